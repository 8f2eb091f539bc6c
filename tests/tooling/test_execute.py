"""The runner: normalisation, byte-identical re-runs, the cache, one-line failures that keep
the last good execution and the site."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from bookbuild.execute import execute_notebooks, normalize

from .conftest import DEMO_CELLS, NOTEBOOK, copy_book, quiet, write_notebook


def executed_like_papermill():
    nb = new_notebook()
    nb.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00", "input_path": "/tmp/x"}
    params = new_code_cell("seed = 1", id="own")
    params.metadata["tags"] = ["parameters"]
    injected = new_code_cell("# Parameters\nseed = 2\n", id="9f8e7d6c")
    injected.metadata["tags"] = ["injected-parameters"]
    body = new_code_cell("seed", id="body")
    for cell in (params, injected, body):
        cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:01"}
        cell.metadata["papermill"] = {"duration": 0.5, "status": "completed"}
    nb.cells = [params, injected, body]
    return nb


def test_normalize_strips_run_dependent_metadata():
    nb = normalize(executed_like_papermill(), "published")
    assert "papermill" not in nb.metadata
    for cell in nb.cells:
        assert "execution" not in cell.metadata and "papermill" not in cell.metadata
    assert nb.cells[1]["id"] == "injected-parameters"


def test_normalize_shows_parameters_in_force_once():
    own, injected, _ = normalize(executed_like_papermill(), "quick").cells
    assert "remove-cell" in own.metadata["tags"]
    assert injected.source.splitlines() == [
        "# Parameters in force (profile: quick; from data/params.yaml)", "seed = 2"]
    assert "remove-cell" not in injected.metadata["tags"] and "hide-input" in injected.metadata["tags"]


def test_normalize_is_idempotent():
    once = nbformat.writes(normalize(executed_like_papermill(), "published"))
    assert nbformat.writes(normalize(nbformat.reads(once, 4), "published")) == once


def statuses(report):
    return {nb: o["status"] for nb, o in report["notebooks"].items()}


def artifacts(book):
    """Every file an execution leaves (notebook, tables, figures, checks) -> its bytes."""
    return {p.relative_to(book.build): p.read_bytes() for folder in
            (book.executed, book.results, book.figures, book.checks) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_two_clean_executions_are_byte_identical_then_cached(built_book, tmp_path, capfd):
    book = copy_book(built_book, tmp_path / "book")
    first = artifacts(book)
    assert {p.suffix for p in first} >= {".ipynb", ".csv", ".png", ".yaml"}

    report = execute_notebooks(book, force=["chapters/demo"], echo=quiet)

    assert statuses(report) == {NOTEBOOK: "executed"}
    assert artifacts(book) == first, "two executions differ"
    # Progress reaches the terminal (the kernel's stderr), not the page.
    assert f"{NOTEBOOK}: " in capfd.readouterr().err.split("looping: 3/3")[0].splitlines()[-1]
    outputs = json.dumps([c.get("outputs", []) for c in
                          nbformat.read(book.executed / NOTEBOOK, 4).cells])
    assert "looping" not in outputs
    assert "book-table" in outputs and "T_" not in outputs and " at 0x" not in outputs
    lines = []
    assert statuses(execute_notebooks(book, echo=lines.append)) == {NOTEBOOK: "cached"}
    assert lines == ["[book] all 1 notebook(s) up to date (profile published)"]
    # Prose is not an input of the execution: a markdown edit reaches the executed notebook
    # without a re-run; a code edit re-runs.
    source = nbformat.read(book.root / NOTEBOOK, 4)
    source.cells[0].source += "\n\nA new paragraph."
    source.cells.insert(4, nbformat.v4.new_markdown_cell("Between two cells.", id="newprose"))
    nbformat.write(source, book.root / NOTEBOOK)
    assert statuses(execute_notebooks(book, echo=quiet)) == {NOTEBOOK: "cached"}
    done = nbformat.read(book.executed / NOTEBOOK, 4)
    assert done.cells[0].source.endswith("A new paragraph.")
    assert [c.id for c in done.cells if c.cell_type == "markdown"] == [
        c.id for c in source.cells if c.cell_type == "markdown"]
    assert [c.outputs for c in done.cells if c.cell_type == "code"][-1] is not None
    source.cells[2].source += "\nextra = 1"
    nbformat.write(source, book.root / NOTEBOOK)
    assert statuses(execute_notebooks(book, echo=quiet)) == {NOTEBOOK: "executed"}


HANG = "chapters/demo/hang.ipynb"


@pytest.mark.slow
def test_failures_are_one_line_each_and_keep_the_last_good_build(built_book, tmp_path):
    book = copy_book(built_book, tmp_path / "book")
    index, good = (book.html / "index.html").read_bytes(), artifacts(book)
    write_notebook(book.root, [*DEMO_CELLS, ("code", "raise RuntimeError('late')")])
    # A second notebook, run alongside, whose cell outlives its timeout from params.yaml.
    write_notebook(book.root, [("md", "# Hang"), ("code", "seed = 0", "parameters"),
                               ("code", "import time\ntime.sleep(60)")], HANG)
    (book.root / "_toc.yml").write_text((book.root / "_toc.yml").read_text()
                                        + "  - file: chapters/demo/hang\n")
    params = yaml.safe_load(book.params_path.read_text())
    params[HANG] = {"published": {"seed": 0}, "cell_timeout": 3}
    book.params_path.write_text(yaml.safe_dump(params))

    proc = subprocess.run([sys.executable, "-m", "bookbuild", "--root", str(book.root), "build"],
                          capture_output=True, text=True)

    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert f"FAILED {NOTEBOOK} cell 7: RuntimeError: late" in lines
    assert f"FAILED {HANG} cell 3: CellTimeoutError: cell did not finish within 3 s" in lines
    assert (book.html / "index.html").read_bytes() == index, "the site must stay"
    assert artifacts(book) == good, "the last successful execution must stay"
    assert (book.failed / NOTEBOOK).exists() and (book.failed / HANG).exists()
