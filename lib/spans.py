"""Operator spans and interaction rank ({prf:ref}`def-operator-span`).

The operator span of a set of blocks {M_1..M_m} ⊂ ℝ^{p×d} is the subspace they
span in ℝ^{p×d}; the interaction rank of a model is the dimension of the span of
all its blocks 𝒲_ij(X).  Numerically: stack vec(M_k) as the rows of an m × pd
matrix; its singular values σ_1 ≥ σ_2 ≥ … measure how far the set is from lower
dimensional spans (Eckart–Young), and the numerical dimension is
#{r : σ_r > rtol · σ_1}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from ._validation import as_real_tensor, as_sequence, check_rtol, check_shape

__all__ = ["OperatorSpan", "operator_span", "interaction_span", "interaction_rank",
           "sine_to_line", "PointwiseMultiple", "pointwise_multiple", "pointwise_witness"]


@dataclass(frozen=True)
class OperatorSpan:
    """The numerical span of a set of p × d operators.

    Attributes:
        dim: number of singular values > rtol · largest (0 if all operators are zero).
        singular_values: all singular values of the stacked operators, descending,
            shape (min(m, pd),).
        basis: orthonormal basis of the span in the Frobenius inner product
            ⟨M, M'⟩ = trace(Mᵀ M'), shape (dim, p, d).
        rtol: the relative tolerance used for `dim`.
    """

    dim: int
    singular_values: np.ndarray
    basis: np.ndarray
    rtol: float

    def coefficients(self, ops: Any) -> np.ndarray:
        """Coordinates ⟨basis_r, M_k⟩ of operators in the basis, shape (m, dim)."""
        p, d = self.basis.shape[1:]
        return _as_ops(ops, (p, d)).reshape(-1, p * d) @ self.basis.reshape(self.dim, p * d).T

    def project(self, ops: Any) -> np.ndarray:
        """Orthogonal projections of operators onto the span, shape (m, p, d)."""
        return np.einsum("mr,rpd->mpd", self.coefficients(ops), self.basis)

    def residual(self, ops: Any) -> np.ndarray:
        """Frobenius distance of each operator from the span, shape (m,)."""
        ops = _as_ops(ops, self.basis.shape[1:])
        return np.linalg.norm((ops - self.project(ops)).reshape(len(ops), -1), axis=1)


def _as_ops(ops: Any, block: tuple[int, int] | None = None) -> np.ndarray:
    # Validate operators of shape (m, p, d) (matching `block` if given) as a float64 numpy array.
    tensor, _ = as_real_tensor(ops, "ops")
    if tensor.ndim != 3 or min(tensor.shape) < 1 or (block is not None and tuple(tensor.shape[1:]) != tuple(block)):
        expected = "(m, p, d)" if block is None else f"(m, {block[0]}, {block[1]})"
        raise ValueError(f"ops must have shape {expected} with m >= 1; got {tuple(tensor.shape)}")
    return tensor.detach().cpu().to(torch.float64).numpy()


def operator_span(ops: Any, rtol: float = 1e-10) -> OperatorSpan:
    """The span of operators M_1..M_m ∈ ℝ^{p×d} ({prf:ref}`def-operator-span`).

    Args:
        ops: operators, shape (m, p, d); numpy array or torch tensor (computed in float64).
        rtol: singular values > rtol · largest count towards `dim`; 0 < rtol < 1.

    Returns:
        OperatorSpan with dim, singular_values (shape (min(m, pd),)), basis (shape (dim, p, d)).
    """
    rtol = check_rtol(rtol)
    ops = _as_ops(ops)
    m, p, d = ops.shape
    _, sigma, rows = np.linalg.svd(ops.reshape(m, p * d), full_matrices=False)
    dim = int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0
    return OperatorSpan(dim=dim, singular_values=sigma, basis=rows[:dim].reshape(dim, p, d), rtol=rtol)


def interaction_span(model: Any, inputs: Any, rtol: float = 1e-10) -> OperatorSpan:
    """The span of all blocks 𝒲_ij(X) of a model over the given inputs.

    For causal models only the blocks with j ≤ i are collected (the others are 0).
    The stacked blocks are compressed input by input with QR (which keeps the
    singular values), so many or long inputs need little memory.

    Args:
        model: a SequenceMap (anything with `.operator(X)`, `.d`, `.causal`).
        inputs: one sequence (n, d), a batch (b, n, d), or an iterable of (n, d)
            sequences (lengths may differ).
        rtol: as in `operator_span`.

    Returns:
        OperatorSpan of the blocks; singular_values has length min(#blocks, pd).
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
    return operator_span(stacked.reshape(-1, model.p, model.d), rtol=rtol)


def interaction_rank(model: Any, inputs: Any, rtol: float = 1e-10) -> int:
    """Interaction rank: dim span{𝒲_ij(X) : i, j, X in inputs} ({prf:ref}`def-operator-span`).

    Args: as in `interaction_span`.

    Returns:
        The numerical dimension (an int between 0 and p·d).
    """
    return interaction_span(model, inputs, rtol).dim


def _as_float64(value: Any, name: str, shape: tuple, dims: dict[str, int]) -> np.ndarray:
    # A finite real array of the given symbolic shape (binding its symbols in dims), as float64 numpy.
    tensor, _ = as_real_tensor(value, name)
    check_shape(tensor, name, shape, dims)
    return tensor.detach().cpu().to(torch.float64).numpy()


def sine_to_line(a: Any, b: Any) -> float:
    """Distance of a from the line span{b}, relative to ‖a‖: the sine of the angle between them.

    Args:
        a, b: vectors of the same shape (p,).

    Returns:
        ‖a − proj_b a‖ / ‖a‖ in [0, 1]: 0 when a is a multiple of b (and when a = 0);
        1 when b = 0 and a ≠ 0, since then the line is {0}.
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
    """How far L acts as a multiple of V on probe inputs u ({prf:ref}`lem-pointwise-multiple`).

    Attributes:
        largest_sine: max over u of `sine_to_line(L u, V u)`; 0 when every L u lies
            on the line of V u.
        factors: c(u) = ⟨Lu, Vu⟩ / ‖Vu‖² per input (NaN where Vu = 0), shape (m,).
        factor_spread: (max c − min c) / max |c| over the defined factors (0 when
            L = cV, c ≠ 0; NaN when no factor is defined or all are 0).
    """

    largest_sine: float
    factors: np.ndarray
    factor_spread: float


def pointwise_multiple(L: Any, V: Any, inputs: Any) -> PointwiseMultiple:
    """Probe the hypothesis and the conclusion of {prf:ref}`lem-pointwise-multiple`.

    The lemma: if L u ∈ span{V u} for every u, then L = cV with one scalar c.
    `largest_sine` measures the hypothesis on the given u, `factor_spread` the
    conclusion (one c for all u).

    Args:
        L, V: operators of the same shape (p, d).
        inputs: probe vectors u, shape (m, d).

    Returns:
        PointwiseMultiple (largest_sine, factors of shape (m,), factor_spread).
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
    """A unit vector u with L u ∉ span{V u}, or None when L is a multiple of V.

    The contrapositive of {prf:ref}`lem-pointwise-multiple`, made constructive by
    following its proof.  L is taken to be a multiple of V when
    ‖L − cV‖_F <= rtol · ‖L‖_F for c = ⟨L, V⟩_F / ‖V‖²_F (or L = 0); otherwise the
    candidates are, in the proof's order:

    1. a direction of ker V on which L is not zero (there V u = 0 ≠ L u; sine 1);
    2. for rank V = 1, V = σ v aᵀ: u = a (then L a ∉ span{v});
    3. for rank V >= 2: the right singular vectors w_r of V (w_1 = a in case 2), and the sums w_r + w_s
       (if every L w_r = c_r V w_r with one common c_r, L = cV on the row space and on
       ker V, so some c_r ≠ c_s, and then L(w_r + w_s) ∉ span{V(w_r + w_s)}).

    The candidate with the largest `sine_to_line(L u, V u)` is returned, the sine
    measured with V truncated to its numerical rank (singular values <= rtol·σ_max set
    to 0), so that V u = 0 exactly on the numerical kernel.  Random probes
    cannot replace this: for V = v aᵀ and L = v bᵀ (b not parallel to a), L u lies on
    the line of V u for every u off the hyperplane aᵀu = 0, and only u ∈ ker V is a witness.

    Args:
        L, V: operators of the same shape (p, d).
        rtol: relative tolerance of the multiple test and of the rank of V, 0 < rtol < 1.

    Returns:
        u of shape (d,) with ‖u‖ = 1, or None.
    """
    rtol = check_rtol(rtol)
    dims: dict[str, int] = {}
    L, V = (_as_float64(value, name, ("p", "d"), dims) for value, name in ((L, "L"), (V, "V")))
    norm_L, energy_V = np.linalg.norm(L), float((V * V).sum())
    c = float((L * V).sum()) / energy_V if energy_V > 0 else 0.0
    if norm_L == 0 or np.linalg.norm(L - c * V) <= rtol * norm_L:
        return None
    left, sigma, rows = np.linalg.svd(V)                      # rows: right singular vectors (d, d)
    rank = int((sigma > rtol * sigma[0]).sum()) if sigma.size and sigma[0] > 0 else 0
    # Images under the rank-`rank` V: σ_r (left_r) on w_r for r < rank, exactly 0 on the kernel.
    images = np.zeros((V.shape[1], V.shape[0]))
    images[:rank] = (left[:, :rank] * sigma[:rank]).T
    pairs = [(r, q) for r in range(rank) for q in range(r + 1, rank)]
    candidates = np.concatenate([rows, [rows[r] + rows[q] for r, q in pairs]]) if pairs else rows
    V_images = np.concatenate([images, [images[r] + images[q] for r, q in pairs]]) if pairs else images
    scale = np.linalg.norm(candidates, axis=1, keepdims=True)
    candidates, V_images = candidates / scale, V_images / scale
    sines = _row_sines(candidates @ L.T, V_images)
    return candidates[int(np.argmax(sines))]


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
