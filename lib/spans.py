"""Operator spans and interaction rank ({prf:ref}`def-operator-span`).

The span of blocks M_1..M_m ∈ ℝ^{p×d} is read from the m × pd matrix of rows vec(M_k): its
singular values σ_1 >= σ_2 >= … and the numerical dimension #{q : σ_q > rtol · σ_1}, the rank
rule used throughout lib. Inputs are numpy or torch; results are float64 numpy.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import numpy as np
import torch

from ._validation import as_tensor, check_int, check_real
from .base import check_model


class OperatorSpan(NamedTuple):
    """dim, the numerical dimension; singular_values (min(m, pd),), descending; basis (dim, p, d),
    orthonormal in ⟨M, M'⟩ = trace(Mᵀ M')."""

    dim: int
    singular_values: np.ndarray
    basis: np.ndarray


def check_rtol(rtol: Any) -> float:
    return check_real(rtol, "rtol", low=0, high=1, open_interval=True)


def rank(sigma: np.ndarray, rtol: float) -> int:
    """The rank rule: #{q : σ_q > rtol · σ_1} for descending σ, 0 when every σ is 0."""
    return int((sigma > rtol * sigma[0]).sum()) if sigma.size and sigma[0] > 0 else 0


def span_of_rows(rows: np.ndarray, p: int, d: int, rtol: float) -> OperatorSpan:
    """The span of the rows (m, pd) of a float64 matrix, read as p × d blocks."""
    _, sigma, right = np.linalg.svd(rows, full_matrices=False)
    dim = rank(sigma, rtol)
    return OperatorSpan(dim, sigma, right[:dim].reshape(dim, p, d))


def operator_span(ops: Any, rtol: float = 1e-10) -> OperatorSpan:
    """span{M_1..M_m} of operators `ops` (m, p, d), numpy or torch; 0 < rtol < 1. Not scale-free: it
    undercounts once the independent part falls below ~rtol of the largest (fast-decaying lags)."""
    rtol = check_rtol(rtol)
    ops = as_tensor(ops, "ops", torch.float64).detach()
    if ops.ndim != 3 or min(ops.shape) < 1:
        raise ValueError(f"ops must have shape (m, p, d) with m, p, d >= 1; got {tuple(ops.shape)}")
    m, p, d = ops.shape
    return span_of_rows(ops.reshape(m, p * d).numpy(), p, d, rtol)


def _sequences(inputs: Any, d: int, dtype: torch.dtype) -> Iterable[torch.Tensor]:
    # One (1, n, d) tensor at a time from a sequence (n, d), a batch (b, n, d) or an iterable of (n, d).
    if isinstance(inputs, (np.ndarray, torch.Tensor)):
        batch = as_tensor(inputs, "inputs", dtype)
        if batch.ndim not in (2, 3) or batch.shape[-1] != d or min(batch.shape) < 1:
            raise ValueError(f"inputs must have shape (n, {d}) or (b, n, {d}); got {tuple(batch.shape)}")
        yield from batch.reshape(-1, *batch.shape[-2:]).split(1)
        return
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise TypeError(f"inputs must be an array (n, d) or (b, n, d), or an iterable of (n, d) arrays; "
                        f"got {type(inputs).__name__}")
    count = 0
    for k, X in enumerate(inputs):
        X = as_tensor(X, f"inputs[{k}]", dtype)
        if X.ndim != 2 or X.shape[1] != d or X.shape[0] < 1:
            raise ValueError(f"inputs[{k}] must have shape (n, {d}); got {tuple(X.shape)}")
        count += 1
        yield X[None]
    if not count:
        raise ValueError("inputs must contain at least one sequence")


def interaction_span(model: Any, inputs: Any, rtol: float = 1e-10) -> OperatorSpan:
    """span{𝒲_ij(X) : i, j, X in inputs} of a SequenceMap (j <= i only if causal).

    inputs: (n, d), (b, n, d), or an iterable of (n, d) sequences (lengths may differ). The
    blocks are compressed input by input by QR (which keeps the singular values). Each block counts
    once (an LTI lag ℓ n − ℓ times); the rank rule is `operator_span`'s.
    """
    rtol = check_rtol(rtol)
    check_model(model)
    stacked = None
    for X in _sequences(inputs, model.d, model.dtype):
        with torch.no_grad():
            W = model.operator(X)[0].to(torch.float64)
        n = W.shape[0]
        rows, cols = torch.tril_indices(n, n) if model.causal else torch.ones(n, n).nonzero().T
        blocks = W[rows, cols].reshape(len(rows), -1)
        stacked = blocks if stacked is None else torch.cat([stacked, blocks])
        if stacked.shape[0] > stacked.shape[1]:
            stacked = torch.linalg.qr(stacked, mode="r").R
    return span_of_rows(stacked.numpy(), model.p, model.d, rtol)


