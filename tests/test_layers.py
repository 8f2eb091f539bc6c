"""Dense, FeedForward, CausalConv1d and KANLayer against independent formulas (lib.layers)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_operators as ref
from lib import CausalConv1d, Dense, FeedForward, KANLayer, apply_operator, interaction_rank

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


def kan_edge(model, u):
    """φ_{q,r}(u) from the closed-form cardinal splines of the reference: shape (len(u), p, d)."""
    return ref.kan_edge(model.silu_weights, model.spline_coefficients, model.grid_range, u)


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


# -- against the plain-numpy references, on adversarial inputs, and the exact ranks --------------


def assert_matches_reference(model, n=7, seed=0):
    """lib's operator and forward pass against the page's formulas on every input family."""
    families = ref.input_families(n, model.d, np.random.default_rng(seed))
    ratio, errors = ref.worst_ratio(model, families)
    assert ratio <= 1, errors


@pytest.mark.parametrize("d,p", [(1, 1), (3, 2), (2, 4)])
def test_prop_dense_matches_the_reference_on_adversarial_inputs(d, p):
    assert_matches_reference(Dense.random(d, p, seed=d + p))


def test_prop_dense_interaction_rank_is_exactly_one_and_zero_for_W_zero():
    X = np.random.default_rng(0).standard_normal((3, 8, 2))
    assert interaction_rank(Dense.random(2, 3, seed=0), X) == 1
    assert interaction_rank(Dense.random(2, 3, seed=0), X[:1, :1]) == 1  # one token suffices
    assert interaction_rank(Dense(np.zeros((3, 2))), X) == 0


@pytest.mark.parametrize("d,p,m", [(1, 1, 1), (3, 2, 6), (2, 4, 16)])
def test_prop_ffn_matches_the_reference_on_adversarial_inputs(d, p, m):
    assert_matches_reference(FeedForward.random(d, p, m=m, seed=m))


@pytest.mark.parametrize("d,p,m", [(3, 3, 6), (2, 2, 16), (4, 2, 3)])
def test_prop_ffn_interaction_rank_is_the_rank_of_realised_patterns_times_rank_one_maps(d, p, m):
    model = FeedForward.random(d, p, m=m, seed=d * m)
    X = np.random.default_rng(m).standard_normal((8, 25, d))
    rank = interaction_rank(model, X)
    assert rank == ref.ffn_rank(model.W1, model.W2, X.reshape(-1, d)) <= min(m, p * d)


def test_prop_ffn_interaction_rank_counts_only_the_patterns_the_inputs_realise():
    # By hand: positive multiples of one token share one pattern (rank 1); adding −x gives the
    # complementary pattern (rank 2); the zero token adds the zero block (no new dimension).
    model = FeedForward.random(3, 3, m=6, seed=1)
    x = np.random.default_rng(2).standard_normal(3)
    one = np.array([[t * x for t in (0.5, 1.0, 3.0)]])
    assert interaction_rank(model, one) == 1
    both = np.array([[x, -x, 2 * x, np.zeros(3)]])
    assert interaction_rank(model, both) == 2
    assert ref.ffn_rank(model.W1, model.W2, both[0]) == 2


@pytest.mark.parametrize("r,d,p", [(1, 1, 1), (3, 2, 2), (5, 3, 1)])
def test_prop_conv_matches_the_reference_on_adversarial_inputs_including_n_below_r(r, d, p):
    assert_matches_reference(CausalConv1d.random(d, p, r=r, seed=r), n=7)  # families with n = 1, 2 < r


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_prop_conv_interaction_rank_is_dim_span_of_the_taps_that_occur(n):
    rng = np.random.default_rng(n)
    K = rng.standard_normal((5, 2, 2))  # r = 5 > pd = 4
    planted = K.copy()
    planted[3] = planted[0] + 2 * planted[1]  # a dependent tap: rank 3 once n >= 4 (r = 4 used)
    X = rng.standard_normal((2, n, 2))
    generic = CausalConv1d(K)
    assert interaction_rank(generic, X) == ref.numerical_rank(K[:min(5, n)]) == min(5, n, 4)
    dependent = CausalConv1d(planted[:4])
    assert interaction_rank(dependent, X) == ref.numerical_rank(planted[:min(4, n)]) == min(n, 3)


@pytest.mark.parametrize("d,p,grid", [(1, 1, 1), (3, 2, 5), (2, 3, 4)])
def test_prop_kan_matches_the_reference_on_adversarial_inputs(d, p, grid):
    model = KANLayer.random(d, p, grid_size=grid, grid_range=(-2, 1), seed=grid)
    assert_matches_reference(model)


@pytest.mark.parametrize("grid", [5, 4])  # with 4 intervals on (−1, 1), 0 is a knot
def test_prop_kan_forward_and_operator_keep_relative_accuracy_near_zero(grid):
    # Tokens of 1e-12..1e-6: (B_g(u) − B_g(0)) computed as a difference loses its digits, so lib uses the
    # Taylor series there. Independent route: the exact cubic piece of each cardinal B-spline expanded at 0
    # with numpy's Polynomial (no difference of nearly equal numbers), and silu(u) = u·sigmoid(u). At a knot
    # the piece is the one on the token's side (the third derivative jumps there).
    from numpy.polynomial import Polynomial as P

    pieces = [P([0, 0, 0, 1 / 6]), P([4 / 6, -2, 2, -3 / 6]), P([-44 / 6, 10, -4, 3 / 6]), P([64 / 6, -8, 2, -1 / 6])]
    model = KANLayer.random(3, 2, grid_size=grid, seed=0)  # d = 3, p = 2
    lo, hi = model.grid_range
    h = (hi - lo) / model.grid_size
    knots = lo + h * (np.arange(model.grid_size + 3) - 3)  # B_m starts at knot m
    u = np.array([1e-6 * 0.9, -3e-8, 2e-12])
    X = np.stack([u, -u[::-1], 0.5 * u], 1)  # (n = 3, d = 3)
    expected = np.zeros((3, 2))
    for i, x in enumerate(X):
        for q in range(2):
            for r in range(3):
                spline = 0.0
                for m, t in enumerate(knots):
                    x0 = -t / h
                    side = int(np.floor(x0)) if x[r] >= 0 else int(np.ceil(x0)) - 1
                    if 0 <= side < 4:
                        piece = pieces[side]
                        spline += model.spline_coefficients[q, r, m] * sum(
                            piece.deriv(k)(x0) * (x[r] / h) ** k / math.factorial(k) for k in (1, 2, 3))
                sig = 1 / (1 + np.exp(-x[r]))
                expected[i, q] += model.silu_weights[q, r] * x[r] * sig + spline
    Y = model(X)
    assert np.abs(Y - expected).max() <= 1e-14 * np.abs(expected).max()
    np.testing.assert_allclose(apply_operator(model.operator(X), X), expected, rtol=1e-9, atol=0)
