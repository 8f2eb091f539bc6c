"""Gradient paths through sequence maps: Jacobian profiles, decay bounds, adversarial inputs.

J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} (0-based positions); its norm against the distance i − j is the
model's gradient profile ({ref}`chap-gradient-highway`). Measured by autograd:
`jacobian_blocks`, `jacobian_norms`. Closed forms: `lag_norms`, `selective_jacobian`,
`rnn_jacobian`. Bounds: `ssm_decay_bound`, `stack_decay_bound`. Inputs on which a path stays
open: `planted_key_input`, `gate_closing_input`, `saturating_input`. Reading a profile:
`fit_decay_rate`, `gradient_reach`. Results are float64 numpy arrays.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._validation import as_real_tensor, as_sequence, check_int, check_real
from .attention import LinearAttention, SoftmaxAttention
from .base import SequenceMap
from .recurrent import ElmanRNN
from .ssm import SSD, LinearSSM, SelectiveSSM
from .stacks import Stack

# -- checks at the edge (the functions below them do not re-check) --------------------------------


def _require(value: Any, name: str, *kinds: type) -> None:
    if not isinstance(value, kinds):
        what = " or ".join(("an " if kind is SSD else "a ") + kind.__name__ for kind in kinds)
        raise TypeError(f"{name} must be {what} from lib; got {type(value).__name__}")


def _query_key(attention: Any, i: Any, j: Any, n: int) -> tuple[int, int]:
    # A query i and a key j != i in [0, n) that the attention can see (j < i if causal).
    i, j = _position(i, "i", n), _position(j, "j", n)
    if j == i:
        raise ValueError(f"j must differ from i; got i = j = {i}")
    if attention.causal and j > i:
        raise ValueError(f"j must be < i for causal attention; got i = {i}, j = {j}")
    return i, j


def _position(value: Any, name: str, n: int) -> int:
    value = check_int(value, name, minimum=0)
    if value >= n:
        raise ValueError(f"{name} must satisfy 0 <= {name} < n = {n}; got {value}")
    return value


def _one_sequence(model: SequenceMap, X: Any) -> torch.Tensor:
    # One sequence (n, d) in the model's dtype, detached from any caller graph.
    tensor, batched, _ = as_sequence(X, model.d, dtype=model.dtype, max_length=model.max_length)
    if batched:
        raise ValueError(f"X must have shape (n, {model.d}) (one sequence); got {tuple(tensor.shape)}")
    return tensor[0].detach()


def _path(model: SequenceMap, X: Any, i: Any, j: Any) -> tuple[np.ndarray, int, int]:
    # (X as float64 numpy, i, j) with 0 <= j <= i < n, for the closed forms.
    X = _one_sequence(model, X)
    i, j = _position(i, "i", X.shape[0]), _position(j, "j", X.shape[0])
    if j > i:
        raise ValueError(f"j must satisfy j <= i (the layer is causal); got i = {i}, j = {j}")
    return _numpy(X), i, j


def _profile(values: Any, name: str) -> np.ndarray:
    # A profile of norms: shape (m,), finite, >= 0.
    values, _ = as_real_tensor(values, name, dtype=torch.float64)
    if values.ndim != 1 or values.shape[0] < 1:
        raise ValueError(f"{name} must have shape (m,) with m >= 1; got {tuple(values.shape)}")
    values = _numpy(values)
    if np.any(values < 0):
        raise ValueError(f"{name} must be >= 0 (a profile of norms)")
    return values


def _full_row_rank(M: np.ndarray, message: str) -> None:
    singular = np.linalg.svd(M, compute_uv=False)
    if singular.size < M.shape[0] or singular.min() <= 1e-12 * max(singular.max(), 1e-300):
        raise ValueError(message)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().to(torch.float64).numpy()


def _block_norms(blocks: np.ndarray) -> np.ndarray:
    # Frobenius norms over the last two axes as s‖M/s‖, s = max|M|: squaring tiny far blocks underflows.
    scale = np.abs(blocks).max(axis=(-2, -1))
    safe = np.where(scale > 0, scale, 1.0)
    return scale * np.linalg.norm(blocks / safe[..., None, None], axis=(-2, -1))


def _lag_norms(ssm: LinearSSM, n: int) -> np.ndarray:
    return _block_norms(_numpy(ssm._lags(n)))


# -- measured profiles ---------------------------------------------------------------------------


def jacobian_blocks(model: SequenceMap, X: Any, i: int) -> np.ndarray:
    """J_ij = ∂y_i/∂x_j for j = 0..i, by p reverse-mode passes from y_i (the measured side).

    Args: model, any SequenceMap (d → p); X, one sequence (n, d), numpy or torch (left
    untouched); i, the output position, 0 <= i < n.
    Returns: shape (i + 1, p, d), blocks[j] = J_ij (j <= i only, also for non-causal models).
    """
    _require(model, "model", SequenceMap)
    X = _one_sequence(model, X)
    i = _position(i, "i", X.shape[0])
    X.requires_grad_(True)
    with torch.enable_grad():
        y = model._forward(X[None])[0, i]  # (p,)
        if not y.requires_grad:  # y_i ignores X
            return np.zeros((i + 1, model.p, model.d))
        rows = [torch.autograd.grad(y[k], X, retain_graph=k + 1 < model.p, allow_unused=True)[0]
                for k in range(model.p)]
    J = torch.stack([torch.zeros_like(X) if row is None else row for row in rows])  # (p, n, d)
    return _numpy(J[:, : i + 1].transpose(0, 1))


def jacobian_norms(model: SequenceMap, X: Any, i: int) -> np.ndarray:
    """‖J_ij‖_F for j = 0..i, shape (i + 1,), indexed by position j (`[::-1]` indexes by distance).

    The norms of `jacobian_blocks(model, X, i)`, taken without underflow.
    """
    return _block_norms(jacobian_blocks(model, X, i))


def lag_norms(ssm: LinearSSM, n: int) -> np.ndarray:
    """‖L_ℓ‖_F = ‖C A^ℓ B‖_F for ℓ = 0..n−1, shape (n,): an LTI SSM's profile on every input.

    {prf:ref}`thm-ssm-gradient-decay`: J_ij = L_{i−j}, so this is `jacobian_norms(ssm, X, i)[::-1]`
    for any X, by doubling (n = 10⁵ in well under a second for small N, d, p).
    """
    _require(ssm, "ssm", LinearSSM)
    return _lag_norms(ssm, check_int(n, "n"))


# -- bounds ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecayBound:
    """‖J_ij‖_F <= scale · rate^{i−j} ({prf:ref}`thm-ssm-gradient-decay`), from `ssm_decay_bound`.

    constant = κ₂(P) for A = P Λ P⁻¹ (unit-norm eigenvectors), rate = ρ(A),
    scale = κ₂(P) ‖C‖₂ ‖B‖_F.
    """

    constant: float
    rate: float
    scale: float

    def at(self, distances: Any) -> np.ndarray:
        """scale · rate^ℓ at distances ℓ >= 0 (any shape, 0^0 = 1)."""
        ell = np.asarray(distances, dtype=float)
        if np.any(ell < 0) or not np.all(np.isfinite(ell)):
            raise ValueError("distances must be finite and >= 0")
        with np.errstate(under="ignore"):
            return self.scale * np.power(self.rate, ell)


def ssm_decay_bound(ssm: LinearSSM) -> DecayBound:
    """The bound ‖C A^ℓ B‖_F <= κ₂(P) ‖C‖₂ ‖B‖_F ρ(A)^ℓ of {prf:ref}`thm-ssm-gradient-decay`.

    ssm: a LinearSSM with diagonalisable A (ValueError when κ₂(P) > 1e12: A is numerically
    defective and only the γ > ρ(A) form of the theorem holds). Deviation: Frobenius norms for J
    and B; numpy's unit-norm eigenvectors, within √N of the best scaling (van der Sluis).
    """
    _require(ssm, "ssm", LinearSSM)
    A, B, C = ssm.A.astype(float), ssm.B.astype(float), ssm.C.astype(float)
    eigenvalues, P = np.linalg.eig(A)
    kappa = float(np.linalg.cond(P, 2))
    if not np.isfinite(kappa) or kappa > 1e12:
        raise ValueError(f"ssm must have a diagonalisable A; its eigenvector matrix has condition number {kappa:.3g}")
    scale = kappa * np.linalg.norm(C, 2) * np.linalg.norm(B, "fro")
    return DecayBound(constant=kappa, rate=float(np.abs(eigenvalues).max()), scale=float(scale))


def stack_decay_bound(stack: Stack, n: int, rate: float, *, constants: Any = None) -> np.ndarray:
    """The bound of {prf:ref}`prop-stack-decay` on ‖J_{i,i−D}‖_F for D = 0..n−1, shape (n,).

    For M LTI layers with ‖L^{(q)}_ℓ‖_F <= κ_q γ^ℓ: plain (∏_q κ_q) C(D+M−1, M−1) γ^D;
    residual [D = 0]√d + Σ_{k=1}^{M} e_k(κ) C(D+k−1, k−1) γ^D, e_k the elementary symmetric
    polynomials. Attained by scalar layers κ_q γ^ℓ (`Stack.scalar`); computed in logs.

    Args: stack, a Stack of LinearSSM layers; n, the number of distances; rate, γ in (0, 1);
    constants, None for the smallest valid κ_q = max_{ℓ<n} ‖L^{(q)}_ℓ‖_F / γ^ℓ, or M numbers
    κ_q >= 0 that must bound the lags for ℓ < n (ValueError otherwise).
    Deviation: Frobenius norms, so the identity enters as ‖I‖_F = √d.
    """
    _require(stack, "stack", Stack)
    for k, layer in enumerate(stack.layers):
        if not isinstance(layer, LinearSSM):
            raise TypeError(f"stack.layers[{k}] must be a LinearSSM; got {type(layer).__name__}")
    n = check_int(n, "n")
    rate = check_real(rate, "rate", positive=True)
    if rate >= 1:
        raise ValueError(f"rate must be in (0, 1); got {rate}")
    depth = len(stack.layers)
    if constants is not None:
        if isinstance(constants, (str, bytes)) or not hasattr(constants, "__len__"):
            raise TypeError(f"constants must be a sequence of {depth} numbers; got {type(constants).__name__}")
        if len(constants) != depth:
            raise ValueError(f"constants must have one entry per layer ({depth}); got {len(constants)}")
        constants = [check_real(K, f"constants[{m}]", nonnegative=True) for m, K in enumerate(constants)]
    distances, log_rate = np.arange(n), math.log(rate)
    log_K = []
    for m, layer in enumerate(stack.layers):
        with np.errstate(divide="ignore"):
            needed = float(np.max(np.log(_lag_norms(layer, n)) - distances * log_rate))
        if constants is None:
            log_K.append(needed)
            continue
        given = math.log(constants[m]) if constants[m] > 0 else -math.inf
        if needed > given + 1e-9:
            raise ValueError(f"constants[{m}] = {constants[m]:.6g} does not bound layer {m}'s lags: "
                             f"‖L_ℓ‖_F / γ^ℓ reaches {math.exp(min(needed, 700.0)):.6g} for some ℓ < n")
        log_K.append(given)
    log_e = np.full(depth + 1, -np.inf)  # log e_k(κ), k = 0..M, by e_k <- e_k + κ_q e_{k−1}
    log_e[0] = 0.0
    for lk in log_K:
        log_e[1:] = np.logaddexp(log_e[1:], lk + log_e[:-1])

    def log_terms(k: int) -> np.ndarray:  # log e_k C(D + k − 1, k − 1) γ^D
        compositions = [math.log(math.comb(int(D) + k - 1, k - 1)) for D in distances]
        return log_e[k] + np.array(compositions) + distances * log_rate

    with np.errstate(under="ignore"):
        if not stack.residual:
            return np.exp(log_terms(depth))
        bound = np.exp(np.logaddexp.reduce(np.stack([log_terms(k) for k in range(1, depth + 1)]), axis=0))
    bound[0] += math.sqrt(stack.d)
    return bound


# -- reading a profile -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DecayFit:
    """log‖J_ℓ‖ ≈ intercept + ℓ · log_rate by least squares (`fit_decay_rate`); rate = exp(log_rate).

    log_rate_stderr is the slope's standard error from the residuals; points, the number of
    distances used.
    """

    rate: float
    log_rate: float
    log_rate_stderr: float
    intercept: float
    points: int


def fit_decay_rate(norms: Any, *, start: int = 0, stop: int | None = None, floor: float = 1e-300) -> DecayFit:
    """Fit an exponential rate to a profile over start <= ℓ < stop, skipping norms <= floor.

    norms: shape (m,), >= 0, indexed by distance. Needs 3 points (ValueError). The slope
    recovers log ρ of {prf:ref}`thm-ssm-gradient-decay` for diagonalisable A. For an LTI SSM
    the residuals are deterministic (transients, oscillation), so the standard error measures
    how well one exponential describes the window, not a probability.
    """
    y = _profile(norms, "norms")
    start = check_int(start, "start", minimum=0)
    stop = len(y) if stop is None else check_int(stop, "stop", minimum=1)
    if not start < stop <= len(y):
        raise ValueError(f"start and stop must satisfy 0 <= start < stop <= len(norms) = {len(y)}; "
                         f"got start = {start}, stop = {stop}")
    floor = check_real(floor, "floor", nonnegative=True)
    ell, window = np.arange(start, stop, dtype=float), y[start:stop]
    keep = window > floor
    m = int(keep.sum())
    if m < 3:
        raise ValueError(f"norms must have at least 3 entries above floor = {floor:g} in the window; got {m}")
    ell, log_norm = ell[keep], np.log(window[keep])
    centred = ell - ell.mean()
    sxx = float(centred @ centred)
    slope = float(centred @ (log_norm - log_norm.mean())) / sxx
    intercept = float(log_norm.mean() - slope * ell.mean())
    residuals = log_norm - intercept - slope * ell
    stderr = math.sqrt(float(residuals @ residuals) / (m - 2) / sxx)
    return DecayFit(rate=math.exp(slope), log_rate=slope, log_rate_stderr=stderr, intercept=intercept, points=m)


@dataclass(frozen=True)
class DecayReport:
    """An LTI SSM's profile against {prf:ref}`thm-ssm-gradient-decay` (`decay_report`).

    norms (length,), ‖C A^ℓ B‖_F for ℓ = 0..length−1; bound, the theorem's `DecayBound`;
    bound_ratio, the largest norms[ℓ] / bound.at(ℓ) (<= 1 where the theorem holds); fit, the
    `DecayFit` of norms over ℓ >= start.
    """

    norms: np.ndarray
    bound: DecayBound
    bound_ratio: float
    fit: DecayFit

    @property
    def relative_gap(self) -> float:
        """abs(fitted log-rate − ln ρ(A)) / abs(ln ρ(A)), the fit's relative error."""
        log_rho = math.log(self.bound.rate)
        return abs(self.fit.log_rate - log_rho) / abs(log_rho)

    def row(self) -> dict[str, float]:
        """The report as one row of the profiles notebook's table `decay-fits`."""
        return {"radius": self.bound.rate, "ln rho": math.log(self.bound.rate),
                "fitted log-rate": self.fit.log_rate, "standard error": self.fit.log_rate_stderr,
                "relative gap": self.relative_gap, "points": self.fit.points}


