"""The head-count chapter's experiments: bounds on k, the map-level construction, heads needed, training.

Sections follow {ref}`chap-head-count`: the lag span dimension k ({prf:ref}`prop-lag-span-bound`,
{prf:ref}`prop-modal-lag-span`) and Monte Carlo errors of the truncated models; heads with
token-dependent coefficients and the nonsingular value families of the map-level count
({prf:ref}`thm-map-level-head-count`); the lag bound and the continuous limit of the heads
needed; the training sweep. Models are lib's (tensors in, tensors out); value families,
tokens and matrices here are float64 numpy arrays.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from lib import (LinearSSM, RelativeHeads, SequenceMap, SoftmaxAttention, batched, factorized_operator,
                 fit_rank_limited_heads, imitate, min_heads, operator_span, optimal_head_errors, rank_limited_error_floor,
                 rank_limited_heads, rank_limited_values, truncated_heads)
from lib.heads import _weighted_lags  # G (n, pd): rows √(n − ℓ) vec L_ℓ
from lib._validation import check_int
from lib.spans import rank
from lib.heads import _flat_rank, _modal_values, _outer_basis, _split  # part 2's constructions


def _tails(squares: np.ndarray, H_max: int) -> np.ndarray:
    # tails[H] = Σ_{r>=H} squares[r], H = 0..H_max, summed from the smallest up (small tails keep their digits).
    squares = np.concatenate([squares, np.zeros(max(0, H_max + 1 - len(squares)))])
    return np.concatenate([np.cumsum(squares[::-1])[::-1], [0.0]])[: H_max + 1]


# -- the lag span dimension k -------------------------------------------------------------------


def minimal_polynomial_degree(A: np.ndarray, rtol: float = 1e-10) -> int:
    """m_A, the degree of the minimal polynomial of A (N, N) ({prf:ref}`prop-lag-span-bound`).

    dim span{I, A, …, A^N} (A first divided by its largest absolute entry).
    """
    scale = np.abs(A).max()
    A = A / scale if scale > 0 else A
    powers = [np.eye(len(A))]
    for _ in range(len(A)):
        powers.append(powers[-1] @ A)
    return operator_span(np.stack(powers), rtol).dim


def lag_span_bound(ssm: Any, n: int) -> int:
    """min(m_A, n, p·d), the bound on k of {prf:ref}`prop-lag-span-bound`, for a LinearSSM."""
    return min(minimal_polynomial_degree(ssm.A.numpy(force=True)), n, ssm.p * ssm.d)


def residues(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Modes μ (N,) and residues R_m = C v_m w_mᵀ B (N, p, d), complex, for A = Σ_m μ_m v_m w_mᵀ.

    So that C A^ℓ B = Σ_m μ_m^ℓ R_m. ValueError unless A is diagonalisable (eigenvector
    condition number <= 1e8) with distinct eigenvalues (gaps > 1e-8 · max(1, max|μ|)).
    """
    mu, R = np.linalg.eig(A)
    if np.linalg.cond(R) > 1e8:
        raise ValueError(f"A is too far from diagonalisable for the modal route "
                         f"(eigenvector condition number {np.linalg.cond(R):.2e})")
    gaps = np.abs(mu[:, None] - mu[None, :])
    np.fill_diagonal(gaps, np.inf)
    if len(mu) > 1 and gaps.min() <= 1e-8 * max(1.0, np.abs(mu).max()):
        raise ValueError(f"A has (nearly) repeated eigenvalues (smallest gap {gaps.min():.2e}); "
                         "the modal route needs distinct ones")
    return mu, np.einsum("pm,md->mpd", C @ R, np.linalg.inv(R) @ B)


def modal_lag_span_dimension(ssm: Any, rtol: float = 1e-10) -> int:
    """k_n for every n >= N from the modes of a LinearSSM: dim span{R_m} ({prf:ref}`prop-modal-lag-span`).

    The real span of the residues is that of {Re R_m, Im R_m} (they come in conjugate pairs).
    No powers μ^ℓ enter, so lags that decay below rounding do not blur the rank: at n = 1024
    and ρ = 0.5 an S4D SSM with N = 32 has `min_heads` 30 but k = 32. ValueError as `residues`.
    """
    _, R = residues(*(m.numpy(force=True) for m in (ssm.A, ssm.B, ssm.C)))
    return operator_span(np.concatenate([R.real, R.imag]), rtol).dim


