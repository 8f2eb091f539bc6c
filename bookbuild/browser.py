"""Headless Chromium for the site audits and the PDF: one place, used by both.

Debian's Chromium is driven through Playwright (``executable_path``: Playwright never
downloads a browser here). Pages are served from a local HTTP server, and every wait is on
the page's own signal — MathJax's ``startup.promise`` for typesetting, the search summary
for the search page — never on a fixed time budget.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: Chromium flags for a machine with no network and no sandbox (CI runs as root).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
PAGE_TIMEOUT_MS = 60_000

# Resolves once MathJax has typeset the page (and at once on pages without MathJax).
_TYPESET = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
        return true;
    }
    return false;
}"""

# Blocks of the page body that scroll sideways: outputs (tables), code, literal blocks.
_OVERFLOWING = """() => [...document.querySelectorAll(
        'main .cell_output .output, main .cell_input pre, main div.highlight pre')]
    .filter(el => el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 2)
    .map(el => `${el.scrollWidth} px in ${el.clientWidth}: `
               + JSON.stringify(el.textContent.trim().replace(/\\s+/g, ' ').slice(0, 40)))"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1 (random port) while the block runs; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class RenderedPage:
    dom: str  # the DOM after typesetting
    typeset: bool  # MathJax ran and finished
    overflowing: list  # blocks that scroll sideways, as "<scroll> px in <width>: <text>"


class Browser:
    """One headless Chromium for many pages: ``with Browser(binary) as browser: ...``."""

    def __init__(self, binary: str, width: int = 1280, height: int = 1600,
                 timeout_ms: int = PAGE_TIMEOUT_MS):
        self.binary, self.viewport = binary, {"width": width, "height": height}
        self.timeout_ms = timeout_ms

    def __enter__(self) -> "Browser":
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=self.binary,
                                                             args=FLAGS)
        except BaseException:
            self._playwright.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._browser.close()
        self._playwright.stop()

    def _open(self, url: str):
        page = self._browser.new_page(viewport=self.viewport)
        page.set_default_timeout(self.timeout_ms)
        page.goto(url, wait_until="load")
        return page

    def render(self, url: str, screenshot: Path | None = None) -> RenderedPage:
        """The page's DOM once MathJax has finished; a full-width screenshot if asked."""
        page = self._open(url)
        try:
            typeset = bool(page.evaluate(_TYPESET))
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
            return RenderedPage(page.content(), typeset, page.evaluate(_OVERFLOWING))
        finally:
            page.close()

    def search(self, url: str) -> str:
        """The text of Sphinx's search summary once the search has finished."""
        page = self._open(url)
        try:
            summary = page.locator("#search-results p.search-summary")
            page.wait_for_function(
                "() => /found|did not match/.test("
                "(document.querySelector('#search-results p.search-summary') || {}).innerText)")
            return summary.inner_text()
        finally:
            page.close()

    def print_pdf(self, url: str, pdf: Path) -> None:
        """Print the page to ``pdf`` after typesetting (no header or footer)."""
        page = self._open(url)
        try:
            page.evaluate(_TYPESET)
            page.pdf(path=str(pdf), print_background=True, prefer_css_page_size=True)
        finally:
            page.close()


def typeset_counts(dom: str) -> tuple[int, int]:
    """(number of mjx-container elements, number of mjx-merror elements) in a DOM dump."""
    return dom.count("<mjx-container"), dom.count("<mjx-merror")
