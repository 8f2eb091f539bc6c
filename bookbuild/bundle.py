"""``make bundle``: the book to take away, ``_build/bundle/how-many-heads-make-an-ssm.zip``,
read fully offline: ``site/``, ``notebooks/`` (executed, with outputs), ``requirements.txt``,
``README.txt`` and ``book.pdf``, printed by headless Chromium from a strict single-page build
once MathJax has typeset it. Two PDF pages are kept beside it as PNG previews (pdftoppm).
:func:`inspect_bundle` checks an archive: contents, notebooks, and per document of the book
the PDF's math (MathJax fonts, no raw TeX in the prose) and figures."""

from __future__ import annotations

import html
import io
import re
import shutil
import subprocess
import time
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

from .book import Book, BookError
from .browser import Browser, find_chromium, serve
from .site import STAMP, jupyter_book, swap, tree_hash

NAME = "how-many-heads-make-an-ssm"
ARCHIVE = f"{NAME}.zip"
PRINT_TIMEOUT = 600  # seconds; printing the book takes well under a minute

#: Injected into the single page: A4, every toc document on new PDF pages (a hidden link to
#: each makes Chromium write a named destination ``/document-<docname>``), no shadows (Chromium
#: rasterises them into images), code wrapped at the page edge.
PRINT_CSS = """<style media="print">
@page { size: A4; margin: 16mm 14mm; }
span[id^="document-"] { display: block; break-before: page; }
:root:root:root *, :root:root:root *::before, :root:root:root *::after {
  box-shadow: none !important; text-shadow: none !important; }
pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
#jb-print-docs-body, .run-locally, details.hide > summary, .headerlink, .copybtn,
  .toggle-button, .prev-next-area { display: none !important; }
.bd-main .bd-content .bd-article h1:first-of-type { display: block !important; }
.print-title { text-align: center; padding-top: 30%; }
.print-title .book { font-size: 2.2em; font-weight: bold; margin-bottom: 1em; }
.print-contents ul { list-style: none; padding: 0; }
.print-contents li { display: flex; gap: 0.6em; margin: 0.15em 0; }
.print-contents li a { flex: 1; }
.print-contents li.part { font-weight: bold; margin-top: 0.9em; }
.print-contents li.section { padding-left: 1.6em; }
</style>"""
#: Chromium's footer template: the page number on every page.
FOOTER = ('<div style="width:100%;text-align:center;font-size:10px;color:#444">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')
#: Text of the site's widgets, which has no place in print.
WIDGET_TEXT = ("Show code cell", "Hide code cell", "Run this locally", "Copy to clipboard",
               "Click to show", "Toggle hidden content")
_LOCAL_URI = re.compile(r"^(https?://(127\.0\.0\.1|localhost|0\.0\.0\.0)\b|file:)", re.I)
_SITE_LINK = re.compile(r'(<a\b[^>]*?\shref=)"(?![a-z][a-z0-9+.-]*:|#)([^"#]*?)(\.html)?(#[^"]*)?"', re.I)

README = """\
How Many Heads Make an SSM? -- an executable book, offline copy (commit {commit})

  site/index.html   the book as a web site, math typeset by the MathJax copy inside site/;
                    or serve it: python3 -m http.server -d site 8000 (http://127.0.0.1:8000)
  book.pdf          the whole book as one PDF, printed from the site (math and figures)
  notebooks/        every notebook, executed, with its outputs: opens in any Jupyter
  requirements.txt  the pinned environment, to run the notebooks yourself:
                    python3 -m venv .venv && .venv/bin/pip install -r requirements.txt
"""

_RAW_TEX = re.compile(r"\\[()\[\]]|\$\$|\\[A-Za-z]+|\$[^$\s][^$\n]{0,200}?\$")
_MATH_FONT = re.compile(r"MathJax|MJX", re.I)
_MONO_FONT = re.compile(r"Mono|Courier|Consol|Menlo", re.I)
_HIDDEN = {"remove-cell", "remove-output", "remove_cell", "remove_output"}


class BundleError(BookError):
    """``make bundle`` could not produce an archive."""


