"""experiments.framework: the zoo against the numpy formulas, and the chapter's tables and checks.

Every instance of `lib.architecture_zoo` (here at another size and seed), plus a non-causal
linear attention the zoo lacks, against the page's formulas in the `reference` package (numpy,
independent of lib): operator, forward pass and the identity on adversarial input families,
interaction ranks where the page claims them. The table builders and checks must pass on lib
and fail on a planted wrong model.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import reference as ref
from experiments import framework as fw
from lib import LinearAttention, LinearSSM, architecture_zoo, interaction_rank

ZOO = architecture_zoo(d=4, p=4, heads=2, state=4, seed=7)
ALL = ZOO + [("linear attention (2 heads, non-causal)", "prop-linear-attention",
              LinearAttention.random(4, 4, 2, causal=False, seed=30))]
IDS = [name for name, _, _ in ALL]
[DENSE] = [a for a in ZOO if a[1] == "prop-dense"]
[LTI] = [a for a in ZOO if a[1] == "prop-lti-ssm"]


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(11).standard_normal((8, 10, 4))


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_every_architecture_matches_the_reference_formulas_on_adversarial_inputs(arch):
    families = ref.input_families(8, 4, np.random.default_rng(3), batch=2)
    errors = {family: fw.agreement(arch[2], X) for family, X in families.items()}
    assert max(max(e.values()) for e in errors.values()) <= fw.TOLERANCE, errors


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_causality_and_input_dependence_are_as_the_proposition_says(arch, inputs):
    name, label, model = arch
    with torch.no_grad():
        W = model.operator(torch.from_numpy(inputs[:4])).numpy()
    upper = W[:, *np.triu_indices(10, 1)]
    assert (np.abs(upper).max() == 0) == model.causal == ("non-causal" not in name)
    changes = [np.linalg.norm(w - W[0]) / np.linalg.norm(W[0]) for w in W[1:]]
    assert (max(changes) > 1e-8) == fw.zoo_claims(label, model, 10)[0]


@pytest.mark.parametrize("arch", ALL, ids=IDS)
def test_interaction_rank_is_what_the_proposition_says(arch, inputs):
    # "=": the page's exact value, in numpy from the parameters (and the inputs, for the ReLU
    # layer's patterns and linear attention's weights); "≤": a bound, checked as one.
    name, label, model = arch
    relation, value, _ = fw.predicted_rank(model, inputs)
    rank = interaction_rank(model, inputs)
    assert rank == value if relation == "=" else rank <= value
    _, claimed, exact = fw.zoo_claims(label, model, 10)
    assert relation == "=" or not exact                     # the zoo never claims more than the page
    if exact:                                               # lib's spans against numpy's ranks
        assert (relation, value) == ("=", claimed)


def test_which_ranks_the_chapter_claims_exactly():
    # Exact for ten of the twelve instances; the Elman RNN and the KAN layer carry bounds only.
    inputs = np.random.default_rng(0).standard_normal((8, 10, 4))
    relations = {name: fw.predicted_rank(model, inputs)[0] for name, _, model in ZOO}
    assert {name for name, r in relations.items() if r == "≤"} == {"Elman RNN (tanh)", "KAN layer"}


def test_lti_ssm_rank_is_k_from_an_independent_lag_computation():
    A, B, C = (getattr(LTI[2], name).numpy(force=True) for name in "ABC")
    lags = np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(10)])
    sigma = np.linalg.svd(lags.reshape(10, -1), compute_uv=False)
    assert fw.zoo_claims(LTI[1], LTI[2], 10)[1:] == (int((sigma > 1e-10 * sigma[0]).sum()), True) == (4, True)


def test_operator_norms_are_the_block_norms_of_the_formula(inputs):
    for _, _, model in ALL:
        expected = np.linalg.norm(fw.operator(model, inputs[0]), axis=(2, 3))
        np.testing.assert_allclose(fw.operator_norms(model, inputs[0]), expected, rtol=1e-9, atol=1e-14)


# -- the notebook's tables and checks: they must be able to fail ---------------------------------


class Planted(LinearSSM):
    """lib's LTI SSM of the zoo with its operator or forward pass off by a factor."""

    def __init__(self, operator_factor=1.0, forward_factor=1.0):
        super().__init__(*(getattr(LTI[2], name).detach() for name in "ABC"))
        self.factors = operator_factor, forward_factor

    def operator(self, X):
        return self.factors[0] * super().operator(X)

    def forward(self, X):
        return self.factors[1] * super().forward(X)


