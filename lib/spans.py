"""Operator spans and interaction rank ({prf:ref}`def-operator-span`).

The span of blocks M_1..M_m ∈ ℝ^{p×d} is computed from the m × pd matrix of rows vec(M_k):
its singular values σ_1 ≥ σ_2 ≥ … (Eckart–Young distances to lower-dimensional spans) and
the numerical dimension #{q : σ_q > rtol · σ_1}, the rank rule used throughout `lib`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from ._validation import as_real_tensor, as_sequence, check_rtol, check_shape


@dataclass(frozen=True)
class OperatorSpan:
    """The numerical span of p × d operators (`operator_span`).

    Attributes: dim, the numerical dimension; singular_values, descending, shape (min(m, pd),);
    basis, orthonormal in ⟨M, M'⟩ = trace(Mᵀ M'), shape (dim, p, d); rtol, the tolerance of `dim`.
    """

    dim: int
    singular_values: np.ndarray
    basis: np.ndarray
    rtol: float

    def coefficients(self, ops: Any) -> np.ndarray:
        """Coordinates ⟨basis_r, M_k⟩ of operators (m, p, d) in the basis, shape (m, dim)."""
        return self._coordinates(_as_ops(ops, self.basis.shape[1:]))

    def project(self, ops: Any) -> np.ndarray:
        """Orthogonal projections of operators (m, p, d) onto the span, shape (m, p, d)."""
        return self._project(_as_ops(ops, self.basis.shape[1:]))

    def residual(self, ops: Any) -> np.ndarray:
        """Frobenius distance of each operator (m, p, d) from the span, shape (m,)."""
        ops = _as_ops(ops, self.basis.shape[1:])
        return np.linalg.norm((ops - self._project(ops)).reshape(len(ops), -1), axis=1)

    def _coordinates(self, ops: np.ndarray) -> np.ndarray:
        flat = ops.reshape(len(ops), -1)
        return flat @ self.basis.reshape(self.dim, flat.shape[1]).T

    def _project(self, ops: np.ndarray) -> np.ndarray:
        return np.einsum("mr,rpd->mpd", self._coordinates(ops), self.basis)


def _as_ops(ops: Any, block: tuple[int, int] | None = None) -> np.ndarray:
    # Operators of shape (m, p, d) (matching `block` if given) as a float64 numpy array.
    tensor, _ = as_real_tensor(ops, "ops")
    if tensor.ndim != 3 or min(tensor.shape) < 1 or (block is not None and tuple(tensor.shape[1:]) != tuple(block)):
        expected = "(m, p, d)" if block is None else f"(m, {block[0]}, {block[1]})"
        raise ValueError(f"ops must have shape {expected} with m >= 1; got {tuple(tensor.shape)}")
    return tensor.detach().cpu().to(torch.float64).numpy()


def _as_float64(value: Any, name: str, shape: tuple, dims: dict[str, int]) -> np.ndarray:
    # A finite real array of the symbolic shape (binding its symbols in dims), as float64 numpy.
    tensor, _ = as_real_tensor(value, name)
    check_shape(tensor, name, shape, dims)
    return tensor.detach().cpu().to(torch.float64).numpy()


def _rank(sigma: np.ndarray, rtol: float) -> int:
    # The rank rule: #{q : σ_q > rtol · σ_1}, 0 when every σ is 0.
    return int((sigma > rtol * sigma[0]).sum()) if sigma.size and sigma[0] > 0 else 0


def _span(rows: np.ndarray, p: int, d: int, rtol: float) -> OperatorSpan:
    # The span of the rows (m, pd) of checked float64 operators, read as p × d blocks.
    _, sigma, right = np.linalg.svd(rows, full_matrices=False)
    dim = _rank(sigma, rtol)
    return OperatorSpan(dim=dim, singular_values=sigma, basis=right[:dim].reshape(dim, p, d), rtol=rtol)


def operator_span(ops: Any, rtol: float = 1e-10) -> OperatorSpan:
    """The span of operators M_1..M_m ∈ ℝ^{p×d} ({prf:ref}`def-operator-span`), in float64.

    Args:
        ops: shape (m, p, d), numpy or torch.
        rtol: singular values > rtol · largest count towards `dim`; 0 < rtol < 1.
    """
    rtol = check_rtol(rtol)
    ops = _as_ops(ops)
    m, p, d = ops.shape
    return _span(ops.reshape(m, p * d), p, d, rtol)


def interaction_span(model: Any, inputs: Any, rtol: float = 1e-10) -> OperatorSpan:
    """The span of all blocks 𝒲_ij(X) of a model over the inputs ({prf:ref}`def-operator-span`).

    Only blocks with j ≤ i are collected for causal models.  The stacked blocks are
    compressed input by input with QR (which keeps the singular values), so many or long
    inputs need little memory; singular_values has length min(#blocks, pd).

    Args:
        model: a SequenceMap (`.operator(X)`, `.d`, `.p`, `.causal`).
        inputs: a sequence (n, d), a batch (b, n, d), or an iterable of (n, d) sequences
            (lengths may differ).
        rtol: as in `operator_span`.
    """
    rtol = check_rtol(rtol)
    stacked = None
    for X in _sequences(inputs, model.d):
        W = torch.as_tensor(model.operator(X)).detach().to(torch.float64)
        n = W.shape[0]
        rows, cols = torch.tril_indices(n, n) if getattr(model, "causal", False) else torch.ones(n, n).nonzero().T
        blocks = W[rows, cols].reshape(len(rows), -1)
        stacked = blocks if stacked is None else torch.cat([stacked, blocks])
        if stacked.shape[0] > stacked.shape[1]:
            stacked = torch.linalg.qr(stacked, mode="r").R
    return _span(stacked.numpy(), model.p, model.d, rtol)


def interaction_rank(model: Any, inputs: Any, rtol: float = 1e-10) -> int:
    """dim span{𝒲_ij(X) : i, j, X in inputs} ({prf:ref}`def-operator-span`); arguments of `interaction_span`."""
    return interaction_span(model, inputs, rtol).dim


def _sequences(inputs: Any, d: int) -> Iterable[torch.Tensor]:
    # One (n, d) tensor at a time from a sequence, a batch or an iterable of sequences.
    if isinstance(inputs, (np.ndarray, torch.Tensor)):
        batch, _, _ = as_sequence(inputs, d, dtype=None, name="inputs")
        yield from batch.unbind(0)
        return
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise TypeError("inputs must be an array (n, d) or (b, n, d), or an iterable of (n, d) arrays; "
                        f"got {type(inputs).__name__}")
    count = 0
    for k, X in enumerate(inputs):
        sequence, batched, _ = as_sequence(X, d, dtype=None, name=f"inputs[{k}]")
        if batched:
            raise ValueError(f"inputs[{k}] must have shape (n, {d}); got {tuple(np.shape(X))}")
        count += 1
        yield sequence[0]
    if count == 0:
        raise ValueError("inputs must contain at least one sequence")


# -- lem-pointwise-multiple ---------------------------------------------------------------


def sine_to_line(a: Any, b: Any) -> float:
    """‖a − proj_b a‖ / ‖a‖ ∈ [0, 1] for a, b of shape (p,): the sine of the angle between them.

    0 when a is a multiple of b (and when a = 0); 1 when b = 0 ≠ a, the line being {0}.
    """
    dims: dict[str, int] = {}
    a, b = _as_float64(a, "a", ("p",), dims), _as_float64(b, "b", ("p",), dims)
    return float(_row_sines(a[None], b[None])[0])


def _row_sines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # sine_to_line for each row pair of a and b, shape (m, p) each -> (m,).
    norm_a, energy_b = np.linalg.norm(a, axis=1), np.einsum("mp,mp->m", b, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        residual = np.linalg.norm(a - (np.einsum("mp,mp->m", a, b) / energy_b)[:, None] * b, axis=1)
        sines = np.minimum(1.0, residual / norm_a)
    return np.where(norm_a == 0, 0.0, np.where(energy_b == 0, 1.0, sines))


@dataclass(frozen=True)
class PointwiseMultiple:
    """`pointwise_multiple`: largest_sine, max over u of `sine_to_line(L u, V u)`; factors
    c(u) = ⟨Lu, Vu⟩/‖Vu‖², shape (m,), NaN where Vu = 0; factor_spread, (max c − min c) over the
    largest absolute factor, among the defined ones (NaN when none is defined or all are 0)."""

    largest_sine: float
    factors: np.ndarray
    factor_spread: float


def pointwise_multiple(L: Any, V: Any, inputs: Any) -> PointwiseMultiple:
    """Probe {prf:ref}`lem-pointwise-multiple` (L u ∈ span{V u} for all u ⇒ L = cV) on inputs.

    `largest_sine` measures the hypothesis on the given u, `factor_spread` the conclusion.

    Args:
        L, V: shape (p, d).  inputs: probe vectors u, shape (m, d).
    """
    dims: dict[str, int] = {}
    L, V, us = (_as_float64(value, name, shape, dims) for value, name, shape in
                ((L, "L", ("p", "d")), (V, "V", ("p", "d")), (inputs, "inputs", ("m", "d"))))
    Lu, Vu = us @ L.T, us @ V.T
    energy = np.einsum("mp,mp->m", Vu, Vu)
    with np.errstate(invalid="ignore", divide="ignore"):
        factors = np.where(energy > 0, np.einsum("mp,mp->m", Lu, Vu) / energy, np.nan)
    defined = factors[~np.isnan(factors)]
    scale = np.abs(defined).max() if len(defined) else 0.0
    spread = float((defined.max() - defined.min()) / scale) if scale > 0 else float("nan")
    return PointwiseMultiple(largest_sine=float(_row_sines(Lu, Vu).max()), factors=factors, factor_spread=spread)


def pointwise_witness(L: Any, V: Any, rtol: float = 1e-10) -> np.ndarray | None:
    """A unit u of shape (d,) with L u ∉ span{V u}, or None when L is a multiple of V.

    The contrapositive of {prf:ref}`lem-pointwise-multiple`, following its proof.  L counts
    as a multiple of V when ‖L − cV‖_F <= rtol · ‖L‖_F, c = ⟨L, V⟩_F/‖V‖²_F (or L = 0).
    Candidates, in the proof's order: the right singular vectors w_q of V (those of its
    numerical kernel included, where V u = 0 ≠ L u) and the sums w_q + w_q' of those off the
    kernel; the one with the largest `sine_to_line(L u, V u)` is returned, V cut to its
    numerical rank (σ <= rtol · σ_max set to 0).  Random probes cannot replace this: for
    V = v aᵀ and L = v bᵀ only u ∈ ker V is a witness.

    Args:
        L, V: shape (p, d).  rtol: tolerance of the multiple test and of rank V, 0 < rtol < 1.
    """
    rtol = check_rtol(rtol)
    dims: dict[str, int] = {}
    L, V = (_as_float64(value, name, ("p", "d"), dims) for value, name in ((L, "L"), (V, "V")))
    return _witness(L, V, rtol)


def _witness(L: np.ndarray, V: np.ndarray, rtol: float) -> np.ndarray | None:
    norm_L, energy_V = np.linalg.norm(L), float((V * V).sum())
    c = float((L * V).sum()) / energy_V if energy_V > 0 else 0.0
    if norm_L == 0 or np.linalg.norm(L - c * V) <= rtol * norm_L:
        return None
    left, sigma, rows = np.linalg.svd(V)                      # rows: right singular vectors (d, d)
    rank = _rank(sigma, rtol)
    images = np.zeros((V.shape[1], V.shape[0]))               # V w_q = σ_q left_q, 0 on the kernel
    images[:rank] = (left[:, :rank] * sigma[:rank]).T
    pairs = [(r, q) for r in range(rank) for q in range(r + 1, rank)]
    candidates = np.concatenate([rows, [rows[r] + rows[q] for r, q in pairs]]) if pairs else rows
    V_images = np.concatenate([images, [images[r] + images[q] for r, q in pairs]]) if pairs else images
    scale = np.linalg.norm(candidates, axis=1, keepdims=True)
    candidates, V_images = candidates / scale, V_images / scale
    return candidates[int(np.argmax(_row_sines(candidates @ L.T, V_images)))]


# -- prop-single-head-generic-inputs -------------------------------------------------------


def span_distances(Y: Any, X: Any, V: Any = None, rtol: float = 1e-10) -> np.ndarray:
    """dist(y_i, V S_i)², S_i = span{x_1..x_i}: the least squared error of a causal single head at i.

    {prf:ref}`prop-single-head-generic-inputs` (1): Σ_{j≤i} α_ij V x_j ranges over V S_i, so
    this is the error of the best token-dependent head. Computed by Gram–Schmidt (twice) on
    V x_1, V x_2, … in turn — no least squares; V x_i joins the basis only when its residual
    exceeds rtol · ‖V x_i‖, so dependent tokens add nothing.

    Args:
        Y: targets, shape (n, p) or (b, n, p).  X: tokens, shape (n, d) or (b, n, d).
        V: value map, shape (p, d); None for the identity (then p = d).
        rtol: 0 < rtol < 1.

    Returns:
        Squared distances, shape (n,) or (b, n).
    """
    rtol = check_rtol(rtol)
    dims: dict[str, int] = {}
    batched = np.ndim(X) == 3
    X = _as_float64(X, "X", ("b", "n", "d") if batched else ("n", "d"), dims)
    Y = _as_float64(Y, "Y", ("b", "n", "p") if batched else ("n", "p"), dims)
    if V is None:
        if dims["p"] != dims["d"]:
            raise ValueError(f"V must be given when p != d; got p = {dims['p']}, d = {dims['d']}")
        V = np.eye(dims["d"])
    V = _as_float64(V, "V", ("p", "d"), dims)
    distances = _span_distances(Y.reshape(-1, *Y.shape[-2:]), X.reshape(-1, *X.shape[-2:]) @ V.T, rtol)
    return distances if batched else distances[0]


def _span_distances(Y: np.ndarray, VX: np.ndarray, rtol: float) -> np.ndarray:
    # Y, VX (b, n, p): ‖y_i − Q_i Q_iᵀ y_i‖² with Q_i an orthonormal basis of span{VX_1..VX_i}.
    b, n, p = VX.shape
    Q = np.zeros((b, p, n))                                   # column j: unit direction or 0
    distances = np.empty((b, n))
    for i in range(n):
        v = VX[:, i]
        for _ in range(2):                                    # twice is enough (Kahan)
            v = v - np.einsum("bpj,bj->bp", Q[:, :, :i], np.einsum("bpj,bp->bj", Q[:, :, :i], v))
        norm, scale = np.linalg.norm(v, axis=1), np.linalg.norm(VX[:, i], axis=1)
        keep = (norm > rtol * scale) & (scale > 0)
        Q[:, :, i] = np.where(keep[:, None], v / np.where(keep, norm, 1.0)[:, None], 0.0)
        basis = Q[:, :, : i + 1]
        residual = Y[:, i] - np.einsum("bpj,bj->bp", basis, np.einsum("bpj,bp->bj", basis, Y[:, i]))
        distances[:, i] = (residual ** 2).sum(1)
    return distances
