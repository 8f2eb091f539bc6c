"""Operator spans and interaction rank (lib.spans)."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import (Dense, LinearSSM, OperatorSpan, SoftmaxAttention, interaction_rank, interaction_span, operator_span,
                 pointwise_multiple, sine_to_line)
from lib.spans import pointwise_witness, span_distances


def random_rank_r(rng, m, p, d, r):
    """m operators drawn from a random r-dimensional subspace of ℝ^{p×d}."""
    basis = rng.standard_normal((r, p, d))
    return np.einsum("mr,rpd->mpd", rng.standard_normal((m, r)), basis)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 4), d=st.integers(1, 4), data=st.data(), seed=st.integers(0, 9999))
def test_def_operator_span_dim_of_random_rank_r_sets(p, d, data, seed):
    r = data.draw(st.integers(0, p * d))
    m = data.draw(st.integers(max(r, 1), 3 * p * d))
    ops = random_rank_r(np.random.default_rng(seed), m, p, d, r)
    span = operator_span(ops)
    assert span.dim == r
    assert span.singular_values.shape == (min(m, p * d),)
    assert span.basis.shape == (r, p, d)
    np.testing.assert_allclose(span.singular_values, np.linalg.svd(ops.reshape(m, -1), compute_uv=False),
                               rtol=1e-12, atol=1e-12)
    # Orthonormal in the Frobenius inner product, and spanning every operator.
    gram = np.einsum("apd,bpd->ab", span.basis, span.basis)
    np.testing.assert_allclose(gram, np.eye(r), atol=1e-12)
    np.testing.assert_allclose(span.project(ops), ops, atol=1e-10 * max(1, np.abs(ops).max()))


def test_zero_duplicated_and_scaled_operators():
    rng = np.random.default_rng(0)
    assert operator_span(np.zeros((5, 2, 3))).dim == 0
    assert operator_span(np.zeros((5, 2, 3))).basis.shape == (0, 2, 3)
    V = rng.standard_normal((2, 3))
    assert operator_span(np.stack([V, V, -2 * V, 1e-3 * V])).dim == 1
    W = rng.standard_normal((2, 3))
    assert operator_span(np.stack([V, W, V + W, 3 * V - W])).dim == 2
    assert operator_span(torch.tensor(np.stack([V, W]))).dim == 2  # torch accepted
    assert operator_span(np.stack([V, W]).astype(np.float32)).dim == 2


def test_span_helpers_of_the_zero_span():
    # dim = 0: no coordinates, projections 0, residuals the operators' own norms.
    span, ops = operator_span(np.zeros((2, 2, 3))), np.arange(12.0).reshape(2, 2, 3)
    assert span.coefficients(ops).shape == (2, 0)
    np.testing.assert_array_equal(span.project(ops), np.zeros_like(ops))
    np.testing.assert_allclose(span.residual(ops), np.linalg.norm(ops.reshape(2, -1), axis=1), rtol=1e-15)


def test_tolerance_behaviour():
    rng = np.random.default_rng(1)
    V, E = rng.standard_normal((2, 3, 3))
    V /= np.linalg.norm(V)
    E -= np.sum(E * V) * V  # orthogonal to V
    E *= 1e-12 / np.linalg.norm(E)
    ops = np.stack([V, V + E, 2 * V])
    assert operator_span(ops, rtol=1e-10).dim == 1
    assert operator_span(ops, rtol=1e-14).dim == 2
    assert operator_span(ops).singular_values[1] == pytest.approx(np.linalg.svd(ops.reshape(3, -1), compute_uv=False)[1],
                                                                  rel=1e-3)


def test_span_helpers():
    rng = np.random.default_rng(2)
    V = rng.standard_normal((2, 2, 2))
    span = operator_span(V)
    assert isinstance(span, OperatorSpan) and span.rtol == 1e-10
    outside = rng.standard_normal((3, 2, 2))
    residual = outside - span.project(outside)
    np.testing.assert_allclose(span.residual(outside), np.linalg.norm(residual.reshape(3, -1), axis=1), rtol=1e-12)
    # The residual is orthogonal to the span.
    np.testing.assert_allclose(np.einsum("mpd,rpd->mr", residual, span.basis), 0, atol=1e-12)
    np.testing.assert_allclose(span.coefficients(V) @ span.basis.reshape(2, -1), V.reshape(2, -1), atol=1e-12)
    with pytest.raises(AttributeError):
        span.dim = 5  # frozen


@pytest.mark.parametrize("rtol", [0, 1, -1e-3, 2.0, float("nan")])
def test_rtol_is_validated(rtol):
    with pytest.raises(ValueError, match="rtol must"):
        operator_span(np.ones((2, 2, 2)), rtol=rtol)


@pytest.mark.parametrize("ops,error,match", [
    (np.ones((2, 2)), ValueError, r"ops must have shape \(m, p, d\)"),
    (np.ones((0, 2, 2)), ValueError, r"ops must have shape \(m, p, d\) with m >= 1"),
    (np.full((2, 2, 2), np.nan), ValueError, "ops must be finite"),
    (np.ones((2, 2, 2), dtype=complex), TypeError, "ops must have a real floating dtype"),
    ("ops", TypeError, "ops must be a numpy array or torch tensor"),
])
def test_ops_are_validated(ops, error, match):
    with pytest.raises(error, match=match):
        operator_span(ops)


def test_interaction_rank_inputs_forms():
    rng = np.random.default_rng(3)
    model = SoftmaxAttention.random(3, 3, heads=2, seed=0)
    batch = rng.standard_normal((3, 6, 3))
    assert interaction_rank(model, batch) == 2
    assert interaction_rank(model, batch[0]) == 2
    assert interaction_rank(model, [batch[0], rng.standard_normal((9, 3))]) == 2  # lengths may differ
    assert interaction_rank(model, (x for x in batch)) == 2
    assert interaction_rank(model, torch.tensor(batch)) == 2
    span = interaction_span(LinearSSM.random(3, 2, 2, seed=0), batch[:, :, :2])
    assert span.dim == 3 and span.singular_values.shape == (4,)
    with pytest.raises(ValueError, match=r"inputs must have shape \(n, 3\) or \(b, n, 3\)"):
        interaction_rank(model, rng.standard_normal((6, 2)))
    with pytest.raises(ValueError, match=r"inputs\[1\] must have shape \(n, 3\)"):
        interaction_rank(model, [batch[0], batch[1, :, :2]])
    with pytest.raises(ValueError, match="inputs must contain at least one sequence"):
        interaction_rank(model, [])
    with pytest.raises(TypeError, match="inputs must be an array"):
        interaction_rank(model, 3)
    with pytest.raises(ValueError, match="rtol must"):
        interaction_rank(model, batch, rtol=0)


def test_interaction_rank_many_inputs_is_compressed_exactly():
    # 50 sequences of length 12: 3900 blocks, compressed to pd rows on the way.
    rng = np.random.default_rng(4)
    model = SoftmaxAttention.random(2, 2, heads=3, seed=1)
    X = rng.standard_normal((50, 12, 2))
    span = interaction_span(model, X)
    W = model.operator(X)
    blocks = W[:, *np.tril_indices(12)].reshape(-1, 4)
    np.testing.assert_allclose(span.singular_values, np.linalg.svd(blocks, compute_uv=False), rtol=1e-10,
                               atol=1e-14 * span.singular_values[0])
    assert span.dim == 3
    assert interaction_rank(Dense.random(2, 2), X) == 1


# -- lem-pointwise-multiple --------------------------------------------------------------------

@pytest.mark.parametrize("rank", [1, 2, 3])
def test_lem_pointwise_multiple_factor_is_one_constant_when_L_is_a_multiple(rank):
    rng = np.random.default_rng(rank)
    V = rng.standard_normal((3, rank)) @ rng.standard_normal((rank, 3))
    L = -1.7 * V
    probe = pointwise_multiple(L, V, rng.standard_normal((50, 3)))
    np.testing.assert_allclose(probe.factors, -1.7, rtol=1e-12)
    assert probe.largest_sine < 1e-12 and probe.factor_spread < 1e-12
    assert operator_span(np.stack([L, V])).dim == 1


def test_lem_pointwise_multiple_fails_pointwise_when_L_is_not_a_multiple():
    # Contrapositive: span{L, V} of dimension 2 => some u has Lu outside span{Vu}.
    # The sines are recomputed independently from the cross product (p = 3).
    rng = np.random.default_rng(9)
    V, L = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    assert operator_span(np.stack([L, V])).dim == 2
    us = rng.standard_normal((50, 3))
    sines = [np.linalg.norm(np.cross(L @ u, V @ u)) / (np.linalg.norm(L @ u) * np.linalg.norm(V @ u)) for u in us]
    assert max(sines) > 1e-2
    probe = pointwise_multiple(L, V, us)
    assert probe.largest_sine == pytest.approx(max(sines), rel=1e-10)
    assert probe.factor_spread > 1e-2


def _exact_sine(a, b):
    # Distance of a from span{b} relative to ‖a‖, from a least-squares solve (b = 0: the line is {0}).
    if not np.any(b):
        return 1.0 if np.any(a) else 0.0
    c = np.linalg.lstsq(b[:, None], a, rcond=None)[0]
    return float(np.linalg.norm(a - b * c) / np.linalg.norm(a))


def _pairs_not_multiples():
    # Pairs (L, V) with L ∉ span{V}, chosen to stress the lemma's case analysis.  V is exactly of the
    # stated rank in floating point (integer or structured entries).
    rng = np.random.default_rng(11)
    v = np.array([1.0, 2.0, 3.0])
    return {
        "hidden kernel: V = v e_1ᵀ, L = v (e_1 + e_2)ᵀ": (np.outer(v, [1.0, 1.0, 0.0]), np.outer(v, [1.0, 0.0, 0.0])),
        "rank 1, different range": (np.outer([1.0, 0.0, 1.0], [1.0, 0.0, 0.0]), np.outer(v, [1.0, 0.0, 0.0])),
        "rank 2, L = 3V off the kernel, differs on it": (3 * np.diag([1.0, 2.0, 0.0]) + np.outer([1.0, 0, 0], [0, 0, 1.0]),
                                                           np.diag([1.0, 2.0, 0.0])),
        "rank 3, two factors": (np.diag([1.0, 2.0, 3.5]), np.diag([1.0, 2.0, 3.0])),
        "V = 0": (rng.standard_normal((2, 3)), np.zeros((2, 3))),
        "random": (rng.standard_normal((3, 3)), rng.standard_normal((3, 3))),
        "near multiple": (2 * np.eye(3) + 1e-6 * rng.standard_normal((3, 3)), np.eye(3)),
        "2 x 2 rotation vs identity": (np.array([[0.0, -1.0], [1.0, 0.0]]), np.eye(2)),
        "p != d": (rng.standard_normal((2, 4)), np.outer([1.0, 2.0], [1.0, 0.0, -1.0, 0.0])),
    }


@pytest.mark.parametrize("case", list(_pairs_not_multiples()))
def test_lem_pointwise_multiple_contrapositive_witness_breaks_collinearity(case):
    # L ∉ span{V}: pointwise_witness returns u with L u off the line of V u; the sine is recomputed
    # here by least squares on the exact V.  In the hidden-kernel case random probes see sine 0
    # (L u ∥ V u for every u off the hyperplane u_1 = 0), so the witness is not found by sampling.
    L, V = _pairs_not_multiples()[case]
    assert operator_span(np.stack([L, V])).dim == 2 or not np.any(V)
    u = pointwise_witness(L, V)
    assert u is not None and np.linalg.norm(u) == pytest.approx(1.0)
    sine = _exact_sine(L @ u, V @ u)
    assert sine > (1e-7 if case == "near multiple" else 1e-2)
    if case.startswith("hidden kernel"):
        probes = np.random.default_rng(0).standard_normal((1000, 3))
        assert pointwise_multiple(L, V, probes).largest_sine < 1e-12


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_lem_pointwise_multiple_no_witness_for_multiples(rank):
    rng = np.random.default_rng(rank)
    V = rng.standard_normal((3, rank)) @ rng.standard_normal((rank, 4))
    for c in (-1.7, 0.0, 2.5):
        assert pointwise_witness(c * V, V) is None
    assert pointwise_witness(np.zeros((3, 4)), np.zeros((3, 4))) is None


def test_pointwise_witness_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=re.escape("V must have shape (p, d) = (2, 2)")):
        pointwise_witness(np.eye(2), np.eye(3))
    with pytest.raises(ValueError, match="rtol must"):
        pointwise_witness(np.eye(2), np.eye(2), rtol=0)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 3))
def test_sine_to_line_matches_the_cross_product(seed, p):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(p), rng.standard_normal(p)
    a3, b3 = np.pad(a, (0, 3 - p)), np.pad(b, (0, 3 - p))
    expected = np.linalg.norm(np.cross(a3, b3)) / (np.linalg.norm(a) * np.linalg.norm(b))
    assert sine_to_line(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert sine_to_line(torch.tensor(a), torch.tensor(-3.0 * a)) < 1e-15


def test_sine_to_line_edge_cases():
    assert sine_to_line([0.0, 0.0], [1.0, 2.0]) == 0.0   # the zero vector is on every line
    assert sine_to_line([1.0, 0.0], [0.0, 0.0]) == 1.0   # the line through 0 is {0}
    assert sine_to_line([1.0, 0.0], [0.0, 5.0]) == 1.0


def test_pointwise_multiple_leaves_undefined_factors_out():
    V = np.array([[1.0, 0.0], [0.0, 0.0]])   # V u = 0 for u = (0, 1)
    probe = pointwise_multiple(2 * V, V, [[1.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    assert np.isnan(probe.factors[1]) and probe.factors[[0, 2]] == pytest.approx([2.0, 2.0])
    assert probe.largest_sine == 0.0 and probe.factor_spread == 0.0
    # L u ≠ 0 where V u = 0: the hypothesis of the lemma fails there, and the sine says so.
    assert pointwise_multiple(np.eye(2), V, [[0.0, 1.0]]).largest_sine == 1.0


@pytest.mark.parametrize("args, message", [
    (([1.0, 2.0], [1.0, 2.0, 3.0]), "b must have shape (p,) = (2,)"),
    (([[1.0]], [1.0]), "a must have shape (p,)"),
    (([np.nan, 1.0], [1.0, 1.0]), "a must be finite"),
])
def test_sine_to_line_bad_input_names_the_argument(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sine_to_line(*args)


@pytest.mark.parametrize("L, V, inputs, message", [
    (np.eye(2), np.eye(3), np.ones((4, 2)), "V must have shape (p, d) = (2, 2)"),
    (np.eye(2), np.eye(2), np.ones((4, 3)), "inputs must have shape (m, d) = (4, 2)"),
    (np.eye(2), np.eye(2), np.ones(2), "inputs must have shape (m, d)"),
    (np.full((2, 2), np.inf), np.eye(2), np.ones((4, 2)), "L must be finite"),
])
def test_pointwise_multiple_bad_input_names_the_argument(L, V, inputs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        pointwise_multiple(L, V, inputs)


# -- span_distances (prop-single-head-generic-inputs, part 1) ------------------------------


def least_squares_distances(Y, X, V):
    """dist(y_i, V span{x_1..x_i})² by numpy's least squares, one position at a time."""
    out = np.empty(Y.shape[:2])
    for b in range(Y.shape[0]):
        for i in range(Y.shape[1]):
            M = V @ X[b, : i + 1].T
            alpha = np.linalg.lstsq(M, Y[b, i], rcond=None)[0]
            out[b, i] = ((Y[b, i] - M @ alpha) ** 2).sum()
    return out