def book_outline(book: Book) -> list[tuple[str, str]]:
    """``_toc.yml`` in reading order: ("part", caption), ("chapter" | "section", docname)."""
    toc, out = yaml.safe_load((book.root / "_toc.yml").read_text()), []

    def walk(items, depth):
        for item in items or []:
            if "file" in item:
                out.append(("chapter" if depth == 0 else "section", str(Path(item["file"]).with_suffix(""))))
            walk(item.get("sections"), depth + 1)

    out.append(("chapter", str(Path(toc["root"]).with_suffix(""))))
    for part in toc.get("parts") or [{"chapters": toc.get("chapters")}]:
        out += [("part", part["caption"])] if part.get("caption") else []
        walk(part.get("chapters"), 0)
    return out


def book_title(book: Book) -> str:
    return yaml.safe_load((book.root / "_config.yml").read_text()).get("title", "")


def page_titles(book: Book) -> dict[str, str]:
    """docname -> its title, as the site's page shows it."""
    suffix = f" \u2014 {book_title(book)}"
    titles = {}
    for page in book.pages:
        site = book.html / page.with_suffix(".html")
        found = re.search(r"<title>(.*?)</title>", site.read_text() if site.exists() else "", re.S)
        titles[page.with_suffix("").as_posix()] = html.unescape(found.group(1)).strip().removesuffix(suffix) \
            if found else page.stem
    return titles


def print_html(book: Book, page: str, starts: dict[str, int] | None = None) -> str:
    """The single page made for print: a title page, a contents list with the PDF page of every
    document (``starts``; blank before the first printing), a hidden link to each document (so
    Chromium writes its named destination), and links into the site turned into links within."""
    outline, titles, root = book_outline(book), page_titles(book), book.pages[0].with_suffix("").as_posix()
    title = book_title(book)
    items = "".join(
        f'<li class="part">{html.escape(name)}</li>' if kind == "part" else
        f'<li class="{kind}"><a href="#document-{html.escape(name)}">{html.escape(titles.get(name, name))}'
        f'</a><span>{(starts or {}).get(name, "000")}</span></li>' for kind, name in outline)
    front = (f'<div class="print-title"><p class="book">{html.escape(title)}</p><p>An executable '
             "reconstruction of A. Ghodsi, <i>How Many Heads Make an SSM? A Unified Framework for "
             "Attention and State Space Models</i>, arXiv:2512.15115 (2025)</p>"
             f"<p>Printed from commit {html.escape(book.commit())}</p></div>"
             f'<span id="document-contents"></span><nav class="print-contents"><h1>Contents</h1>'
             f'<ul>{items}</ul></nav><span id="document-{html.escape(root)}"></span>')
    links = "".join(f'<a href="#document-{html.escape(name)}"></a>'
                    for name in ["contents"] + [n for kind, n in outline if kind != "part"])

    def local(match):  # a link into the site: to its document within the PDF, or no link
        path, fragment = match.group(2).lstrip("./"), match.group(4)
        if fragment:
            return f'{match.group(1)}"{fragment}"'
        return f'{match.group(1)}"#document-{path}"' if match.group(3) and path in titles else match.group(1) + '""'

    page = _SITE_LINK.sub(local, page).replace("</head>", PRINT_CSS + "</head>", 1)
    page = re.sub(r'(<article class="bd-article"[^>]*>)', lambda m: m.group(1) + front, page, count=1)
    return page.replace("</body>", f'<div style="display:none">{links}</div></body>', 1)


def bookmark_title(title: str) -> str:
    """A heading's bookmark text: Chromium names some headings twice over ("AbcAbc" -> "Abc")."""
    half = len(title) // 2
    return title[:half] if half and title == title[:half] * 2 else title


def _flat_outline(reader) -> list[tuple[int, str, int]]:
    """(depth, title, 0-based page) of every bookmark of a PDF, in order."""
    flat = []

    def walk(items, depth):
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                flat.append((depth, item.title, reader.get_destination_page_number(item)))

    walk(reader.outline, 0)
    return flat