def interaction_rank(model: Any, inputs: Any, rtol: float = 1e-10) -> int:
    """dim span{𝒲_ij(X)} over the inputs: `interaction_span(model, inputs, rtol).dim`."""
    return interaction_span(model, inputs, rtol).dim


class ChannelSpan(NamedTuple):
    """The span of 𝒲_ij(X) = U diag(g_ij(X)) V read from the coefficients ({prf:ref}`prop-channel-span`).

    dim: the numerical dimension of span{𝒲_ij}, the head count at the inputs; singular_values
    (≤ D,): those of the matrix of rows vec 𝒲_ij, descending; coefficient_singular_values: those
    of Γ, the matrix of rows g_ij, alone; gram_eigenvalues (D,): of Ω = (UᵀU) ⊙ (VVᵀ), ascending
    (Ω nonsingular: the D rank-one maps u_q v_qᵀ are independent and dim = rank Γ).
    """

    dim: int
    singular_values: np.ndarray
    coefficient_singular_values: np.ndarray
    gram_eigenvalues: np.ndarray


def channel_span(model: Any, inputs: Any, rtol: float = 1e-10, min_lag: int = 0) -> ChannelSpan:
    """span{𝒲_ij(X) : i − j >= min_lag, X in inputs} of a block with 𝒲_ij = U diag(g_ij) V, without 𝒲.

    model: a causal SequenceMap with `coefficients(X)` (b, n, n, D) and `factors()` → U (p, D),
    V (D, d) (lib.MambaBlock, lib.Mamba2Block); inputs as for `interaction_span`. The rows
    vec 𝒲_ij = Mᵀ g_ij, M with rows vec(u_q v_qᵀ), have Gram Γ Ω Γᵀ with Ω = MMᵀ = (UᵀU) ⊙ (VVᵀ):
    their singular values are those of Γ Ω^{1/2}, computed in O(n² D²) instead of O(n² p² d²).
    The rank rule is `operator_span`'s, above a floor: eigenvalues of Ω below D·eps·λ_max count
    as zero (where rounding leaves exactly dependent maps), so directions along channel maps within
    ~√(D·eps) of dependent are dropped; a well-conditioned Ω (every block of the book) is exact
    to rounding. min_lag > 0 keeps the pairs at lags i − j >= min_lag
    (beyond a convolution's window, say); an input shorter than min_lag + 1 adds no pair.
    """
    rtol = check_rtol(rtol)
    min_lag = check_int(min_lag, "min_lag", minimum=0)
    check_model(model)
    if not (callable(getattr(model, "coefficients", None)) and callable(getattr(model, "factors", None))):
        raise TypeError(f"model must have coefficients(X) and factors() (MambaBlock, Mamba2Block); "
                        f"got {type(model).__name__}")
    stacked = None
    for X in _sequences(inputs, model.d, model.dtype):
        with torch.no_grad():
            g = model.coefficients(X)[0].to(torch.float64)
        rows, cols = torch.tril_indices(g.shape[0], g.shape[0], offset=-min_lag)
        stacked = g[rows, cols] if stacked is None else torch.cat([stacked, g[rows, cols]])
        if stacked.shape[0] > stacked.shape[1]:
            stacked = torch.linalg.qr(stacked, mode="r").R
    if stacked.shape[0] == 0:
        raise ValueError(f"inputs must have a pair at lag >= min_lag = {min_lag}; every input is shorter")
    with torch.no_grad():
        return _coefficient_span(stacked, *model.factors(), rtol)


def _coefficient_span(rows: torch.Tensor, U: torch.Tensor, V: torch.Tensor, rtol: float) -> ChannelSpan:
    # The ChannelSpan of coefficient rows (m, D) with factors U (p, D), V (D, d); for experiments
    # that reuse one computation of the coefficients. Unchecked: callers pass what channel_span does.
    U, V, rows = (t.detach().to(torch.float64) for t in (U, V, rows))
    if rows.shape[0] > rows.shape[1]:  # R of a QR keeps the singular values of rows and rows Ω^½
        rows = torch.linalg.qr(rows, mode="r").R
    lam, Q = torch.linalg.eigh((U.T @ U) * (V @ V.T))
    # Ω^{1/2}. Ω is PSD; rounding leaves its zero eigenvalues at ±D·eps·λ_max, whose square roots
    # (~1e-8 relative) would pass the rank rule: set them to zero.
    noise = lam.shape[0] * torch.finfo(lam.dtype).eps * lam[-1].clamp(min=0)
    root = (Q * torch.where(lam > noise, lam, 0).sqrt()) @ Q.T
    # numpy's SVD: torch's svdvals is ~4× slower on these sizes (LAPACK driver).
    sigma = np.linalg.svd((rows @ root).numpy(), compute_uv=False)
    return ChannelSpan(rank(sigma, rtol), sigma, np.linalg.svd(rows.numpy(), compute_uv=False), lam.numpy())
