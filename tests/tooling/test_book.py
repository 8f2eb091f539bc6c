"""The book's configuration: parameters validated with one-line errors, the cache key, the commit."""

from __future__ import annotations

import subprocess

import nbformat
import pytest
import yaml

from bookbuild.book import Book, BookError

from .conftest import NOTEBOOK


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
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("data/params.yaml, line 3: invalid YAML")


def test_quick_profile_overrides_published(fixture_book):
    assert fixture_book.parameters(NOTEBOOK, "published") == {"seed": 3, "scale": 2.0}
    assert fixture_book.parameters(NOTEBOOK, "quick") == {"seed": 3, "scale": 1.0}
    with pytest.raises(BookError, match="profile must be one of"):
        fixture_book.parameters(NOTEBOOK, "fast")


@pytest.mark.parametrize("changed", ["lib/__init__.py", "lib/sub/deep.py", "experiments/x/run.py",
                                     "reference/numpy_ops.py", "data/params.yaml",
                                     "requirements.txt", NOTEBOOK])
def test_shared_inputs_and_the_notebook_enter_the_hash(fixture_book, changed):
    path = fixture_book.root / changed
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(path.read_text() if path.exists() else "")
    before = fixture_book.input_hash(NOTEBOOK, "published")
    (fixture_book.root / "lib" / "__pycache__").mkdir()  # compiled files are no input
    (fixture_book.root / "lib" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert fixture_book.input_hash(NOTEBOOK, "published") == before
    if path.suffix == ".ipynb":  # a notebook's code cells are its input
        edit_notebook(path, "code", "\n# changed")
    else:
        path.write_text(path.read_text() + "\n# changed\n")
    assert fixture_book.input_hash(NOTEBOOK, "published") != before


def edit_notebook(path, kind: str, text: str) -> None:
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == kind)
    cell.source += text
    nbformat.write(nb, path)


def test_prose_is_not_an_input_of_the_execution(fixture_book):
    before = fixture_book.input_hash(NOTEBOOK, "published")
    edit_notebook(fixture_book.root / NOTEBOOK, "markdown", "\n\nMore prose.")
    assert fixture_book.input_hash(NOTEBOOK, "published") == before


def test_profile_and_extra_inputs_enter_the_hash(fixture_book):
    published = fixture_book.input_hash(NOTEBOOK, "published")
    assert fixture_book.input_hash(NOTEBOOK, "quick") != published
    assert fixture_book.input_hash(NOTEBOOK, "published", {"other.ipynb": 1.0}) != published
    assert fixture_book.input_hash(NOTEBOOK, "published") == published


@pytest.mark.parametrize("pattern", ["data/extra/**", "data/extra/*", "data/extra/table.csv"])
def test_declared_inputs_enter_the_hash(fixture_book, pattern):
    params = yaml.safe_load(fixture_book.params_path.read_text())
    params[NOTEBOOK]["inputs"] = [pattern]
    fixture_book.params_path.write_text(yaml.safe_dump(params))
    (fixture_book.root / "data" / "extra").mkdir()
    table = fixture_book.root / "data" / "extra" / "table.csv"
    table.write_text("a\n1\n")
    book = Book(fixture_book.root)
    before = book.input_hash(NOTEBOOK, "published")
    table.write_text("a\n2\n")
    assert book.input_hash(NOTEBOOK, "published") != before


def test_commit_is_dirty_unless_only_ignored_folders_changed(tmp_path):
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


def test_offline_tables_are_inputs_of_the_notebook_that_reads_them():
    """mamba.ipynb reads data/results/trained-heads/offline/: a regenerated table must re-execute it."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    book = Book(root)
    entry = book.entry("chapters/trained-heads/mamba.ipynb")
    covered = {f for pattern in entry.get("inputs") or [] for f in root.glob(pattern)}
    offline = set((root / "data" / "results" / "trained-heads" / "offline").glob("*"))
    assert offline and offline <= covered, sorted(map(str, offline - covered))
