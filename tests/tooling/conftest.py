"""Fixture books in temporary directories: a small one written per test (fast), and one
executed, rendered and bundled once per session (``built_book``, for the slow tests)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from bookbuild.book import Book
from bookbuild.browser import find_chromium

NOTEBOOK = "chapters/demo/demo.ipynb"
DEMO_CELLS = [
    ("md", "# Demo\n\n" + "A fixture notebook, with enough prose to read like a page. " * 10),
    ("code", "seed = 3\nscale = 2.0", "parameters"),
    ("code", textwrap.dedent(f"""\
        import numpy as np
        import pandas as pd
        import matplotlib.pyplot as plt
        from bookbuild.notebook import start
        run = start("{NOTEBOOK}", globals())""")),
    ("code", textwrap.dedent("""\
        values = run.rng().normal(size=5) * scale
        table = run.table(pd.DataFrame({"i": range(5), "value": values}), "values", rtol=1e-12)
        for _ in run.progress(range(3), "looping", every=0):
            pass
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot(values)
        run.figure(fig, "values")
        run.glue("total", float(values.sum()))
        run.show(table, {"value": "{:.3e}"})""")),
    ("md", "```{book-figure} demo/values\n:name: fig-demo-values\n"
           ":alt: Five values drawn at random, joined by a line.\n\n"
           "The five values of the table.\n```"),
    ("code", 'run.check("thm-good", 1e-16, 1e-12, "error")\n'
             'run.check("prop-broken", 0.5, 1e-3, "gap")', "remove-input"),
]
INTRO = r"""# Fixture

A book macro $\W_{ij} \in \R^{p\times d}$ inline, and on its own line

$$
y_i = \sum_{j=1}^{n} \W_{ij}(X)\, x_j .
$$

See the demo.
"""
CLAIMS_PAGE = textwrap.dedent("""\
    # Claims

    :::{prf:theorem} Good
    :label: thm-good

    Holds.
    :::

    :::{prf:proposition} Broken
    :label: prop-broken

    Its check fails.
    :::

    :::{prf:lemma} Untested
    :label: lem-untested

    Has no check and no test.
    :::

    :::{prf:corollary} Unchecked
    :label: cor-unchecked

    Has a test, no check.
    :::

    :::{prf:definition} Not a claim
    :label: def-thing

    Definitions need neither.
    :::

    A directive shown as code is no claim:

    ```text
    :::{prf:theorem} Shown, not stated
    :label: thm-shown
    :::
    ```

    ::::{note}
    :::{prf:lemma}
    A claim without a label, nested in a note.
    :::
    ::::
    """)
CLAIM_TESTS = ("def test_thm_good_holds():\n    pass\n\n"
               "def test_prop_broken_is_asserted():\n    pass\n\n"
               "def test_cor_unchecked_is_asserted():\n    pass\n")
CLAIM_NOTES = {"claims": {
    "thm-good": {"source": "precise", "summary": "It holds.", "verifies": "formula"},
    "prop-broken": {"source": "extension", "summary": "It breaks.", "verifies": "cases"},
    "lem-untested": {"source": "extension", "summary": "Untested.", "verifies": {"demo": "estimate"}},
    "cor-unchecked": {"source": "extension", "summary": "Unchecked.", "verifies": "bound"},
    "thm-gone": {"source": "extension", "summary": "No such claim.", "verifies": "formula"}}}

needs_chromium = pytest.mark.skipif(find_chromium() is None or shutil.which("pdftoppm") is None,
                                    reason="Chromium and pdftoppm (poppler-utils) needed")


def quiet(_line):
    pass


def write_notebook(root: Path, cells, path: str = NOTEBOOK) -> Path:
    nb = new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    for i, (kind, source, *tags) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"cell-{i}"
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def make_book(root: Path) -> Book:
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "__init__.py").write_text("VERSION = 1\n")
    (root / "data").mkdir()
    (root / "data" / "params.yaml").write_text(
        f"{NOTEBOOK}:\n  published: {{seed: 3, scale: 2.0}}\n  quick: {{scale: 1.0}}\n")
    (root / "requirements.txt").write_text("numpy\n")
    (root / "_config.yml").write_text(
        "title: Fixture\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: 'off'\n")
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: chapters/demo/demo\n")
    (root / "intro.md").write_text("# Fixture\n\nSee the demo.\n")
    write_notebook(root, DEMO_CELLS)
    return Book(root)


@pytest.fixture
def fixture_book(tmp_path) -> Book:
    return make_book(tmp_path / "book")


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Book:
    """The fixture book with the real configuration, math and a page of claims: executed,
    rendered and (with Chromium) bundled once for all slow tests. Tests change copies only."""
    from bookbuild.bundle import build_bundle
    from bookbuild.execute import execute_notebooks, failures
    from bookbuild.site import build_site

    book = make_book(tmp_path_factory.mktemp("built") / "book")
    real = Book.here().root
    for name in ("_config.yml", "references.bib"):
        shutil.copy2(real / name, book.root / name)
    shutil.copytree(real / "_static", book.root / "_static")
    (book.root / "intro.md").write_text(INTRO)
    (book.root / "claims.md").write_text(CLAIMS_PAGE)
    (book.root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n"
                                        "  - file: claims\n  - file: chapters/demo/demo\n")
    (book.root / "tests").mkdir()
    (book.root / "tests" / "test_claims.py").write_text(CLAIM_TESTS)
    (book.root / "data" / "claims.yaml").write_text(yaml.safe_dump(CLAIM_NOTES))
    assert not failures(execute_notebooks(book, echo=quiet))
    assert build_site(book, echo=quiet)
    if find_chromium() and shutil.which("pdftoppm"):
        build_bundle(book, echo=quiet)
    return book


def copy_book(book: Book, root: Path) -> Book:
    shutil.copytree(book.root, root, symlinks=True)
    return Book(root)


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def import_benchmark(name: str):
    """A benchmark script as a module (its harness pins thread variables at import: restored after)."""
    import importlib
    import os
    import sys

    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
