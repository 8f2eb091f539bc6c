"""apply_operator, operator_norms, is_causal, toeplitz_operator and the checks (lib.operators, lib.checks)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import apply_operator, identity_error, is_causal, operator_norms, relative_error, toeplitz_operator


def loop_apply(W, X):
    n, _, p, _ = W.shape
    return np.array([sum(W[i, j] @ X[j] for j in range(n)) for i in range(n)])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), p=st.integers(1, 3), d=st.integers(1, 3), b=st.integers(1, 3), seed=st.integers(0, 999))
def test_def_interaction_operator_apply_matches_loops(n, p, d, b, seed):
    rng = np.random.default_rng(seed)
    W, X = rng.standard_normal((b, n, n, p, d)), rng.standard_normal((b, n, d))
    Y = apply_operator(W, X)
    assert Y.shape == (b, n, p)
    for k in range(b):
        np.testing.assert_allclose(Y[k], loop_apply(W[k], X[k]), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(apply_operator(W[k], X[k]), Y[k], rtol=1e-12, atol=1e-13)
    # An unbatched operator is broadcast over a batch of sequences.
    np.testing.assert_allclose(apply_operator(W[0], X), np.stack([loop_apply(W[0], x) for x in X]), rtol=1e-12, atol=1e-13)


def test_apply_operator_kinds_and_gradients():
    rng = np.random.default_rng(0)
    W, X = rng.standard_normal((3, 3, 2, 2)), rng.standard_normal((3, 2))
    assert isinstance(apply_operator(W, X), np.ndarray)
    Xt = torch.tensor(X, requires_grad=True)
    Y = apply_operator(W, Xt)
    assert isinstance(Y, torch.Tensor)
    Y.sum().backward()
    np.testing.assert_allclose(Xt.grad.numpy(), np.einsum("ijpd->jd", W), rtol=1e-12)


@pytest.mark.parametrize("W,X,match", [
    (np.zeros((3, 3, 2, 2)), np.zeros((4, 2)), r"X must have shape \(3, 2\) or \(b, 3, 2\)"),
    (np.zeros((3, 3, 2, 2)), np.zeros((3, 3)), r"X must have shape \(3, 2\) or \(b, 3, 2\)"),
    (np.zeros((2, 3, 3, 2, 2)), np.zeros((3, 3, 2)), r"X must have shape \(2, 3, 2\)"),
    (np.zeros((3, 4, 2, 2)), np.zeros((3, 2)), r"W must have shape \(n, n, p, d\)"),
    (np.zeros((3, 3, 2)), np.zeros((3, 2)), r"W must have shape \(n, n, p, d\)"),
    (np.full((1, 1, 1, 1), np.nan), np.zeros((1, 1)), "W must be finite"),
])
def test_apply_operator_validates(W, X, match):
    with pytest.raises(ValueError, match=match):
        apply_operator(W, X)


def test_operator_norms_and_causality():
    rng = np.random.default_rng(1)
    W = rng.standard_normal((2, 4, 4, 2, 3))
    norms = operator_norms(W)
    assert norms.shape == (2, 4, 4)
    np.testing.assert_allclose(norms[1, 2, 3], np.sqrt(np.sum(W[1, 2, 3] ** 2)), rtol=1e-13)
    assert not is_causal(W)
    lower = W * np.tril(np.ones((4, 4)))[None, :, :, None, None]
    assert is_causal(lower) and is_causal(lower[0])
    lower[0, 0, 3, 0, 0] = 1e-15
    assert not is_causal(lower) and is_causal(lower, atol=1e-14)
    assert isinstance(operator_norms(torch.tensor(W)), torch.Tensor)
    with pytest.raises(ValueError, match="atol must be >= 0"):
        is_causal(W, atol=-1.0)


def test_toeplitz_operator():
    K = np.arange(2 * 2 * 3, dtype=float).reshape(2, 2, 3)
    W = toeplitz_operator(K, 4)
    assert W.shape == (4, 4, 2, 3)
    for i in range(4):
        for j in range(4):
            np.testing.assert_array_equal(W[i, j], K[i - j] if 0 <= i - j < 2 else 0)
    np.testing.assert_array_equal(toeplitz_operator(K, 1)[0, 0], K[0])
    with pytest.raises(ValueError, match=r"kernel must have shape \(r, p, d\)"):
        toeplitz_operator(np.zeros((2, 2)), 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        toeplitz_operator(K, 0)
    with pytest.raises(TypeError, match="n must be an integer"):
        toeplitz_operator(K, 2.0)


def test_relative_and_identity_errors():
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0
    assert relative_error([3.0, 4.0], [0.0, 0.0]) == pytest.approx(5.0)  # absolute when expected = 0
    assert relative_error(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="actual must have the shape of expected"):
        relative_error(np.zeros(2), np.zeros(3))



class PlantedMap:
    """A stand-in model whose forward pass is its operator applied to X plus a planted error E."""

    def __init__(self, W, E):
        self.W, self.E = W, E

    def operator(self, X):
        return self.W

    def __call__(self, X):
        return np.einsum("ijpd,jd->ip", self.W, X) + self.E


def test_identity_error_measures_a_planted_discrepancy():
    # identity_error(model, X) = ‖W(X)X − model(X)‖ / ‖model(X)‖, from a known operator and a known error.
    rng = np.random.default_rng(0)
    W, X, E = rng.standard_normal((4, 4, 2, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    Y = loop_apply(W, X) + 1e-3 * E
    expected = np.linalg.norm(1e-3 * E) / np.linalg.norm(Y)
    assert identity_error(PlantedMap(W, 1e-3 * E), X) == pytest.approx(expected, rel=1e-12)
    assert identity_error(PlantedMap(W, 0 * E), X) < 1e-15  # torch einsum vs numpy einsum: rounding only
