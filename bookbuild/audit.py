"""Site audits run by ``make test`` (and ``make audit``) on the last build.

(a) every page in ``_toc.yml`` was rendered from the current staged sources;
(b) no executed notebook holds an error output;
(c) no page or stylesheet references an external script, stylesheet, font or image;
(d) in headless Chromium, after typesetting, every page with math holds at least as many
    ``mjx-container`` elements as it has math nodes and no ``mjx-merror``, and no output,
    code or literal block is wider than the page (scrolls sideways); a screenshot of each
    page lands in ``_build/screenshots/``;
(e) the build's result tables agree with ``data/results`` within their tolerances;
(f) the reproduction ledger is complete: every claim has a numerical check within its
    tolerance, a test and a summary, and its page shows the ledger line under it;
(g) the site search works offline (headless Chromium finds a known word);
(h) every figure in the executed notebooks has an opaque white background (dark mode);
(i) the offline bundle (``make bundle``) is current and complete, its PDF typeset;
(j) the chapters' notebook pages read like a book (:mod:`bookbuild.reading`).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from html.parser import HTMLParser

import nbformat

from .book import Book
from .browser import Browser, find_chromium, serve, typeset_counts
from .cache import tree_hash
from .results import compare_all
from .site import STAMP


@dataclass
class Audit:
    name: str
    problems: list[str] = field(default_factory=list)
    summary: str = ""
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


# --- (a) ------------------------------------------------------------------------------
def audit_pages(book: Book) -> Audit:
    result = Audit("(a) every toc page rendered from the current sources")
    stamp = book.html / STAMP
    if not stamp.exists():
        result.problems.append(f"{book.html} has no build stamp: the site was never built")
        return result
    if book.stage.exists() and stamp.read_text().strip() != tree_hash(book.stage):
        result.problems.append("the site was not built from the current staged sources "
                               "(a silent or failed build?): run `make book`")
    for page in book.pages:
        html = book.html / page.with_suffix(".html")
        if not html.exists():
            result.problems.append(f"{page}: not rendered ({html.relative_to(book.root)} missing)")
        elif "<h1" not in html.read_text(errors="replace"):
            result.problems.append(f"{page}: rendered page has no title (empty page?)")
    result.summary = f"{len(book.pages)} pages"
    return result


# --- (b) ------------------------------------------------------------------------------
def audit_notebook_errors(book: Book) -> Audit:
    result = Audit("(b) no error output in executed notebooks")
    for nb_path in book.notebooks:
        executed = book.executed / nb_path
        if not executed.exists():
            result.problems.append(f"{nb_path}: never executed")
            continue
        nb = nbformat.read(executed, as_version=4)
        for number, cell in enumerate(nb.cells, 1):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    result.problems.append(
                        f"{nb_path} cell {number}: {out.get('ename')}: {out.get('evalue')}")
    result.summary = f"{len(book.notebooks)} notebooks"
    return result


# --- (c) ------------------------------------------------------------------------------
_EXTERNAL = re.compile(r"^\s*(https?:)?//", re.I)
_CSS_EXTERNAL = re.compile(
    r"(?:url\(\s*['\"]?|@import\s+['\"])\s*((?:https?:)?//[^'\")\s]+)", re.I)
_RESOURCE_LINK_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut",
                       "apple-touch-icon", "manifest", "prefetch", "preconnect", "dns-prefetch"}


class _ResourceParser(HTMLParser):
    """Collects URLs a browser would fetch on its own when the page loads."""

    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "style":
            self._in_style = True
        if a.get("style"):
            self.styles.append(a["style"])
        wanted = {"script": ["src"], "img": ["src", "srcset"], "source": ["src", "srcset"],
                  "iframe": ["src"], "video": ["src", "poster"], "audio": ["src"],
                  "embed": ["src"], "object": ["data"], "input": ["src"]}.get(tag, [])
        if tag == "link" and set((a.get("rel") or "").lower().split()) & _RESOURCE_LINK_RELS:
            wanted = ["href"]
        for attr in wanted:
            value = a.get(attr)
            if value:
                for url in value.split(",") if attr == "srcset" else [value]:
                    self.urls.append((f"<{tag} {attr}>", url.strip().split(" ")[0]))

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def external_resources(html: str) -> list[str]:
    """Descriptions of every external resource a page would load."""
    parser = _ResourceParser()
    parser.feed(html)
    found = [f"{where} {url}" for where, url in parser.urls if _EXTERNAL.match(url)]
    for css in parser.styles:
        found += [f"inline style {m.group(1)}" for m in _CSS_EXTERNAL.finditer(css)]
    return found


def audit_offline(book: Book) -> Audit:
    result = Audit("(c) no external scripts, stylesheets, fonts or images")
    pages = sorted(book.html.rglob("*.html"))
    for page in pages:
        for problem in external_resources(page.read_text(errors="replace")):
            result.problems.append(f"{page.relative_to(book.html)}: {problem}")
    sheets = sorted(book.html.rglob("*.css"))
    for sheet in sheets:
        for m in _CSS_EXTERNAL.finditer(sheet.read_text(errors="replace")):
            result.problems.append(f"{sheet.relative_to(book.html)}: {m.group(1)}")
    result.summary = f"{len(pages)} pages, {len(sheets)} stylesheets"
    return result


# --- (d) ------------------------------------------------------------------------------
_MATH_NODE = re.compile(r'class="math[ "]')


def _browser_for(result: Audit, what: str, require_browser: bool) -> str | None:
    """Chromium's path, or None after recording the missing browser on ``result``."""
    binary = find_chromium()
    if binary is None:
        message = (f"Chromium not found: {what} did NOT run. "
                   "Install it with `apt-get install -y chromium` (CI does).")
        if require_browser:
            result.problems.append(message)
        else:
            result.skipped, result.summary = True, message
    return binary