def nest_outline(pdf: Path, book: Book, starts: dict[str, int]) -> None:
    """Bookmarks in ``_toc.yml``'s shape: parts, their chapters, the chapters' sections, each
    document's own section headings (from Chromium's bookmarks of the headings)."""
    from pypdf import PdfReader, PdfWriter

    reader = PdfReader(pdf)
    flat = _flat_outline(reader)  # Chromium's bookmarks of the headings
    outline, titles = book_outline(book), page_titles(book)
    heads, at = {}, 0  # docname -> index of its heading in flat
    for kind, name in outline:
        found = next((i for i in range(at, len(flat)) if flat[i][2] == starts.get(name, 0) - 1), None)
        if kind != "part" and found is not None:
            heads[name], at = found, found + 1
    ends = sorted(heads.values()) + [len(flat)]
    writer = PdfWriter(clone_from=reader)
    writer._root_object.pop("/Outlines", None)
    if "contents" in starts:
        writer.add_outline_item(title="Contents", page_number=starts["contents"] - 1)
    part = chapter = None
    for i, (kind, name) in enumerate(outline):
        if kind == "part":
            first = next((starts.get(n) for k, n in outline[i + 1:] if k != "part"), None) or 1
            part = writer.add_outline_item(title=name, page_number=first - 1)
            continue
        item = writer.add_outline_item(title=titles.get(name, name), page_number=starts.get(name, 1) - 1,
                                       parent=part if kind == "chapter" else chapter)
        chapter = item if kind == "chapter" else chapter
        if name in heads:
            depth, stop = flat[heads[name]][0], next(e for e in ends if e > heads[name])
            for d, title, page in flat[heads[name] + 1:stop]:
                if d == depth + 1:
                    writer.add_outline_item(title=bookmark_title(title), page_number=page, parent=item)
    with open(pdf, "wb") as handle:
        writer.write(handle)


def archive_path(book: Book) -> Path:
    return book.build / "bundle" / ARCHIVE


@dataclass
class PdfReport:
    pages: int = 0
    math_pages: list[int] = field(default_factory=list)  # 1-based
    images: dict[int, int] = field(default_factory=dict)  # page -> image XObjects drawn
    raw_tex: list[tuple[int, str]] = field(default_factory=list)
    starts: dict[str, int] = field(default_factory=dict)  # docname -> first page
    bookmarks: list[tuple[int, str]] = field(default_factory=list)  # (depth, title) in order
    texts: list[str] = field(default_factory=list)  # each page's text, whitespace collapsed
    links: list[tuple[int, str]] = field(default_factory=list)  # (page, URI) of link annotations

    def unnumbered(self) -> list[int]:
        """Pages whose text lacks the footer ``<page> / <pages>``."""
        return [p for p, text in enumerate(self.texts, 1) if f"{p} / {self.pages}" not in text]

    @property
    def image_count(self) -> int:
        return sum(self.images.values())

    def doc_pages(self, docnames: list[str]) -> dict[str, range]:
        """Pages of each document (the root document starts on page 1)."""
        starts = sorted((page, name) for name, page in {**self.starts, docnames[0]: 1}.items()
                        if name in docnames)
        ends = [page for page, _ in starts[1:]] + [self.pages + 1]
        return {name: range(page, max(end, page + 1)) for (page, name), end in zip(starts, ends)}


def _font_name(font) -> str:
    """BaseFont, FontName and FontFamily (Chromium's Type 3 fonts only have the latter two)."""
    font = font.get_object()
    descriptor = font.get("/FontDescriptor")
    if descriptor is None and "/DescendantFonts" in font:
        descriptor = font["/DescendantFonts"][0].get_object().get("/FontDescriptor")
    descriptor = descriptor.get_object() if descriptor is not None else {}
    return " ".join(str(x) for x in (font.get("/BaseFont", ""), descriptor.get("/FontName", ""),
                                     descriptor.get("/FontFamily", "")))


def _resources(resources, fonts: set, images: set, seen: set) -> None:
    """Fonts and image XObjects of a resource dictionary, form XObjects included."""
    resources = resources.get_object() if resources is not None else {}
    fonts.update(_font_name(font) for font in (resources.get("/Font") or {}).values())
    for ref in (resources.get("/XObject") or {}).values():
        key, xobject = getattr(ref, "idnum", None) or id(ref), ref.get_object()
        if xobject.get("/Subtype") == "/Image":
            images.add(key)
        elif xobject.get("/Subtype") == "/Form" and key not in seen:
            seen.add(key)
            _resources(xobject.get("/Resources"), fonts, images, seen)


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _starts(reader) -> dict[str, int]:
    """docname -> the page (1-based) of its named destination ``/document-<docname>``."""
    starts = {}
    for name, dest in reader.named_destinations.items():
        if name.lstrip("/").startswith("document-"):
            number = reader.get_destination_page_number(dest)
            if number is not None and number >= 0:
                starts[name.lstrip("/").removeprefix("document-")] = number + 1
    return starts


