"""Conventions every notebook of the real book follows (checked on the committed sources)."""
from __future__ import annotations

import ast
import json
import re

import nbformat
import pytest

from bookbuild.book import Book

BOOK = Book.here()
NOTEBOOKS = [str(p) for p in BOOK.notebooks]


def code(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged 'parameters'"
    return cells[0]


def literal_assignments(source: str) -> dict:
    values = {}
    for node in ast.parse(source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, \
            "the parameters cell holds plain assignments only"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def test_toc_and_params_agree():
    BOOK.check_params_cover_toc()


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_committed_without_outputs(path):
    nb = nbformat.read(BOOK.root / path, as_version=4)
    dirty = [i + 1 for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: commit notebooks cleared"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_every_cell_has_an_id(path):
    # nbformat fills a missing id on read (and warns); read the raw JSON instead.
    cells = json.loads((BOOK.root / path).read_text())["cells"]
    missing = [i + 1 for i, c in enumerate(cells) if "id" not in c]
    assert not missing, f"cells {missing} have no id: normalise the notebook"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_parameters_cell_defaults_are_the_published_parameters(path):
    nb = nbformat.read(BOOK.root / path, as_version=4)
    defaults = literal_assignments(parameters_cell(nb).source)
    assert defaults == BOOK.parameters(path, "published")
    if "device" in defaults:
        assert defaults["device"] == "cpu", "the published device is the CPU"
    if re.search(r"\b(train\w*|fit)\(", code(nb)):  # it calls a training function
        assert "device" in defaults, "notebooks that train with torch take a `device` parameter"


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_notebook_names_itself_and_starts_a_run(path):
    nb = nbformat.read(BOOK.root / path, as_version=4)
    assert f'start("{path}", globals())' in code(nb)
    assert "sys.path" not in code(nb), "notebooks import lib from the installed package"
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), \
        "a notebook page starts with its '# ' title"


def test_chapter_notebooks_are_formatted():
    # Visible code must fit the page: ruff format (pinned; line length 88 in pyproject.toml).
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    ruff = Path(sys.executable).with_name("ruff")
    ruff = str(ruff) if ruff.exists() else shutil.which("ruff")
    assert ruff, "ruff is pinned in requirements.txt: run `make venv`"
    proc = subprocess.run([ruff, "format", "--check", "chapters"], cwd=BOOK.root, capture_output=True, text=True)
    unformatted = [line for line in proc.stdout.splitlines() if line.startswith("Would reformat")]
    assert proc.returncode == 0, "run `.venv/bin/ruff format chapters`: " + "; ".join(unformatted or [proc.stderr])


def test_every_reference_has_a_link():
    entries = re.findall(r"^@\w+\{([^,]+),(.*?)^\}", (BOOK.root / "references.bib").read_text(),
                         re.M | re.S)
    assert len(entries) >= 19
    unlinked = [key for key, body in entries if not re.search(r"^\s*(url|doi)\s*=", body, re.M)]
    assert not unlinked, f"references without a url or doi: {unlinked}"


CHAPTER_PAGES = sorted(p for p in BOOK.pages if p.name == "index.md")
CHAPTER_NOTEBOOKS = [nb for nb in NOTEBOOKS if not nb.startswith("chapters/appendix/")]


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=str)
def test_chapter_page_opens_shows_and_closes_for_readers(page):
    """Every chapter page: "In this chapter" first, one box on what is the paper's, a figure
    with alt text and a caption, "Takeaways" last; no note addressed to the book's authors."""
    text = (BOOK.root / page).read_text()
    body = text.split("\n# ", 1)[1]
    first_block = body.split(":::", 2)[1] if ":::" in body else ""
    assert first_block.startswith("{admonition} In this chapter"), "opens with 'In this chapter'"
    assert text.count(":::{admonition} The paper and this book") == 1
    assert re.search(r"```\{book-figure\} [\w-]+/[\w-]+\n(:name: .+\n)?:alt: \S+", text)
    last = re.findall(r"^## (.+)$", text, re.M)[-1]
    assert last == "Takeaways", f"the last section is {last!r}"
    bullets = re.findall(r"^- ", text.split("\n## Takeaways", 1)[1], re.M)
    assert 3 <= len(bullets) <= 5, f"{len(bullets)} takeaways"
    assert not re.search(r"earlier version|moonshot|this session", text, re.I)


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS)
def test_chapter_notebook_ends_with_try_it(path):
    cells = nbformat.read(BOOK.root / path, as_version=4).cells
    headings = [c.source for c in cells if c.cell_type == "markdown" and "## Try it" in c.source]
    assert headings, "a '## Try it' section"
    assert cells[-1].cell_type == "code" or "Try it" in cells[-1].source
