"""Fast unit tests of the build tooling's pieces (no kernels, no Sphinx)."""

from __future__ import annotations

import nbformat
import pytest
import yaml
from nbformat.v4 import new_code_cell, new_notebook

from bookbuild.book import Book, BookError
from bookbuild import audit
from bookbuild.browser import typeset_counts
from bookbuild.audit import external_resources
from bookbuild.normalize import normalize
from bookbuild.results import compare_table

from .conftest import NOTEBOOK


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
    twice = nbformat.writes(normalize(nbformat.reads(once, 4), "published"))
    assert once == twice


def write_table(folder, name, text, **meta):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.csv").write_text(text)
    (folder / f"{name}.meta.yaml").write_text(yaml.safe_dump({"profile": "published", **meta}))
    return folder / f"{name}.csv"


def test_compare_table_within_and_beyond_tolerance(tmp_path):
    committed = write_table(tmp_path / "ref", "t", "model,err\nssm,1.0\nattn,2.0\n",
                            rtol=1e-3, atol=0.0)
    close = write_table(tmp_path / "a", "t", "model,err\nssm,1.0005\nattn,2.0\n")
    far = write_table(tmp_path / "b", "t", "model,err\nssm,1.01\nattn,2.0\n")
    assert compare_table(close, committed, "t.csv") == []
    [problem] = compare_table(far, committed, "t.csv")
    assert "[model=ssm] err: committed 1.0, this build 1.01" in problem


def test_compare_table_per_column_tolerance_and_structure(tmp_path):
    committed = write_table(tmp_path / "ref", "t", "k,err\n1,1e-15\n", rtol=0.0, atol=0.0,
                            columns={"err": {"atol": 1e-12}})
    assert compare_table(write_table(tmp_path / "a", "t", "k,err\n1,3e-15\n"), committed, "t") == []
    assert "columns differ" in compare_table(
        write_table(tmp_path / "b", "t", "k,error\n1,1e-15\n"), committed, "t")[0]
    assert "rows" in compare_table(
        write_table(tmp_path / "c", "t", "k,err\n1,1e-15\n2,0\n"), committed, "t")[0]


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


def test_typeset_counts():
    dom = "<mjx-container><mjx-merror></mjx-merror></mjx-container><mjx-container>"
    assert typeset_counts(dom) == (2, 1)


@pytest.mark.parametrize("params, message", [
    ({NOTEBOOK: {"published": {"scale": 1}}}, "need a 'seed'"),
    ({NOTEBOOK: {"published": {"seed": 0}, "quick": {"n": 2}}}, "does not define"),
    ({NOTEBOOK: {"published": {"seed": 0}, "publish": {}}}, "unknown keys"),
    ({}, "no entry for"),
    ({NOTEBOOK: {"published": {"seed": 0}}, "chapters/gone.ipynb": {"published": {"seed": 0}}},
     "not in _toc.yml"),
])
def test_params_validation_names_the_problem(fixture_book, params, message):
    fixture_book.params_path.write_text(yaml.safe_dump(params))
    with pytest.raises(BookError, match=message):
        Book(fixture_book.root).check_params_cover_toc()


def test_misspelled_parameter_fails_naming_notebook_and_parameter(fixture_book):
    # papermill would inject `haeds` as a new variable and build everything with the default.
    fixture_book.params_path.write_text(yaml.safe_dump({NOTEBOOK: {"published": {"seed": 3, "haeds": 2}}}))
    with pytest.raises(BookError, match=rf"{NOTEBOOK}: 'haeds' not defined in the notebook's parameters cell"):
        Book(fixture_book.root).check_params_cover_toc()


def test_malformed_params_yaml_is_one_line_with_file_and_line(fixture_book):
    fixture_book.params_path.write_text(f"{NOTEBOOK}:\n  published: {{seed: 3\n  quick: {{}}\n")
    with pytest.raises(BookError) as info:
        Book(fixture_book.root).params
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("data/params.yaml, line 3: invalid YAML")


def test_quick_profile_overrides_published(fixture_book):
    assert fixture_book.parameters(NOTEBOOK, "published") == {"seed": 3, "scale": 2.0}
    assert fixture_book.parameters(NOTEBOOK, "quick") == {"seed": 3, "scale": 1.0}
    with pytest.raises(BookError, match="profile must be one of"):
        fixture_book.parameters(NOTEBOOK, "fast")


@pytest.mark.parametrize("pattern", ["data/extra/**", "data/extra/*", "data/extra/table.csv"])
def test_declared_inputs_enter_the_hash(fixture_book, pattern):
    from bookbuild.cache import notebook_hash

    params = yaml.safe_load(fixture_book.params_path.read_text())
    params[NOTEBOOK]["inputs"] = [pattern]
    fixture_book.params_path.write_text(yaml.safe_dump(params))
    (fixture_book.root / "data" / "extra").mkdir()
    table = fixture_book.root / "data" / "extra" / "table.csv"
    table.write_text("a\n1\n")
    book = Book(fixture_book.root)
    before = notebook_hash(book, NOTEBOOK, "published")
    table.write_text("a\n2\n")
    assert notebook_hash(book, NOTEBOOK, "published") != before


@pytest.mark.parametrize("check", [audit.audit_math, audit.audit_search])
def test_missing_browser_is_a_skip_or_a_failure_never_a_pass(fixture_book, monkeypatch, check):
    monkeypatch.setattr(audit, "find_chromium", lambda: None)
    skipped = check(fixture_book, require_browser=False)
    assert skipped.skipped and "did NOT run" in skipped.summary and not skipped.problems
    required = check(fixture_book, require_browser=True)
    assert not required.skipped and not required.ok
    assert "Chromium not found" in required.problems[0]


def test_commit_is_dirty_unless_only_ignored_folders_changed(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "start")
    book = Book(tmp_path)
    assert not book.commit().endswith("-dirty")
    (tmp_path / "tables" / "t.csv").write_text("b\n")
    assert book.commit().endswith("-dirty")
    assert not book.commit(ignoring=("tables",)).endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert book.commit(ignoring=("tables",)).endswith("-dirty")


def test_table_keeps_each_formatted_number_on_one_line_and_lets_text_wrap():
    import pandas as pd

    from bookbuild.notebook import Table

    table = Table(pd.DataFrame({"model": ["S4D Lin"], "error": [9.8e-33], "n": [64]}),
                  {"error": "{:.1e}", "n": "{:d}"})
    assert '<span class="num">9.8e-33</span>' in table.html  # no break at the exponent's '-'
    assert '<span class="num">64</span>' in table.html
    assert ">S4D Lin<" in table.html and "T_" not in table.html
    assert table.text.split() == ["model", "error", "n", "S4D", "Lin", "9.8e-33", "64"]