def decay_report(ssm: LinearSSM, length: int, *, start: int = 0) -> DecayReport:
    """Profile, bound and fitted log-rate of a stable LTI SSM over distances 0..length−1.

    ssm: a LinearSSM with diagonalisable A and 0 < ρ(A) < 1; length >= 3; start, the first
    distance of the fit (0 <= start <= length − 3; past a non-normal transient). The
    profile comes from `lag_norms` (doubling), the bound from `ssm_decay_bound`.
    """
    _require(ssm, "ssm", LinearSSM)
    length = check_int(length, "length", minimum=3)
    start = check_int(start, "start", minimum=0)
    if start > length - 3:
        raise ValueError(f"start must satisfy 0 <= start <= length − 3 = {length - 3} (3 points to "
                         f"fit); got {start}")
    bound = ssm_decay_bound(ssm)
    if not 0 < bound.rate < 1:
        raise ValueError(f"ssm must be stable with 0 < ρ(A) < 1; got ρ(A) = {bound.rate:.6g}")
    norms = _lag_norms(ssm, length)
    ratio = float(np.max(norms / bound.at(np.arange(length))))
    return DecayReport(norms=norms, bound=bound, bound_ratio=ratio,
                       fit=fit_decay_rate(norms, start=start))


def gradient_reach(profile: Any, eps: float = 1e-3) -> int:
    """max{D : profile[D] >= eps · max profile}, in [0, m − 1] (0 for an all-zero profile).

    profile: norms indexed by distance, shape (m,), >= 0; eps in (0, 1). About
    ln(1/eps)/ln(1/ρ) for a normal stable LTI SSM; a reach on random inputs says nothing about
    every input ({ref}`chap-gradient-highway`, the reach table).
    """
    values = _profile(profile, "profile")
    eps = check_real(eps, "eps", positive=True)
    if eps >= 1:
        raise ValueError(f"eps must satisfy 0 < eps < 1; got {eps}")
    peak = values.max()
    return 0 if peak == 0 else int(np.flatnonzero(values >= eps * peak).max())


