"""The reproduction ledger finds every claim's check and test, and catches a broken claim."""

from __future__ import annotations

import shutil
import textwrap

import pytest
import yaml

from bookbuild.book import Book
from bookbuild.ledger import Claim, assemble, build_ledger, claims_from_site, ledger_inputs, match_tests
from bookbuild.site import build_site

PAGE = textwrap.dedent("""\
    # Claims

    :::{prf:theorem} Good
    :label: thm-good

    Holds.
    :::

    :::{prf:proposition} Broken
    :label: prop-broken

    Its check fails.
    :::

    :::{prf:lemma} Untested
    :label: lem-untested

    Has a check, no test.
    :::

    :::{prf:corollary} Unchecked
    :label: cor-unchecked

    Has a test, no check.
    :::

    :::{prf:definition} Not a claim
    :label: def-thing

    Definitions need neither.
    :::

    A directive shown as code is no claim:

    ```text
    :::{prf:theorem} Shown, not stated
    :label: thm-shown
    :::
    ```

    ::::{note}
    :::{prf:lemma}
    A claim without a label, nested in a note.
    :::
    ::::
    """)

CLAIMS = [Claim("thm-good", "theorem", "Good", "claims"),
          Claim("prop-broken", "proposition", "Broken", "claims"),
          Claim("lem-untested", "lemma", "Untested", "claims"),
          Claim("cor-unchecked", "corollary", "Unchecked", "claims")]


def record(book: Book, notebook: str, checks: dict) -> None:
    folder = book.checks / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "demo.yaml").write_text(yaml.safe_dump({"notebook": notebook, "checks": checks}))


@pytest.fixture
def claims_book(fixture_book) -> Book:
    root = fixture_book.root
    (root / "claims.md").write_text(PAGE)
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: claims\n  - file: chapters/demo/demo\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_claims.py").write_text(
        "def test_thm_good_holds():\n    pass\n\n"
        "def test_prop_broken_is_asserted():\n    pass\n\n"
        "def test_cor_unchecked_is_asserted():\n    pass\n")
    (root / "data" / "claims.yaml").write_text(yaml.safe_dump({"claims": {
        "thm-good": {"source": "precise", "summary": "It holds."},
        "prop-broken": {"source": "extension", "summary": "It breaks."},
        "lem-untested": {"source": "extension", "summary": "Untested."},
        "cor-unchecked": {"source": "extension", "summary": "Unchecked."},
        "thm-gone": {"source": "extension", "summary": "No such claim."},
    }}))
    book = Book(root)
    record(book, "chapters/demo/demo.ipynb", {
        "thm-good": {"discrepancy": 1e-16, "tolerance": 1e-12, "what": "error", "ok": True},
        "prop-broken": {"discrepancy": 0.5, "tolerance": 1e-3, "what": "gap", "ok": False},
        "lem-untested": {"discrepancy": 0.0, "tolerance": 0.0, "what": "excess", "ok": True},
        "prop-typo": {"discrepancy": 0.0, "tolerance": 0.0, "what": "excess", "ok": True},
    })
    return book


def test_ledger_reports_every_broken_claim_and_only_those(claims_book):
    ledger = assemble(ledger_inputs(claims_book), CLAIMS)
    verdicts = {e.claim.label: e.verdict for e in ledger.entries}
    assert verdicts == {"thm-good": "reproduced", "prop-broken": "fails its check",
                        "lem-untested": "incomplete", "cor-unchecked": "incomplete"}
    text = "\n".join(ledger.problems)
    assert "prop-broken (proposition on claims): check in chapters/demo/demo exceeds its tolerance" in text
    assert "lem-untested (lemma on claims): no test" in text
    assert "cor-unchecked (corollary on claims): no numerical check" in text
    assert "prop-typo: checked in chapters/demo/demo but no claim has this label" in text
    assert "thm-gone: described in data/claims.yaml but no claim has this label" in text
    assert not any(p.startswith("thm-good") for p in ledger.problems)
    assert len(ledger.problems) == 5


def test_ledger_finds_tests_and_checks_of_the_good_claim(claims_book):
    [good] = [e for e in assemble(ledger_inputs(claims_book), CLAIMS).entries if e.claim.label == "thm-good"]
    assert good.tests == ["tests/test_claims.py::test_thm_good_holds"]
    assert [(c.notebook, c.discrepancy, c.tolerance) for c in good.checks] == [
        ("chapters/demo/demo", 1e-16, 1e-12)]


def test_a_test_belongs_to_the_longest_label_it_starts_with():
    ids = ["t.py::test_thm_rank_gap_one_head", "t.py::test_thm_rank_gap_map_single_token",
           "t.py::test_thm_rank_gapless_is_not_a_match"]
    found = match_tests(["thm-rank-gap", "thm-rank-gap-map"], ids)
    assert found == {"thm-rank-gap": ["t.py::test_thm_rank_gap_one_head"],
                     "thm-rank-gap-map": ["t.py::test_thm_rank_gap_map_single_token"]}


@pytest.mark.slow
def test_rendered_page_shows_the_verdict_under_each_claim(claims_book):
    real = Book.here()
    for name in ("_config.yml", "references.bib"):
        shutil.copy2(real.root / name, claims_book.root / name)
    shutil.copytree(real.root / "_static", claims_book.root / "_static")
    from bookbuild.execute import execute_notebooks

    execute_notebooks(claims_book, echo=lambda _: None)
    record(claims_book, "chapters/demo/demo.ipynb", {  # executing replaced the recorded checks
        "thm-good": {"discrepancy": 1e-16, "tolerance": 1e-12, "what": "error", "ok": True},
        "prop-broken": {"discrepancy": 0.5, "tolerance": 1e-3, "what": "gap", "ok": False}})
    assert build_site(claims_book, echo=lambda _: None)
    # Sphinx found the claims: the four labelled ones, the nested unlabelled lemma, not the code.
    found = claims_from_site(claims_book)
    assert found[:4] == CLAIMS and len(found) == 5
    assert (found[4].kind, found[4].page) == ("lemma", "claims")
    problems = build_ledger(claims_book).problems
    assert "a lemma on claims (untitled) has no :label:, so it cannot be checked or tested" in problems
    assert not any("thm-shown" in p for p in problems)
    html = (claims_book.html / "claims.html").read_text()
    assert html.count('class="claim-ledger') == 4
    assert "✓ reproduced" in html and "✗ fails its check" in html and "◌ incomplete" in html
    assert "test_thm_good_holds" in html
