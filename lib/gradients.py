"""Gradient paths through sequence maps: Jacobian profiles, bounds, adversarial inputs.

The Jacobian block J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} (0-based positions) says how strongly
the output at position i reacts to the token at position j; its norm as a function
of the distance i − j is the model's *gradient profile*.  The chapter's statements
carry two quantifiers:

- for every input: a stable LTI SSM ({prf:ref}`thm-ssm-gradient-decay`), a stack of
  them ({prf:ref}`prop-stack-decay`), a tanh RNN with ‖ΛWΛ⁻¹‖₂ < 1
  ({prf:ref}`prop-rnn-gradient`) attenuate exponentially, whatever X is;
- for some inputs: softmax and linear attention (a planted key,
  {prf:ref}`prop-attention-highway`), selective SSMs and SSD (gates closed after j,
  {prf:ref}`cor-gate-closing`) and RNNs with an expanding principal block of W
  (saturated coordinates) keep ‖J_ij‖ from decaying with the distance.

Measured side (autograd): `jacobian_blocks`, `jacobian_norms`.  Closed forms (no
autograd): `lag_norms`, `selective_jacobian`, `rnn_jacobian`; bounds: `ssm_decay_bound`,
`stack_decay_bound`.  Adversarial inputs: `planted_key_input`, `gate_closing_input`,
`saturating_input` (with `saturation_subset`).  Also `fit_decay_rate` (an exponential
rate with an interval), `one_hop`, `with_constant_step` (a frozen gate,
{prf:ref}`prop-frozen-gate`) and `gradient_reach`.
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

__all__ = [
    "jacobian_blocks",
    "jacobian_norms",
    "lag_norms",
    "DecayBound",
    "ssm_decay_bound",
    "stack_decay_bound",
    "DecayFit",
    "fit_decay_rate",
    "planted_key_input",
    "one_hop",
    "with_constant_step",
    "gradient_reach",
    "gate_closing_input",
    "SelectivePath",
    "selective_jacobian",
    "saturation_subset",
    "saturating_input",
    "rnn_jacobian",
]


def _check_model(model: Any, name: str = "model", kind: type = SequenceMap) -> None:
    if not isinstance(model, kind):
        raise TypeError(f"{name} must be a {kind.__name__} from lib; got {type(model).__name__}")


def _check_position(value: Any, name: str, n: int) -> int:
    # A 0-based position in [0, n).
    value = check_int(value, name, minimum=0)
    if value >= n:
        raise ValueError(f"{name} must satisfy 0 <= {name} < n = {n}; got {value}")
    return value


def _one_sequence(model: SequenceMap, X: Any) -> torch.Tensor:
    # X of shape (n, d) as a fresh leaf tensor of shape (n, d) in the model's dtype.
    tensor, batched, _ = as_sequence(X, model.d, dtype=model.dtype, max_length=model.max_length)
    if batched:
        raise ValueError(f"X must have shape (n, {model.d}) (one sequence); got {tuple(tensor.shape)}")
    return tensor[0].detach().clone()


def _block_norms(blocks: np.ndarray) -> np.ndarray:
    """Frobenius norms over the last two axes without underflow: ‖M‖ = s ‖M/s‖, s = max|M|.

    Squaring entries below ~1e-154 underflows, so the plain formula would return 0
    (or lose digits) for the far, tiny blocks of a decaying profile.
    """
    scale = np.abs(blocks).max(axis=(-2, -1))
    safe = np.where(scale > 0, scale, 1.0)
    return scale * np.linalg.norm(blocks / safe[..., None, None], axis=(-2, -1))


# -- measured profiles ------------------------------------------------------


def jacobian_blocks(model: SequenceMap, X: Any, i: int) -> np.ndarray:
    """The Jacobian blocks J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} for j = 0..i, by reverse-mode autodiff.

    Read off p reverse-mode passes from y_i (one vector–Jacobian product eᵀ_k ∂y_i/∂X
    per output coordinate k), so the cost is p backward passes whatever n is; the full
    (np) × (nd) Jacobian is never formed.  This is the measured side of every check in
    the gradient-highway chapter: the closed forms (`lag_norms`, `selective_jacobian`,
    `rnn_jacobian`) are computed without autograd.

    Args:
        model: any lib SequenceMap (d inputs, p outputs).
        X: one sequence, shape (n, d); numpy array or torch tensor (not modified,
            not part of any caller graph: it is copied and detached).
        i: output position, 0 <= i < n.

    Returns:
        blocks, numpy float64 array of shape (i + 1, p, d): blocks[j] = J_ij.  For
        non-causal models only j <= i is reported.
    """
    _check_model(model)
    X = _one_sequence(model, X)
    i = _check_position(i, "i", X.shape[0])
    X.requires_grad_(True)
    with torch.enable_grad():
        y = model(X)[i]  # (p,)
        if not y.requires_grad:  # y_i does not depend on X at all
            return np.zeros((i + 1, model.p, model.d))
        rows = [torch.autograd.grad(y[k], X, retain_graph=k + 1 < y.shape[0], allow_unused=True)[0]
                for k in range(y.shape[0])]
    # A y_i that ignores X (allow_unused) has no gradient: it is 0.
    J = torch.stack([torch.zeros_like(X) if row is None else row for row in rows])  # (p, n, d) = ∂y_i/∂X
    return J[:, : i + 1].transpose(0, 1).detach().to(torch.float64).numpy()


def jacobian_norms(model: SequenceMap, X: Any, i: int) -> np.ndarray:
    """Frobenius norms ‖∂y_i/∂x_j‖_F for j = 0..i, the gradient profile seen from output i.

    The norms of `jacobian_blocks` (p reverse-mode passes from y_i), taken without
    underflow.  For an LTI SSM, J_ij = C A^{i−j} B = L_{i−j} for every X
    ({prf:ref}`thm-ssm-gradient-decay`), so the result equals `lag_norms` reversed.

    Args:
        model: any lib SequenceMap (d inputs, p outputs).
        X: one sequence, shape (n, d); numpy array or torch tensor (not modified).
        i: output position, 0 <= i < n.

    Returns:
        norms, numpy float64 array of shape (i + 1,): norms[j] = ‖J_ij‖_F.  Indexed
        by the *position* j; the distance is i − j, so `norms[::-1]` is indexed by
        distance.  For non-causal models only j <= i is reported.
    """
    return _block_norms(jacobian_blocks(model, X, i))


def lag_norms(ssm: LinearSSM, n: int) -> np.ndarray:
    """‖L_ℓ‖_F = ‖C A^ℓ B‖_F for ℓ = 0..n−1: an LTI SSM's gradient profile in closed form.

    By {prf:ref}`thm-ssm-gradient-decay`, J_ij = L_{i−j} for every input, so this is
    `jacobian_norms(ssm, X, i)[::-1]` for any X without running the model; computed
    from `ssm.lags(n)` (doubling), it reaches n = 10⁵ in well under a second for
    small N, d, p.  Far lags underflow to exactly 0 once ρ^ℓ < 1e-308.

    Args:
        ssm: a LinearSSM.
        n: number of lags (distances 0..n−1).

    Returns:
        norms, numpy array of shape (n,), indexed by distance ℓ.
    """
    _check_model(ssm, "ssm", LinearSSM)
    n = check_int(n, "n")
    return _block_norms(ssm.lags(n).astype(np.float64))


# -- the LTI bound ----------------------------------------------------------


@dataclass(frozen=True)
class DecayBound:
    """The bound ‖J_ij‖_F <= scale · rate^{i−j} of {prf:ref}`thm-ssm-gradient-decay`.

    Attributes:
        constant: K = κ₂(P) = ‖P‖₂‖P⁻¹‖₂ for A = P Λ P⁻¹ (unit-norm eigenvector columns).
        rate: r = ρ(A).
        scale: K ‖C‖₂ ‖B‖_F.
    """

    constant: float
    rate: float
    scale: float

    def at(self, distances: Any) -> np.ndarray:
        """scale · rate^ℓ at the given distances ℓ >= 0, same shape (0^0 = 1)."""
        ell = np.asarray(distances, dtype=float)
        if np.any(ell < 0) or not np.all(np.isfinite(ell)):
            raise ValueError("distances must be finite and >= 0")
        with np.errstate(under="ignore"):
            return self.scale * np.power(self.rate, ell)


def ssm_decay_bound(ssm: LinearSSM) -> DecayBound:
    """The exact-rate bound ‖C A^ℓ B‖_F <= κ₂(P) ‖C‖₂ ‖B‖_F ρ(A)^ℓ for diagonalisable A.

    Implements the diagonalisable case of {prf:ref}`thm-ssm-gradient-decay`: with
    A = P Λ P⁻¹, ‖A^ℓ‖₂ = ‖P Λ^ℓ P⁻¹‖₂ <= κ₂(P) ρ^ℓ, and ‖C M B‖_F <= ‖C‖₂ ‖M‖₂ ‖B‖_F.
    It holds for all ℓ and all inputs (J_ij = C A^{i−j} B does not depend on X).
    Deviation: the Frobenius norm is used for J and B (the book states operator
    norms; this is the form checked numerically); the constant uses numpy's
    unit-norm eigenvectors, within √N of the best diagonal scaling (van der Sluis).

    Args:
        ssm: a LinearSSM whose A is diagonalisable.

    Returns:
        DecayBound with constant κ₂(P), rate ρ(A), scale κ₂(P)‖C‖₂‖B‖_F.

    Raises:
        ValueError: if A is numerically defective (κ₂(P) > 1e12 or infinite); then
            only the weaker r > ρ form of the theorem applies.
    """
    _check_model(ssm, "ssm", LinearSSM)
    A, B, C = ssm.A.astype(float), ssm.B.astype(float), ssm.C.astype(float)
    eigenvalues, P = np.linalg.eig(A)
    kappa = float(np.linalg.cond(P, 2))
    if not np.isfinite(kappa) or kappa > 1e12:
        raise ValueError(f"ssm must have a diagonalisable A; its eigenvector matrix has condition number {kappa:.3g}")
    scale = kappa * np.linalg.norm(C, 2) * np.linalg.norm(B, "fro")
    return DecayBound(constant=kappa, rate=float(np.abs(eigenvalues).max()), scale=float(scale))


def stack_decay_bound(stack: Stack, n: int, rate: float, *, constants: Any = None) -> np.ndarray:
    """The bound of {prf:ref}`prop-stack-decay` on ‖J_{i,i−D}‖_F, for D = 0..n−1.

    For a stack of L LTI SSM layers whose lags obey ‖L^{(m)}_ℓ‖_F <= K_m r^ℓ, the
    Jacobian at distance D is the lag-D kernel of the composed convolutions, for
    every input, and

        plain stack:     (∏_m K_m) · C(D+L−1, L−1) · r^D,
        residual stack:  [D = 0] ‖I‖_F + Σ_{s=1}^{L} e_s(K_1..K_L) · C(D+s−1, s−1) · r^D,

    with e_s the s-th elementary symmetric polynomial (C(L, s) K^s for equal K_m).
    The residual identity enters through the sum over subsets of layers, not by
    folding I into a layer's constant.  Both are attained with equality by scalar
    layers L_ℓ = K_m r^ℓ.  Computed in logs (K_m and r^{−ℓ} may overflow).
    Deviation: Frobenius norms (submultiplicative, so the proof goes through with
    ‖I‖_F = √d in place of the operator norm's 1).

    Args:
        stack: a Stack whose layers are all LinearSSM (residual or not).
        n: number of distances (D = 0..n−1).
        rate: r in (0, 1); the bound is useful when r >= every layer's ρ(A).
        constants: None (default) for the smallest valid constants over the
            horizon, K_m = max_{ℓ<n} ‖L^{(m)}_ℓ‖_F / r^ℓ (each layer's own lags, no
            identity); or a sequence of L numbers K_m >= 0 (e.g. the κ₂(P)‖C‖₂‖B‖_F
            of `ssm_decay_bound`), which must satisfy the hypothesis on ℓ < n.

    Returns:
        bound, numpy array of shape (n,), indexed by distance D.

    Raises:
        ValueError: if constants[m] does not bound layer m's lags (the hypothesis fails).
    """
    _check_model(stack, "stack", Stack)
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
    distances = np.arange(n)
    log_rate = math.log(rate)
    # r^{-ℓ} overflows for large n; compare in logs instead.
    log_K = []
    for m, layer in enumerate(stack.layers):
        with np.errstate(divide="ignore"):
            log_norms = np.log(_block_norms(layer.lags(n).astype(np.float64)))  # tiny far lags kept
        needed = float(np.max(log_norms - distances * log_rate))
        if constants is None:
            log_K.append(needed)
            continue
        with np.errstate(divide="ignore"):
            given = math.log(constants[m]) if constants[m] > 0 else -math.inf
        if needed > given + 1e-9:
            raise ValueError(f"constants[{m}] = {constants[m]:.6g} does not bound layer {m}'s lags: "
                             f"‖L_ℓ‖_F / r^ℓ reaches {math.exp(min(needed, 700.0)):.6g} for some ℓ < n")
        log_K.append(given)
    # log e_s(K) for s = 0..L by the recursion e_s <- e_s + K_m e_{s-1}.
    log_e = np.full(depth + 1, -np.inf)
    log_e[0] = 0.0
    for lk in log_K:
        log_e[1:] = np.logaddexp(log_e[1:], lk + log_e[:-1])

    def log_compositions(parts: int) -> np.ndarray:  # log C(D + parts − 1, parts − 1): compositions of D
        return np.array([math.log(math.comb(int(D) + parts - 1, parts - 1)) for D in distances])

    with np.errstate(under="ignore"):
        if not stack.residual:
            return np.exp(log_e[depth] + log_compositions(depth) + distances * log_rate)
        terms = [log_e[s] + log_compositions(s) + distances * log_rate for s in range(1, depth + 1)]
        bound = np.exp(np.logaddexp.reduce(np.stack(terms), axis=0))
    bound[0] += math.sqrt(stack.d)  # the empty subset: the identity at lag 0, ‖I‖_F = √d
    return bound


# -- decay-rate fit ---------------------------------------------------------


def _student_t_two_sided(level: float, dof: int) -> float:
    """t with P(|T| <= t) = level for T ~ Student t with `dof` degrees of freedom.

    P(|T| <= t) is the closed form of Abramowitz & Stegun 26.7.3–4 in θ = atan(t/√ν)
    (finite sums of powers of cos θ); it is increasing in θ ∈ (0, π/2), so bisection
    on θ converges to double precision in 60 halvings.
    """

    def coverage(theta: float) -> float:
        s, c2 = math.sin(theta), math.cos(theta) ** 2
        if dof % 2 == 0:  # sin θ (1 + ½cos²θ + (1·3)/(2·4)cos⁴θ + ...), (ν−2)/2 terms after 1
            k = np.arange(1, dof // 2)
            terms = np.cumprod((2 * k - 1) / (2 * k) * c2)
            return s * (1 + terms.sum())
        if dof == 1:
            return 2 * theta / math.pi
        k = np.arange(1, (dof - 1) // 2)  # (2/π)(θ + sin θ cos θ (1 + ⅔cos²θ + ...))
        terms = np.cumprod(2 * k / (2 * k + 1) * c2)
        return 2 / math.pi * (theta + s * math.cos(theta) * (1 + terms.sum()))

    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if coverage(mid) < level else (lo, mid)
    return math.sqrt(dof) * math.tan((lo + hi) / 2)


@dataclass(frozen=True)
class DecayFit:
    """Least-squares fit of log‖J_ℓ‖ = a + ℓ log r over a window of distances.

    Attributes:
        rate: r = exp(slope).
        log_rate: the slope log r.
        log_rate_stderr: its standard error from the regression residuals.
        log_rate_interval: (lo, hi), the `level` confidence interval for log r
            (Student t with points − 2 degrees of freedom).
        rate_interval: (exp(lo), exp(hi)).
        intercept: a, the fitted log‖J_0‖.
        points: number of distances used (inside the window and above the floor).
        level: the confidence level.
    """

    rate: float
    log_rate: float
    log_rate_stderr: float
    log_rate_interval: tuple[float, float]
    rate_interval: tuple[float, float]
    intercept: float
    points: int
    level: float

    def contains(self, rate: float) -> bool:
        """Whether `rate` lies in rate_interval."""
        return self.rate_interval[0] <= rate <= self.rate_interval[1]


def fit_decay_rate(norms: Any, *, start: int = 0, stop: int | None = None, floor: float = 1e-300,
                   level: float = 0.95) -> DecayFit:
    """Fit an exponential rate r to a gradient profile: log‖J_ℓ‖ ≈ a + ℓ log r.

    Ordinary least squares on the points (ℓ, log norms[ℓ]) for start <= ℓ < stop and
    norms[ℓ] > floor (the floor drops exact zeros and underflowed, subnormal values).
    The standard error of the slope is s / √Σ(ℓ − ℓ̄)² with s² = RSS / (m − 2).

    What it assumes: the deviations from the line behave like independent noise of
    constant size.  For an LTI SSM they are deterministic instead — a transient
    Σ_k c_k (λ_k/ρ)^ℓ from the non-dominant eigenvalues (start the window late to
    suppress it) and, for a complex dominant pair, a bounded oscillation (fit over
    many periods).  The interval is then a measure of how well one exponential
    describes the window, not a probability statement.  The slope recovers log ρ
    of {prf:ref}`thm-ssm-gradient-decay` for diagonalisable A.

    Args:
        norms: profile indexed by distance, shape (m,), entries >= 0 (for the
            output of `jacobian_norms`, pass `norms[::-1]`).
        start: first distance of the window.
        stop: one past the last distance (default: len(norms)).
        floor: norms <= floor are skipped.
        level: confidence level of the intervals, 0 < level < 1.

    Returns:
        DecayFit.

    Raises:
        ValueError: if fewer than 3 points remain (the residuals need a degree of freedom).
    """
    if isinstance(norms, np.ndarray):
        norms = np.ascontiguousarray(norms)  # reversed views (norms[::-1]) have negative strides
    y, _ = as_real_tensor(norms, "norms", dtype=torch.float64)
    if y.ndim != 1:
        raise ValueError(f"norms must have shape (m,); got {tuple(y.shape)}")
    y = y.detach().numpy()
    if np.any(y < 0):
        raise ValueError("norms must be >= 0")
    start = check_int(start, "start", minimum=0)
    stop = len(y) if stop is None else check_int(stop, "stop", minimum=1)
    if not start < stop <= len(y):
        raise ValueError(f"start and stop must satisfy 0 <= start < stop <= len(norms) = {len(y)}; "
                         f"got start = {start}, stop = {stop}")
    floor = check_real(floor, "floor", nonnegative=True)
    level = check_real(level, "level")
    if not 0 < level < 1:
        raise ValueError(f"level must satisfy 0 < level < 1; got {level}")
    ell = np.arange(start, stop, dtype=float)
    window = y[start:stop]
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
    half = _student_t_two_sided(level, m - 2) * stderr
    lo, hi = slope - half, slope + half
    return DecayFit(rate=math.exp(slope), log_rate=slope, log_rate_stderr=stderr, log_rate_interval=(lo, hi),
                    rate_interval=(math.exp(lo), math.exp(hi)), intercept=intercept, points=m, level=level)


# -- the planted key --------------------------------------------------------


def planted_key_input(attention: SoftmaxAttention | LinearAttention, n: int, i: int, j: int, *,
                      strength: float = 30.0, head: int = 0, scale: float = 1.0, seed: Any = 0) -> np.ndarray:
    """An input on which query i of one head attends (almost) only to key j.

    The construction behind {prf:ref}`prop-attention-highway`.  Background tokens
    are iid N(0, scale² I_d); only the token at j is replaced.

    Softmax attention: with g_h = W_Kᵀ W_Q x_i / √d_k for each head h, x_j is the
    least-norm solution of

        g_h · x_j + b_h[i − j] = +strength   for the chosen head,
        g_h · x_j + b_h[i − j] = −strength   for every other head,

    so the chosen head's score for key j is `strength` (b is the position bias,
    if any) while the other heads' scores for it are −strength.  Then
    1 − α^head_ij = Σ_{t≠j} e^{s_it} / (e^{strength} + Σ_{t≠j} e^{s_it}): the weight
    is >= 1 − ε exactly when strength >= logsumexp_{t≠j} s_it + ln((1−ε)/ε), a
    margin that grows like ln i with the number of competing keys
    ({prf:ref}`cor-attention-price`).

    Linear attention (feature map elu + 1): x_j is the least-norm solution of
    W_K^head x_j = strength·1 and W_K^h x_j = −strength·1 for the other heads, so
    φ(k^head_j) = (strength + 1)·1 and φ(k^h_j) = e^{−strength}·1: key j's kernel
    φ(q_i)ᵀφ(k_j) grows linearly in `strength` for the chosen head (1 − α = O(1/strength))
    and vanishes for the others.

    Note the quantifier: this is *one* input per (i, j) — the proposition says such
    inputs exist at every distance, not that attention keeps every gradient.

    Args:
        attention: a SoftmaxAttention (any number of heads H <= d) or a
            LinearAttention (H·d_k <= d).
        n: sequence length.
        i: query position, 0 <= i < n.
        j: key position, 0 <= j < n, j != i (j < i if the attention is causal).
        strength: the planted score (softmax) or key coordinate (linear), > 0.
        head: the head that should lock onto key j, 0 <= head < H.
        scale: standard deviation of the background tokens, >= 0.
        seed: seed of the background (numpy Generator).

    Returns:
        X, numpy array of shape (n, d), in float64.

    Raises:
        ValueError: if the key cannot be planted (H > d or a zero query for softmax
            attention; stacked key maps without full row rank for linear attention).
    """
    if not isinstance(attention, (SoftmaxAttention, LinearAttention)):
        raise TypeError(f"attention must be a SoftmaxAttention or a LinearAttention from lib; "
                        f"got {type(attention).__name__}")
    n = check_int(n, "n")
    if attention.max_length is not None and n > attention.max_length:
        raise ValueError(f"n must be <= {attention.max_length} for this model; got {n}")
    i, j = _check_position(i, "i", n), _check_position(j, "j", n)
    if j == i:
        raise ValueError(f"j must differ from i; got i = j = {i}")
    if attention.causal and j > i:
        raise ValueError(f"j must be < i for causal attention; got i = {i}, j = {j}")
    strength = check_real(strength, "strength", positive=True)
    head = check_int(head, "head", minimum=0)
    if head >= attention.H:
        raise ValueError(f"head must satisfy 0 <= head < H = {attention.H}; got {head}")
    scale = check_real(scale, "scale", nonnegative=True)
    rng = np.random.default_rng(seed)
    X = scale * rng.standard_normal((n, attention.d))
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
        problem = ("the key directions W_Kᵀq_i of the heads are linearly dependent (H > d or a zero query)")
    x_j, *_ = np.linalg.lstsq(G, target, rcond=None)
    if not np.allclose(G @ x_j, target, rtol=1e-8, atol=1e-8 * strength):
        raise ValueError(f"attention cannot be planted at this query: {problem}")
    X[j] = x_j
    return X


def one_hop(attention: SoftmaxAttention | LinearAttention, X: Any, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights α^h_ij and the one-hop term Σ_h α^h_ij V_h of ∂y_i/∂x_j.

    For softmax attention (j != i)

        ∂y_i/∂x_j = Σ_h α^h_ij V_h + Σ_h α^h_ij V_h (x_j − x̄^h_i) (W_K^hᵀ q^h_i)ᵀ / √d_k,

    with x̄^h_i = Σ_t α^h_it x_t: the one-hop term (which equals the operator block
    𝒲_ij(X)) plus terms through the softmax weights.  On a planted key the second
    sum is O((1 − α) · strength) and the first is ≈ V_head
    ({prf:ref}`prop-attention-highway`).  For linear attention the weights are the
    normalised kernels φ(q_i)ᵀφ(k_j) / Σ_t φ(q_i)ᵀφ(k_t) and the one-hop term is again 𝒲_ij(X).

    Args:
        attention: a SoftmaxAttention or LinearAttention with H heads.
        X: one sequence, shape (n, d).
        i, j: positions, 0 <= i, j < n.

    Returns:
        (weights of shape (H,), one-hop term of shape (p, d)), numpy arrays.
    """
    if not isinstance(attention, (SoftmaxAttention, LinearAttention)):
        raise TypeError(f"attention must be a SoftmaxAttention or a LinearAttention from lib; "
                        f"got {type(attention).__name__}")
    X = _one_sequence(attention, X)
    n = X.shape[0]
    i, j = _check_position(i, "i", n), _check_position(j, "j", n)
    with torch.no_grad():
        alpha = attention.weights(X)[:, i, j]  # (H,)
        term = torch.einsum("h,hpd->pd", alpha, torch.as_tensor(attention.values(), dtype=attention.dtype))
    return alpha.numpy().astype(float), term.numpy().astype(float)