def lti_checks(ssm, lti_rank=4, extra_ranks=()):
    zoo = [DENSE, (LTI[0], LTI[1], ssm)]
    families = ref.input_families(10, 4, np.random.default_rng(5), batch=2)
    inputs = np.random.default_rng(6).standard_normal((4, 10, 4))
    ranks = fw.rank_rows(zoo, {DENSE[0]: 1, LTI[0]: lti_rank}, inputs) + list(extra_ranks)
    return {label: (value, tol) for label, value, tol, _ in
            fw.proposition_checks(fw.agreement_rows(zoo, families), ranks)}


def test_proposition_checks_pass_on_the_zoo_and_report_the_real_tolerance():
    checks = lti_checks(Planted())
    assert set(checks) == {"prop-dense", "prop-lti-ssm"}
    for value, tol in checks.values():
        assert value <= tol == 1e-10


@pytest.mark.parametrize("fault", [{"operator_factor": 1.001}, {"forward_factor": 1 + 1e-9}])
def test_proposition_checks_fail_on_a_planted_error(fault):
    checks = lti_checks(Planted(**fault))
    assert checks["prop-lti-ssm"][0] > checks["prop-lti-ssm"][1]
    assert checks["prop-dense"][0] <= 1e-10


def test_proposition_checks_fail_on_a_missed_rank():
    value, tol = lti_checks(Planted(), lti_rank=3)["prop-lti-ssm"]
    assert value >= 1 > tol


def test_worst_row_is_relative_to_each_rows_tolerance():
    rows = [{"largest": 1e-9, "tolerance": 1e-8}, {"largest": 1e-10, "tolerance": 1e-10}]
    assert fw.worst_row(rows) is rows[1]


def test_prop_structured_dynamics_rows_fail_on_a_planted_error():
    families = {"random": np.random.default_rng(8).standard_normal((2, 6, 4))}
    recurrent = [a for a in ZOO if a[1] in ("prop-rnn", "prop-lti-ssm", "prop-selective-ssm", "prop-ssd")]
    rows = fw.structured_rows(recurrent, families, [(2, 3, 2)], np.random.default_rng(9))
    assert [r["inputs"] for r in rows] == ["impulses"] + ["random"] * 5
    assert all(r["error"] <= r["tolerance"] for r in rows)
    planted = fw.structured_rows([("ssm", "", Planted(1 + 1e-8))], families, [], np.random.default_rng(9))
    assert fw.worst_row(planted, "error")["error"] > 1e-10


def test_prop_discretisation_rows_pass_for_lib_and_fail_on_a_wrong_step():
    systems = ref.continuous_systems(3, 2, 2, np.random.default_rng(4), hurwitz=1, singular=1)
    steps = [1e-2, 0.5]
    value, _ = fw.discretisation_check(fw.discretisation_rows(LinearSSM.from_continuous, systems, steps))
    assert value <= 1e-12

    def off(A_c, B_c, C, step, method):
        return LinearSSM.from_continuous(A_c, B_c, C, step * (1 + 1e-9), method=method)

    def off_B(A_c, B_c, C, step, method):
        model = LinearSSM.from_continuous(A_c, B_c, C, step, method=method)
        return LinearSSM(model.A.detach(), model.B.detach() * (1 + 1e-9), model.C.detach())

    def off_radius(A_c, B_c, C, step, method):
        model = LinearSSM.from_continuous(A_c, B_c, C, step, method=method)
        return SimpleNamespace(A=model.A, B=model.B, spectral_radius=model.spectral_radius * (1 + 1e-9))

    for wrong in (off, off_B, off_radius):
        assert fw.discretisation_check(fw.discretisation_rows(wrong, systems, steps))[0] > 1e-12


