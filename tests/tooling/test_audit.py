"""The site audits pass on a good build and fail on what each one guards."""

from __future__ import annotations

import base64
import re
import struct
import zlib

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from bookbuild import audit
from bookbuild.audit import (
    audit_figures,
    audit_math,
    audit_notebook_errors,
    audit_offline,
    audit_pages,
    audit_reading,
    audit_results,
    audit_search,
    external_resources,
    png_width,
    reading_problems,
)
from bookbuild.notebook import FIGURE_DPI
from bookbuild.results import refresh

from .conftest import copy_book, needs_chromium, quiet


def test_external_resources_found_and_local_ones_allowed():
    page = """
    <link rel="stylesheet" href="_static/theme.css">
    <link rel="stylesheet" href="https://cdn.example.org/x.css">
    <link rel="canonical" href="https://example.org/page.html">
    <script src="_static/mathjax/tex-chtml.js"></script>
    <script src="//cdn.example.org/mathjax.js"></script>
    <img src="data:image/png;base64,AAAA"><img src="http://example.org/a.png">
    <a href="https://example.org">a plain link is not a request</a>
    <style>@import 'https://fonts.example.org/f.css';</style>
    """
    found = external_resources(page)
    assert len(found) == 4
    assert any("x.css" in f for f in found) and any("mathjax.js" in f for f in found)
    assert any("a.png" in f for f in found) and any("fonts.example.org" in f for f in found)


@pytest.mark.parametrize("check", [audit.audit_math, audit.audit_search])
def test_missing_browser_is_a_skip_or_a_failure_never_a_pass(fixture_book, monkeypatch, check):
    monkeypatch.setattr(audit, "find_chromium", lambda: None)
    skipped = check(fixture_book, require_browser=False)
    assert skipped.skipped and "did NOT run" in skipped.summary and not skipped.problems
    required = check(fixture_book, require_browser=True)
    assert not required.skipped and not required.ok
    assert "Chromium not found" in required.problems[0]