@pytest.mark.parametrize("p, d", [(2, 2), (3, 2), (2, 3), (4, 4)])
def test_prop_single_head_generic_inputs_span_distances_match_least_squares(p, d):
    rng = np.random.default_rng(p + 10 * d)
    X, Y, V = rng.standard_normal((6, 7, d)), rng.standard_normal((6, 7, p)), rng.standard_normal((p, d))
    distances = span_distances(Y, X, V)
    expected = least_squares_distances(Y, X, V)
    assert np.allclose(distances, expected, rtol=1e-10, atol=1e-12 * (Y ** 2).sum(-1).max())
    assert np.allclose(span_distances(Y[0], X[0], V), distances[0], rtol=0, atol=0)


def test_prop_single_head_generic_inputs_span_distances_vanish_once_the_tokens_span():
    # V = I, Gaussian tokens: x_1..x_d span ℝ^d, so every position i >= d is exact.
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((50, 8, 3)), rng.standard_normal((50, 8, 3))
    distances = span_distances(Y, X)
    assert distances[:, 2:].max() <= 1e-24 * (Y ** 2).sum(-1).max()
    assert distances[:, :2].min() > 1e-6


def test_prop_single_head_generic_inputs_span_distances_with_dependent_tokens():
    # x_2 = 2 x_1, x_3 = 0, x_4 = x_1 + 1e-14 e_2: none of them adds a direction, so every
    # distance is that from the line through x_1 (an unpivoted QR would invent directions).
    x1, e2 = np.array([1.0, 2.0, -1.0]), np.array([0.0, 1.0, 0.0])
    X = np.stack([x1, 2 * x1, np.zeros(3), x1 + 1e-14 * e2])
    Y = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [3.0, 1.0, 2.0], [0.0, 0.0, 1.0]])
    line = x1 / np.linalg.norm(x1)
    expected = ((Y - np.outer(Y @ line, line)) ** 2).sum(1)
    assert np.allclose(span_distances(Y, X), expected, rtol=1e-9, atol=0)
    # Planted: a target in the span has distance 0, one orthogonal to it its squared norm.
    planted = np.stack([3 * x1, np.array([2.0, -1.0, 0.0]), x1, x1])
    assert np.allclose(span_distances(planted, X), [0.0, 5.0, 0.0, 0.0], atol=1e-24)


@pytest.mark.parametrize("args, error, message", [
    ((np.ones((4, 2)), np.ones((4, 3))), ValueError, "V must be given when p != d"),
    ((np.ones((4, 2)), np.ones((5, 2))), ValueError, "Y must have shape (n, p) = (5, 2)"),
    ((np.ones((2, 4, 2)), np.ones((3, 4, 2))), ValueError, "Y must have shape (b, n, p) = (3, 4, 2)"),
    ((np.ones((4, 2)), np.ones(4)), ValueError, "X must have shape (n, d)"),
    ((np.ones((4, 2)), np.ones((4, 2)), np.ones((2, 3))), ValueError, "V must have shape (p, d) = (2, 2)"),
    ((np.ones((4, 2)), [["a"]]), TypeError, "X"),
])
def test_span_distances_bad_input_names_the_argument(args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        span_distances(*args)
    with pytest.raises(ValueError, match="rtol"):
        span_distances(np.ones((4, 2)), np.ones((4, 2)), rtol=0.0)
