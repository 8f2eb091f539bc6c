"""Interaction operators ({prf:ref}`def-interaction-operator`) and the identity every model obeys.

W[..., i, j, :, :] = 𝒲_ij with 0-based positions: shape (n, n, p, d), or (b, n, n, p, d) with
one operator per sequence. `toeplitz_operator` and `factorized_operator` build operators from
tensors (the models use them); `apply_operator`, `relative_error` and `identity_error` take
numpy or torch and return numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._validation import as_tensor, check_int
from .base import check_model


def toeplitz_operator(kernel: torch.Tensor, n: int) -> torch.Tensor:
    """W[i, j] = kernel[i − j] for 0 <= i − j < r, else 0: the operator of a causal convolution.

    kernel: tensor (r, ...), e.g. lags (r, p, d); returns (n, n, ...). Taps r >= n never act.
    """
    if not isinstance(kernel, torch.Tensor) or kernel.ndim < 1 or kernel.shape[0] < 1:
        raise TypeError("kernel must be a tensor of shape (r, ...) with r >= 1; "
                        f"got {getattr(kernel, 'shape', type(kernel).__name__)}")
    if not (kernel.is_floating_point() or kernel.is_complex()):
        raise TypeError(f"kernel must have a floating or complex dtype; got {kernel.dtype}")
    n, r = check_int(n, "n"), kernel.shape[0]
    lag = torch.arange(n, device=kernel.device)[:, None] - torch.arange(n, device=kernel.device)
    inside = ((lag >= 0) & (lag < r)).reshape(n, n, *[1] * (kernel.ndim - 1))
    return torch.where(inside, kernel[lag.clamp(0, r - 1)], torch.zeros((), dtype=kernel.dtype))


def factorized_operator(coefficients: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """𝒲_ij = Σ_h α^h_ij V_h ({prf:ref}`def-factorized`): α (b, H, n, n), V (H, p, d) → (b, n, n, p, d)."""
    for tensor, name in ((coefficients, "coefficients"), (values, "values")):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(f"{name} must be a real floating tensor; got "
                            f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    if (coefficients.ndim != 4 or values.ndim != 3 or coefficients.shape[1] != values.shape[0]
            or coefficients.shape[2] != coefficients.shape[3]):
        raise ValueError(f"coefficients must have shape (b, H, n, n) and values (H, p, d), one H; got "
                         f"{tuple(coefficients.shape)} and {tuple(values.shape)}")
    return torch.einsum("bhij,hpd->bijpd", coefficients, values)


def apply_operator(W: Any, X: Any) -> np.ndarray:
    """Y[..., i, :] = Σ_j W[..., i, j] X[..., j, :], the defining identity, in float64.

    W: (n, n, p, d) or (b, n, n, p, d); X: (n, d) or (b, n, d) (an unbatched W acts on every
    sequence). Returns (n, p) if both are unbatched, else (b, n, p).
    """
    W, X = as_tensor(W, "W", torch.float64).detach(), as_tensor(X, "X", torch.float64).detach()
    if W.ndim not in (4, 5) or W.shape[-4] != W.shape[-3]:
        raise ValueError(f"W must have shape (n, n, p, d) or (b, n, n, p, d); got {tuple(W.shape)}")
    n, d = W.shape[-3], W.shape[-1]
    if X.ndim not in (2, 3) or tuple(X.shape[-2:]) != (n, d) or (W.ndim == X.ndim + 2 == 5
                                                                 and W.shape[0] != X.shape[0]):
        raise ValueError(f"X must have shape ({n}, {d}) or (b, {n}, {d}) to match W of shape "
                         f"{tuple(W.shape)}; got {tuple(X.shape)}")
    if W.ndim == 5 and X.ndim == 2:
        X = X.expand(W.shape[0], n, d)
    return torch.einsum("...ijpd,...jd->...ip", W, X).numpy()


def relative_error(actual: Any, expected: Any) -> float:
    """‖actual − expected‖ / ‖expected‖ over all entries (the absolute error if expected = 0)."""
    actual = as_tensor(actual, "actual", torch.float64).detach()
    expected = as_tensor(expected, "expected", torch.float64).detach()
    if actual.shape != expected.shape:
        raise ValueError(f"actual must have the shape of expected {tuple(expected.shape)}; "
                         f"got {tuple(actual.shape)}")
    error, scale = torch.linalg.vector_norm(actual - expected), torch.linalg.vector_norm(expected)
    return float(error / scale) if scale > 0 else float(error)


def identity_error(model: Any, X: Any) -> float:
    """relative_error of Σ_j 𝒲_ij(X) x_j (+ β_i(X)) against model(X): rounding for every model of the book.

    A model with a method `offset(X)` (an affine map: the blocks of `lib.blocks`, whose biases give
    y_i = Σ_j 𝒲_ij(X) x_j + β_i(X)) has β added; every other model is compared without one.
    model: a SequenceMap; X: (n, d) or (b, n, d), numpy or torch.
    """
    check_model(model)
    X = as_tensor(X, "X", model.dtype)
    with torch.no_grad():
        Y = apply_operator(model.operator(X), X)
        offset = getattr(model, "offset", None)
        if callable(offset):
            Y = Y + as_tensor(offset(X), "offset", torch.float64).numpy()
        return relative_error(Y, model(X))
