"""The reproduction ledger: every claim of the book with its proof, its numerical check and its test.

A *claim* is a ``{prf:theorem}``, ``{prf:proposition}``, ``{prf:lemma}`` or ``{prf:corollary}``
on a page of the book. Claims are found by Sphinx itself: the book's extension
(:mod:`bookbuild.sphinx_ext`) walks every doctree for sphinx-proof's nodes and writes them,
in the book's order, to ``_claims.json`` in the built site — so a directive shown inside a
code block is no claim, and one nested in any markup still is. Its *checks* are the
``run.check(label, ...)`` calls of the executed notebooks (recorded under
``_build/checks/``); its *tests* are the pytest functions named ``test_<label with _ for ->``
or ``test_<label>_<anything>`` under ``tests/``; its one-line summary and source (stated in
the abstract, the book's precise version, or the book's extension) come from
``data/claims.yaml``.

Before the site is rendered, :func:`ledger_inputs` gathers the checks, tests and notes into
the staged tree's ``_ledger.json``; the extension joins them with the claims it finds
(:func:`assemble`) to print a line under each claim and the status table. The site check
joins the same inputs with the built site's ``_claims.json`` (:func:`build_ledger`) and fails
on any problem: a claim without a label, a check, a test or a summary, a check beyond its
tolerance, a check or summary whose label is no claim.
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
_NOTES_FILE = Path("data") / "claims.yaml"


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


# --- the sources -------------------------------------------------------------------------
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
    path = book.root / _NOTES_FILE
    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    return data.get("claims") or {}, data.get("figures") or []


# --- the ledger -----------------------------------------------------------------------------
CLAIMS_FILE = "_claims.json"  # written into the built site by the Sphinx extension
_AUTO_LABEL = re.compile(r"^(" + "|".join(CLAIM_KINDS) + r")-\d+$")  # sphinx-proof's label for none


def ledger_inputs(book: Book) -> dict:
    """Everything about the claims except the claims themselves: pages, checks, tests, notes."""
    notes, figures = load_claim_notes(book)
    return {
        "pages": [str(p.with_suffix("")) for p in book.pages],
        "checks": {label: [asdict(c) for c in checks] for label, checks in find_checks(book).items()},
        "tests": find_test_ids(book.root),
        "notes": notes,
        "figures": figures,
    }


def claims_from_site(book: Book) -> list[Claim]:
    """The claims Sphinx found when it rendered the current site, in the book's order."""
    path = book.html / CLAIMS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the site was not built by this book's "
                                "Sphinx extension (run `make book`)")
    return [Claim(**claim) for claim in json.loads(path.read_text())]


def assemble(inputs: dict, claims: list[Claim]) -> Ledger:
    """Join the claims with their checks, tests and notes, and list every problem."""
    labels = [c.label for c in claims if not _AUTO_LABEL.match(c.label)]
    checks = {label: [Check(**c) for c in found] for label, found in inputs["checks"].items()}
    tests = match_tests(labels, inputs["tests"])
    notes, figures = inputs["notes"], inputs["figures"]
    problems = []
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    problems += [f"{label}: labelled twice" for label in duplicates]
    entries = []
    for claim in claims:
        if _AUTO_LABEL.match(claim.label):
            problems.append(f"a {claim.kind} on {claim.page} ({claim.title or 'untitled'}) has no "
                            ":label:, so it cannot be checked or tested")
            continue
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
            problems.append(f"{where}: needs a summary and a source ({', '.join(SOURCES)}) in {_NOTES_FILE}")
        entries.append(entry)
    for label in sorted(set(checks) - set(labels)):
        problems.append(f"{label}: checked in {checks[label][0].notebook} but no claim has this label")
    for label in sorted(set(notes) - set(labels)):
        problems.append(f"{label}: described in {_NOTES_FILE} but no claim has this label")
    for figure in figures:
        if figure.get("ours") not in inputs["pages"]:
            problems.append(f"figure {figure.get('paper', '?')!r}: reproduced by {figure.get('ours')!r}, "
                            "which is not a page of the book")
    return Ledger(entries, figures, problems)


def build_ledger(book: Book) -> Ledger:
    """The ledger of the current build: the site's claims joined with the book's inputs."""
    return assemble(ledger_inputs(book), claims_from_site(book))


def write_inputs(book: Book, path: Path) -> None:
    """The staged tree's ``_ledger.json``, read by the Sphinx extension."""
    path.write_text(json.dumps(ledger_inputs(book), indent=1) + "\n")
