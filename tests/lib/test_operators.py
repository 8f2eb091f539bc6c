"""Operators and the identity (lib.operators) against explicit loops in numpy (reference)."""

import numpy as np
import pytest
import torch

import reference as ref
from lib import (Dense, SequenceMap, apply_operator, factorized_operator, identity_error, relative_error,
                 toeplitz_operator)


@pytest.mark.parametrize("b,n,p,d", [(1, 1, 1, 1), (2, 4, 3, 2), (3, 5, 1, 3)])
def test_def_interaction_operator_apply_matches_loops(b, n, p, d):
    rng = np.random.default_rng(n + p)
    W, X = rng.standard_normal((b, n, n, p, d)), rng.standard_normal((b, n, d))
    Y = apply_operator(W, X)
    assert isinstance(Y, np.ndarray) and Y.shape == (b, n, p)
    for k in range(b):
        np.testing.assert_allclose(Y[k], ref.apply(W[k], X[k]), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(apply_operator(W[k], X[k]), Y[k], rtol=1e-12, atol=1e-13)
    # An unbatched operator acts on every sequence; torch in, numpy out.
    expected = np.stack([ref.apply(W[0], x) for x in X])
    np.testing.assert_allclose(apply_operator(torch.from_numpy(W[0]), torch.from_numpy(X)), expected,
                               rtol=1e-12, atol=1e-13)


def test_toeplitz_operator_places_the_taps_on_the_diagonals():
    K = torch.arange(2 * 2 * 3, dtype=torch.float64).reshape(2, 2, 3)
    W = toeplitz_operator(K, 4)
    assert W.shape == (4, 4, 2, 3)
    np.testing.assert_array_equal(W.numpy(), ref.conv_operator(K.numpy(), 4))
    np.testing.assert_array_equal(toeplitz_operator(K, 1).numpy(), K[:1, None].numpy())  # taps r >= n never act
    scalar = toeplitz_operator(torch.tensor([1.0, 2.0, 3.0]), 3)                       # kernel (r,): (n, n)
    np.testing.assert_array_equal(scalar.numpy(), [[1, 0, 0], [2, 1, 0], [3, 2, 1]])


def test_factorized_operator_matches_the_sum_over_heads():
    rng = np.random.default_rng(0)
    alpha, V = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((3, 2, 5))
    W = factorized_operator(torch.from_numpy(alpha), torch.from_numpy(V))
    assert W.shape == (2, 4, 4, 2, 5)
    for k in range(2):
        np.testing.assert_allclose(W[k].numpy(), ref.factorized_operator(alpha[k], V), rtol=1e-13, atol=1e-14)


def test_relative_error_values():
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0
    assert relative_error([3.0, 4.0], [0.0, 0.0]) == pytest.approx(5.0)  # absolute when expected = 0
    assert relative_error(torch.tensor([1.0, 1.0]), np.array([1.0, 0.0])) == pytest.approx(1.0)
    assert isinstance(relative_error([1.0], [2.0]), float)


class PlantedMap(SequenceMap):
    """A model whose forward pass is a fixed operator applied to X plus a planted error E."""

    def __init__(self, W, E):
        super().__init__()
        dims = self.set_parameters(torch.float64, W=(W, "n m p d"), E=(E, "n p"))
        self.d, self.p = dims["d"], dims["p"]

    def operator(self, X):
        return self.W

    def forward(self, X):
        return torch.einsum("ijpd,jd->ip", self.W, X) + self.E


def test_identity_error_measures_a_planted_discrepancy():
    # ‖W X − model(X)‖ / ‖model(X)‖ from a known operator and a known error; numpy X is accepted.
    rng = np.random.default_rng(0)
    W, X, E = rng.standard_normal((4, 4, 2, 3)), rng.standard_normal((4, 3)), 1e-3 * rng.standard_normal((4, 2))
    expected = np.linalg.norm(E) / np.linalg.norm(ref.apply(W, X) + E)
    assert identity_error(PlantedMap(W, E), X) == pytest.approx(expected, rel=1e-10)
    assert identity_error(PlantedMap(W, 0 * E), torch.from_numpy(X)) < 1e-15
    assert identity_error(Dense.random(3, 2), X) < 1e-15


# -- bad input: the right exception, naming the argument -------------------------------------------

Z, T = np.zeros, torch.zeros
F64 = torch.float64


@pytest.mark.parametrize("call,error,match", [
    (lambda: apply_operator(Z((3, 3, 2, 2)), Z((4, 2))), ValueError, r"X must have shape \(3, 2\) or \(b, 3, 2\)"),
    (lambda: apply_operator(Z((3, 3, 2, 2)), Z((3, 3))), ValueError, r"X must have shape \(3, 2\)"),
    (lambda: apply_operator(Z((3, 3, 2, 2)), Z(2)), ValueError, r"X must have shape \(3, 2\)"),
    (lambda: apply_operator(Z((2, 3, 3, 2, 2)), Z((3, 3, 2))), ValueError, r"X must have shape .* to match W"),
    (lambda: apply_operator(Z((3, 4, 2, 2)), Z((3, 2))), ValueError, r"W must have shape \(n, n, p, d\)"),
    (lambda: apply_operator(Z((3, 3, 2)), Z((3, 2))), ValueError, r"W must have shape \(n, n, p, d\)"),
    (lambda: apply_operator(np.full((1, 1, 1, 1), np.nan), Z((1, 1))), ValueError, "W must be finite"),
    (lambda: apply_operator(Z((1, 1, 1, 1)), [[np.inf]]), ValueError, "X must be finite"),
    (lambda: apply_operator(Z((1, 1, 1, 1), dtype=int), Z((1, 1))), TypeError, "W must have a real floating"),
    (lambda: apply_operator(Z((1, 1, 1, 1)), Z((1, 1), dtype=complex)), TypeError, "X must have a real floating"),
    (lambda: apply_operator(Z((1, 1, 1, 1)), T(1, 1, dtype=torch.bool)), TypeError, "X must have a real floating"),
    (lambda: apply_operator("W", Z((1, 1))), TypeError, "W must be a torch tensor or numpy array"),
    (lambda: apply_operator(Z((1, 1, 1, 1)), None), TypeError, "X must be a torch tensor or numpy array"),
    (lambda: relative_error(Z(2), Z(3)), ValueError, "actual must have the shape of expected"),
    (lambda: relative_error([np.nan], [1.0]), ValueError, "actual must be finite"),
    (lambda: relative_error([1.0], np.array(["a"])), TypeError, "expected must have a real floating"),
    (lambda: identity_error(Dense.random(2, 2), Z((3, 3))), ValueError, "X must have shape"),
    (lambda: identity_error(Dense.random(2, 2), [[1, 2]]), TypeError, "X must have a real floating"),
    (lambda: toeplitz_operator(Z((2, 2)), 3), TypeError, r"kernel must be a tensor of shape \(r, \.\.\.\)"),
    (lambda: toeplitz_operator(torch.tensor(1.0), 3), TypeError, "kernel must be a tensor"),
    (lambda: toeplitz_operator(T(0, 2), 3), TypeError, "kernel must be a tensor .* r >= 1"),
    (lambda: toeplitz_operator(T(2, 2), 0), ValueError, "n must be >= 1"),
    (lambda: toeplitz_operator(T(2, 2), -1), ValueError, "n must be >= 1"),
    (lambda: toeplitz_operator(T(2, 2), 2.0), TypeError, "n must be an integer"),
    (lambda: toeplitz_operator(T(2, 2), True), TypeError, "n must be an integer"),
    (lambda: toeplitz_operator(T(2, 2, dtype=torch.int64), 3), TypeError, "kernel must have a floating"),
    (lambda: toeplitz_operator(T(2, 2, dtype=torch.bool), 3), TypeError, "kernel must have a floating"),
    (lambda: factorized_operator(T(1, 2, 3, 3), T(3, 1, 1)), ValueError, "coefficients must have shape .* one H"),
    (lambda: factorized_operator(T(2, 3, 3), T(2, 1, 1)), ValueError, r"coefficients must have shape \(b, H, n, n\)"),
    (lambda: factorized_operator(T(1, 2, 3, 4), T(2, 1, 1)), ValueError, r"coefficients must have shape \(b, H, n, n"),
    (lambda: factorized_operator(T(1, 2, 3, 3), T(2, 1)), ValueError, r"values \(H, p, d\)"),
    (lambda: factorized_operator(Z((1, 2, 3, 3)), T(2, 1, 1)), TypeError, "coefficients must be a real floating"),
    (lambda: factorized_operator(T(1, 2, 3, 3), [[[1.0]]] * 2), TypeError, "values must be a real floating tensor"),
    (lambda: factorized_operator(T(1, 2, 3, 3, dtype=torch.int64), T(2, 1, 1)), TypeError, "coefficients must be"),
    (lambda: factorized_operator(T(1, 2, 3, 3), T(2, 1, 1, dtype=torch.complex128)), TypeError, "values must be"),
    (lambda: identity_error(object(), Z((3, 2))), TypeError, "model must be a SequenceMap; got object"),
])
def test_bad_input_names_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
