"""How many heads an LTI SSM needs, from its lags L_ℓ = C A^ℓ B ({prf:ref}`def-lti-ssm`).

The lag matrix M has rows vec(L_ℓ), ℓ < n (row-major), and rank k ({prf:ref}`def-lag-span`);
G has rows √(n−ℓ) vec(L_ℓ).  Everything is computed from them, O(n p d N) work, except
`fit_heads`, which builds the dense operator on purpose.  Sections: the exact count
({prf:ref}`thm-head-count`), the least error of H heads ({prf:ref}`thm-approx-head-count`)
with two independent routes, one token-dependent head (the rank gap for maps), the
map-level count ({prf:ref}`thm-map-level-head-count`), S4D-style SSMs and the continuous limit.
A *relative squared error* is Σ_i E‖y_i − ŷ_i‖² / Σ_i E‖y_i‖², the square of `lib.relative_error`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._validation import as_real_tensor, as_sequence, check_choice, check_int, check_real, check_rtol, resolve_dtype
from .base import SequenceMap, _view
from .factorized import RelativeHeads, factorized_operator
from .spans import OperatorSpan, _as_float64, _rank, _span, _witness
from .ssm import LinearSSM


def _check_ssm(ssm: Any) -> LinearSSM:
    if not isinstance(ssm, LinearSSM):
        raise TypeError(f"ssm must be a LinearSSM; got {type(ssm).__name__}")
    return ssm


def _check_lti(ssm: Any) -> SequenceMap:
    # An LTI sequence map with lags L_ℓ, `_lags(n)` of shape (n, p, d): LinearSSM, DiagonalSSM, SharedStateSSM.
    if not (isinstance(ssm, SequenceMap) and getattr(ssm, "time_invariant", False)):
        raise TypeError("ssm must be an LTI sequence map with lags (LinearSSM, DiagonalSSM, SharedStateSSM); "
                        f"got {type(ssm).__name__}")
    return ssm


def _covariance_root(covariance: Any, d: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    # Σ^{1/2} and Σ^{+1/2} (d, d) of a checked covariance (eigenvalues <= 1e-12 λ_max count as 0); None: (None, None).
    if covariance is None:
        return None, None
    Sigma = _as_float64(covariance, "covariance", ("d", "d"), {"d": d})
    scale, asymmetry = float(np.abs(Sigma).max()), float(np.abs(Sigma - Sigma.T).max())
    if asymmetry > 1e-10 * scale:
        raise ValueError(f"covariance must be symmetric; got max |Σ − Σᵀ| = {asymmetry:.2e} (max |Σ| = {scale:.2e})")
    lam, U = np.linalg.eigh((Sigma + Sigma.T) / 2)
    if lam[0] < -1e-10 * max(lam[-1], 0.0):
        raise ValueError(f"covariance must be positive semi-definite; got the eigenvalue {lam[0]:.3e} "
                         f"(largest {lam[-1]:.3e})")
    keep = lam > 1e-12 * lam[-1]
    U, root = U[:, keep], np.sqrt(lam[keep])
    return (U * root) @ U.T, (U / root) @ U.T


def _in_unit_interval(value: Any, name: str) -> float:
    value = check_real(value, name)
    if not 0 < value < 1:
        raise ValueError(f"{name} must satisfy 0 < {name} < 1; got {value}")
    return value


# -- the lag matrix and the exact count -----------------------------------------------------


def _weigh(M: np.ndarray) -> np.ndarray:
    # Row ℓ of an (n, ·) matrix times √(n − ℓ): lag ℓ acts on n − ℓ pairs (i, i − ℓ).
    return M * np.sqrt(np.arange(len(M), 0, -1, dtype=np.float64))[:, None]


def _lag_matrix(ssm: LinearSSM, n: int, weighted: bool = False) -> np.ndarray:
    M = ssm._lags(n).detach().cpu().to(torch.float64).numpy().reshape(n, ssm.p * ssm.d)
    if not np.isfinite(M).all():
        radius = getattr(ssm, "spectral_radius", float("nan"))
        raise ValueError(f"ssm lags C A^l B overflow for n = {n} (spectral radius {radius:.3g})")
    return _weigh(M) if weighted else M


def _lag_span(ssm: LinearSSM, n: int, rtol: float = 1e-10, weighted: bool = False,
              root: np.ndarray | None = None) -> tuple[np.ndarray, OperatorSpan]:
    # M and the span of its rows (weighted: of G's), from the R of a QR when n > pd (same σ and basis).
    M = _lag_matrix(ssm, n)
    if root is not None:                   # L_ℓ Σ^{1/2}: the lags seen by tokens of covariance Σ
        M = (M.reshape(n, ssm.p, ssm.d) @ root).reshape(n, ssm.p * ssm.d)
    rows = _weigh(M) if weighted else M
    if n > rows.shape[1]:
        rows = np.linalg.qr(rows, mode="r")
    return M, _span(rows, ssm.p, ssm.d, rtol)


def _relative_heads(ssm: LinearSSM, M: np.ndarray, span: OperatorSpan, H: int,
                    pinv_root: np.ndarray | None = None) -> RelativeHeads:
    # Values: the first H basis elements of the span; coefficients c[h, ℓ] = ⟨L_ℓ, V_h⟩_F.
    V = span.basis[:H]
    coefficients = (M @ V.reshape(H, ssm.p * ssm.d).T).T
    # With M holding L_ℓ Σ^{1/2}: V_h = W_h Σ^{+1/2}, so V_h Σ^{1/2} = W_h (prop-covariance-head-count).
    return RelativeHeads(V if pinv_root is None else V @ pinv_root, coefficients, dtype=ssm.dtype)


def _tails(squares: np.ndarray, H_max: int) -> np.ndarray:
    # tails[H] = Σ_{r≥H} squares[r], H = 0..H_max, summed from the smallest up (tiny tails keep their digits).
    squares = np.concatenate([squares, np.zeros(max(0, H_max + 1 - len(squares)))])
    return np.concatenate([np.cumsum(squares[::-1])[::-1], [0.0]])[: H_max + 1]


def lag_matrix(ssm: LinearSSM, n: int, weighted: bool = False) -> np.ndarray:
    """The lag matrix M of {prf:ref}`def-lag-span`, row ℓ = vec(L_ℓ): float64, shape (n, p·d).

    Weighted, row ℓ is multiplied by √(n − ℓ): the matrix G of {prf:ref}`thm-approx-head-count`,
    whose Gram matrix GᵀG is that of all blocks 𝒲_ij, j ≤ i.  ValueError if the lags overflow.
    """
    ssm, n = _check_lti(ssm), check_int(n, "n")
    if not isinstance(weighted, bool):
        raise TypeError(f"weighted must be a bool; got {type(weighted).__name__}")
    return _lag_matrix(ssm, n, weighted)


def min_heads(ssm: LinearSSM, n: int, rtol: float = 1e-10) -> int:
    """k = dim span{L_0..L_{n−1}} ({prf:ref}`def-lag-span`): the least number of heads that represent the SSM.

    {prf:ref}`thm-head-count` on length n: the numerical rank of M, rank rule of
    `operator_span` with 0 < rtol < 1 (0 if every lag vanishes).
    """
    ssm, n, rtol = _check_lti(ssm), check_int(n, "n"), check_rtol(rtol)
    return _lag_span(ssm, n, rtol)[1].dim


def heads_from_ssm(ssm: LinearSSM, n: int, rtol: float = 1e-10) -> RelativeHeads:
    """The k-head RelativeHeads equal to the SSM on lengths ≤ n (sufficiency in {prf:ref}`thm-head-count`).

    V_h: the first k right singular vectors of M, an orthonormal basis of the lag span;
    c[h, ℓ] = ⟨L_ℓ, V_h⟩_F, so Σ_h c[h, i−j] V_h = C A^{i−j} B up to the singular values
    dropped by `rtol` (as in `min_heads`).  V: (k, p, d), c: (k, n); k = 0 gives the zero model.
    """
    ssm, n, rtol = _check_lti(ssm), check_int(n, "n"), check_rtol(rtol)
    M, span = _lag_span(ssm, n, rtol)
    return _relative_heads(ssm, M, span, span.dim)


def minimal_polynomial_degree(A: Any, rtol: float = 1e-10) -> int:
    """m_A, the degree of the minimal polynomial of A (N, N), used by {prf:ref}`prop-lag-span-bound`.

    The rank of the Krylov matrix [vec(I), vec(A), …, vec(A^N)] (rank rule of `operator_span`,
    A first divided by its largest absolute entry); 1 for A = 0.
    """
    rtol = check_rtol(rtol)
    A, _ = as_real_tensor(A, "A", dtype=torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
        raise ValueError(f"A must be a square matrix of shape (N, N) with N >= 1; got {tuple(A.shape)}")
    return _minimal_polynomial_degree(A.detach().cpu().numpy(), rtol)


def _minimal_polynomial_degree(A: np.ndarray, rtol: float) -> int:
    N, scale = len(A), np.abs(A).max()
    A = A / scale if scale > 0 else A
    powers, power = [], np.eye(N)
    for _ in range(N + 1):
        powers.append(power.ravel())
        power = power @ A
    return max(1, _span(np.stack(powers), N, N, rtol).dim)


def lag_span_bound(ssm: LinearSSM, n: int) -> int:
    """min(m_A, n, p·d), the bound on k of {prf:ref}`prop-lag-span-bound`, for a LinearSSM and n >= 1."""
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    return min(_minimal_polynomial_degree(ssm.A.astype(np.float64), 1e-10), n, ssm.p * ssm.d)


def _residues(A: np.ndarray, B: np.ndarray, C: np.ndarray, name: str, separation: float = 1e-8,
              max_condition: float = 1e8) -> tuple[np.ndarray, np.ndarray]:
    # For A = Σ_m μ_m v_m w_mᵀ with distinct μ_m: μ (N,) and the rows vec(C v_m w_mᵀ B), (N, pd).
    mu, R = np.linalg.eig(A)
    if np.linalg.cond(R) > max_condition:
        raise ValueError(f"{name} is too far from diagonalisable for the modal route "
                         f"(eigenvector condition number {np.linalg.cond(R):.2e} > {max_condition:g})")
    gaps = np.abs(mu[:, None] - mu[None, :])
    np.fill_diagonal(gaps, np.inf)
    if len(mu) > 1 and gaps.min() <= separation * max(1.0, np.abs(mu).max()):
        raise ValueError(f"{name} has (nearly) repeated eigenvalues (smallest gap {gaps.min():.2e}); "
                         "the modal route needs distinct ones")
    return mu, np.einsum("pm,md->mpd", C @ R, np.linalg.inv(R) @ B).reshape(len(mu), -1)


def modal_lag_span_dimension(ssm: LinearSSM, n: int, rtol: float = 1e-10, *, separation: float = 1e-8,
                             max_condition: float = 1e8) -> int:
    """k from the modes of A ({prf:ref}`prop-modal-lag-span`): the rank of the residues vec(C v_m w_mᵀ B).

    Needs n ≥ N and A diagonalisable (eigenvector condition <= max_condition) with distinct
    eigenvalues (gaps > separation · max(1, max|λ|)).  No powers λ^ℓ enter, so lags that
    decay below rounding do not blur the rank: at n = 1024 and ρ = 0.5 an S4D SSM with
    N = 32 has `min_heads` 30 but k = 32.  Rank rule of `operator_span`.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    separation = check_real(separation, "separation", positive=True)
    max_condition = check_real(max_condition, "max_condition", positive=True)
    return _modal_dimension(ssm, n, rtol, separation, max_condition)


