"""Site audits (a)-(j) run by ``make test`` (``make audit``) on the last build; each can fail
and says what it found. Chromium's audits (d, g) are skipped loudly without a browser, or
fail with ``--require-browser``."""

from __future__ import annotations

import base64
import io
import re
import shutil
import struct
from dataclasses import dataclass, field
from html import unescape

import nbformat
import yaml

from .book import Book
from .browser import Browser, find_chromium, serve
from .notebook import FIGURE_DPI, MAX_FIGURE_INCHES
from .site import STAMP, tree_hash

MATH_NODE = re.compile(r'class="math[ "]')


@dataclass
class Audit:
    name: str
    problems: list[str] = field(default_factory=list)
    summary: str = ""
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def _executed(book: Book):  # (path, executed notebook) of every notebook executed so far
    return [(nb, nbformat.read(book.executed / nb, as_version=4))
            for nb in book.notebooks if (book.executed / nb).exists()]


def audit_pages(book: Book) -> Audit:
    result = Audit("(a) every toc page rendered from the current sources", summary=f"{len(book.pages)} pages")
    stamp = book.html / STAMP
    if not stamp.exists():
        result.problems.append(f"{book.html} has no build stamp: the site was never built")
        return result
    if book.stage.exists() and stamp.read_text().strip() != tree_hash(book.stage):
        result.problems.append("the site was not built from the current staged sources: run `make book`")
    for page in book.pages:
        html = book.html / page.with_suffix(".html")
        if not html.exists():
            result.problems.append(f"{page}: not rendered ({html.relative_to(book.root)} missing)")
        elif "<h1" not in (text := html.read_text(errors="replace")):
            result.problems.append(f"{page}: rendered page has no title (empty page?)")
        elif raw := re.search(r"<p>\s*(\.\. [\w:-]+::)", text):  # reST parsed as Markdown
            result.problems.append(f"{page}: shows an unparsed directive {raw.group(1)!r}")
    return result


def audit_notebook_errors(book: Book) -> Audit:
    result = Audit("(b) no error output in executed notebooks", summary=f"{len(book.notebooks)} notebooks")
    executed = dict(_executed(book))
    result.problems += [f"{nb}: never executed" for nb in book.notebooks if nb not in executed]
    result.problems += [f"{nb} cell {number}: {out.get('ename')}: {out.get('evalue')}"
                        for nb, notebook in executed.items()
                        for number, cell in enumerate(notebook.cells, 1)
                        for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    return result


_EXTERNAL = re.compile(r"^\s*(https?:)?//", re.I)
_CSS_EXTERNAL = re.compile(r"(?:url\(\s*['\"]?|@import\s+['\"])\s*((?:https?:)?//[^'\")\s]+)", re.I)
_FETCHING_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut", "apple-touch-icon",
                  "manifest", "prefetch", "preconnect", "dns-prefetch"}


def external_resources(html: str) -> list[str]:
    """Every external resource a browser would fetch by itself when the page loads."""
    from bs4 import BeautifulSoup

    found = []
    for tag in BeautifulSoup(html, "html.parser").find_all(True):
        attrs = ["src", "srcset", "data", "poster"] if tag.name not in ("a", "link") else []
        if tag.name == "link" and set(tag.get("rel") or []) & _FETCHING_RELS:
            attrs = ["href"]
        for attr in attrs:
            for url in str(tag.get(attr) or "").split(",") if attr == "srcset" else [tag.get(attr) or ""]:
                if _EXTERNAL.match(url):
                    found.append(f"<{tag.name} {attr}> {url.strip().split(' ')[0]}")
        css = (tag.string or "") if tag.name == "style" else tag.get("style") or ""
        found += [f"inline style {m.group(1)}" for m in _CSS_EXTERNAL.finditer(css)]
    return found


def audit_offline(book: Book) -> Audit:
    result = Audit("(c) no external scripts, stylesheets, fonts or images")
    pages, sheets = sorted(book.html.rglob("*.html")), sorted(book.html.rglob("*.css"))
    for path in pages + sheets:
        text = path.read_text(errors="replace")
        found = external_resources(text) if path.suffix == ".html" else _CSS_EXTERNAL.findall(text)
        result.problems += [f"{path.relative_to(book.html)}: {problem}" for problem in found]
    result.summary = f"{len(pages)} pages, {len(sheets)} stylesheets"
    return result


def _browser_for(result: Audit, what: str, require_browser: bool) -> str | None:
    """Chromium's path, or None after recording on ``result`` that it is missing."""
    if (binary := find_chromium()) is None:
        message = f"Chromium not found: {what} did NOT run. Install it: `apt-get install -y chromium`."
        result.problems += [message] if require_browser else []
        result.skipped, result.summary = not require_browser, message
    return binary


