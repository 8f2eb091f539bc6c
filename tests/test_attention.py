"""Softmax and linear attention against independent numpy formulas (lib.attention)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_operators as ref
from lib import SSD, Dense, LinearAttention, SoftmaxAttention, interaction_rank, interaction_span
from lib.attention import elu_plus_one

FAST = settings(max_examples=15, deadline=None)


def numpy_softmax_weights(model, X, bias=None):
    """α^h_ij by the textbook formula, shape (H, n, n)."""
    n = len(X)
    alphas = []
    for h in range(model.H):
        q, k = X @ model.W_Q[h].T, X @ model.W_K[h].T
        s = q @ k.T / np.sqrt(model.d_k)
        if model.causal:
            if bias is not None:
                s = s + np.array([[bias[h, i - j] if j <= i else 0 for j in range(n)] for i in range(n)])
            s = np.where(np.tril(np.ones((n, n))) > 0, s, -np.inf)
        e = np.exp(s - s.max(1, keepdims=True))
        alphas.append(e / e.sum(1, keepdims=True))
    return np.array(alphas)


def numpy_linear_weights(model, X):
    phi = lambda u: np.where(u > 0, u + 1, np.exp(u))  # elu + 1
    alphas = []
    for h in range(model.H):
        kernel = phi(X @ model.W_Q[h].T) @ phi(X @ model.W_K[h].T).T
        if model.causal:
            kernel = np.tril(kernel)
        alphas.append(kernel / kernel.sum(1, keepdims=True))
    return np.array(alphas)


def check_factorized(model, X, alpha):
    """Forward and operator from α and V_h = W_O^h W_V^h."""
    V = np.einsum("hpv,hvd->hpd", model.W_O, model.W_V)
    np.testing.assert_allclose(model.values(), V, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(model.weights(X), alpha, rtol=1e-11, atol=1e-14)
    Y = np.einsum("hij,hpd,jd->ip", alpha, V, X)
    np.testing.assert_allclose(model(X), Y, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(model.operator(X), np.einsum("hij,hpd->ijpd", alpha, V), rtol=1e-10, atol=1e-14)


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 4), p=st.integers(1, 3), H=st.integers(1, 3), causal=st.booleans(),
       seed=st.integers(0, 999))
def test_prop_softmax_attention_operator_is_sum_of_alpha_times_values(n, d, p, H, causal, seed):
    model = SoftmaxAttention.random(d, p, heads=H, causal=causal, seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d)) * 2
    alpha = numpy_softmax_weights(model, X)
    check_factorized(model, X, alpha)
    assert np.all(alpha >= 0) and np.allclose(alpha.sum(-1), 1)  # rows are probability vectors


def test_prop_softmax_attention_relative_position_bias():
    rng = np.random.default_rng(0)
    W_Q, W_K, W_V, W_O = (rng.standard_normal(s) for s in ((2, 3, 4), (2, 3, 4), (2, 2, 4), (2, 3, 2)))
    bias = rng.standard_normal((2, 9))
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=bias)
    X = rng.standard_normal((7, 4))
    check_factorized(model, X, numpy_softmax_weights(model, X, bias))
    scores = model.scores(X)
    assert np.all(np.isneginf(scores[:, np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]]))
    with pytest.raises(ValueError, match="position_bias is only supported with causal=True"):
        SoftmaxAttention(W_Q, W_K, W_V, W_O, causal=False, position_bias=bias)
    with pytest.raises(ValueError, match=r"position_bias must have shape \(H, n_max\)"):
        SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=bias[:1])


@pytest.mark.parametrize("causal", [True, False])
def test_prop_softmax_attention_interaction_rank_is_H_for_n_at_least_2_and_1_for_n_1(causal):
    rng = np.random.default_rng(0)
    for H in (1, 2, 3):  # H <= d = 3: the proposition's conditions can hold
        model = SoftmaxAttention.random(3, 3, heads=H, causal=causal, seed=H)
        assert ref.value_rank(model) == H and ref.score_directions_independent(model)
        for n in (2, 5):
            X = rng.standard_normal((H, n, 3))  # H inputs suffice (almost surely)
            assert interaction_rank(model, X) == H
        assert interaction_rank(model, rng.standard_normal((4, 1, 3))) == 1  # n = 1: the block Σ_h V_h
    # One head: every block is a multiple of the single V.
    model = SoftmaxAttention.random(3, 2, heads=1, seed=0)
    span = interaction_span(model, rng.standard_normal((4, 8, 3)))
    V = model.values()[0]
    np.testing.assert_allclose(abs(np.sum(span.basis[0] * V)), np.linalg.norm(V), rtol=1e-12)


def test_prop_softmax_attention_rank_is_the_coefficient_span_when_more_heads_than_d():
    # H = 5 > d = 3: the proposition's second condition cannot hold and it claims only <= H; the
    # exact value is still dim span{α_ij(X)} (prop-factorized-rank), here computed in numpy.
    model = SoftmaxAttention.random(3, 3, heads=5, seed=5)
    X = np.random.default_rng(1).standard_normal((4, 8, 3))
    assert interaction_rank(model, X) == ref.coefficient_rank(model, X) <= 5


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 4), p=st.integers(1, 3), H=st.integers(1, 3), causal=st.booleans(),
       seed=st.integers(0, 999))
def test_prop_linear_attention_operator_is_sum_of_alpha_times_values(n, d, p, H, causal, seed):
    model = LinearAttention.random(d, p, heads=H, causal=causal, seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d)) * 2
    alpha = numpy_linear_weights(model, X)
    check_factorized(model, X, alpha)
    assert np.all(alpha >= 0) and np.allclose(alpha.sum(-1), 1)


@pytest.mark.parametrize("causal", [True, False])
def test_prop_linear_attention_interaction_rank_is_the_coefficient_span(causal):
    X = np.random.default_rng(0).standard_normal((4, 8, 3))
    for H in (1, 2, 3):
        model = LinearAttention.random(3, 3, heads=H, causal=causal, seed=H)
        assert ref.value_rank(model) == H
        assert interaction_rank(model, X) == ref.coefficient_rank(model, X) == H
        assert interaction_rank(model, X[:, :1]) == 1  # n = 1: the block Σ_h V_h


def linear_score_directions(model, x):
    """g_h = W_K^{hᵀ}(φ(W_Q^h x) ⊙ φ'(W_K^h x)), the condition of prop-linear-attention."""
    phi = ref.elu_plus_one
    slope = lambda u: np.where(u > 0, 1.0, np.exp(np.minimum(u, 0)))
    return np.array([model.W_K[h].T @ (phi(model.W_Q[h] @ x) * slope(model.W_K[h] @ x)) for h in range(model.H)])


def test_prop_linear_attention_coefficients_fill_an_open_set_near_a_regular_token():
    # The proof's construction: inputs (x* + v, x*), v small; the weights α_21 of the H heads move
    # in H independent directions when the g_h are independent, so the blocks 𝒲_21 span H dims.
    model = LinearAttention.random(3, 3, heads=3, seed=3)
    rng = np.random.default_rng(4)
    x_star = rng.standard_normal(3)
    assert np.linalg.matrix_rank(linear_score_directions(model, x_star)) == 3
    inputs = np.array([[x_star + 1e-3 * rng.standard_normal(3), x_star] for _ in range(3)])
    assert interaction_rank(model, inputs[:, :, :]) == 3
    assert np.linalg.matrix_rank(np.array([model.weights(x)[:, 1, 0] for x in inputs]) - 0.5, tol=1e-9) == 3


@pytest.mark.parametrize("d,p,H,causal,scale", [(1, 1, 1, True, 30.0), (3, 2, 2, True, 1000.0),
                                                (4, 3, 3, False, 30.0), (2, 4, 2, False, 1000.0)])
def test_prop_softmax_attention_matches_the_reference_on_adversarial_inputs(d, p, H, causal, scale):
    model = SoftmaxAttention.random(d, p, heads=H, causal=causal, seed=d + H)
    families = ref.input_families(7, d, np.random.default_rng(H), scale=scale)
    ratio, errors = ref.worst_ratio(model, families)
    assert ratio <= 1, errors


@pytest.mark.parametrize("d,p,H,causal,scale", [(1, 1, 1, True, 30.0), (3, 2, 2, True, 100.0),
                                                (4, 3, 3, False, 30.0), (2, 4, 2, False, 100.0)])
def test_prop_linear_attention_matches_the_reference_on_adversarial_inputs(d, p, H, causal, scale):
    model = LinearAttention.random(d, p, heads=H, causal=causal, seed=d + H)
    families = ref.input_families(7, d, np.random.default_rng(H), scale=scale)
    ratio, errors = ref.worst_ratio(model, families)
    assert ratio <= 1, errors


def test_elu_plus_one_keeps_relative_accuracy_far_below_zero():
    # e^u itself, not (e^u − 1) + 1, which is off by 1e-3 at u = −30 and 0 below u ≈ −37.
    u = torch.tensor([-700.0, -300.0, -40.0, -30.0, -1e-3, 0.0, 1e-3, 2.0], dtype=torch.float64, requires_grad=True)
    phi = elu_plus_one(u)
    expected = np.where(u.detach().numpy() > 0, u.detach().numpy() + 1, np.exp(np.minimum(u.detach().numpy(), 0)))
    np.testing.assert_allclose(phi.detach().numpy(), expected, rtol=1e-15)
    (g,) = torch.autograd.grad(phi.sum(), u)
    np.testing.assert_allclose(g.numpy(), np.where(u.detach().numpy() > 0, 1.0, expected), rtol=1e-15)


def test_linear_attention_reports_features_that_underflow():
    # Queries far below −745 in every coordinate make φ(q) = 0 in float64: a clear error, not NaN.
    model = LinearAttention(np.full((1, 1, 1), -1.0), np.ones((1, 1, 1)), np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    with pytest.raises(ValueError, match="feature_map must return positive features.*underflow"):
        model(np.array([[800.0], [1.0]]))


# -- prop-factorized-rank ------------------------------------------------------------------------


def factorized_models(H):
    return {
        "Dense": Dense.random(4, 3, seed=H),
        "SSD": SSD.random(4 * H, 3, N=3, heads=H, step_range=(0.1, 1.0), seed=H),
        "SoftmaxAttention": SoftmaxAttention.random(4 * H, 3, heads=H, seed=H),
        "SoftmaxAttention(non-causal)": SoftmaxAttention.random(4 * H, 3, heads=H, causal=False, seed=H),
        "LinearAttention": LinearAttention.random(4 * H, 3, heads=H, seed=H),
    }


@pytest.mark.parametrize("H", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_prop_factorized_rank_equals_dim_span_of_the_coefficient_vectors(H, n):
    # With independent value maps, rank = dim span{(α^1_ij(X), …, α^H_ij(X))}: lib's measured rank
    # against the coefficient vectors computed in numpy from the model's parameters.
    for name, model in factorized_models(H).items():
        X = np.random.default_rng(n + H).standard_normal((5, n, model.d))
        heads = 1 if name == "Dense" else H
        assert ref.value_rank(model) == heads, name
        rank = interaction_rank(model, X)
        assert rank == ref.coefficient_rank(model, X) <= heads, name


def test_prop_factorized_rank_is_at_most_dim_span_of_the_values_when_they_are_dependent():
    # V_1 = V_2 (W_O^2 W_V^2 = W_O^1 W_V^1): the blocks lie in a 1-dimensional space whatever α does.
    base = SoftmaxAttention.random(4, 3, heads=2, seed=0)
    W_V, W_O = base.W_V.copy(), base.W_O.copy()
    W_V[1], W_O[1] = W_V[0], W_O[0]
    model = SoftmaxAttention(base.W_Q, base.W_K, W_V, W_O)
    X = np.random.default_rng(0).standard_normal((5, 6, 4))
    assert ref.coefficient_rank(model, X) == 2 and ref.value_rank(model) == 1
    assert interaction_rank(model, X) == 1


def test_linear_attention_custom_feature_map_and_positivity_check():
    model = LinearAttention.random(3, 2, heads=2, feature_map=lambda u: torch.exp(u), seed=0)
    X = np.random.default_rng(0).standard_normal((5, 3))
    q = np.einsum("hkd,nd->hnk", model.W_Q, X)
    k = np.einsum("hkd,nd->hnk", model.W_K, X)
    kernel = np.tril(np.einsum("hik,hjk->hij", np.exp(q), np.exp(k)))
    np.testing.assert_allclose(model.weights(X), kernel / kernel.sum(-1, keepdims=True), rtol=1e-12)
    bad = LinearAttention.random(3, 2, feature_map=torch.zeros_like, seed=0)
    with pytest.raises(ValueError, match="feature_map must return positive features"):
        bad(X)
    with pytest.raises(TypeError, match="feature_map must be callable"):
        LinearAttention.random(3, 2, feature_map="elu")


def test_long_sequences_run():
    X = np.random.default_rng(0).standard_normal((2000, 4))
    for model in (LinearAttention.random(4, 4, heads=2), SoftmaxAttention.random(4, 4, heads=2)):
        assert np.all(np.isfinite(model(X)))


def test_softmax_forward_in_query_blocks_matches_numpy_weights_on_long_sequences():
    rng = np.random.default_rng(5)
    W_Q, W_K, W_V, W_O = (rng.standard_normal(s) / 2 for s in ((2, 3, 4), (2, 3, 4), (2, 2, 4), (2, 3, 2)))
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=rng.standard_normal((2, 1200)))
    X = rng.standard_normal((1100, 4))  # more than one block of 512 queries
    # The weights in numpy (vectorised: the reference's loops are too slow at n = 1100).
    n, bias = len(X), model.position_bias
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    scores = np.einsum("hkd,id,hke,je->hij", W_Q, X, W_K, X) / np.sqrt(3) + bias[:, np.clip(lag, 0, None)]
    scores = np.where(lag >= 0, scores, -np.inf)
    alpha = np.exp(scores - scores.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    Y = np.einsum("hij,hpv,hvd,jd->ip", alpha, W_O, W_V, X)
    np.testing.assert_allclose(model(X), Y, rtol=1e-10, atol=1e-13)


# -- prop-softmax-obstruction ---------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 3])
def test_prop_softmax_obstruction_rows_sum_to_the_value_maps_for_every_input(heads):
    rng = np.random.default_rng(heads)
    base = SoftmaxAttention.random(3, 2, heads=heads, seed=heads)
    layer = SoftmaxAttention(base.W_Q, base.W_K, base.W_V, base.W_O, causal=True,
                             position_bias=rng.standard_normal((heads, 9)))
    X = 3 * rng.standard_normal((5, 9, 3))
    row_sums = np.asarray(layer.operator(X)).sum(axis=2)
    values = np.einsum("hpv,hvd->pd", layer.W_O, layer.W_V)  # Σ_h W_O^h W_V^h, in numpy
    np.testing.assert_allclose(row_sums, np.broadcast_to(values, row_sums.shape), rtol=1e-12, atol=1e-12)


def test_prop_softmax_obstruction_an_ssm_with_memory_has_varying_row_sums():
    # The SSM's row sums Σ_{l<i} L_l change with i as soon as L_1 ≠ 0, so no causal softmax
    # layer (whose row sums are constant) has its operator.
    from lib import LinearSSM

    ssm = LinearSSM.random(3, 3, 2, spectral_radius=0.8, seed=2)
    sums = np.cumsum(ssm.lags(9), axis=0)
    assert np.abs(ssm.lags(2)[1]).max() > 0
    assert np.abs(sums[1:] - sums[:-1]).max() > 1e-3