def audit_math(book: Book, require_browser: bool = False) -> Audit:
    result = Audit("(d) math typeset and nothing scrolls sideways in headless Chromium, screenshots")
    binary = _browser_for(result, "the MathJax check and the screenshots", require_browser)
    if binary is None:
        return result
    shots = book.build / "screenshots"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    with_math = 0
    with serve(book.html) as base, Browser(binary) as browser:
        for page in book.pages:
            rel = page.with_suffix(".html").as_posix()
            source = (book.html / rel).read_text(errors="replace")
            math_nodes = len(_MATH_NODE.findall(source))
            png = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
            rendered = browser.render(f"{base}/{rel}", screenshot=png)
            containers, errors = typeset_counts(rendered.dom)
            if math_nodes:
                with_math += 1
                if not rendered.typeset:
                    result.problems.append(f"{rel}: {math_nodes} math nodes but MathJax never ran")
                elif containers < math_nodes:
                    result.problems.append(f"{rel}: {math_nodes} math nodes but only {containers} "
                                           "typeset (mjx-container)")
            if errors:
                result.problems.append(f"{rel}: {errors} TeX error(s) (mjx-merror)")
            result.problems += [f"{rel}: scrolls sideways, {block}" for block in rendered.overflowing[:3]]
            if not png.exists():
                result.problems.append(f"{rel}: no screenshot")
    result.summary = (f"{len(book.pages)} pages, {with_math} with math; screenshots in "
                      f"{shots.relative_to(book.root)}/")
    return result


# --- (e) ------------------------------------------------------------------------------
def audit_results(book: Book) -> Audit:
    result = Audit("(e) result tables agree with data/results")
    result.problems = compare_all(book)
    result.summary = "within their tolerances"
    return result


# --- (f) ------------------------------------------------------------------------------
def audit_ledger(book: Book) -> Audit:
    from .ledger import build_ledger

    result = Audit("(f) every claim checked within tolerance, tested, and shown so")
    ledger = build_ledger(book)
    result.problems = list(ledger.problems)
    per_page: dict[str, int] = {}
    for entry in ledger.entries:
        per_page[entry.claim.page] = per_page.get(entry.claim.page, 0) + 1
    for page, claims in sorted(per_page.items()):
        html = book.html / f"{page}.html"
        lines = html.read_text(errors="replace").count('class="claim-ledger') if html.exists() else 0
        if lines != claims:
            result.problems.append(f"{page}: {claims} claims but {lines} ledger lines on the rendered page")
    verdicts = [e.verdict for e in ledger.entries]
    result.summary = f"{verdicts.count('reproduced')} of {len(verdicts)} claims reproduced"
    return result


