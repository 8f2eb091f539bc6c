"""``make bundle``: the book to take away, in one zip archive that reads fully offline.

The archive ``_build/bundle/how-many-heads-make-an-ssm.zip`` holds, under one top folder:

* ``site/``: the HTML site (``_build/html``), MathJax included;
* ``notebooks/<source path>.ipynb``: every executed notebook, plain nbformat JSON with outputs;
* ``requirements.txt``: the pinned environment;
* ``book.pdf``: the whole book, printed by headless Chromium from a single-page HTML build
  (``jupyter-book build --builder singlehtml``, strict like the site) once MathJax has
  typeset it; no LaTeX involved;
* ``README.txt``: how to read it.

Next to the archive, ``book.pdf`` and two ``preview-<page>.png`` (pages with math and a
figure, rendered by ``pdftoppm``) are kept for people to look at. Everything is built in
``_build/bundle-new`` and swapped into ``_build/bundle`` only on success.

:func:`check_bundle` verifies an archive: contents, notebooks readable with outputs, the
PDF's math typeset (MathJax fonts on the pages of every document that has math, no raw TeX
in its text) and its figures present.
"""

from __future__ import annotations

import html
import io
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import nbformat

from .book import Book, BookError
from .cache import tree_hash
from .browser import Browser, find_chromium, serve
from .site import STAMP

NAME = "how-many-heads-make-an-ssm"
ARCHIVE = f"{NAME}.zip"

#: Printing the book takes well under a minute; allow for slower machines and longer books.
PRINT_TIMEOUT = 600

#: Injected into the single page before printing: A4, each toc page starts on a new PDF page
#: (so every document owns its pages), no box shadows (Chromium rasterises them into images),
#: code and text outputs wrapped at the page edge (paper cannot scroll sideways),
#: and a hidden link to every document so Chromium writes a named destination for each one
#: (``/document-<docname>``), from which :func:`analyse_pdf` finds each document's pages.
PRINT_CSS = """<style media="print">
@page { size: A4; margin: 16mm 14mm; }
span[id^="document-"] { display: block; break-before: page; }
:root:root:root *, :root:root:root *::before, :root:root:root *::after {
  box-shadow: none !important; text-shadow: none !important; }
pre { white-space: pre-wrap !important; overflow-wrap: anywhere; }
</style>"""

README = """\
How Many Heads Make an SSM? -- an executable book (offline copy)
================================================================

Everything here reads without a network connection.

  site/index.html    the book as a web site: open it in any browser (math is typeset by a
                     MathJax copy inside site/). To serve it instead:
                     python3 -m http.server -d site 8000, then http://127.0.0.1:8000
  book.pdf           the whole book as one PDF (printed from the site, math and figures)
  notebooks/         every notebook, executed, with its outputs: opens in any Jupyter
                     (JupyterLab, Notebook, VS Code) without running anything
  requirements.txt   the pinned Python environment, to run the notebooks yourself:
                     python3 -m venv .venv && .venv/bin/pip install -r requirements.txt

Built from commit {commit}.
"""

#: Raw TeX that typeset math never leaves in a PDF's text (checked outside code and math fonts).
_RAW_TEX = re.compile(r"\\[()\[\]]|\$\$|\\[A-Za-z]+|\$[^$\s][^$\n]{0,200}?\$")
_MATH_FONT = re.compile(r"MathJax|MJX", re.I)
_MONO_FONT = re.compile(r"Mono|Courier|Consol|Menlo", re.I)
_MATH_NODE = re.compile(r'class="math[ "]')
_HIDDEN_TAGS = {"remove-cell", "remove-output", "remove_cell", "remove_output"}


class BundleError(BookError):
    """``make bundle`` could not produce an archive (reported without a traceback)."""


def archive_path(book: Book) -> Path:
    return book.build / "bundle" / ARCHIVE


# --- the PDF ------------------------------------------------------------------------------
@dataclass
class PdfReport:
    pages: int = 0
    math_pages: list[int] = field(default_factory=list)   # 1-based
    images: dict[int, int] = field(default_factory=dict)  # page -> image XObjects drawn
    raw_tex: list[tuple[int, str]] = field(default_factory=list)
    starts: dict[str, int] = field(default_factory=dict)  # docname -> first page

    @property
    def image_count(self) -> int:
        return sum(self.images.values())

    def doc_pages(self, docnames: list[str]) -> dict[str, range]:
        """Page range of each document (the root document starts on page 1)."""
        starts = {**self.starts, docnames[0]: 1} if docnames else dict(self.starts)
        ordered = sorted((page, name) for name, page in starts.items() if name in docnames)
        ranges = {}
        for i, (page, name) in enumerate(ordered):
            end = ordered[i + 1][0] if i + 1 < len(ordered) else self.pages + 1
            ranges[name] = range(page, max(end, page + 1))
        return ranges


