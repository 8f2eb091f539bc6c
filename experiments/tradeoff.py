"""The trade-off chapter ({ref}`chap-tradeoff`): rank and attenuation within input-independent dynamics.

{prf:ref}`prop-rank-attenuation-independent`: scaling A keeps the lag span and moves the spectral
radius (`scaled_ssm`); rotation blocks carry a rank-N span with no attenuation at all
(`rotation_ssm`), at the price of outputs that grow with the position on a bounded resonant input
(`resonant_input`); and a stable normal A can carry a gradient of relative size ε only as far as
ln(1/ε)/(1 − ρ) allows (`margin_needed`). Models are lib's; arrays are float64 numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lib import LinearSSM


def _array(value: Any) -> np.ndarray:
    return value.detach().numpy().astype(float) if hasattr(value, "detach") else np.asarray(value, dtype=float)


def scaled_ssm(ssm: LinearSSM, c: float) -> LinearSSM:
    """(cA, B, C): lags c^ℓ C A^ℓ B, the same span as (A, B, C) for c != 0, spectral radius |c| ρ(A)."""
    return LinearSSM(c * _array(ssm.A), _array(ssm.B), _array(ssm.C))


def rotation_ssm(angles: Any) -> LinearSSM:
    """A = blockdiag(R(θ_1), …, R(θ_m)) (rotations, ρ = 1), B = C = I_N, N = 2m.

    Lags A^ℓ with ‖A^ℓ‖_F = √N at every ℓ; lag span dimension N on n >= N positions when the
    e^{±iθ_q} are 2m distinct numbers ({prf:ref}`prop-rank-attenuation-independent` 2).
    """
    angles = np.asarray(angles, dtype=float)
    N = 2 * len(angles)
    A = np.zeros((N, N))
    for q, theta in enumerate(angles):
        A[2 * q:2 * q + 2, 2 * q:2 * q + 2] = [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]]
    return LinearSSM(A, np.eye(N), np.eye(N))


def resonant_input(ssm: LinearSSM, n: int, u: Any) -> np.ndarray:
    """x_t = A^t u for t = 0..n−1, shape (n, d) (d = N; B = I assumed): bounded by ‖u‖ when A is orthogonal.

    For `rotation_ssm` the output is y_i = (i + 1) A^i u, of norm (i + 1)‖u‖
    ({prf:ref}`prop-rank-attenuation-independent` 4).
    """
    A = _array(ssm.A)
    X = np.empty((n, A.shape[0]))
    X[0] = np.asarray(u, dtype=float)
    for t in range(1, n):
        X[t] = A @ X[t - 1]
    return X


def margin_needed(eps: float, D: int, condition: float = 1.0) -> float:
    """ln(κ/ε)/D: the largest margin −ln ρ (>= 1 − ρ) that leaves ‖J_{i,i−D}‖_F >= ε ‖C‖₂‖B‖_F possible.

    {prf:ref}`prop-rank-attenuation-independent` 3 with κ = κ₂(P) for A = P Λ P⁻¹ (1 for normal A).
    """
    return math.log(condition / eps) / D


def reach(profile: Any, eps: float = 1e-3) -> int:
    """The largest D >= 1 with g(D) >= eps · g(1) for a profile g indexed by D (0 if g(1) = 0): the
    reach page's definition (`experiments.gradient_highway.read_profile`)."""
    g = _array(profile)
    return 0 if g[1] == 0 else int(np.flatnonzero(g[1:] >= eps * g[1]).max()) + 1


def margin_reading(ssm: LinearSSM, profile: Any, eps: float) -> dict[str, float]:
    """Part 3 of {prf:ref}`prop-rank-attenuation-independent` for a stable SSM with normal A and its profile g.

    "bound ratio": max_D g(D) / (‖C‖₂‖B‖_F ρ^D) (<= 1 by {prf:ref}`thm-ssm-gradient-decay`);
    "last D kept": the largest D with g(D) >= eps ‖C‖₂‖B‖_F; "margin −ln ρ" and
    "allowed ln(1/ε)/D" = `margin_needed(eps, max(D, 1))`, which part 3 says bounds it.
    """
    g = _array(profile)
    rho = ssm.spectral_radius
    scale = float(np.linalg.norm(_array(ssm.C), 2) * np.linalg.norm(_array(ssm.B)))
    kept = int(np.flatnonzero(g >= eps * scale).max())
    with np.errstate(under="ignore"):
        envelope = scale * rho ** np.arange(len(g))
    return {"bound ratio": float((g / envelope).max()), "last D kept": kept,
            "margin −ln ρ": -math.log(rho), "allowed ln(1/ε)/D": margin_needed(eps, max(kept, 1))}


def scale_reach(profile: Any, scale: float, eps: float = 1e-3) -> int:
    """The largest D >= 1 with g(D) >= eps · scale (0 if none): the reach relative to a fixed scale,
    ‖C‖₂‖B‖_F in part 3 of {prf:ref}`prop-rank-attenuation-independent`, rather than to g(1)."""
    hits = np.flatnonzero(_array(profile)[1:] >= eps * scale)
    return 0 if hits.size == 0 else int(hits.max()) + 1


def slowest_mode_reach(step: float, rate: float, eps: float = 1e-3) -> float:
    """ln(1/eps)/(Δ a): the distance at which the mode e^{−Δ a D} of step Δ and rate a falls to eps
    of its value at D = 0 — where an SSM whose slowest mode it is stops keeping eps of its start."""
    return math.log(1 / eps) / (step * rate)