def _modal_dimension(ssm: LinearSSM, n: int, rtol: float, separation: float = 1e-8,
                     max_condition: float = 1e8) -> int:
    if n < ssm.N:
        raise ValueError(f"n must be >= N = {ssm.N} for the modal route; got n = {n}")
    _, residues = _residues(ssm.A.astype(np.float64), ssm.B, ssm.C, "ssm.A", separation, max_condition)
    return _rank(np.linalg.svd(residues, compute_uv=False), rtol)


# -- the least error of H heads (thm-approx-head-count) ----------------------------------------


def optimal_head_errors(ssm: LinearSSM, n: int, H_max: int, *, covariance: Any = None) -> np.ndarray:
    """Σ_{q>H} σ_q(G)², H = 0..H_max: the least Σ_i E‖y_i − ŷ_i‖² of H heads, shape (H_max + 1,).

    {prf:ref}`thm-approx-head-count`: tokens with E[x_j x_j'ᵀ] = δ_jj' I, H heads with
    input-independent coefficients; attained by `truncated_heads`.  Entry 0 is ‖G‖²_F, the
    error of the zero model; entries H ≥ k are 0 up to rounding.
    With covariance Σ (d, d), symmetric positive semi-definite: tokens with
    E[x_j x_j'ᵀ] = δ_jj' Σ and G_Σ, rows √(n−ℓ) vec(L_ℓ Σ^{1/2}) ({prf:ref}`prop-covariance-head-count`).
    """
    ssm, n, H_max = _check_lti(ssm), check_int(n, "n"), check_int(H_max, "H_max", minimum=0)
    root, _ = _covariance_root(covariance, ssm.d)
    return _tails(_lag_span(ssm, n, weighted=True, root=root)[1].singular_values ** 2, H_max)


