"""How many heads an LTI SSM needs: exact head count, optimal truncations, the map-level loophole.

A linear SSM with lags L_ℓ = C A^ℓ B ({prf:ref}`def-lag-operators`) acts on length-n
sequences through L_0..L_{n−1} only.  Stack them as the rows of the n × pd *lag
matrix* M (row ℓ = vec(L_ℓ)); its rank is the lag span dimension k
({prf:ref}`def-lag-span`).  Everything here is computed from the lags — O(n p d N)
work and O(n p d) memory — never from the n × n × p × d operator:

- `min_heads`: k, the least number of heads of a factorized model that
  represents the SSM ({prf:ref}`thm-head-count`);
- `heads_from_ssm`: the k-head construction (a basis of the lag span as values,
  coordinates of the lags as relative-position coefficients);
- `optimal_head_errors`, `truncated_heads`, `heads_needed`: the best H-head model
  in mean square under Gaussian tokens ({prf:ref}`thm-approx-head-count`), from
  the singular values of the weighted lag matrix G (row ℓ = √(n−ℓ) vec(L_ℓ));
- `population_error`: Σ_i E‖y_i − ŷ_i‖² between two lag kernels, in closed form;
- `TokenDependentHeads`: two heads with token-dependent coefficients that
  reproduce any 2 × 2 SSM's outputs ({prf:ref}`prop-map-level-two-heads`);
- `s4d_ssm`: S4D-style diagonal SSMs with a chosen spectral radius.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ._validation import as_real_tensor, check_choice, check_int, check_real, check_rtol, resolve_dtype
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
    "TokenDependentHeads",
    "s4d_ssm",
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
    """Least H whose optimal relative error is ≤ eps: optimal_head_errors[H] ≤ eps · optimal_head_errors[0].

    The approximate head count of {prf:ref}`thm-approx-head-count`: the number of
    heads a factorized model with input-independent coefficients needs to
    reproduce the SSM to relative mean-square error eps on length-n sequences.

    Args:
        ssm: a LinearSSM.
        n: sequence length.
        eps: relative tolerance on the squared error, 0 < eps < 1.

    Returns:
        H in 0..min(n, p·d) (0 if all lags vanish).
    """
    ssm, n = _check_ssm(ssm), check_int(n, "n")
    eps = check_real(eps, "eps")
    if not 0 < eps < 1:
        raise ValueError(f"eps must satisfy 0 < eps < 1; got {eps}")
    sigma = _lag_span(ssm, n, weighted=True).singular_values
    errors = _tail_energies(sigma, len(sigma))
    return int(np.argmax(errors <= eps * errors[0]))


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


# -- the map-level counterexample -----------------------------------------------

_J = ((0.0, -1.0), (1.0, 0.0))  # rotation by 90°: ⟨x, Jx⟩ = 0 and ‖Jx‖ = ‖x‖


class TokenDependentHeads(SequenceMap):
    """Two heads, V_1 = I and V_2 = J, whose token-dependent coefficients reproduce any 2 × 2 SSM.

    Implements the construction of {prf:ref}`prop-map-level-two-heads`.  For a
    token x ≠ 0 in ℝ², {x, Jx} is an orthogonal basis with ‖Jx‖ = ‖x‖, so every
    vector L x is a x + b Jx with a = ⟨Lx, x⟩/‖x‖², b = ⟨Lx, Jx⟩/‖x‖².  With

        α^1_ij(X) = ⟨L_{i−j} x_j, x_j⟩ / ‖x_j‖²,   α^2_ij(X) = ⟨L_{i−j} x_j, J x_j⟩ / ‖x_j‖²

    for j ≤ i (0 for j > i or x_j = 0), y_i = Σ_j (α^1_ij I + α^2_ij J) x_j =
    Σ_j L_{i−j} x_j equals the SSM's output for every X, although the operator
    blocks α^1_ij I + α^2_ij J differ from C A^{i−j} B whenever L_{i−j} is not
    in span{I, J}.  The interaction rank is at most 2 while k can be 4: the
    head count of {prf:ref}`thm-head-count` is about operators, not input–output maps.

    Args:
        ssm: a LinearSSM with p = d = 2 (any N).

    The model computes in the SSM's dtype and accepts any sequence length.
    """

    def __init__(self, ssm: LinearSSM) -> None:
        ssm = _check_ssm(ssm)
        if (ssm.p, ssm.d) != (2, 2):
            raise ValueError(f"ssm must have p = d = 2; got p = {ssm.p}, d = {ssm.d}")
        self.ssm = ssm
        super().__init__(2, 2, ssm.dtype)

    def values(self) -> np.ndarray:
        """The value maps (I, J), shape (2, 2, 2)."""
        return self._values().numpy()

    def coefficients(self, X: Any) -> torch.Tensor | np.ndarray:
        """α^h_ij(X), shape (2, n, n) or (b, 2, n, n); zero for j > i and for zero tokens."""
        return self._apply(self._coefficients, X)

    def _values(self) -> torch.Tensor:
        return torch.stack([torch.eye(2, dtype=self.dtype), torch.tensor(_J, dtype=self.dtype)])

    def _coefficients(self, X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        lags = torch.as_tensor(self.ssm.lags(n), dtype=self.dtype)
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        L = lags[lag.clamp(min=0)]                                  # L_{i−j}, (n, n, 2, 2)
        image = torch.einsum("ijpd,bjd->bijp", L, X)                # L_{i−j} x_j
        V = self._values()
        inner = torch.einsum("bijp,hpd,bjd->bhij", image, V, X)    # ⟨L x_j, V_h x_j⟩
        norm2 = (X * X).sum(-1)[:, None, None, :]                   # ‖x_j‖², broadcast over h, i
        keep = (lag >= 0) & (norm2 > 0)
        return torch.where(keep, inner / torch.where(norm2 > 0, norm2, 1.0), 0.0)

    def _forward(self, X: torch.Tensor) -> torch.Tensor:
        # y_i = Σ_h V_h Σ_j α^h_ij x_j: mix tokens with each head's coefficients, then apply V_h.
        mixed = torch.einsum("bhij,bjd->bhid", self._coefficients(X), X)
        return torch.einsum("hpd,bhid->bip", self._values(), mixed)

    def _operator(self, X: torch.Tensor) -> torch.Tensor:
        return factorized_operator(self._coefficients(X), self._values())

    def _sizes(self) -> dict[str, int]:
        return {"H": 2, "N": self.ssm.N, **super()._sizes()}


# -- S4D-style SSMs ---------------------------------------------------------------


def s4d_ssm(N: int, d: int, spectral_radius: float, *, init: str = "lin", p: int | None = None,
            seed: Any = 0, dtype: Any = torch.float64) -> LinearSSM:
    """An S4D-style diagonal SSM, discretised by ZOH, with ρ(A) = spectral_radius.

    Continuous eigenvalues (Gu et al. 2022, "On the parameterization and
    initialization of diagonal state space models"):

        "lin":  λ_m = −½ ± iπm, m = 1..⌊N/2⌋, plus −½ if N is odd;
        "real": λ_m = −(m + 1), m = 0..N−1.

    ZOH gives eigenvalues exp(Δλ_m); the step Δ is chosen so that the largest
    modulus is ρ: Δ = −2 ln ρ for "lin" (every |exp(Δλ_m)| = ρ), Δ = −ln ρ for
    "real".  A_c is in real block form ([[−½, −πm], [πm, −½]] per pair), so A, B, C
    are real.  B_c, C have iid N(0, 1/d) and N(0, 1/N) entries.  Deviation from
    S4D: the lin modes start at m = 1 (S4D's m = 0 mode is real; in real form its
    pair would repeat an eigenvalue), and there is no D skip term.

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
    N, d = check_int(N, "N"), check_int(d, "d")
    p = d if p is None else check_int(p, "p")
    rho = check_real(spectral_radius, "spectral_radius")
    if not 0 < rho < 1:
        raise ValueError(f"spectral_radius must satisfy 0 < spectral_radius < 1; got {rho}")
    init = check_choice(init, "init", ("lin", "real"))
    A_c = np.zeros((N, N))
    if init == "lin":
        for m in range(1, N // 2 + 1):
            k = 2 * (m - 1)
            A_c[k:k + 2, k:k + 2] = [[-0.5, -math.pi * m], [math.pi * m, -0.5]]
        if N % 2:
            A_c[-1, -1] = -0.5
        step = -2 * math.log(rho)
    else:
        A_c[np.arange(N), np.arange(N)] = -np.arange(1, N + 1)
        step = -math.log(rho)
    rng = np.random.default_rng(seed)
    B_c = rng.standard_normal((N, d)) / math.sqrt(d)
    C = rng.standard_normal((p, N)) / math.sqrt(N)
    return LinearSSM.from_continuous(A_c, B_c, C, step, "zoh", dtype=resolve_dtype(dtype))