def audit_math(book: Book, require_browser: bool = False) -> Audit:
    result = Audit("(d) math typeset and nothing scrolls sideways in headless Chromium, screenshots")
    binary = _browser_for(result, "the MathJax check and the screenshots", require_browser)
    if binary is None:
        return result
    shots, with_math = book.build / "screenshots", 0
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    with serve(book.html) as base, Browser(binary) as browser:
        for page in book.pages:
            rel = page.with_suffix(".html").as_posix()
            nodes = len(MATH_NODE.findall((book.html / rel).read_text(errors="replace")))
            png = shots / (rel.replace("/", "__").removesuffix(".html") + ".png")
            rendered = browser.render(f"{base}/{rel}", screenshot=png)
            containers, errors = rendered.dom.count("<mjx-container"), rendered.dom.count("<mjx-merror")
            with_math += bool(nodes)
            if nodes and not rendered.typeset:
                result.problems.append(f"{rel}: {nodes} math nodes but MathJax never ran")
            elif containers < nodes:
                result.problems.append(f"{rel}: {nodes} math nodes but only {containers} typeset (mjx-container)")
            if errors:
                result.problems.append(f"{rel}: {errors} TeX error(s) (mjx-merror)")
            result.problems += [f"{rel}: scrolls sideways, {block}" for block in rendered.overflowing[:3]]
            if not png.exists():
                result.problems.append(f"{rel}: no screenshot")
    result.summary = (f"{len(book.pages)} pages, {with_math} with math; screenshots in "
                      f"{shots.relative_to(book.root)}/")
    return result


def audit_results(book: Book) -> Audit:
    from .results import compare_all

    return Audit("(e) result tables agree with data/results", compare_all(book), "within their tolerances")


def audit_ledger(book: Book) -> Audit:
    from .ledger import assemble, claims_from_site, ledger_inputs

    entries, problems = assemble(ledger_inputs(book), claims_from_site(book))
    result = Audit("(f) every claim checked within tolerance, tested, and shown so", problems)
    for page in sorted({e["page"] for e in entries.values()}):
        claims = sum(e["page"] == page for e in entries.values())
        html = book.html / f"{page}.html"
        lines = html.read_text(errors="replace").count('class="claim-ledger') if html.exists() else 0
        if lines != claims:
            result.problems.append(f"{page}: {claims} claims but {lines} ledger lines on the rendered page")
    reproduced = sum(e["verdict"] == "reproduced" for e in entries.values())
    result.summary = f"{reproduced} of {len(entries)} claims reproduced"
    return result


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


FIGURE_USE = re.compile(r"```\{book-figure\}\s+([\w-]+/[\w-]+)")
FIGURE_HTML = re.compile(r'<figure class="[^"]*book-figure[^"]*"[^>]*>(.*?)</figure>', re.S)


def audit_figures(book: Book) -> Audit:
    """Every figure a notebook saved is opaque white (readable in dark mode) and shown by a
    page; every shown figure has alt text, a numbered caption and its provenance line."""
    from PIL import Image

    result = Audit("(h) figures: white, each on a page with alt text, a numbered caption, provenance")
    sources = [book.root / p for p in book.pages]
    shown = {key for path in sources if path.exists() for key in FIGURE_USE.findall(
        "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
        if path.suffix == ".ipynb" else path.read_text())}
    saved = sorted(book.figures.glob("*/*.png")) if book.figures.exists() else []
    for png in saved:
        key = f"{png.parent.name}/{png.stem}"
        image = Image.open(png).convert("RGBA")
        w, h = image.size
        corners = [image.getpixel(xy) for xy in ((0, 0), (w - 1, 0), (0, h - 1), (w - 1, h - 1))]
        if any(c[3] < 255 or min(c[:3]) < 250 for c in corners):
            result.problems.append(f"{key}.png: corners {corners} are not opaque white")
        if key not in shown:
            result.problems.append(f"{key}.png: no page shows it (``{{book-figure}} {key}``)")
    count = 0
    for page in book.pages:
        html = book.html / page.with_suffix(".html")
        for figure in FIGURE_HTML.findall(html.read_text(errors="replace") if html.exists() else ""):
            count += 1
            alt = re.search(r'<img [^>]*alt="([^"]*)"', figure)
            if not alt or len(alt.group(1).split()) < 4:
                result.problems.append(f"{page}: a figure without alt text (4 words or more)")
            if not re.search(r'<span class="caption-number">Fig(ure)?\.? \d+', figure):
                result.problems.append(f"{page}: a figure without a numbered caption")
            if "figure-provenance" not in figure:
                result.problems.append(f"{page}: a figure without its provenance line")
    result.summary = f"{len(saved)} figures saved, {count} shown"
    return result


def audit_bundle(book: Book) -> Audit:
    from .bundle import inspect_bundle

    summary = inspect_bundle(book)
    return Audit("(i) offline bundle complete, PDF typeset", summary.problems, summary.describe())


# --- (j): how a notebook page reads ---------------------------------------------------------
GOALS = {"code lines per 100 words": 15, "largest visible cell": 15, "lines over 88 characters": 0,
         "object reprs and stray values": 0, "figures wider than 8 in": 0}
MAX_LINE = 88
_REPR = re.compile(r"<[A-Za-z_][\w.]*(?: object)? at 0x[0-9a-fA-F]+>|\bT_[0-9a-f]{5}(?:_|\b)")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")


