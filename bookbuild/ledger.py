"""The reproduction ledger: every claim of the book with its proof, its numerical check and its test.

A *claim* is a ``{prf:theorem}``, ``{prf:proposition}``, ``{prf:lemma}`` or ``{prf:corollary}``
with a ``:label:`` on a page of the book. Its *checks* are the ``run.check(label, ...)`` calls
of the executed notebooks (recorded under ``_build/checks/``); its *tests* are the pytest
functions named ``test_<label with _ for ->`` or ``test_<label>_<anything>`` under
``tests/``; its one-line summary and source (stated in the abstract, the book's precise
version, or the book's extension) come from ``data/claims.yaml``.

`build_ledger` joins the four and lists every problem: a claim without a check, without a
test or without a summary, a check beyond its tolerance, a check or summary whose label is
no claim. The site check fails on any problem; the staged tree carries the ledger as
``_ledger.json`` for the Sphinx extension that prints it under each claim and on the
status page.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import yaml

from .book import Book

CLAIM_KINDS = ("theorem", "proposition", "lemma", "corollary")
SOURCES = {
    "abstract": "stated in the paper's abstract",
    "precise": "the book's precise version of a claim of the abstract",
    "extension": "the book's extension",
}
_DIRECTIVE = re.compile(r"^\s*(:{3,}|`{3,})\{prf:(" + "|".join(CLAIM_KINDS) + r")\}\s*(.*?)\s*$")
_LABEL = re.compile(r"^\s*:label:\s*(\S+)\s*$")
_CLAIMS_FILE = Path("data") / "claims.yaml"


@dataclass
class Claim:
    label: str
    kind: str
    title: str
    page: str  # docname, e.g. chapters/head-count/index


@dataclass
class Check:
    notebook: str  # docname of the notebook
    cell: int | None  # 1-based position in the source notebook
    discrepancy: float
    tolerance: float
    what: str
    ok: bool


@dataclass
class Entry:
    claim: Claim
    source: str = ""
    summary: str = ""
    checks: list[Check] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if not self.checks or not self.tests:
            return "incomplete"
        return "reproduced" if all(c.ok for c in self.checks) else "fails its check"


@dataclass
class Ledger:
    entries: list[Entry]
    figures: list[dict]
    problems: list[str]

    def to_json(self) -> dict:
        return {
            "claims": {e.claim.label: {**asdict(e), "verdict": e.verdict} for e in self.entries},
            "figures": self.figures,
            "sources": SOURCES,
            "problems": self.problems,
        }


# --- the four sources -------------------------------------------------------------------
def _page_lines(book: Book, page: Path) -> list[str]:
    path = book.root / page
    if page.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        return [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()]
    return path.read_text().splitlines()


def find_claims(book: Book) -> list[Claim]:
    """Every labelled theorem, proposition, lemma and corollary on the book's pages."""
    claims = []
    for page in book.pages:
        lines = _page_lines(book, page)
        for number, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if not match:
                continue
            for option in lines[number + 1:number + 6]:
                label = _LABEL.match(option)
                if label:
                    claims.append(Claim(label.group(1), match.group(2), match.group(3),
                                        str(page.with_suffix(""))))
                    break
    return claims


def _check_cells(executed: Path) -> dict[str, int]:
    """label -> 1-based source position of the cell that glued ``check-<label>``."""
    if not executed.exists():
        return {}
    nb = nbformat.read(executed, as_version=4)
    cells, position = {}, 0
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            continue  # not a cell of the source notebook
        position += 1
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name", "")
            if name.startswith("check-"):
                cells[name.removeprefix("check-")] = position
    return cells