def analyse_pdf(data: bytes) -> PdfReport:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    report = PdfReport(pages=len(reader.pages), starts=_starts(reader),
                       bookmarks=[(depth, title) for depth, title, _ in _flat_outline(reader)])
    for number, page in enumerate(reader.pages, 1):
        report.texts.append(_norm(page.extract_text()))
        report.links += [(number, str(uri)) for a in page.get("/Annots") or []
                         if (uri := (a.get_object().get("/A") or {}).get("/URI")) is not None]
        fonts, images = set(), set()
        _resources(page.get("/Resources"), fonts, images, set())
        if any(_MATH_FONT.search(f) for f in fonts):
            report.math_pages.append(number)
        report.images[number] = len(images)
        prose = []  # text outside math and code fonts

        def visit(text, _cm, _tm, font, _size, prose=prose):
            name = _font_name(font) if font is not None else ""
            if not (_MATH_FONT.search(name) or _MONO_FONT.search(name)):
                prose.append(text)

        page.extract_text(visitor_text=visit)
        report.raw_tex += [(number, m.group(0)[:60]) for m in _RAW_TEX.finditer("".join(prose))]
    return report


def print_problems(book: Book, pdf: PdfReport) -> list[str]:
    """What a printed book needs: a title page, a contents list giving each document its page,
    a bookmark for every part and document, a number on every page, no link to the local
    server it was printed from, no text of the site's widgets."""
    problems, outline, titles = [], book_outline(book), page_titles(book)
    title = _norm(book_title(book))
    if not pdf.texts or title not in pdf.texts[0]:
        problems.append(f"book.pdf: page 1 is not a title page (no {title!r} on it)")
    label = {name: name if kind == "part" else titles.get(name, name) for kind, name in outline}
    if (first := pdf.starts.get("contents")) is None:
        problems.append("book.pdf: no contents list (no named destination /document-contents)")
    else:
        text = " ".join(pdf.texts[first - 1:max(first, pdf.starts.get(outline[0][1], 0) - 1)])
        for kind, name in outline:
            entry = re.escape(_norm(label[name])) + ("" if kind == "part" else f" {pdf.starts.get(name)}\\b")
            if not re.search(entry, text):
                problems.append(f"book.pdf: the contents list lacks {label[name]!r}"
                                + ("" if kind == "part" else f" with its page {pdf.starts.get(name)}"))
    marks = {_norm(t) for _, t in pdf.bookmarks}
    if missing := [label[name] for _, name in outline if _norm(label[name]) not in marks]:
        problems.append(f"book.pdf: no bookmark for {len(missing)} part(s) or document(s): "
                        + ", ".join(map(repr, missing[:4])))
    if unnumbered := pdf.unnumbered():
        problems.append(f"book.pdf: {len(unnumbered)} page(s) without a page number, e.g. {unnumbered[:5]}")
    if local := [(p, uri) for p, uri in pdf.links if _LOCAL_URI.match(uri)]:
        problems.append(f"book.pdf: {len(local)} link(s) to the local server it was printed from, "
                        f"e.g. page {local[0][0]}: {local[0][1]}")
    problems += [f"book.pdf page {p}: widget text {w!r}" for p, text in enumerate(pdf.texts, 1)
                 for w in WIDGET_TEXT if w in text][:10]
    return problems


