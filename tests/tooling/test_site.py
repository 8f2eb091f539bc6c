"""The site: rendered only when the staged sources changed, swapped in only on success."""

from __future__ import annotations

import pytest

from bookbuild.site import build_site, stage, tree_hash

from .conftest import INTRO, copy_book

pytestmark = pytest.mark.slow


def test_unchanged_sources_skip_the_build_and_a_failed_build_keeps_the_site(built_book, tmp_path):
    book = copy_book(built_book, tmp_path / "book")
    lines = []
    assert build_site(book, echo=lines.append)
    assert lines == ["[book] site up to date (staged sources unchanged)"]
    before = {p: p.read_bytes() for p in book.html.rglob("*") if p.is_file()}
    # A broken cross-reference is a warning, and -W makes it an error.
    (book.root / "intro.md").write_text(INTRO + "\nSee {ref}`no-such-label`.\n")
    lines = []

    assert not build_site(book, echo=lines.append)

    assert any("no-such-label" in line for line in lines)
    assert lines[-1] == "[book] the previous _build/html is untouched"
    assert {p: p.read_bytes() for p in book.html.rglob("*") if p.is_file()} == before


def test_lib_is_an_input_of_the_site(built_book, tmp_path):
    # The API page renders lib's docstrings: a change to lib must render the site again.
    book = copy_book(built_book, tmp_path / "book")
    before = tree_hash(stage(book))
    (book.root / "lib").mkdir(exist_ok=True)
    (book.root / "lib" / "extra.py").write_text('"""A docstring the API page shows."""\n')
    assert tree_hash(stage(book)) != before
