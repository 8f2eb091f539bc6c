"""Operator spans and interaction rank (lib.spans), against numpy's SVD of the stacked blocks."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from lib import (Dense, LinearSSM, SequenceMap, SoftmaxAttention, channel_span, interaction_rank,
                 interaction_span, min_heads, operator_span)
from lib.spans import rank



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
    dim, sigma, basis = operator_span(ops)
    assert dim == r
    assert basis.shape == (r, p, d)
    np.testing.assert_allclose(sigma, np.linalg.svd(ops.reshape(m, -1), compute_uv=False), rtol=1e-12,
                               atol=1e-12)
    # Orthonormal in the Frobenius inner product, and spanning every operator (least squares on it).
    flat = basis.reshape(r, p * d)
    np.testing.assert_allclose(flat @ flat.T, np.eye(r), atol=1e-12)
    rows = ops.reshape(m, -1)
    coefficients = np.linalg.lstsq(flat.T, rows.T, rcond=None)[0] if r else np.zeros((0, m))
    np.testing.assert_allclose(coefficients.T @ flat, rows, atol=1e-10 * max(1, np.abs(ops).max()))


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
    with pytest.raises(AttributeError):
        operator_span(np.stack([V, W])).dim = 5  # a NamedTuple: read-only


def test_tolerance_behaviour():
    rng = np.random.default_rng(1)
    V, E = rng.standard_normal((2, 3, 3))
    V /= np.linalg.norm(V)
    E -= np.sum(E * V) * V  # orthogonal to V
    E *= 1e-12 / np.linalg.norm(E)
    ops = np.stack([V, V + E, 2 * V])
    assert operator_span(ops, rtol=1e-10).dim == 1
    assert operator_span(ops, rtol=1e-14).dim == 2
    assert operator_span(ops).singular_values[1] == pytest.approx(
        np.linalg.svd(ops.reshape(3, -1), compute_uv=False)[1], rel=1e-3)


@pytest.mark.parametrize("rtol", [0, 1, -1e-3, 2.0, float("nan"), float("inf")])
def test_rtol_is_validated(rtol):
    ssm = LinearSSM.random(2, 2, 2)
    for call in (lambda: operator_span(np.ones((2, 2, 2)), rtol=rtol),
                 lambda: interaction_span(ssm, np.ones((3, 2)), rtol=rtol),
                 lambda: interaction_rank(ssm, np.ones((3, 2)), rtol=rtol),
                 lambda: min_heads(ssm, 3, rtol=rtol)):
        with pytest.raises(ValueError, match="rtol must be finite and in"):
            call()
    for bad in ("1e-10", None, True):
        with pytest.raises(TypeError, match="rtol must be a real number"):
            operator_span(np.ones((2, 2, 2)), rtol=bad)


@pytest.mark.parametrize("ops,error,match", [
    (np.ones((2, 2)), ValueError, r"ops must have shape \(m, p, d\)"),
    (np.ones((0, 2, 2)), ValueError, r"ops must have shape \(m, p, d\) with m, p, d >= 1"),
    (np.ones((2, 2, 0)), ValueError, r"ops must have shape \(m, p, d\) with m, p, d >= 1"),
    (np.full((2, 2, 2), np.nan), ValueError, "ops must be finite"),
    (np.ones((2, 2, 2), dtype=complex), TypeError, "ops must have a real floating dtype"),
    (np.ones((2, 2, 2), dtype=int), TypeError, "ops must have a real floating dtype"),
    (torch.ones(2, 2, 2, dtype=torch.int64), TypeError, "ops must have a real floating dtype"),
    ("ops", TypeError, "ops must be a torch tensor or numpy array"),
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
    assert interaction_rank(model, torch.tensor(batch, dtype=torch.float32)) == 2


def test_interaction_span_of_an_lti_ssm_is_the_span_of_its_lags():
    # The blocks 𝒲_ij = C A^{i−j} B (numpy's matrix powers), the same for every input: their
    # singular values, and dim = 3 (the lags of N = 3 states span at most 3 of the pd = 4 dimensions).
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    A, B, C = (t.numpy(force=True) for t in (ssm.A, ssm.B, ssm.C))
    X = np.random.default_rng(3).standard_normal((3, 6, 2))
    span = interaction_span(ssm, X)
    W = reference.lti_operator(A, B, C, 6)
    blocks = np.concatenate([W[np.tril_indices(6)].reshape(-1, 4)] * 3)
    np.testing.assert_allclose(span.singular_values, np.linalg.svd(blocks, compute_uv=False), rtol=1e-10,
                               atol=1e-13 * span.singular_values[0])
    assert span.dim == reference.numerical_rank(blocks) == 3 and span.singular_values.shape == (4,)


def test_interaction_rank_many_inputs_is_compressed_exactly():
    # 50 sequences of length 12: 3900 blocks, compressed to pd rows on the way.
    rng = np.random.default_rng(4)
    model = SoftmaxAttention.random(2, 2, heads=3, seed=1)
    X = rng.standard_normal((50, 12, 2))
    span = interaction_span(model, X)
    W_Q, W_K = model.W_Q.numpy(force=True), model.W_K.numpy(force=True)
    alpha = np.stack([reference.softmax_weights(W_Q, W_K, x, causal=True) for x in X])
    values = reference.attention_values(model.W_V.numpy(force=True), model.W_O.numpy(force=True))
    W = np.einsum("bhij,hpd->bijpd", alpha, values)
    blocks = W[:, *np.tril_indices(12)].reshape(-1, 4)
    np.testing.assert_allclose(span.singular_values, np.linalg.svd(blocks, compute_uv=False), rtol=1e-10,
                               atol=1e-14 * span.singular_values[0])
    assert span.dim == 3
    assert interaction_rank(Dense.random(2, 2), X) == 1


def test_interaction_span_of_a_non_causal_model_takes_every_block():
    # Non-causal attention: blocks above the diagonal count too (against the full n × n stack).
    rng = np.random.default_rng(5)
    model = SoftmaxAttention.random(3, 2, heads=2, causal=False, seed=2)
    X = rng.standard_normal((2, 5, 3))
    W = model.operator(torch.from_numpy(X)).numpy(force=True)
    every = W.reshape(-1, 6)
    lower = W[:, *np.tril_indices(5)].reshape(-1, 6)
    span = interaction_span(model, X)
    expected = np.linalg.svd(every, compute_uv=False)
    np.testing.assert_allclose(span.singular_values, expected, rtol=1e-10, atol=1e-14 * expected[0])
    assert not np.allclose(span.singular_values, np.linalg.svd(lower, compute_uv=False), rtol=1e-6)


@pytest.mark.parametrize("call,error,match", [
    (lambda m, x: interaction_rank(m, np.ones((6, 2))), ValueError, r"inputs must have shape \(n, 3\) or \(b, n, 3\)"),
    (lambda m, x: interaction_rank(m, np.ones((0, 3))), ValueError, r"inputs must have shape \(n, 3\)"),
    (lambda m, x: interaction_rank(m, [x, x[:, :2]]), ValueError, r"inputs\[1\] must have shape \(n, 3\)"),
    (lambda m, x: interaction_rank(m, [x, np.ones((4, 3), dtype=int)]), TypeError,
     r"inputs\[1\] must have a real floating dtype"),
    (lambda m, x: interaction_rank(m, np.full((4, 3), np.inf)), ValueError, "inputs must be finite"),
    (lambda m, x: interaction_rank(m, []), ValueError, "inputs must contain at least one sequence"),
    (lambda m, x: interaction_rank(m, 3), TypeError, "inputs must be an array"),
    (lambda m, x: interaction_rank(m, "X"), TypeError, "inputs must be an array"),
    (lambda m, x: interaction_span(np.eye(3), x), TypeError, "model must be a SequenceMap"),
    (lambda m, x: interaction_rank(lambda X: X, x), TypeError, "model must be a SequenceMap"),
])
def test_interaction_span_bad_input_names_the_argument(call, error, match):
    model = SoftmaxAttention.random(3, 3, heads=2, seed=0)
    with pytest.raises(error, match=match):
        call(model, np.random.default_rng(0).standard_normal((6, 3)))


class _Channels(SequenceMap):
    """A toy 𝒲_ij = U diag(g_ij) V with g_ij = tanh(P x_i) ⊙ (Q x_j) (j <= i): channel_span's test model."""

    def __init__(self, U, V, P, Q):
        super().__init__()
        self.set_parameters(torch.float64, U=(U, "p D"), V=(V, "D d"), P=(P, "D d"), Q=(Q, "D d"))
        self.p, self.D = self.U.shape
        self.d = self.V.shape[1]

    def factors(self):
        return self.U, self.V

    def coefficients(self, X):
        n = X.shape[1]
        g = torch.tanh(X @ self.P.T)[:, :, None] * (X @ self.Q.T)[:, None, :]
        return g * torch.tril(torch.ones(n, n, dtype=X.dtype))[None, :, :, None]

    def operator(self, X):
        return torch.einsum("pq,bijq,qd->bijpd", self.U, self.coefficients(X), self.V)

    def forward(self, X):
        return torch.einsum("bijpd,bjd->bip", self.operator(X), X)


