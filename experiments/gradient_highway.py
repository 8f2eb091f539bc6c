"""The gradient-highway chapter ({ref}`chap-gradient-highway`): profiles, bounds, open paths, recall.

J_ij = ∂y_i/∂x_j ∈ ℝ^{p×d} (0-based positions) is measured by `lib.jacobian_blocks`; a profile
holds ‖J_{i,i−D}‖_F indexed by the distance D. Here: closed forms (`lag_norms`,
`selective_jacobian`, `rnn_jacobian`), bounds (`ssm_decay_bound`, `stack_decay_bound`), inputs
on which a path stays open (`planted_key_input`, `gate_closing_input`, `saturating_input`),
the SSM stacks and hybrids of the depth page, and the delayed-recall task trained by `lib.fit`.
Inputs X are one sequence (n, d), numpy or torch; results are float64 numpy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from lib import (
    SSD,
    LinearAttention,
    LinearSSM,
    SelectiveSSM,
    SoftmaxAttention,
    Stack,
    fit,
    jacobian_blocks,
    jacobian_norms,
    s4d_ssm,
)
from lib._validation import as_generator, check_int
from lib.attention import alibi_slopes as lib_alibi_slopes
from lib.jacobians import block_norms


def _array(value: Any) -> np.ndarray:
    # A float64 numpy copy of a tensor (parameters included) or an array.
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy()
    return np.asarray(value, dtype=float)


def _solve(M: np.ndarray, target: np.ndarray, problem: str) -> np.ndarray:
    # The least-norm x with M x = target; ValueError when no x reaches it (the input would be wrong).
    x = np.linalg.lstsq(M, target, rcond=None)[0]
    if not np.allclose(M @ x, target, rtol=1e-8, atol=1e-8 * max(np.abs(target).max(), 1.0)):
        raise ValueError(f"no input reaches the target: {problem}")
    return x


# -- LTI SSMs: the profile, the bound of thm-ssm-gradient-decay, fitted rates ---------------------


def lag_norms(ssm: LinearSSM, n: int) -> np.ndarray:
    """‖L_ℓ‖_F = ‖C A^ℓ B‖_F for ℓ = 0..n−1, shape (n,), by doubling: the profile on every input.

    {prf:ref}`thm-ssm-gradient-decay`: J_ij = L_{i−j}, so this is `jacobian_norms(ssm, X, i)[::-1]`.
    """
    return block_norms(_array(ssm.lags(n)))


@dataclass(frozen=True)
class DecayBound:
    """‖J_ij‖_F <= scale · rate^{i−j}: constant = κ₂(P) for A = P Λ P⁻¹ (unit-norm eigenvectors),
    rate = ρ(A), scale = κ₂(P) ‖C‖₂ ‖B‖_F ({prf:ref}`thm-ssm-gradient-decay`)."""

    constant: float
    rate: float
    scale: float

    def at(self, distances: Any) -> np.ndarray:
        """scale · rate^ℓ at distances ℓ >= 0 (any shape)."""
        with np.errstate(under="ignore"):
            return self.scale * np.power(self.rate, np.asarray(distances, dtype=float))


def ssm_decay_bound(ssm: LinearSSM) -> DecayBound:
    """The bound of {prf:ref}`thm-ssm-gradient-decay` for a LinearSSM with diagonalisable A.

    ValueError when κ₂(P) > 1e12 (A numerically defective: only the γ > ρ(A) form holds).
    Deviation: Frobenius norms for J and B; numpy's unit-norm eigenvectors, within √N of the
    best scaling (van der Sluis).
    """
    A, B, C = _array(ssm.A), _array(ssm.B), _array(ssm.C)
    eigenvalues, P = np.linalg.eig(A)
    kappa = float(np.linalg.cond(P, 2))
    if not np.isfinite(kappa) or kappa > 1e12:
        raise ValueError(f"ssm must have a diagonalisable A; its eigenvector matrix has condition number {kappa:.3g}")
    scale = kappa * np.linalg.norm(C, 2) * np.linalg.norm(B, "fro")
    return DecayBound(constant=kappa, rate=float(np.abs(eigenvalues).max()), scale=float(scale))


def fit_decay_rate(norms: Any, *, start: int = 0, stop: int | None = None,
                   floor: float = 1e-300) -> tuple[float, float, int]:
    """(log-rate, its standard error, points): log‖J_ℓ‖ ≈ c + ℓ · log-rate by least squares.

    Over start <= ℓ < stop, skipping norms <= floor (3 points needed). For an LTI SSM the
    residuals are deterministic (transients, oscillation): the standard error measures how well
    one exponential describes the window, not a probability.
    """
    y = _array(norms)
    stop = len(y) if stop is None else stop
    ell, window = np.arange(start, stop, dtype=float), y[start:stop]
    keep = window > floor
    m = int(keep.sum())
    ell, log_norm = ell[keep], np.log(window[keep])
    centred = ell - ell.mean()
    sxx = float(centred @ centred)
    slope = float(centred @ (log_norm - log_norm.mean())) / sxx
    residuals = log_norm - float(log_norm.mean() - slope * ell.mean()) - slope * ell
    return slope, math.sqrt(float(residuals @ residuals) / (m - 2) / sxx), m


@dataclass(frozen=True)
class DecayReport:
    """An LTI SSM's profile `norms` (length,) against its `bound`; bound_ratio, the largest
    norms[ℓ] / bound.at(ℓ) (<= 1 where the theorem holds); `fit_decay_rate` of norms from `start`."""

    norms: np.ndarray
    bound: DecayBound
    bound_ratio: float
    log_rate: float
    log_rate_stderr: float
    points: int

    @property
    def relative_gap(self) -> float:
        """abs(fitted log-rate − ln ρ(A)) / abs(ln ρ(A))."""
        log_rho = math.log(self.bound.rate)
        return abs(self.log_rate - log_rho) / abs(log_rho)

    def row(self) -> dict[str, float]:
        """One row of the profiles page's table `decay-fits`."""
        return {"radius": self.bound.rate, "ln rho": math.log(self.bound.rate), "fitted log-rate": self.log_rate,
                "standard error": self.log_rate_stderr, "relative gap": self.relative_gap, "points": self.points}


def decay_report(ssm: LinearSSM, length: int, *, start: int = 0) -> DecayReport:
    """Profile (distances 0..length−1), bound and fitted log-rate (from `start`) of a stable LTI SSM."""
    bound = ssm_decay_bound(ssm)
    norms = lag_norms(ssm, length)
    ratio = float(np.max(norms / bound.at(np.arange(length))))
    return DecayReport(norms, bound, ratio, *fit_decay_rate(norms, start=start))


# -- stacks: LTI layers, hybrids, and the bound of prop-stack-decay --------------------------------

SSM_KINDS = ("gaussian", "s4d-lin", "s4d-real")


def ssm_layer(kind: str, state_size: int, d: int, spectral_radius: float, *, seed: Any = 0) -> LinearSSM:
    """One d → d LTI SSM with ρ(A) = spectral_radius, of a kind in SSM_KINDS.

    "gaussian": `LinearSSM.random` (non-normal A: the profile may rise before it decays);
    "s4d-lin", "s4d-real": `lib.s4d_ssm` (normal A, ‖A^ℓ‖₂ = ρ^ℓ). seed: an int or SeedSequence.
    """
    if kind == "gaussian":
        return LinearSSM.random(state_size, d, d, spectral_radius=spectral_radius, seed=seed)
    return s4d_ssm(state_size, d, spectral_radius, init=kind.removeprefix("s4d-"), seed=seed)


def lti_stack(d: int, depth: int, *, state_size: int = 8, spectral_radius: float = 0.9, ssm: str = "gaussian",
              residual: bool = False, seed: Any = 0) -> Stack:
    """`depth` layers `ssm_layer(ssm, state_size, d, spectral_radius)`, the stacks of {prf:ref}`prop-stack-decay`.

    One numpy SeedSequence stream per layer (seed: int or list of ints); the plain and the
    residual stack of one seed have the same layers.
    """
    seeds = np.random.SeedSequence(seed).spawn(depth)
    return Stack([ssm_layer(ssm, state_size, d, spectral_radius, seed=s) for s in seeds], residual=residual)


def hybrid_stack(d: int, depth: int, attention_every: int, *, offset: int = 0, state_size: int = 8,
                 heads: int = 1, spectral_radius: float = 0.9, residual: bool = True, causal: bool = True,
                 ssm: str = "gaussian", seed: Any = 0) -> Stack:
    """A Jamba-like d → d stack: layer k is SoftmaxAttention if k % attention_every == offset, else `ssm_layer`.

    Jamba (Lieber et al. 2024) has one attention layer per 8 among Mamba layers; here the SSM
    layers are LTI, so their paths are exactly C A^ℓ B. Seeds as in `lti_stack`.
    """
    seeds = np.random.SeedSequence(seed).spawn(depth)
    layers = [SoftmaxAttention.random(d, d, heads, causal=causal, seed=s) if k % attention_every == offset
              else ssm_layer(ssm, state_size, d, spectral_radius, seed=s) for k, s in enumerate(seeds)]
    return Stack(layers, residual=residual)


def scalar_stack(constants: Any, rate: float, *, residual: bool = False) -> Stack:
    """Scalar LTI layers with lags κ_q γ^ℓ (A = γ, B = κ_q, C = 1): every path is positive, so
    they attain the bound of {prf:ref}`prop-stack-decay` (`stack_decay_bound`)."""
    return Stack([LinearSSM([[rate]], [[float(K)]], [[1.0]]) for K in constants], residual=residual)


def stack_decay_bound(stack: Stack, n: int, rate: float, *, constants: Any = None) -> np.ndarray:
    """The bound of {prf:ref}`prop-stack-decay` on ‖J_{i,i−D}‖_F for D = 0..n−1, shape (n,).

    M LinearSSM layers with ‖L^{(q)}_ℓ‖_F <= κ_q γ^ℓ (γ = rate): plain (∏_q κ_q) C(D+M−1, M−1) γ^D;
    residual [D = 0]√d + Σ_{k=1}^{M} e_k(κ) C(D+k−1, k−1) γ^D (e_k elementary symmetric), in logs.
    constants: None for the smallest κ_q = max_{ℓ<n} ‖L^{(q)}_ℓ‖_F / γ^ℓ, or M numbers that must
    bound the lags for ℓ < n (ValueError otherwise). Deviation: Frobenius norms, ‖I‖_F = √d.
    """
    distances, log_rate = np.arange(n), math.log(rate)
    log_K = []
    for m, layer in enumerate(stack.layers):
        with np.errstate(divide="ignore"):
            needed = float(np.max(np.log(lag_norms(layer, n)) - distances * log_rate))
        if constants is None:
            log_K.append(needed)
            continue
        given = math.log(constants[m]) if constants[m] > 0 else -math.inf
        if needed > given + 1e-9:
            raise ValueError(f"constants[{m}] = {constants[m]:.6g} does not bound layer {m}'s lags: "
                             f"‖L_ℓ‖_F / γ^ℓ reaches {math.exp(min(needed, 700.0)):.6g} for some ℓ < n")
        log_K.append(given)
    log_e = np.full(len(log_K) + 1, -np.inf)  # log e_k(κ), k = 0..M, by e_k <- e_k + κ_q e_{k−1}
    log_e[0] = 0.0
    for lk in log_K:
        log_e[1:] = np.logaddexp(log_e[1:], lk + log_e[:-1])

    def log_terms(k: int) -> np.ndarray:  # log e_k C(D + k − 1, k − 1) γ^D
        compositions = [math.log(math.comb(int(D) + k - 1, k - 1)) for D in distances]
        return log_e[k] + np.array(compositions) + distances * log_rate

    with np.errstate(under="ignore"):
        if not stack.residual:
            return np.exp(log_terms(len(log_K)))
        bound = np.exp(np.logaddexp.reduce(np.stack([log_terms(k) for k in range(1, len(log_K) + 1)]), axis=0))
    bound[0] += math.sqrt(stack.d)
    return bound


# -- attention: planted keys and their price --------------------------------------------------------


def planted_key_input(attention: SoftmaxAttention | LinearAttention, n: int, i: int, j: int, *,
                      strength: float = 30.0, head: int = 0, scale: float = 1.0, seed: Any = 0) -> np.ndarray:
    """An input (n, d) on which query i of `head` attends (almost) only to key j != i.

    {prf:ref}`prop-attention-highway`: background tokens iid N(0, scale² I); x_j is the least-norm solution of
    g_h · x_j + b_h[i − j] = ±strength (+ for `head`, − for the others), g_h = W_Kᵀ W_Q x_i / √d_k,
    b the position bias if any. LinearAttention (elu + 1): W_K^h x_j = ±strength · 1 instead, so
    1 − α = O(1/strength). ValueError when the key cannot be planted (dependent key directions).
    """
    X = scale * np.random.default_rng(seed).standard_normal((n, attention.d))
    W_Q, W_K = _array(attention.W_Q), _array(attention.W_K)
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
            target = target - _array(attention.position_bias)[:, i - j]
        problem = "the key directions W_Kᵀq_i of the heads are linearly dependent (H > d or a zero query)"
    X[j] = _solve(G, target, f"attention cannot be planted at this query: {problem}")
    return X


def key_price(attention: SoftmaxAttention, X: Any, i: int, j: int, eps: float, *, head: int = 0) -> tuple[float, float]:
    """(score, largest other score): the score z^h_ij that gives α^h_ij = 1 − eps, lse_{t≠j} z^h_it + ln((1−ε)/ε).

    {prf:ref}`prop-attention-highway` 1. The other scores (t <= i if causal, else every t; t != j;
    position bias included) come from W_Q, W_K in numpy, not from the model's forward. Planting
    the key at that score (`planted_key_input(..., strength=score)`) gives weight exactly 1 − eps.
    """
    X = _array(X)
    keys = np.arange(i + 1 if attention.causal else len(X))
    keys = keys[keys != j]
    q = _array(attention.W_Q[head]) @ X[i]
    scores = X[keys] @ _array(attention.W_K[head]).T @ q / math.sqrt(attention.d_k)
    if attention.position_bias is not None:
        scores = scores + _array(attention.position_bias)[head, i - keys]
    return float(np.logaddexp.reduce(scores) + math.log((1 - eps) / eps)), float(scores.max())


def planted_key_deviation(attention: SoftmaxAttention, n: int, distances: Any, *, strength: float = 30.0,
                          head: int = 0, seed: int = 0) -> np.ndarray:
    """‖J_{n−1, n−1−D} − V_h‖_F / ‖V_h‖_F for each D in distances, each on its own planted key, shape (len(distances),).

    {prf:ref}`prop-attention-highway` 2: the same inputs as `planted_key_profile` (seed + D), the
    whole block against the planted head's value map V_h = W_O^h W_V^h, not only its norm (a
    norm ratio near 1 would also pass J = −V_h).
    """
    V = _array(attention.values()[head])
    gaps = []
    for D in distances:
        X = planted_key_input(attention, n, n - 1, n - 1 - D, strength=strength, head=head, seed=seed + D)
        gaps.append(np.linalg.norm(jacobian_blocks(attention, X, n - 1)[n - 1 - D] - V) / np.linalg.norm(V))
    return np.array(gaps)