# -- selective SSMs -----------------------------------------------------------


def with_constant_step(model: SelectiveSSM, step: float) -> SelectiveSSM:
    """The same selective SSM with its gate frozen: Δ_t = step for every token.

    For the selective SSM of {prf:ref}`prop-selective-ssm`: sets W_Δ = 0 and
    b_Δ = softplus⁻¹(step), keeping A, W_B, W_C.  Then A_t = exp(step · A) for
    every t: an LTI SSM in Mamba's parametrisation.  A small step makes A_t ≈ I, so
    the Jacobian decays only like exp(−step · min|A| · (i − j)) — but the input
    enters as step · B_t x_t, so for j < i every J_ij shrinks in proportion to step
    as well.  For one mode with a *fixed* rate a the best lag-D response over the
    step, max_Δ Δ e^{−Δ a D} = 1/(e a D), is attained at Δ = 1/(a D)
    ({prf:ref}`prop-frozen-gate`); with a learnable rate the 1/D price disappears.

    Args:
        model: a SelectiveSSM.
        step: Δ > 0.

    Returns:
        A new SelectiveSSM of the same sizes and dtype (parameters copied).
    """
    _check_model(model, "model", SelectiveSSM)
    step = check_real(step, "step", positive=True)
    bias = step + math.log(-math.expm1(-step))  # softplus(bias) = step
    return SelectiveSSM(model.A_log, np.zeros_like(model.W_delta), np.full(model.d, bias), model.W_B, model.W_C,
                        dtype=model.dtype)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().to(torch.float64).numpy()