# -- attention: the planted key --------------------------------------------------------------------


def planted_key_input(attention: SoftmaxAttention | LinearAttention, n: int, i: int, j: int, *,
                      strength: float = 30.0, head: int = 0, scale: float = 1.0, seed: Any = 0) -> np.ndarray:
    """An input (n, d) on which query i of `head` attends (almost) only to key j.

    {prf:ref}`prop-attention-highway`: background tokens iid N(0, scale² I); x_j is the
    least-norm solution of g_h · x_j + b_h[i − j] = ±strength (+ for `head`, − for the others),
    g_h = W_Kᵀ W_Q x_i / √d_k, b the position bias if any. For LinearAttention (elu + 1) it
    solves W_K^h x_j = ±strength · 1 instead, so 1 − α = O(1/strength).

    Args: attention, SoftmaxAttention (H <= d) or LinearAttention (H·d_k <= d); n; positions
    0 <= i, j < n, j != i (j < i if causal); strength > 0; head in [0, H); scale >= 0; seed.
    ValueError when the key cannot be planted (dependent key directions).
    """
    _require(attention, "attention", SoftmaxAttention, LinearAttention)
    n = check_int(n, "n")
    if attention.max_length is not None and n > attention.max_length:
        raise ValueError(f"n must be <= {attention.max_length} for this model; got {n}")
    i, j = _query_key(attention, i, j, n)
    strength = check_real(strength, "strength", positive=True)
    head = check_int(head, "head", minimum=0)
    if head >= attention.H:
        raise ValueError(f"head must satisfy 0 <= head < H = {attention.H}; got {head}")
    scale = check_real(scale, "scale", nonnegative=True)
    X = scale * np.random.default_rng(seed).standard_normal((n, attention.d))
    W_Q, W_K = attention.W_Q.astype(float), attention.W_K.astype(float)
    if isinstance(attention, LinearAttention):
        G = W_K.reshape(-1, attention.d)  # stacked key maps, (H d_k, d)
        target = np.full((attention.H, attention.d_k), -strength)
        target[head] = strength
        target = target.reshape(-1)
        problem = "the stacked key maps W_K^h are not of full row rank H·d_k (H·d_k > d?)"
    else:
        G = np.einsum("hkd,hk->hd", W_K, W_Q @ X[i]) / math.sqrt(attention.d_k)  # rows g_h, (H, d)
        target = np.full(attention.H, -strength)
        target[head] = strength
        if attention.position_bias is not None:
            target = target - attention.position_bias[:, i - j]
        problem = "the key directions W_Kᵀq_i of the heads are linearly dependent (H > d or a zero query)"
    x_j = np.linalg.lstsq(G, target, rcond=None)[0]
    if not np.allclose(G @ x_j, target, rtol=1e-8, atol=1e-8 * strength):
        raise ValueError(f"attention cannot be planted at this query: {problem}")
    X[j] = x_j
    return X