def _font_name(font) -> str:
    """BaseFont, FontName and FontFamily of a font (Chromium's Type 3 fonts only have the
    latter two, e.g. ``MathJax_Math-Italic``)."""
    font = font.get_object()
    parts = [str(font.get("/BaseFont", ""))]
    descriptor = font.get("/FontDescriptor")
    if descriptor is None and "/DescendantFonts" in font:
        descriptor = font["/DescendantFonts"][0].get_object().get("/FontDescriptor")
    if descriptor is not None:
        descriptor = descriptor.get_object()
        parts += [str(descriptor.get("/FontName", "")), str(descriptor.get("/FontFamily", ""))]
    return " ".join(parts)


def _resources(resources, fonts: set, images: set, seen: set) -> None:
    """Fonts and image XObjects of a resource dictionary, descending into form XObjects."""
    if resources is None:
        return
    resources = resources.get_object()
    for font in (resources.get("/Font") or {}).values():
        fonts.add(_font_name(font))
    for ref in (resources.get("/XObject") or {}).values():
        key = getattr(ref, "idnum", None) or id(ref)
        xobject = ref.get_object()
        if xobject.get("/Subtype") == "/Image":
            images.add(key)
        elif xobject.get("/Subtype") == "/Form" and key not in seen:
            seen.add(key)
            _resources(xobject.get("/Resources"), fonts, images, seen)


def analyse_pdf(data: bytes) -> PdfReport:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    report = PdfReport(pages=len(reader.pages))
    for name, dest in reader.named_destinations.items():
        name = name.lstrip("/")
        if name.startswith("document-"):
            number = reader.get_destination_page_number(dest)
            if number is not None and number >= 0:
                report.starts[name.removeprefix("document-")] = number + 1
    for number, page in enumerate(reader.pages, 1):
        fonts, images = set(), set()
        _resources(page.get("/Resources"), fonts, images, set())
        if any(_MATH_FONT.search(f) for f in fonts):
            report.math_pages.append(number)
        report.images[number] = len(images)
        prose: list[str] = []

        def visit(text, _cm, _tm, font, _size, prose=prose):
            name = _font_name(font) if font is not None else ""
            if not (_MATH_FONT.search(name) or _MONO_FONT.search(name)):
                prose.append(text)

        page.extract_text(visitor_text=visit)
        for m in _RAW_TEX.finditer("".join(prose)):
            report.raw_tex.append((number, m.group(0)[:60]))
    return report


# --- what the book should put into the bundle ----------------------------------------------
def _docname(page: Path) -> str:
    return page.with_suffix("").as_posix()


def _visible_pngs(nb) -> int:
    """Figures a notebook shows on its page: PNG outputs of cells not removed, not glued."""
    count = 0
    for cell in nb.cells:
        if _HIDDEN_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue
        for out in cell.get("outputs", []):
            if "image/png" in out.get("data", {}) and "scrapbook" not in out.get("metadata", {}):
                count += 1
    return count


def expected_files(book: Book) -> set[str]:
    """Archive members that must be present (relative to the archive's top folder)."""
    files = {"README.txt", "requirements.txt", "book.pdf", "site/index.html"}
    files |= {f"site/{page.with_suffix('.html').as_posix()}" for page in book.pages}
    files |= {f"notebooks/{nb.as_posix()}" for nb in book.notebooks}
    return files


