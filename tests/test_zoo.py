"""The framework chapter's architecture instances against the plain-numpy references.

Every instance of `lib.zoo.architecture_zoo` (the ones the chapter's notebook measures, here at
another size and seed), plus a non-causal linear attention the zoo lacks, is compared with the
chapter's formulas transcribed in numpy (tests/reference_operators.py, which imports nothing
from lib): operator, forward pass and the identity y_i = Σ_j 𝒲_ij x_j on adversarial input
families; interaction ranks as equalities where the chapter claims them, computed from the
page's formulas in numpy, and as bounds only where it claims bounds.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import reference_operators as ref
from lib import LinearAttention, interaction_rank, is_causal, relative_error
from lib.zoo import Architecture, architecture_zoo

ZOO = architecture_zoo(d=4, p=4, n=10, heads=2, state=4, seed=7)
EXTRA = [Architecture("linear attention (2 heads, non-causal)", "prop-linear-attention",
                      LinearAttention.random(4, 4, heads=2, causal=False, seed=30),
                      causal=False, input_dependent=True, rank_bound=2)]
ALL = ZOO + EXTRA
IDS = [a.name for a in ALL]


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(11).standard_normal((16, 10, 4))


def test_zoo_covers_every_proposition_of_the_chapter():
    labels = {a.label for a in ZOO}
    assert labels == {"prop-dense", "prop-ffn", "prop-conv", "prop-rnn", "prop-lti-ssm",
                      "prop-selective-ssm", "prop-ssd", "prop-softmax-attention",
                      "prop-linear-attention", "prop-kan"}
    assert all(isinstance(a, Architecture) for a in ZOO)


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_every_architecture_matches_the_reference_formulas_on_adversarial_inputs(arch):
    families = ref.input_families(10, 4, np.random.default_rng(3))
    ratio, errors = ref.worst_ratio(arch.model, families)
    assert ratio <= 1, errors


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_causality_is_as_the_proposition_says(arch, inputs):
    assert is_causal(arch.model.operator(inputs)) == arch.causal == arch.model.causal


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_input_dependence_is_as_the_proposition_says(arch, inputs):
    changes = [relative_error(arch.model.operator(x), arch.model.operator(inputs[0])) for x in inputs[1:4]]
    assert (max(changes) > 1e-8) == arch.input_dependent


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_interaction_rank_is_what_the_proposition_says(arch, inputs):
    # "=": the page's exact value, computed in numpy from the parameters (and the inputs, for the
    # ReLU layer's patterns and linear attention's weights); "≤": a bound, checked as one.
    relation, value, _ = ref.predicted_rank(arch.model, inputs)
    rank = interaction_rank(arch.model, inputs)
    if relation == "=":
        assert rank == value
    else:
        assert rank <= value
    assert relation == "=" or not arch.rank_exact  # the zoo never claims more than the page


@pytest.mark.parametrize("arch", [a for a in ZOO if a.rank_exact], ids=[a.name for a in ZOO if a.rank_exact])
def test_the_zoo_records_the_exact_ranks_the_reference_computes(arch, inputs):
    relation, value, _ = ref.predicted_rank(arch.model, inputs)
    assert (relation, value) == ("=", arch.rank_bound)


def test_which_ranks_the_chapter_claims_exactly():
    # Exact for ten of the twelve instances; the Elman RNN and the KAN layer carry bounds only.
    inputs = np.random.default_rng(0).standard_normal((8, 10, 4))
    relations = {a.name: ref.predicted_rank(a.model, inputs)[0] for a in ZOO}
    assert {name for name, r in relations.items() if r == "≤"} == {"Elman RNN (tanh)", "KAN layer"}


def test_lti_ssm_rank_is_k_from_an_independent_lag_computation():
    [arch] = [a for a in ZOO if a.label == "prop-lti-ssm"]
    A, B, C = arch.model.A, arch.model.B, arch.model.C
    lags = np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(10)])
    sigma = np.linalg.svd(lags.reshape(10, -1), compute_uv=False)
    assert arch.rank_bound == int((sigma > 1e-10 * sigma[0]).sum()) == 4


def test_zoo_validates_its_arguments():
    with pytest.raises(ValueError, match="heads must divide d"):
        architecture_zoo(d=3, heads=2)
    with pytest.raises(ValueError, match="kernel must be >= 1"):
        architecture_zoo(kernel=0)
    with pytest.raises(TypeError, match="n must be an integer"):
        architecture_zoo(n=2.0)


# -- the notebook's tables and checks (tests/reference_operators.py): they must be able to fail


class LinearSSM:
    """A stand-in with the name, parameters and forward pass of a lib LinearSSM whose operator
    (or forward pass) is off by a planted factor."""

    def __init__(self, model, operator_factor=1.0, forward_factor=1.0):
        self._model, self._operator_factor, self._forward_factor = model, operator_factor, forward_factor

    def __getattr__(self, name):
        return getattr(self._model, name)

    def operator(self, X):
        return self._operator_factor * np.asarray(self._model.operator(X))

    def __call__(self, X):
        return self._forward_factor * np.asarray(self._model(X))


[LTI] = [a for a in ZOO if a.label == "prop-lti-ssm"]
[DENSE] = [a for a in ZOO if a.label == "prop-dense"]


def lti_checks(ssm, measured=None):
    models = {"dense": (DENSE.label, DENSE.model), "ssm": (LTI.label, ssm)}
    families = ref.input_families(10, 4, np.random.default_rng(5), batch=2)
    inputs = np.random.default_rng(6).standard_normal((4, 10, 4))
    ranks = ref.rank_rows([DENSE, LTI], measured or {DENSE.name: 1, LTI.name: LTI.rank_bound}, inputs)
    return {label: (value, tol) for label, value, tol, _ in
            ref.proposition_checks(ref.agreement_rows(models, families), ranks)}


def test_proposition_checks_pass_on_the_zoo_and_report_the_real_tolerance():
    checks = lti_checks(LinearSSM(LTI.model))
    assert set(checks) == {"prop-dense", "prop-lti-ssm"}
    for value, tol in checks.values():
        assert value <= tol and tol in (1e-10, 1e-8)


@pytest.mark.parametrize("fault", [{"operator_factor": 1.001}, {"forward_factor": 1 + 1e-9}])
def test_proposition_checks_fail_on_a_planted_error(fault):
    value, tol = lti_checks(LinearSSM(LTI.model, **fault))["prop-lti-ssm"]
    assert value > tol
    assert lti_checks(LinearSSM(LTI.model, **fault))["prop-dense"][0] <= 1e-10


def test_proposition_checks_fail_on_a_missed_rank():
    value, tol = lti_checks(LinearSSM(LTI.model), {DENSE.name: 1, LTI.name: LTI.rank_bound - 1})["prop-lti-ssm"]
    assert value >= 1 > tol


def test_prop_structured_dynamics_rows_fail_on_a_planted_error():
    families = {"random": np.random.default_rng(8).standard_normal((2, 6, 4))}
    rows = ref.structured_rows({"ssm": LTI.model}, families, [(2, 3, 2)], np.random.default_rng(9))
    assert [r["inputs"] for r in rows] == ["impulses", "random"]
    assert all(r["error"] <= r["tolerance"] for r in rows)
    planted = ref.structured_rows({"ssm": LinearSSM(LTI.model, 1 + 1e-8)}, families, [], np.random.default_rng(9))
    assert ref.worst_row(planted, "error")["error"] > 1e-10


def test_prop_discretisation_rows_pass_for_lib_and_fail_on_a_wrong_step():
    from lib import LinearSSM as LibSSM

    systems = ref.continuous_systems(3, 2, 2, np.random.default_rng(4), hurwitz=1, singular=1)
    steps = [1e-2, 0.5]
    value, _ = ref.discretisation_check(ref.discretisation_rows(LibSSM.from_continuous, systems, steps))
    assert value <= 1e-12

    def off(A_c, B_c, C, step, method):
        return LibSSM.from_continuous(A_c, B_c, C, step * (1 + 1e-9), method=method)

    assert ref.discretisation_check(ref.discretisation_rows(off, systems, steps))[0] > 1e-12

    def off_B(A_c, B_c, C, step, method):
        model = LibSSM.from_continuous(A_c, B_c, C, step, method=method)
        return LibSSM(model.A, model.B * (1 + 1e-9), model.C)

    assert ref.discretisation_check(ref.discretisation_rows(off_B, systems, steps))[0] > 1e-12

    def off_radius(A_c, B_c, C, step, method):
        model = LibSSM.from_continuous(A_c, B_c, C, step, method=method)
        return SimpleNamespace(A=model.A, B=model.B, spectral_radius=model.spectral_radius * (1 + 1e-9))

    assert ref.discretisation_check(ref.discretisation_rows(off_radius, systems, steps))[0] > 1e-12


def test_prop_discretisation_check_counts_unstable_hurwitz_systems():
    row = {"system": "Hurwitz 1", "Ā error": 0.0, "B̄ error": 0.0, "ρ(Ā)": 1.0, "ρ mapped": 1.0}
    assert ref.discretisation_check([row])[0] == 1
    assert ref.discretisation_check([{**row, "system": "zero 1"}])[0] == 0


def test_prop_factorized_rank_misses_are_counted():
    row = {"heads H": 2, "dim span{V_h}": 2, "dim span{α_ij(X)}": 2, "measured": 2}
    assert ref.factorized_rank_misses([row]) == 0
    assert ref.factorized_rank_misses([{**row, "measured": 1}]) == 1        # independent V_h: must equal
    assert ref.factorized_rank_misses([{**row, "dim span{V_h}": 1, "measured": 1}]) == 0  # dependent: ≤ only
    assert ref.factorized_rank_misses([{**row, "dim span{α_ij(X)}": 3, "measured": 3}]) == 1  # above H


def test_notebook_helpers_bad_input_names_the_argument():
    families = {"random": np.zeros((1, 3, 4))}
    with pytest.raises(ValueError, match="models must be a non-empty dict"):
        ref.agreement_rows({}, families)
    with pytest.raises(ValueError, match=r"models\['x'\] must be a pair"):
        ref.agreement_rows({"x": DENSE.model}, families)
    with pytest.raises(ValueError, match="families must be a non-empty dict"):
        ref.agreement_rows({"x": ("prop-dense", DENSE.model)}, {})
    with pytest.raises(ValueError, match="measured lacks the ranks of"):
        ref.rank_rows([DENSE], {}, np.zeros((1, 3, 4)))
    with pytest.raises(ValueError, match="rows must not be empty"):
        ref.worst_row([])
    with pytest.raises(TypeError, match="discretise must be callable"):
        ref.discretisation_rows(None, [], [0.1])
    with pytest.raises(ValueError, match="steps must be a non-empty 1-d array of positive steps"):
        ref.discretisation_rows(lambda *a, **k: None, [], [0.1, 0.0])