def test_prop_discretisation_check_counts_unstable_hurwitz_systems():
    row = {"system": "Hurwitz 1", "Ā error": 0.0, "B̄ error": 0.0, "ρ(Ā)": 1.0, "ρ mapped": 1.0}
    assert fw.discretisation_check([row])[0] == 1
    assert fw.discretisation_check([{**row, "system": "zero 1"}])[0] == 0


def test_prop_factorized_rank_rows_hold_for_the_zoo(inputs):
    factorized = [a for a in ALL if a[1] in ("prop-dense", "prop-ssd", "prop-softmax-attention",
                                             "prop-linear-attention")]
    inputs = inputs[:3]
    measured = {name: interaction_rank(model, inputs) for name, _, model in factorized}
    rows = fw.factorized_rank_rows(factorized, measured, inputs)
    assert [r["heads H"] for r in rows] == [1, 1, 2, 1, 2, 2, 2]
    assert all(r["dim span{V_h}"] == r["heads H"] for r in rows)
    assert fw.factorized_rank_misses(rows) == 0
    assert fw.factorized_rank_misses(fw.factorized_rank_rows(factorized, {**measured, DENSE[0]: 2}, inputs)) == 1


def test_prop_factorized_rank_misses_are_counted():
    row = {"heads H": 2, "dim span{V_h}": 2, "dim span{α_ij(X)}": 2, "measured": 2}
    assert fw.factorized_rank_misses([row]) == 0
    assert fw.factorized_rank_misses([{**row, "measured": 1}]) == 1        # independent V_h: must equal
    assert fw.factorized_rank_misses([{**row, "dim span{V_h}": 1, "measured": 1}]) == 0  # dependent: ≤ only
    assert fw.factorized_rank_misses([{**row, "dim span{α_ij(X)}": 3, "measured": 3}]) == 1  # above H



# -- prop-lti-ssm: k by a route without lags ------------------------------------------------------

HAND_K = {"double eigenvalues ±0.5 (m_A = 2)": 2, "Jordan block, λ = 0.7 (m_A = 4)": 4,
          "diagonal A, one mode not driven": 3, "rank-one B and C": 1, "nilpotent shift, p = d = 1": 1,
          "C = 0": 0, "N = 8, p = d = 2, ρ(A) = 0.99": 4}


def lti_rank_rows(measure=interaction_rank, seed=3):
    systems = fw.lti_rank_systems(np.random.default_rng(seed))
    draw = np.random.default_rng(seed + 1).standard_normal
    return fw.lti_rank_rows(systems, {w: draw((2, 9, w)) for w in (1, 2, 4)}, measure)


def test_prop_lti_ssm_resolvent_rank_is_the_k_worked_out_by_hand():
    # Double eigenvalues: m_A = 2 bounds k; an undriven mode drops one; rank-one B, C: every lag
    # is a multiple of c aᵀ; p = d = 1 and N > pd: k = pd (generic parameters: almost surely).
    for seed in range(3):
        rows = lti_rank_rows(seed=seed)
        assert {r["system"]: r["k (resolvents)"] for r in rows} == HAND_K
        assert all(r["holds"] for r in rows)


@pytest.mark.parametrize("N", [1, 4, 8, 12])
def test_prop_lti_ssm_resolvent_rank_equals_the_rank_of_the_lags_near_the_unit_circle(N):
    for seed in range(3):
        A, B, C = (getattr(LinearSSM.random(N, 4, 4, spectral_radius=0.99, seed=seed), x).numpy(force=True)
                   for x in "ABC")
        lags = np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(N + 4)])
        assert fw.resolvent_rank(A, B, C) == ref.numerical_rank(lags) == min(N, 16)


