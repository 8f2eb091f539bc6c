"""Dense, FeedForward, CausalConv1d and KANLayer against the page's formulas in numpy (lib.layers)."""

import math

import numpy as np
import pytest
import torch
from numpy.polynomial import Polynomial

import reference as ref
from lib import CausalConv1d, Dense, FeedForward, KANLayer, apply_operator, interaction_rank


def t(a):
    return torch.from_numpy(np.asarray(a, dtype=float))


def params(model, *names):
    return [getattr(model, name).numpy(force=True) for name in names]


def call(model, X):
    """model(X) and model.operator(X) on a numpy X, as numpy."""
    with torch.no_grad():
        return model(t(X)).numpy(), model.operator(t(X)).numpy()


def off_diagonal_blocks(W):
    return W[..., ~np.eye(W.shape[-4], dtype=bool), :, :]


def assert_matches_reference(model, forward, operator, n=7, seed=0):
    """lib's forward pass and operator against the page's formulas, sequence by sequence, on every
    input family (random, zero tokens, constant, n = 1, n = 2 (< r), large entries), each item relative."""
    for family, X in ref.input_families(n, model.d, np.random.default_rng(seed)).items():
        Y, W = call(model, X)
        for x, y, w in zip(X, Y, W):
            assert ref.itemwise_error(y, forward(x), 1) <= 1e-10, family
            assert ref.itemwise_error(w, operator(x), 2) <= 1e-10, family


# -- Dense ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("d,p", [(1, 1), (3, 2), (2, 4)])
def test_prop_dense_operator_is_delta_ij_W_on_adversarial_inputs(d, p):
    model = Dense.random(d, p, seed=d + p)
    (W,) = params(model, "W")
    assert_matches_reference(model, lambda x: ref.dense_forward(W, x), lambda x: ref.dense_operator(W, x))
    X = np.random.default_rng(0).standard_normal((2, 5, d))
    _, ops = call(model, X)
    assert np.all(off_diagonal_blocks(ops) == 0)
    np.testing.assert_array_equal(ops[0], ops[1])  # input-independent


def test_prop_dense_interaction_rank_is_exactly_one_and_zero_for_W_zero():
    X = np.random.default_rng(0).standard_normal((3, 8, 2))
    assert interaction_rank(Dense.random(2, 3, seed=0), X) == 1
    assert interaction_rank(Dense.random(2, 3, seed=0), X[:1, :1]) == 1  # one token suffices
    assert interaction_rank(Dense(np.zeros((3, 2))), X) == 0


# -- FeedForward ---------------------------------------------------------------------------------


@pytest.mark.parametrize("d,p,m", [(1, 1, 1), (3, 2, 6), (2, 4, 16)])
def test_prop_ffn_operator_is_W2_Pi_W1_on_adversarial_inputs(d, p, m):
    model = FeedForward.random(d, p, m=m, seed=m)
    W1, W2 = params(model, "W1", "W2")
    assert_matches_reference(model, lambda x: ref.ffn_forward(W1, W2, x), lambda x: ref.ffn_operator(W1, W2, x))


def test_prop_ffn_operator_depends_on_the_activation_pattern_only():
    model = FeedForward.random(3, 2, m=6, seed=1)
    X = np.random.default_rng(0).standard_normal((5, 3))
    _, W = call(model, X)
    # Positive rescaling keeps every sign: the same operator; x -> −x flips them: another one.
    np.testing.assert_allclose(call(model, 2.5 * X)[1], W, rtol=1e-12, atol=1e-14)
    assert not np.allclose(call(model, -X)[1][0, 0], W[0, 0])


@pytest.mark.parametrize("d,p,m", [(3, 3, 6), (2, 2, 16), (4, 2, 3)])
def test_prop_ffn_interaction_rank_is_the_rank_of_realised_patterns_times_rank_one_maps(d, p, m):
    model = FeedForward.random(d, p, m=m, seed=d * m)
    X = np.random.default_rng(m).standard_normal((8, 25, d))
    assert interaction_rank(model, X) == ref.ffn_rank(*params(model, "W1", "W2"), X.reshape(-1, d)) <= min(m, p * d)