@dataclass(frozen=True)
class KeyPrice:
    """The score key j needs for weight α^h_ij >= 1 − ε ({prf:ref}`prop-attention-highway` 1).

    score = lse_{t≠j} z^h_it + ln((1−ε)/ε); largest_other = max_{t≠j} z^h_it; gap, their
    difference, between ln((1−ε)/ε) and ln(m(1−ε)/ε) for m other keys.
    """

    score: float
    largest_other: float

    @property
    def gap(self) -> float:
        """score − largest_other: how far key j must beat the best of the others."""
        return self.score - self.largest_other


def key_price(attention: SoftmaxAttention, X: Any, i: int, j: int, eps: float, *, head: int = 0) -> KeyPrice:
    """The score key j needs at query i of `head` for α^h_ij >= 1 − eps (`KeyPrice`).

    The other scores z^h_it (t <= i if causal, else every t; t != j; position bias included)
    are computed in numpy from W_Q, W_K, not by the model's forward. Args: attention, a
    SoftmaxAttention; X, one sequence (n, d); positions 0 <= i, j < n, j != i (j < i if
    causal); eps in (0, 1); head in [0, H). Planting the key at that score
    (`planted_key_input(..., strength=score)`) gives weight exactly 1 − eps.
    """
    _require(attention, "attention", SoftmaxAttention)
    X = _numpy(_one_sequence(attention, X))
    n = X.shape[0]
    i, j = _query_key(attention, i, j, n)
    eps = check_real(eps, "eps", positive=True)
    if eps >= 1:
        raise ValueError(f"eps must satisfy 0 < eps < 1; got {eps}")
    head = check_int(head, "head", minimum=0)
    if head >= attention.H:
        raise ValueError(f"head must satisfy 0 <= head < H = {attention.H}; got {head}")
    keys = np.arange(i + 1 if attention.causal else n)
    keys = keys[keys != j]
    q = attention.W_Q[head].astype(float) @ X[i]
    scores = X[keys] @ attention.W_K[head].astype(float).T @ q / math.sqrt(attention.d_k)
    if attention.position_bias is not None:
        scores = scores + attention.position_bias[head, i - keys]
    needed = float(np.logaddexp.reduce(scores) + math.log((1 - eps) / eps))
    return KeyPrice(score=needed, largest_other=float(scores.max()))


