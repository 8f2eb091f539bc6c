"""`make bundle`: the archive holds what it should, its PDF has typeset math and figures, a
failed build keeps the last bundle, and the bundle audit catches a broken archive."""

from __future__ import annotations

import dataclasses
import io
import zipfile

import nbformat
import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from bookbuild.bundle import (NAME, BundleError, PdfReport, analyse_pdf, archive_path, build_bundle,
                              bookmark_title, inspect_bundle, print_problems)
from bookbuild.site import STAMP, stage, tree_hash

from .conftest import INTRO, NOTEBOOK, copy_book, needs_chromium, quiet


def members(archive) -> set[str]:
    with zipfile.ZipFile(archive) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
    assert all(n.startswith(f"{NAME}/") for n in names)
    return {n.removeprefix(f"{NAME}/") for n in names}


@pytest.mark.slow
@needs_chromium
def test_bundle_of_a_small_book(built_book):
    book, archive = built_book, archive_path(built_book)
    site = {f"site/{p.relative_to(book.html).as_posix()}" for p in book.html.rglob("*") if p.is_file()}
    assert {"site/index.html", "site/intro.html", "site/claims.html",
            "site/chapters/demo/demo.html"} <= site
    assert members(archive) == site | {"README.txt", "requirements.txt", "book.pdf",
                                       f"notebooks/{NOTEBOOK}"}
    with zipfile.ZipFile(archive) as zf:
        nb = nbformat.reads(zf.read(f"{NAME}/notebooks/{NOTEBOOK}").decode(), as_version=4)
        pdf = analyse_pdf(zf.read(f"{NAME}/book.pdf"))
        assert "site/index.html" in zf.read(f"{NAME}/README.txt").decode()
    nbformat.validate(nb)
    assert any(c.get("outputs") for c in nb.cells), "an executed notebook"
    assert "book-figure-image" in (book.html / "chapters/demo/demo.html").read_text()
    assert pdf.starts["contents"] == 2 and pdf.starts["intro"] == 3, "title page, contents, intro"
    assert pdf.math_pages and pdf.math_pages[0] == 3, "the intro page's math is typeset"
    assert pdf.raw_tex == [] and pdf.image_count >= 1
    assert pdf.starts["claims"] == 4 and pdf.starts["chapters/demo/demo"] > 4, \
        "each document starts on its own page"
    assert "an executable book" in pdf.texts[0] and f"Claims {pdf.starts['claims']}" in pdf.texts[1]
    assert [t for _, t in pdf.bookmarks] == ["Contents", "Fixture", "Claims", "Demo"]
    assert pdf.unnumbered() == [] and not any("Run this locally" in t for t in pdf.texts)
    assert list((book.build / "bundle").glob("preview-*.png"))
    assert inspect_bundle(book).problems == []


@pytest.mark.slow
@needs_chromium
def test_a_failed_single_page_build_keeps_the_last_bundle(built_book, tmp_path):
    book = copy_book(built_book, tmp_path / "book")
    before = archive_path(book).read_bytes()
    (book.root / "intro.md").write_text(INTRO + "\nSee {ref}`no-such-label`.\n")
    (book.html / STAMP).write_text(tree_hash(stage(book)) + "\n")  # as if the site were current
    with pytest.raises(BundleError, match="single-page build failed"):
        build_bundle(book, echo=quiet)
    assert archive_path(book).read_bytes() == before
    assert not (book.build / "bundle-new").exists()