# --- building -----------------------------------------------------------------------------
def _render_single_page(book: Book, scratch: Path, echo) -> Path:
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book), "build", "--builder", "singlehtml", "-W", "-n",
               "--keep-going", "--path-output", str(scratch / "jb"), str(book.stage)]
    echo("[bundle] rendering the single-page book (jupyter-book build --builder singlehtml "
         "-W -n --keep-going)")
    proc = subprocess.run(command, capture_output=True, text=True)
    log = book.build / "bundle-jupyter-book.log"
    log.write_text(proc.stdout + proc.stderr)
    built = scratch / "jb" / "_build" / "singlehtml"
    page = built / f"{_docname(book.pages[0])}.html"
    if proc.returncode != 0 or not page.exists():
        problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                    if "WARNING" in line or "ERROR" in line or "Error" in line]
        for line in problems[:40] or (proc.stdout + proc.stderr).splitlines()[-20:]:
            echo(f"  {line}")
        raise BundleError(f"the single-page build failed (full log: {log}); "
                          "the previous bundle is untouched")
    # The print copy: page breaks, no shadows, and a hidden link to every document.
    text = page.read_text()
    links = "".join(f'<a href="#document-{html.escape(_docname(p))}"></a>'
                    for p in book.pages[1:])
    text = text.replace("</head>", PRINT_CSS + "</head>", 1)
    text = text.replace("</body>", f'<div style="display:none">{links}</div></body>', 1)
    (built / "print.html").write_text(text)
    return built


def _print_pdf(built: Path, pdf: Path, binary: str, echo) -> None:
    echo("[bundle] printing it to PDF with headless Chromium (after MathJax has typeset)")
    from playwright.sync_api import Error as PlaywrightError

    try:
        with serve(built) as base, Browser(binary, timeout_ms=PRINT_TIMEOUT * 1000) as browser:
            browser.print_pdf(f"{base}/print.html", pdf)
    except PlaywrightError as err:
        raise BundleError(f"Chromium did not print the book: {str(err).splitlines()[0]}") from None
    if not pdf.exists() or pdf.stat().st_size == 0:
        raise BundleError("Chromium wrote no PDF")


