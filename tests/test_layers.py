"""Dense, FeedForward, CausalConv1d and KANLayer against independent formulas (lib.layers)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import CausalConv1d, Dense, FeedForward, KANLayer, interaction_rank

FAST = settings(max_examples=15, deadline=None)


def off_diagonal_blocks(W):
    n = W.shape[-4]
    return W[..., ~np.eye(n, dtype=bool), :, :]


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 4), p=st.integers(1, 4), seed=st.integers(0, 999))
def test_prop_dense_operator_is_constant_block_diagonal(n, d, p, seed):
    model = Dense.random(d, p, seed=seed)
    rng = np.random.default_rng(seed)
    X, X2 = rng.standard_normal((2, n, d))
    W = model.operator(X)
    for i in range(n):
        np.testing.assert_array_equal(W[i, i], model.W)
    assert np.all(off_diagonal_blocks(W) == 0)
    np.testing.assert_array_equal(model.operator(X2), W)  # input-independent
    np.testing.assert_allclose(model(X), np.array([model.W @ x for x in X]), rtol=1e-12, atol=1e-14)


def test_prop_ffn_operator_block_diagonal_and_depends_on_activation_pattern():
    rng = np.random.default_rng(0)
    model = FeedForward.random(3, 2, m=6, seed=1)
    W1, W2 = model.W1, model.W2
    X = rng.standard_normal((5, 3))
    W = model.operator(X)
    for i in range(5):
        D = np.diag((W1 @ X[i] > 0).astype(float))
        np.testing.assert_allclose(W[i, i], W2 @ D @ W1, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(model(X)[i], W2 @ np.maximum(W1 @ X[i], 0), rtol=1e-12, atol=1e-14)
    assert np.all(off_diagonal_blocks(W) == 0)
    # Same activation pattern (positive rescaling keeps every sign) -> same operator;
    # a different pattern (x -> -x flips the signs) -> a different operator.
    np.testing.assert_allclose(model.operator(2.5 * X), W, rtol=1e-12, atol=1e-14)
    assert np.array_equal(model.activation_pattern(-X), ~model.activation_pattern(X))
    assert not np.allclose(model.operator(-X)[0, 0], W[0, 0])


@FAST
@given(n=st.integers(1, 8), r=st.integers(1, 5), d=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 999))
def test_prop_conv_operator_is_toeplitz_with_support_below_r(n, r, d, p, seed):
    model = CausalConv1d.random(d, p, r=r, seed=seed)
    K = model.kernel
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W = model.operator(X)
    for i in range(n):
        for j in range(n):
            expected = K[i - j] if 0 <= i - j < r else np.zeros((p, d))
            np.testing.assert_array_equal(W[i, j], expected)
    # Forward against an explicit loop y_i = Σ_ℓ K_ℓ x_{i−ℓ}.
    Y = np.zeros((n, p))
    for i in range(n):
        for ell in range(r):
            if i - ell >= 0:
                Y[i] += K[ell] @ X[i - ell]
    np.testing.assert_allclose(model(X), Y, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(model.operator(rng.standard_normal((n, d))), W)  # input-independent


def cardinal_cubic(x):
    """The cubic B-spline with knots 0, 1, 2, 3, 4 (closed form)."""
    x = np.asarray(x, dtype=float)
    return np.select(
        [(0 <= x) & (x < 1), (1 <= x) & (x < 2), (2 <= x) & (x < 3), (3 <= x) & (x < 4)],
        [x**3 / 6, (-3 * x**3 + 12 * x**2 - 12 * x + 4) / 6, (3 * x**3 - 24 * x**2 + 60 * x - 44) / 6, (4 - x) ** 3 / 6],
        0.0,
    )


def kan_edge(model, u):
    """φ_{q,r}(u) from the closed-form splines: shape (len(u), p, d)."""
    lo, hi = model.grid_range
    h = (hi - lo) / model.grid_size
    M = model.grid_size + 3
    basis = lambda v: np.stack([cardinal_cubic((v - (lo + (m - 3) * h)) / h) for m in range(M)], -1)
    silu = u / (1 + np.exp(-u))
    return (model.silu_weights * silu[:, None, None]
            + np.einsum("qrm,km->kqr", model.spline_coefficients, basis(u) - basis(np.zeros(1))))


def test_prop_kan_edge_functions_match_closed_form_splines_and_vanish_at_zero():
    model = KANLayer.random(3, 2, grid_size=5, grid_range=(-2, 1), seed=3)
    u = np.linspace(-4, 3, 301)
    np.testing.assert_allclose(model.edge_functions(u), kan_edge(model, u), rtol=1e-11, atol=1e-13)
    assert np.all(model.edge_functions(np.zeros(1)) == 0)  # φ(0) = 0: homogeneous


@FAST
@given(n=st.integers(1, 6), d=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 999))
def test_prop_kan_operator_is_diagonal_in_positions_with_secant_slopes(n, d, p, seed):
    model = KANLayer.random(d, p, grid_size=4, grid_range=(-2, 2), seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d)) * 2
    W = model.operator(X)
    for i in range(n):
        expected = kan_edge(model, X[i])  # [r, q, r'] = φ_{q,r'}(x_i[r])
        np.testing.assert_allclose(W[i, i], np.einsum("rqr->qr", expected) / X[i], rtol=1e-9, atol=1e-12)
    assert np.all(off_diagonal_blocks(W) == 0)
    y = np.array([np.einsum("rqr->q", kan_edge(model, x)) for x in X])
    np.testing.assert_allclose(model(X), y, rtol=1e-10, atol=1e-12)


def test_prop_kan_secant_at_zero_is_the_derivative():
    model = KANLayer.random(2, 2, grid_size=5, seed=0)
    zero_block = model.operator(np.zeros((1, 2)))[0, 0]
    u = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    derivative = np.zeros((2, 2))
    for q in range(2):
        for r in range(2):
            (g,) = torch.autograd.grad(model.edge_functions(u)[0, q, r], u)
            derivative[q, r] = g.item()
    np.testing.assert_allclose(zero_block, derivative, rtol=1e-10, atol=1e-12)
    tiny = model.operator(np.full((1, 2), 1e-9))[0, 0]
    np.testing.assert_allclose(tiny, derivative, rtol=1e-6, atol=1e-9)


def test_prop_kan_operator_is_input_dependent():
    model = KANLayer.random(2, 2, seed=0)
    rng = np.random.default_rng(0)
    assert not np.allclose(model.operator(rng.standard_normal((1, 2)))[0, 0],
                           model.operator(rng.standard_normal((1, 2)))[0, 0])


@pytest.mark.parametrize("model", [Dense.random(2, 2), CausalConv1d.random(2, 2, r=4)], ids=["dense", "conv"])
def test_position_wise_and_conv_interaction_ranks(model):
    X = np.random.default_rng(0).standard_normal((3, 8, 2))
    # Dense: one operator W; conv: span of its r taps (generic, r = 4 = pd).
    assert interaction_rank(model, X) == (1 if isinstance(model, Dense) else 4)