def _gate(model: SelectiveSSM | SSD) -> tuple[np.ndarray, np.ndarray]:
    # (W_Δ, b_Δ): (d, d) and (d,) for SelectiveSSM (per channel), (H, d) and (H,) for SSD (per head).
    return _numpy(model._W_delta), _numpy(model._b_delta)


def _softplus(u: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, u)


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -u))


def gate_closing_input(model: SelectiveSSM | SSD, n: int, j: int, *, closing: float = 40.0, opening: float = 0.0,
                       seed: Any = 0) -> np.ndarray:
    """An input that writes token j into the state and then closes every gate.

    The construction of {prf:ref}`cor-gate-closing`.  With W_Δ, b_Δ the gate's
    weights (per channel for a SelectiveSSM, W_Δ of shape (d, d); per head for an
    SSD, shape (H, d)):

        x_t = 0 for t < j        (the state stays exactly 0: the drive Δ_t B_t x_t vanishes),
        x_j = w  with W_Δ w + b_Δ = opening · 1   (an open gate writes x_j),
        x_t = z  with W_Δ z + b_Δ = −closing · 1  for t > j   (every gate closed).

    After j every step is Δ_t = softplus(−closing) < e^{−closing}, so the accumulated
    step over a distance D is below D e^{−closing} and the gradient from x_j to any
    y_i, i >= j, keeps its D = 0 size up to a relative a_max D e^{−closing}
    ({prf:ref}`prop-selective-gradient`, part (iii)).  z is the least-norm solution;
    w is a seeded N(0, I_d) token projected onto {W_Δ w + b_Δ = opening · 1}.
    The input does not depend on the output position i (causality).

    Args:
        model: a SelectiveSSM or an SSD.
        n: sequence length.
        j: position of the written token, 0 <= j < n.
        closing: M > 0, the (negated) gate pre-activation of the closing tokens.
        opening: the gate pre-activation of token j (0 gives Δ_j = ln 2).
        seed: seed of the random part of w (numpy Generator).

    Returns:
        X, numpy array of shape (n, d), in float64.

    Raises:
        ValueError: if W_Δ does not have full row rank (then no token closes every
            channel or head at once).
    """
    if not isinstance(model, (SelectiveSSM, SSD)):
        raise TypeError(f"model must be a SelectiveSSM or an SSD from lib; got {type(model).__name__}")
    n = check_int(n, "n")
    j = _check_position(j, "j", n)
    closing = check_real(closing, "closing", positive=True)
    opening = check_real(opening, "opening")
    W, b = _gate(model)
    singular = np.linalg.svd(W, compute_uv=False)
    if singular.size < W.shape[0] or singular.min() <= 1e-12 * max(singular.max(), 1e-300):
        raise ValueError(f"model's gate weights W_Δ (shape {W.shape}) must have full row rank to close every "
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
    """The Jacobian block J_ij of a selective SSM or SSD as a sum of decaying modes.

    J_ij = Σ_k exp(−rates[k] · steps[k]) modes[k]  ({prf:ref}`prop-selective-gradient`):
    for a SelectiveSSM the modes are k = (channel c, state m), with
    modes[k] = e_c (C_i[m] ∂h_j[c, m]/∂x_j), rate |A[c, m]| and step τ_c =
    Σ_{t=j+1}^{i} Δ_t[c]; for an SSD they are the heads h, with modes[h] =
    W_O E_h ∂((h^h_j)ᵀ C_i)/∂x_j, rate |a_h| and step τ_h.  For j = i one more
    mode with rate 0 carries the dependence of C_i on x_i.

    Attributes:
        block: J_ij, shape (p, d).
        modes: shape (K, p, d).
        rates: shape (K,), >= 0.
        steps: shape (K,), the accumulated step of each mode's channel or head.
    """

    block: np.ndarray
    modes: np.ndarray
    rates: np.ndarray
    steps: np.ndarray

    @property
    def undecayed(self) -> np.ndarray:
        """Σ_k modes[k]: the block with every accumulated step set to 0, shape (p, d)."""
        return self.modes.sum(0)


def selective_jacobian(model: SelectiveSSM | SSD, X: Any, i: int, j: int) -> SelectivePath:
    """J_ij = ∂y_i/∂x_j of a SelectiveSSM or SSD in closed form, without autograd.

    Implements the formula of {prf:ref}`prop-selective-gradient`: the state is run
    forward in numpy, ∂h_j/∂x_j is differentiated by hand (through Δ_j, B_j and x_j),
    and the carried part is multiplied by exp(A τ) with τ = Σ_{t=j+1}^{i} Δ_t — the
    gates after j do not depend on x_j.  It is the independent route against which
    `jacobian_blocks` (autograd through lib's scan) is checked.

    Args:
        model: a SelectiveSSM (p = d) or an SSD.
        X: one sequence, shape (n, d).
        i, j: positions, 0 <= j <= i < n.

    Returns:
        SelectivePath with block of shape (p, d).
    """
    if not isinstance(model, (SelectiveSSM, SSD)):
        raise TypeError(f"model must be a SelectiveSSM or an SSD from lib; got {type(model).__name__}")
    Xt = _one_sequence(model, X)
    n = Xt.shape[0]
    i, j = _check_position(i, "i", n), _check_position(j, "j", n)
    if j > i:
        raise ValueError(f"j must satisfy j <= i (the layer is causal); got i = {i}, j = {j}")
    X = _numpy(Xt)
    W_delta, b_delta = _gate(model)
    W_B, W_C = _numpy(model._W_B), _numpy(model._W_C)
    pre = X @ W_delta.T + b_delta           # (n, d) or (n, H)
    delta, slope = _softplus(pre), _sigmoid(pre)
    Bt, Ct = X @ W_B.T, X @ W_C.T           # (n, N)
    tau = delta[j + 1: i + 1].sum(0)        # accumulated step per channel / head
    d = model.d
    if isinstance(model, SelectiveSSM):
        A = -np.exp(_numpy(model._A_log))   # (d, N)
        h = np.zeros((d, model.N))
        for t in range(j):                  # h_{j−1}
            h = np.exp(delta[t][:, None] * A) * h + (delta[t] * X[t])[:, None] * Bt[t][None, :]
        decay_j = np.exp(delta[j][:, None] * A)
        u = A * decay_j * h + X[j][:, None] * Bt[j][None, :]          # ∂h_j[c]/∂Δ_j[c], (d, N)
        G = (u * slope[j][:, None])[:, :, None] * W_delta[:, None, :]  # through Δ_j, (d, N, d)
        G += (delta[j] * X[j])[:, None, None] * W_B[None]             # through B_j
        G[np.arange(d), :, np.arange(d)] += delta[j][:, None] * Bt[j][None, :]  # through x_j[c]
        modes = np.zeros((d, model.N, d, d))
        modes[np.arange(d), :, np.arange(d), :] = Ct[i][None, :, None] * G   # row c of the block
        modes = modes.reshape(d * model.N, d, d)
        rates, steps = -A.reshape(-1), np.repeat(tau, model.N)
        if i == j:
            h_i = decay_j * h + (delta[j] * X[j])[:, None] * Bt[j][None, :]
            modes = np.concatenate([modes, (h_i @ W_C)[None]])
            rates, steps = np.append(rates, 0.0), np.append(steps, 0.0)
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
            carried = np.exp(delta[j, k] * a[k]) * h[k].T @ Ct[i]               # (h^k_{j−1})ᵀ C_i, (d_h,)
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
            rates, steps = np.append(rates, 0.0), np.append(steps, 0.0)
    with np.errstate(under="ignore"):
        block = np.einsum("k,kpd->pd", np.exp(-rates * steps), modes)
    return SelectivePath(block=block, modes=modes, rates=rates, steps=steps)


# -- nonlinear RNNs -----------------------------------------------------------


def saturation_subset(rnn: ElmanRNN) -> tuple[tuple[int, ...], float]:
    """The set S of state coordinates whose principal block W_SS has the largest spectral radius.

    Exhaustive over the 2^N − 1 non-empty subsets ({prf:ref}`prop-rnn-gradient`):
    an input that saturates the coordinates outside S and keeps S at 0 makes the
    Jacobian at distance D tend to C_{:,S} W_SS^D U_{S,:}, so max_S ρ(W_SS) — not
    ρ(W) — is the rate no input-independent bound can beat.

    Args:
        rnn: an ElmanRNN with N <= 12 state coordinates.

    Returns:
        (S as a sorted tuple of 0-based indices, ρ(W_SS)); ties go to the smallest S
        in order of size, then lexicographic.
    """
    _check_model(rnn, "rnn", ElmanRNN)
    N = rnn.N
    if N > 12:
        raise ValueError(f"rnn must have N <= 12 state coordinates for the exhaustive search; got N = {N}")
    W = rnn.W.astype(float)
    best, radius = (), -1.0
    for size in range(1, N + 1):
        for S in itertools.combinations(range(N), size):
            value = float(np.abs(np.linalg.eigvals(W[np.ix_(S, S)])).max())
            if value > radius * (1 + 1e-12):
                best, radius = S, value
    return best, radius


def saturating_input(rnn: ElmanRNN, n: int, subset: Any = None, *, saturation: float = 20.0) -> np.ndarray:
    """An input that holds the pre-activations at z_t = z* for every t: 0 on S, `saturation` off S.

    The construction of {prf:ref}`prop-rnn-gradient` (b): with U of full row rank,
    x_0 = U⁺ z* and x_t = U⁺ (z* − W tanh z*) for t >= 1 give z_t = W s_{t−1} + U x_t = z*
    exactly, so every Φ_t = diag(1 − tanh² z*) = P_S + sech²(M) P_{S^c}, and for all
    j <= i the Jacobian is J_ij = C (Φ W)^{i−j} Φ U: one input for every distance.

    Args:
        rnn: an ElmanRNN whose U (shape (N, d)) has full row rank N (so N <= d).
        n: sequence length.
        subset: the unsaturated coordinates S (0-based indices); default
            `saturation_subset(rnn)[0]`.
        saturation: M > 0, the pre-activation of the saturated coordinates.

    Returns:
        X, numpy array of shape (n, d), in float64.

    Raises:
        ValueError: if U does not have full row rank (the inputs cannot set every
            pre-activation), or subset is not a set of distinct indices in [0, N).
    """
    _check_model(rnn, "rnn", ElmanRNN)
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
    singular = np.linalg.svd(U, compute_uv=False)
    if singular.size < N or singular.min() <= 1e-12 * max(singular.max(), 1e-300):
        raise ValueError(f"rnn.U (shape {U.shape}) must have full row rank N = {N} for the inputs to set every "
                         "pre-activation")
    target = np.full(N, saturation)
    target[list(subset)] = 0.0
    X = np.empty((n, rnn.d))
    X[0] = np.linalg.lstsq(U, target, rcond=None)[0]
    X[1:] = np.linalg.lstsq(U, target - W @ np.tanh(target), rcond=None)[0]
    return X


def rnn_jacobian(rnn: ElmanRNN, X: Any, i: int, j: int) -> np.ndarray:
    """J_ij = C Φ_i W Φ_{i−1} W ⋯ Φ_{j+1} W Φ_j U of an Elman RNN, without autograd.

    Φ_t = diag(1 − tanh² z_t) = diag(sech² z_t) with the pre-activations z_t of a
    numpy run of the recurrence ({prf:ref}`prop-rnn-gradient`); sech² is computed
    directly so that saturated slopes (~4e^{−2|z|}) keep their digits.

    Args:
        rnn: an ElmanRNN.
        X: one sequence, shape (n, d).
        i, j: positions, 0 <= j <= i < n.

    Returns:
        J_ij, numpy array of shape (p, d).
    """
    _check_model(rnn, "rnn", ElmanRNN)
    Xt = _one_sequence(rnn, X)
    n = Xt.shape[0]
    i, j = _check_position(i, "i", n), _check_position(j, "j", n)
    if j > i:
        raise ValueError(f"j must satisfy j <= i (the layer is causal); got i = {i}, j = {j}")
    X = _numpy(Xt)
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


def gradient_reach(profile: Any, eps: float = 1e-3) -> int:
    """The largest distance D at which a gradient profile keeps a fraction `eps` of its peak.

    reach = max{D : profile[D] >= eps · max_D' profile[D']}.  For a stable LTI SSM with a
    dominant eigenvalue of modulus ρ and a normal A this is about ln(1/eps)/ln(1/ρ)
    ({prf:ref}`thm-ssm-gradient-decay`; a non-normal A adds its transient); for a
    token-wise layer it is 0; on inputs that open a highway (planted keys, closed gates,
    saturated RNN coordinates) it is the whole sequence.  A reach on random inputs is not
    a statement about every input.

    Args:
        profile: norms indexed by distance, shape (m,), entries >= 0 (for `jacobian_norms`
            output, pass `norms[::-1]`; for several inputs, their elementwise maximum).
        eps: the fraction of the peak that still counts, 0 < eps < 1.

    Returns:
        The reach, an int in [0, m − 1] (0 also for an all-zero profile).
    """
    values, _ = as_real_tensor(profile, "profile", dtype=torch.float64)
    if values.ndim != 1 or values.shape[0] < 1:
        raise ValueError(f"profile must have shape (m,) with m >= 1; got {tuple(values.shape)}")
    if bool((values < 0).any()):
        raise ValueError("profile must hold norms (entries >= 0)")
    eps = check_real(eps, "eps", positive=True)
    if eps >= 1:
        raise ValueError(f"eps must satisfy 0 < eps < 1; got {eps}")
    peak = float(values.max())
    if peak == 0:
        return 0
    return int(torch.nonzero(values >= eps * peak).max())