def raw_tex_pdf() -> bytes:
    """One page of Helvetica text with TeX that was never typeset."""
    writer = PdfWriter()
    page = writer.add_blank_page(300, 200)
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                             NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    text = r"Raw \(\frac{a}{b}\) and $$\mathcal{W}$$."
    content = DecodedStreamObject()
    content.set_data(("BT /F1 12 Tf 10 100 Td (%s) Tj ET" % text.replace(
        "\\", "\\\\").replace("(", "\\(").replace(")", "\\)")).encode())
    page[NameObject("/Contents")] = writer._add_object(content)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_inspect_bundle_reports_a_broken_archive(fixture_book):
    book = fixture_book
    assert inspect_bundle(book).problems[0].endswith("missing: run `make bundle`")
    # A site (not rendered: the check reads only its pages and stamp).
    for name, text in {"index.html": "<h1>x</h1>", "chapters/demo/demo.html": "<h1>Demo</h1>",
                       "intro.html": '<h1>Fixture</h1><span class="math notranslate">x</span>',
                       STAMP: "digest\n"}.items():
        (book.html / name).parent.mkdir(parents=True, exist_ok=True)
        (book.html / name).write_text(text)
    archive = archive_path(book)
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for path in book.html.rglob("*"):
            zf.write(path, f"{NAME}/site/{path.relative_to(book.html).as_posix()}")
        zf.writestr(f"{NAME}/book.pdf", raw_tex_pdf())
        zf.writestr(f"{NAME}/requirements.txt", "numpy\n")
        zf.writestr(f"{NAME}/README.txt", "read me\n")

    problems = inspect_bundle(book).problems

    assert f"{archive.name}: notebooks/{NOTEBOOK} missing" in problems
    assert any(p.startswith("book.pdf page 1: raw TeX in the text: '\\\\('") for p in problems)
    assert any("'\\\\frac'" in p for p in problems)
    assert "book.pdf: 0 page(s) use MathJax fonts, fewer than the 1 toc pages with math" in problems
    assert any(p.startswith(f"book.pdf: no named destination for {NOTEBOOK}") for p in problems)
    assert not any("not the current" in p for p in problems)

    # The notebook present but never executed; the site rebuilt since.
    with zipfile.ZipFile(archive, "a") as zf:
        zf.write(book.root / NOTEBOOK, f"{NAME}/notebooks/{NOTEBOOK}")
    (book.html / STAMP).write_text("another digest\n")
    problems = inspect_bundle(book).problems
    assert f"notebooks/{NOTEBOOK}: has no outputs (not an executed notebook)" in problems
    assert f"{archive.name}: its site/ is not the current {book.html}: run `make bundle`" in problems
    assert not any("missing" in p for p in problems)


def test_print_problems_name_what_a_printed_book_lacks(fixture_book):
    book = fixture_book  # title "Fixture"; toc: intro, then chapters/demo/demo
    (book.html / "chapters" / "demo").mkdir(parents=True)
    (book.html / "intro.html").write_text("<title>Fixture &#8212; Fixture</title>")
    (book.html / "chapters/demo/demo.html").write_text("<title>A demo &#8212; Fixture</title>")
    good = PdfReport(pages=4, starts={"contents": 2, "intro": 3, "chapters/demo/demo": 4},
                     bookmarks=[(0, "Contents"), (0, "Fixture"), (1, "A demo")],
                     texts=["Fixture an executable book 1 / 4", "Contents Fixture 3 A demo 4 2 / 4",
                            "Fixture text 3 / 4", "A demo more text 4 / 4"],
                     links=[(3, "https://arxiv.org/abs/2512.15115")])
    assert print_problems(book, good) == []
    bad = dataclasses.replace(
        good, bookmarks=[(0, "Fixture")], links=[(3, "http://127.0.0.1:8000/chapters/demo/demo.html")],
        texts=["Contents A demo 5 1 / 4", "2 / 4", "Show code cell source 3 / 4", "A demo"])
    problems = print_problems(book, bad)
    assert problems == [
        "book.pdf: page 1 is not a title page (no 'Fixture' on it)",
        "book.pdf: the contents list lacks 'Fixture' with its page 3",
        "book.pdf: the contents list lacks 'A demo' with its page 4",
        "book.pdf: no bookmark for 1 part(s) or document(s): 'A demo'",
        "book.pdf: 1 page(s) without a page number, e.g. [4]",
        "book.pdf: 1 link(s) to the local server it was printed from, e.g. page 3: "
        "http://127.0.0.1:8000/chapters/demo/demo.html",
        "book.pdf page 3: widget text 'Show code cell'"]
    assert "no contents list" in print_problems(book, dataclasses.replace(good, starts={"intro": 3}))[0]


def test_bookmark_title_drops_a_heading_named_twice_over():
    assert bookmark_title("Structured dynamicsStructured dynamics") == "Structured dynamics"
    assert bookmark_title("abab ab") == "abab ab" and bookmark_title("") == ""
