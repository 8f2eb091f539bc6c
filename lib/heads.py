"""How many heads an LTI map needs, from its lags L_ℓ ({prf:ref}`def-lti-ssm`).

`ssm` is any model with `lags(n)`: LinearSSM, DiagonalSSM, SharedStateSSM, RelativeHeads. The
lag matrix M has rows vec(L_ℓ), ℓ < n, and rank k ({prf:ref}`def-lag-span`); G has rows
√(n − ℓ) vec(L_ℓ), the weights counting the pairs (i, i − ℓ) a lag acts on. The exact count
is {prf:ref}`thm-head-count`, the least error of H heads {prf:ref}`thm-approx-head-count`,
with covariance Σ {prf:ref}`prop-covariance-head-count`. Errors are Σ_i E‖y_i − ŷ_i‖²;
"relative" ones are divided by the H = 0 error ‖G‖²_F. Results are float64 numpy.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch

from ._validation import as_generator, as_tensor, check_choice, check_int, check_real, check_shape
from .attention import RelativeHeads
from .spans import OperatorSpan, check_rtol, rank, span_of_rows
from .ssm import LinearSSM


def _check_lti(ssm: Any, name: str = "ssm") -> Any:
    if not (callable(getattr(ssm, "lags", None)) and hasattr(ssm, "d") and hasattr(ssm, "p")):
        raise TypeError(f"{name} must be an LTI model with lags (LinearSSM, DiagonalSSM, SharedStateSSM, "
                        f"RelativeHeads); got {type(ssm).__name__}")
    return ssm


def _lags(ssm: Any, n: int, name: str = "ssm") -> np.ndarray:
    # The lags (n, p, d) of an LTI map as float64 numpy; ValueError if they overflow. A float32
    # model's lags are computed from a float64 copy of its parameters: float32 products carry
    # ~1e-7 relative noise, which the rank rule (rtol 1e-10) would count as extra heads.
    _check_lti(ssm, name)
    if isinstance(ssm, torch.nn.Module) and any(t.dtype != torch.float64 for t in ssm.parameters()):
        ssm = copy.deepcopy(ssm).to(torch.float64)
    with torch.no_grad():
        lags = ssm.lags(n).to(torch.float64).numpy()
    if not np.isfinite(lags).all():
        raise ValueError(f"{name}'s lags overflow for n = {n}")
    return lags


def _weigh(M: np.ndarray) -> np.ndarray:
    # Row ℓ of an (n, ·) matrix times √(n − ℓ).
    return M * np.sqrt(np.arange(len(M), 0, -1, dtype=np.float64))[:, None]


def _weighted_lags(ssm: Any, n: int) -> np.ndarray:
    # G (n, pd): rows √(n − ℓ) vec L_ℓ, as in `_lag_span(weighted=True)`; private, for experiments.
    return _weigh(_lags(ssm, n).reshape(n, ssm.p * ssm.d))


def _covariance(covariance: Any, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    # Σ, Σ^{1/2} and Σ^{+1/2} (d, d) of a checked covariance (eigenvalues <= 1e-12 λ_max count as 0).
    if covariance is None:
        return None
    Sigma = as_tensor(covariance, "covariance", torch.float64).detach()
    check_shape(Sigma, "covariance", "d d", {"d": d})
    Sigma = Sigma.numpy()
    scale, asymmetry = float(np.abs(Sigma).max()), float(np.abs(Sigma - Sigma.T).max())
    if asymmetry > 1e-10 * scale:
        raise ValueError(f"covariance must be symmetric; got max |Σ − Σᵀ| = {asymmetry:.2e} (max |Σ| = {scale:.2e})")
    lam, U = np.linalg.eigh((Sigma + Sigma.T) / 2)
    if lam[0] < -1e-10 * max(lam[-1], 0.0):
        raise ValueError(f"covariance must be positive semi-definite; got the eigenvalue {lam[0]:.3e}")
    keep = lam > 1e-12 * lam[-1]
    U, root = U[:, keep], np.sqrt(lam[keep])
    return Sigma, (U * root) @ U.T, (U / root) @ U.T


def _lag_span(ssm: Any, n: int, rtol: float = 1e-10, weighted: bool = False,
              root: np.ndarray | None = None) -> tuple[np.ndarray, OperatorSpan]:
    # M (n, pd) and the span of its rows (weighted: of G's), from the R of a QR when n > pd.
    lags = _lags(ssm, n)
    if root is not None:  # L_ℓ Σ^{1/2}: the lags seen by tokens of covariance Σ
        lags = lags @ root
    M = lags.reshape(n, ssm.p * ssm.d)
    rows = _weigh(M) if weighted else M
    if n > rows.shape[1]:
        rows = np.linalg.qr(rows, mode="r")
    return M, span_of_rows(rows, ssm.p, ssm.d, rtol)


def _relative_heads(ssm: Any, M: np.ndarray, span: OperatorSpan, H: int,
                    pinv_root: np.ndarray | None = None) -> RelativeHeads:
    # V_h: the first H basis elements of the span; c[h, ℓ] = ⟨L_ℓ, V_h⟩_F. With M holding
    # L_ℓ Σ^{1/2}: V_h = W_h Σ^{+1/2}, so that V_h Σ^{1/2} = W_h.
    V = span.basis[:H]
    coefficients = (M @ V.reshape(H, ssm.p * ssm.d).T).T
    return RelativeHeads(V if pinv_root is None else V @ pinv_root, coefficients, dtype=ssm.dtype)


def _tails(squares: np.ndarray, H_max: int) -> np.ndarray:
    # tails[H] = Σ_{q>=H} squares[q], H = 0..H_max, summed from the smallest (tiny tails keep their digits).
    squares = np.concatenate([squares, np.zeros(max(0, H_max + 1 - len(squares)))])
    return np.concatenate([np.cumsum(squares[::-1])[::-1], [0.0]])[: H_max + 1]


def min_heads(ssm: Any, n: int, rtol: float = 1e-10) -> int:
    """k = dim span{L_0..L_{n−1}}: the fewest heads that represent the map on length n.

    {prf:ref}`thm-head-count`; the numerical rank of M by the rank rule (0 if every lag vanishes).
    """
    return _lag_span(ssm, check_int(n, "n"), check_rtol(rtol))[1].dim


def heads_from_ssm(ssm: Any, n: int, rtol: float = 1e-10) -> RelativeHeads:
    """The k-head RelativeHeads equal to the map on lengths <= n ({prf:ref}`thm-head-count`).

    V_h: the first k right singular vectors of M; c[h, ℓ] = ⟨L_ℓ, V_h⟩_F. k = 0: the zero model.
    """
    M, span = _lag_span(ssm, check_int(n, "n"), check_rtol(rtol))
    return _relative_heads(ssm, M, span, span.dim)


def optimal_head_errors(ssm: Any, n: int, H_max: int, *, covariance: Any = None) -> np.ndarray:
    """Σ_{q>H} σ_q(G)², H = 0..H_max: the least error of H heads, shape (H_max + 1,).

    {prf:ref}`thm-approx-head-count`: tokens with E[x_j x_j'ᵀ] = δ_jj' I (or δ_jj' Σ with
    `covariance` Σ (d, d), symmetric PSD: G_Σ has rows √(n − ℓ) vec(L_ℓ Σ^{1/2})); H heads with
    input-independent coefficients; attained by `truncated_heads`. Entry 0 is ‖G‖²_F.
    """
    ssm, n, H_max = _check_lti(ssm), check_int(n, "n"), check_int(H_max, "H_max", minimum=0)
    moments = _covariance(covariance, ssm.d)
    sigma = _lag_span(ssm, n, weighted=True, root=None if moments is None else moments[1])[1].singular_values
    return _tails(sigma ** 2, H_max)


def truncated_heads(ssm: Any, n: int, H: int, *, covariance: Any = None) -> RelativeHeads:
    """The H-head RelativeHeads attaining `optimal_head_errors(ssm, n, H)[H]`.

    V_h: the first H right singular vectors of G (of G_Σ, then times Σ^{+1/2});
    c[h, ℓ] = ⟨L_ℓ Σ^{1/2}, W_h⟩_F. Only min(H, rank G) heads are built (rtol 1e-10): more
    would have zero coefficients.
    """
    ssm, n, H = _check_lti(ssm), check_int(n, "n"), check_int(H, "H", minimum=0)
    moments = _covariance(covariance, ssm.d)
    root, pinv_root = (None, None) if moments is None else moments[1:]
    M, span = _lag_span(ssm, n, weighted=True, root=root)
    return _relative_heads(ssm, M, span, min(H, span.dim), pinv_root)


def heads_needed(ssm: Any, n: int, eps: float, *, covariance: Any = None) -> int:
    """H_ε, the least H with Σ_{q>H} σ_q(G)² <= eps ‖G‖²_F, 0 < eps < 1 (0 if all lags vanish).

    eps is a relative squared error: 10⁻² is a 10 % relative error. Covariance as in
    `optimal_head_errors`.
    """
    ssm, n = _check_lti(ssm), check_int(n, "n")
    eps = check_real(eps, "eps", low=0, high=1, open_interval=True)
    moments = _covariance(covariance, ssm.d)
    sigma = _lag_span(ssm, n, weighted=True, root=None if moments is None else moments[1])[1].singular_values
    errors = _tails(sigma ** 2, len(sigma))
    return int(np.argmax(errors <= eps * errors[0]))


def population_error(teacher: Any, student: Any, n: int, *, covariance: Any = None, mean: Any = None) -> float:
    """Σ_i E‖y_i − ŷ_i‖² = Σ_ℓ (n − ℓ)‖E_ℓ‖²_F, E_ℓ = K_ℓ − K̂_ℓ, for iid N(0, I) tokens.

    Two LTI maps with lags (equal p, d) on length n. With covariance Σ and mean x̄ (tokens iid
    over positions): Σ_ℓ (n − ℓ) tr(E_ℓ Σ E_ℓᵀ) + Σ_i ‖Σ_{ℓ<=i} E_ℓ x̄‖²
    ({prf:ref}`prop-covariance-head-count`).
    """
    n = check_int(n, "n")
    _check_lti(teacher, "teacher"), _check_lti(student, "student")
    if (student.p, student.d) != (teacher.p, teacher.d):
        raise ValueError(f"student must have (p, d) = ({teacher.p}, {teacher.d}) like the teacher; "
                         f"got ({student.p}, {student.d})")
    E = _lags(teacher, n, "teacher") - _lags(student, n, "student")
    weights = np.arange(n, 0, -1, dtype=np.float64)
    moments = _covariance(covariance, teacher.d)
    if moments is None:
        error = float(weights @ (E ** 2).sum(axis=(1, 2)))
    else:
        error = float(weights @ np.einsum("lpd,de,lpe->l", E, moments[0], E))
    if mean is not None:
        mu = as_tensor(mean, "mean", torch.float64).detach()
        check_shape(mu, "mean", "d", {"d": teacher.d})
        error += float((np.cumsum(E @ mu.numpy(), axis=0) ** 2).sum())
    return error


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
        alpha = torch.linalg.solve(values @ values.T, values @ rows.T).T  # (n², H)
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
        if current <= 1e-26 or not previous - current > 1e-15 * current:  # exact, or stalled
            break
        previous = current
    with torch.no_grad():
        loss, alpha = fitted(V)
    return float(loss) * scale, V.detach().numpy().reshape(H, p, d), alpha.numpy().T.reshape(H, n, n) * math.sqrt(scale)


def _fit_als(W: np.ndarray, H: int, rng: np.random.Generator, max_iter: int):
    n, _, p, d = W.shape
    rows = W.reshape(n * n, p * d)
    V = rng.standard_normal((H, p * d))
    previous, floor = float("inf"), 1e-26 * float((rows ** 2).sum())
    for _ in range(max_iter):
        alpha = np.linalg.lstsq(V.T, rows.T, rcond=None)[0].T  # V fixed
        V = np.linalg.lstsq(alpha, rows, rcond=None)[0]          # alpha fixed
        current = float(((rows - alpha @ V) ** 2).sum())
        if current <= floor or not previous - current > 1e-15 * current:
            break
        previous = current
    return current, V.reshape(H, p, d), alpha.T.reshape(H, n, n)


def fit_heads(ssm: Any, n: int, H: int, *, method: str = "lbfgs", restarts: int = 3, seed: Any = 0,
              max_iter: int = 3000) -> tuple[float, np.ndarray, np.ndarray]:
    """(error, V (H, p, d), α (H, n, n)): the least Σ_{i,j} ‖𝒲_ij − Σ_h α^h_ij V_h‖²_F found by an optimiser.

    An independent route to {prf:ref}`thm-approx-head-count` (no SVD): any α_ij, causal or
    not, on the dense n × n × p × d operator (keep n <= 64), so it stops at or above
    `optimal_head_errors(ssm, n, H)[H]`. "lbfgs": L-BFGS on V, α by least squares, in rounds
    of 100 iterations; "als": alternating least squares. A run stops when a round gains
    < 1e-15 relative or the error is < 1e-26 ‖𝒲‖²; the best of `restarts` (default_rng(seed)).
    """
    ssm, n, H = _check_lti(ssm), check_int(n, "n"), check_int(H, "H", minimum=0)
    restarts, max_iter = check_int(restarts, "restarts"), check_int(max_iter, "max_iter")
    method = check_choice(method, "method", ("lbfgs", "als"))
    lags = _lags(ssm, n)
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    W = np.where((lag >= 0)[..., None, None], lags[np.clip(lag, 0, None)], 0.0)  # 𝒲_ij = L_{i−j}, j <= i
    energy = float((W ** 2).sum())
    if H == 0 or energy == 0:  # the zero model is optimal
        return energy, np.zeros((H, ssm.p, ssm.d)), np.zeros((H, n, n))
    rng = as_generator(seed)
    runs = [(_fit_lbfgs if method == "lbfgs" else _fit_als)(W, H, rng, max_iter) for _ in range(restarts)]
    return min(runs, key=lambda run: run[0])


# -- heads with value maps of rank <= r ({prf:ref}`thm-rank-limited-heads`) --------------------------


def _flat_rank(blocks: np.ndarray, rtol: float) -> int:
    # dim of Σ_b col(Q_b): the rank of [Q_1 … Q_k] (p, k·d).
    return rank(np.linalg.svd(np.concatenate(list(blocks), axis=1), compute_uv=False), rtol)


def _ranks_at_most(V: np.ndarray, r: int, rtol: float = 1e-10) -> bool:
    # Whether every V_h has numerical rank <= r (singular values above rtol of its largest).
    return all(int((s > rtol * s[0]).sum()) <= r if s[0] > 0 else True
               for s in np.linalg.svd(V, compute_uv=False))


def _holds(V: np.ndarray, Q: np.ndarray, atol: float = 1e-8) -> bool:
    # Whether span{V_h} holds every Q_b (orthonormal, (k, p, d)) to atol: the residual after projecting
    # on an SVD basis of the V_h (a rank rule at 1e-12, so dependent V_h add no spurious directions).
    flat, rows = V.reshape(len(V), -1), Q.reshape(len(Q), -1)
    if len(flat) == 0 or not np.abs(flat).max() > 0:
        return len(rows) == 0 or not np.abs(rows).max() > atol
    u, s, _ = np.linalg.svd(flat.T, full_matrices=False)
    basis = u[:, s > 1e-12 * s[0]]
    return bool(np.abs(rows - (rows @ basis) @ basis.T).max() <= atol)


def _split(blocks: np.ndarray, r: int, rtol: float) -> np.ndarray:
    # Thm part 2: each M_b = Σ_t σ_t u_t v_tᵀ cut into ⌈rank M_b / r⌉ pieces of r singular triples.
    pieces = []
    for M in blocks:
        U, sigma, Wt = np.linalg.svd(M, full_matrices=False)
        m = rank(sigma, rtol)
        pieces += [(U[:, t:t + r] * sigma[t:t + r]) @ Wt[t:t + r] for t in range(0, m, r)]
    return np.array(pieces).reshape(len(pieces), *blocks.shape[1:])


def _outer_basis(Q: np.ndarray, rtol: float) -> np.ndarray:
    # Thm part 2: u_a w_bᵀ over orthonormal bases of col(𝓛) and row(𝓛), c·q maps of rank one.
    cols = [np.linalg.svd(np.concatenate(list(blocks), axis=1), full_matrices=False)[:2] for blocks in (Q, Q.transpose(0, 2, 1))]
    (u, su), (w, sw) = cols
    u, w = u[:, :rank(su, rtol)], w[:, :rank(sw, rtol)]
    return np.einsum("pa,db->abpd", u, w).reshape(-1, len(u), len(w))


def _modal_values(ssm: LinearSSM, r: int) -> np.ndarray | None:
    # Thm part 2, the modal construction, for lags C A^ℓ B with A diagonalisable (eigenvector
    # condition <= 1e8, else None): R_m = C v_m w_mᵀ B; a real mode gives R_m (rank <= 1); a pair
    # λ, λ̄ with Cv = a + ib, Bᵀw = f + ig gives Re R = afᵀ − bgᵀ and Im R = agᵀ + bfᵀ (r >= 2), or
    # P S T_t Fᵀ, t = 1, 2, 3 (r = 1; P = [a b], F = [f g], S = diag(1, −1)).
    A, B, C = (x.detach().to(torch.float64).numpy() for x in (ssm.A, ssm.B, ssm.C))
    lam, vectors = np.linalg.eig(A)
    if not np.isfinite(lam).all() or np.linalg.cond(vectors) > 1e8:
        return None
    left = np.linalg.inv(vectors)
    real = np.abs(lam.imag) <= 1e-12 * max(np.abs(lam).max(), 1e-300)
    S = np.diag([1.0, -1.0])
    T = [np.diag([1.0, 0.0]), np.diag([0.0, 1.0]), np.array([[1.0, -1.0], [1.0, -1.0]])]
    values = []
    for j in range(len(lam)):
        column, row = C @ vectors[:, j], left[j] @ B
        if real[j]:
            values.append(np.outer(column, row).real)
        elif lam[j].imag > 0:
            a, b, f, g = column.real, column.imag, row.real, row.imag
            if r >= 2:
                values += [np.outer(a, f) - np.outer(b, g), np.outer(a, g) + np.outer(b, f)]
            else:
                P, F = np.stack([a, b], axis=1), np.stack([f, g], axis=1)
                values += [P @ S @ T_t @ F.T for T_t in T]
    return np.array(values).reshape(len(values), C.shape[0], B.shape[1])


def _scalar_blocks(Q: np.ndarray, r: int, rtol: float, spread: float = 1.0) -> tuple[int, np.ndarray | None, bool]:
    # The tight case, thm-rank-limited-heads part 4: m = the rank of a generic M in the span, and
    # whether the restrictions K_b of M⁺Q_b to row(M) fail, clearly, to be block-scalar with blocks
    # of dimension r in one basis (non-commuting; an eigenvalue off the real axis by the margin
    # below; or an eigenspace of a dimension not a multiple of r, with the eigenvalues 1e-3
    # apart; a smaller imaginary part can be rounding near a defective K and is left undecided).
    # A numerical judgement, not a certificate. "Not diagonalisable" is
    # never reported as a failure: spans arbitrarily close to one whose K is defective have a
    # diagonalisable K (span{I, [[0, 1], [0, t]]}, t → 0), so rounding cannot tell them apart. Returns
    # (m, V, failed): V (m/r, p, d), values of rank <= r whose span holds every Q_b (checked), or
    # None. The K_b carry M⁺, whose rounding grows like cond(M) = σ_1/σ_m: above 1e6 the test never
    # reports "failed" (undecided, no claim either way); a V is still built and checked. spread =
    # σ_1/σ_k of the lag matrix: the computed basis Q_b is off by ~eps·spread, which M⁺ multiplies.
    g = np.random.default_rng(0)
    M = np.einsum("b,bpd->pd", g.standard_normal(len(Q)), Q)
    U, sigma, Wt = np.linalg.svd(M)
    m = rank(sigma, rtol)
    if m == 0 or m % r:
        return m, None, False
    decidable = bool(sigma[0] <= 1e6 * sigma[m - 1])
    R = Wt[:m].T                                                   # orthonormal basis of row(M), (d, m)
    pinv = (Wt[:m].T / sigma[:m]) @ U[:, :m].T                     # M⁺ (d, p)
    K = np.einsum("dm,dp,bpe,en->bmn", R, pinv, Q, R)              # K_b = Rᵀ M⁺ Q_b R, (k, m, m)
    mixed = np.einsum("b,bmn->mn", g.standard_normal(len(Q)), K)   # a generic K
    scale = max(float(np.abs(mixed).max()), 1e-300)
    commutators = np.abs(np.einsum("bmn,nk->bmk", K, mixed) - np.einsum("mn,bnk->bmk", mixed, K)).max()
    lam, vectors = np.linalg.eig(mixed)
    imag = np.abs(lam.imag).max()
    # Rounding in K is ~eps·cond(M)·(cond(M) + spread) of its scale (M⁺ twice; the basis once).
    # With well-conditioned computed eigenvectors (condition κ) it moves eigenvalues by at most
    # about κ times that (Bauer–Fike); near a defective K (κ huge) by up to its 1/m-th power. An
    # imaginary part below ten times the smaller of the two is undecided. (Cluster sizes are judged
    # only once K has a full set of real eigenvectors, where rounding moves eigenvalues far less.)
    cond = sigma[0] / sigma[m - 1]
    error = np.finfo(float).eps * cond * (cond + spread)
    bauer_fike = 10 * np.linalg.cond(vectors) * error
    margin = min(max(1e-3, 10 * error ** (1 / m)), max(bauer_fike, 1e-9))
    if commutators > max(1e-6, 10 * error) * scale * np.abs(K).max() or imag > margin * scale:
        return m, None, decidable
    if imag > 1e-6 * scale:
        return m, None, False                                       # undecided
    lam = np.sort(lam.real)
    clusters = np.split(lam, np.flatnonzero(np.diff(lam) > 1e-6 * scale) + 1)
    means = np.array([c.mean() for c in clusters])
    spaces = []
    for c, mean in zip(clusters, means):  # each eigenspace: the null space of K − λI, from an SVD
        _, s, vt = np.linalg.svd(mixed - mean * np.eye(m))
        if (s > 1e-4 * scale).sum() > m - len(c):                  # fewer eigenvectors: undecided
            return m, None, False
        spaces.append(vt[m - len(c):].T)
    if any(len(c) % r for c in clusters):                           # wrong sizes: fails if well separated
        return m, None, decidable and bool(np.diff(means).min(initial=np.inf) > 1e-3 * scale)
    T = np.concatenate(spaces, axis=1)
    if np.linalg.cond(T) > 1e8:
        return m, None, False                                         # undecided: no claim either way
    # Split each eigenspace into pieces of dimension r: V_h = M R T_h S_h (S = T⁻¹), rank <= r.
    S = np.linalg.inv(T)
    V = np.stack([M @ R @ T[:, t:t + r] @ S[t:t + r] @ R.T for t in range(0, m, r)])
    return m, (V if _holds(V, Q) else None), False


def rank_limited_values(ssm: Any, r: int, n: int, rtol: float = 1e-10) -> np.ndarray:
    """V (H, p, d): value maps of rank <= r whose span holds every lag ℓ < n, built by the proofs.

    {prf:ref}`thm-rank-limited-heads`: part 2's constructions (the SVD split of two bases of the lag
    span 𝓛, orthonormal and the first independent lags, into pieces of r singular triples; the c·q
    maps u_a w_bᵀ; for a LinearSSM with diagonalisable A, N_ℝ + 3N_ℂ (r = 1) or N_ℝ + 2N_ℂ (r >= 2)
    modal maps) and part 4's (m/r′ maps, r′ <= r dividing m). Each is checked (every Q_b of an
    orthonormal basis of 𝓛 within 1e-8 of their span); the one with fewest maps. By part 1 these H
    heads represent the map; H is the upper bound of `rank_limited_heads`. Shape (0, p, d) for k = 0.
    """
    ssm, n = _check_lti(ssm), check_int(n, "n")
    r, rtol = check_int(r, "r"), check_rtol(rtol)
    M, span = _lag_span(ssm, n, rtol)
    k, Q = span.dim, span.basis
    if k == 0:
        return np.zeros((0, ssm.p, ssm.d))
    candidates = [_split(Q, r, rtol), _outer_basis(Q, rtol)]
    chosen: list[np.ndarray] = []  # the first k independent lags, in order of ℓ
    for row in M:
        trial = np.stack([*chosen, row])
        if rank(np.linalg.svd(trial, compute_uv=False), rtol) == len(trial):
            chosen.append(row)
        if len(chosen) == k:
            break
    if len(chosen) == k:
        candidates.append(_split(np.stack(chosen).reshape(k, ssm.p, ssm.d), r, rtol))
    if isinstance(ssm, LinearSSM):  # lags exactly C A^ℓ B (no skip D)
        candidates.append(_modal_values(ssm, r))
    spread = span.singular_values[0] / span.singular_values[k - 1]
    m = _scalar_blocks(Q, 1, rtol, spread)[0]
    candidates += [_scalar_blocks(Q, r_prime, rtol, spread)[1] for r_prime in range(1, min(r, m) + 1)
                   if m % r_prime == 0]
    found = [V for V in candidates if V is not None and _holds(V, Q) and _ranks_at_most(V, r)]
    if not found:
        raise ValueError(f"the lag span is numerically ill-determined at rtol = {rtol:g} (no construction "
                         "spans it); try a larger rtol or a shorter n")
    return min(found, key=len)


def rank_limited_heads(ssm: Any, r: int, n: int, rtol: float = 1e-10) -> tuple[int, int]:
    """(lower, upper): bounds on H_r, the fewest heads with value maps of rank <= r that represent the map.

    {prf:ref}`thm-rank-limited-heads`, on the lag span 𝓛 of lags ℓ < n (rank rule `rtol`), k = dim 𝓛,
    c, q = dim Σ col, dim Σ row over 𝓛, m = the largest rank in 𝓛 (of a random element, seed 0):
    lower = max(k, ⌈c/r⌉, ⌈q/r⌉) (part 3), plus one where that equals m/r and part 4's criterion fails
    clearly (non-commuting restrictions at 1e-6 relative; an eigenvalue off the real axis by
    more than ten times the rounding it could come from: 10κ·ρ with well-conditioned eigenvectors
    (κ their condition, Bauer–Fike; at least 1e-9), at most max(1e-3, 10ρ^(1/m)), after the
    rounding near a defective restriction of size m, where ρ = eps·cond(M)·(cond(M) + σ_1/σ_k) counts M⁺ and the computed basis of the
    lag span, singular values σ_1..σ_k; eigenspaces of the wrong dimension with eigenvalues 1e-3 apart; only when
    cond(M) <= 1e6); a restriction that looks not diagonalisable, or has eigenvalues nearer the
    real axis, leaves it undecided, which counts as not failing. A numerical judgement, not a
    certificate. upper = the number of maps `rank_limited_values` builds and checks (parts 2, 4).
    lower == upper: H_r is known.
    """
    ssm, n = _check_lti(ssm), check_int(n, "n")
    r, rtol = check_int(r, "r"), check_rtol(rtol)
    span = _lag_span(ssm, n, rtol)[1]
    k, Q = span.dim, span.basis
    if k == 0:
        return 0, 0
    c = _flat_rank(Q, rtol)
    q = _flat_rank(Q.transpose(0, 2, 1), rtol)
    lower = max(k, -(-c // r), -(-q // r))
    m, _, failed = _scalar_blocks(Q, r, rtol, span.singular_values[0] / span.singular_values[k - 1])
    if failed and m % r == 0 and lower == m // r:
        lower += 1
    upper = len(rank_limited_values(ssm, r, n, rtol))
    if upper < lower:  # the theorem forbids it: a rank decision went wrong
        raise ValueError(f"the lag span is numerically ill-determined at rtol = {rtol:g} (bounds {lower} > {upper}); "
                         "try a larger rtol or a shorter n")
    return lower, upper


def rank_limited_error_floor(ssm: Any, n: int, H: int, r: int, rtol: float = 1e-10) -> float:
    """A proved lower bound on the relative error of `fit_rank_limited_heads` (weighted=False) for any V.

    {prf:ref}`thm-rank-limited-heads` part 5: with Q_b an orthonormal basis of the lag span (k of them),
    error² >= max((k − H)/k, Σ_{t>Hr} σ_t([Q_1 … Q_k])²/k, the same for [Q_1ᵀ … Q_kᵀ]); the square root.
    0 for k = 0. Positive iff H < max(k, ⌈c/r⌉, ⌈q/r⌉).
    """
    ssm, n, H = _check_lti(ssm), check_int(n, "n"), check_int(H, "H", minimum=0)
    r, rtol = check_int(r, "r"), check_rtol(rtol)
    Q = _lag_span(ssm, n, rtol)[1].basis
    k = len(Q)
    if k == 0:
        return 0.0
    tails = [max(k - H, 0)]
    for blocks in (Q, Q.transpose(0, 2, 1)):
        sigma = np.linalg.svd(np.concatenate(list(blocks), axis=1), compute_uv=False)
        tails.append(float((sigma[H * r:] ** 2).sum()))
    return math.sqrt(max(tails) / k)


def _span_error(rows: np.ndarray, V: np.ndarray) -> float:
    # Σ ‖rows − rows Π_V‖² for values V (H, pd): the rows' squared distance to span{V_h} (QR basis).
    basis = np.linalg.qr(V.T)[0]
    return float(((rows - (rows @ basis) @ basis.T) ** 2).sum())


def _rank_limited_als(rows: np.ndarray, p: int, d: int, H: int, r: int, rng: np.random.Generator,
                      max_iter: int) -> tuple[float, np.ndarray]:
    # Alternating least squares on rows_b ≈ Σ_h C_bh U_h W_hᵀ over C (m, H), U (p, Hr), W (d, Hr):
    # each block is a linear least-squares problem. Returns the variable-projection error of the
    # final V (the best C for it) and V (H, p, d).
    m = len(rows)
    blocks = rows.reshape(m, p, d)
    side_by_side = np.concatenate(list(blocks), axis=1)                       # (p, m·d)
    stacked_rows = np.concatenate(list(blocks.transpose(0, 2, 1)), axis=1)    # (d, m·p)
    U, W = rng.standard_normal((p, H * r)), rng.standard_normal((d, H * r))

    def values() -> np.ndarray:
        return np.einsum("phr,dhr->hpd", U.reshape(p, H, r), W.reshape(d, H, r)).reshape(H, p * d)

    previous = np.inf
    for step in range(max_iter):
        C = np.repeat(np.linalg.lstsq(values().T, rows.T, rcond=None)[0].T, r, axis=1)  # (m, Hr)
        Z = np.concatenate([(W * C[b]).T for b in range(m)], axis=1)          # rows_b = U Z_b
        U = np.linalg.lstsq(Z.T, side_by_side.T, rcond=None)[0].T
        Y = np.concatenate([(U * C[b]).T for b in range(m)], axis=1)          # rows_bᵀ = W Y_b
        W = np.linalg.lstsq(Y.T, stacked_rows.T, rcond=None)[0].T
        scale = np.sqrt(np.linalg.norm(U, axis=0) / np.maximum(np.linalg.norm(W, axis=0), 1e-300))
        U, W = U / np.maximum(scale, 1e-300), W * scale                       # balance the factors
        if step % 20 == 19:
            current = _span_error(rows, values())
            if current <= 1e-26 or not previous - current > 1e-12 * current:  # exact, or stalled
                break
            previous = current
    V = values()
    return _span_error(rows, V), V.reshape(H, p, d)


def _polish(rows: np.ndarray, V: np.ndarray, r: int, max_iter: int = 200) -> tuple[float, np.ndarray]:
    # L-BFGS on the factors of V (H, p, d), started from their truncated SVDs; the coefficients
    # eliminated by projection. Returns (error, V) like _rank_limited_als.
    H, p, d = V.shape
    U, sigma, Wt = np.linalg.svd(V)
    root = np.sqrt(sigma[:, :r])
    P = torch.tensor(U[:, :, :r] * root[:, None, :], requires_grad=True)
    Q = torch.tensor(root[:, :, None] * Wt[:, :r, :], requires_grad=True)
    target = torch.tensor(rows)
    optimiser = torch.optim.LBFGS([P, Q], lr=1.0, max_iter=max_iter, history_size=50, tolerance_grad=1e-16,
                                  tolerance_change=1e-30, line_search_fn="strong_wolfe")

    def error() -> torch.Tensor:
        basis = torch.linalg.qr((P @ Q).reshape(H, p * d).T)[0]
        return ((target - (target @ basis) @ basis.T) ** 2).sum()

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = error()
        loss.backward()
        return loss

    optimiser.step(closure)
    with torch.no_grad():
        polished = (P @ Q).numpy()
    return _span_error(rows, polished.reshape(H, p * d)), polished


def fit_rank_limited_heads(ssm: Any, n: int, H: int, r: int, *, weighted: bool = False, method: str = "als",
                           restarts: int = 8, seed: Any = 0, max_iter: int = 2000,
                           rtol: float = 1e-10) -> tuple[float, np.ndarray]:
    """(relative error, V (H, p, d)): the best fit an optimiser finds with H value maps of rank <= r.

    Error² = Σ_b dist(Q_b, span{V_h})²_F / Σ_b ‖Q_b‖²_F, with Q_b an orthonormal basis of the lag span
    (rtol as in `min_heads`), the e of {prf:ref}`thm-rank-limited-heads` part 5: 0 iff the H heads
    represent the map. weighted: the rows of G (√(n − ℓ) vec L_ℓ) instead, the population error of
    the best coefficients over its H = 0 value ({prf:ref}`thm-approx-head-count`). V_h = U_h W_hᵀ,
    U_h (p, r), W_h (d, r). "als": alternating least squares on (coefficients, U, W), up to max_iter
    sweeps per start, stopped when 20 sweeps gain < 1e-12 relative; a best error² in (1e-26, 1e-4)
    is then polished by up to 200 L-BFGS steps on the factors (ALS crawls near some exact fits); "lbfgs": one L-BFGS run (strong
    Wolfe, max_iter iterations) on V with the coefficients eliminated, summed over the starts.
    The best of `restarts` Gaussian starts (default_rng(seed); ALS stops early at an error below
    1e-13, relative). An optimiser: it stops at or above
    the least error, and slowly where that is an infimum not attained.
    """
    ssm, n, H, r = _check_lti(ssm), check_int(n, "n"), check_int(H, "H", minimum=0), check_int(r, "r")
    restarts, max_iter = check_int(restarts, "restarts"), check_int(max_iter, "max_iter")
    method = check_choice(method, "method", ("als", "lbfgs"))
    if not isinstance(weighted, bool):
        raise TypeError(f"weighted must be a bool; got {type(weighted).__name__}")
    p, d = ssm.p, ssm.d
    if weighted:
        rows = _weighted_lags(ssm, n)
    else:
        span = _lag_span(ssm, n, check_rtol(rtol))[1]
        rows = span.basis.reshape(span.dim, p * d)
    energy = float((rows ** 2).sum())
    if H == 0 or energy == 0:
        return (1.0 if energy else 0.0), np.zeros((H, p, d))
    rows = rows / math.sqrt(energy)
    rng = as_generator(seed)
    if method == "als":
        if len(rows) > p * d:  # the same distances from the R of a QR
            rows = np.linalg.qr(rows, mode="r")
        best = (math.inf, np.zeros((H, p, d)))
        for _ in range(restarts):
            best = min(best, _rank_limited_als(rows, p, d, H, r, rng, max_iter), key=lambda run: run[0])
            if best[0] <= 1e-26:  # exact: more starts cannot do better
                break
        if 1e-26 < best[0] < 1e-4:  # close: ALS crawls there (swamps); finish with L-BFGS from its V
            best = min(best, _polish(rows, best[1], r), key=lambda run: run[0])
        return math.sqrt(max(best[0], 0.0)), best[1]
    rows_t = torch.tensor(rows)
    P = torch.tensor(rng.standard_normal((restarts, H, p, r)), requires_grad=True)
    Q = torch.tensor(rng.standard_normal((restarts, H, r, d)), requires_grad=True)
    optimiser = torch.optim.LBFGS([P, Q], lr=1.0, max_iter=max_iter, history_size=50, tolerance_grad=1e-14,
                                  tolerance_change=1e-20, line_search_fn="strong_wolfe")

    def errors() -> torch.Tensor:
        basis = torch.linalg.qr((P @ Q).reshape(restarts, H, p * d).transpose(1, 2))[0]  # (R, pd, H)
        return 1.0 - ((rows_t @ basis) ** 2).sum((1, 2))

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = errors().sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    with torch.no_grad():
        found = errors()
        best = int(torch.argmin(found))
        V = (P @ Q)[best].numpy()
    return math.sqrt(max(float(found[best]), 0.0)), V
