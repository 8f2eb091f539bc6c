"""The site audits can fail: a TeX error and a CDN script are caught on a real build."""

from __future__ import annotations

import shutil

import pytest

from bookbuild.book import Book
from bookbuild.browser import Browser, find_chromium, serve, typeset_counts
from bookbuild.audit import audit_math, audit_offline
from bookbuild.site import build_site

pytestmark = pytest.mark.slow
REAL = Book.here()


@pytest.fixture
def math_book(tmp_path) -> Book:
    """A one-page book using the real _config.yml (macros, offline MathJax, noundefined)."""
    root = tmp_path / "mathbook"
    root.mkdir()
    for name in ("_config.yml", "references.bib"):
        shutil.copy2(REAL.root / name, root / name)
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    (root / "data").mkdir()
    (root / "data" / "params.yaml").write_text("{}\n")
    (root / "intro.md").write_text(
        "# Math\n\nA book macro $\\W_{ij} \\in \\R^{p\\times d}$ and an unknown one "
        "$\\nosuchmacro{x}$.\n\n```python\nshort_line = 1\n```\n\n"
        "```python\nwide_line = [" + ", ".join(["0"] * 120) + "]\n```\n")
    assert build_site(Book(root), echo=lambda _: None)
    return Book(root)


@pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed")
def test_unknown_macro_is_reported_and_known_macros_typeset(math_book):
    result = audit_math(math_book)
    assert [p for p in result.problems if "mjx-merror" in p] == ["intro.html: 1 TeX error(s) (mjx-merror)"]
    assert (math_book.build / "screenshots" / "intro.png").exists()


@pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed")
def test_a_code_block_wider_than_the_page_is_reported(math_book):
    [problem] = [p for p in audit_math(math_book).problems if "scrolls sideways" in p]
    assert problem.startswith("intro.html: scrolls sideways") and "wide_line" in problem


def test_offline_check_catches_a_cdn_script(math_book):
    assert audit_offline(math_book).ok
    page = math_book.html / "intro.html"
    page.write_text(page.read_text().replace(
        "</head>", '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js">'
                   "</script></head>"))
    [problem] = audit_offline(math_book).problems
    assert "cdn.jsdelivr.net" in problem


@pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed")
def test_render_waits_for_mathjax_to_finish_not_for_a_time_budget(tmp_path):
    # A stand-in MathJax whose typesetting finishes 1.5 s after load.
    (tmp_path / "page.html").write_text(
        "<html><body><p>x</p><script>window.MathJax = {startup: {promise: new Promise("
        "r => setTimeout(() => { document.body.appendChild(document.createElement("
        "'mjx-' + 'container')); r(); }, 1500))}};</script></body></html>")
    (tmp_path / "plain.html").write_text("<html><body><p>no math</p></body></html>")
    with serve(tmp_path) as base, Browser(find_chromium()) as browser:
        late = browser.render(f"{base}/page.html", screenshot=tmp_path / "page.png")
        plain = browser.render(f"{base}/plain.html")
    assert late.typeset and typeset_counts(late.dom) == (1, 0)
    assert (tmp_path / "page.png").exists()
    assert not plain.typeset and typeset_counts(plain.dom) == (0, 0)