def test_prop_lti_ssm_rank_rows_fail_on_a_planted_operator_and_on_the_generic_value():
    def perturbed(model, X):  # lib's rank of A + 1e-3 E: the double eigenvalues split
        E = torch.from_numpy(np.random.default_rng(0).standard_normal(model.A.shape))
        return interaction_rank(LinearSSM(model.A.detach() + 1e-3 * E, model.B.detach(), model.C.detach()), X)

    def generic(model, X):
        return min(model.N, X.shape[1], model.p * model.d)

    for wrong, misses in ((perturbed, 2), (generic, 4)):
        rows = lti_rank_rows(wrong)
        assert sum(not r["holds"] for r in rows) >= misses
    ranks = lti_rank_rows(generic)
    value, tol = lti_checks(Planted(), extra_ranks=ranks)["prop-lti-ssm"]
    assert value >= 4 > tol


def test_a_mamba_like_step_projection_is_outside_the_exactness_hypothesis(inputs):
    [(_, _, selective)] = [a for a in ZOO if a[1] == "prop-selective-ssm"]
    low = fw.with_step_rank(selective, 1)
    W = selective.W_delta.numpy(force=True)
    assert np.linalg.matrix_rank(low.W_delta.numpy(force=True)) == 1
    sigma = np.linalg.svd(W, compute_uv=False)
    assert np.linalg.norm(low.W_delta.numpy(force=True) - W, 2) == pytest.approx(sigma[1], rel=1e-12)
    assert fw.predicted_rank(low, inputs)[:2] == ("≤", 4) and fw.predicted_rank(selective, inputs)[:2] == ("=", 4)
    assert interaction_rank(low, inputs) <= 4


# -- prop-residual-attention, prop-ssd-skip, the feed-through remark ------------------------------


def _residual_blocks_zoo(d=4, heads=2, seed=0):
    from lib import SoftmaxAttention
    gain = np.random.default_rng(seed).uniform(0.5, 1.5, d)
    softmax = [SoftmaxAttention.random(d, d, H, seed=seed + H) for H in (1, heads)]
    blocks = {f"softmax {f.H}": (f, None, True) for f in softmax}
    blocks["linear"] = (LinearAttention.random(d, d, heads, seed=seed + 5), None, True)
    blocks |= {f"softmax {f.H} pre-LN": (f, gain, False) for f in softmax}
    return blocks


def test_prop_residual_attention_rank_is_h_plus_one_and_rows_sum_to_i_plus_values():
    inputs = np.random.default_rng(1).standard_normal((4, 7, 4))
    rows = fw.residual_rows(_residual_blocks_zoo(), inputs)
    assert [r["measured rank"] for r in rows] == [r["heads H"] + 1 for r in rows] == [2, 3, 3, 2, 3]
    value, _ = fw.residual_check(rows)
    assert value < 1e-12


def test_prop_residual_attention_operator_matches_lib_stack_without_norm():
    # Without a norm the block is lib.Stack([f], residual=True); its operator adds I in lib's own code.
    from lib import SoftmaxAttention, Stack
    f = SoftmaxAttention.random(3, 3, 2, seed=4)
    X = np.random.default_rng(4).standard_normal((6, 3))
    W = fw.residual_blocks(f, X)
    W_stack = Stack([f], residual=True).operator(torch.from_numpy(X)).numpy(force=True)
    np.testing.assert_allclose(W, W_stack, rtol=0, atol=1e-13)
    P = {k: v.numpy(force=True) for k, v in f.named_parameters()}
    values = np.einsum("hpv,hvd->pd", P["W_O"], P["W_V"])
    np.testing.assert_allclose(W.sum(axis=1), np.broadcast_to(np.eye(3) + values, (6, 3, 3)), atol=1e-13)