def sampled_head_errors(ssm: Any, n: int, heads: Iterable[int], samples: int, *, tokens: str = "gaussian",
                        seed: Any = 0, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo Σ_i E‖y_i − ŷ_i‖² of `truncated_heads(ssm, n, H)` for H in heads: (mean, standard error).

    `samples` sequences of iid N(0, 1) ("gaussian") or ±1 ("rademacher") entries (default_rng(seed),
    `chunk` at a time), the same for every H, so E[x_j x_j'ᵀ] = δ_jj' I
    ({prf:ref}`thm-approx-head-count`). Both results have shape (len(heads),).
    """
    models = [truncated_heads(ssm, n, H) for H in heads]
    rng = np.random.default_rng(seed)
    errors = np.empty((len(models), samples))
    for start in range(0, samples, chunk):
        shape = (min(chunk, samples - start), n, ssm.d)
        X = rng.standard_normal(shape) if tokens == "gaussian" else rng.choice([-1.0, 1.0], size=shape)
        X = torch.from_numpy(X)
        with torch.no_grad():
            Y = ssm(X)
            for r, model in enumerate(models):
                errors[r, start:start + len(X)] = ((Y - model(X)) ** 2).sum((1, 2)).numpy()
    return errors.mean(axis=1), errors.std(axis=1, ddof=1) / math.sqrt(samples)


def operator_head_errors(ssm: Any, n: int, H_max: int) -> np.ndarray:
    """Σ_{q>H} σ_q(F)², H = 0..H_max, for F (n², pd) the rows vec 𝒲_ij(ᵀ) of the map's operator over all pairs.

    𝒲 is read off the forward pass on the n·d unit impulses (token e_b at position j): no lags,
    no lag matrix, no `min_heads`. By Eckart–Young these are the least errors of H heads with
    input-independent coefficients (the proof of {prf:ref}`thm-approx-head-count` before its
    last step, FᵀF = GᵀG); entry 0 is the output energy Σ_ij ‖𝒲_ij‖²_F.
    """
    d, p = ssm.d, ssm.p
    impulses = torch.eye(n * d, dtype=torch.float64).reshape(n * d, n, d)  # row j·d + b: e_b at position j
    with torch.no_grad():
        Y = ssm(impulses).numpy(force=True)                                # Y[j·d + b, i, a] = 𝒲_ij[a, b]
    F = Y.reshape(n, d, n, p).transpose(2, 0, 3, 1).reshape(n * n, p * d)
    return _tails(np.linalg.svd(F, compute_uv=False) ** 2, H_max)


# -- value maps of bounded rank ({prf:ref}`prop-rank-limited-heads`) -----------------------------


def value_span_error(ssm: Any, n: int, values: np.ndarray) -> float:
    """Σ_ℓ (n − ℓ) dist(L_ℓ, span{V_h})²_F: the least Σ_i E‖y_i − ŷ_i‖² of heads with value maps V (H, p, d).

    Over all input-independent coefficients, on tokens with E[x_j x_j'ᵀ] = δ_jj' I (the proof of
    {prf:ref}`thm-approx-head-count`: for fixed values the best coefficients project every lag
    on their span). The span is taken from an SVD of the maps (cut at 1e-13 of the largest
    singular value), so badly scaled or nearly parallel maps are fine.
    """
    return float((_span_residual(ssm, n, values) ** 2).sum())


def _span_residual(ssm: Any, n: int, values: Any) -> np.ndarray:
    # G − G Π (n, pd): the weighted lags' rows √(n − ℓ) vec L_ℓ minus their projection on span{V_h}
    G = _weighted_lags(ssm, n)
    V = np.asarray(values, dtype=float)
    if V.ndim != 3 or V.shape[1:] != (ssm.p, ssm.d) or not np.all(np.isfinite(V)):
        raise ValueError(f"values must be a finite (H, p, d) = (H, {ssm.p}, {ssm.d}) array; got shape {V.shape}")
    V = V.reshape(len(V), ssm.p * ssm.d).T  # (pd, H)
    if V.size == 0 or not np.abs(V).max() > 0:
        return G
    left, sigma, _ = np.linalg.svd(V / np.abs(V).max(), full_matrices=False)
    basis = left[:, sigma > 1e-13 * sigma[0]]
    return G - (G @ basis) @ basis.T


def output_relative_error(ssm: Any, n: int, values: np.ndarray) -> float:
    """(Σ_i E‖y_i − ŷ_i‖² / Σ_i E‖y_i‖²)^½ of heads with value maps V (H, p, d) and the best
    input-independent coefficients, on white tokens: `value_span_error` over its H = 0 value (the
    relative error of the head-count chapter's convention; 0 iff every lag lies in span{V_h})."""
    total = value_span_error(ssm, n, np.zeros((0, ssm.p, ssm.d)))
    return math.sqrt(value_span_error(ssm, n, values) / total) if total > 0 else 0.0  # the zero map: no error


def memoryless_output_error(ssm: Any, n: int) -> float:
    """e_y of a layer with no memory: L_0 exact and every later lag zero, on white tokens.

    (Σ_{ℓ≥1} (n − ℓ)‖L_ℓ‖²_F / Σ_ℓ (n − ℓ)‖L_ℓ‖²_F)^½, the output relative error of
    `output_relative_error`'s convention; 1 minus its square is the share of the output energy
    that L_0 (with a skip, CB + D) carries. 0 for the zero map and for n = 1.
    """
    n = check_int(n, "n")
    G = _weighted_lags(ssm, n)
    total = float((G ** 2).sum())
    return math.sqrt(float((G[1:] ** 2).sum()) / total) if total > 0 else 0.0


def memory_output_error(ssm: Any, n: int, values: Any) -> float:
    """The relative error on the lags ℓ >= 1 alone of heads with value maps V (H, p, d).

    With the best input-independent coefficients (each lag projected on span{V_h}), on white
    tokens: (Σ_{ℓ≥1} (n − ℓ) dist(L_ℓ, span{V_h})²_F / Σ_{ℓ≥1} (n − ℓ)‖L_ℓ‖²_F)^½, the relative
    error of the memory part Σ_{j<i} L_{i−j} x_j of the outputs (positions 0-based in code).
    0 where there is no memory (every L_ℓ = 0 for ℓ >= 1, or n = 1).
    """
    n = check_int(n, "n")
    residual = _span_residual(ssm, n, values)[1:]
    memory = float((_weighted_lags(ssm, n)[1:] ** 2).sum())
    return math.sqrt(float((residual ** 2).sum()) / memory) if memory > 0 else 0.0


def rank_limited_head_error(ssm: Any, n: int, H: int, rank: int, *, restarts: int = 50, seed: Any = 0,
                            max_iter: int = 1000) -> float:
    """The least Σ_i E‖y_i − ŷ_i‖² an optimiser finds for H heads whose value maps have rank <= `rank`.

    `lib.fit_rank_limited_heads` (L-BFGS) on the weighted lags G (its relative error squared, times ‖G‖²_F):
    input-independent coefficients, eliminated by projection (`value_span_error`). It stops at or
    above the least error, and approaches an infimum that is not attained only slowly
    ({prf:ref}`prop-rank-limited-heads`).
    """
    error = fit_rank_limited_heads(ssm, n, H, rank, weighted=True, method="lbfgs", restarts=restarts,
                                   seed=seed, max_iter=max_iter)[0]
    return error ** 2 * float((_weighted_lags(ssm, n) ** 2).sum())


def as_built_verdict(lower: int, upper: int, H: int) -> str:
    """"yes" if H heads of width d/H are proved to represent the map (upper bound on H_{d/H} <= H),
    "no" if proved not to (lower bound > H), "open" otherwise ({prf:ref}`cor-heads-as-built`)."""
    return "yes" if upper <= H else "no" if lower > H else "open"


def built_values_residual(ssm: Any, n: int, r: int, *, per_lag: bool = False) -> float:
    """How far the lags ℓ < n lie from the span of `lib.rank_limited_values` (the proofs' value maps).

    Numpy least squares of every lag on the maps, the largest residual entry relative to the largest
    lag entry (L_0's, with a skip); per_lag: the largest ‖residual_ℓ‖_F / ‖L_ℓ‖_F over the non-zero
    lags instead. inf if a map has rank above r (numerical, 1e-10 relative) — 0 up to rounding
    when the construction of {prf:ref}`thm-rank-limited-heads` parts 2 and 4 is right.
    """
    if not isinstance(per_lag, bool):
        raise TypeError(f"per_lag must be a bool; got {type(per_lag).__name__}")
    return _lags_residual(ssm, n, rank_limited_values(ssm, r, n), r, per_lag)


def _lags_residual(ssm: Any, n: int, V: np.ndarray, r: int, per_lag: bool = False) -> float:
    # numpy least squares of every lag ℓ < n on the maps V (H, p, d), the largest residual entry
    # relative to the largest lag entry (per_lag: the largest ‖residual_ℓ‖_F / ‖L_ℓ‖_F over the
    # non-zero lags); inf if a map has rank above r (1e-10 relative)
    lags = ssm.lags(n).detach().to(torch.float64).numpy().reshape(n, -1)
    if not np.abs(lags).max() > 0:
        return 0.0
    if any(np.linalg.matrix_rank(v, tol=1e-10 * np.abs(v).max()) > r for v in V):
        return math.inf
    flat = V.reshape(len(V), -1)
    if len(flat) == 0:
        return 1.0
    coef = np.linalg.lstsq(flat.T, lags.T, rcond=None)[0]
    residual = (flat.T @ coef - lags.T).T                                 # (n, pd)
    if per_lag:
        norms = np.linalg.norm(lags, axis=1)
        return float((np.linalg.norm(residual, axis=1)[norms > 0] / norms[norms > 0]).max())
    return float(np.abs(residual).max() / np.abs(lags).max())


def _rank(M: np.ndarray) -> int:
    # lib's rank rule (1e-10 relative to σ_1), the one rank_limited_heads uses
    return rank(np.linalg.svd(M, compute_uv=False), 1e-10)


def construction_misses(ssm: Any, n: int, r: int) -> dict:
    """Each upper-bound construction of {prf:ref}`thm-rank-limited-heads` part 2, checked on its own.

    Unlike `lib.rank_limited_values` (which keeps the smallest construction that holds the lags),
    nothing is filtered: for the SVD split of an orthonormal basis Q_1 … Q_k of the lag span (it
    must give Σ_b ⌈rank Q_b / r⌉ maps), the c·q maps u_a w_bᵀ (k_col · k_row maps) and, for a
    LinearSSM with diagonalisable A, the modal maps (N_ℝ + 3N_ℂ at r = 1, N at r >= 2; N_ℂ the
    number of complex pairs), the entry is (maps built, maps the proof counts, residual of the lags
    ℓ < n on their span by numpy least squares, lag by lag: the largest ‖residual_ℓ‖_F / ‖L_ℓ‖_F,
    as `built_values_residual(per_lag=True)`; inf if a map has rank above r). Lag by lag, so that
    a large L_0 (a skip) cannot hide a missed direction of the later lags.
    "misses": constructions with a wrong count or a residual above 1e-8.
    """
    Q = operator_span(ssm.lags(n).detach(), 1e-10).basis
    out: dict = {}
    if len(Q):
        ranks = [_rank(q) for q in Q]
        k_col, k_row = _flat_rank(Q, 1e-10), _flat_rank(Q.transpose(0, 2, 1), 1e-10)
        for name, V, count in [("split", _split(Q, r, 1e-10), sum(-(-m // r) for m in ranks)),
                               ("outer", _outer_basis(Q, 1e-10), k_col * k_row)]:
            out[name] = (len(V), count, _lags_residual(ssm, n, V, r, per_lag=True))
    if isinstance(ssm, LinearSSM):
        V = _modal_values(ssm, r)
        if V is not None:
            lam = np.linalg.eigvals(ssm.A.detach().to(torch.float64).numpy())
            pairs = int((np.abs(lam.imag) > 1e-12 * np.abs(lam).max()).sum()) // 2
            N = len(lam)
            out["modal"] = (len(V), N + pairs if r == 1 else N, _lags_residual(ssm, n, V, r, per_lag=True))
    out["misses"] = sum(int(built != count or not residual <= 1e-8) for built, count, residual in out.values())
    return out


def residual_lag_span(ssm: Any, n: int) -> RelativeHeads:
    """A model whose lags ℓ < n are L_ℓ − δ_ℓ0 I (p = d): what the attention inside a residual block
    y = x + Attn(x) must represent ({prf:ref}`cor-heads-as-built` part 6), for `lib.rank_limited_heads`."""
    lags = ssm.lags(n).detach().to(torch.float64).clone()
    if lags.shape[1] != lags.shape[2]:
        raise ValueError(f"ssm must have p = d for a residual block; got p = {lags.shape[1]}, d = {lags.shape[2]}")
    lags[0] -= torch.eye(lags.shape[1], dtype=lags.dtype)
    return RelativeHeads(lags, torch.eye(n, dtype=lags.dtype))


def memory_lag_span(ssm: Any, n: int) -> RelativeHeads:
    """A model whose lags ℓ < n are L_ℓ for ℓ >= 1 and L_0 = 0: the memory part alone, to fit heads
    to the lags ℓ >= 1 only (`lib.fit_rank_limited_heads`, weighted as the outputs are)."""
    lags = ssm.lags(n).detach().to(torch.float64).clone()
    lags[0] = 0.0
    return RelativeHeads(lags, torch.eye(n, dtype=lags.dtype))


def rank_limited_survey(ssm: Any, n: int, r: int, heads: Iterable[int], fit: Callable[[int], float]) -> dict:
    """The bounds of {prf:ref}`thm-rank-limited-heads` for value maps of rank <= r, and the checks on them.

    `fit(H)` is the optimiser's relative error with H heads of rank <= r (e of part 5). Returns k,
    k_col = dim col, k_row = dim row, lower, upper, `built` (`built_values_residual`: the upper
    bound's value maps, built), the floor of part 5 and fit at H = lower − 1 (None if lower = 0),
    fit at upper (a measurement: an optimiser can stop above 0 at a correct bound), and
    `constructions` (`construction_misses`: part 2's constructions, each on its own, with a wrong
    count or missing a lag), `failures`: bounds that cross, upper bound's maps that miss the lags
    (residual > 1e-8), construction misses, or the optimiser below the floor at lower − 1.
    `heads`: more H at which to record fit(H) (as "e at H").
    """
    k = min_heads(ssm, n)
    Q = operator_span(ssm.lags(n).detach(), 1e-10).basis
    k_col = _flat_rank(Q, 1e-10) if k else 0                              # [Q_1 … Q_k]
    k_row = _flat_rank(Q.transpose(0, 2, 1), 1e-10) if k else 0
    lower, upper = rank_limited_heads(ssm, r, n)
    row = dict(k=k, k_col=int(k_col), k_row=int(k_row), lower=lower, upper=upper,
               built=built_values_residual(ssm, n, r), floor=None, below=None,
               at_upper=fit(upper) if upper else 0.0)
    row["constructions"] = construction_misses(ssm, n, r)["misses"]
    failures = int(lower > upper) + int(not row["built"] <= 1e-8) + row["constructions"]
    if lower >= 1:
        row["floor"] = rank_limited_error_floor(ssm, n, lower - 1, r)
        row["below"] = fit(lower - 1)
        failures += int(row["below"] < row["floor"] * (1 - 1e-9))
    row.update({f"e at {H}": fit(H) for H in heads})
    row["failures"] = failures
    return row


ROTATION_SCALINGS = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.0, -1.0], [1.0, 0.0]]])  # I, J


def rank_one_pair(ssm: Any, n: int, t: float) -> np.ndarray:
    """Two rank-one value maps (2, 2, 2) whose span S_t tends, as t → 0, to span{v_1, (v_2 + w)/√2}.

    For a 2 × 2 SSM whose lags are rotation–scalings: v_1, v_2 the top right singular vectors of G
    (reshaped; they lie in span{I, J}), w = diag(1, −1)/√2 ⟂ span{I, J}. The maps are
    m = (v_2 + w)/√2 and v_1 + t w + c m with c = (1 − t²)/(√2 t), both of rank one (det = 0);
    the infimum σ_2(G)²/2 of {prf:ref}`prop-rank-limited-heads` is their error's limit.
    """
    v = np.linalg.svd(_weighted_lags(ssm, n))[2][:2].reshape(2, 2, 2)
    w = np.diag([1.0, -1.0]) / math.sqrt(2)
    m = (v[1] + w) / math.sqrt(2)
    return np.stack([m, v[0] + t * w + (1 - t * t) / (math.sqrt(2) * t) * m])


def rank_one_triple() -> np.ndarray:
    """E_11, E_22 and [[1, −1], [1, −1]]: three rank-one value maps whose span contains I and J."""
    return np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]], [[1.0, -1.0], [1.0, -1.0]]])