# --- (g) ------------------------------------------------------------------------------
def audit_search(book: Book, require_browser: bool = False, word: str = "Eckart") -> Audit:
    result = Audit("(g) site search works offline")
    binary = _browser_for(result, "the search check", require_browser)
    if binary is None:
        return result
    with serve(book.html) as base, Browser(binary) as browser:
        summary = browser.search(f"{base}/search.html?q={word}")
    found = re.search(r"found (\d+) page", summary)
    if not found or int(found.group(1)) == 0:
        result.problems.append(f"searching for {word!r} found nothing: {summary!r}")
    result.summary = f"{word!r}: {found.group(0) if found else 'no result'}"
    return result


# --- (h) ------------------------------------------------------------------------------
def audit_figure_backgrounds(book: Book) -> Audit:
    import base64
    import io

    from PIL import Image

    result = Audit("(h) figures have opaque white backgrounds (readable in dark mode)")
    count = 0
    for nb_path in book.notebooks:
        executed = book.executed / nb_path
        if not executed.exists():
            continue
        for number, cell in enumerate(nbformat.read(executed, as_version=4).cells, 1):
            for out in cell.get("outputs", []):
                data = out.get("data", {}).get("image/png")
                if not data:
                    continue
                count += 1
                image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGBA")
                w, h = image.size
                corners = [image.getpixel(xy) for xy in ((0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1))]
                if any(c[3] < 255 or min(c[:3]) < 250 for c in corners):
                    result.problems.append(f"{nb_path} cell {number}: figure corners {corners} are not opaque white")
    result.summary = f"{count} figures"
    return result


# --- (i) ------------------------------------------------------------------------------
def audit_bundle_archive(book: Book) -> Audit:
    from .bundle import inspect_bundle

    result = Audit("(i) offline bundle complete, PDF typeset")
    summary = inspect_bundle(book)
    result.problems = summary.problems
    if summary.pdf is not None:
        result.summary = (f"{summary.size / 1e6:.1f} MB; PDF {summary.pdf.pages} pages, "
                          f"{len(summary.pdf.math_pages)} with math, {summary.pdf.image_count} images")
    return result


def run_audits(book: Book, require_browser: bool = False, echo=print) -> bool:
    audits = [audit_pages(book), audit_notebook_errors(book), audit_offline(book),
              audit_math(book, require_browser), audit_results(book), audit_ledger(book),
              audit_search(book, require_browser), audit_figure_backgrounds(book),
              audit_bundle_archive(book), audit_reading(book)]
    for audit in audits:
        if audit.skipped:
            banner = "!" * 78
            echo(f"{banner}\nSKIPPED {audit.name}: {audit.summary}\n{banner}")
        elif audit.ok:
            echo(f"ok      {audit.name}: {audit.summary}")
        else:
            echo(f"FAILED  {audit.name}:")
            for problem in audit.problems:
                echo(f"        {problem}")
    return all(a.ok for a in audits)


# --- (j) ------------------------------------------------------------------------------
def audit_reading(book: Book) -> Audit:
    from .reading import GOALS, measure

    result = Audit("(j) chapter notebooks read like a book (short cells, no reprs, "
                         "figures fit)")
    measured = [measure(nbformat.read(book.executed / nb, as_version=4), str(nb))
                for nb in book.notebooks
                if nb.parts[:2] != ("chapters", "appendix") and (book.executed / nb).exists()]
    for m in measured:
        result.problems += m.problems()
    worst = {name: max((m.values()[name] for m in measured), default=0) for name in GOALS}
    result.summary = f"{len(measured)} notebooks; worst: " + ", ".join(
        f"{name} {value:.3g}" for name, value in worst.items())
    return result