def truncated_heads(ssm: LinearSSM, n: int, H: int, *, covariance: Any = None) -> RelativeHeads:
    """The H-head RelativeHeads attaining `optimal_head_errors(ssm, n, H)[H]` ({prf:ref}`thm-approx-head-count`).

    V_h: the first H right singular vectors of G; c[h, ℓ] = ⟨L_ℓ, V_h⟩_F (Eckart–Young on G,
    row weights divided out).  Deviation: only min(H, rank G) heads are built (rank rule of
    `operator_span`, rtol = 1e-10); further heads would have zero coefficients.
    With covariance Σ: W_h from G_Σ, V_h = W_h Σ^{+1/2} and c[h, ℓ] = ⟨L_ℓ Σ^{1/2}, W_h⟩_F
    ({prf:ref}`prop-covariance-head-count`; eigenvalues of Σ below 1e-12 λ_max count as 0).
    """
    ssm, n, H = _check_lti(ssm), check_int(n, "n"), check_int(H, "H", minimum=0)
    root, pinv_root = _covariance_root(covariance, ssm.d)
    M, span = _lag_span(ssm, n, weighted=True, root=root)
    return _relative_heads(ssm, M, span, min(H, span.dim), pinv_root)


def heads_needed(ssm: LinearSSM, n: int, eps: float, *, covariance: Any = None) -> int:
    """The least H with Σ_{q>H} σ_q(G)² ≤ eps ‖G‖²_F ({prf:ref}`thm-approx-head-count`); 0 if all lags vanish.

    eps, 0 < eps < 1, is a relative squared error: eps = 10⁻² is a 10 % relative error.
    With covariance Σ, the count of G_Σ (as in `optimal_head_errors`).
    """
    ssm, n, eps = _check_lti(ssm), check_int(n, "n"), _in_unit_interval(eps, "eps")
    root, _ = _covariance_root(covariance, ssm.d)
    sigma = _lag_span(ssm, n, weighted=True, root=root)[1].singular_values
    errors = _tails(sigma ** 2, len(sigma))
    return int(np.argmax(errors <= eps * errors[0]))


def lag_energy_count(ssm: LinearSSM, n: int, eps: float) -> int:
    """L_ε, the least L with Σ_{ℓ≥L} (n−ℓ)‖L_ℓ‖²_F ≤ eps Σ_ℓ (n−ℓ)‖L_ℓ‖²_F (eps as in `heads_needed`).

    The bound heads_needed ≤ L_ε of {prf:ref}`prop-heads-needed-lag-bound`, from the lag
    norms alone; 0 if every lag vanishes.
    """
    ssm, n, eps = _check_lti(ssm), check_int(n, "n"), _in_unit_interval(eps, "eps")
    tails = _tails((_lag_matrix(ssm, n, weighted=True) ** 2).sum(axis=1), n)
    return int(np.argmax(tails <= eps * tails[0]))


def _kernel(model: Any, n: int, name: str) -> np.ndarray:
    # The lags (n, p, d) of an input-independent causal convolution, float64.
    if isinstance(model, SequenceMap) and getattr(model, "time_invariant", False):
        return _lag_matrix(model, n).reshape(n, model.p, model.d)
    if isinstance(model, RelativeHeads):
        if model.max_length < n:
            raise ValueError(f"{name} accepts sequences of length <= {model.max_length}; got n = {n}")
        return np.einsum("hl,hpd->lpd", model.coefficients[:, :n].astype(np.float64), model.V.astype(np.float64))
    raise TypeError(f"{name} must be an LTI map (LinearSSM, DiagonalSSM, SharedStateSSM) or RelativeHeads; "
                    f"got {type(model).__name__}")


def population_error(teacher: LinearSSM | RelativeHeads, student: LinearSSM | RelativeHeads, n: int, *,
                     covariance: Any = None, mean: Any = None) -> float:
    """Σ_i E‖y_i − ŷ_i‖² = Σ_ℓ (n−ℓ)‖K_ℓ − K̂_ℓ‖²_F for iid N(0, I_d) tokens, in closed form.

    The objective of {prf:ref}`thm-approx-head-count` between two causal convolutions
    (LinearSSM or RelativeHeads with lags K_ℓ, K̂_ℓ and equal (p, d)) on length n.
    With covariance Σ and mean x̄: tokens iid over positions with these moments, and the error
    Σ_ℓ (n−ℓ) tr(E_ℓ Σ E_ℓᵀ) + Σ_i ‖Σ_{ℓ≤i} E_ℓ x̄‖², E_ℓ = K_ℓ − K̂_ℓ ({prf:ref}`prop-covariance-head-count`).
    """
    n = check_int(n, "n")
    K, K_hat = _kernel(teacher, n, "teacher"), _kernel(student, n, "student")
    if K.shape != K_hat.shape:
        raise ValueError(f"student must have (p, d) = {K.shape[1:]} like the teacher; got {K_hat.shape[1:]}")
    E, weights = K - K_hat, np.arange(n, 0, -1, dtype=np.float64)
    if covariance is None:
        error = float(weights @ (E ** 2).sum(axis=(1, 2)))
    else:
        _covariance_root(covariance, E.shape[2])                     # checks Σ; the error uses Σ itself
        Sigma = _as_float64(covariance, "covariance", ("d", "d"), {"d": E.shape[2]})
        error = float(weights @ np.einsum("lpd,de,lpe->l", E, Sigma, E))
    if mean is not None:
        mu = _as_float64(mean, "mean", ("d",), {"d": E.shape[2]})
        error += float((np.cumsum(E @ mu, axis=0) ** 2).sum())
    return error


@dataclass(frozen=True)
class HeadFit:
    """`fit_heads`, best restart: error Σ_{i,j} ‖𝒲_ij − Σ_h α^h_ij V_h‖²_F, V (H, p, d),
    coefficients α (H, n, n); restart_errors (restarts,); method."""

    error: float
    V: np.ndarray
    coefficients: np.ndarray
    restart_errors: np.ndarray
    method: str