def test_prop_ffn_interaction_rank_counts_only_the_patterns_the_inputs_realise():
    # By hand: positive multiples of one token share one pattern (rank 1); adding −x gives the
    # complementary pattern (rank 2); the zero token adds the zero block (no new dimension).
    model = FeedForward.random(3, 3, m=6, seed=1)
    x = np.random.default_rng(2).standard_normal(3)
    assert interaction_rank(model, np.array([[s * x for s in (0.5, 1.0, 3.0)]])) == 1
    both = np.array([[x, -x, 2 * x, np.zeros(3)]])
    assert interaction_rank(model, both) == 2 == ref.ffn_rank(*params(model, "W1", "W2"), both[0])


# -- CausalConv1d --------------------------------------------------------------------------------


@pytest.mark.parametrize("r,d,p", [(1, 1, 1), (3, 2, 2), (5, 3, 1)])
def test_prop_conv_operator_is_toeplitz_in_the_taps_including_n_below_r(r, d, p):
    model = CausalConv1d.random(d, p, r=r, seed=r)
    (K,) = params(model, "K")
    assert_matches_reference(model, lambda x: ref.conv_forward(K, x), lambda x: ref.conv_operator(K, len(x)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_prop_conv_interaction_rank_is_dim_span_of_the_taps_that_occur(n):
    rng = np.random.default_rng(n)
    K = rng.standard_normal((5, 2, 2))  # r = 5 > pd = 4
    planted = K.copy()
    planted[3] = planted[0] + 2 * planted[1]  # a dependent tap: rank 3 once n >= 4 (r = 4 used)
    X = rng.standard_normal((2, n, 2))
    assert interaction_rank(CausalConv1d(K), X) == ref.numerical_rank(K[:min(5, n)]) == min(5, n, 4)
    assert interaction_rank(CausalConv1d(planted[:4]), X) == ref.numerical_rank(planted[:min(4, n)]) == min(n, 3)


# -- KANLayer ------------------------------------------------------------------------------------


def kan(model):
    w, c = params(model, "silu_weights", "spline_coefficients")
    return w, c, model.grid_range


def test_prop_kan_edge_functions_match_closed_form_splines_and_vanish_at_zero():
    # A token u·e_r excites channel r alone (φ(0) = 0 elsewhere): y[q] = φ_qr(u), inside and outside the grid.
    model = KANLayer.random(3, 2, grid_size=5, grid_range=(-2, 1), seed=3)
    u = np.linspace(-4, 3, 301)
    expected = ref.kan_edge(*kan(model), u)  # [k, q, r] = φ_qr(u_k)
    for r in range(3):
        X = np.zeros((len(u), 3))
        X[:, r] = u
        np.testing.assert_allclose(call(model, X)[0], expected[:, :, r], rtol=1e-11, atol=1e-13)
    assert np.all(call(model, np.zeros((1, 3)))[0] == 0)  # φ(0) = 0: homogeneous


@pytest.mark.parametrize("d,p,grid", [(1, 1, 1), (3, 2, 5), (2, 3, 4)])
def test_prop_kan_operator_is_diagonal_in_positions_with_secant_slopes_on_adversarial_inputs(d, p, grid):
    model = KANLayer.random(d, p, grid_size=grid, grid_range=(-2, 1), seed=grid)
    w, c, grid_range = kan(model)
    assert_matches_reference(model, lambda x: ref.kan_forward(w, c, grid_range, x),
                             lambda x: ref.kan_operator(w, c, grid_range, x))


def test_prop_kan_secant_at_zero_is_the_derivative():
    model = KANLayer.random(2, 2, grid_size=5, seed=0)
    zero = torch.zeros(1, 2, dtype=torch.float64)
    derivative = torch.autograd.functional.jacobian(model, zero)[0, :, 0, :]  # ∂y_0/∂x_0 at 0
    np.testing.assert_allclose(call(model, zero)[1][0, 0], derivative, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(call(model, zero)[1][0, 0], ref.kan_slope_at_zero(*kan(model)), rtol=1e-10)
    np.testing.assert_allclose(call(model, np.full((1, 2), 1e-9))[1][0, 0], derivative, rtol=1e-6, atol=1e-9)


def test_prop_kan_operator_is_input_dependent():
    model = KANLayer.random(2, 2, seed=0)
    rng = np.random.default_rng(0)
    assert not np.allclose(call(model, rng.standard_normal((1, 2)))[1], call(model, rng.standard_normal((1, 2)))[1])


@pytest.mark.parametrize("grid", [5, 4])  # with 4 intervals on (−1, 1), 0 is a knot
def test_prop_kan_forward_and_operator_keep_relative_accuracy_near_zero(grid):
    # Tokens of 1e-12..1e-6: (B_g(u) − B_g(0)) computed as a difference loses its digits, so lib uses the
    # Taylor series there. Independent route: the exact cubic piece of each cardinal B-spline expanded at 0
    # with numpy's Polynomial (no difference of nearly equal numbers), and silu(u) = u·sigmoid(u). At a knot
    # the piece is the one on the token's side (the third derivative jumps there).
    P = Polynomial
    pieces = [P([0, 0, 0, 1 / 6]), P([4 / 6, -2, 2, -3 / 6]), P([-44 / 6, 10, -4, 3 / 6]), P([64 / 6, -8, 2, -1 / 6])]
    model = KANLayer.random(3, 2, grid_size=grid, seed=0)  # d = 3, p = 2
    w, c, (lo, hi) = kan(model)
    h = (hi - lo) / grid
    knots = lo + h * (np.arange(grid + 3) - 3)  # B_m starts at knot m
    u = np.array([1e-6 * 0.9, -3e-8, 2e-12])
    X = np.stack([u, -u[::-1], 0.5 * u], 1)  # (n = 3, d = 3)
    expected = np.zeros((3, 2))
    for i, x in enumerate(X):
        for q in range(2):
            for r in range(3):
                spline = 0.0
                for m, knot in enumerate(knots):
                    x0 = -knot / h
                    side = int(np.floor(x0)) if x[r] >= 0 else int(np.ceil(x0)) - 1
                    if 0 <= side < 4:
                        spline += c[q, r, m] * sum(pieces[side].deriv(k)(x0) * (x[r] / h) ** k / math.factorial(k)
                                                   for k in (1, 2, 3))
                expected[i, q] += w[q, r] * x[r] / (1 + np.exp(-x[r])) + spline
    Y, W = call(model, X)
    assert np.abs(Y - expected).max() <= 1e-14 * np.abs(expected).max()
    np.testing.assert_allclose(apply_operator(W, X), expected, rtol=1e-9, atol=0)


@pytest.mark.parametrize("call_,error,match", [
    (lambda: KANLayer(np.zeros((2, 3)), np.zeros((2, 3, 3))), ValueError,
     r"spline_coefficients must have shape \(p, d, G \+ 3\) with G >= 1"),
    (lambda: KANLayer(np.zeros((2, 3)), np.zeros((2, 3, 6)), grid_range=(1, -1)), ValueError,
     r"grid_range\[1\] must be finite and in \(1, inf\)"),
    (lambda: KANLayer(np.zeros((2, 3)), np.zeros((2, 3, 6)), grid_range=(1, 1)), ValueError, r"grid_range\[1\]"),
    (lambda: KANLayer.random(2, 2, grid_range=(np.nan, 1)), ValueError, r"grid_range\[0\] must be finite"),
    (lambda: KANLayer.random(2, 2, grid_range=(0, "1")), TypeError, r"grid_range\[1\] must be a real number"),
    (lambda: KANLayer.random(2, 2, grid_range="ab"), TypeError, r"grid_range must be a pair"),
    (lambda: KANLayer.random(2, 2, grid_range=(0, 1, 2)), TypeError, r"grid_range must be a pair"),
])
def test_layer_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()