def build_bundle(book: Book, echo=print) -> Path:
    """Build the archive from the current site and executed notebooks; swapped into
    ``_build/bundle`` only when everything succeeded. Returns the archive's path."""
    stamp = book.html / STAMP
    if not stamp.exists() or not book.stage.exists() or stamp.read_text().strip() != tree_hash(book.stage):
        raise BundleError("the site is not built from the current sources: run `make book` first")
    missing = [str(nb) for nb in book.notebooks if not (book.executed / nb).exists()]
    if missing:
        raise BundleError(f"notebooks never executed: {', '.join(missing)}")
    if (binary := find_chromium()) is None or shutil.which("pdftoppm") is None:
        raise BundleError("Chromium (prints the PDF) and pdftoppm (its previews) are needed: "
                          "apt-get install -y chromium poppler-utils")
    started, scratch = time.perf_counter(), book.build / "bundle-new"
    shutil.rmtree(scratch, ignore_errors=True)
    top, out = scratch / "tree" / NAME, scratch / "out"
    try:
        built = jupyter_book(book, scratch / "jb", "singlehtml", echo)
        if built is None:
            raise BundleError("the single-page build failed; the previous bundle is untouched")
        shutil.copytree(book.html, top / "site")
        out.mkdir(parents=True)
        echo("[bundle] printing it to PDF with headless Chromium (after MathJax has typeset)")
        single, starts = (built / book.pages[0].with_suffix(".html")).read_text(), None
        from playwright.sync_api import Error as PlaywrightError
        from pypdf import PdfReader

        try:  # print until the contents list's page numbers are the pages printed
            with serve(built) as base, Browser(binary, timeout_ms=PRINT_TIMEOUT * 1000) as browser:
                for _ in range(3):
                    (built / "print.html").write_text(print_html(book, single, starts))
                    browser.print_pdf(f"{base}/print.html", out / "book.pdf", FOOTER)
                    printed = _starts(PdfReader(out / "book.pdf"))
                    if printed == starts:
                        break
                    starts = printed
                else:
                    raise BundleError("the contents list's page numbers do not settle")
        except PlaywrightError as err:
            raise BundleError(f"Chromium did not print the book: {str(err).splitlines()[0]}") from None
        nest_outline(out / "book.pdf", book, starts)
        for page_number in preview_pages(analyse_pdf((out / "book.pdf").read_bytes())):
            subprocess.run(["pdftoppm", "-png", "-r", "80", "-singlefile", "-f", str(page_number),
                            "-l", str(page_number), str(out / "book.pdf"),
                            str(out / f"preview-{page_number}")], check=True, capture_output=True)
            echo(f"[bundle] preview: {book.build / 'bundle' / f'preview-{page_number}.png'}")
        for nb in book.notebooks:  # not stale notebooks that left the book
            (top / "notebooks" / nb).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(book.executed / nb, top / "notebooks" / nb)
        shutil.copy2(book.root / "requirements.txt", top / "requirements.txt")
        shutil.copy2(out / "book.pdf", top / "book.pdf")
        (top / "README.txt").write_text(README.format(commit=book.commit()))
        shutil.make_archive(str(out / NAME), "zip", root_dir=top.parent, base_dir=NAME)
        swap(out, book.build / "bundle")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    echo(f"[bundle] built in {time.perf_counter() - started:.1f} s")
    return archive_path(book)


