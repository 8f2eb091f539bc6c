"""The trade-off chapter ({ref}`chap-tradeoff`): rank and attenuation within input-independent dynamics.

{prf:ref}`prop-rank-attenuation-independent`: scaling A keeps the lag span and moves the spectral
radius (`scaled_ssm`); rotation blocks carry a rank-N span with no attenuation at all
(`rotation_ssm`), at the price of outputs that grow with the position on a bounded resonant input
(`resonant_input`); and a stable normal A can carry a gradient of relative size ε only as far as
ln(1/ε)/(1 − ρ) allows (`margin_needed`); for every A, distance is bought with the margin, the
departure from normality or the state size (`schur_power_bounds`), and the shifts of part 5 carry a
gradient over N − 1 steps with small outputs (`shift_ssm`, `cyclic_ssm`, `distance_reading`), the
near-defective shift also in a normal realisation of the same lags (`normal_realisation`). The
torch-init tanh RNN's diagonal-scaling search (`best_diagonal_scaling`, an upper bound) and a greedy
lower bound on its joint spectral radius (`greedy_switching_radius`) serve {prf:ref}`prop-rnn-gradient`
part 1. Models are lib's; arrays are float64 numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from experiments.gradient_highway import read_profile
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


def reach(profile: Any, eps: float = 1e-3) -> float:
    """The largest D >= 1 with g(D) >= eps · g(1) for a profile g indexed by D: `read_profile`'s reach
    (the reach page's definition), except undefined (nan) where g(1) = 0 — `read_profile` writes 0 there,
    the figures' convention. A shift register or the cyclic SSM of part 5(b), whose gradient at N − 1 may
    equal the one at 0, has no reach by this measure."""
    g = _array(profile)
    return float("nan") if g[1] == 0 else read_profile(g, eps).reach


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


# -- what buys distance: margin, non-normality, state size ({prf:ref}`prop-rank-attenuation-independent` 3, 5) --


def departure_from_normality(A: Any) -> float:
    """ν = (‖A‖_F² − Σ|λ_q|²)^{1/2}: the Frobenius norm of the strict upper triangle of any Schur form of A
    (0 iff A is normal; eigenvalues by numpy, negative rounding clipped to 0)."""
    A = _array(A)
    return math.sqrt(max(float((A ** 2).sum() - (np.abs(np.linalg.eigvals(A)) ** 2).sum()), 0.0))


def schur_power_bounds(A: Any, length: int) -> np.ndarray:
    """Σ_{j=0}^{min(D, N−1)} C(D, j) ρ^{D−j} ν^j >= ‖A^D‖₂ for D = 0..length−1, ρ = ρ(A),
    ν = `departure_from_normality` (0^0 = 1).

    {prf:ref}`prop-rank-attenuation-independent` 3(b): a word of (Λ + T)^D with j >= N factors T vanishes.
    """
    A = _array(A)
    rho, nu = float(np.abs(np.linalg.eigvals(A)).max()), departure_from_normality(A)
    return np.array([float(sum(math.comb(D, j) * rho ** (D - j) * nu ** j for j in range(min(D, len(A) - 1) + 1)))
                     for D in range(length)])


def shift_ssm(N: int, r: float) -> LinearSSM:
    """A = S + r^N e_1 e_N^⊤ (S the shift, S e_q = e_{q+1}), B = e_1, C = (e_1 + e_N)^⊤, d = p = 1.

    ρ(A) = r; lags L_{mN} = L_{mN+N−1} = r^{mN}, zero otherwise; r = 0: a shift register (A = S nilpotent);
    r > 0: A = Δ (rZ) Δ⁻¹, Z the cyclic permutation, Δ = diag(r^{−(q−1)}), κ₂(P) = r^{−(N−1)}
    ({prf:ref}`prop-rank-attenuation-independent` 5(a)).
    """
    A = np.eye(N, k=-1)
    A[0, N - 1] = r ** N
    B, C = np.zeros((N, 1)), np.zeros((1, N))
    B[0, 0] = C[0, 0] = C[0, N - 1] = 1.0
    return LinearSSM(A, B, C)


def cyclic_ssm(N: int, r: float) -> LinearSSM:
    """A = r Z (Z the cyclic permutation: normal, ρ = r), B = e_1, C = e_N^⊤, d = p = 1: L_ℓ = r^ℓ for
    ℓ ≡ N − 1 (mod N), zero otherwise ({prf:ref}`prop-rank-attenuation-independent` 5(b))."""
    A = r * np.eye(N, k=-1)
    A[0, N - 1] = r
    B, C = np.zeros((N, 1)), np.zeros((1, N))
    B[0, 0] = C[0, N - 1] = 1.0
    return LinearSSM(A, B, C)


def normal_realisation(ssm: LinearSSM, r: float) -> LinearSSM:
    """(Δ⁻¹AΔ, Δ⁻¹B, CΔ) with Δ = diag(r^{−(q−1)})_q: for `shift_ssm(N, r)` (r > 0) the normal realisation
    (rZ, e_1, CΔ) of the same lags ({prf:ref}`prop-rank-attenuation-independent` 5(a)); ‖CΔ‖₂ = (1 + r^{−2(N−1)})^{1/2}."""
    A, B, C = _array(ssm.A), _array(ssm.B), _array(ssm.C)
    scale = r ** -np.arange(len(A), dtype=float)
    return LinearSSM(A * scale[None, :] / scale[:, None], B / scale[:, None], C * scale[None, :])


def worst_bounded_input(lags: Any, k: int = 0) -> np.ndarray:
    """x_t = L_{n−1−t}ᵀe_k / ‖L_{n−1−t}ᵀe_k‖₂ (0 where that row is 0), shape (n, d), for lags
    L_0..L_{n−1} (n, p, d), or scalar lags (n,): ‖x_t‖₂ <= 1 and y_{n−1}[k] = Σ_ℓ ‖L_ℓᵀe_k‖₂, the
    largest y_{n−1}[k] of any such input (for d = p = 1, x_t = sign L_{n−1−t} and y_{n−1} = Σ_ℓ |L_ℓ|)."""
    L = _array(lags)
    L = L[:, None, None] if L.ndim == 1 else L
    if L.ndim != 3:
        raise ValueError(f"lags must have shape (n,) or (n, p, d); got {L.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < L.shape[1]:
        raise ValueError(f"k must be an output index in [0, {L.shape[1]}); got {k!r}")
    rows = L[:, k, :]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)[::-1].copy()


def bounded_output_range(ssm: LinearSSM, n: int) -> dict[str, float]:
    """Part 6 of {prf:ref}`prop-rank-attenuation-independent` on length n: "Σg" = Σ_{ℓ<n} ‖L_ℓ‖_F (the
    profile's sum, an upper bound on ‖y_{n−1}‖₂ for ‖x_t‖₂ <= 1), "Σg/p" (the lower bound), "attained"
    the largest ‖y_{n−1}‖₂ of the inputs `worst_bounded_input(lags, k)`, k < p, by a forward pass, and
    "row gap" max_k |y_{n−1}[k] / Σ_ℓ ‖L_ℓᵀe_k‖₂ − 1| (forward pass against the lags)."""
    import torch

    lags = _array(ssm.lags(n))
    attained, gap = 0.0, 0.0
    for k in range(ssm.p):
        with torch.no_grad():
            y = ssm(torch.from_numpy(worst_bounded_input(lags, k)))[-1].numpy()
        rows = np.linalg.norm(lags[:, k, :], axis=1).sum()
        attained = max(attained, float(np.linalg.norm(y)))
        gap = max(gap, abs(y[k] / rows - 1) if rows > 0 else abs(y[k]))
    total = float(np.linalg.norm(lags, axis=(1, 2)).sum())
    return {"Σg": total, "Σg/p": total / ssm.p, "attained": attained, "row gap": float(gap)}


def eigenvector_condition(A: Any) -> float:
    """κ₂(P) of numpy's eigenvector matrix (columns of unit norm)."""
    return float(np.linalg.cond(np.linalg.eig(_array(A))[1]))


# -- the torch-init tanh RNN at large N: the diagonal scaling of {prf:ref}`prop-rnn-gradient` part 1 --------


def _scaled_norm(x: np.ndarray, W: np.ndarray) -> tuple[float, np.ndarray]:
    # ‖e^X W e^{−X}‖₂ (X = diag(x − mean x)) and its gradient u² − v² (top singular pair), mean removed.
    d = np.exp(x - x.mean())
    U, s, Vt = np.linalg.svd(d[:, None] * W / d[None, :])
    grad = U[:, 0] ** 2 - Vt[0] ** 2
    return float(s[0]), grad - grad.mean()


def best_diagonal_scaling(W: Any, iterations: int) -> tuple[float, np.ndarray]:
    """A local search (L-BFGS, `iterations` steps from Λ = I) for a positive diagonal Λ with small
    ‖ΛWΛ⁻¹‖₂; returns that norm and Λ's diagonal. Its value is an upper bound on the least such norm,
    not the least: a value < 1 certifies decay on every input ({prf:ref}`prop-rnn-gradient` 1), one > 1
    certifies nothing."""
    from scipy.optimize import minimize

    W = _array(W)
    res = minimize(_scaled_norm, np.zeros(len(W)), args=(W,), jac=True, method="L-BFGS-B",
                   options={"maxiter": iterations})
    x = res.x - res.x.mean()
    d = np.exp(x)
    return float(np.linalg.norm(d[:, None] * W / d[None, :], 2)), d


def distance_reading(ssm: LinearSSM, profile: Any) -> dict[str, float]:
    """Part 3 and 5 of {prf:ref}`prop-rank-attenuation-independent` for a scalar SSM (d = p = 1) and its
    profile g(D) = |L_D|, D = 0..n−1: N, ρ, κ₂(P) (`eigenvector_condition`; nan if ρ = 0), the scale
‖C‖₂‖B‖_F of part 3, g(0), g(N−1),
    "Schur ratio" max_D g(D)/(‖C‖₂‖B‖_F `schur_power_bounds`) (<= 1 by 3(b); 0/0 read as 0),
    "gain" Σ_{D<n} g(D) (the largest |y_{n−1}| on inputs with |x_t| <= 1) and "1/(1−ρ)", part 4's
    ceiling for a normal A with ‖C‖₂ = ‖B‖₂ = 1."""
    g, A = _array(profile), _array(ssm.A)
    rho, N = ssm.spectral_radius, len(A)
    scale = float(np.linalg.norm(_array(ssm.C), 2) * np.linalg.norm(_array(ssm.B)))
    bounds = scale * schur_power_bounds(A, len(g))
    ratio = np.divide(g, bounds, out=np.zeros_like(g), where=bounds > 0)
    if (g[bounds == 0] > 0).any():
        ratio = np.append(ratio, np.inf)
    return {"N": N, "ρ": rho, "κ₂(P)": eigenvector_condition(A) if rho > 0 else float("nan"),
            "‖C‖₂‖B‖_F": scale, "g(0)": float(g[0]), "g(N−1)": float(g[N - 1]), "Schur ratio": float(ratio.max()),
            "gain": float(g.sum()), "1/(1−ρ)": 1 / (1 - rho)}


def torch_init_recurrence(N: int, seed: Any) -> np.ndarray:
    """W of `experiments.gradient_highway.torch_default_rnn` (torch.nn.RNN's uniform ±1/√N), N × N."""
    from experiments.gradient_highway import torch_default_rnn

    return _array(torch_default_rnn(N, 1, 1, seed=seed).W)


def greedy_switching_radius(W: Any, sweeps: int = 3) -> float:
    """max ρ(Π_Q W) found by flipping one coordinate of Q at a time (from Q = all, up to `sweeps` passes,
    keeping a flip that raises ρ): a lower bound on the joint spectral radius of {Π_Q W}, which
    {prf:ref}`prop-rnn-gradient` part 1 needs below 1 (Π_Q the projection on the coordinates Q)."""
    W = _array(W)
    q = np.ones(len(W), dtype=bool)

    def radius() -> float:
        return float(np.abs(np.linalg.eigvals(W * q[:, None])).max())

    best = radius()
    for _ in range(sweeps):
        improved = False
        for i in range(len(W)):
            q[i] = not q[i]
            value = radius()
            if value > best:
                best, improved = value, True
            else:
                q[i] = not q[i]
        if not improved:
            break
    return best