def preview_pages(report: PdfReport) -> list[int]:
    """Two pages to look at: pages with both math and a figure first, then math or figures."""
    both = [p for p in report.math_pages if report.images.get(p)]
    figures = [p for p, n in report.images.items() if n]
    ordered = []
    for p in (both[:1] + both[len(both) // 2:] + report.math_pages + figures):
        if p not in ordered:
            ordered.append(p)
    return sorted(ordered[:2]) or [1]


def _previews(pdf: Path, pages: list[int], out: Path) -> list[Path]:
    made = []
    for page in pages:
        prefix = out / f"preview-{page}"
        subprocess.run(["pdftoppm", "-png", "-r", "80", "-singlefile", "-f", str(page),
                        "-l", str(page), str(pdf), str(prefix)], check=True,
                       capture_output=True)
        made.append(prefix.with_suffix(".png"))
    return made


def _write_archive(book: Book, pdf: Path, target: Path) -> None:
    top = PurePosixPath(NAME)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(str(top / "README.txt"), README.format(commit=book.commit()))
        archive.write(book.root / "requirements.txt", str(top / "requirements.txt"))
        archive.write(pdf, str(top / "book.pdf"))
        for nb_path in book.notebooks:
            nb = nbformat.read(book.executed / nb_path, as_version=4)
            nbformat.validate(nb)
            archive.writestr(str(top / "notebooks" / nb_path.as_posix()), nbformat.writes(nb))
        for path in sorted(book.html.rglob("*")):
            if path.is_file():
                archive.write(path, str(top / "site" / path.relative_to(book.html).as_posix()))


def build_bundle(book: Book, echo=print) -> Path:
    """Build the archive from the current site and executed notebooks; returns its path."""
    stamp = book.html / STAMP
    if not stamp.exists() or not book.stage.exists():
        raise BundleError("no site to bundle: run `make book` first")
    if stamp.read_text().strip() != tree_hash(book.stage):
        raise BundleError("the site is not built from the current staged sources: "
                          "run `make book` first")
    missing = [str(nb) for nb in book.notebooks if not (book.executed / nb).exists()]
    if missing:
        raise BundleError(f"notebooks never executed: {', '.join(missing)}")
    binary = find_chromium()
    if binary is None:
        raise BundleError("Chromium not found (it prints the PDF): apt-get install -y chromium")
    if shutil.which("pdftoppm") is None:
        raise BundleError("pdftoppm not found (it renders the PDF previews): "
                          "apt-get install -y poppler-utils")
    started = time.perf_counter()
    scratch = book.build / "bundle-new"
    shutil.rmtree(scratch, ignore_errors=True)
    out = scratch / "out"
    out.mkdir(parents=True)
    try:
        built = _render_single_page(book, scratch, echo)
        pdf = out / "book.pdf"
        _print_pdf(built, pdf, binary, echo)
        report = analyse_pdf(pdf.read_bytes())
        for png in _previews(pdf, preview_pages(report), out):
            echo(f"[bundle] preview: {book.build / 'bundle' / png.name}")
        _write_archive(book, pdf, out / ARCHIVE)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    target = book.build / "bundle"
    old = book.build / "bundle.old"
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    out.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    echo(f"[bundle] built in {time.perf_counter() - started:.1f} s")
    return target / ARCHIVE


# --- checking -----------------------------------------------------------------------------
@dataclass
class BundleSummary:
    archive: Path
    size: int = 0
    pdf: PdfReport | None = None
    problems: list[str] = field(default_factory=list)


def inspect_bundle(book: Book, archive: Path | None = None) -> BundleSummary:
    """Problems of an archive (default: the book's) and what its PDF holds."""
    archive = archive or archive_path(book)
    summary = BundleSummary(archive)
    problems = summary.problems
    if not archive.exists():
        problems.append(f"{archive} missing: run `make bundle`")
        return summary
    summary.size = archive.stat().st_size
    stamp = book.html / STAMP
    if not stamp.exists():
        problems.append(f"{book.html} has no build stamp: no site to compare the bundle with")
    elif archive.stat().st_mtime < stamp.stat().st_mtime:
        problems.append(f"{archive.name} is older than the site {book.html}: run `make bundle`")
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as err:
        problems.append(f"{archive.name} is not a readable zip archive: {err}")
        return summary
    with zf:
        prefix = f"{NAME}/"
        names = {n.removeprefix(prefix) for n in zf.namelist() if not n.endswith("/")}
        outside = sorted(n for n in zf.namelist() if not n.startswith(prefix))
        if outside:
            problems.append(f"{len(outside)} member(s) outside the top folder {prefix}: "
                            f"{outside[:3]}")
        for name in sorted(expected_files(book) - names):
            problems.append(f"{archive.name}: {name} missing")
        if stamp.exists() and f"site/{STAMP}" in names and (
                zf.read(prefix + f"site/{STAMP}").decode().strip() != stamp.read_text().strip()):
            problems.append(f"{archive.name}: its site/ is not the current {book.html} "
                            "(built from other sources): run `make bundle`")
        pngs = {}
        for nb_path in book.notebooks:
            member = f"notebooks/{nb_path.as_posix()}"
            if member not in names:
                continue
            try:
                nb = nbformat.reads(zf.read(prefix + member).decode(), as_version=4)
                nbformat.validate(nb)
            except Exception as err:  # noqa: BLE001 - any failure to open is the problem
                problems.append(f"{member}: does not open with nbformat: "
                                f"{type(err).__name__}: {err}"[:300])
                continue
            outputs = sum(len(c.get("outputs", [])) for c in nb.cells)
            if not outputs:
                problems.append(f"{member}: has no outputs (not an executed notebook)")
            pngs[_docname(nb_path)] = _visible_pngs(nb)
        if "book.pdf" in names:
            try:
                summary.pdf = analyse_pdf(zf.read(prefix + "book.pdf"))
            except Exception as err:  # noqa: BLE001
                problems.append(f"book.pdf: unreadable PDF: {type(err).__name__}: {err}")
    if summary.pdf is not None:
        problems += _pdf_problems(book, summary.pdf, pngs)
    return summary


def _pdf_problems(book: Book, pdf: PdfReport, pngs: dict[str, int]) -> list[str]:
    problems = []
    for page, snippet in pdf.raw_tex[:10]:
        problems.append(f"book.pdf page {page}: raw TeX in the text: {snippet!r} "
                        "(math not typeset before printing?)")
    if len(pdf.raw_tex) > 10:
        problems.append(f"book.pdf: {len(pdf.raw_tex) - 10} more raw TeX fragment(s)")
    docnames = [_docname(p) for p in book.pages]
    ranges = pdf.doc_pages(docnames)
    with_math = 0
    for page in book.pages:
        name = _docname(page)
        site_page = book.html / page.with_suffix(".html")
        nodes = len(_MATH_NODE.findall(site_page.read_text(errors="replace"))) \
            if site_page.exists() else 0
        if nodes:
            with_math += 1
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
    return problems


def check_bundle(book: Book) -> list[str]:
    """Problems with ``_build/bundle`` (empty when the archive is complete and current)."""
    return inspect_bundle(book).problems