def random_profiles(model: Any, n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Profiles ‖J_{n−1, n−1−D}‖_F, D = 0..n−1, on `count` inputs rng.standard_normal((n, d)), shape (count, n).

    The inputs are drawn in order from `rng` (advanced), so a notebook's random stream stays as it was.
    """
    return np.stack([jacobian_norms(model, rng.standard_normal((n, model.d)), n - 1)[::-1] for _ in range(count)])


def planted_key_profile(model: Any, n: int, distances: Any, *, layer: Any = None, strength: float = 30.0,
                        head: int = 0, seed: int = 0) -> np.ndarray:
    """‖J_{n−1, n−1−D}‖_F of `model` for each D >= 1 in distances, each on its own planted key, shape (len(distances),).

    The input for D is `planted_key_input(layer, n, n − 1, n − 1 − D, strength=strength,
    head=head, seed=seed + D)`; `layer` (default `model`) is the attention layer that sees X,
    e.g. a Stack's first layer.
    """
    layer = model if layer is None else layer
    norms = []
    for D in distances:
        X = planted_key_input(layer, n, n - 1, n - 1 - D, strength=strength, head=head, seed=seed + D)
        norms.append(jacobian_norms(model, X, n - 1)[n - 1 - D])
    return np.array(norms)


# -- selective SSMs: frozen and closing gates ------------------------------------------------------


def with_constant_step(model: SelectiveSSM, step: float) -> SelectiveSSM:
    """A copy of `model` with its gate frozen at Δ_t = step (W_Δ = 0, dt_bias = softplus⁻¹(step)).

    An LTI SSM in Mamba's parametrisation, A_t = exp(step · A): {prf:ref}`prop-frozen-gate`.
    """
    bias = step + math.log(-math.expm1(-step))  # softplus(bias) = step
    return SelectiveSSM(model.A_log, torch.zeros_like(model.W_delta), np.full(model.d, bias), model.W_B,
                        model.W_C, dtype=model.dtype)


def frozen_gate_response(step: float, rate: float, D: int, *, B: float = 1.0, C: float = 1.0) -> float:
    """abs(L_D) of one frozen-gate mode Ā = e^{−Δa}, B̄ = ΔB, C ({prf:ref}`prop-frozen-gate`), Δ = step, a = rate.

    Read from `lag_norms` of that one-state LinearSSM, not from the closed form abs(CB) Δ e^{−ΔaD}.
    """
    mode = LinearSSM([[math.exp(-step * rate)]], [[step * B]], [[C]])
    return float(lag_norms(mode, D + 1)[D])


def _gate(model: SelectiveSSM | SSD) -> tuple[np.ndarray, np.ndarray]:
    # (W_Δ, dt_bias): (d, d), (d,) per channel for a SelectiveSSM; (H, d), (H,) per head for an SSD.
    return _array(model.W_delta), _array(model.dt_bias)


def gate_closing_input(model: SelectiveSSM | SSD, n: int, j: int, *, closing: float = 40.0, opening: float = 0.0,
                       seed: Any = 0) -> np.ndarray:
    """An input (n, d) that writes token j into the state, then closes every gate ({prf:ref}`cor-gate-closing`).

    x_t = 0 for t < j; x_j = w with W_Δ w + dt_bias = opening · 1 (a seeded N(0, I) token
    projected onto that plane); x_t = u with W_Δ u + dt_bias = −μ 1, μ = closing, for t > j
    (least norm), so every later step is softplus(−μ) < e^{−μ}. ValueError unless W_Δ has full
    row rank (the gates could not all be set).
    """
    W, b = _gate(model)
    problem = f"the gate weights W_Δ (shape {W.shape}) must have full row rank"
    z = _solve(W, -closing - b, problem)
    u = np.random.default_rng(seed).standard_normal(model.d)
    w = u + _solve(W, opening - b - W @ u, problem)
    X = np.zeros((n, model.d))
    X[j] = w
    X[j + 1:] = z
    return X


@dataclass(frozen=True)
class SelectivePath:
    """J_ij = block = Σ_k exp(−rates[k] · steps[k]) modes[k] ({prf:ref}`prop-selective-gradient`).

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
        """Σ_k modes[k]: the block with every accumulated step set to 0, (p, d)."""
        return self.modes.sum(0)


def selective_jacobian(model: SelectiveSSM | SSD, X: Any, i: int, j: int) -> SelectivePath:
    """J_ij (j <= i) of a SelectiveSSM or SSD in closed form, without autograd ({prf:ref}`prop-selective-gradient`).

    The state is run forward in numpy, ∂s_j/∂x_j differentiated by hand (through Δ_j, B_j and
    x_j), and carried by exp(A τ).
    """
    X = _array(X)
    n, d = X.shape
    W_delta, b_delta = _gate(model)
    W_B, W_C = _array(model.W_B), _array(model.W_C)
    pre = X @ W_delta.T + b_delta           # (n, d) or (n, H)
    delta, slope = np.logaddexp(0.0, pre), np.exp(-np.logaddexp(0.0, -pre))  # softplus, sigmoid
    Bt, Ct = X @ W_B.T, X @ W_C.T           # (n, N)
    tau = delta[j + 1: i + 1].sum(0)        # accumulated step per channel / head
    if isinstance(model, SelectiveSSM):
        A = -np.exp(_array(model.A_log))    # (d, N)
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
        a = -np.exp(_array(model.A_log))    # (H,)
        W_O = _array(model.W_O)             # (p, d)
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
    """‖J_{n−1, n−1−D}‖_F for each D in distances, each on `gate_closing_input(model, n, n − 1 − D)`.

    {prf:ref}`cor-gate-closing`: flat in D up to a relative a_max D e^{−closing}.
    """
    return np.array([jacobian_norms(model, gate_closing_input(model, n, n - 1 - D, closing=closing, seed=seed),
                                    n - 1)[n - 1 - D] for D in distances])


def gate_closing_check(model: SelectiveSSM | SSD, n: int, *, closing: float = 40.0,
                       seed: int = 0) -> tuple[float, float]:
    """(ratio, spread): {prf:ref}`cor-gate-closing` at every distance D = 1..n−1 on gate-closing inputs.

    ratio, the largest ‖J_ij − J⁰‖_F over its bound a_max D e^{−μ} Σ_k ‖T_k‖_F (<= 1 where the
    corollary holds; J_ij by autograd, J⁰ and the T_k from `selective_jacobian` at D = 1, with
    1e-12 ‖J⁰‖ of slack for the rounding of J_ij); spread, the largest ‖J⁰(D) − J⁰(1)‖_F / ‖J⁰(1)‖_F
    (0 predicted). μ = closing.
    """
    last, J0, ratio, spread = n - 1, None, 0.0, 0.0
    for D in range(1, n):
        X = gate_closing_input(model, n, last - D, closing=closing, seed=seed)
        path = selective_jacobian(model, X, last, last - D)
        J0 = path.undecayed if J0 is None else J0
        J = jacobian_blocks(model, X, last)[last - D]
        allowed = path.rates.max() * D * math.exp(-closing) * np.linalg.norm(path.modes, axis=(1, 2)).sum()
        ratio = max(ratio, float(np.linalg.norm(J - J0) / (allowed + 1e-12 * np.linalg.norm(J0))))
        spread = max(spread, float(np.linalg.norm(path.undecayed - J0) / np.linalg.norm(J0)))
    return ratio, spread


# -- tanh RNNs: saturation -------------------------------------------------------------------------


def saturation_subset(rnn: Any) -> tuple[tuple[int, ...], float]:
    """(S, ρ(W_SS)): the state coordinates whose principal block of W has the largest spectral radius.

    {prf:ref}`prop-rnn-gradient`: saturating the coordinates outside S makes J at distance D tend
    to C_{:,S} W_SS^D U_{S,:}. Exhaustive over the 2^N − 1 subsets; S is a sorted tuple of
    0-based indices, ties to the smallest S by size, then lexicographic.
    """
    W = _array(rnn.W)
    best, radius = (), -1.0
    for size in range(1, rnn.N + 1):
        for S in itertools.combinations(range(rnn.N), size):
            value = float(np.abs(np.linalg.eigvals(W[np.ix_(S, S)])).max())
            if value > radius * (1 + 1e-12):
                best, radius = S, value
    return best, radius


def saturating_input(rnn: Any, n: int, subset: Any = None, *, saturation: float = 20.0) -> np.ndarray:
    """An input (n, d) holding every pre-activation at z* (0 on S, `saturation` off S).

    {prf:ref}`prop-rnn-gradient` 2: x_0 = U⁺z*, x_t = U⁺(z* − W tanh z*), so every Φ_t is the same
    and J_ij = C (ΦW)^{i−j} Φ U. subset: default `saturation_subset(rnn)[0]`. ValueError unless
    U (N, d) has full row rank (the inputs could not set every pre-activation).
    """
    subset = saturation_subset(rnn)[0] if subset is None else subset
    W, U = _array(rnn.W), _array(rnn.U)
    target = np.full(rnn.N, saturation)
    target[list(subset)] = 0.0
    problem = f"rnn.U (shape {U.shape}) must have full row rank N = {rnn.N}"
    X = np.empty((n, rnn.d))
    X[0] = _solve(U, target, problem)
    X[1:] = _solve(U, target - W @ np.tanh(target), problem)
    return X


def rnn_jacobian(rnn: Any, X: Any, i: int, j: int) -> np.ndarray:
    """J_ij = C Φ_i W Φ_{i−1} ⋯ W Φ_j U (j <= i) of an ElmanRNN without autograd, shape (p, d).

    {prf:ref}`prop-rnn-gradient`; Φ_t = diag(sech² z_t) from a numpy run of the recurrence (sech²
    directly, so saturated slopes keep their digits).
    """
    X, W, U, C = _array(X), _array(rnn.W), _array(rnn.U), _array(rnn.C)
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


# -- delayed recall: the training consequence ------------------------------------------------------
#
# A sequence of n tokens in ℝ^Q carries the one-hot token of one of Q classes D steps before
# the end and background tokens elsewhere; the model names the class at the last position. The
# only useful gradient path runs over distance D: O(ρ^D) for a stable LTI SSM, α V for attention
# with a learned position bias. With noisy backgrounds the weak lag-D signal must beat the nearby
# noise; on a blank background Adam, which rescales every step, trains the SSM at every distance.

KINDS = ("ssm", "attention", "hybrid")


@dataclass(frozen=True)
class RecallTask:
    """Recall the class token seen `distance` steps before the end.

    Length n = distance + 1 + lead; position `lead` holds the one-hot token of a uniform class
    among Q = classes, every other position N(0, noise² I_Q); the class is the target at n − 1.
    """

    distance: int
    classes: int = 8
    noise: float = 0.5
    lead: int = 0

    @property
    def length(self) -> int:
        return self.distance + 1 + self.lead

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """X (batch, n, Q) in float64 and labels (batch,), drawn from `generator` only."""
        labels = torch.randint(self.classes, (batch,), generator=generator)
        X = self.noise * torch.randn(batch, self.length, self.classes, generator=generator, dtype=torch.float64)
        X[:, self.lead] = F.one_hot(labels, self.classes).to(torch.float64)
        return X, labels


class _RotationScaling(torch.nn.Module):
    """A = blockdiag(ρ_k R(θ_k)) from unconstrained rows (ν_k, θ_k), ρ_k = sigmoid(ν_k) < 1."""

    def forward(self, radius_angle: torch.Tensor) -> torch.Tensor:
        r, angle = torch.sigmoid(radius_angle[:, 0]), radius_angle[:, 1]
        c, s = r * torch.cos(angle), r * torch.sin(angle)
        return torch.block_diag(*torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2))

    def right_inverse(self, A: torch.Tensor) -> torch.Tensor:
        c, s = A.diagonal()[::2], A.diagonal(-1)[::2]
        r = torch.hypot(c, s)
        return torch.stack([torch.log(r / (1 - r)), torch.atan2(s, c)], 1)