# --- (j) how a notebook page reads ------------------------------------------------------------
def png(width: int, height: int = 2) -> str:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\xff" * (3 * width) for _ in range(height))
    body = (chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def page(*cells):
    nb = new_notebook()
    nb.cells = list(cells)
    return nb


def code(source, tags=(), outputs=()):
    cell = new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    cell.outputs = list(outputs)
    return cell


PROSE = new_markdown_cell(" ".join(["word"] * 100))


def test_png_width_reads_the_header():
    assert png_width(png(123)) == 123


def test_a_page_that_reads_well_has_no_problems():
    good = page(PROSE, code("import x", ["remove-input"]), code("y = f(x)\ny"),
                code("plot()", outputs=[new_output("display_data", data={
                    "image/png": png(int(7.9 * FIGURE_DPI)), "text/plain": "<Figure size 700x400>"})]))
    assert reading_problems(good, "good.ipynb") == []
    assert audit.reading_measures(good)["code lines per 100 words"][0] == 3


def test_each_reading_measure_fails_and_names_notebook_and_measure():
    long_line = "x = " + "1 + " * 30 + "1"
    bad = page(PROSE,
               code("\n".join(f"a{k} = {k}" for k in range(16))),             # 16 lines > 15
               code(long_line),                                                  # > 88 chars
               code("df.style", outputs=[new_output("execute_result", data={
                   "text/plain": "<pandas.io.formats.style.Styler at 0x7f00deadbeef>",
                   "text/html": '<table id="T_1a2b3_">'})]),
               code("len(x)", outputs=[new_output("execute_result", data={"text/plain": "7168"})]),
               code("plot()", outputs=[new_output("display_data", data={
                   "image/png": png(int(12.5 * FIGURE_DPI))})]))
    problems = reading_problems(bad, "chapters/x/bad.ipynb")
    text = "\n".join(problems)
    assert all(p.startswith("chapters/x/bad.ipynb: ") for p in problems) and len(problems) == 5
    for name in ("largest visible cell = 16", "lines over 88 characters = 1",
                 "object reprs and stray values = 3", "figures wider than 8 in = 1",
                 "code lines per 100 words = 20"):
        assert name in text, name
    assert "stray value '7168'" in text and "12.5 in" in text


def test_a_table_built_but_on_no_page_is_named():
    built = {"chapters/x/a.ipynb": 2, "chapters/x/b.ipynb": 1, "chapters/x/none.ipynb": 0}
    pages = ['<table class="book-table" data-book-table="chapters/x/a.ipynb 1">',
             '<p>x</p><table data-book-table="chapters/x/b.ipynb 1"></table>']
    assert audit.unshown_tables(built, pages) == ["chapters/x/a.ipynb: table 2 of 2 is on no page"]
    assert audit.unshown_tables(built, [*pages, 'data-book-table="chapters/x/a.ipynb 2"']) == []
    assert audit.unshown_tables({"chapters/x/a.ipynb": 1}, ['data-book-table="chapters/x/a.ipynb 11"'])
    import pandas as pd

    from bookbuild.notebook import Table  # a label the page escapes is found unescaped

    odd = 'chapters/x/q&a "b".ipynb'
    assert audit.unshown_tables({odd: 1}, [Table(pd.DataFrame({"a": [1]}), label=f"{odd} 1").html]) == []


# --- on a built book ----------------------------------------------------------------------------
@pytest.mark.slow
def test_audits_pass_on_a_good_build_and_catch_drift_and_missing_pages(built_book, tmp_path):
    book = copy_book(built_book, tmp_path / "book")
    assert refresh(book, echo=quiet) == 2  # `make data`: values.csv and its tolerances
    for check in (audit_pages, audit_notebook_errors, audit_offline, audit_results,
                  audit_figures, audit_reading):
        result = check(book)
        assert result.ok, (result.name, result.problems)
    assert audit_figures(book).summary == "1 figures saved, 1 shown"
    assert audit_reading(book).summary.endswith("; 1 tables built, each on a page")
    page = book.html / "chapters/demo/demo.html"  # a figure shown without alt text or number
    good_page = page.read_text()
    page.write_text(re.sub(r'alt="[^"]*"', 'alt=""', good_page.replace("caption-number", "x"), 1))
    assert audit_figures(book).problems == [
        "chapters/demo/demo.ipynb: a figure without alt text (4 words or more)",
        "chapters/demo/demo.ipynb: a figure without a numbered caption"]
    page.write_text(good_page.replace("data-book-table", "data-x"))  # its table dropped
    assert audit_reading(book).problems == ["chapters/demo/demo.ipynb: table 1 of 1 is on no page"]
    page.write_text(good_page)
    notebook = book.root / "chapters/demo/demo.ipynb"  # a saved figure no page shows
    notebook.write_text(notebook.read_text().replace("book-figure} demo/values", "note} x"))
    assert audit_figures(book).problems == [
        "demo/values.png: no page shows it (``{book-figure} demo/values``)"]
    table = book.committed_results / "demo" / "values.csv"
    rows = table.read_text().splitlines()
    i, value = rows[2].split(",")
    table.write_text("\n".join([*rows[:2], f"{i},{float(value) * (1 + 1e-9)}", *rows[3:]]) + "\n")
    [problem] = audit_results(book).problems
    assert problem.startswith(f"demo/values.csv: [row 2] value: committed {float(value) * (1 + 1e-9)}")
    (book.html / "claims.html").unlink()
    assert audit_pages(book).problems == ["claims.md: not rendered (_build/html/claims.html missing)"]
    intro = book.html / "intro.html"  # autodoc's reST parsed as Markdown shows as text
    intro.write_text(intro.read_text().replace("</h1>", "</h1><p>.. py:class:: lib.X(*args)</p>", 1))
    assert "intro.md: shows an unparsed directive '.. py:class::'" in audit_pages(book).problems


@pytest.mark.slow
def test_offline_audit_catches_a_cdn_script(built_book, tmp_path):
    book = copy_book(built_book, tmp_path / "book")
    page = book.html / "intro.html"
    page.write_text(page.read_text().replace(
        "</head>", '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js">'
                   "</script></head>"))
    [problem] = audit_offline(book).problems
    assert problem.startswith("intro.html: <script src> https://cdn.jsdelivr.net")


@pytest.mark.slow
@needs_chromium
def test_math_audit_passes_then_catches_a_tex_error_and_a_wide_block(built_book, tmp_path):
    result = audit_math(built_book)
    assert result.ok, result.problems
    assert result.summary.startswith("3 pages, 1 with math")
    assert (built_book.build / "screenshots" / "intro.png").exists()
    book = copy_book(built_book, tmp_path / "book")
    page = book.html / "intro.html"
    wide = "wide_line = [" + ", ".join(["0"] * 120) + "]"
    page.write_text(page.read_text().replace("#</a></h1>", (  # the article's title
        '#</a></h1><p><span class="math notranslate nohighlight">\\(\\nosuchmacro{x}\\)</span></p>'
        f'<div class="highlight"><pre>{wide}</pre></div>'), 1))
    problems = audit_math(book).problems
    assert problems[0] == "intro.html: 1 TeX error(s) (mjx-merror)"
    assert problems[1].startswith("intro.html: scrolls sideways") and "wide_line" in problems[1]
    assert len(problems) == 2


@pytest.mark.slow
@needs_chromium
def test_search_audit_finds_a_word_of_the_book_and_not_another(built_book):
    assert audit_search(built_book, word="Fixture").ok
    assert "found nothing" in audit_search(built_book, word="Zyzzyva").problems[0]
