"""`make bundle`: the archive holds what it should, its PDF has typeset math and figures, and
the bundle check catches a broken archive."""

from __future__ import annotations

import os
import shutil
import zipfile

import nbformat
import pytest

from bookbuild.book import Book
from bookbuild.bundle import (NAME, BundleError, analyse_pdf, archive_path, build_bundle,
                              check_bundle)
from bookbuild.cache import tree_hash
from bookbuild.browser import Browser, find_chromium, serve
from bookbuild.execute import execute_notebooks
from bookbuild.site import STAMP, build_site

from .conftest import NOTEBOOK

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_chromium() is None,
                       reason="Chromium not installed (it prints the PDF)"),
    pytest.mark.skipif(shutil.which("pdftoppm") is None,
                       reason="pdftoppm not installed (apt-get install -y poppler-utils)"),
]
REAL = Book.here()
INTRO = r"""# Fixture

A book macro $\W_{ij} \in \R^{p\times d}$ inline, and on its own line

$$
y_i = \sum_{j=1}^{n} \W_{ij}(X)\, x_j .
$$

See the demo.
"""


def quiet(_line):
    pass


def members(archive) -> set[str]:
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
    assert all(n.startswith(f"{NAME}/") for n in names)
    return {n.removeprefix(f"{NAME}/") for n in names if not n.endswith("/")}


def test_bundle_of_a_small_book(fixture_book):
    book = fixture_book
    for name in ("_config.yml", "references.bib"):
        shutil.copy2(REAL.root / name, book.root / name)
    (book.root / "intro.md").write_text(INTRO)
    assert not execute_notebooks(book, echo=quiet).failed
    assert build_site(book, echo=quiet)

    archive = build_bundle(book, echo=quiet)

    assert archive == archive_path(book)
    site = {f"site/{p.relative_to(book.html).as_posix()}"
            for p in book.html.rglob("*") if p.is_file()}
    assert {"site/index.html", "site/intro.html", "site/chapters/demo/demo.html"} <= site
    assert members(archive) == site | {"README.txt", "requirements.txt", "book.pdf",
                                       f"notebooks/{NOTEBOOK}"}
    with zipfile.ZipFile(archive) as zf:
        nb = nbformat.reads(zf.read(f"{NAME}/notebooks/{NOTEBOOK}").decode(), as_version=4)
        pdf = analyse_pdf(zf.read(f"{NAME}/book.pdf"))
        readme = zf.read(f"{NAME}/README.txt").decode()
    nbformat.validate(nb)
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert "site/index.html" in readme

    assert pdf.math_pages and pdf.math_pages[0] == 1, "the intro page's math is typeset"
    assert pdf.raw_tex == []
    assert pdf.image_count >= 1
    assert pdf.starts == {"chapters/demo/demo": 2}, "each document starts on its own page"
    assert (book.build / "bundle" / "book.pdf").exists()
    assert list((book.build / "bundle").glob("preview-*.png"))
    assert check_bundle(book) == []

    # A failing single-page build (strict: an unknown reference) keeps the last bundle.
    before = archive.read_bytes()
    intro = book.stage / "intro.md"
    intro.write_text(intro.read_text() + "\nSee {ref}`no-such-label`.\n")
    (book.html / STAMP).write_text(tree_hash(book.stage) + "\n")
    with pytest.raises(BundleError, match="single-page build failed"):
        build_bundle(book, echo=quiet)
    assert archive.read_bytes() == before
    assert not (book.build / "bundle-new").exists()


def _print(html: str, directory, pdf) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "page.html").write_text(html)
    with serve(directory) as base, Browser(find_chromium()) as browser:
        browser.print_pdf(f"{base}/page.html", pdf)
    assert pdf.exists()


def test_check_bundle_reports_a_broken_archive(fixture_book, tmp_path):
    book = fixture_book
    assert check_bundle(book)[0].endswith("missing: run `make bundle`")
    # A site (not rendered: check_bundle only reads its pages and stamp).
    for page, text in {"index.html": "<h1>x</h1>",
                       "intro.html": '<h1>Fixture</h1><span class="math notranslate">x</span>',
                       "chapters/demo/demo.html": "<h1>Demo</h1>"}.items():
        (book.html / page).parent.mkdir(parents=True, exist_ok=True)
        (book.html / page).write_text(text)
    (book.html / STAMP).write_text("digest\n")
    # A PDF printed without MathJax: the TeX stays raw, no math fonts, no destinations.
    pdf = tmp_path / "raw.pdf"
    _print(r"<h1>Fixture</h1><p>Raw \(\frac{a}{b}\) and $$\mathcal{W}$$.</p>",
           tmp_path / "raw", pdf)
    archive = archive_path(book)
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for path in book.html.rglob("*"):
            zf.write(path, f"{NAME}/site/{path.relative_to(book.html).as_posix()}")
        zf.write(pdf, f"{NAME}/book.pdf")
        zf.writestr(f"{NAME}/requirements.txt", "numpy\n")
        zf.writestr(f"{NAME}/README.txt", "read me\n")

    problems = check_bundle(book)

    assert f"{archive.name}: notebooks/{NOTEBOOK} missing" in problems
    assert any(p.startswith("book.pdf page 1: raw TeX in the text: '\\\\('") for p in problems)
    assert any("'\\\\frac'" in p for p in problems)
    assert "book.pdf: 0 page(s) use MathJax fonts, fewer than the 1 toc pages with math" \
        in problems
    assert any(p.startswith(f"book.pdf: no named destination for {NOTEBOOK}") for p in problems)

    # The notebook present but never executed; the archive older than the site.
    with zipfile.ZipFile(archive, "a") as zf:
        zf.write(book.root / NOTEBOOK, f"{NAME}/notebooks/{NOTEBOOK}")
    later = archive.stat().st_mtime + 60
    os.utime(book.html / STAMP, (later, later))
    problems = check_bundle(book)
    assert f"notebooks/{NOTEBOOK}: has no outputs (not an executed notebook)" in problems
    assert f"{archive.name} is older than the site {book.html}: run `make bundle`" in problems
    assert not any("missing" in p for p in problems)