# -- the map level: heads with token-dependent coefficients -------------------------------------


class TokenDependentHeads(SequenceMap):
    """H heads with value maps V (H, p, d) and token-dependent coefficients that compute an LTI map.

    The sufficiency half of {prf:ref}`thm-map-level-head-count` ((I, J) for p = d = 2:
    {prf:ref}`prop-map-level-two-heads`). With 𝒱(u) = [V_1 u, …, V_H u] of rank p, a_ℓ(u) is
    the least-norm solution of 𝒱(u) a = L_ℓ u (QR of 𝒱(u)ᵀ; errors grow with cond 𝒱(u)) and
    α^h_ij(X) = a^h_{i−j}(x_j) for j <= i (0 for j > i and for x_j = 0), so that
    Σ_h V_h Σ_j α^h_ij(X) x_j = Σ_{j<=i} L_{i−j} x_j on every X, with interaction rank <= H.
    V defaults to `nonsingular_values(p, d)`; the ssm (with `lags`) is a submodule.
    """

    def __init__(self, ssm: Any, values: Any = None) -> None:
        super().__init__()
        self.ssm = ssm
        V = nonsingular_values(ssm.p, ssm.d) if values is None else values
        self.H = self.set_parameters(ssm.dtype, {"p": ssm.p, "d": ssm.d}, V=(V, "H p d"))["H"]
        self.d, self.p = ssm.d, ssm.p

    def values(self) -> torch.Tensor:
        """V_h, shape (H, p, d)."""
        return self.V

    @batched
    def coefficients(self, X: torch.Tensor) -> torch.Tensor:
        """α^h_ij(X), shape (b, H, n, n). ValueError if B(x_j) has rank < p at a token x_j ≠ 0."""
        n, device = X.shape[1], X.device
        targets = torch.einsum("lpd,bjd->bjpl", self.ssm.lags(n), X)  # L_ℓ x_j, (b, j, p, ℓ)
        B = torch.einsum("hpd,bjd->bjph", self.V, X)                   # 𝒱(x_j), (b, j, p, H)
        nonzero = (X != 0).any(-1)[..., None, None]
        B = torch.where(nonzero, B, torch.eye(self.p, self.H, dtype=X.dtype, device=device))
        Q, R = torch.linalg.qr(B.transpose(-1, -2))                    # B(x)ᵀ = QR
        scale = torch.linalg.matrix_norm(B, ord=2)[..., None]
        if bool((R.diagonal(dim1=-2, dim2=-1).abs() <= 1e-13 * scale).any()):
            raise ValueError("values must span R^p at every non-zero token: [V_1 x, ..., V_H x] has rank < p "
                             "at a token of this input (use a nonsingular family, e.g. nonsingular_values)")
        a = torch.where(nonzero, Q @ torch.linalg.solve_triangular(R.transpose(-1, -2), targets, upper=False), 0.0)
        lag = torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)  # i − j
        alpha = a.permute(0, 2, 1, 3)[:, :, torch.arange(n, device=device).expand(n, n), lag.clamp(min=0)]
        return torch.where(lag >= 0, alpha, 0.0)

    @batched
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        mixed = torch.einsum("bhij,bjd->bhid", self.coefficients(X), X)
        return torch.einsum("hpd,bhid->bip", self.V, mixed)

    @batched
    def operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self.coefficients(X), self.V)


