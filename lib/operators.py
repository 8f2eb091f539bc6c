"""The effective interaction operator and the identity every sequence map obeys.

A sequence map sends X = (x_1..x_n), x_j ∈ ℝ^d, to Y = (y_1..y_n), y_i ∈ ℝ^p, and
its interaction operator is the array of blocks 𝒲_ij(X) ∈ ℝ^{p×d} with

    y_i = Σ_j 𝒲_ij(X) x_j                        ({prf:ref}`def-interaction-operator`)

In code W[i, j] = 𝒲_ij with 0-based positions: W has shape (n, n, p, d), or
(b, n, n, p, d) for a batch.  The map is causal when 𝒲_ij = 0 for j > i
({prf:ref}`def-causal`).

Functions accept numpy arrays or torch tensors and return torch tensors if any
input is a torch tensor, numpy arrays otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._validation import as_real_tensor, check_int, check_real, check_shape, to_output


def _as_operator(W: Any) -> tuple[torch.Tensor, bool]:
    tensor, was_torch = as_real_tensor(W, "W")
    if tensor.ndim not in (4, 5) or tensor.shape[-3] != tensor.shape[-4] or min(tensor.shape) < 1:
        raise ValueError("W must have shape (n, n, p, d) or (b, n, n, p, d) with all sizes >= 1; "
                         f"got {tuple(tensor.shape)}")
    return tensor, was_torch


def apply_operator(W: Any, X: Any) -> torch.Tensor | np.ndarray:
    """Apply an interaction operator: Y[..., i, :] = Σ_j W[..., i, j] @ X[..., j, :].

    Implements the defining identity of {prf:ref}`def-interaction-operator`.

    Args:
        W: operator, shape (n, n, p, d), or (b, n, n, p, d) for one operator per sequence.
            An unbatched W is applied to every sequence of a batched X.
        X: sequence, shape (n, d) or (b, n, d).

    Returns:
        Y, shape (n, p) if both are unbatched, else (b, n, p).
    """
    W, w_torch = _as_operator(W)
    X, x_torch = as_real_tensor(X, "X")
    n, d = W.shape[-3], W.shape[-1]
    batch_mismatch = W.ndim == 5 and X.ndim == 3 and X.shape[0] != W.shape[0]
    if X.ndim not in (2, 3) or tuple(X.shape[-2:]) != (n, d) or batch_mismatch:
        batch = f"({W.shape[0]}, {n}, {d})" if W.ndim == 5 else f"({n}, {d}) or (b, {n}, {d})"
        raise ValueError(f"X must have shape {batch} to match W of shape {tuple(W.shape)}; got {tuple(X.shape)}")
    dtype = torch.promote_types(W.dtype, X.dtype)
    W, X = W.to(dtype), X.to(dtype)
    subscripts = {(4, 2): "ijpd,jd->ip", (4, 3): "ijpd,bjd->bip", (5, 2): "bijpd,jd->bip", (5, 3): "bijpd,bjd->bip"}
    Y = torch.einsum(subscripts[W.ndim, X.ndim], W, X)
    return to_output(Y, w_torch or x_torch)


def operator_norms(W: Any) -> torch.Tensor | np.ndarray:
    """Frobenius norms ‖𝒲_ij‖_F of the blocks, e.g. for heat maps.

    Args:
        W: operator, shape (n, n, p, d) or (b, n, n, p, d).

    Returns:
        Norms, shape (n, n) or (b, n, n).
    """
    W, was_torch = _as_operator(W)
    return to_output(torch.linalg.matrix_norm(W), was_torch)


def is_causal(W: Any, atol: float = 0.0) -> bool:
    """Whether every block above the diagonal (j > i) is zero up to `atol` ({prf:ref}`def-causal`).

    Args:
        W: operator, shape (n, n, p, d) or (b, n, n, p, d) (all sequences must be causal).
        atol: largest absolute entry tolerated in a block with j > i.
    """
    W, _ = _as_operator(W)
    atol = check_real(atol, "atol", nonnegative=True)
    n = W.shape[-3]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=W.device), diagonal=1)
    return bool((W.detach().abs()[..., upper, :, :] <= atol).all())


def toeplitz_operator(kernel: Any, n: int) -> torch.Tensor | np.ndarray:
    """The causal block-Toeplitz operator 𝒲_ij = K_{i−j} for 0 ≤ i−j < r, else 0.

    This is the operator of a causal convolution (lags K_0..K_{r−1}); lags beyond
    n − 1 never act on a length-n sequence and are ignored.

    Args:
        kernel: lags K, shape (r, p, d).
        n: sequence length.

    Returns:
        W, shape (n, n, p, d).
    """
    kernel, was_torch = as_real_tensor(kernel, "kernel")
    check_shape(kernel, "kernel", ("r", "p", "d"))
    n = check_int(n, "n")
    return to_output(_toeplitz(kernel, n), was_torch)


def _toeplitz(kernel: torch.Tensor, n: int) -> torch.Tensor:
    # kernel (r, ...) -> (n, n, ...) with W[i, j] = kernel[i - j] when 0 <= i - j < r.
    r = kernel.shape[0]
    lag = torch.arange(n, device=kernel.device)[:, None] - torch.arange(n, device=kernel.device)[None, :]
    inside = (lag >= 0) & (lag < r)
    blocks = kernel[lag.clamp(0, r - 1)]
    mask = inside.reshape(n, n, *([1] * (kernel.ndim - 1)))
    return torch.where(mask, blocks, torch.zeros((), dtype=kernel.dtype, device=kernel.device))


def _block_diagonal(blocks: torch.Tensor) -> torch.Tensor:
    # blocks (b, n, p, d) -> operator (b, n, n, p, d) with W[:, i, i] = blocks[:, i].
    n = blocks.shape[1]
    return torch.einsum("ij,bipd->bijpd", torch.eye(n, dtype=blocks.dtype, device=blocks.device), blocks)


def relative_error(actual: Any, expected: Any) -> float:
    """‖actual − expected‖ / ‖expected‖ over all entries (absolute error if expected = 0).

    The book's one "relative error": a ratio of norms, not of squared norms.

    Args:
        actual, expected: arrays or tensors of the same shape.
    """
    actual, _ = as_real_tensor(actual, "actual", dtype=torch.float64)
    expected, _ = as_real_tensor(expected, "expected", dtype=torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"actual must have the shape of expected {tuple(expected.shape)}; got {tuple(actual.shape)}")
    error, scale = torch.linalg.vector_norm((actual - expected).detach()), torch.linalg.vector_norm(expected.detach())
    return float(error / scale) if scale > 0 else float(error)


def identity_error(model: Any, X: Any) -> float:
    """relative_error of Σ_j 𝒲_ij(X) x_j against model(X) ({prf:ref}`def-interaction-operator`).

    Args:
        model: a SequenceMap.  X: shape (n, d) or (b, n, d).
    """
    return relative_error(apply_operator(model.operator(X), X), model(X))
