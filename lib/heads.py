"""How many heads an LTI SSM needs: exact head count, optimal truncations, the map-level count.

A linear SSM with lags L_ℓ = C A^ℓ B ({prf:ref}`def-lag-operators`) acts on length-n
sequences through L_0..L_{n−1} only.  Stack them as the rows of the n × pd *lag
matrix* M (row ℓ = vec(L_ℓ)); its rank is the lag span dimension k
({prf:ref}`def-lag-span`).  Everything here is computed from the lags — O(n p d N)
work and O(n p d) memory — never from the n × n × p × d operator, except where a
function says it builds the dense operator on purpose (an independent route):

- `min_heads`, `modal_lag_span_dimension`: k, the least number of heads of a
  factorized model that represents the SSM ({prf:ref}`thm-head-count`), as a
  numerical rank and, for diagonalisable A, from the modes ({prf:ref}`prop-modal-lag-span`);
- `heads_from_ssm`: the k-head construction (a basis of the lag span as values,
  coordinates of the lags as relative-position coefficients);
- `optimal_head_errors`, `truncated_heads`, `heads_needed`: the best H-head model
  in mean square ({prf:ref}`thm-approx-head-count`), from the singular values of
  the weighted lag matrix G (row ℓ = √(n−ℓ) vec(L_ℓ));
- `fit_heads`: the same minimum found by an optimiser (L-BFGS or alternating least
  squares) over all input-independent H-head models — no singular values;
- `sampled_head_errors`: Monte Carlo estimates of the truncated models' errors;
- `lag_energy_count`, `s4d_continuous`, `continuous_head_errors`: why the head count
  of an S4D SSM depends on ρ the way it does ({prf:ref}`prop-heads-needed-lag-bound`,
  {prf:ref}`prop-heads-needed-continuous-limit`);
- `population_error`: Σ_i E‖y_i − ŷ_i‖² between two lag kernels, in closed form;
- `token_dependent_single_head`: the best single head whose coefficients may be any
  functions of the input ({prf:ref}`prop-single-head-generic-inputs`);
  `single_head_witness`: the single-token input on which it fails ({prf:ref}`thm-rank-gap-map`);
- map level ({prf:ref}`thm-map-level-head-count`): value families that span ℝ^p at every
  non-zero token (`polynomial_values`, `complex_values`, `cayley_dickson_values`,
  `nonsingular_values`), `TokenDependentHeads` built on them, `map_head_bounds`,
  `singular_token` ({prf:ref}`lem-odd-nonsingular`);
- `s4d_ssm`: S4D-style diagonal SSMs with a chosen spectral radius.

Relative errors.  The book's *relative error* of an approximation ŷ of y is the norm
ratio ‖y − ŷ‖/‖y‖ (`lib.relative_error`); in mean square over random tokens it is
√(Σ_i E‖y_i − ŷ_i‖² / Σ_i E‖y_i‖²).  Its square, error/energy, is called the
*relative squared error*; `heads_needed` takes its tolerance in that form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._validation import (as_real_tensor, as_sequence, check_choice, check_int, check_real, check_rtol, check_shape,
                          resolve_dtype)
from .base import SequenceMap
from .factorized import RelativeHeads, factorized_operator
from .spans import OperatorSpan, operator_span
from .ssm import LinearSSM

__all__ = [
    "lag_matrix",
    "min_heads",
    "minimal_polynomial_degree",
    "lag_span_bound",
    "heads_from_ssm",
    "optimal_head_errors",
    "truncated_heads",
    "heads_needed",
    "population_error",
    "lag_energy_count",
    "modal_lag_span_dimension",
    "HeadFit",
    "fit_heads",
    "SampledErrors",
    "sampled_head_errors",
    "SingleHeadFit",
    "token_dependent_single_head",
    "SingleTokenWitness",
    "single_head_witness",
    "polynomial_values",
    "complex_values",
    "cayley_dickson_values",
    "nonsingular_values",
    "nonsingular_dimension_bounds",
    "composition_defect",
    "token_matrix",
    "worst_conditioned_tokens",
    "pointwise_lag_rank",
    "MapHeadBounds",
    "map_head_bounds",
    "singular_token",
    "token_miss",
    "TokenDependentHeads",
    "s4d_continuous",
    "s4d_step",
    "s4d_ssm",
    "continuous_head_errors",
]


# -- the lag matrix and its span ----------------------------------------------


def _check_ssm(ssm: Any, name: str = "ssm") -> LinearSSM:
    if not isinstance(ssm, LinearSSM):
        raise TypeError(f"{name} must be a LinearSSM; got {type(ssm).__name__}")
    return ssm


def lag_matrix(ssm: LinearSSM, n: int, weighted: bool = False) -> np.ndarray:
    """The lag matrix: row ℓ is vec(L_ℓ) (times √(n−ℓ) if `weighted`), ℓ = 0..n−1.

    Implements the matrix M of {prf:ref}`def-lag-span` (rank k) and, weighted, the
    matrix G of {prf:ref}`thm-approx-head-count`: lag ℓ acts on the n − ℓ pairs
    (i, i − ℓ) of a length-n sequence, so G has the Gram matrix GᵀG of the
    stack of all blocks 𝒲_ij, j ≤ i.  vec is row-major: vec(L)[a·d + b] = L[a, b].

    Args:
        ssm: a LinearSSM with p outputs and d inputs.
        n: sequence length (number of lags).
        weighted: multiply row ℓ by √(n − ℓ).

    Returns:
        float64 numpy array of shape (n, p·d).

    Raises:
        ValueError: if the lags overflow (spectral radius > 1 and n large).
    """
    ssm = _check_ssm(ssm)
    n = check_int(n, "n")
    if not isinstance(weighted, bool):
        raise TypeError(f"weighted must be a bool; got {type(weighted).__name__}")
    M = ssm.lags(n).astype(np.float64).reshape(n, ssm.p * ssm.d)
    if not np.isfinite(M).all():
        raise ValueError(f"ssm lags C A^l B overflow for n = {n} (spectral radius {ssm.spectral_radius:.3g})")
    if weighted:
        M *= np.sqrt(np.arange(n, 0, -1, dtype=np.float64))[:, None]
    return M


def _row_span(M: np.ndarray, p: int, d: int, rtol: float) -> OperatorSpan:
    """operator_span of the rows of M (m × pd), compressed to pd rows by QR when m > pd.

    M = QR with orthonormal Q, so R has M's singular values and right singular
    vectors: the span, its basis and its dimension are unchanged, and the SVD
    costs O(m (pd)²) instead of an SVD of a tall matrix with its left factor.
    """
    if M.shape[0] > M.shape[1]:
        M = np.linalg.qr(M, mode="r")
    return operator_span(M.reshape(-1, p, d), rtol=rtol)


def _lag_span(ssm: LinearSSM, n: int, rtol: float = 1e-10, weighted: bool = False) -> OperatorSpan:
    return _row_span(lag_matrix(ssm, n, weighted), ssm.p, ssm.d, rtol)


def minimal_polynomial_degree(A: Any, rtol: float = 1e-10) -> int:
    """Degree m_A of the minimal polynomial of a square matrix A (numerically).

    m_A is the least m such that A^m is a combination of I, A, …, A^{m−1}, i.e. the rank
    of the Krylov matrix [vec(I), vec(A), …, vec(A^N)] (N + 1 columns of length N²),
    with the rank rule of `lib.spans.operator_span` (σ > rtol·σ_max).  Used by
    {prf:ref}`prop-lag-span-bound`: k_n ≤ min(m_A, n, pd).

    Args:
        A: square matrix, shape (N, N) (numpy array or torch tensor; a LinearSSM's `.A`).
        rtol: rank tolerance, 0 < rtol < 1.

    Returns:
        m_A, an int in 1..N (1 also for A = 0, whose minimal polynomial is z).
    """
    rtol = check_rtol(rtol)
    A_t, _ = as_real_tensor(A, "A", dtype=torch.float64)
    if A_t.ndim != 2 or A_t.shape[0] != A_t.shape[1] or A_t.shape[0] < 1:
        raise ValueError(f"A must be a square matrix of shape (N, N) with N >= 1; got {tuple(A_t.shape)}")
    A_np = A_t.detach().numpy()
    N = A_np.shape[0]
    # Scale A so powers neither overflow nor vanish: the degree does not depend on the scale.
    scale = np.abs(A_np).max()
    A_np = A_np / scale if scale > 0 else A_np
    powers, power = [], np.eye(N)
    for _ in range(N + 1):
        powers.append(power.reshape(1, N, N))
        power = power @ A_np
    return max(1, operator_span(np.concatenate(powers), rtol).dim)


def lag_span_bound(ssm: LinearSSM, n: int) -> int:
    """The bound min(m_A, n, p·d) on the lag span dimension ({prf:ref}`prop-lag-span-bound`).

    Args:
        ssm: a LinearSSM.
        n: sequence length, >= 1.

    Returns:
        min(deg of A's minimal polynomial, n, p·d).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    return min(minimal_polynomial_degree(ssm.A), n, ssm.p * ssm.d)


def min_heads(ssm: LinearSSM, n: int, rtol: float = 1e-10) -> int:
    """k = dim span{L_0..L_{n−1}}: the least number of heads that represent the SSM on length n.

    Implements {prf:ref}`thm-head-count` (k heads are necessary and sufficient)
    with k from {prf:ref}`def-lag-span`, computed as the numerical rank of the lag
    matrix with the rule of `operator_span`: #{r : σ_r > rtol · σ_1} (0 if all
    lags vanish).  By {prf:ref}`prop-lag-span-bound`, k ≤ min(deg minpoly(A), n, pd).

    Args:
        ssm: a LinearSSM.
        n: sequence length.
        rtol: relative tolerance, 0 < rtol < 1.

    Returns:
        k, an int in 0..min(n, p·d).
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    return _lag_span(ssm, n, rtol).dim


def _heads_from_span(ssm: LinearSSM, n: int, span: OperatorSpan, H: int) -> RelativeHeads:
    # Values: the first H basis elements (orthonormal); coefficients c[h, ℓ] = ⟨L_ℓ, V_h⟩_F.
    V = span.basis[:H]
    c = lag_matrix(ssm, n) @ V.reshape(len(V), ssm.p * ssm.d).T
    return RelativeHeads(V, c.T, dtype=ssm.dtype)


def heads_from_ssm(ssm: LinearSSM, n: int, rtol: float = 1e-10) -> RelativeHeads:
    """The k-head relative-position model that equals the SSM on sequences of length ≤ n.

    Implements the sufficiency half of {prf:ref}`thm-head-count`: with the SVD
    M = U S Wᵀ of the lag matrix, V_h = reshape(W[:, h], (p, d)) for h < k is an
    orthonormal basis of span{L_ℓ}, and c[h, ℓ] = ⟨L_ℓ, V_h⟩_F = U[ℓ, h] S[h], so

        Σ_h c[h, i−j] V_h = C A^{i−j} B   for all 0 ≤ j ≤ i < n,

    up to the singular values dropped by `rtol` (relative error ~1e-13 for the
    default).  The coefficients are signed, unnormalised and input-independent.

    Args:
        ssm: a LinearSSM.
        n: longest sequence length; the model rejects longer inputs.
        rtol: rank tolerance, as in `min_heads`.

    Returns:
        RelativeHeads with H = k, V of shape (k, p, d), coefficients (k, n).
        If k = 0 (all lags zero) the model has no heads and outputs zeros.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    span = _lag_span(ssm, n, rtol)
    return _heads_from_span(ssm, n, span, span.dim)


def optimal_head_errors(ssm: LinearSSM, n: int, H_max: int) -> np.ndarray:
    """Least mean-square error of H-head models, H = 0..H_max: Σ_{r>H} σ_r(G)².

    Implements {prf:ref}`thm-approx-head-count`: for tokens x_j iid N(0, I_d) and
    any H-head factorized model with input-independent coefficients α^h_ij,

        min Σ_i E‖y_i − ŷ_i‖² = Σ_{r>H} σ_r(G)²,   G row ℓ = √(n−ℓ) vec(L_ℓ),

    attained by `truncated_heads`.  Entry 0 is ‖G‖_F² = Σ_ℓ (n−ℓ)‖L_ℓ‖²_F, the
    error of predicting zero.  The entries are 0 up to rounding for H ≥ k.

    Args:
        ssm: a LinearSSM.
        n: sequence length.
        H_max: largest head count, >= 0.

    Returns:
        numpy array of shape (H_max + 1,), non-increasing.
    """
    ssm, n, H_max = _check_ssm(ssm), check_int(n, "n"), check_int(H_max, "H_max", minimum=0)
    return _tail_energies(_lag_span(ssm, n, weighted=True).singular_values, H_max)


def _tail_energies(sigma: np.ndarray, H_max: int) -> np.ndarray:
    # tail[H] = Σ_{r>H} σ_r², summed from the smallest up so tiny tails keep their digits.
    squares = np.concatenate([sigma.astype(np.float64) ** 2, np.zeros(max(0, H_max + 1 - len(sigma)))])
    tails = np.concatenate([np.cumsum(squares[::-1])[::-1], [0.0]])
    return tails[: H_max + 1].copy()


def truncated_heads(ssm: LinearSSM, n: int, H: int) -> RelativeHeads:
    """The optimal H-head model in mean square under Gaussian tokens.

    Implements the attaining model of {prf:ref}`thm-approx-head-count`: with the
    SVD G = U S Wᵀ of the weighted lag matrix, V_h = reshape(W[:, h], (p, d)) and
    c[h, ℓ] = ⟨L_ℓ, V_h⟩_F = U[ℓ, h] S[h] / √(n−ℓ) (Eckart–Young truncation of G,
    row weights divided out).  Its error `population_error(ssm, model, n)` equals
    `optimal_head_errors(ssm, n, H)[H]`.

    Deviation: when H exceeds the numerical rank k of G (rank rule of
    `operator_span`, rtol = 1e-10), only k heads are returned — further heads
    would have zero coefficients.  The model is then exact like `heads_from_ssm`.

    Args:
        ssm: a LinearSSM.
        n: sequence length; the model rejects longer inputs.
        H: number of heads, >= 0.

    Returns:
        RelativeHeads with min(H, k) heads, coefficients of shape (min(H, k), n).
    """
    ssm, n, H = _check_ssm(ssm), check_int(n, "n"), check_int(H, "H", minimum=0)
    span = _lag_span(ssm, n, weighted=True)
    return _heads_from_span(ssm, n, span, min(H, span.dim))


def heads_needed(ssm: LinearSSM, n: int, eps: float) -> int:
    """Least H whose optimal relative squared error is ≤ eps: optimal_head_errors[H] ≤ eps · optimal_head_errors[0].

    The approximate head count of {prf:ref}`thm-approx-head-count`: the number of
    heads a factorized model with input-independent coefficients needs to
    reproduce the SSM on length-n sequences with Σ_i E‖y_i − ŷ_i‖² ≤ eps · Σ_i E‖y_i‖².
    eps is a relative *squared* error: a relative error δ in norm (the book's
    "relative error", `lib.relative_error`) is eps = δ², so eps = 10⁻² is a 10 % error.

    Args:
        ssm: a LinearSSM.
        n: sequence length.
        eps: relative squared error, 0 < eps < 1.

    Returns:
        H in 0..min(n, p·d) (0 if all lags vanish).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    eps = _check_eps(eps)
    sigma = _lag_span(ssm, n, weighted=True).singular_values
    errors = _tail_energies(sigma, len(sigma))
    return int(np.argmax(errors <= eps * errors[0]))


def _check_eps(eps: Any) -> float:
    eps = check_real(eps, "eps")
    if not 0 < eps < 1:
        raise ValueError(f"eps must satisfy 0 < eps < 1; got {eps}")
    return eps


def lag_energy_count(ssm: LinearSSM, n: int, eps: float) -> int:
    """L_ε: the least L such that the lags ℓ ≥ L carry at most eps of the weighted energy.

    Σ_{ℓ ≥ L} (n − ℓ) ‖L_ℓ‖²_F ≤ eps · Σ_ℓ (n − ℓ) ‖L_ℓ‖²_F.  By
    {prf:ref}`prop-heads-needed-lag-bound`, heads_needed(ssm, n, eps) ≤ L_ε: the span of
    the first L_ε lags, used as value maps, already leaves at most that tail.  Computed
    from the lag norms alone (no singular values).

    Args:
        ssm: a LinearSSM.  n: sequence length.  eps: relative squared error, 0 < eps < 1.

    Returns:
        L_ε in 0..n (0 if all lags vanish).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    eps = _check_eps(eps)
    energy = (lag_matrix(ssm, n, weighted=True) ** 2).sum(axis=1)
    tails = np.concatenate([np.cumsum(energy[::-1])[::-1], [0.0]])  # tails[L] = Σ_{ℓ≥L}
    return int(np.argmax(tails <= eps * tails[0]))


def _modes(A: np.ndarray, name: str, separation: float, max_condition: float):
    # Eigenvalues λ (N,), right eigenvectors R (N, N) and left ones R⁻¹ of a diagonalisable A with
    # distinct eigenvalues; ValueError naming `name` otherwise.
    lam, R = np.linalg.eig(A)
    if np.linalg.cond(R) > max_condition:
        raise ValueError(f"{name} is too far from diagonalisable for the modal route "
                         f"(eigenvector condition number {np.linalg.cond(R):.2e} > {max_condition:g})")
    gaps = np.abs(lam[:, None] - lam[None, :])
    np.fill_diagonal(gaps, np.inf)
    if len(lam) > 1 and gaps.min() <= separation * max(1.0, np.abs(lam).max()):
        raise ValueError(f"{name} has (nearly) repeated eigenvalues (smallest gap {gaps.min():.2e}); "
                         "the modal route needs distinct ones")
    return lam, R, np.linalg.inv(R)


def modal_lag_span_dimension(ssm: LinearSSM, n: int, rtol: float = 1e-10, *, separation: float = 1e-8,
                             max_condition: float = 1e8) -> int:
    """k_n from the modes of A: the rank of the N × pd residue matrix [vec(C v_m w_mᵀ B)]_m.

    Implements {prf:ref}`prop-modal-lag-span`: if A = Σ_m λ_m v_m w_mᵀ has N distinct
    eigenvalues and n ≥ N, then span{L_0..L_{n−1}} = span_ℂ{C v_m w_mᵀ B} and k_n is the
    rank of the residue matrix.  That matrix holds no powers λ^ℓ, so its rank is not
    blurred by lags that decay below rounding or by eigenvalues that nearly coincide:
    at n = 1024 and ρ = 0.5 an S4D SSM with N = 32 has numerical lag rank (`min_heads`)
    30, while its k is 32.  The rank rule is that of `operator_span` (σ > rtol·σ_max).

    Args:
        ssm: a LinearSSM whose A is diagonalisable with distinct eigenvalues.
        n: sequence length, n ≥ N.
        rtol: rank tolerance, 0 < rtol < 1.
        separation: eigenvalues closer than separation·max(1, max|λ|) count as repeated.
        max_condition: largest accepted condition number of the eigenvector matrix.

    Returns:
        k_n, an int in 0..min(N, p·d).

    Raises:
        ValueError: if n < N, if A has (nearly) repeated eigenvalues, or if its
            eigenvectors are worse conditioned than max_condition.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    if n < ssm.N:
        raise ValueError(f"n must be >= N = {ssm.N} for the modal route; got n = {n}")
    _, R, left = _modes(ssm.A.astype(np.float64), "ssm.A", separation, max_condition)
    residues = np.einsum("pm,md->mpd", ssm.C @ R, left @ ssm.B).reshape(ssm.N, -1)
    sigma = np.linalg.svd(residues, compute_uv=False)
    return int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0


def _kernel(model: Any, n: int, name: str) -> np.ndarray:
    # The lags (n, p, d) of an input-independent causal convolution model.
    if isinstance(model, LinearSSM):
        return lag_matrix(model, n).reshape(n, model.p, model.d)
    if isinstance(model, RelativeHeads):
        if model.max_length < n:
            raise ValueError(f"{name} accepts sequences of length <= {model.max_length}; got n = {n}")
        return np.einsum("hl,hpd->lpd", model.coefficients[:, :n].astype(np.float64), model.V.astype(np.float64))
    raise TypeError(f"{name} must be a LinearSSM or RelativeHeads; got {type(model).__name__}")


def population_error(teacher: LinearSSM | RelativeHeads, student: LinearSSM | RelativeHeads, n: int) -> float:
    """Σ_i E‖y_i − ŷ_i‖² over tokens x_j iid N(0, I_d), in closed form.

    Both models are causal convolutions with lags K_ℓ and K̂_ℓ, so
    y_i − ŷ_i = Σ_{ℓ≤i} (K_ℓ − K̂_ℓ) x_{i−ℓ} and, as E[x xᵀ] = I,

        Σ_i E‖y_i − ŷ_i‖² = Σ_ℓ (n − ℓ) ‖K_ℓ − K̂_ℓ‖²_F.

    The quantity minimised in {prf:ref}`thm-approx-head-count`; the error of
    `truncated_heads(ssm, n, H)` is `optimal_head_errors(ssm, n, H)[H]`.

    Args:
        teacher, student: LinearSSM or RelativeHeads with equal (p, d).
        n: sequence length (at most max_length of a RelativeHeads).

    Returns:
        The error, a float >= 0.
    """
    n = check_int(n, "n")
    K, K_hat = _kernel(teacher, n, "teacher"), _kernel(student, n, "student")
    if K.shape != K_hat.shape:
        raise ValueError(f"student must have (p, d) = {K.shape[1:]} like the teacher; got {K_hat.shape[1:]}")
    weights = np.arange(n, 0, -1, dtype=np.float64)
    return float(weights @ ((K - K_hat) ** 2).sum(axis=(1, 2)))


# -- the least error by optimisation and by sampling -----------------------------


@dataclass(frozen=True)
class HeadFit:
    """The best input-independent H-head model an optimiser found (`fit_heads`).

    Attributes:
        error: Σ_{i,j} ‖𝒲_ij − Σ_h α^h_ij V_h‖²_F of the best restart, which is
            Σ_i E‖y_i − ŷ_i‖² for tokens with E[x_j x_j'ᵀ] = δ_jj' I.
        V: value maps of the best restart, shape (H, p, d).
        coefficients: α^h_ij of the best restart, shape (H, n, n) (every pair, causal or not).
        restart_errors: the final error of each restart, shape (restarts,).
        method: "lbfgs" or "als".
    """

    error: float
    V: np.ndarray
    coefficients: np.ndarray
    restart_errors: np.ndarray
    method: str


def _dense_operator(ssm: LinearSSM, n: int) -> np.ndarray:
    # 𝒲_ij = L_{i−j} for j ≤ i, 0 otherwise: the full (n, n, p, d) operator, built on purpose.
    lags = ssm.lags(n).astype(np.float64)
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    return np.where((lag >= 0)[..., None, None], lags[np.clip(lag, 0, None)], 0.0)


def _fit_lbfgs(W: np.ndarray, H: int, rng: np.random.Generator, max_iter: int):
    # Variable projection: for fixed V the best α is the least-squares fit of every block on
    # span{V_h} (an H × H solve), so L-BFGS runs on V alone, f(V) = Σ_ij ‖𝒲_ij − proj_V 𝒲_ij‖².
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
        if current <= 1e-26 or not previous - current > 1e-15 * current:   # relative to ‖𝒲‖²: exact, or stalled
            break
        previous = current
    with torch.no_grad():
        loss, alpha = fitted(V)
    return float(loss) * scale, V.detach().numpy().reshape(H, p, d).copy(), \
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
    """Minimise the error of an input-independent H-head model by an optimiser (no SVD).

    An independent route to {prf:ref}`thm-approx-head-count`.  The model is the general
    one of the theorem — any coefficient α^h_ij for every pair (i, j), causal or not,
    and any value maps V_h — and the objective is the dense
    Σ_{i,j} ‖𝒲_ij − Σ_h α^h_ij V_h‖²_F over the SSM's n × n × p × d operator, so neither
    the reduction to lags nor a singular value decomposition enters.  The theorem says
    its minimum is `optimal_head_errors(ssm, n, H)[H]`; an optimiser can only stop at or
    above it.

    Methods (float64, `restarts` random starts, the best one kept):

    - "lbfgs": torch.optim.LBFGS with strong-Wolfe line search on the value maps V,
      with the coefficients eliminated exactly (for fixed V the best α_ij is the
      least-squares fit of 𝒲_ij on span{V_h}, an H × H linear solve — variable
      projection); the objective is divided by ‖𝒲‖²; rounds of 100 iterations until a
      round improves it by less than 1e-15 relative (or it is below 1e-26, an exact
      fit), at most max_iter iterations;
    - "als": alternating least squares (α for fixed V, then V for fixed α, each by
      numpy.linalg.lstsq) until a sweep improves by less than 1e-15 relative (or the
      error is below 1e-26 ‖𝒲‖²), at most max_iter sweeps.

    Args:
        ssm: a LinearSSM.
        n: sequence length (the dense operator has n² blocks: keep n small, say ≤ 64).
        H: number of heads, >= 0 (H = 0 returns the error of the zero model, ‖𝒲‖²).
        method: "lbfgs" or "als".
        restarts: number of random starts, >= 1.
        seed: seed of numpy's default_rng for the starts.
        max_iter: iteration budget per start, >= 1.

    Returns:
        HeadFit(error, V (H, p, d), coefficients (H, n, n), restart_errors (restarts,), method).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    H, restarts = check_int(H, "H", minimum=0), check_int(restarts, "restarts")
    max_iter = check_int(max_iter, "max_iter")
    method = check_choice(method, "method", ("lbfgs", "als"))
    W = _dense_operator(ssm, n)
    if H == 0:
        return HeadFit(float((W ** 2).sum()), np.zeros((0, ssm.p, ssm.d)), np.zeros((0, n, n)),
                       np.full(restarts, float((W ** 2).sum())), method)
    rng = np.random.default_rng(seed)
    fit = _fit_lbfgs if method == "lbfgs" else _fit_als
    runs = [fit(W, H, rng, max_iter) for _ in range(restarts)]
    best = min(runs, key=lambda run: run[0])
    return HeadFit(float(best[0]), best[1], best[2], np.array([run[0] for run in runs]), method)


@dataclass(frozen=True)
class SampledErrors:
    """Monte Carlo estimates of Σ_i E‖y_i − ŷ_i‖² (`sampled_head_errors`).

    Attributes:
        heads: the head counts H, as a tuple.
        mean: the sample mean of Σ_i ‖y_i − ŷ_i‖² per H, shape (len(heads),).
        stderr: its standard error (sample standard deviation / √samples), shape (len(heads),).
        samples: number of sequences.  tokens: "gaussian" or "rademacher".
    """

    heads: tuple
    mean: np.ndarray
    stderr: np.ndarray
    samples: int
    tokens: str


def sampled_head_errors(ssm: LinearSSM, n: int, heads: Any, samples: int, *, tokens: str = "gaussian",
                        seed: Any = 0, chunk: int = 4096) -> SampledErrors:
    """Monte Carlo estimates of the errors of `truncated_heads(ssm, n, H)` for H in `heads`.

    Sequences of n tokens with iid entries — N(0, 1) ("gaussian") or ±1 with equal
    probability ("rademacher") — so E[x_j x_j'ᵀ] = δ_jj' I, the only property of the
    tokens {prf:ref}`thm-approx-head-count` uses.  y comes from the SSM's own forward pass
    (its recurrence or scan), ŷ from the model's causal convolution, and every H is scored
    on the same sequences.

    Args:
        ssm: a LinearSSM.  n: sequence length.
        heads: head counts, an iterable of ints >= 0.
        samples: number of sequences, >= 2.
        tokens: "gaussian" or "rademacher".
        seed: seed of numpy's default_rng.
        chunk: sequences per batch (memory only; the estimates do not depend on it).

    Returns:
        SampledErrors(heads, mean, stderr, samples, tokens).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    samples, chunk = check_int(samples, "samples", minimum=2), check_int(chunk, "chunk")
    tokens = check_choice(tokens, "tokens", ("gaussian", "rademacher"))
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(f"heads must be an iterable of head counts; got {type(heads).__name__}")
    heads = tuple(check_int(H, "heads[...]", minimum=0) for H in heads)
    models = [truncated_heads(ssm, n, H) for H in heads]
    rng = np.random.default_rng(seed)
    per_sequence = np.empty((len(heads), samples))
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        X = rng.standard_normal((size, n, ssm.d)) if tokens == "gaussian" else \
            rng.choice([-1.0, 1.0], size=(size, n, ssm.d))
        Y = np.asarray(ssm(X))
        for r, model in enumerate(models):
            per_sequence[r, start:start + size] = ((Y - np.asarray(model(X))) ** 2).sum(axis=(1, 2))
    return SampledErrors(heads, per_sequence.mean(axis=1),
                         per_sequence.std(axis=1, ddof=1) / math.sqrt(samples), samples, tokens)


# -- one head with token-dependent coefficients ----------------------------------


@dataclass(frozen=True)
class SingleHeadFit:
    """The best single head with input-dependent coefficients, input by input.

    Attributes:
        outputs: ŷ_i = V Σ_j α_ij(X) x_j, shape (b, n, p).
        coefficients: α_ij(X), shape (b, n, n) (zero for j > i when causal).
        errors: ‖y_i − ŷ_i‖² = dist(y_i, V·span{x_j})², shape (b, n).
        targets: the SSM's outputs y, shape (b, n, p).
    """

    outputs: np.ndarray
    coefficients: np.ndarray
    errors: np.ndarray
    targets: np.ndarray


def token_dependent_single_head(ssm: LinearSSM, X: Any, V: Any, *, causal: bool = True) -> SingleHeadFit:
    """The best single head y_i = Σ_j α_ij(X) V x_j, its coefficients chosen for each input.

    Implements the construction of {prf:ref}`prop-single-head-generic-inputs`: for each
    input X and position i, α_i· is the least-norm least-squares solution of
    V Σ_j α_ij x_j ≈ y_i over j ≤ i (causal) or all j, with y the SSM's output; so ŷ_i
    is the point of V·span{x_j} nearest to y_i.  Where the tokens x_1..x_i span ℝ^d and
    rank V = p, the error is 0 up to rounding.  The coefficients are functions of the
    whole input — signed, unnormalised and unbounded, nothing like softmax weights.
    Computed with numpy.linalg.pinv (singular values below 1e-12 of the largest dropped).

    Args:
        ssm: a LinearSSM with p outputs and d inputs.
        X: inputs, shape (n, d) or (b, n, d).
        V: the value map, shape (p, d).
        causal: restrict position i to the tokens j ≤ i.

    Returns:
        SingleHeadFit(outputs (b, n, p), coefficients (b, n, n), errors (b, n), targets (b, n, p)).
    """
    ssm = _check_ssm(ssm)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    batch, _, _ = as_sequence(X, ssm.d, dtype=torch.float64, name="X")
    V_t, _ = as_real_tensor(V, "V", dtype=torch.float64)
    check_shape(V_t, "V", ("p", "d"), {"p": ssm.p, "d": ssm.d})
    X_np, V_np = batch.numpy(), V_t.numpy()
    Y = np.asarray(ssm(X_np))
    b, n, _ = X_np.shape
    projected = np.einsum("pd,bjd->bpj", V_np, X_np)                    # column j is V x_j
    alpha = np.zeros((b, n, n))
    for i in range(n):
        cols = i + 1 if causal else n
        alpha[:, i, :cols] = (np.linalg.pinv(projected[:, :, :cols], rtol=1e-12) @ Y[:, i, :, None])[..., 0]
    outputs = np.einsum("bij,bpj->bip", alpha, projected)
    return SingleHeadFit(outputs, alpha, ((Y - outputs) ** 2).sum(axis=2), Y)


@dataclass(frozen=True)
class SingleTokenWitness:
    """An input on which every single head with a given value map misses an SSM (`single_head_witness`).

    Attributes:
        lag: ℓ; the input is (u, 0, …, 0) and the miss is at position 1 + ℓ (index ℓ).
        token: u, shape (d,), unit norm.
        miss: the least relative error ‖y − ŷ‖/‖y‖ at that position over all coefficients, with
            y = L_ℓ u from the SSM's own forward pass and ŷ ∈ span{V u}.
    """

    lag: int
    token: np.ndarray
    miss: float


def single_head_witness(ssm: LinearSSM, n: int, V: Any, rtol: float = 1e-10) -> SingleTokenWitness | None:
    """The single-token input of {prf:ref}`thm-rank-gap-map` on which a single head with value map V fails.

    The theorem's contrapositive, made constructive: if some lag L_ℓ (ℓ < n) is not a
    multiple of V, `lib.spans.pointwise_witness` gives a token u with L_ℓ u ∉ span{V u}.
    On the input (u, 0, …, 0) a single head y_i = Σ_j α_ij(X) V x_j outputs a multiple of
    V u at every position whatever its coefficients, while the SSM outputs y_{1+ℓ} = L_ℓ u;
    the miss is measured from the SSM's forward pass (its recurrence), by least squares
    on V u (V u below rtol·‖V‖ counts as 0, so the miss is then 1).  Among the lags with a
    witness, the one with the largest miss is returned.

    Args:
        ssm: a LinearSSM.  n: sequence length.  V: the value map, shape (p, d).
        rtol: as in `pointwise_witness`.

    Returns:
        SingleTokenWitness(lag, token, miss), or None when every lag is a multiple of V
        (then one head with value V represents the SSM: {prf:ref}`thm-rank-gap`).
    """
    from .spans import pointwise_witness

    ssm, n = _check_ssm(ssm), check_int(n, "n")
    V_t, _ = as_real_tensor(V, "V", dtype=torch.float64)
    check_shape(V_t, "V", ("p", "d"), {"p": ssm.p, "d": ssm.d})
    V = V_t.numpy()
    lags = ssm.lags(n).astype(np.float64)
    best = None
    for ell in range(n):
        u = pointwise_witness(lags[ell], V, rtol)
        if u is None:
            continue
        X = np.zeros((1, n, ssm.d))
        X[0, 0] = u
        y, Vu = np.asarray(ssm(X))[0, ell], V @ u
        if np.linalg.norm(Vu) <= rtol * np.linalg.norm(V):
            miss = 1.0
        else:
            miss = float(np.linalg.norm(y - (y @ Vu) / (Vu @ Vu) * Vu) / np.linalg.norm(y))
        if best is None or miss > best.miss:
            best = SingleTokenWitness(ell, u, miss)
    return best


# -- the map level: value families that span ℝ^p at every token ------------------


def _check_sizes(p: Any, d: Any) -> tuple[int, int]:
    return check_int(p, "p"), check_int(d, "d")


def polynomial_values(p: int, d: int) -> np.ndarray:
    """Value maps of polynomial multiplication: (V_h)_ab = 1[a + b = h], h = 0..p+d−2.

    yᵀ V_h u is the coefficient of t^h in y(t)u(t), with y(t) = Σ_a y_a t^a and
    u(t) = Σ_b u_b t^b.  A product of non-zero polynomials is non-zero, so for every
    u ≠ 0 the vectors V_h u = (u_h, u_{h−1}, …, u_{h−p+1}) (entries outside 0..d−1 are 0)
    span ℝ^p: a nonsingular family with p + d − 1 heads ({prf:ref}`prop-nonsingular-families`).

    Args:
        p, d: output and input widths, >= 1.

    Returns:
        float64 array of shape (p + d − 1, p, d).
    """
    p, d = _check_sizes(p, d)
    a, b = np.meshgrid(np.arange(p), np.arange(d), indexing="ij")
    return (a + b == np.arange(p + d - 1)[:, None, None]).astype(np.float64)


def complex_values(p: int, d: int) -> np.ndarray:
    """The complex structure, for p = 2 or d = 2: m = 2⌈max(p, d)/2⌉ heads.

    For p = 2 the bilinear map is C(y, u) = y_0 u' + y_1 J u' ∈ ℝ^m, with u' = (u, 0) ∈ ℝ^m
    and J the complex structure of ℝ^m (a 90° rotation in each coordinate pair); so
    (V_h)_0b = δ_hb and (V_h)_1b = J_hb.  Then V_h u = (u'_h, (J u')_h) and the 2 × m matrix
    [V_1 u, …, V_m u] has orthogonal rows of norm ‖u‖: it spans ℝ² for u ≠ 0
    ({prf:ref}`prop-nonsingular-families`).  For d = 2 the family is the transpose of the
    one for (2, p).

    Args:
        p, d: output and input widths; one of them must be 2.

    Returns:
        float64 array of shape (m, p, d).
    """
    p, d = _check_sizes(p, d)
    if p != 2 and d != 2:
        raise ValueError(f"complex_values needs p = 2 or d = 2; got p = {p}, d = {d}")
    if p != 2:
        return complex_values(2, p).transpose(0, 2, 1).copy()
    m = d + d % 2
    J = np.kron(np.eye(m // 2), np.array(_J))
    V = np.zeros((m, 2, d))
    V[:, 0, :] = np.eye(m)[:, :d]
    V[:, 1, :] = J[:, :d]
    return V


def _cd_conjugate(x: np.ndarray) -> np.ndarray:
    out = -x
    out[0] = x[0]
    return out


def _cd_product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Cayley–Dickson doubling: (a, b)(c, d) = (ac − d̄b, da + bc̄); R, C, H, O for m = 1, 2, 4, 8.
    m = len(x)
    if m == 1:
        return x * y
    h = m // 2
    a, b, c, d = x[:h], x[h:], y[:h], y[h:]
    return np.concatenate([_cd_product(a, c) - _cd_product(_cd_conjugate(d), b),
                           _cd_product(d, a) + _cd_product(b, _cd_conjugate(c))])


def cayley_dickson_values(p: int, d: int) -> np.ndarray:
    """Left multiplications of the reals, complexes, quaternions or octonions: m ∈ {1, 2, 4, 8} heads.

    With m the least of 1, 2, 4, 8 that is >= max(p, d) and e_0..e_{m−1} the basis of the
    Cayley–Dickson algebra of dimension m, V_h is left multiplication by e_h, cut to p
    rows and d columns: (V_h)_ab = (e_h e_b)_a.  Then [V_1 u, …, V_m u] is right
    multiplication by u (rows cut to p), and B(u)B(u)ᵀ = ‖u‖² I_p — the multiplication
    is norm-preserving — which `composition_defect` verifies exactly on the integer
    structure constants.  For p = d = 2 the family is (I, J), that of
    {prf:ref}`prop-map-level-two-heads`.  ({prf:ref}`prop-nonsingular-families`.)

    Args:
        p, d: output and input widths, 1..8.

    Returns:
        float64 array of shape (m, p, d) with entries 0 and ±1.
    """
    p, d = _check_sizes(p, d)
    if max(p, d) > 8:
        raise ValueError(f"cayley_dickson_values needs p, d <= 8 (the octonions); got p = {p}, d = {d}")
    m = next(size for size in (1, 2, 4, 8) if size >= max(p, d))
    basis = np.eye(m)
    table = np.stack([np.stack([_cd_product(basis[h], basis[b]) for b in range(m)], axis=1) for h in range(m)])
    return table[:, :p, :d].copy()                         # table[h, a, b] = (e_h e_b)_a


def nonsingular_values(p: int, d: int) -> np.ndarray:
    """The value family with the fewest heads among those above, for any p, d.

    Candidates: `cayley_dickson_values` (if max(p, d) <= 8), `complex_values` (if p or d
    is 2), `polynomial_values` (always, p + d − 1 heads).  Ties go to the first in this
    order, so p = d = 2 gives (I, J).  The number of heads is an upper bound on
    ν(p, d), the least H of a nonsingular family ({prf:ref}`thm-map-level-head-count`).

    Args:
        p, d: output and input widths, >= 1.

    Returns:
        float64 array of shape (H, p, d).
    """
    p, d = _check_sizes(p, d)
    candidates = []
    if max(p, d) <= 8:
        candidates.append(cayley_dickson_values(p, d))
    if 2 in (p, d):
        candidates.append(complex_values(p, d))
    candidates.append(polynomial_values(p, d))
    return min(candidates, key=len)


def nonsingular_dimension_bounds(p: int, d: int) -> tuple[int, int]:
    """Bounds lower <= ν(p, d) <= upper on the least number of heads of a nonsingular family.

    lower = max(p, d), plus 1 when max(p, d) is odd and min(p, d) >= 2
    ({prf:ref}`lem-odd-nonsingular`); upper = the heads of `nonsingular_values(p, d)`
    ({prf:ref}`prop-nonsingular-families`).  When they agree, ν(p, d) is known exactly.

    Args:
        p, d: output and input widths, >= 1.

    Returns:
        (lower, upper).
    """
    p, d = _check_sizes(p, d)
    big, small = max(p, d), min(p, d)
    return big + (1 if big % 2 and small >= 2 else 0), len(nonsingular_values(p, d))


def _as_values(values: Any, p: int | None = None, d: int | None = None) -> np.ndarray:
    tensor, _ = as_real_tensor(values, "values", dtype=torch.float64)
    dims = {key: value for key, value in (("p", p), ("d", d)) if value is not None}
    check_shape(tensor, "values", ("H", "p", "d"), dims)
    if tensor.shape[0] < 1:
        raise ValueError(f"values must have shape (H, p, d) with H >= 1; got {tuple(tensor.shape)}")
    return tensor.numpy()


def composition_defect(values: Any) -> float:
    """max |S_aa'bb' + S_aa'b'b − 2 δ_aa' δ_bb'| with S_aa'bb' = Σ_h (V_h)_ab (V_h)_a'b'.

    B(u)B(u)ᵀ = Σ_h V_h u uᵀ V_hᵀ is a quadratic form in u; it equals ‖u‖² I_p for every
    u exactly when this defect is 0.  For families with integer entries (those of
    `cayley_dickson_values`, `complex_values`) the defect is computed exactly, so 0 is a
    proof that the family is norm-preserving, hence nonsingular, and that every B(u) has
    condition number 1 ({prf:ref}`prop-nonsingular-families`).

    Args:
        values: V_1..V_H, shape (H, p, d).

    Returns:
        The defect, a float >= 0.
    """
    V = _as_values(values)
    S = np.einsum("hab,hce->acbe", V, V)                       # S[a, a', b, b']
    p, d = V.shape[1:]
    target = 2.0 * np.einsum("ac,be->acbe", np.eye(p), np.eye(d))
    return float(np.abs(S + S.transpose(0, 1, 3, 2) - target).max())


def token_matrix(values: Any, tokens: Any) -> np.ndarray:
    """B(u) = [V_1 u, …, V_H u] for each token u: shape (..., p, H).

    The model's reachable outputs for a token u are the columns' span; the family is
    nonsingular when B(u) has rank p for every u ≠ 0.

    Args:
        values: V, shape (H, p, d).
        tokens: u, shape (..., d).

    Returns:
        float64 array of shape (..., p, H).
    """
    V = _as_values(values)
    u, _ = as_real_tensor(tokens, "tokens", dtype=torch.float64)
    if u.ndim < 1 or u.shape[-1] != V.shape[2]:
        raise ValueError(f"tokens must have shape (..., d) = (..., {V.shape[2]}); got {tuple(u.shape)}")
    return np.einsum("hpd,...d->...ph", V, u.numpy())


def worst_conditioned_tokens(values: Any, samples: int = 20_000, keep: int = 3, *,
                             seed: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """The tokens u with the largest condition number of B(u) = [V_1 u, …, V_H u] found by a search.

    Candidates: `samples` Gaussian tokens and a few structured ones — the basis vectors,
    (1, …, 1), (1, −1, 1, …) and the binomial coefficients (the polynomial (1 + t)^{d−1},
    whose roots sit on the unit circle, where polynomial multiplication is worst
    conditioned).  The condition number is σ_1/σ_p of the p × H matrix B(u) (inf if it
    has rank < p).  A search, not a bound: for `cayley_dickson_values` and
    `complex_values` every B(u) has condition number 1 (`composition_defect` = 0).

    Args:
        values: V, shape (H, p, d).
        samples: number of Gaussian candidates, >= 1.  keep: number of tokens returned, >= 1.
        seed: seed of numpy's default_rng.

    Returns:
        (tokens of shape (keep, d), their condition numbers (keep,)), worst first.
    """
    V = _as_values(values)
    samples, keep = check_int(samples, "samples"), check_int(keep, "keep")
    d = V.shape[2]
    structured = np.concatenate([np.eye(d), [np.ones(d), (-1.0) ** np.arange(d),
                                             [math.comb(d - 1, b) for b in range(d)]]])
    tokens = np.concatenate([np.random.default_rng(seed).standard_normal((samples, d)), structured])
    sigma = np.linalg.svd(token_matrix(V, tokens), compute_uv=False)[:, : V.shape[1]]
    with np.errstate(divide="ignore"):
        condition = np.where(sigma[:, -1] > 0, sigma[:, 0] / sigma[:, -1], np.inf)
    order = np.argsort(-condition)[:keep]
    return tokens[order], condition[order]


def pointwise_lag_rank(ssm: LinearSSM, n: int, token: Any, rtol: float = 1e-10) -> int:
    """rank K_n(u), K_n(u) = [L_0 u, …, L_{n−1} u] ∈ ℝ^{p×n}: the outputs one token u can demand.

    Its maximum over u is the lower bound r* of {prf:ref}`thm-map-level-head-count`; the
    rank is maximal for almost every u, so a random token attains it with probability 1.
    Rank rule of `operator_span` (σ > rtol·σ_max; 0 if K = 0).

    Args:
        ssm: a LinearSSM.  n: sequence length.  token: u, shape (d,).  rtol: 0 < rtol < 1.
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    u, _ = as_real_tensor(token, "token", dtype=torch.float64)
    check_shape(u, "token", ("d",), {"d": ssm.d})
    sigma = np.linalg.svd(np.einsum("lpd,d->pl", lag_matrix(ssm, n).reshape(n, ssm.p, ssm.d), u.numpy()),
                          compute_uv=False)
    return int((sigma > rtol * sigma[0]).sum()) if sigma[0] > 0 else 0


@dataclass(frozen=True)
class MapHeadBounds:
    """Bounds lower <= H_map <= upper on the map-level head count ({prf:ref}`thm-map-level-head-count`).

    Attributes:
        lower: r* = max_u rank K_n(u), raised to the lower bound of ν(p, d) when `full`.
        upper: min(k_n, heads of `nonsingular_values(p, d)`).
        k: the lag span dimension k_n: `modal_lag_span_dimension` when A has distinct
            eigenvalues and n >= N, else `min_heads`.
        pointwise_rank: r*, measured at a random Gaussian token.
        full: k_n = pd, which certifies that K_n(u) has rank p for every u ≠ 0.
    """

    lower: int
    upper: int
    k: int
    pointwise_rank: int
    full: bool

    @property
    def exact(self) -> bool:
        """True when the bounds meet."""
        return self.lower == self.upper


def map_head_bounds(ssm: LinearSSM, n: int, *, seed: Any = 0, rtol: float = 1e-10) -> MapHeadBounds:
    """The bounds of {prf:ref}`thm-map-level-head-count` on the least number of token-dependent heads.

    r* (lower bound) is the rank of K_n(u) at one Gaussian token u drawn with `seed`
    (the maximum, with probability 1); if k_n = pd every non-zero token has rank p,
    H_map = ν(p, d), and the lower bound of `nonsingular_dimension_bounds` applies.

    Args:
        ssm: a LinearSSM.  n: sequence length.  seed: seed of the random token.
        rtol: rank tolerance, 0 < rtol < 1.

    Returns:
        MapHeadBounds(lower, upper, k, pointwise_rank, full).
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    try:
        k = modal_lag_span_dimension(ssm, n, rtol)
    except ValueError:                                        # repeated eigenvalues, n < N, ...
        k = min_heads(ssm, n, rtol)
    r = pointwise_lag_rank(ssm, n, np.random.default_rng(seed).standard_normal(ssm.d), rtol)
    nu_lower, nu_upper = nonsingular_dimension_bounds(ssm.p, ssm.d)
    full = k == ssm.p * ssm.d
    return MapHeadBounds(max(r, nu_lower) if full else r, min(k, nu_upper), k, r, full)


def _sign_change_zero(values: np.ndarray, start: Any, direction: Any) -> np.ndarray:
    # For square B(u) = [V_h u]_h (H = p, p odd, d >= 2): a unit u on a half great circle with det B(u) = 0.
    H, p, d = values.shape
    u0, _ = as_real_tensor(start, "start", dtype=torch.float64)
    check_shape(u0, "start", ("d",), {"d": d})
    u0 = u0.numpy()
    if not np.linalg.norm(u0) > 0:
        raise ValueError("start must be a non-zero token")
    u0 = u0 / np.linalg.norm(u0)
    if direction is None:
        w = np.eye(d)[np.argmin(np.abs(u0))]
    else:
        w_t, _ = as_real_tensor(direction, "direction", dtype=torch.float64)
        check_shape(w_t, "direction", ("d",), {"d": d})
        w = w_t.numpy()
    w = w - (w @ u0) * u0
    if np.linalg.norm(w) <= 1e-12:
        raise ValueError("direction must not be a multiple of start")
    w /= np.linalg.norm(w)

    def f(theta: float) -> float:
        return float(np.linalg.det(token_matrix(values, math.cos(theta) * u0 + math.sin(theta) * w)))

    low, high, f_low = 0.0, math.pi, f(0.0)
    if f_low == 0.0:
        return u0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        f_middle = f(middle)
        if f_middle == 0.0:
            low = high = middle
            break
        if (f_middle > 0) == (f_low > 0):
            low, f_low = middle, f_middle
        else:
            high = middle
    theta = 0.5 * (low + high)
    return math.cos(theta) * u0 + math.sin(theta) * w


def singular_token(values: Any, start: Any, direction: Any = None) -> np.ndarray:
    """A unit token u ≠ 0 at which H heads stop spanning ℝ^p: rank [V_1 u, …, V_H u] < p.

    Such a token exists whenever H < max(p, d), or H = max(p, d) is odd and
    min(p, d) >= 2 ({prf:ref}`lem-odd-nonsingular`); it is found constructively:

    - H < p: every token will do (B(u) has only H < p columns); u = start.
    - H < d: for y = start ∈ ℝ^p the H × d matrix with rows yᵀ V_h has a null vector u,
      so y ⟂ every V_h u.
    - H = p odd, d >= 2: f(u) = det B(u) is a form of odd degree p, f(−u) = −f(u); along
      the half great circle u(θ) = cos θ·u_0 + sin θ·w, θ ∈ [0, π] (w ⟂ u_0) it changes
      sign, and bisection finds θ with f(u(θ)) = 0 to rounding.
    - H = d odd, p >= 2: the same for the transposed family V_hᵀ gives y ≠ 0 with
      det [V_1ᵀ y, …, V_dᵀ y] = 0, and u is the null vector of the rows yᵀ V_h.

    At that token no choice of coefficients reaches outputs outside a proper subspace of ℝ^p.

    Args:
        values: V_1..V_H, shape (H, p, d).
        start: u_0 of shape (d,) in the cases H < p and H = p; y of shape (p,) in the
            cases H < d and H = d (H < p and H = p take precedence); non-zero.
        direction: w for the bisection cases, same shape as start, not a multiple of it
            (default: the standard basis vector least aligned with start).

    Returns:
        The unit token u, shape (d,).
    """
    V = _as_values(values)
    H, p, d = V.shape

    def null_token(y: np.ndarray) -> np.ndarray:
        u = np.linalg.svd(np.einsum("a,hab->hb", y, V))[2][-1]  # rows yᵀ V_h; its null vector
        return u / np.linalg.norm(u)

    if H < p or (H == p and p % 2 == 1 and d >= 2):
        if H < p:
            u0, _ = as_real_tensor(start, "start", dtype=torch.float64)
            check_shape(u0, "start", ("d",), {"d": d})
            if not np.linalg.norm(u0.numpy()) > 0:
                raise ValueError("start must be a non-zero token")
            return u0.numpy() / np.linalg.norm(u0.numpy())
        return _sign_change_zero(V, start, direction)
    if H < d:
        y, _ = as_real_tensor(start, "start", dtype=torch.float64)
        check_shape(y, "start", ("p",), {"p": p})
        if not np.linalg.norm(y.numpy()) > 0:
            raise ValueError("start must be non-zero")
        return null_token(y.numpy())
    if H == d and d % 2 == 1 and p >= 2:
        return null_token(_sign_change_zero(V.transpose(0, 2, 1), start, direction))
    raise ValueError(f"values must have H < max(p, d) heads, or H = p odd with d >= 2, or H = d odd with "
                     f"p >= 2 (then a rank-deficient token is guaranteed); got shape {V.shape}")


def token_miss(ssm: LinearSSM, n: int, values: Any, token: Any, rtol: float = 1e-10) -> float:
    """The least relative error of heads with value maps V_h on the single-token input (u, 0, …, 0).

    On that input an H-head model (any coefficients) outputs vectors of range B(u),
    B(u) = [V_1 u, …, V_H u], at every position, while the SSM outputs L_ℓ u at position
    1 + ℓ.  Returns √(Σ_ℓ dist(L_ℓ u, range B(u))² / Σ_ℓ ‖L_ℓ u‖²), with range B(u) spanned
    by the left singular vectors whose singular values exceed rtol·σ_max (so a B(u)
    singular to rounding, as at a `singular_token`, counts as singular).  This is the
    quantity the necessity half of {prf:ref}`thm-map-level-head-count` bounds below.

    Args:
        ssm: a LinearSSM.  n: sequence length.  values: shape (H, p, d).  token: u, shape (d,).
        rtol: rank tolerance of B(u), 0 < rtol < 1.

    Returns:
        The relative miss in [0, 1] (0 if the SSM's output on the input is 0).
    """
    ssm, n, rtol = _check_ssm(ssm), check_int(n, "n"), check_rtol(rtol)
    V = _as_values(values, ssm.p, ssm.d)
    u, _ = as_real_tensor(token, "token", dtype=torch.float64)
    check_shape(u, "token", ("d",), {"d": ssm.d})
    X = np.zeros((1, n, ssm.d))
    X[0, 0] = u.numpy()
    K = np.asarray(ssm(X))[0].T                               # the SSM's outputs L_ℓ u, (p, n)
    left, sigma, _ = np.linalg.svd(token_matrix(V, u.numpy()), full_matrices=False)
    rank = int((sigma > rtol * np.linalg.norm(V) * np.linalg.norm(u.numpy())).sum())
    residual = K - left[:, :rank] @ (left[:, :rank].T @ K)
    total = float((K ** 2).sum())
    return float(np.sqrt((residual ** 2).sum() / total)) if total > 0 else 0.0


_J = ((0.0, -1.0), (1.0, 0.0))  # rotation by 90°: ⟨x, Jx⟩ = 0 and ‖Jx‖ = ‖x‖


class TokenDependentHeads(SequenceMap):
    """H heads with fixed value maps and token-dependent coefficients that compute an SSM's map.

    Implements the sufficiency construction of {prf:ref}`thm-map-level-head-count` (and,
    with the default values for p = d = 2, {prf:ref}`prop-map-level-two-heads`).  For a
    token u ≠ 0 let B(u) = [V_1 u, …, V_H u] ∈ ℝ^{p×H}; if it has rank p, the least-norm
    a_ℓ(u) ∈ ℝ^H with B(u) a_ℓ(u) = L_ℓ u exists, and with

        α^h_ij(X) = a^h_{i−j}(x_j) for j ≤ i (0 for j > i and for x_j = 0)

    the model y_i = Σ_h V_h Σ_j α^h_ij(X) x_j equals Σ_{j≤i} L_{i−j} x_j for every X.  Its
    interaction rank is at most H although k can be pd.  a_ℓ(u) is computed from a QR
    factorisation of B(u)ᵀ (error amplification ~ cond B(u), which is 1 for the
    Cayley–Dickson and complex families).  For the default (I, J) with p = d = 2 this is
    α^1 = ⟨L x_j, x_j⟩/‖x_j‖², α^2 = ⟨L x_j, J x_j⟩/‖x_j‖², as before.

    Args:
        ssm: a LinearSSM (any N, p, d).
        values: V_1..V_H, shape (H, p, d), spanning ℝ^p at every non-zero token met
            (default `nonsingular_values(p, d)`: (I, J) for p = d = 2).

    Raises (when called): ValueError naming `values` if B(x_j) has rank < p at a
    non-zero token.  The model computes in the SSM's dtype and accepts any length.
    """

    def __init__(self, ssm: LinearSSM, values: Any = None) -> None:
        ssm = _check_ssm(ssm)
        V = nonsingular_values(ssm.p, ssm.d) if values is None else _as_values(values, ssm.p, ssm.d)
        self.ssm = ssm
        self._V = torch.as_tensor(V, dtype=ssm.dtype)
        self.H = len(V)
        super().__init__(ssm.d, ssm.p, ssm.dtype)

    def values(self) -> np.ndarray:
        """The value maps V_h, shape (H, p, d)."""
        return self._values().numpy()

    def coefficients(self, X: Any) -> torch.Tensor | np.ndarray:
        """α^h_ij(X), shape (H, n, n) or (b, H, n, n); zero for j > i and for zero tokens."""
        return self._apply(self._coefficients, X)

    def _values(self) -> torch.Tensor:
        return self._V

    def _coefficients(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        lags = torch.as_tensor(self.ssm.lags(n), dtype=self.dtype)
        targets = torch.einsum("lpd,bjd->bjpl", lags, X)                 # L_ℓ x_j, (b, n_j, p, n_ℓ)
        B = torch.einsum("hpd,bjd->bjph", self._V, X)                    # B(x_j), (b, n, p, H)
        nonzero = (X != 0).any(-1)                                      # (b, n)
        safe = torch.where(nonzero[..., None, None], B, torch.eye(self.p, self.H, dtype=self.dtype))
        Q, R = torch.linalg.qr(safe.transpose(-1, -2))                   # B(x)ᵀ = QR, Q (H, p), R (p, p)
        diagonal = R.diagonal(dim1=-2, dim2=-1).abs()
        scale = torch.linalg.matrix_norm(safe, ord=2)
        if bool((diagonal <= 1e-13 * scale[..., None]).any()):
            raise ValueError("values must span R^p at every non-zero token: [V_1 x, ..., V_H x] has rank < p "
                             "at a token of this input (use a nonsingular family, e.g. nonsingular_values(p, d))")
        z = torch.linalg.solve_triangular(R.transpose(-1, -2), targets, upper=False)   # Rᵀ z = L x
        a = Q @ z                                                        # least-norm a_ℓ(x_j), (b, n_j, H, n_ℓ)
        a = torch.where(nonzero[..., None, None], a, 0.0)
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]        # i − j
        column = torch.arange(n).expand(n, n)                            # j
        alpha = a.permute(0, 2, 1, 3)[:, :, column, lag.clamp(min=0)]    # α[b, h, i, j] = a^h_{i−j}(x_j)
        return torch.where(lag >= 0, alpha, 0.0)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        # y_i = Σ_h V_h Σ_j α^h_ij x_j: mix tokens with each head's coefficients, then apply V_h.
        mixed = torch.einsum("bhij,bjd->bhid", self._coefficients(X), X)
        return torch.einsum("hpd,bhid->bip", self._values(), mixed)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self._coefficients(X), self._values())

    def _sizes(self) -> dict[str, int]:
        return {"H": self.H, "N": self.ssm.N, **super()._sizes()}


# -- S4D-style SSMs ---------------------------------------------------------------


def s4d_continuous(N: int, d: int, *, init: str = "lin", p: int | None = None,
                   seed: Any = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The continuous-time system (A_c, B_c, C) behind `s4d_ssm` (same arguments, same matrices).

    "lin": A_c has the blocks [[−½, −πm], [πm, −½]], m = 1..⌊N/2⌋ (eigenvalues −½ ± iπm),
    plus −½ if N is odd; "real": A_c = diag(−1, …, −N).  B_c and C have iid N(0, 1/d)
    and N(0, 1/N) entries from numpy's default_rng(seed), drawn in that order.  They do
    not depend on the spectral radius: `s4d_ssm` changes only the step Δ with ρ.

    Args:
        N: state size, >= 1.  d: input width.  init: "lin" or "real".
        p: output width (default d).  seed: seed of B_c and C.

    Returns:
        (A_c (N, N), B_c (N, d), C (p, N)), float64 numpy arrays.
    """
    N, d = check_int(N, "N"), check_int(d, "d")
    p = d if p is None else check_int(p, "p")
    init = check_choice(init, "init", ("lin", "real"))
    A_c = np.zeros((N, N))
    if init == "lin":
        for m in range(1, N // 2 + 1):
            k = 2 * (m - 1)
            A_c[k:k + 2, k:k + 2] = [[-0.5, -math.pi * m], [math.pi * m, -0.5]]
        if N % 2:
            A_c[-1, -1] = -0.5
    else:
        A_c[np.arange(N), np.arange(N)] = -np.arange(1, N + 1)
    rng = np.random.default_rng(seed)
    B_c = rng.standard_normal((N, d)) / math.sqrt(d)
    C = rng.standard_normal((p, N)) / math.sqrt(N)
    return A_c, B_c, C


def s4d_step(spectral_radius: float, init: str = "lin") -> float:
    """The ZOH step Δ that gives `s4d_ssm` the spectral radius ρ: −2 ln ρ ("lin") or −ln ρ ("real")."""
    rho = check_real(spectral_radius, "spectral_radius")
    if not 0 < rho < 1:
        raise ValueError(f"spectral_radius must satisfy 0 < spectral_radius < 1; got {rho}")
    init = check_choice(init, "init", ("lin", "real"))
    return (-2 if init == "lin" else -1) * math.log(rho)


def s4d_ssm(N: int, d: int, spectral_radius: float, *, init: str = "lin", p: int | None = None,
            seed: Any = 0, dtype: Any = torch.float64) -> LinearSSM:
    """An S4D-style diagonal SSM, discretised by ZOH, with ρ(A) = spectral_radius.

    Continuous eigenvalues (Gu et al. 2022, "On the parameterization and
    initialization of diagonal state space models"):

        "lin":  λ_m = −½ ± iπm, m = 1..⌊N/2⌋, plus −½ if N is odd;
        "real": λ_m = −(m + 1), m = 0..N−1.

    ZOH gives eigenvalues exp(Δλ_m); the step Δ is chosen so that the largest
    modulus is ρ: Δ = −2 ln ρ for "lin" (every |exp(Δλ_m)| = ρ), Δ = −ln ρ for
    "real" (`s4d_step`).  So ρ sets the step: the lags are samples
    L_ℓ = C e^{ℓΔ A_c} B_Δ of one continuous impulse response at spacing Δ, and a
    sequence of n steps covers the time T = nΔ.  A_c is in real block form
    (`s4d_continuous`), so A, B, C are real.  B_c, C have iid N(0, 1/d) and N(0, 1/N)
    entries.  Deviation from S4D: the lin modes start at m = 1 (S4D's m = 0 mode is
    real; in real form its pair would repeat an eigenvalue), and there is no D skip term.

    Args:
        N: state size (real), >= 1.
        d: input width.
        spectral_radius: ρ, 0 < ρ < 1.
        init: "lin" or "real".
        p: output width (default d).
        seed: seed of numpy's default_rng for B_c and C.
        dtype: computation dtype (default float64).

    Returns:
        LinearSSM with N states.
    """
    step = s4d_step(spectral_radius, init)
    A_c, B_c, C = s4d_continuous(N, d, init=init, p=p, seed=seed)
    return LinearSSM.from_continuous(A_c, B_c, C, step, "zoh", dtype=resolve_dtype(dtype))


def _phi2(z: np.ndarray) -> np.ndarray:
    # (e^z − 1 − z)/z², with its Taylor series near 0 (no cancellation).
    z = np.asarray(z, dtype=np.complex128)
    out = np.empty_like(z)
    small = np.abs(z) < 1e-2
    zs = z[small]
    out[small] = 0.5 + zs / 6 + zs ** 2 / 24 + zs ** 3 / 120 + zs ** 4 / 720
    zb = z[~small]
    out[~small] = (np.expm1(zb) - zb) / zb ** 2
    return out


def continuous_head_errors(A_c: Any, B_c: Any, C: Any, T: float, H_max: int) -> np.ndarray:
    """Σ_{r>H} λ_r(Γ_T), H = 0..H_max: the continuous-time limit of the least errors of H heads.

    Γ_T = ∫_0^T (1 − t/T) vec K(t) vec K(t)ᵀ dt for the impulse response
    K(t) = C e^{t A_c} B_c on a window of length T.  By
    {prf:ref}`prop-heads-needed-continuous-limit`, for the ZOH discretisation with step
    Δ = T/n, GᵀG/(nΔ) → Γ_T as n → ∞, so the relative least errors
    optimal_head_errors[H]/optimal_head_errors[0] tend to the ratios of these tails.
    Computed in closed form for diagonalisable A_c = Σ_m μ_m v_m w_mᵀ (no time grid):
    K(t) = Σ_m e^{μ_m t} R_m with R_m = C v_m w_mᵀ B_c, and

        Γ_T = Σ_{m,m'} φ_T(μ_m + μ̄_m') vec R_m vec R̄_m'ᵀ,
        φ_T(a) = ∫_0^T (1 − t/T) e^{at} dt = T (e^{aT} − 1 − aT)/(aT)².

    The eigenvalues come from numpy.linalg.eigvalsh (absolute accuracy ~1e-16 of the
    largest), so tails below ~1e-13 of the total are not resolved.

    Args:
        A_c: shape (N, N), diagonalisable with distinct eigenvalues.  B_c: (N, d).  C: (p, N).
        T: window length, > 0.
        H_max: largest head count, >= 0.

    Returns:
        numpy array of shape (H_max + 1,), non-increasing, entry 0 = trace Γ_T.
    """
    dims: dict[str, int] = {}
    arrays = []
    for value, name, shape in ((A_c, "A_c", ("N", "N")), (B_c, "B_c", ("N", "d")), (C, "C", ("p", "N"))):
        tensor, _ = as_real_tensor(value, name, dtype=torch.float64)
        check_shape(tensor, name, shape, dims)
        arrays.append(tensor.numpy())
    A_c, B_c, C = arrays
    T, H_max = check_real(T, "T", positive=True), check_int(H_max, "H_max", minimum=0)
    mu, R, left = _modes(A_c, "A_c", 1e-8, 1e8)
    residues = np.einsum("pm,md->mpd", C @ R, left @ B_c).reshape(len(mu), -1)   # rows vec R_m
    P = T * _phi2((mu[:, None] + mu.conj()[None, :]) * T)
    gamma = residues.T @ P @ residues.conj()
    eigenvalues = np.clip(np.linalg.eigvalsh(((gamma + gamma.conj().T) / 2).real)[::-1], 0.0, None)
    return _tail_energies(np.sqrt(eigenvalues), H_max)