# -- nonsingular value families ({prf:ref}`prop-nonsingular-families`) ---------------------------


def polynomial_values(p: int, d: int) -> np.ndarray:
    """(V_h)_ab = 1[a + b = h], shape (p + d − 1, p, d): yᵀ V_h u is the t^h coefficient of y(t)u(t)."""
    a, b = np.meshgrid(np.arange(p), np.arange(d), indexing="ij")
    return (a + b == np.arange(p + d - 1)[:, None, None]).astype(np.float64)


def complex_values(p: int, d: int) -> np.ndarray:
    """The complex structure for p = 2 or d = 2: shape (m, p, d), m = 2⌈max(p, d)/2⌉.

    For p = 2, (V_h)_0b = δ_hb and (V_h)_1b = J_hb, J the 90° rotation of each coordinate pair
    of ℝ^m, so 𝒱(u) has orthogonal rows of norm ‖u‖; for d = 2 the transposed family of (2, p).
    """
    if p != 2:
        return complex_values(2, p).transpose(0, 2, 1)
    m = d + d % 2
    V = np.zeros((m, 2, d))
    V[:, 0, :] = np.eye(m)[:, :d]
    V[:, 1, :] = np.kron(np.eye(m // 2), [[0.0, -1.0], [1.0, 0.0]])[:, :d]
    return V


def _cd_product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Cayley–Dickson doubling (a, b)(c, d) = (ac − d̄b, da + bc̄), x̄ = (x_0, −x_1, …): ℝ, ℂ, ℍ, 𝕆 for m = 1, 2, 4, 8.
    if len(x) == 1:
        return x * y
    h, bar = len(x) // 2, lambda v: np.concatenate([v[:1], -v[1:]])
    a, b, c, d = x[:h], x[h:], y[:h], y[h:]
    return np.concatenate([_cd_product(a, c) - _cd_product(bar(d), b),
                           _cd_product(d, a) + _cd_product(b, bar(c))])


def cayley_dickson_values(p: int, d: int) -> np.ndarray:
    """Left multiplication by e_h in ℝ, ℂ, ℍ or 𝕆 cut to p × d: (V_h)_ab = (e_h e_b)_a, shape (m, p, d).

    m is the least of 1, 2, 4, 8 that is >= max(p, d) (p, d <= 8); entries 0, ±1. For p = d = 2
    the family is (I, J) of {prf:ref}`prop-map-level-two-heads`.
    """
    m = next(size for size in (1, 2, 4, 8) if size >= max(p, d))
    basis = np.eye(m)
    table = np.stack([np.stack([_cd_product(basis[h], basis[b]) for b in range(m)], axis=1) for h in range(m)])
    return table[:, :p, :d]


def nonsingular_values(p: int, d: int) -> np.ndarray:
    """The family with the fewest heads among Cayley–Dickson, complex and polynomial (ties in that order).

    Its size bounds ν(p, d) from above ({prf:ref}`thm-map-level-head-count`); p = d = 2 gives (I, J).
    """
    candidates = [cayley_dickson_values(p, d)] if max(p, d) <= 8 else []
    if 2 in (p, d):
        candidates.append(complex_values(p, d))
    return min(candidates + [polynomial_values(p, d)], key=len)


def hopf_stiefel_number(p: int, d: int) -> int:
    """p∘d, the least m with the binomial coefficient C(m, k) even for every k with m − p < k < d.

    The Hopf–Stiefel condition: a nonsingular bilinear map ℝ^p × ℝ^d → ℝ^m exists only if m >= p∘d
    (Hopf 1940, Stiefel 1940), so ν(p, d) >= p∘d ({prf:ref}`cor-map-level-exact`). Symmetric in
    p and d (k ↦ m − k); m < max(p, d) always fails (k = m or k = 0 is in the range, C = 1).
    """
    m = 1
    while any(math.comb(m, k) % 2 for k in range(max(m - p + 1, 0), d)):
        m += 1
    return m


def truncated_binomial_vanishes(p: int, d: int, m: int) -> bool:
    """Whether (x + y)^m = 0 in 𝔽_2[x, y]/(x^p, y^d), by m multiplications by x + y mod 2.

    The form in which Hopf's proof meets the condition (the cohomology ring of ℝP^{p−1} × ℝP^{d−1}
    mod 2); no binomial coefficient is computed, so it is an independent route to
    `hopf_stiefel_number`: that number is the least m for which this is True.
    """
    power = np.zeros((p, d), dtype=np.uint8)
    power[0, 0] = 1
    for _ in range(m):
        product = np.zeros_like(power)
        product[1:, :] ^= power[:-1, :]  # · x
        product[:, 1:] ^= power[:, :-1]  # · y
        power = product
    return not power.any()


def elementary_nonsingular_bound(p: int, d: int) -> int:
    """max(p, d), plus 1 when max(p, d) is odd and min(p, d) >= 2: the lower bound on ν(p, d) of
    {prf:ref}`lem-odd-nonsingular` (the cases k = 1 and k = m − 1 of the Hopf–Stiefel condition)."""
    big, small = max(p, d), min(p, d)
    return big + (1 if big % 2 and small >= 2 else 0)


def nonsingular_dimension_bounds(p: int, d: int) -> tuple[int, int]:
    """(lower, upper) bounds on ν(p, d), the least size of a nonsingular family.

    lower = `hopf_stiefel_number(p, d)`; upper = len(nonsingular_values(p, d)). They meet for
    every p, d <= 8 ({prf:ref}`cor-map-level-exact`).
    """
    return hopf_stiefel_number(p, d), len(nonsingular_values(p, d))


def composition_defect(values: np.ndarray) -> float:
    """max |S_aa'bb' + S_aa'b'b − 2 δ_aa' δ_bb'| with S_aa'bb' = Σ_h (V_h)_ab (V_h)_a'b', for V (H, p, d).

    0 exactly when 𝒱(u)𝒱(u)ᵀ = ‖u‖² I_p for every u; exact for integer families, so 0 proves a
    family norm-preserving, hence nonsingular with cond 𝒱(u) = 1.
    """
    S = np.einsum("hab,hce->acbe", values, values)  # S[a, a', b, b']
    p, d = values.shape[1:]
    target = 2.0 * np.einsum("ac,be->acbe", np.eye(p), np.eye(d))
    return float(np.abs(S + S.transpose(0, 1, 3, 2) - target).max())


def token_matrix(values: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """𝒱(u) = [V_1 u, …, V_H u] for V (H, p, d) and tokens u (..., d): shape (..., p, H).

    A family is nonsingular when 𝒱(u) has rank p at every u ≠ 0.
    """
    return np.einsum("hpd,...d->...ph", values, tokens)


def worst_conditioned_tokens(values: np.ndarray, samples: int = 20_000, keep: int = 3, *,
                             seed: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """The `keep` tokens (keep, d) with the largest cond 𝒱(u) = σ_1/σ_p (inf below rank p), worst first,
    and their condition numbers (keep,): a search, not a bound.

    Candidates: `samples` Gaussian tokens (default_rng(seed)), the basis vectors, (1, …, 1),
    (1, −1, …) and the binomial coefficients of (1 + t)^{d−1} (roots on the unit circle, the
    worst case of polynomial multiplication).
    """
    d = values.shape[2]
    structured = np.concatenate([np.eye(d), [np.ones(d), (-1.0) ** np.arange(d),
                                             [math.comb(d - 1, b) for b in range(d)]]])
    tokens = np.concatenate([np.random.default_rng(seed).standard_normal((samples, d)), structured])
    sigma = np.linalg.svd(token_matrix(values, tokens), compute_uv=False)[:, : values.shape[1]]
    with np.errstate(divide="ignore"):
        condition = np.where(sigma[:, -1] > 0, sigma[:, 0] / sigma[:, -1], np.inf)
    order = np.argsort(-condition)[:keep]
    return tokens[order], condition[order]


def pointwise_lag_rank(ssm: Any, n: int, token: np.ndarray, rtol: float = 1e-10) -> int:
    """dim span{L_0 u, …, L_{n−1} u} for a token u (d,): r* of {prf:ref}`thm-map-level-head-count` at u.

    Maximal for almost every u.
    """
    outputs = ssm.lags(n).numpy(force=True) @ token  # L_ℓ u, (n, p)
    return operator_span(outputs[:, :, None], rtol).dim


def map_head_bounds(ssm: Any, n: int, *, seed: Any = 0, rtol: float = 1e-10) -> tuple[int, int, int]:
    """(k, lower, upper) with lower <= H_map <= upper for a LinearSSM ({prf:ref}`def-map-head-count`).

    k: `modal_lag_span_dimension` when n >= N and A has distinct eigenvalues, else `min_heads`.
    lower: r* = `pointwise_lag_rank` at one Gaussian token (default_rng(seed); the maximum with
    probability 1), raised to the lower bound of ν(p, d) when k = pd (then K_n(u) has rank p at
    every u ≠ 0); upper: min(k, len(nonsingular_values(p, d))) ({prf:ref}`thm-map-level-head-count`).
    """
    try:
        k = modal_lag_span_dimension(ssm, rtol) if n >= ssm.N else min_heads(ssm, n, rtol)
    except ValueError:  # repeated eigenvalues, or far from diagonalisable
        k = min_heads(ssm, n, rtol)
    r = pointwise_lag_rank(ssm, n, np.random.default_rng(seed).standard_normal(ssm.d), rtol)
    nu_lower, nu_upper = nonsingular_dimension_bounds(ssm.p, ssm.d)
    return k, max(r, nu_lower) if k == ssm.p * ssm.d else r, min(k, nu_upper)


def half_circle_bisection(values: np.ndarray, start: np.ndarray, direction: np.ndarray | None = None) -> np.ndarray:
    """The unit token where det 𝒱(u) changes sign on the half great circle cos θ u_0 + sin θ w, θ ∈ [0, π].

    For square 𝒱(u) (V of shape (p, p, d), d >= 2), u_0 = start/‖start‖ and w the unit part of
    `direction` (default: the basis vector least aligned with u_0) orthogonal to u_0; bisection on θ
    keeps a sign change of det 𝒱 in its bracket. For p odd, det 𝒱(−u) = −det 𝒱(u), so there is
    one, and the token found has rank 𝒱(u) < p to rounding ({prf:ref}`lem-odd-nonsingular`). For p
    even nothing forces a sign change: where det 𝒱 keeps its sign (a nonsingular family) the
    bisection runs to the far end, −u_0, and B there has full rank.
    """
    u0 = start / np.linalg.norm(start)
    w = np.eye(len(u0))[np.argmin(np.abs(u0))] if direction is None else direction
    w = w - (w @ u0) * u0
    w /= np.linalg.norm(w)

    def point(theta: float) -> np.ndarray:
        return math.cos(theta) * u0 + math.sin(theta) * w

    def det(theta: float) -> float:
        return float(np.linalg.det(token_matrix(values, point(theta))))

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


def singular_token(values: np.ndarray, start: np.ndarray, direction: np.ndarray | None = None) -> np.ndarray:
    """A unit token u (d,) with rank [V_1 u, …, V_H u] < p ({prf:ref}`lem-odd-nonsingular`), for V (H, p, d).

    Only where the lemma guarantees one: H < max(p, d), or H = max(p, d) odd and min(p, d) >= 2:
    - H < p: u = start; H < d: u ⟂ the rows yᵀ V_h for y = start, so y ⟂ every V_h u;
    - H = p odd, d >= 2: `half_circle_bisection` from u_0 = start towards `direction`;
    - H = d odd, p >= 2: the same for the family V_hᵀ gives y, then u as for H < d.
    ValueError elsewhere (p even, for instance, where nonsingular families with H = p exist);
    `search_singular_token` covers the sizes the Hopf–Stiefel condition adds.
    start (non-zero): shape (d,) when H <= p, else (p,); direction: the shape of start.
    """
    H, p, d = values.shape
    if H < p or (H == p and p % 2 == 1 and d >= 2):
        return start / np.linalg.norm(start) if H < p else half_circle_bisection(values, start, direction)
    if H < d or (H == d and d % 2 == 1 and p >= 2):
        y = start / np.linalg.norm(start)
        if H == d:
            y = half_circle_bisection(values.transpose(0, 2, 1).copy(), y, direction)
        u = np.linalg.svd(np.einsum("a,hab->hb", y, values))[2][-1]  # the null vector of the rows yᵀ V_h
        return u / np.linalg.norm(u)
    raise ValueError(f"values of shape {values.shape} need H < max(p, d), or H = p odd with d >= 2, or "
                     "H = d odd with p >= 2, for a rank-deficient token to be guaranteed by the lemma")


def search_singular_token(values: np.ndarray, restarts: int = 20, iterations: int = 60, *,
                          seed: Any = 0) -> np.ndarray:
    """The unit token u (d,) with the smallest σ_p([V_1 u, …, V_H u]) found by a search, for V (H, p, d).

    Gauss–Newton on the H bilinear equations yᵀ V_h u = 0 over unit y ∈ ℝ^p, u ∈ ℝ^d (steps in the
    tangent spaces, then renormalised), from `restarts` Gaussian starts (default_rng(seed)),
    `iterations` steps each. A search, not a proof: it finds a rank-deficient token where one
    exists and is reached from some start (the Hopf–Stiefel condition guarantees one when
    H < hopf_stiefel_number(p, d)); for a nonsingular family it cannot, and σ_p stays away from 0.
    """
    H, p, d = values.shape
    rng = np.random.default_rng(seed)
    best, best_sigma = None, np.inf
    for _ in range(restarts):
        y, u = rng.standard_normal(p), rng.standard_normal(d)
        y, u = y / np.linalg.norm(y), u / np.linalg.norm(u)
        for _ in range(iterations):
            residual = np.einsum("a,hab,b->h", y, values, u)
            tangent_y, tangent_u = np.eye(p) - np.outer(y, y), np.eye(d) - np.outer(u, u)
            jacobian = np.concatenate([np.einsum("hab,b->ha", values, u) @ tangent_y,
                                       np.einsum("a,hab->hb", y, values) @ tangent_u], axis=1)
            step = np.linalg.lstsq(jacobian, -residual, rcond=None)[0]
            y, u = y + tangent_y @ step[:p], u + tangent_u @ step[p:]
            y, u = y / np.linalg.norm(y), u / np.linalg.norm(u)
        sigma = np.linalg.svd(token_matrix(values, u), compute_uv=False)
        smallest = sigma[p - 1] if len(sigma) >= p else 0.0
        if smallest < best_sigma:
            best, best_sigma = u, smallest
    return best


def token_miss(ssm: Any, n: int, values: np.ndarray, token: np.ndarray, rtol: float = 1e-10) -> float:
    """The least relative error of heads with values V (H, p, d) on the input (u, 0, …, 0), in [0, 1].

    √(Σ_ℓ dist(L_ℓ u, range 𝒱(u))² / Σ_ℓ ‖L_ℓ u‖²), with L_ℓ u from the SSM's forward pass and
    range 𝒱(u) cut to singular values > rtol ‖V‖ ‖u‖ (0 if the SSM outputs 0): the quantity the
    necessity half of {prf:ref}`thm-map-level-head-count` bounds below.
    """
    X = np.zeros((n, ssm.d))
    X[0] = token
    with torch.no_grad():
        K = ssm(torch.from_numpy(X)).numpy().T  # L_ℓ u, (p, n)
    left, sigma, _ = np.linalg.svd(token_matrix(values, token), full_matrices=False)
    rank = int((sigma > rtol * np.linalg.norm(values) * np.linalg.norm(token)).sum())
    residual = K - left[:, :rank] @ (left[:, :rank].T @ K)
    total = float((K ** 2).sum())
    return float(np.sqrt((residual ** 2).sum() / total)) if total > 0 else 0.0


# -- heads needed: the lag bound and the continuous limit ---------------------------------------


def aliased_eigenvalue_count(N: int, j: int) -> int:
    """Distinct eigenvalues of the S4D-Lin system of N modes at the step Δ = 1/j (zero-order hold).

    ρe^{±iπm/j} for m = 1..⌊N/2⌋ (and ρ if N is odd) depend only on ±m mod 2j
    ({prf:ref}`prop-heads-needed-aliasing`): the number of distinct residues, at most min(N, 2j).
    """
    residues = {(s * m) % (2 * j) for m in range(1, N // 2 + 1) for s in (1, -1)}
    return len(residues | ({0} if N % 2 else set()))


def distinct_eigenvalue_count(A: np.ndarray, atol: float = 1e-8) -> int:
    """Eigenvalues of A (N, N) counted once per cluster of width atol (numpy's eigvals)."""
    found: list[complex] = []
    for value in np.linalg.eigvals(A):
        if all(abs(value - other) > atol for other in found):
            found.append(value)
    return len(found)


def lag_energy_count(ssm: Any, n: int, eps: float) -> int:
    """L_ε, the least L with Σ_{ℓ>=L} (n−ℓ)‖L_ℓ‖²_F <= eps Σ_ℓ (n−ℓ)‖L_ℓ‖²_F (0 if every lag vanishes).

    The bound `heads_needed` <= L_ε of {prf:ref}`prop-heads-needed-lag-bound`, from the lag norms alone.
    """
    weighted = ssm.lags(n).numpy(force=True).reshape(n, -1) * np.sqrt(np.arange(n, 0, -1.0))[:, None]
    tails = _tails((weighted ** 2).sum(axis=1), n)
    return int(np.argmax(tails <= eps * tails[0]))


def _phi2(z: np.ndarray) -> np.ndarray:
    # (e^z − 1 − z)/z², with its Taylor series near 0 (no cancellation).
    out = np.empty_like(z)
    small = np.abs(z) < 1e-2
    zs, zb = z[small], z[~small]
    out[small] = 0.5 + zs / 6 + zs ** 2 / 24 + zs ** 3 / 120 + zs ** 4 / 720
    out[~small] = (np.expm1(zb) - zb) / zb ** 2
    return out


def continuous_head_errors(A_c: np.ndarray, B_c: np.ndarray, C: np.ndarray, T: float, H_max: int) -> np.ndarray:
    """Σ_{q>H} λ_q(Γ_T), H = 0..H_max: the continuous-time limit of the least errors of H heads.

    Γ_T = ∫_0^T (1 − t/T) vec K(t) vec K(t)ᵀ dt for K(t) = C e^{t A_c} B_c; for ZOH with step
    Δ = T/n, GᵀG/(nΔ) → Γ_T ({prf:ref}`prop-heads-needed-continuous-limit`). Closed form from the
    `residues` R_m of A_c: Γ_T = Σ_{m,m'} φ_T(μ_m + μ̄_m') vec R_m vec R̄_m'ᵀ with
    φ_T(a) = T (e^{aT} − 1 − aT)/(aT)². A_c (N, N), B_c (N, d), C (p, N); entry 0 is trace Γ_T,
    tails below ~1e-13 of it are not resolved.
    """
    mu, R = residues(A_c, B_c, C)
    R = R.reshape(len(mu), -1)
    gamma = R.T @ (T * _phi2((mu[:, None] + mu.conj()[None, :]) * T)) @ R.conj()
    eigenvalues = np.clip(np.linalg.eigvalsh(((gamma + gamma.conj().T) / 2).real)[::-1], 0.0, None)
    return _tails(eigenvalues, H_max)


def impulse_slope_max(A_c: np.ndarray, B_c: np.ndarray, C: np.ndarray, T: float,
                      points: int = 2049) -> tuple[float, float]:
    """(lower, upper) bracketing κ_T = max_{0<=t<=T} ‖C A_c e^{t A_c} B_c‖_F = max ‖K'(t)‖_F.

    K' is evaluated on the grid t_k = kh, h = T/(points − 1) (e^{hA_c} by torch's matrix
    exponential, its powers applied to B_c by doubling); lower = the largest grid value. Between
    grid points ‖K'(t)‖ <= (‖K'(t_k)‖ + ‖K'(t_k+1)‖ + hD)/2 with D = ‖C A_c²‖₂ ‖B_c‖_F max(1, e^{Tμ})
    >= max ‖K''‖_F, μ = λ_max((A_c + A_cᵀ)/2) (‖e^{tA_c}‖₂ <= e^{tμ}); upper = the largest of
    these, an upper bound up to rounding (~1e-15 relative). T >= 0, points >= 2.
    """
    d = B_c.shape[1]
    X = np.asarray(B_c, dtype=float)                 # columns k·d..k·d+d−1: e^{t_k A_c} B_c
    power = torch.linalg.matrix_exp(torch.as_tensor(A_c * (T / (points - 1)), dtype=torch.float64)).numpy()
    while X.shape[1] < points * d:                   # block m..2m−1 = e^{m h A_c} (block 0..m−1)
        X = np.concatenate([X, power @ X], axis=1)
        power = power @ power
    K1 = (C @ A_c @ X[:, : points * d]).reshape(len(C), points, d)
    values = np.sqrt((K1 ** 2).sum(axis=(0, 2)))
    mu = float(np.linalg.eigvalsh((A_c + A_c.T) / 2).max())
    D = float(np.linalg.norm(C @ A_c @ A_c, 2) * np.linalg.norm(B_c)) * max(1.0, math.exp(T * mu))
    h = T / (points - 1)
    upper = float(np.max((values[:-1] + values[1:] + h * D) / 2))
    return float(values.max()), max(upper, float(values.max()))


def short_window_bound(A_c: np.ndarray, B_c: np.ndarray, C: np.ndarray, T: float,
                       kappa: float | None = None) -> float:
    """(T κ̄_T / (‖K(0)‖_F − T κ̄_T))², the bound of {prf:ref}`prop-heads-needed-short-window` (inf if T κ̄_T >= ‖K(0)‖_F).

    On Σ_{q>1} σ_q(G_n)² / ‖G_n‖²_F, the relative least error of one head, for ZOH with any n and
    Δ = T/n. κ̄_T is the certified upper end of `impulse_slope_max` (κ_T itself up to a relative
    grid error of about T‖A_c‖/4000), so the bound is the proposition's, rounded up; kappa, if
    given, is that upper end, computed once.
    """
    K0 = float(np.linalg.norm(C @ B_c))
    M = impulse_slope_max(A_c, B_c, C, T)[1] if kappa is None else kappa
    return (T * M / (K0 - T * M)) ** 2 if T * M < K0 else math.inf


def short_window_step_ratio(A_c: np.ndarray, B_c: np.ndarray, C: np.ndarray, T: float, n: int, *,
                            ssm: Any = None, kappa: float | None = None) -> float:
    """max_ℓ ‖L_ℓ − Δ K(0)‖_F / ((ℓ + ½) Δ² κ̄_T), ℓ < n, Δ = T/n: the proof's key step of
    {prf:ref}`prop-heads-needed-short-window` holds when this is <= 1 (L_ℓ from lib's ZOH
    discretisation, or from ssm if given; κ̄_T the upper end of `impulse_slope_max`, or kappa)."""
    step = T / n
    ssm = LinearSSM.from_continuous(A_c, B_c, C, step, "zoh") if ssm is None else ssm
    lags = ssm.lags(n).numpy(force=True)
    deviation = np.linalg.norm((lags - step * (C @ B_c)).reshape(n, -1), axis=1)
    kappa = impulse_slope_max(A_c, B_c, C, T)[1] if kappa is None else kappa
    return float(np.max(deviation / ((np.arange(n) + 0.5) * step ** 2 * kappa)))


def short_window_threshold(A_c: np.ndarray, B_c: np.ndarray, C: np.ndarray, eps: float) -> float:
    """The largest window T* with (1 + √ε) T κ̄_T <= √ε ‖K(0)‖_F, i.e. `short_window_bound` <= eps:
    for every window up to it, and every n, one head reaches relative squared error eps, since
    κ_T <= κ_T* <= κ̄_T* ({prf:ref}`prop-heads-needed-short-window`). 0 if CB_c = 0.

    Fixed-point iteration T ← c / κ̄_T, c = √ε ‖K(0)‖_F / (1 + √ε), from T = c / ‖K'(0)‖_F: the
    iterates decrease while κ̄_T grows with T, until a step shrinks T by less than 1e-10.
    """
    K0 = float(np.linalg.norm(C @ B_c))
    if not K0 > 0:
        return 0.0
    c = math.sqrt(eps) * K0 / (1 + math.sqrt(eps))
    T = c / float(np.linalg.norm(C @ A_c @ B_c))  # ‖K'(0)‖_F <= κ_T: an upper start
    for _ in range(200):
        following = c / impulse_slope_max(A_c, B_c, C, T)[1]
        if following >= T * (1 - 1e-10):
            break
        T = following
    while short_window_bound(A_c, B_c, C, T) > eps:  # the grid's upper bound is not exactly monotone
        T *= 1 - 1e-9
    return T


# -- softmax heads at the level of maps ({prf:ref}`prop-softmax-map-obstruction`) ---------------


def softmax_heads(scores: torch.Tensor, values: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """y_i = Σ_h Σ_{j<=i} softmax_j(s^h_ij) V_h x_j for given scores (H, n, n) or (b, H, n, n), V (H, p, d).

    Causal softmax heads with arbitrary real scores (above the diagonal ignored), the model of
    {prf:ref}`prop-softmax-map-obstruction`; X (b, n, d) → (b, n, p).
    """
    n = X.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=X.device).tril()
    weights = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
    return torch.einsum("...hij,hpd,bjd->bip", weights, values, X)


def memoryless_softmax_heads(L0: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores (2, n, n) and values (2, p, d) of two causal softmax heads that compute y_i = L_0 x_i.

    V_1 = 2 L_0, V_2 = −L_0; head 1 puts weight 3/4 on j = i and 1/(4(i − 1)) on each j < i, head 2
    1/2 and 1/(2(i − 1)): 2α¹ − α² is the identity ({prf:ref}`prop-softmax-map-obstruction`, part 3).
    Scores are the logarithms of the weights (finite, input-independent, depending on i and j).
    """
    i = np.arange(1, n + 1)[:, None]
    past = np.maximum(i - 1, 1)
    first = np.where(np.eye(n, dtype=bool), np.where(i > 1, 0.75, 1.0), 1 / (4 * past))
    second = np.where(np.eye(n, dtype=bool), np.where(i > 1, 0.5, 1.0), 1 / (2 * past))
    scores = np.log(np.stack([first, second]))
    return scores, np.stack([2 * L0, -L0])


# -- training: error against head count ---------------------------------------------------------

_MODEL_NAMES = {"factorized": "factorized (trained)", "softmax": "softmax attention (trained)"}


def train_students(teachers: Sequence[Any], n: int, heads: Iterable[int] | Callable[[int], Iterable[int]],
                   *, model: str = "factorized", seeds: int = 1, seed: int = 0, **budget: Any) -> list[dict]:
    """Train students with H heads to imitate each teacher (`lib.imitate`); one row per student.

    The experiment of {prf:ref}`thm-approx-head-count` on length n: for each teacher (k =
    `min_heads(teacher, n)` >= 1), H in `heads` (or `heads(k)`) and init seeds seed + s,
    s < seeds, all trained on the batch stream of `seed` with one budget (imitate's steps,
    batch, lr, final_lr, progress, device). "factorized": `RelativeHeads.random(H, n, d, p,
    decay=1, scale=0.1)`, exact errors; "softmax": causal `SoftmaxAttention` with d_k = d_v = d
    and zero position scores, held-out errors. Rows, teachers × heads × seeds: k, H, model,
    seed, error, optimum (`optimal_head_errors`[H]), energy (the same at H = 0) and
    "relative squared error" (error / energy).
    """
    rows = []
    for teacher in teachers:
        k, d, p = min_heads(teacher, n), teacher.d, teacher.p
        plan = [(H, s) for H in (heads(k) if callable(heads) else heads) for s in range(seeds)]
        optimum = optimal_head_errors(teacher, n, max(H for H, _ in plan))
        if model == "factorized":
            students = [RelativeHeads.random(H, n, d, p, decay=1.0, scale=0.1, seed=seed + s) for H, s in plan]
        else:
            students = [SoftmaxAttention.random(d, p, H, d_k=d, d_v=d, max_length=n, seed=seed + s)
                        for H, s in plan]
        results = imitate(students, teacher, seed=seed, **budget)
        for (H, s), (error, _) in zip(plan, results):
            rows.append({"k": k, "H": H, "model": _MODEL_NAMES[model], "seed": seed + s, "error": error,
                         "optimum": float(optimum[H]), "energy": float(optimum[0]),
                         "relative squared error": error / float(optimum[0])})
    return rows


def row_sum_deviation(model: SequenceMap, X: torch.Tensor, target: np.ndarray) -> float:
    """Largest |Σ_j 𝒲_ij(X) − target| / max |target| over the rows i and the inputs X (b, n, d), the
    identity of {prf:ref}`prop-softmax-obstruction` (target Σ_h V_h, or I + Σ_h V_h with a residual)."""
    with torch.no_grad():
        sums = model.operator(X).sum(2).numpy(force=True)
    return float(np.abs(sums - target).max() / np.abs(target).max())


# -- the heads-needed explorer (_static/explore/heads-needed.js) --------------------------------


def heads_needed_explorer(N: int, width: int, n: int, radii: Sequence[float], exponents: Sequence[float], *,
                          init: str = "lin", seed: Any = 0, initial: tuple[float, float] = (0.99, -2.0)) -> dict:
    """H_ε of the S5-like system `s4d_ssm(N, width, ρ)` on length-n sequences, over radii and ε = 10^e.

    Per radius: "shares" σ_q(G)²/‖G‖²_F, q = 1..min(n, pd) (the normalised squared singular values of
    the weighted lags, {prf:ref}`thm-approx-head-count`); "tails" Σ_{q>H} σ_q(G)²/‖G‖²_F, H = 0..min(n, pd)
    (`lib.optimal_head_errors` divided by its entry 0, the relative squared error of the best H heads);
    "heads" H_ε for every ε, the least H with tails[H] <= ε — `lib.heads_needed`'s rule on the same
    errors, without its SVD per ε; "window" T = nΔ. Unrounded lists.
    """
    from lib import s4d_ssm, s4d_step

    radii, epsilons = [float(r) for r in radii], [float(10.0 ** e) for e in exponents]
    shares, tails, heads, windows = [], [], [], []
    for radius in radii:
        ssm = s4d_ssm(N, width, radius, init=init, seed=seed)
        errors = optimal_head_errors(ssm, n, min(n, ssm.p * ssm.d))
        shares.append((-np.diff(errors) / errors[0]).tolist())
        tails.append((errors / errors[0]).tolist())
        heads.append([int(np.argmax(errors <= eps * errors[0])) for eps in epsilons])
        windows.append(n * s4d_step(radius, init))
    return {"N": int(N), "width": int(width), "n": int(n), "init": init, "seed": seed, "radius": radii,
            "exponent": [float(e) for e in exponents], "epsilon": epsilons, "shares": shares, "tails": tails,
            "heads": heads, "window": windows,
            "initial": [int(np.argmin(np.abs(np.asarray(radii) - initial[0]))),
                        int(np.argmin(np.abs(np.asarray(exponents) - initial[1])))]}
