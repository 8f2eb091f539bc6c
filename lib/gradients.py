"""Gradient paths through sequence maps: Jacobian profiles, decay fits, planted keys.

The Jacobian block J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} (0-based positions) says how strongly
the output at position i reacts to the token at position j; its norm as a function
of the distance i − j is the model's *gradient profile*.  The chapter contrasts two
statements with different quantifiers:

- {prf:ref}`thm-ssm-gradient-decay`: for a stable LTI SSM, J_ij = C A^{i−j} B for
  *every* input, so ‖J_ij‖ ≤ K ‖C‖ ‖B‖ r^{i−j} decays exponentially, whatever X is;
- {prf:ref}`prop-attention-highway`: for softmax attention there *exist* inputs (a
  planted key) with ‖J_ij‖ ≈ ‖V‖ at every distance.

`jacobian_norms` measures profiles of any model by reverse-mode autodiff;
`lag_norms` and `ssm_decay_bound` give the LTI profile and its bound in closed form,
`stack_decay_bound` the bound for stacks of LTI layers;
`fit_decay_rate` fits the exponential rate with an interval; `planted_key_input`
and `one_hop` build and inspect the attention inputs of the proposition;
`with_constant_step` freezes a selective SSM's gate to show its trade-off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._validation import as_real_tensor, as_sequence, check_int, check_real
from .attention import SoftmaxAttention
from .base import SequenceMap
from .ssm import LinearSSM, SelectiveSSM
from .stacks import Stack

__all__ = [
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


def jacobian_norms(model: SequenceMap, X: Any, i: int) -> np.ndarray:
    """Frobenius norms ‖∂y_i/∂x_j‖_F for j = 0..i, the gradient profile seen from output i.

    J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} is read off p reverse-mode passes from y_i (one
    vector–Jacobian product eᵀ_k ∂y_i/∂X per output coordinate k), so the cost is
    p backward passes whatever n is; the full (np) × (nd) Jacobian is never formed.
    For an LTI SSM, J_ij = C A^{i−j} B = L_{i−j} for every X
    ({prf:ref}`thm-ssm-gradient-decay`), so the result equals `lag_norms` reversed.

    Args:
        model: any lib SequenceMap (d inputs, p outputs).
        X: one sequence, shape (n, d); numpy array or torch tensor (not modified,
            not part of any caller graph: it is copied and detached).
        i: output position, 0 <= i < n.

    Returns:
        norms, numpy float64 array of shape (i + 1,): norms[j] = ‖J_ij‖_F.  Indexed
        by the *position* j; the distance is i − j, so `norms[::-1]` is indexed by
        distance.  For non-causal models only j <= i is reported.
    """
    _check_model(model)
    X = _one_sequence(model, X)
    i = _check_position(i, "i", X.shape[0])
    X.requires_grad_(True)
    with torch.enable_grad():
        y = model(X)[i]  # (p,)
        if not y.requires_grad:  # y_i does not depend on X at all
            return np.zeros(i + 1)
        rows = [torch.autograd.grad(y[k], X, retain_graph=k + 1 < y.shape[0], allow_unused=True)[0]
                for k in range(y.shape[0])]
    # A y_i that ignores X (allow_unused) has no gradient: it is 0.
    J = torch.stack([torch.zeros_like(X) if row is None else row for row in rows])  # (p, n, d) = ∂y_i/∂X
    return _block_norms(J[:, : i + 1].transpose(0, 1).detach().to(torch.float64).numpy())


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


def stack_decay_bound(stack: Stack, n: int, rate: float) -> np.ndarray:
    """The bound ‖J_{i,i−D}‖_F <= (∏_m K_m) · C(D+L−1, L−1) · r^D of {prf:ref}`prop-stack-decay`.

    For a stack of L LTI SSM layers (with or without residual connections) the
    Jacobian at distance D is the lag-D kernel of the composed convolutions, for
    every input.  Each layer's constant is computed from its own lags,
    K_m = max_{ℓ<n} ‖L^{(m)}_ℓ + [ℓ = 0 and residual] I‖_F / r^ℓ, so the bound
    holds at every distance D < n (the kernel at D uses lags ≤ D only).
    Deviation: Frobenius norms (submultiplicative, so the proof goes through
    unchanged), and K_m is the smallest valid constant rather than one assumed
    >= 1; the residual identity is folded into lag 0 instead of using K >= 1.

    Args:
        stack: a Stack whose layers are all LinearSSM.
        n: number of distances (D = 0..n−1).
        rate: r in (0, 1); the bound is useful when r >= every layer's ρ(A).

    Returns:
        bound, numpy array of shape (n,), indexed by distance D.
    """
    _check_model(stack, "stack", Stack)
    for k, layer in enumerate(stack.layers):
        if not isinstance(layer, LinearSSM):
            raise TypeError(f"stack.layers[{k}] must be a LinearSSM; got {type(layer).__name__}")
    n = check_int(n, "n")
    rate = check_real(rate, "rate", positive=True)
    if rate >= 1:
        raise ValueError(f"rate must be in (0, 1); got {rate}")
    distances = np.arange(n)
    # r^{-ℓ} overflows for large n; compare in logs instead.
    log_constant = 0.0
    for layer in stack.layers:
        lags = layer.lags(n).astype(np.float64)
        if stack.residual:
            lags[0] += np.eye(layer.d)
        with np.errstate(divide="ignore"):
            log_norms = np.log(_block_norms(lags))  # far lags are tiny: keep them from underflowing
        log_constant += float(np.max(log_norms - distances * math.log(rate)))
    depth = len(stack.layers)
    log_paths = np.log([float(math.comb(D + depth - 1, depth - 1)) for D in distances])  # compositions of D
    with np.errstate(under="ignore"):
        return np.exp(log_constant + log_paths + distances * math.log(rate))


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


def planted_key_input(attention: SoftmaxAttention, n: int, i: int, j: int, *, strength: float = 30.0,
                      head: int = 0, scale: float = 1.0, seed: Any = 0) -> np.ndarray:
    """An input on which query i of one head attends (almost) only to key j.

    The construction behind {prf:ref}`prop-attention-highway`.  Background tokens
    are iid N(0, scale² I_d).  With g_h = W_Kᵀ W_Q x_i / √d_k for each head h, the
    token at j is replaced by the least-norm x_j solving

        g_h · x_j + b_h[i − j] = +strength   for the chosen head,
        g_h · x_j + b_h[i − j] = −strength   for every other head,

    so the chosen head's score for key j is `strength` (b is the position bias,
    if any) while the other heads' scores for it are −strength.  Then

        1 − α^head_ij <= Σ_{t≠j} exp(s_it − strength),

    which is tiny once strength exceeds the background scores by log n plus a
    margin, and the other heads give key j weight <= exp(−strength − min_t s_it).
    Note the quantifier: this is *one* input per (i, j) — the proposition says such
    inputs exist at every distance, not that attention keeps every gradient.

    Args:
        attention: a SoftmaxAttention (any number of heads H <= d).
        n: sequence length.
        i: query position, 0 <= i < n.
        j: key position, 0 <= j < n, j != i (j < i if the attention is causal).
        strength: the planted score, > 0.
        head: the head that should lock onto key j, 0 <= head < H.
        scale: standard deviation of the background tokens, >= 0.
        seed: seed of the background (numpy Generator).

    Returns:
        X, numpy array of shape (n, d), in float64.

    Raises:
        ValueError: if the scores cannot be planted (e.g. H > d, or the query is 0).
    """
    _check_model(attention, "attention", SoftmaxAttention)
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
    G = np.einsum("hkd,hk->hd", W_K, W_Q @ X[i]) / math.sqrt(attention.d_k)  # rows g_h, (H, d)
    target = np.full(attention.H, -strength)
    target[head] = strength
    if attention.position_bias is not None:
        target = target - attention.position_bias[:, i - j]
    x_j, *_ = np.linalg.lstsq(G, target, rcond=None)
    if not np.allclose(G @ x_j, target, rtol=1e-8, atol=1e-8 * strength):
        raise ValueError("attention cannot be planted at this query: the key directions W_Kᵀq_i of the heads "
                         "are linearly dependent (H > d or a zero query)")
    X[j] = x_j
    return X


def one_hop(attention: SoftmaxAttention, X: Any, i: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights α^h_ij and the one-hop term Σ_h α^h_ij V_h of ∂y_i/∂x_j.

    For softmax attention (j != i)

        ∂y_i/∂x_j = Σ_h α^h_ij V_h + Σ_h α^h_ij V_h (x_j − x̄^h_i) (W_K^hᵀ q^h_i)ᵀ / √d_k,

    with x̄^h_i = Σ_t α^h_it x_t: the one-hop term (which equals the operator block
    𝒲_ij(X)) plus terms through the softmax weights.  On a planted key the second
    sum is O((1 − α) · strength) and the first is ≈ V_head
    ({prf:ref}`prop-attention-highway`).

    Args:
        attention: a SoftmaxAttention with H heads.
        X: one sequence, shape (n, d).
        i, j: positions, 0 <= i, j < n.

    Returns:
        (weights of shape (H,), one-hop term of shape (p, d)), numpy arrays.
    """
    _check_model(attention, "attention", SoftmaxAttention)
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
    every t: a small step makes A_t ≈ I, so the Jacobian decays only like
    exp(−step · min|A| · (i − j)) — but the input enters as step · B_t x_t, so for
    j < i every J_ij = step · Σ_n (…) exp(−step |A_n| (i − j)) shrinks in
    proportion to step as well (J_ii also has a term through C_i).  At a fixed
    distance D the product step · exp(−step a D) is largest, 1/(e a D), at
    step = 1/(a D): a polynomial, not exponential, price for long memory.

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


def gradient_reach(profile: Any, eps: float = 1e-3) -> int:
    """The largest distance D at which a gradient profile keeps a fraction `eps` of its peak.

    reach = max{D : profile[D] >= eps · max_D' profile[D']}.  For a stable LTI SSM with a
    dominant eigenvalue of modulus ρ this is about ln(1/eps)/ln(1/ρ)
    ({prf:ref}`thm-ssm-gradient-decay`); for a token-wise layer it is 0; for attention on an
    input that opens its highway it is the whole sequence ({prf:ref}`prop-attention-highway`).

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