def test_prop_residual_attention_pre_ln_identity_fails_on_a_wrong_gain():
    from lib import SoftmaxAttention
    f = SoftmaxAttention.random(4, 4, 1, seed=2)
    X = np.random.default_rng(2).standard_normal((5, 4))
    gain = np.linspace(0.5, 1.5, 4)
    y = np.einsum("ijpd,jd->ip", fw.residual_blocks(f, X, gain), X)
    assert ref.itemwise_error(y, fw.residual_forward(f, X, gain), 1) < 1e-12
    assert ref.itemwise_error(y, fw.residual_forward(f, X, 1.001 * gain), 1) > 1e-5


def test_prop_residual_attention_check_counts_a_rank_miss():
    row = {"heads H": 1, "measured rank": 1, "identity error": 0.0, "row sums − (I + Σ V_h)": 0.0}
    assert fw.residual_check([row])[0] == 1


def test_prop_ssd_skip_stays_factorized_with_h_heads():
    from lib import SSD
    inputs = np.random.default_rng(3).standard_normal((4, 6, 4))
    for H in (1, 2, 4):
        core = SSD.random(4, 3, N=3, heads=H, seed=H)
        D = np.random.default_rng(H).standard_normal(H)
        row = fw.ssd_skip_row(core, D, inputs)
        assert row["measured rank"] == H and row["identity error"] < 1e-12
        # the skip is D_h V_h on the diagonal blocks only
        W_core = core.operator(torch.from_numpy(inputs[0])).numpy(force=True)
        diff = fw.ssd_skip_blocks(core, D, inputs[0]) - W_core
        V = core.values().numpy(force=True)
        np.testing.assert_allclose(diff[2, 2], np.einsum("h,hpd->pd", D, V), atol=1e-14)
        assert np.abs(diff[2, 1]).max() == 0
        # a wrong skip breaks the identity
        y = np.einsum("ijpd,jd->ip", fw.ssd_skip_blocks(core, D, inputs[0]), inputs[0])
        assert ref.itemwise_error(y, fw.ssd_skip_forward(core, 1.001 * D, inputs[0]), 1) > 1e-6


@pytest.mark.parametrize("N,d,p,n", [(2, 4, 4, 12), (3, 2, 2, 9), (1, 3, 1, 5), (4, 1, 1, 3)])
def test_lti_feedthrough_rank_is_at_most_n_plus_one(N, d, p, n):
    rng = np.random.default_rng(N + d)
    A, B, C, D = (rng.standard_normal(s) for s in ((N, N), (N, d), (p, N), (p, d)))
    k, gap = fw.feedthrough_rank(0.5 * A, B, C, D, n)
    assert gap < 1e-12
    assert k == min(N + 1, n, p * d)  # generic systems attain the bound


def test_residual_head_example_represents_an_ssm_with_k_two():
    k, gap = fw.residual_head_example(0.8, 10)
    assert k == 2 and gap < 1e-14


# -- Issue 20, referee F1: a sharper LTI bound, ranks below the maximum, a rank-one W_Δ, the rule ---


def test_prop_lti_ssm_sharper_bound_min_m_a_n_rank_c_rank_b():
    # m_A by hand: a Jordan block of size 4 has m_A = 4, ±0.5 doubled m_A = 2, A = 0 has m_A = 1.
    P = np.random.default_rng(0).standard_normal((4, 4))
    doubled = P @ np.diag([0.5, 0.5, -0.5, -0.5]) @ np.linalg.inv(P)
    assert fw.minimal_polynomial_degree(0.7 * np.eye(4) + np.eye(4, k=1)) == 4
    assert fw.minimal_polynomial_degree(doubled) == 2
    assert fw.minimal_polynomial_degree(np.zeros((3, 3))) == 1
    bounds = {r["system"]: r["min(m_A, n, rk C·rk B)"] for r in lti_rank_rows()}
    assert bounds["rank-one B and C"] == 1 and bounds["double eigenvalues ±0.5 (m_A = 2)"] == 2
    assert all(r["holds"] for r in lti_rank_rows())
    # a k above the bound is a miss: lib's rank of a perturbed system against the same bound
    def perturbed(model, X):
        return interaction_rank(LinearSSM(model.A.detach() + 1e-3, model.B.detach(), model.C.detach()), X)
    assert sum(not r["holds"] for r in lti_rank_rows(perturbed)) >= 1


