"""The reproduction ledger finds every claim's check and test, and catches a broken claim."""

from __future__ import annotations

import pytest
import yaml

from bookbuild.audit import audit_ledger
from bookbuild.book import Book
from bookbuild.ledger import assemble, claims_from_site, ledger_inputs, match_tests
from bookbuild.sphinx_ext import ledger_line, status_table

from .conftest import CLAIM_NOTES, CLAIM_TESTS, CLAIMS_PAGE, copy_book

CLAIMS = [dict(label=label, kind=kind, title=title, page="claims") for label, kind, title in (
    ("thm-good", "theorem", "Good"), ("prop-broken", "proposition", "Broken"),
    ("lem-untested", "lemma", "Untested"), ("cor-unchecked", "corollary", "Unchecked"))]


@pytest.fixture
def claims_book(fixture_book) -> Book:
    root = fixture_book.root
    (root / "claims.md").write_text(CLAIMS_PAGE)
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: claims\n  - file: chapters/demo/demo\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_claims.py").write_text(CLAIM_TESTS)
    (root / "data" / "claims.yaml").write_text(yaml.safe_dump(CLAIM_NOTES))
    (fixture_book.checks / "demo").mkdir(parents=True)
    (fixture_book.checks / "demo" / "demo.yaml").write_text(yaml.safe_dump({
        "notebook": "chapters/demo/demo.ipynb", "checks": {
            "thm-good": {"discrepancy": 1e-16, "tolerance": 1e-12, "what": "error"},
            "prop-broken": {"discrepancy": 0.5, "tolerance": 1e-3, "what": "gap"},
            "lem-untested": {"discrepancy": 0.0, "tolerance": 0.0, "what": "excess"},
            "prop-typo": {"discrepancy": 0.0, "tolerance": 0.0, "what": "excess"}}}))
    return Book(root)


def test_ledger_reports_every_broken_claim_and_only_those(claims_book):
    entries, problems = assemble(ledger_inputs(claims_book), CLAIMS)
    assert {label: e["verdict"] for label, e in entries.items()} == {
        "thm-good": "reproduced", "prop-broken": "fails its check",
        "lem-untested": "incomplete", "cor-unchecked": "incomplete"}
    text = "\n".join(problems)
    assert "prop-broken (proposition on claims): check in chapters/demo/demo exceeds its tolerance" in text
    assert "lem-untested (lemma on claims): no test" in text
    assert "cor-unchecked (corollary on claims): no numerical check" in text
    assert "prop-typo: checked in chapters/demo/demo but no claim has this label" in text
    assert "thm-gone: described in data/claims.yaml but no claim has this label" in text
    assert len(problems) == 5
    good = entries["thm-good"]
    assert good["tests"] == ["tests/test_claims.py::test_thm_good_holds"]
    assert [(c["notebook"], c["discrepancy"], c["tolerance"]) for c in good["checks"]] == [
        ("chapters/demo/demo", 1e-16, 1e-12)]


def test_ledger_says_what_each_check_verifies_and_a_bound_is_a_ratio_against_one(claims_book):
    inputs = ledger_inputs(claims_book)
    entries, problems = assemble(inputs, CLAIMS)
    assert [c["kind"] for c in entries["thm-good"]["checks"]] == ["formula"]
    assert [c["kind"] for c in entries["lem-untested"]["checks"]] == ["estimate"]  # per notebook
    notes = inputs["notes"]
    broken = {**inputs, "notes": {**notes, "thm-good": {k: v for k, v in notes["thm-good"].items() if k != "verifies"},
                                  "prop-broken": {**notes["prop-broken"], "verifies": "proof"},
                                  "lem-untested": {**notes["lem-untested"], "verifies": {"other": "formula"}}}}
    text = "\n".join(assemble(broken, CLAIMS)[1])
    for label in ("thm-good (theorem", "prop-broken (proposition", "lem-untested (lemma"):
        assert f"{label} on claims): needs `verifies` (formula, bound, cases, estimate" in text
    # A bound check must report measured ÷ bound against 1: a tolerance of 1e-12 is a discrepancy's.
    bound = {**inputs, "notes": {**notes, "thm-good": {**notes["thm-good"], "verifies": "bound"}}}
    assert "thm-good (theorem on claims): its bound check in chapters/demo/demo must report measured ÷ bound " \
        "against 1" in assemble(bound, CLAIMS)[1]
    ratio = {**bound, "checks": {**inputs["checks"], "thm-good": [{**inputs["checks"]["thm-good"][0],
                                                                     "discrepancy": 0.354, "tolerance": 1 + 1e-9}]}}
    entries, problems = assemble(ratio, CLAIMS)
    assert entries["thm-good"]["verdict"] == "reproduced" and not any("thm-good" in p for p in problems)
    # Shown as such: the status table's row and the line under the claim.
    row = status_table({"thm-good": entries["thm-good"]}, "claims").astext()
    assert "ratio 0.35 ≤ 1 (notebook" in row and row.rstrip().endswith("✓ bound")
    line = ledger_line(entries["thm-good"], "claims", "status.html#status-thm-good")
    assert line.astext() == "✓ reproduced · checked: ratio 0.35 ≤ 1 · tested · details"
    assert line.children[-1]["refuri"] == "status.html#status-thm-good"


def test_a_test_belongs_to_the_longest_label_it_starts_with():
    ids = ["t.py::test_thm_rank_gap_one_head", "t.py::test_thm_rank_gap_map_single_token",
           "t.py::test_thm_rank_gapless_is_not_a_match"]
    assert match_tests(["thm-rank-gap", "thm-rank-gap-map"], ids) == {
        "thm-rank-gap": ["t.py::test_thm_rank_gap_one_head"],
        "thm-rank-gap-map": ["t.py::test_thm_rank_gap_map_single_token"]}


@pytest.mark.slow
def test_rendered_page_shows_the_verdict_under_each_claim(built_book, tmp_path):
    # Sphinx found the claims: the four labelled ones, the nested unlabelled lemma, not the code.
    found = claims_from_site(built_book)
    assert found[:4] == CLAIMS and len(found) == 5
    assert (found[4]["kind"], found[4]["page"]) == ("lemma", "claims")
    entries, problems = assemble(ledger_inputs(built_book), found)
    assert "a lemma on claims (untitled) has no :label:, so it cannot be checked or tested" in problems
    assert not any("thm-shown" in p for p in problems)
    # The checks come from the executed notebook, with the cell that made them.
    assert [(c["notebook"], c["cell"], c["ok"]) for c in entries["thm-good"]["checks"]] == [
        ("chapters/demo/demo", 6, True)]
    html = (built_book.html / "claims.html").read_text()
    assert html.count('class="claim-ledger') == 4
    assert "✓ reproduced" in html and "✗ fails its check" in html and "◌ incomplete" in html
    # One-line badges: what was measured against what is allowed, whether tested; the notebook,
    # cell and test names live on the status table (this fixture has none, so no details link).
    assert "checked: " in html and "no test" in html and "test_thm_good_holds" not in html
    assert "details</a>" not in html
    assert not any("ledger lines" in p for p in audit_ledger(built_book).problems)
    book = copy_book(built_book, tmp_path / "book")
    page = book.html / "claims.html"
    page.write_text(page.read_text().replace('class="claim-ledger', 'class="other', 1))
    assert "claims: 4 claims but 3 ledger lines on the rendered page" in audit_ledger(book).problems