def _toy(p, D, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in ((p, D), (D, d), (D, d), (D, d))]


@pytest.mark.parametrize("p, D, d", [(3, 4, 3), (4, 9, 3), (2, 5, 2), (5, 3, 4)])
def test_prop_channel_span_equals_the_dense_span(p, D, d):
    # Independent route: the dense operator's blocks and operator_span's SVD.
    model = _Channels(*_toy(p, D, d))
    X = np.random.default_rng(1).standard_normal((2, 6, d))
    dense, fast = interaction_span(model, X), channel_span(model, X)
    assert fast.dim == dense.dim
    top = min(len(dense.singular_values), len(fast.singular_values))
    assert np.allclose(fast.singular_values[:top], dense.singular_values[:top], rtol=1e-9, atol=1e-12)
    # D rank-one maps in p·d dimensions: independent iff D <= pd here (generic factors)
    assert (fast.gram_eigenvalues[0] > 1e-10 * fast.gram_eigenvalues[-1]) == (D <= p * d)


def test_channel_span_dependent_channels_and_rank_deficient_coefficients():
    U, V, P, Q = _toy(3, 4, 3)
    U[:, 1], V[1] = U[:, 0], V[0]  # u_2 v_2ᵀ = u_1 v_1ᵀ: K singular, dim < rank G
    model = _Channels(U, V, P, Q)
    X = np.random.default_rng(2).standard_normal((7, 3))
    fast = channel_span(model, X)
    assert fast.dim == interaction_span(model, X).dim == 3
    assert rank(fast.coefficient_singular_values, 1e-10) == 4
    P[2], Q[3] = 0.0, 0.0  # two channels silent: rank G = 2 (the two merged channels stay one)
    silent = _Channels(U, V, P, Q)
    assert channel_span(silent, X).dim == interaction_span(silent, X).dim == 1