def test_prop_ffn_conv_selective_ssd_ranks_below_the_maximum_at_values_fixed_in_advance(inputs):
    instances = fw.below_maximum(ZOO)
    assert [fixed for *_, fixed in instances] == [8, 2, 3, 1]
    rows = fw.below_maximum_rows(instances, inputs, interaction_rank)
    assert all(r["holds"] for r in rows), rows
    # the maximum would miss every one of them: a rank that always reports the structural bound
    maximum = {"prop-ffn": 16, "prop-conv": 3, "prop-selective-ssm": 4, "prop-ssd": 2}
    wrong = fw.below_maximum_rows(instances, inputs, lambda model, X: maximum[
        next(label for _, label, m, _ in instances if m is model)])
    assert not any(r["holds"] for r in wrong)


def test_prop_selective_ssm_conditions_are_sufficient_not_necessary(inputs):
    [(_, _, selective)] = [a for a in ZOO if a[1] == "prop-selective-ssm"]
    rows = fw.rank_one_step_rows(selective, inputs, interaction_rank)
    assert [r["diagonal blocks"] for r in rows] == [3, 3, 0]
    assert [r["interaction rank"] for r in rows] == [4, 4, 4]
    assert all(r["holds"] for r in rows)
    # the softplus identity behind the dependent g_q
    t = np.linspace(-5, 5, 11)
    assert np.allclose(np.logaddexp(0, t) - np.logaddexp(0, -t), t, atol=1e-12)


def test_the_1e_10_rule_undercounts_a_fast_decaying_shift():
    rows = fw.threshold_rows([0.1, 0.01], interaction_rank)
    assert [r["exact k"] for r in rows] == [9, 9]
    assert rows[0]["measured rank"] == rows[0]["k (resolvents)"] == 9
    assert rows[1]["measured rank"] < 9 and rows[1]["k (resolvents)"] < 9


def test_one_softmax_head_full_rank_attention_matrix_but_interaction_rank_one():
    from lib import SoftmaxAttention

    X = np.random.default_rng(5).standard_normal((6, 4))
    head = SoftmaxAttention.random(4, 4, 1, seed=3)
    ranks = fw.head_ranks(head, X)
    assert ranks["attention matrix rank"] == 6  # causal: triangular, positive diagonal
    assert ranks["value map rank"] == 4
    assert ranks["operator matrix rank"] == 6 * 4  # rank(α ⊗ V) = rank α · rank V
    assert ranks["interaction rank"] == 1
    assert ranks["Kronecker gap"] <= 1e-14
    # a rank-2 value map: the operator matrix rank drops to n · 2, the interaction rank stays 1
    W_V = head.W_V.clone()
    W_V[0, 2:] = 0.0
    low = SoftmaxAttention(head.W_Q, head.W_K, W_V, head.W_O)
    ranks = fw.head_ranks(low, X)
    assert (ranks["operator matrix rank"], ranks["interaction rank"]) == (12, 1)


def test_block_patterns_are_lags_for_the_ssm_and_scaled_value_maps_for_the_head():
    from lib import SoftmaxAttention

    X = np.random.default_rng(6).standard_normal((5, 4))
    head = SoftmaxAttention.random(4, 4, 1, seed=4)
    rows = fw.block_patterns(LTI[2], head, X)
    assert max(r["SSM gap"] for r in rows) <= 1e-12
    assert max(r["head gap"] for r in rows) <= 1e-12
    assert all(r["alpha"] == 0.0 for r in rows if r["j"] > r["i"])