def png_width(data: str) -> int:
    """Pixel width of a base64 PNG (from its IHDR chunk)."""
    return struct.unpack(">I", base64.b64decode(data[:44])[16:20])[0]


def reading_measures(nb) -> dict[str, tuple[float, list[str]]]:
    """measure -> (value, examples) for one executed notebook: what a reader sees is a code
    cell's source unless tagged to hide it, and its outputs unless tagged to remove them."""
    words = code = largest = 0
    long, reprs, wide = [], [], []
    for number, cell in enumerate(nb.cells, 1):
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type == "markdown":
            words += len(_WORD.findall(re.sub(r"\$[^$]*\$", " ", cell.source)))
        if cell.cell_type != "code":
            continue
        lines = [line for line in cell.source.splitlines() if line.strip()]
        if not tags & {"remove-input", "remove-cell", "hide-input", "hide-cell"}:
            code, largest = code + len(lines), max(largest, len(lines))
        if not tags & {"remove-input", "remove-cell"}:  # hide-input is one click away: it counts
            long += [f"cell {number}: {len(line)} chars" for line in lines if len(line) > MAX_LINE]
        if tags & {"remove-output", "remove-cell"}:
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            for text in [out.get("text", ""), data.get("text/plain", ""), data.get("text/html", "")]:
                reprs += [f"cell {number}: {hit}" for hit in _REPR.findall("".join(text))]
            if out.get("output_type") == "execute_result" and set(data) == {"text/plain"}:
                reprs.append(f"cell {number}: stray value {''.join(data['text/plain'])[:30]!r}")
            if "image/png" in data and png_width(data["image/png"]) / FIGURE_DPI > MAX_FIGURE_INCHES:
                wide.append(f"cell {number}: {png_width(data['image/png']) / FIGURE_DPI:.1f} in")
    return {"code lines per 100 words": (100 * code / max(words, 1), []),
            "largest visible cell": (largest, []), "lines over 88 characters": (len(long), long),
            "object reprs and stray values": (len(reprs), reprs),
            "figures wider than 8 in": (len(wide), wide)}


def reading_problems(nb, name: str) -> list[str]:
    """One line per measure beyond its goal, naming the notebook and the measure."""
    return [f"{name}: {measure} = {value:.3g} (goal ≤ {GOALS[measure]})"
            + (f": {'; '.join(examples[:3])}" if examples else "")
            for measure, (value, examples) in reading_measures(nb).items() if value > GOALS[measure]]


def unshown_tables(built: dict[str, int], pages: list[str]) -> list[str]:
    """Each table a notebook built with ``run.show`` (``built``: notebook -> count; numbered
    1, 2, … in ``data-book-table``) that no rendered page shows: dropped in a loop or
    mid-cell, by a trailing ``;``, a hidden output, or glued under a key no page uses."""
    found = {unescape(m) for page in pages for m in re.findall(r'data-book-table="([^"]+)"', page)}
    return [f"{nb}: table {k} of {count} is on no page" for nb, count in sorted(built.items())
            for k in range(1, count + 1) if f"{nb} {k}" not in found]


def audit_reading(book: Book) -> Audit:
    result = Audit("(j) chapter notebooks read like a book (short cells, no reprs, figures fit, tables shown)")
    chapters = [(nb, notebook) for nb, notebook in _executed(book) if nb.parts[:2] != ("chapters", "appendix")]
    worst = dict.fromkeys(GOALS, 0.0)
    for nb, notebook in chapters:
        result.problems += reading_problems(notebook, str(nb))
        for measure, (value, _) in reading_measures(notebook).items():
            worst[measure] = max(worst[measure], value)
    records = [yaml.safe_load(p.read_text()) or {} for p in sorted(book.checks.rglob("*.yaml"))
               ] if book.checks.exists() else []
    built = {r["notebook"]: int(r.get("tables", 0)) for r in records if "notebook" in r}
    built = {nb: count for nb, count in built.items() if nb in {str(p) for p in book.notebooks}}
    pages = [path.read_text(errors="replace") for page in book.pages
             if (path := book.html / page.with_suffix(".html")).exists()]
    result.problems += unshown_tables(built, pages)
    result.summary = f"{len(chapters)} notebooks; worst: " + ", ".join(
        f"{measure} {value:.3g}" for measure, value in worst.items()) + (
        f"; {sum(built.values())} tables built, each on a page")
    return result


def run_audits(book: Book, require_browser: bool = False, echo=print) -> bool:
    audits = [audit_pages(book), audit_notebook_errors(book), audit_offline(book),
              audit_math(book, require_browser), audit_results(book), audit_ledger(book),
              audit_search(book, require_browser), audit_figures(book),
              audit_bundle(book), audit_reading(book)]
    for audit in audits:
        if audit.skipped:
            echo(f"{'!' * 78}\nSKIPPED {audit.name}: {audit.summary}\n{'!' * 78}")
        elif audit.ok:
            echo(f"ok      {audit.name}: {audit.summary}")
        else:
            echo(f"FAILED  {audit.name}:\n" + "\n".join(f"        {p}" for p in audit.problems))
    return all(a.ok for a in audits)