def test_channel_span_rejects_models_without_factors():
    with pytest.raises(TypeError, match="coefficients"):
        channel_span(Dense.random(2, 2), np.ones((3, 2)))


@pytest.mark.parametrize("min_lag", [1, 2, 5])
def test_prop_channel_span_beyond_a_lag_equals_the_dense_span(min_lag):
    model = _Channels(*_toy(3, 5, 2, seed=3))
    X = np.random.default_rng(4).standard_normal((2, 7, 2))
    blocks = []
    for x in X:
        with torch.no_grad():
            W = model.operator(torch.from_numpy(x)[None])[0]
        blocks += [W[i, j] for i in range(7) for j in range(i + 1) if i - j >= min_lag]
    dense, fast = operator_span(torch.stack(blocks)), channel_span(model, X, min_lag=min_lag)
    assert fast.dim == dense.dim
    top = min(len(dense.singular_values), len(fast.singular_values))
    assert np.allclose(fast.singular_values[:top], dense.singular_values[:top], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="min_lag = 7"):
        channel_span(model, X, min_lag=7)
    with pytest.raises(TypeError, match="min_lag must be an integer"):
        channel_span(model, X, min_lag=1.0)


@pytest.mark.parametrize("seed", range(6))
def test_prop_channel_span_with_repeated_channels_matches_the_dense_count(seed):
    # Ω singular: its zero eigenvalues come out at ~1e-17, and their square roots (~3e-9) must
    # not lift a zero singular value above the rank rule (a bug found on the trained blocks).
    U, V, P, Q = _toy(4, 8, 3, seed=seed)
    U[:, 1], V[1] = U[:, 0], V[0]
    model = _Channels(U, V, P, Q)
    X = np.random.default_rng(seed).standard_normal((2, 6, 3))
    assert channel_span(model, X).dim == interaction_span(model, X).dim


@pytest.mark.parametrize("seed", [0, 3, 4, 5])
def test_channel_span_resolves_nearly_dependent_channels_above_its_floor(seed):
    # u_2 v_2ᵀ = u_1 v_1ᵀ + δ a v_1ᵀ, δ = 3e-6: Ω's smallest eigenvalue is ~1e-12 of its largest,
    # far above the floor D·eps ≈ 9e-16 where channel_span starts dropping directions. The dense
    # route resolves the near-dependent direction (σ ~ 1e-7 of σ₁, above rtol); so must this one.
    U, V, P, Q = _toy(3, 4, 3, seed=seed)
    a = np.random.default_rng(100 + seed).standard_normal(3)
    U[:, 1] = U[:, 0] + 3e-6 * np.linalg.norm(U[:, 0]) * a / np.linalg.norm(a)
    V[1] = V[0]
    model = _Channels(U, V, P, Q)
    X = np.random.default_rng(seed).standard_normal((2, 6, 3))
    dense, fast = interaction_span(model, X), channel_span(model, X)
    lam = fast.gram_eigenvalues
    assert 3e-13 < lam[0] / lam[-1] < 3e-12
    assert fast.dim == dense.dim == 4
    assert np.allclose(fast.singular_values[:3], dense.singular_values[:3], rtol=1e-9, atol=0)
    assert dense.singular_values[3] / dense.singular_values[0] < 1e-6
    assert np.isclose(fast.singular_values[3], dense.singular_values[3], rtol=1e-3, atol=0)  # ~1e-4 measured