# -- profiles on chosen inputs ---------------------------------------------------------------------


def _distances(distances: Any, n: int, smallest: int) -> list[int]:
    if isinstance(distances, (str, bytes)) or not hasattr(distances, "__iter__"):
        raise TypeError(f"distances must be a sequence of integers; got {type(distances).__name__}")
    values = [check_int(D, "distances entries", minimum=smallest) for D in distances]
    if not values or max(values) > n - 1:
        raise ValueError(f"distances must hold at least one integer in [{smallest}, n − 1 = {n - 1}]; "
                         f"got {values[:5]}{'…' if len(values) > 5 else ''}")
    return values


def random_profiles(model: SequenceMap, n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Profiles ‖J_{n−1, n−1−D}‖_F, D = 0..n−1, on `count` random inputs, shape (count, n).

    Input k is rng.standard_normal((n, d)), drawn in order from `rng` (a numpy Generator,
    advanced), so a notebook's random stream stays as it was. Row k is indexed by distance.
    """
    _require(model, "model", SequenceMap)
    n, count = check_int(n, "n"), check_int(count, "count")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy Generator; got {type(rng).__name__}")
    return np.stack([jacobian_norms(model, rng.standard_normal((n, model.d)), n - 1)[::-1]
                     for _ in range(count)])


def planted_key_profile(model: SequenceMap, n: int, distances: Any, *, layer: Any = None,
                        strength: float = 30.0, head: int = 0, seed: int = 0) -> np.ndarray:
    """‖J_{n−1, n−1−D}‖_F of `model` for each D in distances, each on its own planted key.

    {prf:ref}`prop-attention-highway`: the input for D is `planted_key_input(layer, n, n − 1,
    n − 1 − D, strength=strength, head=head, seed=seed + D)`; `layer` (default: `model`) is
    the attention layer that sees X — for a Stack, its first layer. distances: integers in
    [1, n − 1]. Returns shape (len(distances),).
    """
    _require(model, "model", SequenceMap)
    layer = model if layer is None else layer
    _require(layer, "layer", SoftmaxAttention, LinearAttention)
    if layer.d != model.d:
        raise ValueError(f"layer must take the model's input width d = {model.d}; got d = {layer.d}")
    n = check_int(n, "n", minimum=2)
    seed = check_int(seed, "seed", minimum=0)
    norms = []
    for D in _distances(distances, n, 1):
        X = planted_key_input(layer, n, n - 1, n - 1 - D, strength=strength, head=head, seed=seed + D)
        norms.append(jacobian_norms(model, X, n - 1)[n - 1 - D])
    return np.array(norms)


# -- selective SSMs ------------------------------------------------------------------------------


def with_constant_step(model: SelectiveSSM, step: float) -> SelectiveSSM:
    """A copy of `model` with its gate frozen at Δ_t = step > 0 (W_Δ = 0, b_Δ = softplus⁻¹(step)).

    An LTI SSM in Mamba's parametrisation, A_t = exp(step · A), the setting of
    {prf:ref}`prop-frozen-gate`.
    """
    _require(model, "model", SelectiveSSM)
    step = check_real(step, "step", positive=True)
    bias = step + math.log(-math.expm1(-step))  # softplus(bias) = step
    return SelectiveSSM(model.A_log, np.zeros_like(model.W_delta), np.full(model.d, bias), model.W_B, model.W_C,
                        dtype=model.dtype)


def frozen_gate_response(step: float, rate: float, D: int, *, B: float = 1.0, C: float = 1.0) -> float:
    """The lag-D response abs(L_D) of one frozen-gate mode Ā = e^{−Δa}, B̄ = ΔB, C ({prf:ref}`prop-frozen-gate`).

    step = Δ > 0, rate = a > 0, D >= 0 the distance; B, C the mode's real scalars. Read from
    `lag_norms` of that one-state LinearSSM (doubling), not from the closed form
    abs(CB) Δ e^{−ΔaD}, so comparing the two checks one route against another.
    """
    step = check_real(step, "step", positive=True)
    rate = check_real(rate, "rate", positive=True)
    D = check_int(D, "D", minimum=0)
    B, C = check_real(B, "B"), check_real(C, "C")
    mode = LinearSSM([[math.exp(-step * rate)]], [[step * B]], [[C]])
    return float(_lag_norms(mode, D + 1)[D])


@dataclass(frozen=True)
class FrozenGateSearch:
    """The largest abs(L_D) over a grid of steps Δ and rates a, and where (`frozen_gate_search`)."""

    response: float
    step: float
    rate: float


def frozen_gate_search(D: int, steps: Any, rates: Any, *, B: float = 1.0, C: float = 1.0) -> FrozenGateSearch:
    """max over Δ in steps and a in rates of `frozen_gate_response(Δ, a, D, B=B, C=C)`.

    {prf:ref}`prop-frozen-gate` 1: with every rate >= a_min the maximum cannot exceed
    abs(CB)/(e a_min D), and a grid holding a = a_min and Δ = 1/(a_min D) attains it. steps,
    rates: non-empty 1-d sequences of positive numbers; D >= 1. Ties go to the first maximum
    (steps outer, rates inner).
    """
    D = check_int(D, "D", minimum=1)
    grids = []
    for name, values in (("steps", steps), ("rates", rates)):
        values = np.asarray(values, dtype=float) if not isinstance(values, (str, bytes)) else None
        if values is None or values.ndim != 1 or values.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-d sequence of numbers > 0")
        if not np.all(np.isfinite(values)) or np.any(values <= 0):
            raise ValueError(f"{name} must hold finite numbers > 0")
        grids.append(values)
    best = FrozenGateSearch(response=-1.0, step=math.nan, rate=math.nan)
    for step in grids[0]:
        for rate in grids[1]:
            response = frozen_gate_response(float(step), float(rate), D, B=B, C=C)
            if response > best.response:
                best = FrozenGateSearch(response=response, step=float(step), rate=float(rate))
    return best


def _gate(model: SelectiveSSM | SSD) -> tuple[np.ndarray, np.ndarray]:
    # (W_Δ, b_Δ): (d, d) and (d,) per channel for a SelectiveSSM; (H, d) and (H,) per head for an SSD.
    return _numpy(model._W_delta), _numpy(model._b_delta)


def gate_closing_input(model: SelectiveSSM | SSD, n: int, j: int, *, closing: float = 40.0, opening: float = 0.0,
                       seed: Any = 0) -> np.ndarray:
    """An input (n, d) that writes token j into the state, then closes every gate.

    {prf:ref}`cor-gate-closing`: x_t = 0 for t < j; x_j = w with W_Δ w + b_Δ = opening · 1 (a
    seeded N(0, I) token projected onto that plane); x_t = u with W_Δ u + b_Δ = −μ 1, μ =
    closing, for t > j (least norm), so every later step is softplus(−μ) < e^{−μ}.

    Args: model, a SelectiveSSM or SSD whose W_Δ has full row rank (ValueError otherwise);
    n; 0 <= j < n; closing > 0; opening; seed.
    """
    _require(model, "model", SelectiveSSM, SSD)
    n = check_int(n, "n")
    j = _position(j, "j", n)
    closing = check_real(closing, "closing", positive=True)
    opening = check_real(opening, "opening")
    W, b = _gate(model)
    _full_row_rank(W, f"model's gate weights W_Δ (shape {W.shape}) must have full row rank to close every "
                      "gate at once; got a rank-deficient W_Δ")
    z = np.linalg.lstsq(W, -closing - b, rcond=None)[0]
    u = np.random.default_rng(seed).standard_normal(model.d)
    w = u + np.linalg.lstsq(W, opening - b - W @ u, rcond=None)[0]
    X = np.zeros((n, model.d))
    X[j] = w
    X[j + 1:] = z
    return X


@dataclass(frozen=True)
class SelectivePath:
    """J_ij = Σ_k exp(−rates[k] · steps[k]) modes[k] ({prf:ref}`prop-selective-gradient`).

    Modes: (channel, state) pairs of a SelectiveSSM, heads of an SSD, plus for j = i one mode
    of rate 0 through C_i. block (p, d); modes (K, p, d); rates (K,) >= 0; steps (K,), the
    accumulated step Σ_{t=j+1}^{i} Δ_t of each mode's channel or head.
    """

    block: np.ndarray
    modes: np.ndarray
    rates: np.ndarray
    steps: np.ndarray

    @property
    def undecayed(self) -> np.ndarray:
        """Σ_k modes[k], the block with every accumulated step set to 0, shape (p, d)."""
        return self.modes.sum(0)


def selective_jacobian(model: SelectiveSSM | SSD, X: Any, i: int, j: int) -> SelectivePath:
    """J_ij of a SelectiveSSM or SSD in closed form, without autograd ({prf:ref}`prop-selective-gradient`).

    The state s_t is run forward in numpy, ∂s_j/∂x_j differentiated by hand (through Δ_j, B_j
    and x_j), and carried by exp(A τ). Args: X, one sequence (n, d); positions 0 <= j <= i < n.
    """
    _require(model, "model", SelectiveSSM, SSD)
    X, i, j = _path(model, X, i, j)
    n, d = X.shape
    W_delta, b_delta = _gate(model)
    W_B, W_C = _numpy(model._W_B), _numpy(model._W_C)
    pre = X @ W_delta.T + b_delta           # (n, d) or (n, H)
    delta, slope = np.logaddexp(0.0, pre), np.exp(-np.logaddexp(0.0, -pre))  # softplus, sigmoid
    Bt, Ct = X @ W_B.T, X @ W_C.T           # (n, N)
    tau = delta[j + 1: i + 1].sum(0)        # accumulated step per channel / head
    if isinstance(model, SelectiveSSM):
        A = -np.exp(_numpy(model._A_log))   # (d, N)
        h = np.zeros((d, model.N))          # the state s_t
        for t in range(j):                  # s_{j−1}
            h = np.exp(delta[t][:, None] * A) * h + (delta[t] * X[t])[:, None] * Bt[t][None, :]
        decay_j = np.exp(delta[j][:, None] * A)
        u = A * decay_j * h + X[j][:, None] * Bt[j][None, :]          # ∂s_j[q]/∂Δ_j[q], (d, N)
        G = (u * slope[j][:, None])[:, :, None] * W_delta[:, None, :]  # through Δ_j, (d, N, d)
        G += (delta[j] * X[j])[:, None, None] * W_B[None]             # through B_j
        G[np.arange(d), :, np.arange(d)] += delta[j][:, None] * Bt[j][None, :]  # through x_j[c]
        modes = np.zeros((d, model.N, d, d))
        modes[np.arange(d), :, np.arange(d), :] = Ct[i][None, :, None] * G   # row q of the block
        modes = modes.reshape(d * model.N, d, d)
        rates, steps = -A.reshape(-1), np.repeat(tau, model.N)
        if i == j:
            h_i = decay_j * h + (delta[j] * X[j])[:, None] * Bt[j][None, :]
            modes = np.concatenate([modes, (h_i @ W_C)[None]])
    else:
        H, d_h = model.H, d // model.H
        a = -np.exp(_numpy(model._A_log))   # (H,)
        W_O = _numpy(model._W_O)            # (p, d)
        h = np.zeros((H, model.N, d_h))
        heads = X.reshape(n, H, d_h)
        for t in range(j):
            drive = delta[t][:, None, None] * Bt[t][None, :, None] * heads[t][:, None, :]
            h = np.exp(delta[t] * a)[:, None, None] * h + drive
        overlap = Bt[j] @ Ct[i]
        modes = np.zeros((H, W_O.shape[0], d))
        for k in range(H):
            carried = np.exp(delta[j, k] * a[k]) * h[k].T @ Ct[i]               # (s^k_{j−1})ᵀ C_i, (d_h,)
            dq = np.outer(a[k] * carried + heads[j, k] * overlap, slope[j, k] * W_delta[k])  # through Δ_j
            dq[:, k * d_h:(k + 1) * d_h] += delta[j, k] * overlap * np.eye(d_h)             # through x_j^{(k)}
            dq += delta[j, k] * np.outer(heads[j, k], Ct[i] @ W_B)                          # through B_j
            modes[k] = W_O[:, k * d_h:(k + 1) * d_h] @ dq
        rates, steps = -a, tau.copy()
        if i == j:
            h_i = (np.exp(delta[j] * a)[:, None, None] * h
                   + delta[j][:, None, None] * Bt[j][None, :, None] * heads[j][:, None, :])    # (H, N, d_h)
            through_C = np.concatenate([h_i[k].T @ W_C for k in range(H)])                   # (d, d)
            modes = np.concatenate([modes, (W_O @ through_C)[None]])
    if i == j:  # the mode through C_i does not decay
        rates, steps = np.append(rates, 0.0), np.append(steps, 0.0)
    with np.errstate(under="ignore"):
        block = np.einsum("k,kpd->pd", np.exp(-rates * steps), modes)
    return SelectivePath(block=block, modes=modes, rates=rates, steps=steps)


def gate_closing_profile(model: SelectiveSSM | SSD, n: int, distances: Any, *, closing: float = 40.0,
                         seed: int = 0) -> np.ndarray:
    """‖J_{n−1, n−1−D}‖_F for each D in distances, each on `gate_closing_input(model, n,
    n − 1 − D, closing=closing, seed=seed)`, shape (len(distances),).

    {prf:ref}`cor-gate-closing`: flat in D up to a relative a_max D e^{−closing}.
    distances: integers in [0, n − 1].
    """
    _require(model, "model", SelectiveSSM, SSD)
    n = check_int(n, "n")
    return np.array([jacobian_norms(model, gate_closing_input(model, n, n - 1 - D, closing=closing, seed=seed),
                                    n - 1)[n - 1 - D] for D in _distances(distances, n, 0)])


@dataclass(frozen=True)
class GateClosingCheck:
    """{prf:ref}`cor-gate-closing` measured on gate-closing inputs (`gate_closing_check`).

    ratio, the largest ‖J_ij − J⁰‖_F over its bound a_max D e^{−μ} Σ_k ‖T_k‖_F (at most 1
    where the corollary holds; J_ij by autograd, J⁰ and the T_k from `selective_jacobian` at
    D = 1); spread, the largest ‖J⁰(D) − J⁰(1)‖_F / ‖J⁰(1)‖_F (0 predicted: J⁰ does not
    depend on D).
    """

    ratio: float
    spread: float


def gate_closing_check(model: SelectiveSSM | SSD, n: int, *, closing: float = 40.0, seed: int = 0) -> GateClosingCheck:
    """Check {prf:ref}`cor-gate-closing` at every distance D = 1..n−1 (`GateClosingCheck`).

    The input for D is `gate_closing_input(model, n, n − 1 − D, closing=closing, seed=seed)`;
    μ = closing. The bound gets 1e-12 ‖J⁰‖ of slack (rounding of J_ij itself). n >= 2.
    """
    _require(model, "model", SelectiveSSM, SSD)
    n = check_int(n, "n", minimum=2)
    closing = check_real(closing, "closing", positive=True)
    last, J0, ratio, spread = n - 1, None, 0.0, 0.0
    for D in range(1, n):
        X = gate_closing_input(model, n, last - D, closing=closing, seed=seed)
        path = selective_jacobian(model, X, last, last - D)
        J0 = path.undecayed if J0 is None else J0
        J = jacobian_blocks(model, X, last)[last - D]
        allowed = path.rates.max() * D * math.exp(-closing) * np.linalg.norm(path.modes, axis=(1, 2)).sum()
        ratio = max(ratio, float(np.linalg.norm(J - J0) / (allowed + 1e-12 * np.linalg.norm(J0))))
        spread = max(spread, float(np.linalg.norm(path.undecayed - J0) / np.linalg.norm(J0)))
    return GateClosingCheck(ratio=ratio, spread=spread)


# -- nonlinear RNNs --------------------------------------------------------------------------------


def saturation_subset(rnn: ElmanRNN) -> tuple[tuple[int, ...], float]:
    """(S, ρ(W_SS)): the state coordinates whose principal block of W has the largest spectral radius.

    {prf:ref}`prop-rnn-gradient`: saturating the coordinates outside S makes J at distance D
    tend to C_{:,S} W_SS^D U_{S,:}. Exhaustive over the 2^N − 1 subsets (rnn.N <= 12); S is a
    sorted tuple of 0-based indices, ties to the smallest S by size, then lexicographic.
    """
    _require(rnn, "rnn", ElmanRNN)
    if rnn.N > 12:
        raise ValueError(f"rnn must have N <= 12 state coordinates for the exhaustive search; got N = {rnn.N}")
    W = rnn.W.astype(float)
    best, radius = (), -1.0
    for size in range(1, rnn.N + 1):
        for S in itertools.combinations(range(rnn.N), size):
            value = float(np.abs(np.linalg.eigvals(W[np.ix_(S, S)])).max())
            if value > radius * (1 + 1e-12):
                best, radius = S, value
    return best, radius


def saturating_input(rnn: ElmanRNN, n: int, subset: Any = None, *, saturation: float = 20.0) -> np.ndarray:
    """An input (n, d) holding every pre-activation at z* (0 on S, `saturation` off S).

    {prf:ref}`prop-rnn-gradient` 2: x_0 = U⁺z*, x_t = U⁺(z* − W tanh z*), so every Φ_t is the
    same and J_ij = C (ΦW)^{i−j} Φ U for all j <= i. Args: rnn, an ElmanRNN whose U (N, d) has
    full row rank (ValueError otherwise); n; subset, distinct indices in [0, N) (default
    `saturation_subset(rnn)[0]`); saturation > 0.
    """
    _require(rnn, "rnn", ElmanRNN)
    n = check_int(n, "n")
    saturation = check_real(saturation, "saturation", positive=True)
    N = rnn.N
    if subset is None:
        subset = saturation_subset(rnn)[0]
    if isinstance(subset, (str, bytes)) or not hasattr(subset, "__iter__"):
        raise TypeError(f"subset must be a collection of state indices; got {type(subset).__name__}")
    subset = tuple(check_int(k, "subset entries", minimum=0) for k in subset)
    if len(set(subset)) != len(subset) or any(k >= N for k in subset):
        raise ValueError(f"subset must hold distinct indices in [0, N = {N}); got {subset}")
    W, U = rnn.W.astype(float), rnn.U.astype(float)
    _full_row_rank(U, f"rnn.U (shape {U.shape}) must have full row rank N = {N} for the inputs to set every "
                      "pre-activation")
    target = np.full(N, saturation)
    target[list(subset)] = 0.0
    X = np.empty((n, rnn.d))
    X[0] = np.linalg.lstsq(U, target, rcond=None)[0]
    X[1:] = np.linalg.lstsq(U, target - W @ np.tanh(target), rcond=None)[0]
    return X


def rnn_jacobian(rnn: ElmanRNN, X: Any, i: int, j: int) -> np.ndarray:
    """J_ij = C Φ_i W Φ_{i−1} ⋯ W Φ_j U of an Elman RNN without autograd, shape (p, d).

    {prf:ref}`prop-rnn-gradient`; Φ_t = diag(sech² z_t) from a numpy run of the recurrence
    (sech² directly, so saturated slopes keep their digits). X (n, d); 0 <= j <= i < n.
    """
    _require(rnn, "rnn", ElmanRNN)
    X, i, j = _path(rnn, X, i, j)
    W, U, C = rnn.W.astype(float), rnn.U.astype(float), rnn.C.astype(float)
    s, slopes = np.zeros(rnn.N), []
    for t in range(i + 1):
        z = W @ s + U @ X[t]
        with np.errstate(over="ignore"):
            slopes.append(1.0 / np.cosh(z) ** 2)
        s = np.tanh(z)
    M = slopes[j][:, None] * U
    for t in range(j + 1, i + 1):
        M = slopes[t][:, None] * (W @ M)
    return C @ M