def preview_pages(report: PdfReport) -> list[int]:
    """Two pages to look at: with both math and a figure first, then math or figures."""
    both = [p for p in report.math_pages if report.images.get(p)]
    figures = [p for p, n in report.images.items() if n]
    return sorted(list(dict.fromkeys(both[:1] + both[len(both) // 2:] + report.math_pages
                                     + figures))[:2]) or [1]


@dataclass
class BundleSummary:
    archive: Path
    size: int = 0
    pdf: PdfReport | None = None
    problems: list[str] = field(default_factory=list)

    def describe(self) -> str:
        pdf = self.pdf or PdfReport()
        return (f"{self.size / 1e6:.1f} MB; PDF {pdf.pages} pages, {len(pdf.math_pages)} with "
                f"math, {pdf.image_count} images")


def inspect_bundle(book: Book, archive: Path | None = None) -> BundleSummary:
    """What an archive (default: the book's) holds, and its problems."""
    archive = archive or archive_path(book)
    summary = BundleSummary(archive)
    problems, stamp, prefix = summary.problems, book.html / STAMP, f"{NAME}/"
    if not archive.exists():
        problems.append(f"{archive} missing: run `make bundle`")
        return summary
    summary.size = archive.stat().st_size
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as err:
        problems.append(f"{archive.name} is not a readable zip archive: {err}")
        return summary
    # docname -> figures its page shows: {book-figure} images, PNG outputs of cells not removed
    pngs = {p.with_suffix("").as_posix(): (book.html / p.with_suffix(".html")).read_text(
        errors="replace").count("book-figure-image") if (book.html / p.with_suffix(".html")).exists()
        else 0 for p in book.pages}
    with zf:
        names = {n.removeprefix(prefix) for n in zf.namelist() if not n.endswith("/")}
        if not stamp.exists():
            problems.append(f"{book.html} has no build stamp: no site to compare the bundle with")
        elif f"site/{STAMP}" not in names or (
                zf.read(prefix + f"site/{STAMP}").decode() != stamp.read_text()):
            problems.append(f"{archive.name}: its site/ is not the current {book.html}: run `make bundle`")
        expected = {"README.txt", "requirements.txt", "book.pdf", "site/index.html",
                    *(f"site/{p.with_suffix('.html').as_posix()}" for p in book.pages),
                    *(f"notebooks/{nb.as_posix()}" for nb in book.notebooks)}
        problems += [f"{archive.name}: {name} missing" for name in sorted(expected - names)]
        for nb in book.notebooks:
            member = f"notebooks/{nb.as_posix()}"
            if member not in names:
                continue
            try:
                notebook = nbformat.reads(zf.read(prefix + member).decode(), as_version=4)
                nbformat.validate(notebook)
            except Exception as err:  # noqa: BLE001 - any failure to open is the problem
                problems.append(f"{member}: does not open with nbformat: {type(err).__name__}: {err}"[:300])
                continue
            if not any(c.get("outputs") for c in notebook.cells):
                problems.append(f"{member}: has no outputs (not an executed notebook)")
            pngs[nb.with_suffix("").as_posix()] += sum(
                "image/png" in out.get("data", {}) and "scrapbook" not in out.get("metadata", {})
                for c in notebook.cells if not _HIDDEN & set(c.get("metadata", {}).get("tags", []))
                for out in c.get("outputs", []))
        if "book.pdf" in names:
            try:
                summary.pdf = analyse_pdf(zf.read(prefix + "book.pdf"))
            except Exception as err:  # noqa: BLE001
                problems.append(f"book.pdf: unreadable PDF: {type(err).__name__}: {err}")
    if (pdf := summary.pdf) is None:
        return summary
    from .audit import MATH_NODE

    problems += [f"book.pdf page {page}: raw TeX in the text: {snippet!r} (math not typeset "
                 "before printing?)" for page, snippet in pdf.raw_tex[:10]]
    if len(pdf.raw_tex) > 10:
        problems.append(f"book.pdf: {len(pdf.raw_tex) - 10} more raw TeX fragment(s)")
    problems += print_problems(book, pdf)
    ranges = pdf.doc_pages([p.with_suffix("").as_posix() for p in book.pages])
    with_math = 0
    for page in book.pages:
        name, site_page = page.with_suffix("").as_posix(), book.html / page.with_suffix(".html")
        nodes = len(MATH_NODE.findall(site_page.read_text(errors="replace"))) if site_page.exists() else 0
        with_math += bool(nodes)
        if name not in ranges:
            problems.append(f"book.pdf: no named destination for {page} (document-{name}): "
                            "cannot tell which PDF pages are its own")
            continue
        span = ranges[name]
        where = f"PDF pages {span.start}-{span.stop - 1}"
        if nodes and not set(span) & set(pdf.math_pages):
            problems.append(f"book.pdf: {page} has {nodes} math node(s) on the site but none of "
                            f"its {where} uses MathJax fonts (math not typeset?)")
        shown = sum(pdf.images.get(p, 0) for p in span)
        if pngs.get(name, 0) > shown:
            problems.append(f"book.pdf: {page} shows {pngs[name]} figure(s) but its {where} "
                            f"hold {shown} image(s)")
    if len(pdf.math_pages) < with_math:
        problems.append(f"book.pdf: {len(pdf.math_pages)} page(s) use MathJax fonts, fewer than "
                        f"the {with_math} toc pages with math")
    if pdf.image_count < sum(pngs.values()):
        problems.append(f"book.pdf: {pdf.image_count} image(s), fewer than the "
                        f"{sum(pngs.values())} figures in the executed notebooks")
    return summary
