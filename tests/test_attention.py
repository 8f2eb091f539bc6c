"""Softmax and linear attention against independent numpy formulas (lib.attention)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import LinearAttention, SoftmaxAttention, interaction_rank, interaction_span

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


def test_prop_softmax_attention_interaction_rank_at_most_heads():
    X = np.random.default_rng(0).standard_normal((4, 8, 3))
    for H in (1, 2, 3, 5):
        model = SoftmaxAttention.random(3, 3, heads=H, seed=H)
        rank = interaction_rank(model, X)
        assert rank <= H
        assert rank == min(H, 9)  # generic values: the bound is attained
    # One head: every block is a multiple of the single V.
    model = SoftmaxAttention.random(3, 2, heads=1, seed=0)
    span = interaction_span(model, X)
    V = model.values()[0]
    np.testing.assert_allclose(abs(np.sum(span.basis[0] * V)), np.linalg.norm(V), rtol=1e-12)


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 4), p=st.integers(1, 3), H=st.integers(1, 3), causal=st.booleans(),
       seed=st.integers(0, 999))
def test_prop_linear_attention_operator_is_sum_of_alpha_times_values(n, d, p, H, causal, seed):
    model = LinearAttention.random(d, p, heads=H, causal=causal, seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d)) * 2
    alpha = numpy_linear_weights(model, X)
    check_factorized(model, X, alpha)
    assert np.all(alpha >= 0) and np.allclose(alpha.sum(-1), 1)


def test_prop_linear_attention_interaction_rank_at_most_heads():
    X = np.random.default_rng(0).standard_normal((4, 8, 3))
    for H in (1, 2, 4):
        assert interaction_rank(LinearAttention.random(3, 3, heads=H, seed=H), X) == H


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


def test_softmax_forward_in_query_blocks_matches_weights_on_long_sequences():
    rng = np.random.default_rng(5)
    W_Q, W_K, W_V, W_O = (rng.standard_normal(s) / 2 for s in ((2, 3, 4), (2, 3, 4), (2, 2, 4), (2, 3, 2)))
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=rng.standard_normal((2, 1200)))
    X = rng.standard_normal((1100, 4))  # more than one block of 512 queries
    Y = np.einsum("hij,hpd,jd->ip", model.weights(X), model.values(), X)
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
    np.testing.assert_allclose(row_sums, np.broadcast_to(layer.values().sum(axis=0), row_sums.shape),
                               rtol=1e-12, atol=1e-12)


def test_prop_softmax_obstruction_an_ssm_with_memory_has_varying_row_sums():
    # The SSM's row sums Σ_{l<i} L_l change with i as soon as L_1 ≠ 0, so no causal softmax
    # layer (whose row sums are constant) has its operator.
    from lib import LinearSSM

    ssm = LinearSSM.random(3, 3, 2, spectral_radius=0.8, seed=2)
    sums = np.cumsum(ssm.lags(9), axis=0)
    assert np.abs(ssm.lags(2)[1]).max() > 0
    assert np.abs(sums[1:] - sums[:-1]).max() > 1e-3
