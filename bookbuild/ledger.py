"""The reproduction ledger: each claim (a labelled sphinx-proof theorem, proposition, lemma or
corollary, found by the Sphinx extension) joined with its ``run.check`` records, its tests
(``test_<label with _>[_<anything>]`` under ``tests/``) and its ``data/claims.yaml`` entry (source,
summary, what its checks verify), and every problem that leaves it incomplete."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import nbformat
import yaml

from .book import Book

CLAIM_KINDS = ("theorem", "proposition", "lemma", "corollary")
SOURCES = {"abstract": "abstract", "precise": "precise version", "extension": "extension"}  # as shown
# What a claim's checks verify (data/claims.yaml `verifies`); a "bound" check reports measured ÷ bound against 1.
VERIFIES = {"formula": "formula on chosen inputs", "bound": "bound on chosen inputs",
            "cases": "statement on a battery of cases", "estimate": "estimate within its accuracy"}
NOTES_FILE = "data/claims.yaml"
LEDGER_FILE = "_ledger.json"  # in the staged tree: checks, tests and notes, for the extension
CLAIMS_FILE = "_claims.json"  # in the built site: the claims the extension found
_AUTO_LABEL = re.compile(rf"^({'|'.join(CLAIM_KINDS)})-\d+$")  # sphinx-proof's when none is given


def _check_cells(executed: Path) -> dict[str, int]:
    """label -> position (source numbering) of the cell that glued ``check-<label>``."""
    cells = [c for c in nbformat.read(executed, as_version=4).cells
             if "injected-parameters" not in c.metadata.get("tags", [])] if executed.exists() else []
    return {out["metadata"]["scrapbook"]["name"].removeprefix("check-"): position
            for position, cell in enumerate(cells, 1) for out in cell.get("outputs", [])
            if out.get("metadata", {}).get("scrapbook", {}).get("name", "").startswith("check-")}


def find_checks(book: Book) -> dict[str, list[dict]]:
    """label -> the checks recorded by the last successful executions of the book's notebooks."""
    found: dict[str, list[dict]] = {}
    notebooks = {str(p) for p in book.notebooks}
    for path in sorted(book.checks.rglob("*.yaml")) if book.checks.exists() else []:
        record = yaml.safe_load(path.read_text()) or {}
        if record.get("notebook") not in notebooks:
            continue  # a notebook that left the book
        cells = _check_cells(book.executed / record["notebook"])
        for label, check in (record.get("checks") or {}).items():
            value, tolerance = float(check["discrepancy"]), float(check["tolerance"])
            found.setdefault(label, []).append(dict(
                notebook=record["notebook"].removesuffix(".ipynb"), cell=cells.get(label), discrepancy=value,
                tolerance=tolerance, what=str(check.get("what", "")), ok=value <= tolerance))
    return found


def find_test_ids(root: Path) -> list[str]:
    """``tests/...py::[Class::]test_name`` of every test function under ``tests/``."""
    ids = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            group = isinstance(node, ast.ClassDef) and node.name.startswith("Test")  # its test methods
            prefix = f"{path.relative_to(root).as_posix()}::" + (f"{node.name}::" if group else "")
            ids += [prefix + f.name for f in (node.body if group else [node])
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test_")]
    return ids


def match_tests(labels, ids) -> dict[str, list[str]]:
    """label -> test ids named after it; a test belongs to the longest label it starts with."""
    stems = sorted(((label, "test_" + label.replace("-", "_")) for label in labels), key=lambda x: -len(x[1]))
    found: dict[str, list[str]] = {label: [] for label in labels}
    for test_id in ids:
        name = test_id.rsplit("::", 1)[-1]
        label = next((lb for lb, stem in stems if name == stem or name.startswith(stem + "_")), None)
        if label is not None:
            found[label].append(test_id)
    return found


def ledger_inputs(book: Book) -> dict:
    """Everything but the claims: pages, checks, tests and ``data/claims.yaml``."""
    path = book.root / NOTES_FILE
    notes = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    return {"pages": [str(p.with_suffix("")) for p in book.pages], "checks": find_checks(book),
            "tests": find_test_ids(book.root), "notes": notes.get("claims") or {},
            "figures": notes.get("figures") or []}


def assemble(inputs: dict, claims: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """Join claims (dicts: label, kind, title, page) with their checks, tests and notes:
    (label -> entry with its verdict, in the book's order; every problem)."""
    labels = [c["label"] for c in claims if not _AUTO_LABEL.match(c["label"])]
    checks, notes = inputs["checks"], inputs["notes"]
    tests = match_tests(labels, inputs["tests"])
    problems = [f"{label}: labelled twice" for label in sorted({x for x in labels if labels.count(x) > 1})]
    entries = {}
    for claim in claims:
        label, where = claim["label"], f"{claim['label']} ({claim['kind']} on {claim['page']})"
        if _AUTO_LABEL.match(label):
            problems.append(f"a {claim['kind']} on {claim['page']} ({claim['title'] or 'untitled'}) "
                            "has no :label:, so it cannot be checked or tested")
            continue
        note = notes.get(label) or {}
        kind = note.get("verifies")  # a kind, or {notebook stem: kind}
        entry = {**claim, "source": str(note.get("source", "")), "summary": str(note.get("summary", "")),
                 "checks": [{**c, "kind": kind.get(Path(c["notebook"]).name) if isinstance(kind, dict) else kind}
                            for c in checks.get(label, [])], "tests": tests.get(label, [])}
        entry["verdict"] = ("incomplete" if not entry["checks"] or not entry["tests"] else
                            "reproduced" if all(c["ok"] for c in entry["checks"]) else "fails its check")
        entries[label] = entry
        if not entry["checks"]:
            problems.append(f"{where}: no numerical check (call run.check('{label}', ...) in a notebook)")
        if not entry["tests"]:
            problems.append(f"{where}: no test (name one test_{label.replace('-', '_')}_...)")
        problems += [f"{where}: check in {c['notebook']} exceeds its tolerance: {c['what']} = "
                     f"{c['discrepancy']:.3g} > {c['tolerance']:.3g}" for c in entry["checks"] if not c["ok"]]
        if entry["source"] not in SOURCES or not entry["summary"]:
            problems.append(f"{where}: needs a summary and a source ({', '.join(SOURCES)}) in {NOTES_FILE}")
        if not kind or any(c["kind"] not in VERIFIES for c in entry["checks"]):
            problems.append(f"{where}: needs `verifies` ({', '.join(VERIFIES)}; per notebook) in {NOTES_FILE}")
        problems += [f"{where}: its bound check in {c['notebook']} must report measured ÷ bound against 1"
                     for c in entry["checks"] if c["kind"] == "bound" and not 1 <= c["tolerance"] <= 1 + 1e-6]
    problems += [f"{label}: checked in {checks[label][0]['notebook']} but no claim has this label"
                 for label in sorted(set(checks) - set(labels))]
    problems += [f"{label}: described in {NOTES_FILE} but no claim has this label"
                 for label in sorted(set(notes) - set(labels))]
    problems += [f"figure {f.get('paper', '?')!r}: reproduced by {f.get('ours')!r}, which is not a "
                 "page of the book" for f in inputs["figures"] if f.get("ours") not in inputs["pages"]]
    return entries, problems


def claims_from_site(book: Book) -> list[dict]:
    """The claims Sphinx found when it rendered the current site, in the book's order."""
    path = book.html / CLAIMS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the site was not built by this book's "
                                "Sphinx extension (run `make book`)")
    return json.loads(path.read_text())
