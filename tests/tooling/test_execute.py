"""The runner: loud one-line failures, nothing lost, byte-identical re-runs, a working cache."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat

import pytest

from bookbuild.execute import execute_notebooks
from bookbuild.site import build_site

from .conftest import GOOD_CELLS, NOTEBOOK, write_notebook

pytestmark = pytest.mark.slow


def quiet(_line):
    pass


def statuses(report):
    return {o.notebook: o.status for o in report.outcomes}


def test_failing_cell_gives_one_line_and_keeps_old_site(fixture_book):
    # A site from an earlier build, which a failed build must leave alone.
    old_site = fixture_book.html
    old_site.mkdir(parents=True)
    (old_site / "index.html").write_text("the last good site")
    failing = [*GOOD_CELLS[:3],
               ("code", "x = 1"),
               ("code", "import numpy as np\nnp.linalg.inv(np.zeros((2, 2)))"),
               ("code", "print('never reached')")]
    write_notebook(fixture_book.root, failing)

    proc = subprocess.run(
        [sys.executable, "-m", "bookbuild", "--root", str(fixture_book.root), "build"],
        capture_output=True, text=True)

    assert proc.returncode == 1
    expected = f"FAILED {NOTEBOOK} cell 5: LinAlgError: Singular matrix"
    assert expected in proc.stdout.splitlines()
    assert (old_site / "index.html").read_text() == "the last good site"
    assert (fixture_book.failed / NOTEBOOK).exists(), "partial output must be kept"
    assert not (fixture_book.executed / NOTEBOOK).exists(), "never install a failed run"


def test_failure_keeps_last_successful_execution(fixture_book):
    first = execute_notebooks(fixture_book, echo=quiet)
    assert statuses(first) == {NOTEBOOK: "executed"}
    good = (fixture_book.executed / NOTEBOOK).read_bytes()
    table = (fixture_book.results / "demo" / "values.csv").read_bytes()
    write_notebook(fixture_book.root, [*GOOD_CELLS, ("code", "raise RuntimeError('late')")])

    second = execute_notebooks(fixture_book, echo=quiet)

    assert [o.message for o in second.failed] == [
        f"FAILED {NOTEBOOK} cell 5: RuntimeError: late"]
    assert (fixture_book.executed / NOTEBOOK).read_bytes() == good
    assert (fixture_book.results / "demo" / "values.csv").read_bytes() == table


def test_hung_cell_times_out_with_one_line(fixture_book):
    write_notebook(fixture_book.root, [*GOOD_CELLS[:2], ("code", "x = 1"),
                                       ("code", "import time\ntime.sleep(60)")])

    report = execute_notebooks(fixture_book, cell_timeout=3, echo=quiet)

    [failure] = report.failed
    assert failure.message == (
        f"FAILED {NOTEBOOK} cell 4: CellTimeoutError: cell did not finish within 3 s")


def test_two_clean_executions_are_byte_identical_and_progress_stays_off_the_page(fixture_book):
    lines = []
    execute_notebooks(fixture_book, echo=lines.append)
    first = {p: p.read_bytes() for p in fixture_book.build.rglob("*")
             if p.is_file() and "logs" not in p.parts and p.suffix != ".json"}
    assert any(p.suffix == ".png" for p in first) and any(p.suffix == ".csv" for p in first)
    # Progress from inside the notebook reaches the terminal, not the rendered outputs.
    assert any(f"{NOTEBOOK}: " in line and "looping: 3/3" in line for line in lines)
    outputs = json.dumps([c.get("outputs", []) for c in
                          nbformat.read(fixture_book.executed / NOTEBOOK, 4).cells])
    assert "looping" not in outputs
    assert "book-table" in outputs and "T_" not in outputs and " at 0x" not in outputs  # a styled table, no ids

    report = execute_notebooks(fixture_book, force=["chapters/demo"], echo=quiet)

    assert statuses(report) == {NOTEBOOK: "executed"}
    for path, data in first.items():
        assert path.read_bytes() == data, f"{path} differs between two executions"


def test_cache_skips_unchanged_and_reruns_on_lib_or_params_change(fixture_book):
    messages = []
    assert statuses(execute_notebooks(fixture_book, echo=quiet)) == {NOTEBOOK: "executed"}
    assert statuses(execute_notebooks(fixture_book, echo=messages.append)) == {NOTEBOOK: "cached"}
    assert any("up to date" in m for m in messages)

    (fixture_book.root / "lib" / "__init__.py").write_text("VERSION = 2\n")
    assert statuses(execute_notebooks(fixture_book, echo=quiet)) == {NOTEBOOK: "executed"}
    assert statuses(execute_notebooks(fixture_book, echo=quiet)) == {NOTEBOOK: "cached"}
    # Another profile is another set of parameters: executed again.
    assert statuses(execute_notebooks(fixture_book, profile="quick", echo=quiet)) == {
        NOTEBOOK: "executed"}


def test_site_failure_leaves_previous_site(fixture_book):
    execute_notebooks(fixture_book, echo=quiet)
    assert build_site(fixture_book, echo=quiet)
    index = (fixture_book.html / "index.html").read_bytes()
    # A broken cross-reference is a warning, and -W makes it an error.
    (fixture_book.root / "intro.md").write_text("# Fixture\n\nSee {ref}`no-such-label`.\n")

    assert not build_site(fixture_book, echo=quiet)
    assert (fixture_book.html / "index.html").read_bytes() == index
