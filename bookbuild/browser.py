"""Headless Chromium (Debian's, driven by Playwright; it never downloads a browser) for the
site audits and the PDF. Every wait is on the page's own signal (MathJax's startup promise,
the search summary), never on a time budget."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from contextlib import contextmanager
from collections import namedtuple
from pathlib import Path

#: For a machine with no network and no sandbox (CI runs as root).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
PAGE_TIMEOUT_MS = 60_000

# Resolves once MathJax has typeset the page (false at once on pages without MathJax).
_TYPESET = """async () => { const startup = window.MathJax && MathJax.startup;
    if (startup && startup.promise) { await startup.promise; return true; } return false; }"""

# Blocks of the page body wider than the column: outputs (tables), code, literal blocks,
# display math, prose (a paragraph or list item with text that cannot wrap, such as a long
# glued value); and display math that would be clipped, not scrolled, on a narrow screen.
_OVERFLOWING = """() => [...document.querySelectorAll('main .cell_output .output, main .cell_input pre, '
        + 'main div.highlight pre, main mjx-container[display="true"], main p, main li')]
    .filter(el => el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 2)
    .map(el => `${el.scrollWidth} px in ${el.clientWidth}: `
               + JSON.stringify(el.textContent.trim().replace(/\\s+/g, ' ').slice(0, 40)))
    .concat([...document.querySelectorAll('main mjx-container[display="true"]')]
        .filter(el => !['auto', 'scroll'].includes(getComputedStyle(el).overflowX)).slice(0, 1)
        .map(el => 'display math that a narrow screen clips (overflow-x is not auto)'))"""


def find_chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@contextmanager
def serve(directory: Path):
    """Serve ``directory`` on 127.0.0.1 (a free port) while the block runs; yields the base URL."""
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# The DOM after typesetting, whether MathJax ran and finished, blocks that scroll sideways.
RenderedPage = namedtuple("RenderedPage", "dom typeset overflowing")


class Browser:
    """One headless Chromium for many pages: ``with Browser(binary) as browser: ...``."""

    def __init__(self, binary: str, timeout_ms: int = PAGE_TIMEOUT_MS):
        self.binary, self.timeout_ms = binary, timeout_ms

    def __enter__(self) -> "Browser":
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=self.binary, args=FLAGS)
        except BaseException:
            self._playwright.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._browser.close()
        self._playwright.stop()

    @contextmanager
    def page(self, url: str):
        page = self._browser.new_page(viewport={"width": 1280, "height": 1600})
        page.set_default_timeout(self.timeout_ms)
        try:
            page.goto(url, wait_until="load")
            yield page
        finally:
            page.close()

    def render(self, url: str, screenshot: Path | None = None) -> RenderedPage:
        """The page once MathJax has finished, and a screenshot if asked."""
        with self.page(url) as page:
            typeset = bool(page.evaluate(_TYPESET))
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
            return RenderedPage(page.content(), typeset, page.evaluate(_OVERFLOWING))

    def search(self, url: str) -> str:
        """The text of Sphinx's search summary once the search has finished."""
        with self.page(url) as page:
            summary = "#search-results p.search-summary"
            page.wait_for_function(f"() => /found|did not match/.test("
                                   f"(document.querySelector('{summary}') || {{}}).innerText)")
            return page.locator(summary).inner_text()

    def print_pdf(self, url: str, pdf: Path, footer: str = "<span></span>") -> None:
        """Print the page to ``pdf`` once MathJax has typeset it: bookmarks from its headings,
        ``footer`` (Chromium's template: ``pageNumber``, ``totalPages`` spans) on every page."""
        with self.page(url) as page:
            page.evaluate(_TYPESET)
            page.pdf(path=str(pdf), print_background=True, prefer_css_page_size=True,
                     outline=True, tagged=True, display_header_footer=True,
                     header_template="<span></span>", footer_template=footer)