def stable_ssm(classes: int, state_size: int = 16, *, radius: tuple[float, float] = (0.85, 0.95),
               seed: int = 0) -> LinearSSM:
    """A Q → Q LinearSSM (Q = classes) whose A stays stable while it trains: eigenvalues ρ_k e^{±iθ_k}, ρ_k < 1.

    A is parametrised by `parametrizations.A.original` (rows (ν_k, θ_k)). Init from a
    torch.Generator seeded with `seed`: ρ_k uniform in `radius`, θ_k uniform in [0, π], B, C
    Gaussian with variance 1/fan-in. state_size even.
    """
    Q, N = classes, state_size
    g = torch.Generator().manual_seed(seed)
    r = radius[0] + (radius[1] - radius[0]) * torch.rand(N // 2, generator=g, dtype=torch.float64)
    angle = math.pi * torch.rand(N // 2, generator=g, dtype=torch.float64)
    B = (1 / math.sqrt(Q)) * torch.randn(N, Q, generator=g, dtype=torch.float64)
    C = (1 / math.sqrt(N)) * torch.randn(Q, N, generator=g, dtype=torch.float64)
    radius_angle = torch.stack([torch.log(r / (1 - r)), angle], 1)
    ssm = LinearSSM(_RotationScaling()(radius_angle), B, C)
    parametrize.register_parametrization(ssm, "A", _RotationScaling(), unsafe=True)
    with torch.no_grad():
        ssm.parametrizations["A"].original.copy_(radius_angle)
    return ssm


def recall_model(kind: str, task: RecallTask, *, seed: int = 0, radius: tuple[float, float] = (0.85, 0.95),
                 state_size: int = 16, position_bias: bool = True) -> LinearSSM | SoftmaxAttention | Stack:
    """A fresh "ssm", "attention" or "hybrid" model for `task`, read at the last position.

    attention: one causal head (d_k = d_v = Q, projections N(0, 1/Q)) with a learned score b[ℓ]
    per lag ℓ, started at zero (position_bias=False: no such scores, the head sees content only);
    hybrid: the residual block x + ssm(x), then the attention head without a residual (it would
    put the last background token straight into the logits). `radius`, `state_size`: the SSM's
    initial moduli and its (even) number of states.
    """
    if kind == "ssm":
        return stable_ssm(task.classes, state_size, radius=radius, seed=seed)
    g = torch.Generator().manual_seed(seed + (kind == "hybrid"))
    Q = task.classes
    W_Q, W_K, W_V, W_O = ((1 / math.sqrt(Q)) * torch.randn(1, Q, Q, generator=g, dtype=torch.float64)
                          for _ in range(4))
    bias = torch.zeros(1, task.length, dtype=torch.float64) if position_bias else None
    attention = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=bias)
    if kind == "attention":
        return attention
    return Stack([Stack([stable_ssm(Q, state_size, radius=radius, seed=seed)], residual=True), attention])


def _logits(model: torch.nn.Module, X: torch.Tensor) -> torch.Tensor:
    with parametrize.cached():  # a parametrised A is formed once per call, not once per step
        return model(X)[:, -1]


@dataclass(frozen=True)
class RecallResult:
    """One training run: test accuracy and mean cross-entropy on the test batch, the mean
    training loss over the last 10 % of steps, and the run's distance, seed, steps and kind;
    `predictions` (argmax of the logits), `labels` and `losses` (per-sequence cross-entropy,
    whose mean is `loss`) of the test batch, in its order, for paired comparisons of runs on
    the same test batch (`experiments.trained_heads.mcnemar`)."""

    distance: int
    seed: int
    steps: int
    accuracy: float
    loss: float
    train_loss: float
    kind: str = ""
    predictions: tuple[int, ...] = field(default=(), repr=False)
    labels: tuple[int, ...] = field(default=(), repr=False)
    losses: tuple[float, ...] = field(default=(), repr=False)


def train_recall(model: torch.nn.Module, task: RecallTask, *, steps: int = 200, seed: int = 0, batch: int = 16,
                 lr: float = 0.02, optimizer: str = "adam", test_size: int = 256,
                 progress: Callable[[str], None] | None = None, kind: str = "", device: Any = "cpu") -> RecallResult:
    """Train `model` in place on the task by `lib.fit` (cross-entropy of the last position's logits).

    Batches come from `fit`'s generator seeded with `seed`, the test batch from a second one
    (seed + 1_000_003). optimizer "adam" rescales each step (which hides small gradients);
    "sgd" (momentum 0.9) shows them.
    """
    X_test, y_test = task.sample(test_size, torch.Generator().manual_seed(seed + 1_000_003))

    def draw(generator):
        while True:
            yield task.sample(batch, generator)

    history = fit(model, lambda m, X, y: F.cross_entropy(_logits(m, X), y), draw, steps=steps, lr=lr,
                  optimizer=optimizer, seed=seed, device=device, progress=progress,
                  label=f"recall {kind or type(model).__name__} D={task.distance} seed={seed}")
    with torch.no_grad():
        logits = _logits(model, X_test)
    return RecallResult(distance=task.distance, seed=seed, steps=steps,
                        accuracy=float((logits.argmax(-1) == y_test).to(torch.float64).mean()),
                        loss=float(F.cross_entropy(logits, y_test)),
                        train_loss=float(np.mean(history[-max(1, steps // 10):])), kind=kind,
                        predictions=tuple(logits.argmax(-1).tolist()), labels=tuple(y_test.tolist()),
                        losses=tuple(F.cross_entropy(logits, y_test, reduction="none").tolist()))


def initial_gradient_norm(model: torch.nn.Module, task: RecallTask, *, samples: int = 256, seed: int = 0) -> float:
    """‖∂loss/∂θ‖ over all parameters at their current values, on `samples` sequences drawn with `seed`.

    On a blank background (noise 0) every path of the stable SSM runs through C A^D B, so the
    norm falls like ρ^D; for the attention head the path is α V and it does not.
    """
    X, y = task.sample(samples, torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(F.cross_entropy(_logits(model, X), y), list(model.parameters()), allow_unused=True)
    return float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None)))


def recall_sweep(distances: tuple[int, ...] = (2, 8, 32, 128), kinds: tuple[str, ...] = KINDS,
                 seeds: tuple[int, ...] = (0, 1, 2), *, steps: int = 200, classes: int = 8, noise: float = 0.5,
                 optimizer: str = "adam", lr: float = 0.02, radius: tuple[float, float] = (0.85, 0.95),
                 state_size: int = 16, position_bias: bool = True,
                 progress: Callable[[str], None] | None = None, device: Any = "cpu") -> list[RecallResult]:
    """`train_recall` of a fresh `recall_model` (with `radius`, `state_size`, `position_bias`) for every
    (kind, distance, seed), in that order (model and data seeded by the seed)."""
    results = []
    for kind in kinds:
        for D in distances:
            task = RecallTask(D, classes=classes, noise=noise)
            for seed in seeds:
                model = recall_model(kind, task, seed=seed, radius=radius, state_size=state_size,
                                     position_bias=position_bias)
                r = train_recall(model, task, steps=steps, seed=seed, optimizer=optimizer, lr=lr, kind=kind,
                                 device=device)
                results.append(r)
                if progress is not None:
                    progress(f"recall {kind:9s} D={D:4d} seed={seed}: accuracy {r.accuracy:.3f}, loss {r.loss:.3f}")
    return results


@dataclass(frozen=True)
class RecallSignal:
    """The learning signal at initialisation of one fresh model (`signal_sweep`)."""

    kind: str
    distance: int
    seed: int
    gradient_norm: float


def signal_sweep(distances: tuple[int, ...] = (2, 8, 32, 128), kinds: tuple[str, ...] = KINDS,
                 seeds: tuple[int, ...] = (0, 1, 2), *, classes: int = 8, samples: int = 256,
                 length: int | None = None) -> list[RecallSignal]:
    """`initial_gradient_norm` of a fresh `recall_model(kind, task, seed=seed)` on the blank task
    (noise 0: the class token is the only input), its batch drawn with `seed`, for every
    (kind, distance, seed) in that order. length: None for sequences of D + 1 tokens (the class
    token first), or one length n > max(distances) for all (the class token at n − 1 − D, blanks
    before it), which keeps the position of the output fixed while the distance changes."""
    results = []
    for kind in kinds:
        for D in distances:
            lead = 0 if length is None else length - 1 - D
            task = RecallTask(D, classes=classes, noise=0.0, lead=lead)
            for seed in seeds:
                norm = initial_gradient_norm(recall_model(kind, task, seed=seed), task, samples=samples, seed=seed)
                results.append(RecallSignal(kind=kind, distance=D, seed=seed, gradient_norm=norm))
    return results


# -- reach at standard initialisations, growth against preservation, switching saturation --------
#
# (Issue 20.) The framework chapter's zoo fixes one instance per architecture, with steps 10–1000×
# Mamba's; the reach page also measures every architecture at its standard initialisation, over
# seeds, the step range and the spectral radius. A profile g(D) = ‖J_{n−1, n−1−D}‖_F is read
# against its first lag g(1), so that growth is not counted as reach, and beside its absolute level.

from lib import DiagonalSSM, ElmanRNN, SharedStateSSM

STANDARD_STEPS = (1e-3, 1e-1)  # Δ at initialisation: Mamba's and Mamba-2's (dt_min, dt_max), S4D's and S5's


def torch_default_rnn(N: int, d: int, p: int, *, seed: Any = 0) -> ElmanRNN:
    """An ElmanRNN with W, U, C iid uniform on [−1/√N, 1/√N], torch.nn.RNN's initialisation (bias-free).

    C (torch.nn.RNN has no read-out) is drawn the same way. seed: an int or SeedSequence.
    """
    rng = np.random.default_rng(seed)
    bound = 1 / math.sqrt(N)
    W, U, C = (rng.uniform(-bound, bound, shape) for shape in ((N, N), (N, d), (p, N)))
    return ElmanRNN(W, U, C)


def standard_zoo(d: int = 4, *, state: int = 16, heads: int = 2, seed: Any = 0) -> list[tuple[str, str, str, Any]]:
    """(name, proposition label, initialisation, model) for one instance of each architecture at its
    standard initialisation, d → d.

    S4D (`DiagonalSSM`, S4D-Lin) and S5 (`SharedStateSSM`) with `state` states and steps
    log-uniform in STANDARD_STEPS; the selective SSM with Mamba's A = −(1, …, N), N = `state`, and
    steps in STANDARD_STEPS; SSD with 1 and `heads` heads, Mamba-2's rates U(1, 16) and steps in
    STANDARD_STEPS; the tanh RNN with N = d states (so that U can have full row rank) and
    torch.nn.RNN's uniform weights; softmax (1 head causal, `heads` heads non-causal) and linear
    attention with Gaussian projections (`SoftmaxAttention.random`). Model k is seeded with
    SeedSequence([seed, k]).
    """
    seeds = np.random.SeedSequence(seed).spawn(9)
    steps = f"Δ log-uniform in [{STANDARD_STEPS[0]:g}, {STANDARD_STEPS[1]:g}]"
    gaussian = "Gaussian projections, N(0, 1/d)"
    return [
        ("S4D layer (S4D-Lin)", "prop-lti-ssm", f"S4D: N = {state}, modes −½ + iπm, {steps}",
         DiagonalSSM.random(d, state, init="lin", step_range=STANDARD_STEPS, seed=seeds[0])),
        ("S5 layer", "prop-lti-ssm", f"S5: N = {state}, S4D-Lin modes, {steps}",
         SharedStateSSM.random(d, state, step_range=STANDARD_STEPS, seed=seeds[1])),
        ("Elman RNN (tanh)", "prop-rnn", f"torch.nn.RNN: N = {d}, uniform on ±1/√N",
         torch_default_rnn(d, d, d, seed=seeds[2])),
        ("selective SSM (Mamba)", "prop-selective-ssm", f"Mamba: N = {state}, A = −(1, …, N), {steps}",
         SelectiveSSM.random(d, N=state, step_range=STANDARD_STEPS, seed=seeds[3])),
        ("SSD (1 head)", "prop-ssd", f"Mamba-2: N = {state}, rates U(1, 16), {steps}",
         SSD.random(d, d, N=state, heads=1, step_range=STANDARD_STEPS, seed=seeds[4])),
        (f"SSD ({heads} heads)", "prop-ssd", f"Mamba-2: N = {state}, rates U(1, 16), {steps}",
         SSD.random(d, d, N=state, heads=heads, step_range=STANDARD_STEPS, seed=seeds[5])),
        ("softmax attention (1 head)", "prop-softmax-attention", gaussian,
         SoftmaxAttention.random(d, d, 1, seed=seeds[6])),
        (f"softmax attention ({heads} heads, non-causal)", "prop-softmax-attention", gaussian,
         SoftmaxAttention.random(d, d, heads, causal=False, seed=seeds[7])),
        (f"linear attention ({heads} heads)", "prop-linear-attention", gaussian,
         LinearAttention.random(d, d, heads, seed=seeds[8])),
    ]


@dataclass(frozen=True)
class ProfileReading:
    """A profile g(D) = ‖J_{n−1, n−1−D}‖_F read against its first lag g(1) (`read_profile`).

    reach: the largest D >= 1 with g(D) >= eps · g(1) (0 when g(1) = 0, by convention: undefined); growth: max_{D >= 1} g(D) / g(1);
    verdict: "zero beyond D = 0" when g = 0 at every D >= 1, "g(1) = 0" when g(1) = 0 but a later g(D) is not, else "grows" when growth > 1/eps, else "decays"
    when g at the largest distance is < eps · g(1), else "preserved"; first, far: g(1) and g at
    the largest distance, absolute.
    """

    reach: int
    growth: float
    verdict: str
    first: float
    far: float


def read_profile(norms: Any, eps: float = 1e-3, distances: Any = None) -> ProfileReading:
    """The `ProfileReading` of g given at `distances` (increasing, one per norm, holding D = 1;
    default 0, 1, …, len − 1)."""
    g = _array(norms)
    if not np.isfinite(g).all():
        raise ValueError(f"norms must be finite; got {g[~np.isfinite(g)][:3].tolist()}")
    if distances is None and len(g) < 2:
        raise ValueError(f"norms must hold g(0) and g(1); got {len(g)} value(s)")
    D = np.arange(len(g)) if distances is None else np.asarray(distances, dtype=float)
    if D.shape != g.shape or 1 not in D or np.any(np.diff(D) <= 0) or np.any(D % 1 != 0):
        raise ValueError(f"distances must be increasing integers, one per norm ({len(g)}), and "
                         f"hold D = 1; got {D.tolist()[:8]}")
    D = D.astype(int)
    keep = D >= 1
    g, D = g[keep], D[keep]
    first, far = float(g[0]), float(g[-1])
    if first == 0:
        return ProfileReading(0, math.nan, "zero beyond D = 0" if not g.any() else "g(1) = 0", first, far)
    ratio = g / first  # growth; the reach and the end by one comparison (by the ratio if subnormal)
    kept = g >= eps * first if eps * first >= np.finfo(float).tiny else ratio >= eps
    growth = float(ratio.max())
    verdict = "grows" if growth > 1 / eps else ("preserved" if kept[-1] else "decays")
    return ProfileReading(int(D[kept].max()), growth, verdict, first, far)


def shrink_to(X: Any, radius: float, built: Any = None) -> np.ndarray:
    """X with its built tokens scaled by one factor c <= 1 so that the longest has norm <= radius.

    built: a boolean mask (n,) of the tokens a construction chose (default: every token); the
    others (a random background) are left alone. c = min(1, radius / longest built token).
    """
    X = _array(X).copy()
    built = np.ones(len(X), dtype=bool) if built is None else np.asarray(built, dtype=bool)
    longest = float(np.linalg.norm(X[built], axis=1).max())
    X[built] *= min(1.0, radius / longest) if longest > 0 else 1.0
    return X


@dataclass(frozen=True)
class AdversarialProfile:
    """g(D) at `distances` on the input the chapter's theory builds for each D (`adversarial_profile`).

    norms: g(D) on those inputs; matched: (g at the first distance, g at the last) on the same
    inputs with their built tokens shrunk to the radius (`shrink_to`); longest: the longest built
    token over the inputs; text: what the input is.
    """

    distances: np.ndarray
    norms: np.ndarray
    matched: tuple[float, float]
    longest: float
    text: str


def adversarial_profile(model: Any, n: int, distances: Any, *, radius: float, strength: float = 30.0,
                        closing: float = 20.0, saturation: float = 20.0, period: int = 3,
                        seed: int = 0) -> AdversarialProfile:
    """The profile of `model` at `distances` (increasing, each >= 1) on the input its proposition builds.

    Softmax and linear attention: `planted_key_input(model, n, n − 1, n − 1 − D, strength=strength,
    seed=seed + D)`, built token x_j ({prf:ref}`prop-attention-highway`); SelectiveSSM and SSD:
    `gate_closing_input(model, n, n − 1 − D, closing=closing, seed=seed)`, built tokens t >= j
    ({prf:ref}`cor-gate-closing`); ElmanRNN: one `alternating_saturation_input` for every D, on the
    cycle of `slope_products(model, period)` (the product of at most `period` factors P_S W with the
    largest ρ^{1/L}), every token built ({prf:ref}`prop-rnn-gradient`).
    """
    distances = np.asarray(distances, dtype=int)
    last, ends = n - 1, (distances[0], distances[-1])
    if isinstance(model, ElmanRNN):
        products = slope_products(model, period)
        cycle, rate = products.cycle, products.lower
        X = alternating_saturation_input(model, n, cycle, saturation=saturation)
        sets = " → ".join("{" + ", ".join(str(k + 1) for k in S) + "}" for S in cycle)
        by_distance = jacobian_norms(model, X, last)[::-1]
        shrunk = jacobian_norms(model, shrink_to(X, radius), last)[::-1]
        return AdversarialProfile(distances, by_distance[distances], (shrunk[ends[0]], shrunk[ends[1]]),
                                  float(np.linalg.norm(X, axis=1).max()),
                                  f"saturating, unsaturated states {sets}, rate {rate:.3f} per step")
    gated = isinstance(model, (SelectiveSSM, SSD))
    norms, matched, longest = [], [], 0.0
    for D in distances:
        j = last - D
        if gated:
            X, built = gate_closing_input(model, n, j, closing=closing, seed=seed), np.arange(n) >= j
        else:
            X, built = planted_key_input(model, n, last, j, strength=strength, seed=seed + D), np.arange(n) == j
        norms.append(jacobian_norms(model, X, last)[j])
        if D in ends:
            matched.append(jacobian_norms(model, shrink_to(X, radius, built), last)[j])
        longest = max(longest, float(np.linalg.norm(X[built], axis=1).max()))
    text = f"gate-closing, W_Δu + b_Δ = −{closing:g}" if gated else f"planted key, strength {strength:g}"
    return AdversarialProfile(distances, np.array(norms), (matched[0], matched[-1]), longest, text)


def lower_median(values: Any) -> float:
    """The lower median: the ⌈k/2⌉-th smallest of k values (an element of them, so an integer stays one)."""
    ordered = np.sort(_array(values))
    return float(ordered[(len(ordered) - 1) // 2])


def reach_row(model: Any, n: int, rng: np.random.Generator, *, count: int, eps: float, radius: float,
              distances: Any = None, fixed: bool = False, **construction: Any) -> dict[str, Any]:
    """One row of the reach tables: readings on `count` random inputs and on the adversarial ones.

    Random: `random_profiles(model, n, count, rng)`, each read by `read_profile`; the row holds the
    lower medians of reach and of g(n − 1). Adversarial: `adversarial_profile(model, n, distances
    (default 1..n−1), radius=radius, **construction)` read by `read_profile`, unless `fixed` (the
    Jacobian beyond lag 0 does not depend on the input): then the random profile of the first
    input stands for every input. Keys as in the page's tables.
    """
    profiles = random_profiles(model, n, count, rng)
    readings = [read_profile(p, eps) for p in profiles]
    row = {"reach (random inputs)": int(lower_median([r.reach for r in readings])),
           "far level (random inputs)": lower_median([r.far for r in readings])}
    if fixed:
        worst, matched, longest, text = readings[0], (readings[0].first, readings[0].far), math.nan, "none (fixed)"
    else:
        distances = np.arange(1, n) if distances is None else distances
        found = adversarial_profile(model, n, distances, radius=radius, **construction)
        worst = read_profile(found.norms, eps, found.distances)
        matched, longest, text = found.matched, found.longest, found.text
    return row | {"reach (adversarial input)": worst.reach, "growth (adversarial input)": worst.growth,
                  "profile (adversarial input)": worst.verdict, "far level (adversarial input)": worst.far,
                  "longest built token": longest, "far level (matched scale)": float(matched[1]),
                  "first level (matched scale)": float(matched[0]), "adversarial input": text}


SWEEP_KINDS = {"S4D layer (S4D-Lin)": "step", "selective SSM (Mamba)": "step", "SSD (1 head)": "step",
               "SSD (2 heads)": "step", "LTI SSM, Gaussian A": "radius", "LTI SSM, S4D-Lin A": "radius",
               "Elman RNN (tanh), Gaussian W": "radius"}


def sweep_model(kind: str, setting: Any, d: int, *, state: int = 16, seed: Any = 0) -> Any:
    """A d → d model of a kind in SWEEP_KINDS at one setting: a step range (lo, hi) or a spectral radius ρ.

    Step kinds: as in `standard_zoo`, with step_range = setting. Radius kinds: `LinearSSM.random(state,
    d, d, spectral_radius=ρ)`, `s4d_ssm(state, d, ρ)` (normal A) and `ElmanRNN.random(d, d, d,
    spectral_radius=ρ)` (N = d). seed: an int or SeedSequence.
    """
    if kind == "S4D layer (S4D-Lin)":
        return DiagonalSSM.random(d, state, init="lin", step_range=tuple(setting), seed=seed)
    if kind == "selective SSM (Mamba)":
        return SelectiveSSM.random(d, N=state, step_range=tuple(setting), seed=seed)
    if kind.startswith("SSD"):
        return SSD.random(d, d, N=state, heads=1 if "1 head" in kind else 2, step_range=tuple(setting), seed=seed)
    if kind == "LTI SSM, Gaussian A":
        return LinearSSM.random(state, d, d, spectral_radius=setting, seed=seed)
    if kind == "LTI SSM, S4D-Lin A":
        return s4d_ssm(state, d, setting, seed=seed)
    return ElmanRNN.random(d, d, d, spectral_radius=setting, seed=seed)


# -- the derivation page's further checks ----------------------------------------------------------
#
# Functions added for the profiles page's checks of the derivation page (issue 20): the early steps
# of an LTI profile, a continuous search of the frozen gate, attention with a position bias,
# position-wise maps between LTI layers, closing single channels of a selective SSM, and tanh RNNs
# under switching saturation.


def early_steps(norms: Any, rate: float) -> dict[str, float]:
    """The first m = ⌈1/(1 − ρ)⌉ steps of a profile norms[D] = ‖J_D‖ (D = 0..m at least), ρ = rate < 1.

    What the decay fits of `decay_report` skip: "rising steps", the D in 1..m with
    norms[D] > norms[D − 1]; "mean log-slope", ln(norms[m] / norms[0]) / m (ln ρ when the profile is
    one exact exponential); "largest ‖J_D‖/‖J_0‖" over D <= m.
    """
    y = _array(norms)
    m = math.ceil(1 / (1 - rate) - 1e-6)  # ρ = 0.999 (± rounding) gives 1000
    head = y[: m + 1]
    return {"radius": float(rate), "ln rho": math.log(rate), "first steps m": m,
            "rising steps": int((np.diff(head) > 0).sum()), "mean log-slope": float(math.log(head[m] / head[0]) / m),
            "largest ‖J_D‖/‖J_0‖": float(head.max() / head[0])}


def frozen_gate_optimum(D: int, a_min: float, *, starts: int = 8, seed: int = 0, B: float = 1.0,
                        C: float = 1.0) -> tuple[float, float, float]:
    """(response, step, rate): the largest `frozen_gate_response` over Δ > 0 and a >= a_min found by
    Nelder–Mead (scipy) from `starts` random points, D >= 1 ({prf:ref}`prop-frozen-gate` 1).

    No grid and not the maximiser of the proposition: Δ = e^w, a = a_min + v², and the negative log of
    the lag, −ln|CB| − w + e^w a D, minimised from (w, v) drawn uniformly in [ln 1e-5, ln 10] × [0, 3];
    the best point's response is read from the lags (`frozen_gate_response`).
    """
    from scipy.optimize import minimize

    def loss(z: np.ndarray) -> float:
        return -math.log(abs(C * B)) - z[0] + math.exp(min(z[0], 50.0)) * (a_min + z[1] ** 2) * D

    rng, best = np.random.default_rng(seed), None
    for _ in range(starts):
        z0 = [rng.uniform(math.log(1e-5), math.log(10.0)), rng.uniform(0.0, 3.0)]
        result = minimize(loss, z0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-15, "maxiter": 4000})
        if best is None or result.fun < best.fun:
            best = result
    step, rate = math.exp(best.x[0]), a_min + best.x[1] ** 2
    return frozen_gate_response(step, rate, D, B=B, C=C), step, rate


def with_position_bias(attention: SoftmaxAttention, bias: Any) -> SoftmaxAttention:
    """A copy of a causal one-or-more-head `attention` with position scores b (n_max,) for every head
    or (H, n_max): b[ℓ] is added to the score at lag ℓ = i − j ({prf:ref}`cor-attention-price` 2).

    ALiBi (Press et al. 2022) is b[ℓ] = −c ℓ, e.g. `with_position_bias(layer, -c * np.arange(n))`.
    """
    b = np.broadcast_to(_array(bias), (attention.H, np.shape(bias)[-1]))
    return SoftmaxAttention(attention.W_Q.detach(), attention.W_K.detach(), attention.W_V.detach(),
                            attention.W_O.detach(), position_bias=b.copy(), dtype=attention.dtype)


def score_bound(attention: SoftmaxAttention, R: float, *, head: int = 0, query_bias: Any = None) -> float:
    """S = R(‖W_Kᵀ W_Q‖₂ R + ‖W_Kᵀ b_Q‖₂) / √d_k of one head: |content score| <= S and ‖g‖₂ R <= S on tokens
    of norm <= R ({prf:ref}`cor-attention-price`). query_bias: b_Q (d_k,) of a query projection W_Q x + b_Q
    (None: no bias, S = ‖W_Kᵀ W_Q‖₂ R²/√d_k); a key bias cancels in the softmax and needs no term."""
    W_Q, W_K = _array(attention.W_Q[head]), _array(attention.W_K[head])
    b_Q = np.zeros(W_Q.shape[0]) if query_bias is None else _array(query_bias)
    if b_Q.shape != (W_Q.shape[0],):
        raise ValueError(f"query_bias must have shape ({W_Q.shape[0]},); got {b_Q.shape}")
    spread = np.linalg.norm(W_K.T @ W_Q, 2) * R + np.linalg.norm(W_K.T @ b_Q)
    return float(R * spread / math.sqrt(attention.d_k))


def weight_bound(S: float, bias: Any, i: int, j: int) -> float:
    """ᾱ_ij = 1 / (1 + e^{−2S} Σ_{t <= i, t != j} e^{b[i−t] − b[i−j]}), j < i: the bound on one causal head's
    weight α_ij over every input with content scores in [−S, S] ({prf:ref}`cor-attention-price`).

    bias: b[ℓ] for lags ℓ = 0..i (zeros: no bias, ᾱ = 1/(1 + i e^{−2S})).
    """
    b = _array(bias)[: i + 1]
    others = np.delete(b, i - j)  # b[i − t] over t != j
    return float(1.0 / (1.0 + np.exp(np.logaddexp.reduce(others - b[i - j]) - 2 * S)))


def standard_score_bounds(d: int, *, head_width: int = 64, seed: Any = 0) -> np.ndarray:
    """‖Z_Kᵀ Z_Q‖₂ d / √d_k for each of the d // head_width heads (d >= head_width), Z_Q, Z_K (d_k, d) iid
    N(0, 1), d_k = head_width.

    Times σ² it is a head's S of {prf:ref}`cor-attention-price` for projections with iid N(0, σ²) entries
    (σ² = 1/d: `SoftmaxAttention.random`; σ = 0.02: GPT-2's) on tokens of norm R = √d (LayerNorm without
    its affine part). The norm comes from the Cholesky factors L of the Gram matrices Z Zᵀ:
    Z_Kᵀ Z_Q = Q_K (L_Kᵀ L_Q) Q_Qᵀ with orthonormal Q, so ‖Z_Kᵀ Z_Q‖₂ = ‖L_Kᵀ L_Q‖₂ (d_k × d_k).
    """
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(d // head_width):
        Z_Q, Z_K = rng.standard_normal((2, head_width, d))
        L_Q, L_K = np.linalg.cholesky(Z_Q @ Z_Q.T), np.linalg.cholesky(Z_K @ Z_K.T)
        values.append(np.linalg.norm(L_K.T @ L_Q, 2) * d / math.sqrt(head_width))
    return np.array(values)


from lib import SequenceMap, batched

_SLOPE_BOUNDS = {"identity": 1.0, "tanh": 1.0, "silu": 1.1}  # sup |φ'|; SiLU's is 1.0998…


class PositionWise(SequenceMap):
    """y_t = gain ⊙ φ(x_t), φ elementwise in {"identity", "tanh", "silu"}, gain (d,): a position-wise map
    for {prf:ref}`prop-stack-decay` 3, with ‖Dφ(z)‖₂ <= `lipschitz` = max|gain| · sup|φ'| at every z."""

    def __init__(self, gain: Any, kind: str = "tanh", *, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        dims = self.set_parameters(dtype, gain=(np.atleast_1d(_array(gain)), "d"))
        self.d = self.p = dims["d"]
        self.kind = kind
        self.lipschitz = float(np.abs(_array(self.gain)).max()) * _SLOPE_BOUNDS[kind]

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        act = {"identity": lambda z: z, "tanh": torch.tanh, "silu": F.silu}[self.kind]
        return self.gain * act(X)


def mapped_stack(layers: list, maps: list, *, residual: bool = False, before: bool = False) -> Stack:
    """The stack of {prf:ref}`prop-stack-decay` 3: layer (branch, if residual) q is maps[q] ∘ layers[q]
    (layers[q] ∘ maps[q] if before)."""
    pairs = [[m, f] if before else [f, m] for f, m in zip(layers, maps)]
    return Stack([Stack(pair) for pair in pairs], residual=residual)


def mapped_stack_bound(layers: list, lipschitz: Any, n: int, rate: float, *, residual: bool = False) -> np.ndarray:
    """The bound of {prf:ref}`prop-stack-decay` 3 on ‖J_{i,i−D}‖_F, D = 0..n−1: `stack_decay_bound` with κ_q
    replaced by λ_q κ_q (λ_q = lipschitz[q]), computed on the LinearSSM layers with C scaled by λ_q."""
    scaled = [LinearSSM(f.A.detach(), f.B.detach(), lam * f.C.detach()) for f, lam in zip(layers, lipschitz)]
    return stack_decay_bound(Stack(scaled, residual=residual), n, rate)


class GatedLTI(SequenceMap):
    """y_t = (ssm(X))_t ⊙ (W_g x_t), p = d: an LTI branch times a linear gate (GLU-style; Mamba's z gate
    without its SiLU). For j < i, J_ij = diag(W_g x_i) L_{i−j}: it grows with x_i, so no bound of the
    form K γ^{i−j} holds for every input ({prf:ref}`prop-stack-decay`, the remark after it)."""

    def __init__(self, ssm: LinearSSM, W_g: Any) -> None:
        super().__init__()
        self.ssm = ssm
        dims = self.set_parameters(ssm.dtype, {"d": ssm.d}, W_g=(W_g, "d d"))
        self.d = self.p = dims["d"]

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.ssm(X) * (X @ self.W_g.T)


class S4DGLUBlock(SequenceMap):
    """One S4D block as in the reference code (state-spaces/s4, models/s4/s4d.py), p = d = h: the
    kernel convolution with its skip D (a DiagonalSSM), then GELU, then the 1×1 convolution
    W_out (2h, h) with bias b_out, then GLU: out = a ⊙ σ(b) with (a, b) = W_out GELU(y) + b_out.
    Everything after the SSM is position-wise, but the GLU's derivative grows with the value a
    it multiplies, so on large tokens J_{i,i−D} grows with them ({doc}`profiles`)."""

    def __init__(self, ssm: DiagonalSSM, W_out: Any, b_out: Any) -> None:
        super().__init__()
        self.ssm = ssm
        self.set_parameters(
            ssm.dtype, {"h": ssm.d}, W_out=(W_out, "g h"), b_out=(b_out, "g")
        )
        self.d = self.p = ssm.d

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        z = F.gelu(self.ssm(X)) @ self.W_out.T + self.b_out
        return F.glu(z, dim=-1)


def gate_zero_input(block: S4DGLUBlock, n: int, size: float) -> np.ndarray:
    """Zeros, and a last token that puts the SSM's last output at (size, …, size): x = size/(K_0 + D)
    channel by channel. With a gate row of W_out that sums to 0 and b_out = 0 there, that row's
    gate sits at σ(0) = 1/2 while the value it multiplies grows like `size`."""
    ssm = block.ssm
    X = np.zeros((n, block.d))
    X[-1] = size / (ssm.kernel(1)[:, 0] + ssm.D).numpy(force=True)
    return X


def with_low_rank_step(model: SelectiveSSM, rank: int, *, seed: Any = 0) -> SelectiveSSM:
    """A copy of `model` whose step projection is W_Δ = W_up W_down of rank `rank`, as in Mamba
    (dt_proj ∘ x_proj, rank ⌈d_model/16⌉): W_down (rank, d) uniform in ±1/√d, W_up (d, rank)
    uniform in ±1/√rank (nn.Linear's and Mamba's dt_proj ranges), from a numpy Generator(seed)."""
    rng = np.random.default_rng(seed)
    down = rng.uniform(-1, 1, (rank, model.d)) / math.sqrt(model.d)
    up = rng.uniform(-1, 1, (model.d, rank)) / math.sqrt(rank)
    return SelectiveSSM(model.A_log, up @ down, model.dt_bias, model.W_B, model.W_C, dtype=model.dtype)


def channel_closing_input(model: SelectiveSSM | SSD, n: int, j: int, direction: Any, *, closing: float = 40.0,
                          seed: Any = 0) -> tuple[np.ndarray, tuple[int, ...]]:
    """(X, Q): token j then the tokens u = s v (v = direction) that close the channels (heads, for SSD)
    Q = {q : W_Δ[q, :] v < 0} ({prf:ref}`cor-gate-closing`).

    x_t = 0 for t < j, x_j a seeded N(0, I) token, x_t = u for t > j with the smallest s >= 0 that
    puts every q in Q at pre-activation W_Δ[q, :] u + b_Δ[q] <= −closing; the other channels' gates
    are whatever u makes them. Q may be empty (then u = 0).
    """
    W, b = _gate(model)
    v = _array(direction)
    slope = W @ v
    closed = tuple(int(q) for q in np.flatnonzero(slope < 0))
    s = max([0.0] + [(closing + b[q]) / -slope[q] for q in closed])
    X = np.zeros((n, model.d))
    X[j] = np.random.default_rng(seed).standard_normal(model.d)
    X[j + 1:] = s * v
    return X, closed


@dataclass(frozen=True)
class ChannelClosing:
    """{prf:ref}`cor-gate-closing` per channel on `channel_closing_input`, at distances D (`channel_closing_check`).

    closed: the closed channels Q; ratio: the largest ‖J_ij[q, :] − J⁰_q‖ over its bound
    a_max,q D e^{−μ} Σ_k ‖T_{q,k}‖ for q in Q (<= 1 where the corollary holds); spread: the largest
    relative change of J⁰_q with D (0 predicted); norms: ‖J_{i,i−D}[q, :]‖ per channel, (len(D), d);
    formula_gap: the largest relative gap between the autograd block and the closed form with its steps.
    """

    closed: tuple[int, ...]
    ratio: float
    spread: float
    norms: np.ndarray
    formula_gap: float = 0.0


def channel_closing_check(model: SelectiveSSM, n: int, direction: Any, distances: Any, *, closing: float = 40.0,
                          seed: int = 0) -> ChannelClosing:
    """Row by row, the autograd Jacobian of a SelectiveSSM on `channel_closing_input` against the
    closed form of `selective_jacobian` with every accumulated step set to 0 (J⁰_q, from D = first),
    within the bound of {prf:ref}`cor-gate-closing` (1e-12 ‖J⁰_q‖ of slack for rounding). Every D >= 1."""
    last, N = n - 1, model.N
    J0, ratio, spread, norms, closed, formula_gap = {}, 0.0, 0.0, [], (), 0.0
    for D in distances:
        X, closed = channel_closing_input(model, n, last - D, direction, closing=closing, seed=seed)
        path = selective_jacobian(model, X, last, last - D)
        J = jacobian_blocks(model, X, last)[last - D]
        formula_gap = max(formula_gap, float(np.linalg.norm(J - path.block) / np.linalg.norm(path.block)))
        norms.append(np.linalg.norm(J, axis=1))
        for q in closed:
            modes = path.modes[q * N:(q + 1) * N, q]           # T_{q,k}, row q only, (N, d)
            undecayed = modes.sum(0)
            J0.setdefault(q, undecayed)
            allowed = path.rates[q * N:(q + 1) * N].max() * D * math.exp(-closing) * np.linalg.norm(modes, axis=1).sum()
            gap = np.linalg.norm(J[q] - J0[q])
            ratio = max(ratio, float(gap / (allowed + 1e-12 * np.linalg.norm(J0[q]))))
            spread = max(spread, float(np.linalg.norm(undecayed - J0[q]) / np.linalg.norm(J0[q])))
    return ChannelClosing(closed=closed, ratio=ratio, spread=spread, norms=np.array(norms), formula_gap=formula_gap)


# -- tanh RNNs: switching saturation and the joint spectral radius of the slope products ----------


def _slope_set(W: np.ndarray) -> tuple[list[tuple[int, ...]], np.ndarray]:
    # The nonempty S ⊆ [N] and the matrices P_S W, (2^N − 1, N, N) (S = ∅ gives 0 and never maximises).
    N = W.shape[0]
    subsets = [S for size in range(1, N + 1) for S in itertools.combinations(range(N), size)]
    mats = np.zeros((len(subsets), N, N))
    for k, S in enumerate(subsets):
        mats[k][list(S)] = W[list(S)]
    return subsets, mats


@dataclass(frozen=True)
class SlopeProducts:
    """The products M_1 ⋯ M_D of M_t ∈ 𝒫 = {P_S W : S ⊆ [N]} ({prf:ref}`prop-rnn-gradient`), D = 0..length.

    norms[D] = π_D = max ‖M_1 ⋯ M_D‖₂ (π_0 = 1), worst[D] its sets (S_1, …, S_D), the leftmost
    first; lower = max over D of the largest ρ(M_1 ⋯ M_D)^{1/D} (<= the joint spectral radius ρ̂ of 𝒫),
    upper = min over D of π_D^{1/D} (>= ρ̂); cycle, the sets of the product attaining `lower`.
    """

    norms: np.ndarray
    worst: list
    lower: float
    upper: float
    cycle: tuple

    def bound(self, D: int) -> float:
        """π̄_D >= π_D for any D >= 0, by submultiplicativity: π_m^{⌊D/m⌋} π_{D mod m}, m = length."""
        m = len(self.norms) - 1
        return float(self.norms[m] ** (D // m) * self.norms[D % m])


def slope_products(rnn: Any, length: int) -> SlopeProducts:
    """`SlopeProducts` of an ElmanRNN's W by enumerating all (2^N − 1)^D products for D <= length.

    Exact and exponential: keep (2^N − 1)^length small (N = 2, length 12: 5·10^5 products).
    """
    subsets, mats = _slope_set(_array(rnn.W))
    norms, worst, lower, cycle = [1.0], [()], 0.0, ()
    products, index = np.eye(rnn.N)[None], np.zeros((1, 0), dtype=int)
    for D in range(1, length + 1):
        products = np.einsum("kab,pbc->kpac", mats, products).reshape(-1, rnn.N, rnn.N)
        index = np.concatenate([np.repeat(np.arange(len(subsets)), len(index))[:, None],
                                np.tile(index, (len(subsets), 1))], axis=1)
        spectral = np.linalg.norm(products, 2, axis=(1, 2))
        best = int(spectral.argmax())
        norms.append(float(spectral[best]))
        worst.append(tuple(subsets[k] for k in index[best]))
        radii = np.abs(np.linalg.eigvals(products)).max(axis=1) ** (1 / D)
        if radii.max() > lower * (1 + 1e-12):
            lower, cycle = float(radii.max()), tuple(subsets[k] for k in index[int(radii.argmax())])
    upper = min(norms[D] ** (1 / D) for D in range(1, length + 1))
    return SlopeProducts(norms=np.array(norms), worst=worst, lower=lower, upper=upper, cycle=cycle)


def switching_saturation_input(rnn: Any, sets: Any, *, saturation: float = 20.0) -> np.ndarray:
    """An input (n, d), n = len(sets), with pre-activation z_t = 0 on sets[t] and `saturation` off it.

    {prf:ref}`prop-rnn-gradient` 2: x_0 = U⁺z*_0, x_t = U⁺(z*_t − W tanh z*_{t−1}), so Φ_t =
    P_{S_t} + sech²(saturation) P_{S_t^c} at every t. ValueError unless U (N, d) has full row rank.
    """
    W, U = _array(rnn.W), _array(rnn.U)
    targets = np.full((len(sets), rnn.N), saturation)
    for t, S in enumerate(sets):
        targets[t, list(S)] = 0.0
    problem = f"rnn.U (shape {U.shape}) must have full row rank N = {rnn.N}"
    previous = np.vstack([np.zeros(rnn.N), np.tanh(targets[:-1])])
    return np.stack([_solve(U, z - W @ s, problem) for z, s in zip(targets, previous)])


def alternating_saturation_input(rnn: Any, n: int, cycle: Any = None, *, saturation: float = 20.0,
                                 length: int = 4) -> np.ndarray:
    """The switching-saturation input (n, d) that repeats `cycle` backwards from the last position:
    S_{n−1−m} = cycle[m mod k] (k = len(cycle)), so the Jacobian of the last output at distance D
    tends to C (P_{cycle[0]} W)(P_{cycle[1]} W) ⋯ P_{cycle[D mod k]} U as saturation grows.

    cycle: default `slope_products(rnn, length).cycle`, the product of period <= length with the
    largest ρ^{1/k}: the RNN's Jacobian grows on this input iff that rate exceeds 1 (the input of the
    reach page's adversarial search; {prf:ref}`prop-rnn-gradient`). For W = [[0.9, 1.5], [−1, −0.9]]
    it is ({0}, {1}): the saturated coordinate alternates.
    """
    cycle = slope_products(rnn, length).cycle if cycle is None else tuple(cycle)
    sets = [cycle[(n - 1 - t) % len(cycle)] for t in range(n)]
    return switching_saturation_input(rnn, sets, saturation=saturation)


def prescribed_jacobian(rnn: Any, sets: Any, i: int, j: int, *, saturation: float = 20.0) -> np.ndarray:
    """C Φ_i W Φ_{i−1} ⋯ W Φ_j U with Φ_t = P_{S_t} + sech²(saturation) P_{S_t^c}, S_t = sets[t]: the
    Jacobian that {prf:ref}`prop-rnn-gradient` 2 predicts on `switching_saturation_input`, from the
    prescribed slopes (no run of the network), shape (p, d)."""
    W, U, C = _array(rnn.W), _array(rnn.U), _array(rnn.C)

    def slopes(S):
        phi = np.full(rnn.N, 1.0 / math.cosh(saturation) ** 2)
        phi[list(S)] = 1.0
        return phi[:, None]

    M = slopes(sets[j]) * U
    for t in range(j + 1, i + 1):
        M = slopes(sets[t]) * (W @ M)
    return C @ M


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's slopes (Press et al. 2022), steepest first, as numpy: `lib.attention.alibi_slopes`
    (2^{−8h/H}, h = 1..H, when H is a power of two; the published interleaving otherwise)."""
    return lib_alibi_slopes(heads).numpy()


def alibi_reach(two_S: float, slope: float) -> float:
    """D* = (2S + ln(1 + 2S)) / β: the distance beyond which the envelope (1 + 2S)e^{2S − βD} of
    {prf:ref}`cor-attention-price` 2 falls below 1, i.e. below ‖V‖₂; below D* it does not bound."""
    return (two_S + math.log1p(two_S)) / slope


def bounded_planted_alibi(attention: SoftmaxAttention, n: int, D: int, slope: float, *,
                          seed: Any = 0) -> tuple[float, float, float]:
    """(α_{i,i−D}, ‖J_{i,i−D}‖₂/‖V‖₂, ‖J_{i,i−D} − V‖₂/‖V‖₂) of head 0 of `attention` with ALiBi scores −slope·ℓ at the last
    query i = n − 1, on a bounded input: every token of norm R = √d (random directions), the query
    x_i = R · the top right singular vector of W_Kᵀ W_Q, the key x_{i−D} = R · g/‖g‖ with
    g = W_Kᵀ W_Q x_i / √d_k. J = α V [I + (x_j − x̄_i) gᵀ] (one head, input-independent bias)."""
    d, i, j, R = attention.d, n - 1, n - 1 - D, math.sqrt(attention.d)
    X = np.random.default_rng(seed).standard_normal((n, d))
    X *= R / np.linalg.norm(X, axis=1, keepdims=True)
    W_Q, W_K = _array(attention.W_Q[0]), _array(attention.W_K[0])
    M = W_K.T @ W_Q
    X[i] = R * np.linalg.svd(M)[2][0]
    g = M @ X[i] / math.sqrt(attention.d_k)
    X[j] = R * g / np.linalg.norm(g)
    biased = with_position_bias(attention, -slope * np.arange(n))
    alpha = _array(biased.weights(torch.from_numpy(X)))[0, i, : i + 1]
    V = _array(attention.values()[0])
    J = alpha[j] * V @ (np.eye(d) + np.outer(X[j] - alpha @ X[: i + 1], g))
    size = np.linalg.norm(V, 2)
    return float(alpha[j]), float(np.linalg.norm(J, 2) / size), float(np.linalg.norm(J - V, 2) / size)


def sharp_price_horizon(S: float, eps: float) -> float:
    """ln of the largest position i at which a one-head layer without bias, content scores in [−S, S]
    (S > 0), can have ‖J_ij‖₂ >= (1 − ε)‖V‖₂, by the middle bound α(1 + 2S(1 − α)) of
    {prf:ref}`cor-attention-price`: i <= e^{2S}(1/α_min − 1), α_min = [(1 + 2S) − √((1 + 2S)² − 8S(1 − ε))]/(4S)
    = 2(1 − ε)/[(1 + 2S) + √(…)], the least weight in [0, 1] with α(1 + 2S(1 − α)) >= 1 − ε."""
    a = 2 * (1 - eps) / ((1 + 2 * S) + math.sqrt((1 + 2 * S) ** 2 - 8 * S * (1 - eps)))
    return 2 * S + math.log(1 / a - 1)


def price_bound_sup(S: float, i: int) -> float:
    """The largest ‖J_ij‖₂/‖V‖₂ that the middle bound of {prf:ref}`cor-attention-price` 1 allows at position i
    (no bias, content scores in [−S, S], S > 0): max of α(1 + 2S(1 − α)) over 0 <= α <= 1/(1 + i e^{−2S}).

    Computed from the vertex α* = (1 + 2S)/(4S) of the concave quadratic, not from the roots that
    `sharp_price_horizon` solves for; a highway of accuracy ε at i needs this to be >= 1 − ε.
    """
    top = 1 / (1 + i * math.exp(-2 * S))
    alpha = min(top, (1 + 2 * S) / (4 * S))
    return alpha * (1 + 2 * S * (1 - alpha))


def direction_price_horizon(S: float, V: Any, eps: float) -> float:
    """ln of the largest number i − 1 of other keys at which a one-head layer without bias, content scores
    in [−S, S], can have ‖J_ij − V‖₂ <= ε‖V‖₂, by the direction condition of {prf:ref}`cor-attention-price` 1.

    J − V = V[(α − 1)I + α(x_j − x̄_i)gᵀ] is (α − 1)V on g⊥, so ‖J − V‖₂ >= (1 − α)‖V P_{g⊥}‖₂ >= (1 − ᾱ_i)σ₂(V)
    (σ₂ the second singular value: every (d − 1)-dimensional restriction of V keeps at least σ₂), with
    ᾱ_i = 1/(1 + (i − 1)e^{−2S}). A highway needs (1 − ᾱ_i)σ₂ <= εσ₁, i.e. i − 1 <= e^{2S} r/(1 − r) with
    r = εσ₁/σ₂; inf when r >= 1 (no condition: e.g. d = 1 or V of rank 1, the row space along g possible).
    V: (p, d), the head's value map."""
    sigma = np.linalg.svd(_array(V), compute_uv=False)
    if not (0 < eps < 1):
        raise ValueError(f"eps must lie in (0, 1); got {eps!r}")
    if len(sigma) < 2 or eps * sigma[0] >= sigma[1]:
        return math.inf
    r = eps * sigma[0] / sigma[1]
    return 2 * S + math.log(r / (1 - r))


def best_highway_gap(attention: SoftmaxAttention, i: int, R: float, *, starts: int = 16, steps: int = 300,
                     seed: Any = 0) -> tuple[float, np.ndarray]:
    """(smallest ‖J_{i0} − V‖₂/‖V‖₂ found, its input (i + 1, d)): a search for a one-hop highway from the first
    token to query i (0-based) of head 0 over inputs with every token of norm <= R (x = R y/max(‖y‖, 1)).

    Adam on `starts` random starts at once for `steps` steps, on J = α V[I + (x_j − x̄_i)gᵀ] (one head, no
    bias; {prf:ref}`cor-attention-price`). A search, not a proof: it gives an upper limit on the least gap
    (the input it returns attains it; compare `lib.jacobian_blocks`), the bounds give lower limits."""
    W_Q, W_K = attention.W_Q[0].detach(), attention.W_K[0].detach()
    V = attention.values()[0].detach()
    gen = torch.Generator().manual_seed(int(seed))
    Y = torch.randn(starts, i + 1, attention.d, generator=gen, dtype=V.dtype).requires_grad_()

    def gaps(Y):
        X = R * Y / Y.norm(dim=-1, keepdim=True).clamp(min=1.0)
        g = X[:, i] @ W_Q.T @ W_K / math.sqrt(attention.d_k)                      # (starts, d)
        alpha = torch.softmax(torch.einsum("bd,btd->bt", g, X), -1)
        spread = X[:, 0] - torch.einsum("bt,btd->bd", alpha, X)
        J = alpha[:, 0, None, None] * (V + torch.einsum("pd,bd,be->bpe", V, spread, g))
        return torch.linalg.matrix_norm(J - V, 2) / torch.linalg.matrix_norm(V, 2), X

    opt = torch.optim.Adam([Y], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        gaps(Y)[0].sum().backward()
        opt.step()
    G, X = gaps(Y.detach())
    k = int(G.argmin())
    return float(G[k]), X[k].numpy()


def standard_lin_stack(d: int, depth: int, *, state_size: int = 8, residual: bool = True, seed: Any = 0) -> Stack:
    """`depth` S4D-Lin layers at S4D's standard initialisation, `DiagonalSSM.random(d, state_size, "lin")`
    with steps log-uniform in STANDARD_STEPS (skip D included), one SeedSequence stream per layer."""
    seeds = np.random.SeedSequence(seed).spawn(depth)
    return Stack([DiagonalSSM.random(d, state_size, init="lin", step_range=STANDARD_STEPS, seed=s)
                  for s in seeds], residual=residual)


# ---------------------------------------------------------------------------------------------
# The blocks as built (lib.MambaBlock, lib.Mamba2Block): the Jacobian through the convolution
# window (prop-block-gradient), gate closing per channel through the rank-dt_rank step
# projection (cor-block-gate-closing), and attention with ALiBi (prop-alibi-attenuation).

SILU_GAP = 0.2785  # sup_y |silu(y) − relu(y)| = 0.27846… (attained at y ≈ −1.278)


def _silu_slope(c: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(c)
    return s * (1 + c * (1 - s))


def _block_tensor(block: Any, X: Any) -> torch.Tensor:
    from lib import MambaBlock
    if not isinstance(block, MambaBlock):
        raise TypeError(f"block must be a lib.MambaBlock; got {type(block).__name__}")
    X = torch.as_tensor(np.asarray(X, dtype=float) if not torch.is_tensor(X) else X).to(block.D.dtype)
    if X.ndim != 2 or X.shape[1] != block.d_model:
        raise ValueError(f"X must have shape (n, {block.d_model}); got {tuple(X.shape)}")
    return X


def mamba_values(block: Any, X: Any) -> dict[str, torch.Tensor]:
    """The forward quantities of a MambaBlock at one sequence X (n, d_model), recomputed from its
    parameters (not through the block's code): u, z (n, D_in), c (conv pre-activation), v = silu(c),
    pre (step pre-activation), Δ, B, C (n, N), A (D_in, N), h (n, D_in, N) the scan states,
    r = o ⊙ silu(z) (the input of out_proj) and y = out_proj(r). Differentiable in X."""
    X = _block_tensor(block, X)
    Din, N, K, r = block.d_inner, block.d_state, block.d_conv, block.dt_rank
    W_in, b_in = block.in_proj.weight, block.in_proj.bias
    uz = X @ W_in.T + (0 if b_in is None else b_in)
    u, z = uz[:, :Din], uz[:, Din:]
    w, n = block.taps(), len(X)
    c = u.new_zeros(n, Din) + (0 if block.conv1d.bias is None else block.conv1d.bias)
    for k in range(min(K, n)):
        c = c + F.pad(w[k] * u[:n - k], (0, 0, k, 0))
    v = F.silu(c)
    Wx = block.x_proj.weight
    pre = (v @ Wx[:r].T) @ block.dt_proj.weight.T + block.dt_proj.bias
    Delta = F.softplus(pre, threshold=40.0)
    B, C = v @ Wx[r:r + N].T, v @ Wx[r + N:].T
    A = -torch.exp(block.A_log)
    h, states = u.new_zeros(Din, N), []
    for t in range(n):
        h = torch.exp(Delta[t, :, None] * A) * h + Delta[t, :, None] * B[t] * v[t, :, None]
        states.append(h)
    h = torch.stack(states)
    o = torch.einsum("tqn,tn->tq", h, C) + block.D * v
    rr = o * F.silu(z)
    y = rr @ block.out_proj.weight.T + (0 if block.out_proj.bias is None else block.out_proj.bias)
    return {"u": u, "z": z, "c": c, "v": v, "pre": pre, "Delta": Delta, "B": B, "C": C, "A": A, "h": h, "o": o,
            "r": rr, "y": y}


@dataclass(frozen=True)
class BlockPath:
    """J_ij of a MambaBlock by the closed form of {prf:ref}`prop-block-gradient` (`mamba_block_path`).

    jacobian: J_ij (d_model, d_model); inner: ∂r_i/∂x_j (D_in, d_model), r = o ⊙ silu(z);
    launch: j' = min(i, j + d_conv − 1), the last position the token reaches through the conv;
    tau: τ_q = Σ_{t=j'+1}^{i} Δ_t[q] (D_in,) (zero when i <= j + d_conv − 1);
    launch_state: S = ∂h_{j'}/∂x_j (D_in, N, d_model); bound: the bound (2') of the proposition
    (NaN inside the window); core: what the scan core's formula (token launched at j alone, the
    conv's later taps ignored) would give for J_ij at j < i; at i = j it is set to J_ii itself (formula (1)
    is stated for j < i only), so comparing it with J_ii checks nothing.
    """

    jacobian: np.ndarray
    inner: np.ndarray
    launch: int
    tau: np.ndarray
    launch_state: np.ndarray
    bound: float
    core: np.ndarray


def mamba_block_path(block: Any, X: Any, i: int, j: int, *, window: int | None = None,
                     bound: bool = True) -> BlockPath:
    """∂y_i/∂x_j of a MambaBlock (0-based 0 <= j <= i < n) by the closed form of
    {prf:ref}`prop-block-gradient`, with hand-written derivatives (no autograd):

        ∂h_i[q]/∂x_j = Σ_{t=j}^{min(i, j+K−1)} Λ_q(i, t) G_t[q],  Λ_q(i, t) = diag(exp(A[q] Σ_{s=t+1}^{i} Δ_s[q])),
        G_t[q] = (A[q] ⊙ e^{Δ_t[q]A[q]} ⊙ h_{t−1}[q] + v_t[q] B_t) ∂Δ_t[q] + Δ_t[q] v_t[q] ∂B_t + Δ_t[q] B_t ∂v_t[q],
        ∂r_i = silu(z_i) ⊙ (C_i·∂h_i + [i < j+K](∂C_i·h_i + D ⊙ ∂v_i)) + [i = j] o_i ⊙ silu'(z_i) W_z,

    with ∂c_t = diag(w_{t−j}) V (t − j < K), J_ij = U ∂r_i. `window` overrides K (for tests only);
    bound=False skips the bound (2'), whose spectral norms are the costly part at large widths.
    """
    X = _block_tensor(block, X)
    n = len(X)
    i, j = int(i), int(j)
    if not 0 <= j <= i < n:
        raise ValueError(f"need 0 <= j <= i < n = {n}; got i = {i}, j = {j}")
    K = block.d_conv if window is None else int(window)
    Din, N, r = block.d_inner, block.d_state, block.dt_rank
    with torch.no_grad():
        val = mamba_values(block, X)
        Wz = block.in_proj.weight[Din:]
        Wx, w, A = block.x_proj.weight, block.taps(), val["A"]
        cum = torch.cat([val["Delta"].new_zeros(1, Din), torch.cumsum(val["Delta"], 0)])  # cum[t] = Σ_{s<t} Δ_s

        def decay(upto: int, t: int) -> torch.Tensor:  # Λ(upto, t): exp(A Σ_{s=t+1}^{upto} Δ_s), (Din, N)
            return torch.exp(A * (cum[upto + 1] - cum[t + 1])[:, None])

        last = min(i, j + K - 1)
        dv = {}
        S = X.new_zeros(Din, N, X.shape[1])
        core = None
        for t in range(j, last + 1):
            tap = w[t - j] if t - j < w.shape[0] else torch.zeros_like(w[0])  # window > K: no tap
            dv[t], dDelta = _window_derivatives(block, val, t, tap)
            dB = Wx[r:r + N] @ dv[t]
            h_prev = val["h"][t - 1] if t > 0 else torch.zeros_like(val["h"][0])
            Dt, vt, Bt = val["Delta"][t], val["v"][t], val["B"][t]
            G = ((A * torch.exp(Dt[:, None] * A) * h_prev + vt[:, None] * Bt)[:, :, None] * dDelta[:, None, :]
                 + (Dt * vt)[:, None, None] * dB[None] + (Dt[:, None] * Bt)[:, :, None] * dv[t][:, None, :])
            S = decay(t, t - 1)[:, :, None] * S + G if t > j else G
            if t == j:
                core = G
        dh = decay(i, last)[:, :, None] * S
        dh_core = decay(i, j)[:, :, None] * core
        s_i = F.silu(val["z"][i])
        do = torch.einsum("qnd,n->qd", dh, val["C"][i])
        do_core = torch.einsum("qnd,n->qd", dh_core, val["C"][i])
        if i in dv:  # the output position inside the window: C_i, v_i (skip) depend on x_j
            dC = Wx[r + N:] @ dv[i]
            local = torch.einsum("qn,nd->qd", val["h"][i], dC) + block.D[:, None] * dv[i]
            do = do + local
            do_core = do_core + (local if i == j else 0)
        inner, inner_core = s_i[:, None] * do, s_i[:, None] * do_core
        if i == j:
            gate = (val["o"][i] * _silu_slope(val["z"][i]))[:, None] * Wz
            inner, inner_core = inner + gate, inner_core + gate
        U = block.out_proj.weight
        tau = (cum[i + 1] - cum[last + 1]).numpy()
        limit = math.nan
        if bound and i > j + K - 1:
            a_min = (-A).min(1).values
            rows = s_i.abs() * torch.exp(-a_min * (cum[i + 1] - cum[last + 1])) * torch.linalg.matrix_norm(S, ord=2)
            limit = float(torch.linalg.matrix_norm(U, ord=2) * torch.linalg.vector_norm(val["C"][i]) *
                          torch.linalg.vector_norm(rows))
        return BlockPath((U @ inner).numpy(), inner.numpy(), last, tau, S.numpy(), limit, (U @ inner_core).numpy())


def _window_derivatives(block: Any, val: dict, t: int, tap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # ∂v_t and ∂Δ_t with respect to x_j, each (D_in, d_model), where the conv carries x_j to t with
    # weight `tap` = w_{t−j} (D_in,): ∂c_t = diag(tap) V, ∂v_t = silu'(c_t) ∂c_t, ∂Δ_t = σ(pre_t) W_Δ ∂v_t.
    dv = (_silu_slope(val["c"][t]) * tap)[:, None] * block.in_proj.weight[:block.d_inner]
    W_delta = block.x_proj.weight[:block.dt_rank]                                # (dt_rank, D_in)
    return dv, torch.sigmoid(val["pre"][t])[:, None] * (block.dt_proj.weight @ (W_delta @ dv))


def step_projection(block: Any) -> torch.Tensor:
    """W_Δ = dt_proj.weight · x_proj.weight[:dt_rank], shape (D_in, D_in), rank <= dt_rank: the step
    pre-activation of a MambaBlock is W_Δ v_t + dt_proj.bias."""
    return block.dt_proj.weight @ block.x_proj.weight[:block.dt_rank]


def closing_slopes(block: Any, direction: Any) -> np.ndarray:
    """σ_q(ξ) = W_Δ[q,:] relu(a(ξ)) with a(ξ) = (Σ_k w_k) ⊙ V ξ, shape (D_in,): along tokens χξ the
    step pre-activation of channel q on a constant stretch is χσ_q(ξ) + O(1) ({prf:ref}`cor-block-gate-closing`)."""
    xi = torch.as_tensor(np.asarray(direction, dtype=float)).to(block.D.dtype)
    if xi.shape != (block.d_model,):
        raise ValueError(f"direction must have shape ({block.d_model},); got {tuple(xi.shape)}")
    with torch.no_grad():
        a = block.taps().sum(0) * (block.in_proj.weight[:block.d_inner] @ xi)
        return (block.dt_proj.weight @ (block.x_proj.weight[:block.dt_rank] @ torch.relu(a))).numpy()  # W_Δ relu(a)


def _step_pre(block: Any, u: torch.Tensor) -> torch.Tensor:
    """p(u) of `step_preactivations` as a differentiable tensor, u (..., d_model) -> (..., D_in)."""
    x = u @ block.in_proj.weight[:block.d_inner].T
    if block.in_proj.bias is not None:
        x = x + block.in_proj.bias[:block.d_inner]
    c = block.taps().sum(0) * x + (0 if block.conv1d.bias is None else block.conv1d.bias)
    low = F.silu(c) @ block.x_proj.weight[:block.dt_rank].T                  # W_δ v, rank dt_rank
    return low @ block.dt_proj.weight.T + block.dt_proj.bias


def step_preactivations(block: Any, token: Any) -> np.ndarray:
    """p_q(u) = W_Δ[q,:] silu(w̄ ⊙ (V u + b_u) + b_c) + b_Δ[q] for a token u (d_model,), or for each of a
    stack of tokens (..., d_model); shape (..., D_in): the step pre-activation of a MambaBlock at every
    position whose d_conv taps all see u ({prf:ref}`cor-block-gate-closing` 1); channel q is closed at
    level μ where p_q(u) <= −μ."""
    u = torch.as_tensor(np.asarray(token, dtype=float)).to(block.D.dtype)
    if u.ndim == 0 or u.shape[-1] != block.d_model:
        raise ValueError(f"token must have shape (..., {block.d_model}); got {tuple(u.shape)}")
    with torch.no_grad():
        return _step_pre(block, u).numpy()


def closing_witnesses(block: Any, channels: Any, rms: float = 1.0, *, steps: int = 100, seed: Any = 0
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, levels): for each channel q of `channels`, a token u_q of root-mean-square `rms` found by
    projected gradient descent on p_q(u) over that sphere (normalised steps shrinking to 0, the best
    iterate kept), and its level −p_q(u_q) (`step_preactivations`, recomputed): a witness that a token of
    that size closes q at that level, not the least p_q on the sphere. tokens (|Q|, d_model), levels (|Q|,)."""
    Q = np.asarray(channels, dtype=int)
    steps, R = check_int(steps, "steps"), float(rms) * math.sqrt(block.d_model)
    if not R > 0:
        raise ValueError(f"rms must be > 0; got {rms}")
    U = torch.from_numpy(as_generator(seed).standard_normal((len(Q), block.d_model))).to(block.D.dtype)
    U = R * U / U.norm(dim=1, keepdim=True)
    rows = torch.arange(len(Q))
    best, best_p = U.clone(), torch.full((len(Q),), math.inf, dtype=U.dtype)
    for k in range(steps):
        U.requires_grad_(True)
        p = _step_pre(block, U)[rows, torch.from_numpy(Q)]
        (grad,) = torch.autograd.grad(p.sum(), U)
        with torch.no_grad():
            better = p < best_p
            best[better], best_p[better] = U[better], p[better]
            U = U - 0.3 * R * (1 - k / steps) * grad / grad.norm(dim=1, keepdim=True).clamp_min(1e-300)
            U = R * U / U.norm(dim=1, keepdim=True)
    tokens = best.detach().numpy()
    return tokens, -step_preactivations(block, tokens)[np.arange(len(Q)), Q]


def least_closing_scale(block: Any, direction: Any, channels: Any, closing: float, scales: Any) -> float:
    """The first χ of the increasing grid `scales` at which the token χξ closes every channel of
    `channels` at level μ = `closing` (every p_q(χξ) <= −μ, `step_preactivations`); inf if none does.
    A grid reading, not a minimum over χ (p_q(χξ) need not be monotone in χ)."""
    Q = np.asarray(channels, dtype=int)
    grid = np.asarray(scales, dtype=float)
    pre = step_preactivations(block, grid[:, None] * np.asarray(direction, dtype=float)[None, :])
    closes = (pre[:, Q] <= -closing).all(1)
    return float(grid[np.argmax(closes)]) if closes.any() else math.inf


def closing_scale(block: Any, direction: Any, channels: Any, closing: float) -> float:
    """χ of the proof of {prf:ref}`cor-block-gate-closing`: the least χ >= 0 with
    χσ_q(ξ) + b_Δ[q] + ‖W_Δ[q,:]‖₁(‖b̄‖_∞ + 0.2785) <= −μ for every q in `channels` (each σ_q < 0),
    b̄ = conv bias + (Σ_k w_k) ⊙ in_proj's x-bias: then the step pre-activation is <= −μ on a constant stretch."""
    Q = np.asarray(channels, dtype=int)
    sigma = closing_slopes(block, direction)[Q]
    if len(Q) == 0 or (sigma >= 0).any():
        raise ValueError("channels must be a nonempty set of channels with σ_q(direction) < 0")
    with torch.no_grad():
        wsum = block.taps().sum(0)
        bbar = torch.zeros_like(wsum)
        if block.conv1d.bias is not None:
            bbar = bbar + block.conv1d.bias
        if block.in_proj.bias is not None:
            bbar = bbar + wsum * block.in_proj.bias[:block.d_inner]
        slack = (step_projection(block).abs().sum(1) * (bbar.abs().max() + SILU_GAP) + block.dt_proj.bias).numpy()[Q]
    return float(max(0.0, ((closing + slack) / -sigma).max()))


def block_closing_input(block: Any, n: int, j: int, direction: Any, chi: float, *, seed: Any = 0) -> np.ndarray:
    """The input of {prf:ref}`cor-block-gate-closing`: random tokens of unit root-mean-square before j
    and at j (x_j = w), then x_t = χ ξ/‖ξ‖·‖ξ‖ = χξ for t > j (0-based j); shape (n, d_model)."""
    rng = as_generator(seed)
    X = rng.standard_normal((n, block.d_model))
    X /= np.sqrt((X ** 2).mean(1, keepdims=True))
    X[j + 1:] = chi * np.asarray(direction, dtype=float)
    return X


@dataclass(frozen=True)
class BlockClosing:
    """What `block_closing_check` measured on one MambaBlock and gate-closing input.

    channels: Q; chi: the scale of the closing token; longest: ‖χξ‖; worst_pre: the largest step
    pre-activation over q ∈ Q and t > j + K − 1 (the hypothesis asks <= −μ); distances: D = i − j;
    ratio: max_q ‖M_i[q] − J⁰_q‖ / (a_max (i − j') e^{−μ} Σ_k ‖R_{q,k}‖) per distance (<= 1 by the
    corollary), at the largest level the input meets, μ = −worst_pre (>= the requested `closing`); drift: max_q ‖M_i[q] − J⁰_q‖/‖J⁰_q‖ per distance; autograd_gap: the closed-form
    rows M_i[q] against autograd for a few q at the last i (relative); J_norms: ‖J_ij‖_F per distance.
    """

    channels: np.ndarray
    chi: float
    longest: float
    worst_pre: float
    distances: np.ndarray
    ratio: np.ndarray
    drift: np.ndarray
    autograd_gap: float
    J_norms: np.ndarray


def carrying_channels(block: Any, direction: Any, count: int | None = None) -> np.ndarray:
    """The channels q with σ_q(ξ) < 0 (the step gate closes along χξ) and W_z[q,:]ξ > 0 (the output
    gate silu(z_q) opens, growing like χ, instead of closing like χe^{−χ|W_z[q,:]ξ|}); with `count`, the `count` of them
    with the most negative σ_q (the smaller the |σ_q|, the larger the token that closes q)."""
    with torch.no_grad():
        zrow = (block.in_proj.weight[block.d_inner:] @ torch.as_tensor(np.asarray(direction, dtype=float)).to(
            block.D.dtype)).numpy()
    sigma = closing_slopes(block, direction)
    Q = np.flatnonzero((sigma < 0) & (zrow > 0))
    return Q if count is None else np.sort(Q[np.argsort(sigma[Q])[:count]])


def block_closing_check(block: Any, n: int, j: int, direction: Any, *, closing: float = 20.0,
                        channels: Any = None, distances: Any = None, autograd_rows: int = 3,
                        seed: Any = 0) -> BlockClosing:
    """{prf:ref}`cor-block-gate-closing` on a MambaBlock: Q = `channels` (default `carrying_channels`),
    χ = `closing_scale`, X = `block_closing_input`; the hypothesis is measured on the step
    pre-activations of the block at X, the conclusion at every i = j + K, …, n − 1 from the exact
    rows M_i[q] = silu(z_i[q]) C_iᵀ Λ_q(i, j') S_q ({prf:ref}`prop-block-gradient`), themselves
    compared with autograd for `autograd_rows` channels at i = n − 1. `distances`: the D = i − j
    measured (default K, …, n − 1 − j; each >= K; the last is n − 1 − j)."""
    Q = carrying_channels(block, direction) if channels is None else np.asarray(channels, dtype=int)
    chi = closing_scale(block, direction, Q, closing)
    X = block_closing_input(block, n, j, direction, chi, seed=seed)
    K = block.d_conv
    with torch.no_grad():
        val = mamba_values(block, X)
        path = mamba_block_path(block, X, j + K, j, bound=False)
    worst_pre = float(val["pre"][j + K:, Q].max())
    S, launch = torch.from_numpy(path.launch_state), path.launch
    A, Delta, U = val["A"].detach(), val["Delta"].detach(), block.out_proj.weight.detach()
    s_bar, C_bar = F.silu(val["z"][-1]).detach(), val["C"][-1].detach()
    R = (s_bar[Q, None, None] * C_bar[None, :, None] * S[Q]).numpy()      # R_{q,k}, (|Q|, N, d)
    J0 = R.sum(1)
    scale = np.linalg.norm(R, axis=2).sum(1) * (-A).numpy()[Q].max(1)
    distances = np.arange(K, n - j) if distances is None else np.asarray(distances, dtype=int)
    if distances.min() < K or distances.max() != n - 1 - j:
        raise ValueError(f"distances must be >= d_conv = {K} and end at n − 1 − j = {n - 1 - j}")
    ratio, drift, norms = [], [], []
    for D in distances:
        i = j + D
        tau = Delta[launch + 1:i + 1].sum(0)
        M = (F.silu(val["z"][i]).detach()[:, None] *
             torch.einsum("n,qnd->qd", val["C"][i].detach(), torch.exp(A * tau[:, None])[:, :, None] * S)).numpy()
        gap = np.linalg.norm(M[Q] - J0, axis=1)
        ratio.append((gap / (scale * (i - launch) * math.exp(worst_pre))).max())   # μ = −worst_pre >= closing
        drift.append((gap / np.linalg.norm(J0, axis=1)).max())
        norms.append(float(torch.linalg.matrix_norm(U @ torch.from_numpy(M))))
    Xt = torch.from_numpy(X).requires_grad_(True)
    r_last = mamba_values(block, Xt)["r"][-1]
    rows = [torch.autograd.grad(r_last[q], Xt, retain_graph=True)[0][j].numpy() for q in Q[:autograd_rows]]
    auto_gap = float(max(np.linalg.norm(row - M[q]) / np.linalg.norm(row) for row, q in zip(rows, Q)))
    return BlockClosing(Q, chi, float(np.linalg.norm(X[-1])), worst_pre, distances, np.array(ratio),
                        np.array(drift), auto_gap, np.array(norms))


def alibi_attention(d: int, heads: int, n_max: int, *, d_k: int | None = None, seed: Any = 0) -> SoftmaxAttention:
    """Causal softmax attention with Gaussian projections (`SoftmaxAttention.random`) and ALiBi's
    position scores b_h[ℓ] = −m_h ℓ, m_h = 2^{−8h/H} (h = 1..H; ALiBi's slopes for H a power of two),
    shape (H, n_max)."""
    base = SoftmaxAttention.random(d, d, heads, d_k=d_k, seed=seed)
    bias = -alibi_slopes(heads)[:, None] * np.arange(n_max)[None, :]
    return SoftmaxAttention(base.W_Q.detach(), base.W_K.detach(), base.W_V.detach(), base.W_O.detach(),
                            position_bias=bias)


@dataclass(frozen=True)
class AlibiCheck:
    """{prf:ref}`prop-alibi-attenuation` at one input (`alibi_check`).

    weight_ratio: max over heads, queries i and keys j < i of α^h_ij / e^{−m_h(i−j) + ω^h_i};
    sharp_ratio: the same against e^{−m_h(i−j) + s^h_ij − s^h_ii}; jacobian_ratio: max over j < i of
    ‖J_ij‖₂ / (its bound) at the query `i`; identity_error: max over heads, i and j < i of
    |α^h_ij / (α^h_ii e^{−m_h(i−j) + s^h_ij − s^h_ii}) − 1|, part 1's identity checked two-sided (the
    ratios are one-sided: slopes steeper than `slopes` keep them <= 1, but not this error near 0);
    formula_error: max over j < i of ‖J_ij − Σ_h α^h_ij V_h[I + (x_j − x̄^h_i)g_hᵀ]‖_F / ‖J_ij‖_F at the query
    `i`, autograd against part 2's Jacobian formula with α^h from the content scores and `slopes` (two-sided).
    """

    weight_ratio: float
    sharp_ratio: float
    jacobian_ratio: float
    identity_error: float
    formula_error: float


def alibi_check(attention: SoftmaxAttention, X: Any, slopes: Any, i: int | None = None) -> AlibiCheck:
    """Weights and Jacobian of an ALiBi head set at X (n, d) against {prf:ref}`prop-alibi-attenuation`:
    α^h_ij <= e^{−m_h ℓ + s^h_ij − s^h_ii} <= e^{−m_h ℓ + ω^h_i} (ℓ = i − j >= 1, ω^h_i the range of
    query i's content scores over t <= i) and
    ‖J_ij‖₂ <= Σ_h min(1, e^{−m_h ℓ + s^h_ij − s^h_ii})‖V_h‖₂(1 + ‖g_h‖₂ max_{t<=i} ‖x_j − x_t‖₂)
    at query `i` (default n − 1), g_h = W_K^{h⊤}W_Q^h x_i/√d_k. Content scores are recomputed here
    from the projections, not read from the layer."""
    X = torch.as_tensor(_array(X))
    n = len(X)
    i = n - 1 if i is None else int(i)
    m = torch.as_tensor(_array(slopes))
    with torch.no_grad():
        alpha = attention.weights(X)                                          # (H, n, n)
        Q = torch.einsum("hkd,nd->hnk", attention.W_Q, X)
        Kt = torch.einsum("hkd,nd->hnk", attention.W_K, X)
        s = Q @ Kt.transpose(1, 2) / math.sqrt(attention.d_k)                 # content scores (H, n, n)
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        causal = lag >= 0
        hi = s.masked_fill(~causal, -math.inf).max(-1).values
        lo = s.masked_fill(~causal, math.inf).min(-1).values
        omega = hi - lo                                                       # (H, n)
        past = lag >= 1
        env = torch.exp(-m[:, None, None] * lag + omega[:, :, None])
        sharp = torch.exp(-m[:, None, None] * lag + s - torch.diagonal(s, dim1=1, dim2=2)[:, :, None])
        weight_ratio = float((alpha / env)[:, past].max())
        sharp_ratio = float((alpha / sharp)[:, past].max())
        newest = torch.diagonal(alpha, dim1=1, dim2=2)[:, :, None]              # α^h_ii
        identity_error = float((alpha / (newest * sharp) - 1).abs()[:, past].max())
        V = attention.values()
        g = torch.einsum("hkd,hk->hd", attention.W_K, Q[:, i]) / math.sqrt(attention.d_k)
        spread = torch.cdist(X[: i + 1], X[: i + 1]).max(1).values           # max_t ‖x_j − x_t‖, t <= i
        Vn = torch.linalg.matrix_norm(V, ord=2)
        bound = (sharp[:, i, : i + 1].clamp(max=1) * (Vn[:, None] * (1 + torch.linalg.vector_norm(g, dim=1)[:, None] * spread))).sum(0)
        # part 2's formula J_ij = Σ_h α^h_ij V_h[I + (x_j − x̄^h_i) g_hᵀ], weights from s and `slopes` alone
        a = torch.softmax(s[:, i, : i + 1] - m[:, None] * torch.arange(i, -1, -1, dtype=s.dtype), dim=-1)
        spread_h = X[None, : i + 1] - (a @ X[: i + 1])[:, None]                # x_j − x̄^h_i, (H, i + 1, d)
        formula = (torch.einsum("ht,hpd->tpd", a, V)
                   + torch.einsum("ht,hpd,htd,he->tpe", a, V, spread_h, g)).numpy()
    J = jacobian_blocks(attention, X.numpy(), i)                              # (i + 1, p, d)
    Jn = np.linalg.norm(J, ord=2, axis=(1, 2))
    gap = np.linalg.norm(J[:i] - formula[:i], axis=(1, 2)) / np.linalg.norm(J[:i], axis=(1, 2))
    return AlibiCheck(weight_ratio, sharp_ratio, float((Jn[:i] / bound.numpy()[:i]).max()), identity_error,
                      float(gap.max()))


def planted_alibi_input(attention: SoftmaxAttention, n: int, lag: int, *, head: int = 0, radius: float | None = None,
                        seed: Any = 0) -> np.ndarray:
    """Adversarial input for {prf:ref}`prop-alibi-attenuation`: random tokens of norm `radius`
    (default √d), and at j = n − 1 − lag the key that maximises head `head`'s content score
    s_{n−1,j} over the ball of that radius: x_j = radius · g/‖g‖, g = W_K^⊤W_Q x_{n−1}."""
    rng = as_generator(seed)
    X = rng.standard_normal((n, attention.d))
    R = math.sqrt(attention.d) if radius is None else float(radius)
    X *= R / np.linalg.norm(X, axis=1, keepdims=True)
    with torch.no_grad():
        g = (attention.W_K[head].T @ attention.W_Q[head] @ torch.from_numpy(X[-1])).numpy()
    X[n - 1 - lag] = R * g / np.linalg.norm(g)
    return X


def probe_profile(model: Any, X: Any, i: int | None = None, *, probes: int = 4, seed: Any = 0) -> np.ndarray:
    """An estimate of ‖J_{i,i−D}‖_F, D = 0..i (default i = n − 1), from `probes` Gaussian output
    directions g ~ N(0, I_p): the root mean square of ‖gᵀJ_{i,j}‖₂ over the probes (E‖gᵀJ‖² = ‖J‖_F²),
    one reverse pass each — for widths where the p passes of `jacobian_norms` are too slow."""
    rng = as_generator(seed)
    X = torch.as_tensor(_array(X)).to(model.dtype if hasattr(model, "dtype") else torch.float64)
    n = len(X)
    i = n - 1 if i is None else int(i)
    X = X.clone().requires_grad_(True)
    with torch.enable_grad():
        y = model(X)[i]
        G = torch.from_numpy(rng.standard_normal((probes, y.shape[-1]))).to(y.dtype)
        sq = sum(torch.autograd.grad(y @ G[k], X, retain_graph=k + 1 < probes)[0][: i + 1].pow(2).sum(1)
                 for k in range(probes))
    return np.sqrt(sq.detach().to(torch.float64).numpy() / probes)[::-1].copy()


def mamba2_values(block: Any, X: Any) -> dict[str, torch.Tensor]:
    """The forward quantities of a Mamba2Block at one sequence X (n, d_model), recomputed from its
    parameters: z, v (n, D_in), Δ (n, H), B, C (n, G, N), a (H,), s (n, H, N, headdim) the states,
    r = o ⊙ silu(z) (n, D_in) and y. Differentiable in X."""
    from lib import Mamba2Block
    if not isinstance(block, Mamba2Block):
        raise TypeError(f"block must be a lib.Mamba2Block; got {type(block).__name__}")
    X = torch.as_tensor(np.asarray(X, dtype=float) if not torch.is_tensor(X) else X).to(block.D.dtype)
    Din, G, N, H, P = block.d_inner, block.ngroups, block.d_state, block.nheads, block.headdim
    proj = X @ block.in_proj.weight.T + (0 if block.in_proj.bias is None else block.in_proj.bias)
    z, xBC, dt = proj.split([Din, Din + 2 * G * N, H], -1)
    w, n = block.conv1d.weight[:, 0].flip(-1).T, len(X)                  # (K, conv_dim)
    pre = xBC.new_zeros(xBC.shape) + (0 if block.conv1d.bias is None else block.conv1d.bias)
    for k in range(min(block.d_conv, n)):
        pre = pre + F.pad(w[k] * xBC[:n - k], (0, 0, k, 0))
    v, B, C = F.silu(pre).split([Din, G * N, G * N], -1)
    B, C = B.unflatten(-1, (G, N)), C.unflatten(-1, (G, N))
    Delta, a = F.softplus(dt + block.dt_bias, threshold=40.0), -torch.exp(block.A_log)
    group = torch.arange(H) // (H // G)
    heads = v.unflatten(-1, (H, P))
    s, states = X.new_zeros(H, N, P), []
    for t in range(n):
        s = torch.exp(Delta[t] * a)[:, None, None] * s + Delta[t][:, None, None] * B[t, group][:, :, None] * heads[t][:, None, :]
        states.append(s)
    s = torch.stack(states)
    o = torch.einsum("thnp,thn->thp", s, C[:, group]) + block.D[:, None] * heads
    r = o.flatten(-2) * F.silu(z)
    y = (block.norm.weight * r * block.norm.inverse_rms(r)) @ block.out_proj.weight.T
    y = y if block.out_proj.bias is None else y + block.out_proj.bias
    return {"z": z, "v": v, "Delta": Delta, "B": B, "C": C, "a": a, "s": s, "r": r, "y": y}


def mamba2_window_prediction(block: Any, X: Any, i: int, j: int, *, window: int | None = None) -> np.ndarray:
    """J_ij of a Mamba2Block for D = i − j >= d_conv by the Mamba-2 form of (1′)
    ({prf:ref}`prop-block-gradient` 4): U N′(r_i) diag(silu z_i) [e^{a_h τ_h} C_iᵀ S^h]_h with
    S^h = ∂s^h_{j'}/∂x_j (j' = j + K − 1; by autograd of the state alone), τ_h = Σ_{t=j'+1}^{i} Δ^h_t and
    N′ the norm's Jacobian at r_i (autograd of the position-wise norm). `window` overrides K (tests)."""
    K = block.d_conv if window is None else int(window)
    X = torch.as_tensor(_array(X))
    jp = j + K - 1
    if not j + block.d_conv <= i < len(X):
        raise ValueError(f"need j + d_conv <= i < n; got i = {i}, j = {j}")
    H = block.nheads

    def state(xj: torch.Tensor) -> torch.Tensor:
        Y = torch.cat([X[:j], xj[None], X[j + 1:jp + 1]])
        return mamba2_values(block, Y)["s"][jp]                            # (H, N, P)

    S = torch.autograd.functional.jacobian(state, X[j])                    # (H, N, P, d)
    with torch.no_grad():
        val = mamba2_values(block, X)
        group = torch.arange(H) // (H // block.ngroups)
        tau = val["Delta"][jp + 1:i + 1].sum(0)                             # (H,)
        dO = torch.exp(val["a"] * tau)[:, None, None] * torch.einsum("hn,hnpd->hpd", val["C"][i, group], S)
        dR = F.silu(val["z"][i])[:, None] * dO.flatten(0, 1)               # (D_in, d)
    norm = torch.autograd.functional.jacobian(lambda r: block.norm.weight * r * block.norm.inverse_rms(r),
                                              val["r"][i].detach())
    return (block.out_proj.weight @ norm @ dR).detach().numpy()


def mamba_block_jacobian(block: Any, X: Any, i: int, j: int, *, values: dict | None = None) -> np.ndarray:
    """J_ij (d_model, d_model) of a MambaBlock (0-based 0 <= j <= i < n) by part 1 of
    {prf:ref}`prop-block-gradient` with the sum over the state index n taken first: with
    ω_t[q,n] = C_i[n] Λ_q(i, t)[n], row q of ∂o_i/∂x_j is Σ_t (ω_t·(A e^{Δ_t A} h_{t−1} + v_t B_t))[q] ∂Δ_t[q]
    + Δ_t[q]v_t[q] ω_t[q]·∂B_t + Δ_t[q](ω_t·B_t)[q] ∂v_t[q] (+ the in-window terms of `mamba_block_path`),
    so no (D_in, N, d) state derivative is formed — the same closed form as `mamba_block_path`, cheap
    enough for the 130m shape. `values`: `mamba_values(block, X)` if already computed."""
    X = _block_tensor(block, X)
    n, i, j = len(X), int(i), int(j)
    if not 0 <= j <= i < n:
        raise ValueError(f"need 0 <= j <= i < n = {n}; got i = {i}, j = {j}")
    K, Din, N, r = block.d_conv, block.d_inner, block.d_state, block.dt_rank
    with torch.no_grad():
        val = mamba_values(block, X) if values is None else values
        Wz = block.in_proj.weight[Din:]
        Wx, w, A, Delta = block.x_proj.weight, block.taps(), val["A"], val["Delta"]
        cum = torch.cat([Delta.new_zeros(1, Din), torch.cumsum(Delta, 0)])
        do = X.new_zeros(Din, X.shape[1])
        for t in range(j, min(i, j + K - 1) + 1):
            dv, dDelta = _window_derivatives(block, val, t, w[t - j])
            omega = val["C"][i] * torch.exp(A * (cum[i + 1] - cum[t + 1])[:, None])        # (D_in, N)
            h_prev = val["h"][t - 1] if t > 0 else torch.zeros_like(val["h"][0])
            Dt, vt, Bt = Delta[t], val["v"][t], val["B"][t]
            launch = (omega * (A * torch.exp(Dt[:, None] * A) * h_prev + vt[:, None] * Bt)).sum(1)
            do += (launch[:, None] * dDelta + (Dt * vt)[:, None] * (omega @ (Wx[r:r + N] @ dv))
                   + (Dt * (omega * Bt).sum(1))[:, None] * dv)
            if t == i:  # the output position inside the window: C_i and the skip's v_i depend on x_j
                do += val["h"][i] @ (Wx[r + N:] @ dv) + block.D[:, None] * dv
        inner = F.silu(val["z"][i])[:, None] * do
        if i == j:
            inner += (val["o"][i] * _silu_slope(val["z"][i]))[:, None] * Wz
        return (block.out_proj.weight @ inner).numpy()


def mamba2_block_jacobian(block: Any, X: Any, i: int, j: int, *, values: dict | None = None) -> np.ndarray:
    """J_ij (d_model, d_model) of a Mamba2Block (0-based 0 <= j <= i < n) by autograd
    (`torch.func.jacrev`) of y_i as a function of x_j alone, written in SSD's quadratic form
    ({prf:ref}`prop-ssd`) with the other tokens held fixed:
    o_i = e^{a Σ_{s=j}^{i} Δ_s} C_iᵀ s_{j−1} + Σ_{m=j}^{i} (C_i·B_m) e^{a Σ_{s=m+1}^{i} Δ_s} Δ_m v_m + D v_i,
    so only quantities of size D_in (not the states) carry the d_model tangents — cheap at the 130m
    shape (reverse mode in x_j's projection, then the input projection's matrix). Exact (checked against
    `jacobian_blocks` in the tests); not a formula of the book. `values`: `mamba2_values(block, X)`.""" 
    X = torch.as_tensor(_array(X)).to(block.D.dtype)
    n, i, j = len(X), int(i), int(j)
    if not 0 <= j <= i < n:
        raise ValueError(f"need 0 <= j <= i < n = {n}; got i = {i}, j = {j}")
    with torch.no_grad():
        val = mamba2_values(block, X) if values is None else values
        val = {k: v.detach() for k, v in val.items()}
    Din, G, N, H, P, K = block.d_inner, block.ngroups, block.d_state, block.nheads, block.headdim, block.d_conv
    group = torch.arange(H) // (H // G)
    w = block.conv1d.weight[:, 0].flip(-1).T.detach()                         # (K, conv_dim)
    W_in = block.in_proj.weight.detach()
    b_in = None if block.in_proj.bias is None else block.in_proj.bias.detach()
    proj = lambda x: x @ W_in.T + (0 if b_in is None else b_in)
    with torch.no_grad():
        P_all = proj(X)
        xBC_all = P_all[:, Din:2 * Din + 2 * G * N]
        pre_all = block._convolve(xBC_all[None])[0]                              # the block's own conv
    a, Delta, s_prev = val["a"], val["Delta"], (val["s"][j - 1] if j > 0 else None)
    last = min(i, j + K - 1)
    norm_w = block.norm.weight.detach()
    beyond_tail, beyond_o = torch.zeros_like(a), torch.zeros(H, P, dtype=X.dtype)
    for m in range(i, last, -1):    # positions the conv does not carry x_j to: constants
        weight = (val["C"][i][group] * val["B"][m][group]).sum(-1) * torch.exp(a * beyond_tail) * Delta[m]
        beyond_o = beyond_o + weight[:, None] * val["v"][m].unflatten(-1, (H, P))
        beyond_tail = beyond_tail + Delta[m]
    if s_prev is not None:   # per group, s_{j−1} of its heads as an (N, heads · P) matrix
        s_groups = [s_prev[group == g].permute(1, 0, 2).reshape(N, -1) for g in range(G)]

    def output(pj: torch.Tensor) -> torch.Tensor:   # y_i from x_j's projection p_j = in_proj(x_j)
        z_i = pj[:Din] if i == j else val["z"][i]
        dxBC = pj[Din:2 * Din + 2 * G * N] - xBC_all[j]
        v, B, C, D_ = {}, {}, {}, {}
        for m in range(j, last + 1):
            # the conv carries x_j to positions j..j+K−1
            vm, Bm, Cm = F.silu(pre_all[m] + w[m - j] * dxBC).split([Din, G * N, G * N])
            v[m], B[m], C[m] = vm, Bm.unflatten(-1, (G, N)), Cm.unflatten(-1, (G, N))
            D_[m] = F.softplus(pj[2 * Din + 2 * G * N:] + block.dt_bias.detach(), threshold=40.0) if m == j \
                else Delta[m]
        C_i = C[i] if i <= last else val["C"][i]                               # (G, N)
        Ci = C_i[group]                                                       # (H, N)
        tail, o = beyond_tail, beyond_o                                       # the terms m > j + K − 1
        for m in range(last, j - 1, -1):   # tail = Σ_{s=m+1}^{i} Δ_s
            o = o + ((Ci * B[m][group]).sum(-1) * torch.exp(a * tail) * D_[m])[:, None] * v[m].unflatten(-1, (H, P))
            tail = tail + D_[m]
        if s_prev is not None:   # C_iᵀ s_{j−1}, group by group as vector-matrix products (no batched copies)
            prev = torch.cat([C_i[g] @ s_groups[g] for g in range(G)]).unflatten(0, (H, P))
            o = o + torch.exp(a * tail)[:, None] * prev
        o = o + block.D.detach()[:, None] * (v[i] if i <= last else val["v"][i]).unflatten(-1, (H, P))
        rr = o.flatten() * F.silu(z_i)
        return block.out_proj.weight.detach() @ (norm_w * rr * block.norm.inverse_rms(rr))

    rows = slice(0 if i == j else Din, None)                                  # z_j reaches y_j only
    return (torch.func.jacrev(output)(P_all[j])[:, rows] @ W_in[rows]).numpy()   # ∂y_i/∂p_j · ∂p_j/∂x_j


def block_window_rows(block: Any, X: Any, outputs: Any) -> list[dict[str, Any]]:
    """For each output i in `outputs` and j <= i: D = i − j and, relative to ‖J_ij‖_F (autograd,
    `jacobian_blocks`), the error of `mamba_block_path`'s closed form, of the scan core's formula
    (`BlockPath.core`; NaN at D = 0, where formula (1) is not stated and `core` is J_ii by construction),
    and ‖J_ij‖_F / the bound (2′) (NaN inside the window)."""
    rows = []
    for i in outputs:
        J = jacobian_blocks(block, X, i)
        for j in range(i + 1):
            path, ref = mamba_block_path(block, X, i, j), np.linalg.norm(J[j])
            rows.append({"D": i - j, "error": np.linalg.norm(path.jacobian - J[j]) / ref,
                         "core": np.linalg.norm(path.core - J[j]) / ref if j < i else math.nan,
                         "ratio": ref / path.bound})
    return rows


def mamba2_window_rows(block: Any, X: Any, windows: Any = (4, 3)) -> list[dict[str, Any]]:
    """At the last output i = n − 1 and every j <= i − d_conv: the error of `mamba2_window_prediction`
    relative to ‖J_ij‖_F (autograd), once per launch window K in `windows` (the block's own first)."""
    n = len(_array(X))
    J = jacobian_blocks(block, X, n - 1)
    return [{"D": n - 1 - j, "K": K, "error": np.linalg.norm(mamba2_window_prediction(block, X, n - 1, j, window=K)
                                                           - J[j]) / np.linalg.norm(J[j])}
            for j in range(n - block.d_conv) for K in windows]


def block_jacobians_at(block: Any, X: Any, distances: Any) -> np.ndarray:
    """Exact J_{i,i−D} (len(distances), d_model, d_model) at the last output i = n − 1:
    `mamba_block_jacobian` for a MambaBlock, `mamba2_block_jacobian` for a Mamba2Block (the forward
    values computed once)."""
    from lib import Mamba2Block, MambaBlock
    n = len(_array(X))
    if isinstance(block, MambaBlock):
        jac, values = mamba_block_jacobian, mamba_values
    elif isinstance(block, Mamba2Block):
        jac, values = mamba2_block_jacobian, mamba2_values
    else:
        raise TypeError(f"block must be a lib.MambaBlock or lib.Mamba2Block; got {type(block).__name__}")
    with torch.no_grad():
        val = values(block, X)
    return np.stack([jac(block, X, n - 1, n - 1 - check_int(D, "distance", minimum=0), values=val)
                     for D in distances])


def block_reach_row(block: Any, X: Any, *, probes: int, eps: float, seed: Any = 0) -> tuple[np.ndarray, dict]:
    """(g, row) at the last output i = n − 1. g: the probe estimate of `probe_profile` (for the figure and
    the reaches). row: the reaches against g(1) and against g(4) (`read_profile` from D = 4 on), read off
    the estimate, except that the exact g(n − 1) settles whether they are n − 1; g(1) itself (the absolute
    level), the ratios g(4)/g(1), g(n−1)/g(1), g(n−1)/g(4) and max |g(2..3)/g(1) − 1| from exact
    norms (`block_jacobians_at` at D = 1, 2, 3, 4, n − 1); 'probe / exact' the estimate's largest relative
    deviation at those five distances; 'exact vs autograd' the largest relative gap between the probe
    norms ‖g_kᵀJ‖ recomputed from the exact blocks and the same probes by the block's own autograd."""
    n = len(_array(X))
    g = probe_profile(block, X, probes=probes, seed=seed)
    D = np.array([1, 2, 3, 4, n - 1])
    J = block_jacobians_at(block, X, D)
    exact = np.linalg.norm(J, axis=(1, 2))
    G = as_generator(seed).standard_normal((probes, J.shape[1]))               # probe_profile's probes
    probed = np.sqrt((np.einsum("kp,Dpd->Dkd", G, J) ** 2).sum(-1).mean(-1))
    # the exact end point settles whether the reach is the whole sequence: n − 1 if g(n−1) keeps eps
    # of the reference, else below n − 1 whatever the estimate reads
    settle = lambda reach, kept: n - 1 if kept else min(reach, n - 2)
    reach1 = settle(read_profile(g, eps).reach, exact[4] >= eps * exact[0])
    reach4 = settle(3 + read_profile(g[3:], eps).reach, exact[4] >= eps * exact[3])
    return g, {"reach from g(1)": reach1, "reach from g(4)": reach4, "g(1)": exact[0],
               "g(4)/g(1)": exact[3] / exact[0], "g(n−1)/g(1)": exact[4] / exact[0],
               "g(n−1)/g(4)": exact[4] / exact[3], "max |g(2..3)/g(1) − 1|": np.abs(exact[1:3] / exact[0] - 1).max(),
               "probe / exact": np.abs(g[D] / exact - 1).max(), "exact vs autograd": np.abs(probed / g[D] - 1).max()}


ALIBI_COLUMNS = {"weight_ratio": "α / e^{−mℓ+ω}", "sharp_ratio": "α / e^{−mℓ+s_ij−s_ii}",
                 "jacobian_ratio": "‖J‖ / bound 2", "identity_error": "|α / (α_ii e^{−mℓ+s_ij−s_ii}) − 1|",
                 "formula_error": "J vs formula 2"}


def alibi_battery(attention: SoftmaxAttention, slopes: Any, n: int, rng: np.random.Generator, *,
                  scales: Any = (0.3, 1.0, 3.0), lags: Any = (1, 4, 16), radius: float = 8.0) -> pd.DataFrame:
    """`alibi_check` on Gaussian inputs (n, d) at `scales`, and on `planted_alibi_input` for every head
    and every lag in `lags` ∪ {n − 1} below n; columns `ALIBI_COLUMNS`, one row per input."""
    rows = [{"input": f"Gaussian ×{s:g}"} | vars(alibi_check(attention, s * rng.standard_normal((n, attention.d)),
                                                              slopes)) for s in scales]
    for head in range(attention.H):
        for lag in sorted((set(lags) | {n - 1}) & set(range(1, n))):
            X = planted_alibi_input(attention, n, lag, head=head, radius=radius, seed=head)
            rows.append({"input": f"planted, head {head + 1}, lag {lag}"} | vars(alibi_check(attention, X, slopes)))
    return pd.DataFrame(rows).rename(columns=ALIBI_COLUMNS)


def block_closing_autograd_ratios(block: Any, n: int, j: int, direction: Any, *, closing: float,
                                  channels: Any = None, seed: Any = 0) -> np.ndarray:
    """{prf:ref}`cor-block-gate-closing` 2 against autograd on a (small) MambaBlock: on the input of
    `block_closing_input` with the proof's χ for level `closing`, for every q of `channels` (default: every
    q with σ_q(ξ) < 0) and every i >= j + K, ‖M_i[q,:] − J⁰_q‖ / (a_max,q (i − j − K + 1) e^{−μ_q} Σ_k ‖R_{q,k}‖)
    with the rows M_i[q,:] = ∂r_i[q]/∂x_j and S_q = ∂h_{j+K−1}[q]/∂x_j both by autograd (not by the
    closed form), J⁰_q, R_{q,k} from them, and μ_q = −max_{t >= j+K} p_t[q] the level the input meets for
    channel q ({Q} = {q} in the corollary); gaps at rounding level (1e-12 of the rows) count as 0.
    Shape (|Q|, n − j − K); <= 1 by the corollary."""
    sigma = closing_slopes(block, direction)
    Q = np.flatnonzero(sigma < 0) if channels is None else np.asarray(channels, dtype=int)
    X = block_closing_input(block, n, j, direction, closing_scale(block, direction, Q, closing), seed=seed)
    K = block.d_conv
    Xt = torch.from_numpy(X)

    def rows(xj: torch.Tensor) -> torch.Tensor:
        val = mamba_values(block, torch.cat([Xt[:j], xj[None], Xt[j + 1:]]))
        return torch.cat([val["h"][j + K - 1].flatten(), val["r"][j + K:].flatten()])

    jac = torch.autograd.functional.jacobian(rows, Xt[j])
    Din, N = block.d_inner, block.d_state
    S = jac[:Din * N].reshape(Din, N, -1)                                         # ∂h_{j+K−1}/∂x_j
    M = jac[Din * N:].reshape(n - j - K, Din, -1)                                 # ∂r_i/∂x_j, i >= j + K
    with torch.no_grad():
        val = mamba_values(block, X)
        s_bar, C_bar, A = F.silu(val["z"][-1]), val["C"][-1], val["A"]
        mu = -val["pre"][j + K:].max(0).values                                    # (D_in,)
    R = s_bar[:, None, None] * C_bar[None, :, None] * S                          # R_{q,k}, (D_in, N, d)
    J0 = R.sum(1)
    steps = torch.arange(1, n - j - K + 1, dtype=Xt.dtype)
    bound = ((-A).max(1).values * torch.exp(-mu) * R.norm(dim=2).sum(1))[None, :] * steps[:, None]
    gap = (M - J0[None]).norm(dim=2)
    floor = 1e-12 * torch.maximum(M.norm(dim=2), J0.norm(dim=1)[None])      # rounding: counted as no gap
    ratio = torch.where(gap <= floor, torch.zeros_like(gap), gap / bound)
    return ratio.T[torch.from_numpy(Q)].numpy()


def alibi_weight_limit(two_S: float, slope: float, D: int) -> float:
    """ᾱ_D = 1/(1 + e^{−2S} Σ_{m=1}^{D} e^{βm}): the largest weight a key at distance D can take in one
    ALiBi head (slope β) on tokens with content scores in [−S, S], from the D keys at lags 0..D−1 that
    every query at that distance sees ({prf:ref}`cor-attention-price`, keeping those terms)."""
    beta, D = float(slope), int(D)
    if D == 0:
        return 1.0                                              # no newer key competes
    log_expm1 = lambda x: x + math.log(-math.expm1(-x))         # ln(e^x − 1), x > 0, without overflow
    log_sum = beta + log_expm1(beta * D) - log_expm1(beta)
    return 1.0 / (1.0 + math.exp(min(log_sum - two_S, 700.0)))  # 1/(1 + e^700) underflows to ~0 anyway


def alibi_gain_limit(two_S: float, slope: float, D: int) -> float:
    """sup ‖J_{i,i−D}‖₂/‖V‖₂ allowed by the middle bound of {prf:ref}`cor-attention-price` with α <= ᾱ_D
    (`alibi_weight_limit`): f(min(ᾱ_D, α*)), f(α) = α(1 + 2S(1 − α)) increasing up to its vertex α*."""
    S = two_S / 2
    alpha = alibi_weight_limit(two_S, slope, D)
    if S > 0:
        alpha = min(alpha, (1 + 2 * S) / (4 * S))
    return alpha * (1 + 2 * S * (1 - alpha))


def alibi_full_strength_reach(two_S: float, slope: float, eps: float) -> int:
    """The largest D >= 0 with ᾱ_D >= 1 − ε (`alibi_weight_limit`): beyond it no bounded input gives a key
    at distance D the weight 1 − ε that J ≈ V_h needs (‖J − V_h‖_F >= (1 − α)‖V_h P_{g⊥}‖_F).

    Σ_{m<=D} e^{βm} <= c, c = e^{2S} ε/(1 − ε), i.e. D <= ln(1 + c(1 − e^{−β}))/β, evaluated in logs
    (ln(1 + e^x) with x = ln c + ln(1 − e^{−β})), so that large 2S (fan-in, d = 4096: 2S ≈ 1220) does
    not overflow."""
    beta = float(slope)
    if not (0 < eps < 1 and beta > 0):
        raise ValueError(f"need 0 < eps < 1 and slope > 0; got eps={eps!r}, slope={slope!r}")
    log_c = two_S + math.log(eps / (1 - eps))
    x = log_c + math.log(-math.expm1(-beta))
    log1p_exp = x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))
    D = max(0, math.floor(log1p_exp / beta))
    # ln Σ_{m<=D} e^{βm} = βD + ln(1 − e^{−βD}) − ln(1 − e^{−β}); settle ties (ᾱ_D = 1 − ε) by the definition
    log_sum = lambda D: beta * D + math.log(-math.expm1(-beta * D)) - math.log(-math.expm1(-beta))
    tol = 1e-12 * max(1.0, abs(log_c))
    while log_sum(D + 1) <= log_c + tol:
        D += 1
    while D > 0 and log_sum(D) > log_c + tol:
        D -= 1
    return D


def alibi_binding_distance(two_S: float, slope: float) -> int:
    """The first D >= 1 at which the sharper bound of {prf:ref}`cor-attention-price` 2, f(min(ᾱ_D, α*))‖V‖₂
    (`alibi_gain_limit`), is below ‖V‖₂: from there on every input of norm <= R attenuates the key at
    distance D (the bound falls with D). Compare `alibi_reach`, where the envelope (1 + 2S)e^{2S − βD}
    falls below ‖V‖₂, which is no earlier."""
    return alibi_gain_reach(two_S, slope, 1.0) + 1


def alibi_gain_reach(two_S: float, slope: float, level: float) -> int:
    """The largest D >= 0 with `alibi_gain_limit` >= level (0 if none; the limit falls with D), level > 0."""
    if not level > 0:
        raise ValueError(f"level must be > 0; got {level!r}")
    if alibi_gain_limit(two_S, slope, 1) < level:
        return 0
    lo, hi = 1, max(2, math.ceil(alibi_reach(two_S, slope)) + 1)
    while alibi_gain_limit(two_S, slope, hi) >= level:      # the limit tends to 0: a bracket exists
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if alibi_gain_limit(two_S, slope, mid) >= level else (lo, mid)
    return lo


def scale_block_biases(block: Any, factor: float) -> Any:
    """Multiply a block's input-projection and convolution biases (those it has) by `factor`, in
    place; returns the block (to stress the slack of {prf:ref}`cor-block-gate-closing` 1)."""
    with torch.no_grad():
        for bias in (block.in_proj.bias, block.conv1d.bias):
            if bias is not None:
                bias.mul_(float(factor))
    return block