def _fit_lbfgs(W: np.ndarray, H: int, rng: np.random.Generator, max_iter: int):
    # Variable projection: for fixed V the best α is the least-squares fit of every block on
    # span{V_h}, so L-BFGS runs on V alone, f(V) = Σ_ij ‖𝒲_ij − proj_V 𝒲_ij‖² / ‖𝒲‖².
    n, _, p, d = W.shape
    scale = float((W ** 2).sum())
    rows = torch.tensor(W.reshape(n * n, p * d) / math.sqrt(scale))
    V = torch.tensor(rng.standard_normal((H, p * d)), requires_grad=True)
    optimiser = torch.optim.LBFGS([V], lr=1.0, max_iter=100, history_size=50, tolerance_grad=1e-16,
                                  tolerance_change=1e-22, line_search_fn="strong_wolfe")

    def fitted(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = torch.linalg.solve(values @ values.T, values @ rows.T).T          # (n², H)
        return ((rows - alpha @ values) ** 2).sum(), alpha

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = fitted(V)[0]
        loss.backward()
        return loss

    previous = float("inf")
    for _ in range(max(1, max_iter // 100)):
        optimiser.step(closure)
        with torch.no_grad():
            current = float(fitted(V)[0])
        if current <= 1e-26 or not previous - current > 1e-15 * current:   # exact, or stalled
            break
        previous = current
    with torch.no_grad():
        loss, alpha = fitted(V)
    return float(loss) * scale, V.detach().numpy().reshape(H, p, d), \
        alpha.numpy().T.reshape(H, n, n) * math.sqrt(scale)


def _fit_als(W: np.ndarray, H: int, rng: np.random.Generator, max_iter: int):
    n, _, p, d = W.shape
    rows = W.reshape(n * n, p * d)
    V = rng.standard_normal((H, p * d))
    previous, floor = float("inf"), 1e-26 * float((rows ** 2).sum())
    for _ in range(max_iter):
        alpha = np.linalg.lstsq(V.T, rows.T, rcond=None)[0].T      # rows ≈ alpha V, V fixed
        V = np.linalg.lstsq(alpha, rows, rcond=None)[0]             # alpha fixed
        current = float(((rows - alpha @ V) ** 2).sum())
        if current <= floor or not previous - current > 1e-15 * current:
            break
        previous = current
    return current, V.reshape(H, p, d), alpha.T.reshape(H, n, n)


def fit_heads(ssm: LinearSSM, n: int, H: int, *, method: str = "lbfgs", restarts: int = 3, seed: Any = 0,
              max_iter: int = 3000) -> HeadFit:
    """The least Σ_{i,j} ‖𝒲_ij − Σ_h α^h_ij V_h‖²_F over H heads found by an optimiser (no SVD).

    An independent route to {prf:ref}`thm-approx-head-count`: any α_ij (causal or not) and
    V_h on the dense n × n × p × d operator (keep n ≤ 64); it can only stop at or above
    `optimal_head_errors(ssm, n, H)[H]`.  "lbfgs": torch L-BFGS on V, α eliminated by least
    squares, in rounds of 100 iterations; "als": alternating least squares.  Both stop when a
    round gains < 1e-15 relative or the error is < 1e-26 ‖𝒲‖²; the best of `restarts`
    starts (default_rng(seed)) is kept, at most max_iter iterations each.  H = 0 or lags
    that all vanish give the zero model.
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    H, restarts = check_int(H, "H", minimum=0), check_int(restarts, "restarts")
    max_iter = check_int(max_iter, "max_iter")
    method = check_choice(method, "method", ("lbfgs", "als"))
    lags = _lag_matrix(ssm, n).reshape(n, ssm.p, ssm.d)
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    W = np.where((lag >= 0)[..., None, None], lags[np.clip(lag, 0, None)], 0.0)   # 𝒲_ij = L_{i−j}, j ≤ i
    energy = float((W ** 2).sum())
    if H == 0 or energy == 0:                                    # the zero model is optimal
        return HeadFit(energy, np.zeros((H, ssm.p, ssm.d)), np.zeros((H, n, n)), np.full(restarts, energy), method)
    rng = np.random.default_rng(seed)
    runs = [(_fit_lbfgs if method == "lbfgs" else _fit_als)(W, H, rng, max_iter) for _ in range(restarts)]
    best = min(runs, key=lambda run: run[0])
    return HeadFit(float(best[0]), best[1], best[2], np.array([run[0] for run in runs]), method)


@dataclass(frozen=True)
class SampledErrors:
    """`sampled_head_errors`: heads (tuple); mean of Σ_i ‖y_i − ŷ_i‖² and its standard error
    (std / √samples), shape (len(heads),) each; samples; tokens."""

    heads: tuple
    mean: np.ndarray
    stderr: np.ndarray
    samples: int
    tokens: str


def sampled_head_errors(ssm: LinearSSM, n: int, heads: Any, samples: int, *, tokens: str = "gaussian",
                        seed: Any = 0, chunk: int = 4096) -> SampledErrors:
    """Monte Carlo errors of `truncated_heads(ssm, n, H)`, H in `heads` ({prf:ref}`thm-approx-head-count`).

    `samples` (>= 2) sequences of iid N(0, 1) ("gaussian") or ±1 ("rademacher") entries, so
    E[x_j x_j'ᵀ] = δ_jj' I; y from the SSM's forward pass, ŷ from the model's, every H on
    the same sequences (numpy default_rng(seed), `chunk` sequences at a time).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    samples, chunk = check_int(samples, "samples", minimum=2), check_int(chunk, "chunk")
    tokens = check_choice(tokens, "tokens", ("gaussian", "rademacher"))
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(f"heads must be an iterable of head counts; got {type(heads).__name__}")
    heads = tuple(check_int(H, "heads[...]", minimum=0) for H in heads)
    M, span = _lag_span(ssm, n, weighted=True)
    models = [_relative_heads(ssm, M, span, min(H, span.dim)) for H in heads]
    rng = np.random.default_rng(seed)
    per_sequence = np.empty((len(heads), samples))
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        X = rng.standard_normal((size, n, ssm.d)) if tokens == "gaussian" else \
            rng.choice([-1.0, 1.0], size=(size, n, ssm.d))
        Y = ssm(X)
        for r, model in enumerate(models):
            per_sequence[r, start:start + size] = ((Y - model(X)) ** 2).sum(axis=(1, 2))
    return SampledErrors(heads, per_sequence.mean(axis=1),
                         per_sequence.std(axis=1, ddof=1) / math.sqrt(samples), samples, tokens)


# -- one head with token-dependent coefficients (the rank gap for maps) ------------------------


@dataclass(frozen=True)
class SingleHeadFit:
    """`token_dependent_single_head`: outputs ŷ (b, n, p); coefficients α_ij(X) (b, n, n);
    errors ‖y_i − ŷ_i‖² (b, n); targets, the SSM's outputs y (b, n, p)."""

    outputs: np.ndarray
    coefficients: np.ndarray
    errors: np.ndarray
    targets: np.ndarray


def token_dependent_single_head(ssm: LinearSSM, X: Any, V: Any, *, causal: bool = True) -> SingleHeadFit:
    """The best y_i = Σ_j α_ij(X) V x_j, α chosen for each input ({prf:ref}`prop-single-head-generic-inputs`).

    X: (n, d) or (b, n, d); V: (p, d).  α_i· is the least-norm least-squares solution of
    V Σ_j α_ij x_j ≈ y_i over j ≤ i (all j if not causal; numpy pinv, rtol 1e-12), so ŷ_i is
    the point of V·span{x_j} nearest to the SSM's y_i.
    """
    ssm = _check_ssm(ssm)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    X = as_sequence(X, ssm.d, dtype=torch.float64, name="X")[0].detach().cpu().numpy()
    V = _as_float64(V, "V", ("p", "d"), {"p": ssm.p, "d": ssm.d})
    Y = ssm(X)
    b, n, _ = X.shape
    projected = np.einsum("pd,bjd->bpj", V, X)                           # column j is V x_j
    alpha = np.zeros((b, n, n))
    for i in range(n):
        cols = i + 1 if causal else n
        alpha[:, i, :cols] = (np.linalg.pinv(projected[:, :, :cols], rtol=1e-12) @ Y[:, i, :, None])[..., 0]
    outputs = np.einsum("bij,bpj->bip", alpha, projected)
    return SingleHeadFit(outputs, alpha, ((Y - outputs) ** 2).sum(axis=2), Y)


def _single_token_outputs(ssm: LinearSSM, n: int, u: np.ndarray) -> np.ndarray:
    # The SSM's outputs L_ℓ u, shape (n, p), on the input (u, 0, …, 0), from its forward pass.
    X = np.zeros((1, n, ssm.d))
    X[0, 0] = u
    return ssm(X)[0]


@dataclass(frozen=True)
class SingleTokenWitness:
    """`single_head_witness`: lag ℓ (the miss is at index ℓ of the input (u, 0, …, 0)); token
    u, unit, shape (d,); miss, the least ‖y − ŷ‖/‖y‖ there over ŷ ∈ span{V u}."""

    lag: int
    token: np.ndarray
    miss: float


def single_head_witness(ssm: LinearSSM, n: int, V: Any, rtol: float = 1e-10) -> SingleTokenWitness | None:
    """The single-token input of {prf:ref}`thm-rank-gap-map` on which every single head with value V misses.

    For each lag L_ℓ (ℓ < n) not a multiple of V, `pointwise_witness` gives u with
    L_ℓ u ∉ span{V u}; on (u, 0, …, 0) a single head outputs multiples of V u, the SSM
    y_ℓ = L_ℓ u (its forward pass).  The lag with the largest miss is returned (miss 1 when
    ‖V u‖ <= rtol ‖V‖); None when every lag is a multiple of V ({prf:ref}`thm-rank-gap`).
    V: shape (p, d); rtol as in `pointwise_witness`.
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    V = _as_float64(V, "V", ("p", "d"), {"p": ssm.p, "d": ssm.d})
    rtol = check_rtol(rtol)
    lags = _lag_matrix(ssm, n).reshape(n, ssm.p, ssm.d)
    best = None
    for ell in range(n):
        u = _witness(lags[ell], V, rtol)
        if u is None:
            continue
        y, Vu = _single_token_outputs(ssm, n, u)[ell], V @ u
        miss = 1.0 if np.linalg.norm(Vu) <= rtol * np.linalg.norm(V) else \
            float(np.linalg.norm(y - (y @ Vu) / (Vu @ Vu) * Vu) / np.linalg.norm(y))
        if best is None or miss > best.miss:
            best = SingleTokenWitness(ell, u, miss)
    return best


# -- the map level: value families that span ℝ^p at every token ------------------------------


_J = ((0.0, -1.0), (1.0, 0.0))  # rotation by 90°


def polynomial_values(p: int, d: int) -> np.ndarray:
    """(V_h)_ab = 1[a + b = h], shape (p + d − 1, p, d): polynomial multiplication.

    yᵀ V_h u is the t^h coefficient of y(t)u(t), non-zero for y, u ≠ 0, so the family is
    nonsingular ({prf:ref}`prop-nonsingular-families`).  p, d >= 1.
    """
    p, d = check_int(p, "p"), check_int(d, "d")
    a, b = np.meshgrid(np.arange(p), np.arange(d), indexing="ij")
    return (a + b == np.arange(p + d - 1)[:, None, None]).astype(np.float64)


def complex_values(p: int, d: int) -> np.ndarray:
    """The complex structure for p = 2 or d = 2: shape (m, p, d), m = 2⌈max(p, d)/2⌉.

    For p = 2, (V_h)_0b = δ_hb and (V_h)_1b = J_hb, J the 90° rotation of each coordinate
    pair of ℝ^m: [V_1 u, …, V_m u] has orthogonal rows of norm ‖u‖
    ({prf:ref}`prop-nonsingular-families`).  For d = 2, the transposed family of (2, p).
    """
    p, d = check_int(p, "p"), check_int(d, "d")
    if p != 2 and d != 2:
        raise ValueError(f"complex_values needs p = 2 or d = 2; got p = {p}, d = {d}")
    if p != 2:
        return complex_values(2, p).transpose(0, 2, 1)
    m = d + d % 2
    V = np.zeros((m, 2, d))
    V[:, 0, :] = np.eye(m)[:, :d]
    V[:, 1, :] = np.kron(np.eye(m // 2), np.array(_J))[:, :d]
    return V


def _cd_product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Cayley–Dickson doubling (a, b)(c, d) = (ac − d̄b, da + bc̄), x̄ = (x_0, −x_1, …): ℝ, ℂ, ℍ, 𝕆 for m = 1, 2, 4, 8.
    if len(x) == 1:
        return x * y
    h, bar = len(x) // 2, lambda v: np.concatenate([v[:1], -v[1:]])
    a, b, c, d = x[:h], x[h:], y[:h], y[h:]
    return np.concatenate([_cd_product(a, c) - _cd_product(bar(d), b), _cd_product(d, a) + _cd_product(b, bar(c))])


def cayley_dickson_values(p: int, d: int) -> np.ndarray:
    """Left multiplication by e_h in ℝ, ℂ, ℍ or 𝕆: (V_h)_ab = (e_h e_b)_a, shape (m, p, d), entries 0, ±1.

    m is the least of 1, 2, 4, 8 that is >= max(p, d) (so p, d <= 8).  The multiplication
    is norm-preserving, B(u)B(u)ᵀ = ‖u‖² I_p (`composition_defect` = 0); for p = d = 2 the
    family is (I, J) of {prf:ref}`prop-map-level-two-heads` ({prf:ref}`prop-nonsingular-families`).
    """
    p, d = check_int(p, "p"), check_int(d, "d")
    if max(p, d) > 8:
        raise ValueError(f"cayley_dickson_values needs p, d <= 8 (the octonions); got p = {p}, d = {d}")
    m = next(size for size in (1, 2, 4, 8) if size >= max(p, d))
    basis = np.eye(m)
    table = np.stack([np.stack([_cd_product(basis[h], basis[b]) for b in range(m)], axis=1) for h in range(m)])
    return table[:, :p, :d]


def nonsingular_values(p: int, d: int) -> np.ndarray:
    """The family with the fewest heads among Cayley–Dickson, complex and polynomial, for any p, d >= 1.

    Ties go to that order (p = d = 2 gives (I, J)); its size bounds ν(p, d) from above
    ({prf:ref}`thm-map-level-head-count`).
    """
    p, d = check_int(p, "p"), check_int(d, "d")
    candidates = [cayley_dickson_values(p, d)] if max(p, d) <= 8 else []
    if 2 in (p, d):
        candidates.append(complex_values(p, d))
    return min(candidates + [polynomial_values(p, d)], key=len)


def nonsingular_dimension_bounds(p: int, d: int) -> tuple[int, int]:
    """(lower, upper) bounds on ν(p, d), the least size of a nonsingular family, for p, d >= 1.

    lower = max(p, d), plus 1 when max(p, d) is odd and min(p, d) >= 2
    ({prf:ref}`lem-odd-nonsingular`); upper = len(nonsingular_values(p, d)).
    """
    p, d = check_int(p, "p"), check_int(d, "d")
    big, small = max(p, d), min(p, d)
    return big + (1 if big % 2 and small >= 2 else 0), len(nonsingular_values(p, d))


def _as_values(values: Any, dims: dict[str, int] | None = None) -> np.ndarray:
    return _as_float64(values, "values", ("H", "p", "d"), {} if dims is None else dims)


def _token_matrix(V: np.ndarray, u: np.ndarray) -> np.ndarray:
    return np.einsum("hpd,...d->...ph", V, u)                          # B(u) = [V_1 u, …, V_H u]


def composition_defect(values: Any) -> float:
    """The largest absolute entry of S_aa'bb' + S_aa'b'b − 2 δ_aa' δ_bb', S_aa'bb' = Σ_h (V_h)_ab (V_h)_a'b'.

    For values (H, p, d): 0 exactly when B(u)B(u)ᵀ = ‖u‖² I_p for every u; exact for integer families, so 0 proves
    them norm-preserving, hence nonsingular with cond B(u) = 1 ({prf:ref}`prop-nonsingular-families`).
    """
    V = _as_values(values)
    S = np.einsum("hab,hce->acbe", V, V)                       # S[a, a', b, b']
    p, d = V.shape[1:]
    target = 2.0 * np.einsum("ac,be->acbe", np.eye(p), np.eye(d))
    return float(np.abs(S + S.transpose(0, 1, 3, 2) - target).max())


def token_matrix(values: Any, tokens: Any) -> np.ndarray:
    """B(u) = [V_1 u, …, V_H u] for values (H, p, d) and tokens u (..., d): shape (..., p, H).

    Its range holds the outputs H heads can reach from one token; a family is nonsingular
    when B(u) has rank p for every u ≠ 0.
    """
    V = _as_values(values)
    u, _ = as_real_tensor(tokens, "tokens", dtype=torch.float64)
    if u.ndim < 1 or u.shape[-1] != V.shape[2]:
        raise ValueError(f"tokens must have shape (..., d) = (..., {V.shape[2]}); got {tuple(u.shape)}")
    return _token_matrix(V, u.detach().cpu().numpy())


def worst_conditioned_tokens(values: Any, samples: int = 20_000, keep: int = 3, *,
                             seed: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """The `keep` tokens with the largest cond B(u) = σ_1/σ_p (inf below rank p) found by a search.

    Candidates: `samples` Gaussian tokens (default_rng(seed)), the basis vectors, (1, …, 1),
    (1, −1, …) and the binomial coefficients of (1 + t)^{d−1} (roots on the unit circle,
    the worst case of polynomial multiplication).  A search, not a bound.  Returns the
    tokens (keep, d) and their condition numbers (keep,), worst first.
    """
    V = _as_values(values)
    samples, keep = check_int(samples, "samples"), check_int(keep, "keep")
    d = V.shape[2]
    structured = np.concatenate([np.eye(d), [np.ones(d), (-1.0) ** np.arange(d),
                                             [math.comb(d - 1, b) for b in range(d)]]])
    tokens = np.concatenate([np.random.default_rng(seed).standard_normal((samples, d)), structured])
    sigma = np.linalg.svd(_token_matrix(V, tokens), compute_uv=False)[:, : V.shape[1]]
    with np.errstate(divide="ignore"):
        condition = np.where(sigma[:, -1] > 0, sigma[:, 0] / sigma[:, -1], np.inf)
    order = np.argsort(-condition)[:keep]
    return tokens[order], condition[order]


def pointwise_lag_rank(ssm: LinearSSM, n: int, token: Any, rtol: float = 1e-10) -> int:
    """rank [L_0 u, …, L_{n−1} u] for a token u (d,): r* of {prf:ref}`thm-map-level-head-count` at u.

    Maximal for almost every u; rank rule of `operator_span`, 0 < rtol < 1.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    u = _as_float64(token, "token", ("d",), {"d": ssm.d})
    return _pointwise_rank(ssm, n, u, rtol)


def _pointwise_rank(ssm: LinearSSM, n: int, u: np.ndarray, rtol: float) -> int:
    K = np.einsum("lpd,d->pl", _lag_matrix(ssm, n).reshape(n, ssm.p, ssm.d), u)
    return _rank(np.linalg.svd(K, compute_uv=False), rtol)


@dataclass(frozen=True)
class MapHeadBounds:
    """`map_head_bounds`: lower <= H_map <= upper; k, the lag span dimension; pointwise_rank, r*
    at a Gaussian token; full, whether k = pd (then K_n(u) has rank p at every u ≠ 0)."""

    lower: int
    upper: int
    k: int
    pointwise_rank: int
    full: bool


def map_head_bounds(ssm: LinearSSM, n: int, *, seed: Any = 0, rtol: float = 1e-10) -> MapHeadBounds:
    """Bounds on the map-level head count H_map ({prf:ref}`def-map-head-count`, {prf:ref}`thm-map-level-head-count`).

    lower: r* = `pointwise_lag_rank` at one Gaussian token (default_rng(seed); the maximum
    with probability 1), raised to the lower bound of ν(p, d) when k = pd; upper:
    min(k, len(nonsingular_values(p, d))).  k is `modal_lag_span_dimension` when A has
    distinct eigenvalues and n ≥ N, else `min_heads`.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    try:
        k = _modal_dimension(ssm, n, rtol)
    except ValueError:                                        # repeated eigenvalues, n < N, ...
        k = _lag_span(ssm, n, rtol)[1].dim
    r = _pointwise_rank(ssm, n, np.random.default_rng(seed).standard_normal(ssm.d), rtol)
    nu_lower, nu_upper = nonsingular_dimension_bounds(ssm.p, ssm.d)
    full = k == ssm.p * ssm.d
    return MapHeadBounds(max(r, nu_lower) if full else r, min(k, nu_upper), k, r, full)


def _bisect_singular(V: np.ndarray, u0: np.ndarray, direction: Any) -> np.ndarray:
    # Square B(u) (H = p odd): det B(−u) = −det B(u), so on the half circle cos θ u_0 + sin θ w,
    # θ ∈ [0, π], det changes sign; bisection finds a unit u with det B(u) = 0 to rounding.
    if direction is None:
        w = np.eye(len(u0))[np.argmin(np.abs(u0))]
    else:
        w = _as_float64(direction, "direction", ("d",), {"d": len(u0)})
    w = w - (w @ u0) * u0
    if np.linalg.norm(w) <= 1e-12:
        raise ValueError("direction must not be a multiple of start")
    w /= np.linalg.norm(w)

    def point(theta: float) -> np.ndarray:
        return math.cos(theta) * u0 + math.sin(theta) * w

    def det(theta: float) -> float:
        return float(np.linalg.det(_token_matrix(V, point(theta))))

    low, high, f_low = 0.0, math.pi, det(0.0)
    if f_low == 0.0:
        return u0
    middle = 0.5 * (low + high)
    while middle not in (low, high) and (f_middle := det(middle)) != 0.0:
        if (f_middle > 0) == (f_low > 0):
            low, f_low = middle, f_middle
        else:
            high = middle
        middle = 0.5 * (low + high)
    return point(middle)


def singular_token(values: Any, start: Any, direction: Any = None) -> np.ndarray:
    """A unit token u (d,) with rank [V_1 u, …, V_H u] < p ({prf:ref}`lem-odd-nonsingular`), found constructively.

    It exists when H < max(p, d), or H = max(p, d) odd and min(p, d) >= 2:

    - H < p: u = start; H < d: u ⟂ the rows yᵀ V_h for y = start, so y ⟂ every V_h u;
    - H = p odd, d >= 2: bisection on det B(u), an odd form, along the half great circle
      from u_0 = start towards w = direction (default: the basis vector least aligned);
    - H = d odd, p >= 2: the same for the family V_hᵀ gives y, then u as for H < d.

    Args:
        values: shape (H, p, d).  start: non-zero, shape (d,) when H <= p, else (p,).
        direction: shape of start, not a multiple of it.
    """
    V = _as_values(values)
    H, p, d = V.shape
    if H < p or (H == p and p % 2 == 1 and d >= 2):
        u0 = _nonzero(start, "d", d, "a non-zero token")
        return u0 / np.linalg.norm(u0) if H < p else _bisect_singular(V, u0 / np.linalg.norm(u0), direction)
    if H < d or (H == d and d % 2 == 1 and p >= 2):
        y = _nonzero(start, "p", p, "non-zero")
        if H == d:
            y = _bisect_singular(V.transpose(0, 2, 1).copy(), y / np.linalg.norm(y), direction)
        u = np.linalg.svd(np.einsum("a,hab->hb", y, V))[2][-1]      # the null vector of the rows yᵀ V_h
        return u / np.linalg.norm(u)
    raise ValueError(f"values must have H < max(p, d) heads, or H = p odd with d >= 2, or H = d odd with "
                     f"p >= 2 (then a rank-deficient token is guaranteed); got shape {V.shape}")


def _nonzero(start: Any, symbol: str, size: int, kind: str) -> np.ndarray:
    start = _as_float64(start, "start", (symbol,), {symbol: size})
    if not np.linalg.norm(start) > 0:
        raise ValueError(f"start must be {kind}")
    return start


def token_miss(ssm: LinearSSM, n: int, values: Any, token: Any, rtol: float = 1e-10) -> float:
    """The least relative error of heads with values V_h on the input (u, 0, …, 0), in [0, 1].

    √(Σ_ℓ dist(L_ℓ u, range B(u))² / Σ_ℓ ‖L_ℓ u‖²), with L_ℓ u from the SSM's forward pass
    and range B(u) cut to singular values > rtol ‖V‖ ‖u‖ (0 if the SSM outputs 0): the
    quantity the necessity half of {prf:ref}`thm-map-level-head-count` bounds below.
    values: (H, p, d); token: u, shape (d,); rtol: rank tolerance of B(u), 0 < rtol < 1.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    V = _as_values(values, {"p": ssm.p, "d": ssm.d})
    u = _as_float64(token, "token", ("d",), {"d": ssm.d})
    K = _single_token_outputs(ssm, n, u).T                        # L_ℓ u, (p, n)
    left, sigma, _ = np.linalg.svd(_token_matrix(V, u), full_matrices=False)
    rank = int((sigma > rtol * np.linalg.norm(V) * np.linalg.norm(u)).sum())
    residual = K - left[:, :rank] @ (left[:, :rank].T @ K)
    total = float((K ** 2).sum())
    return float(np.sqrt((residual ** 2).sum() / total)) if total > 0 else 0.0


class TokenDependentHeads(SequenceMap):
    """H heads with fixed values and token-dependent coefficients that compute an SSM's map.

    The sufficiency construction of {prf:ref}`thm-map-level-head-count` ((I, J) for
    p = d = 2: {prf:ref}`prop-map-level-two-heads`).  With B(u) = [V_1 u, …, V_H u] of rank p,
    a_ℓ(u) is the least-norm solution of B(u) a = L_ℓ u (QR of B(u)ᵀ; error amplification
    ~ cond B(u)) and α^h_ij(X) = a^h_{i−j}(x_j) for j ≤ i (0 for j > i and for x_j = 0), so
    Σ_h V_h Σ_j α^h_ij(X) x_j = Σ_{j≤i} L_{i−j} x_j on every X, with interaction rank ≤ H.
    Any length; the SSM's dtype.

    Args:
        ssm: a LinearSSM.
        values: V_1..V_H, shape (H, p, d), spanning ℝ^p at every non-zero token met (default
            `nonsingular_values(p, d)`); a call raises ValueError naming `values` otherwise.
    """

    def __init__(self, ssm: LinearSSM, values: Any = None) -> None:
        ssm = _check_ssm(ssm)
        super().__init__(ssm.dtype, ssm.d, ssm.p)
        self.ssm = ssm
        V = nonsingular_values(ssm.p, ssm.d) if values is None else values
        self.H = self._set_parameters({"p": ssm.p, "d": ssm.d}, values=(V, ("H", "p", "d")))["H"]

    def values(self) -> np.ndarray:
        """V_h, shape (H, p, d)."""
        return _view(self._values)

    def coefficients(self, X: Any) -> torch.Tensor | np.ndarray:
        """α^h_ij(X), shape (H, n, n) or (b, H, n, n)."""
        return self._at_edge(self._coefficients, X)

    def _coefficients(self, X: torch.Tensor) -> torch.Tensor:
        n, device = X.shape[1], X.device
        targets = torch.einsum("lpd,bjd->bjpl", self.ssm._lags(n), X)          # L_ℓ x_j, (b, n_j, p, n_ℓ)
        B = torch.einsum("hpd,bjd->bjph", self._values, X)                     # B(x_j), (b, n, p, H)
        nonzero = (X != 0).any(-1)
        safe = torch.where(nonzero[..., None, None], B, torch.eye(self.p, self.H, dtype=self.dtype, device=device))
        Q, R = torch.linalg.qr(safe.transpose(-1, -2))                         # B(x)ᵀ = QR
        scale = torch.linalg.matrix_norm(safe, ord=2)[..., None]
        if bool((R.diagonal(dim1=-2, dim2=-1).abs() <= 1e-13 * scale).any()):
            raise ValueError("values must span R^p at every non-zero token: [V_1 x, ..., V_H x] has rank < p "
                             "at a token of this input (use a nonsingular family, e.g. nonsingular_values(p, d))")
        a = Q @ torch.linalg.solve_triangular(R.transpose(-1, -2), targets, upper=False)   # least-norm a_ℓ(x_j)
        a = torch.where(nonzero[..., None, None], a, 0.0)
        lag = torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)[None, :]   # i − j
        alpha = a.permute(0, 2, 1, 3)[:, :, torch.arange(n, device=device).expand(n, n), lag.clamp(min=0)]
        return torch.where(lag >= 0, alpha, 0.0)                               # α[b, h, i, j] = a^h_{i−j}(x_j)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        mixed = torch.einsum("bhij,bjd->bhid", self._coefficients(X), X)
        return torch.einsum("hpd,bhid->bip", self._values, mixed)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self._coefficients(X), self._values)

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "N": self.ssm.N, **super()._sizes()}


# -- S4D-style SSMs and the continuous limit ----------------------------------------------------


def s4d_continuous(N: int, d: int, *, init: str = "lin", p: int | None = None,
                   seed: Any = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The continuous system (A_c (N, N), B_c (N, d), C (p, N)) behind `s4d_ssm`, float64.

    "lin": A_c has the blocks [[−½, −πm], [πm, −½]], m = 1..⌊N/2⌋, plus −½ if N is odd;
    "real": A_c = diag(−1, …, −N).  B_c and C have iid N(0, 1/d) and N(0, 1/N) entries from
    default_rng(seed), in that order; p defaults to d.  ρ sets only the step (`s4d_step`).
    """
    N, d = check_int(N, "N"), check_int(d, "d")
    p = d if p is None else check_int(p, "p")
    init = check_choice(init, "init", ("lin", "real"))
    if init == "lin":
        A_c, k = np.diag(np.full(N, -0.5)), np.arange(0, N - 1, 2)         # block k/2 has m = k/2 + 1
        A_c[k, k + 1], A_c[k + 1, k] = -math.pi * (k // 2 + 1), math.pi * (k // 2 + 1)
    else:
        A_c = np.diag(-np.arange(1.0, N + 1))
    rng = np.random.default_rng(seed)
    B_c = rng.standard_normal((N, d)) / math.sqrt(d)
    C = rng.standard_normal((p, N)) / math.sqrt(N)
    return A_c, B_c, C


def s4d_step(spectral_radius: float, init: str = "lin") -> float:
    """The ZOH step Δ that gives `s4d_ssm` the spectral radius ρ: −2 ln ρ ("lin") or −ln ρ ("real")."""
    rho = _in_unit_interval(spectral_radius, "spectral_radius")
    return (-2 if check_choice(init, "init", ("lin", "real")) == "lin" else -1) * math.log(rho)


def s4d_ssm(N: int, d: int, spectral_radius: float, *, init: str = "lin", p: int | None = None,
            seed: Any = 0, dtype: Any = torch.float64) -> LinearSSM:
    """An S4D-style SSM with ρ(A) = spectral_radius: `s4d_continuous` by ZOH ({prf:ref}`prop-discretisation`).

    S4D-Lin (λ = −½ ± iπm) or S4D-Real (λ = −1..−N) eigenvalues (Gu et al. 2022) in real
    block form, step Δ = `s4d_step(ρ, init)`: ρ sets the step, the lags sample one impulse
    response at spacing Δ, and n steps cover T = nΔ.  Deviations from S4D: the lin modes
    start at m = 1 (a real pair would repeat an eigenvalue); no skip term D.
    """
    step = s4d_step(spectral_radius, init)
    A_c, B_c, C = s4d_continuous(N, d, init=init, p=p, seed=seed)
    return LinearSSM.from_continuous(A_c, B_c, C, step, "zoh", dtype=resolve_dtype(dtype))


def _phi2(z: np.ndarray) -> np.ndarray:
    # (e^z − 1 − z)/z², with its Taylor series near 0 (no cancellation).
    z = np.asarray(z, dtype=np.complex128)
    out = np.empty_like(z)
    small = np.abs(z) < 1e-2
    zs, zb = z[small], z[~small]
    out[small] = 0.5 + zs / 6 + zs ** 2 / 24 + zs ** 3 / 120 + zs ** 4 / 720
    out[~small] = (np.expm1(zb) - zb) / zb ** 2
    return out


def continuous_head_errors(A_c: Any, B_c: Any, C: Any, T: float, H_max: int) -> np.ndarray:
    """Σ_{q>H} λ_q(Γ_T), H = 0..H_max: the continuous-time limit of the least errors of H heads.

    Γ_T = ∫_0^T (1 − t/T) vec K(t) vec K(t)ᵀ dt for K(t) = C e^{t A_c} B_c; for ZOH with step
    Δ = T/n, GᵀG/(nΔ) → Γ_T ({prf:ref}`prop-heads-needed-continuous-limit`).  Closed form for
    A_c = Σ_m μ_m v_m w_mᵀ with distinct μ_m, R_m = C v_m w_mᵀ B_c:
    Γ_T = Σ_{m,m'} φ_T(μ_m + μ̄_m') vec R_m vec R̄_m'ᵀ, φ_T(a) = T (e^{aT} − 1 − aT)/(aT)².
    A_c: (N, N), B_c: (N, d), C: (p, N), T > 0.  Returns shape (H_max + 1,), entry 0 = trace Γ_T;
    tails below ~1e-13 of it are not resolved (numpy eigvalsh).
    """
    dims: dict[str, int] = {}
    A_c, B_c, C = (_as_float64(value, name, shape, dims) for value, name, shape in
                   ((A_c, "A_c", ("N", "N")), (B_c, "B_c", ("N", "d")), (C, "C", ("p", "N"))))
    T, H_max = check_real(T, "T", positive=True), check_int(H_max, "H_max", minimum=0)
    mu, residues = _residues(A_c, B_c, C, "A_c")
    gamma = residues.T @ (T * _phi2((mu[:, None] + mu.conj()[None, :]) * T)) @ residues.conj()
    eigenvalues = np.clip(np.linalg.eigvalsh(((gamma + gamma.conj().T) / 2).real)[::-1], 0.0, None)
    return _tails(eigenvalues, H_max)