def find_checks(book: Book) -> dict[str, list[Check]]:
    """label -> the numerical checks recorded by the last successful executions."""
    found: dict[str, list[Check]] = {}
    notebooks = {str(p) for p in book.notebooks}
    for record_path in sorted(book.checks.rglob("*.yaml")) if book.checks.exists() else []:
        record = yaml.safe_load(record_path.read_text()) or {}
        notebook = record.get("notebook", "")
        if notebook not in notebooks:
            continue  # a notebook that left the book
        cells = _check_cells(book.executed / notebook)
        for label, check in (record.get("checks") or {}).items():
            found.setdefault(label, []).append(Check(
                notebook=str(Path(notebook).with_suffix("")), cell=cells.get(label),
                discrepancy=float(check["discrepancy"]), tolerance=float(check["tolerance"]),
                what=str(check.get("what", "")), ok=bool(check["discrepancy"] <= check["tolerance"])))
    return found


def find_test_ids(root: Path) -> list[str]:
    """pytest node ids ``tests/...py::test_name`` of every test function under ``tests/``."""
    ids = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                ids.append(f"{path.relative_to(root).as_posix()}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids += [f"{path.relative_to(root).as_posix()}::{node.name}::{item.name}"
                        for item in node.body
                        if isinstance(item, ast.FunctionDef) and item.name.startswith("test_")]
    return ids


def match_tests(labels, ids) -> dict[str, list[str]]:
    """label -> test ids named after it; a test belongs to the longest label it starts with."""
    stems = sorted(((label, "test_" + label.replace("-", "_")) for label in labels),
                   key=lambda item: -len(item[1]))
    found: dict[str, list[str]] = {label: [] for label in labels}
    for test_id in ids:
        name = test_id.rsplit("::", 1)[-1]
        for label, stem in stems:
            if name == stem or name.startswith(stem + "_"):
                found[label].append(test_id)
                break
    return found


def load_claim_notes(book: Book) -> tuple[dict, list[dict]]:
    path = book.root / _CLAIMS_FILE
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    return data.get("claims") or {}, data.get("figures") or []


# --- the ledger -----------------------------------------------------------------------------
def build_ledger(book: Book) -> Ledger:
    claims = find_claims(book)
    labels = [c.label for c in claims]
    checks = find_checks(book)
    tests = match_tests(labels, find_test_ids(book.root))
    notes, figures = load_claim_notes(book)
    problems = []
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    problems += [f"{label}: labelled twice" for label in duplicates]
    entries = []
    for claim in claims:
        note = notes.get(claim.label) or {}
        entry = Entry(claim, source=str(note.get("source", "")), summary=str(note.get("summary", "")),
                      checks=checks.get(claim.label, []), tests=tests.get(claim.label, []))
        where = f"{claim.label} ({claim.kind} on {claim.page})"
        if not entry.checks:
            problems.append(f"{where}: no numerical check (call run.check('{claim.label}', ...) in a notebook)")
        if not entry.tests:
            problems.append(f"{where}: no test (name one test_{claim.label.replace('-', '_')}_...)")
        for check in entry.checks:
            if not check.ok:
                problems.append(f"{where}: check in {check.notebook} exceeds its tolerance: "
                                f"{check.what} = {check.discrepancy:.3g} > {check.tolerance:.3g}")
        if entry.source not in SOURCES or not entry.summary:
            problems.append(f"{where}: needs a summary and a source ({', '.join(SOURCES)}) in {_CLAIMS_FILE}")
        entries.append(entry)
    for label in sorted(set(checks) - set(labels)):
        problems.append(f"{label}: checked in {checks[label][0].notebook} but no claim has this label")
    for label in sorted(set(notes) - set(labels)):
        problems.append(f"{label}: described in {_CLAIMS_FILE} but no claim has this label")
    pages = {str(p.with_suffix("")) for p in book.pages}
    for figure in figures:
        if figure.get("ours") not in pages:
            problems.append(f"figure {figure.get('paper', '?')!r}: reproduced by {figure.get('ours')!r}, "
                            "which is not a page of the book")
    return Ledger(entries, figures, problems)


def write_ledger(book: Book, path: Path) -> Ledger:
    ledger = build_ledger(book)
    # Claims keep the book's order (chapter by chapter) for the status table.
    path.write_text(json.dumps(ledger.to_json(), indent=1) + "\n")
    return ledger
