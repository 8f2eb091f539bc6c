"""A small fixture book in a temporary directory, so the machinery can be tested end to end."""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from bookbuild.book import Book

NOTEBOOK = "chapters/demo/demo.ipynb"

GOOD_CELLS = [
    ("md", "# Demo\n\nA fixture notebook."),
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
        run.glue("styled", run.show(table, {"value": "{:.3e}"}))
        run.show(table, {"value": "{:.3e}"})""")),
]


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


@pytest.fixture
def fixture_book(tmp_path) -> Book:
    root = tmp_path / "book"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "__init__.py").write_text("VERSION = 1\n")
    (root / "data").mkdir()
    (root / "data" / "params.yaml").write_text(
        f"{NOTEBOOK}:\n  published: {{seed: 3, scale: 2.0}}\n  quick: {{scale: 1.0}}\n")
    (root / "requirements.txt").write_text("numpy\n")
    (root / "_config.yml").write_text(textwrap.dedent("""\
        title: Fixture
        only_build_toc_files: true
        execute:
          execute_notebooks: 'off'
        """))
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: chapters/demo/demo\n")
    (root / "intro.md").write_text("# Fixture\n\nSee the demo.\n")
    write_notebook(root, GOOD_CELLS)
    return Book(root)
