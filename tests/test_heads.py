"""Head counts of LTI SSMs (lib.heads): exact construction, optimal truncation, map-level loophole.

Expected values are computed independently with numpy: lags C A^ℓ B from
numpy.linalg.matrix_power, the explicit stack of all operator blocks for pairs
j ≤ i, ranks with numpy.linalg.matrix_rank, minimal-polynomial degrees from
Krylov matrices, best-subspace errors by alternating least squares.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import LinearSSM, RelativeHeads, apply_operator, interaction_rank, relative_error
from lib.spans import pointwise_witness
from lib.heads import (
    TokenDependentHeads,
    cayley_dickson_values,
    complex_values,
    composition_defect,
    continuous_head_errors,
    fit_heads,
    heads_from_ssm,
    heads_needed,
    lag_energy_count,
    lag_matrix,
    map_head_bounds,
    min_heads,
    modal_lag_span_dimension,
    nonsingular_dimension_bounds,
    nonsingular_values,
    optimal_head_errors,
    pointwise_lag_rank,
    polynomial_values,
    population_error,
    s4d_continuous,
    s4d_ssm,
    s4d_step,
    sampled_head_errors,
    single_head_witness,
    singular_token,
    token_dependent_single_head,
    token_matrix,
    token_miss,
    truncated_heads,
    worst_conditioned_tokens,
)

# -- independent references ---------------------------------------------------------


def lags_np(ssm, n):
    """C A^ℓ B, ℓ = 0..n−1, shape (n, p, d), with explicit matrix powers."""
    A, B, C = ssm.A, ssm.B, ssm.C
    return np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(n)])


def blocks_np(ssm, n):
    """All operator blocks 𝒲_ij = C A^{i−j} B for 0 ≤ j ≤ i < n, as rows vec(𝒲_ij): (n(n+1)/2, pd)."""
    L = lags_np(ssm, n)
    return np.stack([L[i - j].ravel() for i in range(n) for j in range(i + 1)])


def operator_np(ssm, n):
    """The full causal operator (n, n, p, d) from explicit powers."""
    L = lags_np(ssm, n)
    W = np.zeros((n, n, ssm.p, ssm.d))
    for i in range(n):
        for j in range(i + 1):
            W[i, j] = L[i - j]
    return W


def rank_np(M, rtol=1e-10):
    sigma_max = np.linalg.norm(M, 2) if M.size else 0.0
    return 0 if sigma_max == 0 else int(np.linalg.matrix_rank(M, tol=rtol * sigma_max))


def minpoly_degree(A):
    """deg of A's minimal polynomial = rank of the Krylov matrix [vec(I), vec(A), …, vec(A^N)]."""
    N = len(A)
    K = np.stack([np.linalg.matrix_power(A, j).ravel() for j in range(N + 1)], axis=1)
    return int(np.linalg.matrix_rank(K, tol=1e-9 * np.linalg.norm(K, 2)))


def best_subspace_error_als(rows, H, iterations=400, seed=0):
    """min over H-dim subspaces of Σ_rows dist², by alternating least squares (no SVD)."""
    if H == 0:
        return float((rows ** 2).sum())
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((H, rows.shape[1]))
    for _ in range(iterations):
        coeff = np.linalg.lstsq(V.T, rows.T, rcond=None)[0].T   # rows ≈ coeff V
        V = np.linalg.lstsq(coeff, rows, rcond=None)[0]
    return float(((rows - coeff @ V) ** 2).sum())


def ssm_from(A, B, C):
    return LinearSSM(np.asarray(A, float), np.asarray(B, float), np.asarray(C, float))


def _rng_ssm(N, d, p, seed, A):
    rng = np.random.default_rng(seed)
    return ssm_from(A, rng.standard_normal((N, d)), rng.standard_normal((p, N)))


def _jordan(lam, N):
    return lam * np.eye(N) + np.eye(N, k=1)


def _shift(N):
    return np.eye(N, k=-1)


ADVERSARIAL = {
    "repeated eigenvalues": (_rng_ssm(4, 2, 2, 1, np.diag([0.5, 0.5, 0.5, -0.3])), 12),
    "jordan block": (_rng_ssm(4, 2, 3, 2, _jordan(0.7, 4)), 12),
    "N > pd": (_rng_ssm(10, 2, 2, 3, LinearSSM.random(10, 1, 1, spectral_radius=0.9, seed=3).A), 16),
    "n < N": (LinearSSM.random(8, 3, 3, seed=4), 3),
    "nilpotent": (_rng_ssm(5, 2, 2, 5, _shift(5)), 12),
    "B = 0 (k = 0)": (ssm_from(0.5 * np.eye(3), np.zeros((3, 2)), np.ones((2, 3))), 6),
    "C = 0 (k = 0)": (ssm_from(0.5 * np.eye(3), np.ones((3, 2)), np.zeros((2, 3))), 6),
    "p != d (1 x 4)": (LinearSSM.random(5, 4, 1, seed=6), 10),
    "p != d (3 x 1)": (LinearSSM.random(5, 1, 3, seed=7), 10),
    "N = 1": (LinearSSM.random(1, 2, 2, seed=8), 7),
    "n = 1": (LinearSSM.random(4, 2, 2, seed=9), 1),
    "damped rotation": (LinearSSM.damped_rotation(0.9, 0.7), 10),
}


# -- thm-head-count ---------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ADVERSARIAL))
def test_thm_head_count_construction_is_exact_on_adversarial_ssms(case):
    ssm, n = ADVERSARIAL[case]
    k = rank_np(blocks_np(ssm, n))
    model = heads_from_ssm(ssm, n)
    assert isinstance(model, RelativeHeads)
    assert model.H == k == min_heads(ssm, n)
    X = np.random.default_rng(0).standard_normal((3, n, ssm.d))
    W = operator_np(ssm, n)
    np.testing.assert_allclose(model.operator(X[0]), W, rtol=0, atol=1e-13 * max(1.0, np.abs(W).max()))
    Y = np.einsum("ijpd,bjd->bip", W, X)
    assert relative_error(model(X), Y) < 1e-12 if k else np.abs(model(X)).max() == 0
    assert relative_error(model(X), ssm(X)) < 1e-12 if k else np.abs(ssm(X)).max() == 0
    # Shorter sequences are represented too (the lags of a prefix are a prefix).
    assert relative_error(model(X[:, : max(1, n // 2)]), ssm(X[:, : max(1, n // 2)])) < 1e-12 or k == 0


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 6), d=st.integers(1, 3), p=st.integers(1, 3), n=st.integers(1, 12),
       radius=st.sampled_from([0.3, 0.7, 0.95]), seed=st.integers(0, 10_000))
def test_thm_head_count_construction_is_exact_on_random_ssms(N, d, p, n, radius, seed):
    ssm = LinearSSM.random(N, d, p, spectral_radius=radius, seed=seed)
    M = blocks_np(ssm, n)
    k = rank_np(M)
    model = heads_from_ssm(ssm, n)
    assert model.H == k == min_heads(ssm, n)
    # V_h orthonormal in the Frobenius inner product.
    V = model.V.reshape(k, -1)
    np.testing.assert_allclose(V @ V.T, np.eye(k), atol=1e-12)
    X = np.random.default_rng(seed).standard_normal((2, n, d))
    assert relative_error(model(X), ssm(X)) < 1e-11
    assert relative_error(model.operator(X[0]), operator_np(ssm, n)) < 1e-11


def test_thm_head_count_coefficients_are_lag_coordinates():
    ssm, n = LinearSSM.random(3, 2, 2, seed=0), 15
    model = heads_from_ssm(ssm, n)
    L = lags_np(ssm, n)
    expected = np.einsum("lpd,hpd->hl", L, model.V)  # c[h, ℓ] = ⟨L_ℓ, V_h⟩_F
    np.testing.assert_allclose(model.coefficients, expected, atol=1e-13)
    np.testing.assert_allclose(np.einsum("hl,hpd->lpd", model.coefficients, model.V), L, atol=1e-13)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thm_head_count_fewer_heads_never_exact(seed):
    N, d, p, n = 4, 2, 2, 10
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.8, seed=seed)
    rows = blocks_np(ssm, n)
    k = rank_np(rows)
    assert k == min_heads(ssm, n) == 4
    errors = optimal_head_errors(ssm, n, k)
    best = best_subspace_error_als(rows, k - 1)            # independent of lib: ALS on all blocks
    assert errors[k - 1] > 1e-6 * errors[0]               # strictly positive: not exact
    assert errors[k - 1] == pytest.approx(best, rel=1e-6)
    # Every (k−1)-head model misses: its operator has interaction rank <= k−1 < k.
    X = np.random.default_rng(seed).standard_normal((n, d))
    for model in (truncated_heads(ssm, n, k - 1), RelativeHeads.random(k - 1, n, d, p, seed=seed)):
        assert interaction_rank(model, X) <= k - 1 < interaction_rank(ssm, X)
        assert population_error(ssm, model, n) >= errors[k - 1] * (1 - 1e-10)


# -- prop-lag-span-bound ----------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ADVERSARIAL))
def test_prop_lag_span_bound_on_adversarial_ssms(case):
    ssm, n = ADVERSARIAL[case]
    k = min_heads(ssm, n)
    assert k == rank_np(np.stack([x.ravel() for x in lags_np(ssm, n)]))
    assert k <= min(minpoly_degree(ssm.A), n, ssm.p * ssm.d)


def test_prop_lag_span_bound_is_attained_by_each_term():
    # deg minpoly binds: repeated eigenvalue, N = 4 but minpoly degree 2.
    ssm = _rng_ssm(4, 3, 3, 0, np.diag([0.6, 0.6, -0.4, -0.4]))
    assert minpoly_degree(ssm.A) == 2 and min_heads(ssm, 10) == 2
    # n binds: short sequences.
    assert min_heads(LinearSSM.random(6, 3, 3, seed=1), 2) == 2
    # pd binds: many states, small widths.
    assert min_heads(LinearSSM.random(9, 2, 2, seed=2), 20) == 4
    # Nilpotent of index 3: only L_0, L_1, L_2 are non-zero.
    assert min_heads(_rng_ssm(3, 3, 3, 3, _shift(3)), 10) == 3


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 7), d=st.integers(1, 3), p=st.integers(1, 3), n=st.integers(1, 10),
       seed=st.integers(0, 10_000))
def test_prop_lag_span_bound_random(N, d, p, n, seed):
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.8, seed=seed)
    k = min_heads(ssm, n)
    assert k == rank_np(np.stack([x.ravel() for x in lags_np(ssm, n)]))
    assert k <= min(minpoly_degree(ssm.A), n, p * d)


# -- thm-approx-head-count --------------------------------------------------------------------


@pytest.mark.parametrize("N, d, p, n", [(4, 2, 2, 8), (5, 3, 1, 7), (3, 1, 2, 9)])
def test_thm_approx_head_count_matches_brute_force_least_squares(N, d, p, n):
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=N + n)
    rows = blocks_np(ssm, n)                                # every block 𝒲_ij, j ≤ i
    sigma = np.linalg.svd(rows, compute_uv=False)
    errors = optimal_head_errors(ssm, n, p * d + 1)
    assert errors.shape == (p * d + 2,)
    for H in range(p * d + 2):
        # Eckart–Young on the explicit block stack, and ALS: two independent references.
        assert errors[H] == pytest.approx((sigma[H:] ** 2).sum(), rel=1e-9, abs=1e-12 * errors[0])
        assert errors[H] == pytest.approx(best_subspace_error_als(rows, H), rel=1e-6, abs=1e-10 * errors[0])
        # The truncated relative-position model attains the optimum.
        model = truncated_heads(ssm, n, H)
        W = model.operator(np.zeros((n, d)))
        explicit = sum(((W[i, j] - operator_np(ssm, n)[i, j]) ** 2).sum() for i in range(n) for j in range(i + 1))
        assert explicit == pytest.approx(errors[H], rel=1e-9, abs=1e-12 * errors[0])
        assert population_error(ssm, model, n) == pytest.approx(errors[H], rel=1e-9, abs=1e-12 * errors[0])
    assert np.all(np.diff(errors) <= 1e-12 * errors[0])


@pytest.mark.parametrize("tokens", ["gaussian", "rademacher"])
def test_thm_approx_head_count_monte_carlo_per_head_count(tokens):
    # Σ_i E‖y_i − ŷ_i‖² sampled on Gaussian and on Rademacher tokens (E[x xᵀ] = I for both) agrees
    # with the closed form for every H < k, relative to that H's own error, within 4 standard errors,
    # and the standard error is small enough (< 0.5 %) that a 2 % error in the closed form would show.
    ssm, n = LinearSSM.random(5, 3, 2, spectral_radius=0.9, seed=11), 10
    k = min_heads(ssm, n)
    closed = optimal_head_errors(ssm, n, k)
    sampled = sampled_head_errors(ssm, n, range(k + 1), 40_000, tokens=tokens, seed=1)
    for H in range(k):
        assert abs(sampled.mean[H] - closed[H]) < 4 * sampled.stderr[H]
        assert sampled.stderr[H] < 0.005 * closed[H]
    assert sampled.mean[k] < 1e-20 * closed[0]           # exact from k heads on


def test_sampled_head_errors_estimates_a_hand_computed_mean():
    # One head, one lag: y = x (n = 1, p = d = 1) and the zero model: E y² = 1 exactly, for either token law.
    ssm = ssm_from([[0.0]], [[1.0]], [[1.0]])
    for tokens in ("gaussian", "rademacher"):
        sampled = sampled_head_errors(ssm, 1, [0], 20_000, tokens=tokens, seed=2)
        assert abs(sampled.mean[0] - 1.0) < 4 * sampled.stderr[0] + (1e-12 if tokens == "rademacher" else 0)
    assert sampled_head_errors(ssm, 1, [0], 50, tokens="rademacher").stderr[0] == 0.0   # x² = 1 always


@pytest.mark.parametrize("method", ["lbfgs", "als"])
def test_thm_approx_head_count_optimiser_finds_the_closed_form(method):
    # An optimiser over all input-independent H-head models (any α_ij, causal or not; dense operator,
    # no SVD) stops at Σ_{r>H} σ_r(G)² to ~1e-10 relative, and never below it.
    for ssm, n in [(LinearSSM.random(4, 3, 3, spectral_radius=0.8, seed=100), 12),
                   (LinearSSM.damped_rotation(0.9, 0.6), 16), (LinearSSM.random(5, 2, 3, seed=2), 10)]:
        k = min_heads(ssm, n)
        closed = optimal_head_errors(ssm, n, k)
        for H in range(k):
            fit = fit_heads(ssm, n, H, method=method, restarts=1, seed=H)
            assert fit.error >= closed[H] * (1 - 1e-12)
            assert fit.error == pytest.approx(closed[H], rel=1e-9)
            # The returned parameters have the returned error (recomputed on the dense operator).
            W = operator_np(ssm, n)
            W_hat = np.einsum("hij,hpd->ijpd", fit.coefficients, fit.V)
            assert ((W - W_hat) ** 2).sum() == pytest.approx(fit.error, rel=1e-9, abs=1e-12 * closed[0])
        assert fit_heads(ssm, n, k, method=method, restarts=1).error <= 1e-18 * closed[0]


def test_fit_heads_returns_every_restart_and_the_zero_model():
    ssm, n = LinearSSM.random(3, 2, 2, seed=1), 8
    fit = fit_heads(ssm, n, 1, restarts=4, seed=3)
    assert fit.restart_errors.shape == (4,) and fit.error == fit.restart_errors.min()
    assert fit.V.shape == (1, 2, 2) and fit.coefficients.shape == (1, n, n)
    zero = fit_heads(ssm, n, 0)
    assert zero.error == pytest.approx((operator_np(ssm, n) ** 2).sum(), rel=1e-12)


def test_fit_heads_on_vanishing_lags_returns_the_exact_zero_model():
    # All lags zero (B = 0): every H-head model with zero values is exact; no optimiser runs (no 0/0).
    ssm = ssm_from(0.5 * np.eye(3), np.zeros((3, 2)), np.ones((2, 3)))
    for method in ("lbfgs", "als"):
        fit = fit_heads(ssm, 6, 2, method=method, restarts=2)
        assert fit.error == 0.0 and np.all(fit.restart_errors == 0.0)
        assert fit.V.shape == (2, 2, 2) and fit.coefficients.shape == (2, 6, 6)
        assert np.all(np.isfinite(fit.V)) and np.all(np.isfinite(fit.coefficients))


def test_thm_approx_head_count_zero_exactly_from_k_heads():
    ssm, n = LinearSSM.random(3, 2, 2, seed=5), 12
    errors = optimal_head_errors(ssm, n, 6)
    k = min_heads(ssm, n)
    assert np.all(errors[:k] > 1e-8 * errors[0]) and np.all(errors[k:] <= 1e-24 * errors[0])
    assert errors[0] == pytest.approx(sum((n - ell) * (L ** 2).sum() for ell, L in enumerate(lags_np(ssm, n))))
    assert truncated_heads(ssm, n, 6).H == k     # extra heads are not materialised


# -- prop-covariance-head-count -----------------------------------------------------------------


def weighted_blocks_np(ssm, n, S):
    """Rows vec(𝒲_ij S) for all 0 ≤ j ≤ i < n, with any factor S (d × r) of Σ = S Sᵀ."""
    L = lags_np(ssm, n)
    return np.stack([(L[i - j] @ S).ravel() for i in range(n) for j in range(i + 1)])


def covariance_case(seed, d, r):
    """A random Σ = S Sᵀ of rank min(r, d) with a non-symmetric factor S (d × r)."""
    S = np.random.default_rng(seed).standard_normal((d, r))
    return S @ S.T, S


@pytest.mark.parametrize("N, d, p, n, r", [(4, 3, 2, 8, 2), (5, 3, 2, 7, 3), (3, 2, 3, 9, 1), (4, 3, 2, 6, 5)])
def test_prop_covariance_head_count_matches_dense_least_squares_with_any_factor(N, d, p, n, r):
    # Eckart–Young on every block times a factor S of Σ (not Σ^{1/2}), ALS on the same rows, and the error
    # of the constructed model computed block by block from Σ itself: three routes to the closed form.
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=N + n + r)
    Sigma, S = covariance_case(n + r, d, r)
    rows = weighted_blocks_np(ssm, n, S)
    sigma = np.linalg.svd(rows, compute_uv=False)
    errors = optimal_head_errors(ssm, n, p * d, covariance=Sigma)
    W = operator_np(ssm, n)
    for H in range(p * d + 1):
        floor = 1e-12 * errors[0]
        assert errors[H] == pytest.approx((sigma[H:] ** 2).sum(), rel=1e-9, abs=floor)
        assert errors[H] == pytest.approx(best_subspace_error_als(rows, H), rel=1e-6, abs=1e-10 * errors[0])
        model = truncated_heads(ssm, n, H, covariance=Sigma)
        E = W - model.operator(np.zeros((n, d)))
        explicit = sum(np.trace(E[i, j] @ Sigma @ E[i, j].T) for i in range(n) for j in range(i + 1))
        assert explicit == pytest.approx(errors[H], rel=1e-9, abs=floor)
        assert population_error(ssm, model, n, covariance=Sigma) == pytest.approx(errors[H], rel=1e-9, abs=floor)
    # Zero exactly from rank G_Σ = rank of the rows on; rank G_Σ <= min(p r, k).
    rank = rank_np(rows)
    assert rank <= min(p * min(r, d), min_heads(ssm, n))
    assert np.all(errors[:rank] > 1e-8 * errors[0]) and np.all(errors[rank:] <= 1e-20 * errors[0])


def test_prop_covariance_head_count_optimiser_stops_at_the_closed_form():
    # L-BFGS over all input-independent H-head models (dense operator, no SVD) on the blocks 𝒲_ij S:
    # the SSM (A, BS, C) has exactly those blocks.  It never goes below the closed form and reaches it.
    ssm, n = LinearSSM.random(4, 3, 2, spectral_radius=0.85, seed=21), 9
    Sigma, S = covariance_case(5, 3, 2)
    closed = optimal_head_errors(ssm, n, 4, covariance=Sigma)
    seen = LinearSSM(ssm.A, ssm.B @ S, ssm.C)
    for H in range(4):
        fit = fit_heads(seen, n, H, restarts=2, seed=H)
        assert fit.error >= closed[H] * (1 - 1e-12)
        assert fit.error == pytest.approx(closed[H], rel=1e-9)


def test_prop_covariance_head_count_identity_and_scaling():
    ssm, n = LinearSSM.random(5, 3, 2, seed=2), 11
    base = optimal_head_errors(ssm, n, 6)
    np.testing.assert_allclose(optimal_head_errors(ssm, n, 6, covariance=np.eye(3)), base, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(optimal_head_errors(ssm, n, 6, covariance=4.0 * np.eye(3)), 4 * base, rtol=1e-10,
                               atol=1e-14)
    assert heads_needed(ssm, n, 1e-3, covariance=np.eye(3)) == heads_needed(ssm, n, 1e-3)
    # A covariance that weights one input direction changes which heads are best, and never helps the
    # white-token truncation: it is scored at or above the optimum under Σ.
    Sigma = np.diag([100.0, 1.0, 0.01])
    closed = optimal_head_errors(ssm, n, 6, covariance=Sigma)
    white = [population_error(ssm, truncated_heads(ssm, n, H), n, covariance=Sigma) for H in range(6)]
    assert all(w >= c * (1 - 1e-12) for w, c in zip(white, closed))
    assert max(w / c for w, c in zip(white[1:5], closed[1:5])) > 1.5


def test_prop_covariance_head_count_singular_sigma_values_vanish_on_its_null_space():
    # V_h = W_h Σ^{+1/2}: every value map is zero on null(Σ), so it acts on range(Σ) only.
    ssm, n = LinearSSM.random(5, 3, 2, seed=4), 10
    Sigma, _ = covariance_case(8, 3, 2)
    null = np.linalg.svd(Sigma)[2][-1]
    model = truncated_heads(ssm, n, 6, covariance=Sigma)
    assert model.H == 4                                            # rank G_Σ <= p r = 4 < p d
    np.testing.assert_allclose(model.V @ null, 0.0, atol=1e-12)
    # ... and the truncation equals the SSM on inputs in range(Σ), not on the null direction.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, n, 2)) @ np.linalg.svd(Sigma)[2][:2]
    assert relative_error(model(X), ssm(X)) < 1e-10
    Z = np.zeros((1, n, 3))
    Z[0, 0] = null
    assert relative_error(model(Z), ssm(Z)) > 0.5


@pytest.mark.parametrize("law", ["gaussian", "exponential"])
def test_prop_covariance_head_count_monte_carlo_with_a_mean(law):
    # Tokens μ + S z, z iid with mean 0 and variance 1 (Gaussian, or centred exponential: skewed).  The plain
    # truncation (no bias) has error Σ_{q>H} σ_q² + Σ_i ‖Σ_{ℓ≤i} E_ℓ μ‖² (population_error with the mean), within
    # 4 standard errors; the closed form alone is below it whenever E_ℓ μ ≠ 0.
    ssm, n = LinearSSM.random(4, 3, 2, spectral_radius=0.8, seed=31), 8
    Sigma, S = covariance_case(12, 3, 3)
    mu = np.array([1.5, -2.0, 0.5])
    rng = np.random.default_rng(7)
    z = rng.standard_normal((40_000, n, 3)) if law == "gaussian" else rng.exponential(size=(40_000, n, 3)) - 1.0
    X = mu + z @ S.T
    Y = ssm(X)
    closed = optimal_head_errors(ssm, n, 6, covariance=Sigma)
    for H in (1, 2, 3):
        model = truncated_heads(ssm, n, H, covariance=Sigma)
        e = ((Y - model(X)) ** 2).sum(axis=(1, 2))
        predicted = population_error(ssm, model, n, covariance=Sigma, mean=mu)
        assert abs(e.mean() - predicted) < 4 * e.std(ddof=1) / np.sqrt(len(e))
        assert predicted > closed[H] * (1 + 1e-3)
        # The mean term by hand: Σ_i ‖Σ_{ℓ≤i} E_ℓ μ‖².
        E = lags_np(ssm, n) - np.einsum("hl,hpd->lpd", model.coefficients, model.V)
        assert predicted - closed[H] == pytest.approx((np.cumsum(E @ mu, axis=0) ** 2).sum(), rel=1e-8)


@pytest.mark.parametrize("call, error, match", [
    (lambda: optimal_head_errors(SSM, 5, 2, covariance=np.eye(3)), ValueError, r"covariance must have shape \(d, d\)"),
    (lambda: optimal_head_errors(SSM, 5, 2, covariance=np.array([[1.0, 0.5], [0.0, 1.0]])), ValueError,
     "covariance must be symmetric"),
    (lambda: optimal_head_errors(SSM, 5, 2, covariance=np.diag([1.0, -0.1])), ValueError,
     "covariance must be positive semi-definite"),
    (lambda: truncated_heads(SSM, 5, 2, covariance=np.full((2, 2), np.nan)), ValueError, "covariance must be finite"),
    (lambda: heads_needed(SSM, 5, 0.1, covariance="I"), TypeError, "covariance must be a numpy array"),
    (lambda: truncated_heads(SSM, 5, 2, covariance=np.eye(2, dtype=int)), TypeError, "covariance must have a real"),
    (lambda: population_error(SSM, SSM, 5, covariance=-np.eye(2)), ValueError, "positive semi-definite"),
    (lambda: population_error(SSM, SSM, 5, mean=np.ones(3)), ValueError, r"mean must have shape"),
])
def test_covariance_arguments_are_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_covariance_none_keeps_the_old_behaviour_bit_for_bit():
    ssm, n = LinearSSM.random(4, 2, 2, seed=9), 12
    model = truncated_heads(ssm, n, 2)
    assert population_error(ssm, model, n) == population_error(ssm, model, n, covariance=None, mean=None)
    np.testing.assert_array_equal(optimal_head_errors(ssm, n, 3), optimal_head_errors(ssm, n, 3, covariance=None))


@pytest.mark.parametrize("eps", [1e-1, 1e-3, 1e-6])
def test_heads_needed_is_least_head_count_within_tolerance(eps):
    ssm, n = LinearSSM.random(6, 2, 2, spectral_radius=0.9, seed=3), 20
    sigma = np.linalg.svd(blocks_np(ssm, n), compute_uv=False)
    tails = np.array([(sigma[H:] ** 2).sum() for H in range(len(sigma) + 1)])
    assert heads_needed(ssm, n, eps) == int(np.argmax(tails <= eps * tails[0]))


def test_lag_matrix_rows():
    ssm, n = LinearSSM.random(3, 2, 3, seed=0), 6
    L = lags_np(ssm, n)
    np.testing.assert_allclose(lag_matrix(ssm, n), L.reshape(n, -1), atol=1e-14)
    np.testing.assert_allclose(lag_matrix(ssm, n, weighted=True),
                               np.sqrt(n - np.arange(n))[:, None] * L.reshape(n, -1), atol=1e-14)


def test_long_sequences_agree_with_dense_route():
    # n = 600 exercises the FFT route of RelativeHeads; the errors agree with the explicit blocks' SVD.
    ssm, n = LinearSSM.random(6, 2, 2, spectral_radius=0.99, seed=0), 600
    X = np.random.default_rng(0).standard_normal((1, n, 2))
    assert relative_error(heads_from_ssm(ssm, n)(X), ssm(X)) < 1e-12
    m = 60
    sigma = np.linalg.svd(blocks_np(ssm, m), compute_uv=False)
    np.testing.assert_allclose(optimal_head_errors(ssm, m, 4), [(sigma[H:] ** 2).sum() for H in range(5)],
                               rtol=1e-9)


# -- thm-rank-gap and prop-map-level-two-heads ----------------------------------------------------


def test_thm_rank_gap_one_head_has_interaction_rank_one():
    ssm, n = LinearSSM.damped_rotation(0.9, 0.5), 8
    X = np.random.default_rng(0).standard_normal((2, n, 2))
    assert min_heads(ssm, n) == 2 == interaction_rank(ssm, X)
    for model in (truncated_heads(ssm, n, 1), RelativeHeads.random(1, n, 2, 2, seed=1)):
        assert interaction_rank(model, X) <= 1
        assert relative_error(model.operator(X[0]), ssm.operator(X[0])) > 1e-3


def test_thm_rank_gap_map_level_single_token_forces_collinear_lags():
    # A one-head map y_i = Σ_j α_ij(X) V x_j, fed one token u at position j, outputs
    # α V u at position i: it can match L_{i−j} u only if L_{i−j} u ∈ span{V u}.
    # For k >= 2, every V leaves some lag and some token out of reach.
    ssm, n = LinearSSM.random(3, 2, 2, seed=4), 6
    L = lags_np(ssm, n)
    assert min_heads(ssm, n) >= 2
    rng = np.random.default_rng(0)
    candidates = [truncated_heads(ssm, n, 1).V[0]] + [rng.standard_normal((2, 2)) for _ in range(20)]
    for V in candidates:
        worst = 0.0
        for u in rng.standard_normal((50, 2)):
            Vu = V @ u
            for L_ell in L:
                target = L_ell @ u
                alpha = target @ Vu / (Vu @ Vu)            # the best scalar coefficient
                worst = max(worst, np.linalg.norm(target - alpha * Vu) / np.linalg.norm(target))
        assert worst > 1e-2


RANK_GAP_SSMS = [(LinearSSM.damped_rotation(0.9, 0.6), 16), (LinearSSM.random(2, 2, 2, seed=3), 8),
                 (LinearSSM.random(4, 3, 2, spectral_radius=0.95, seed=4), 10),
                 (_rng_ssm(4, 2, 3, 2, _jordan(0.7, 4)), 8)]


@pytest.mark.parametrize("case", range(len(RANK_GAP_SSMS)))
def test_thm_rank_gap_best_single_head_found_by_optimisers_misses_by_sigma_2(case):
    # Contrapositive of thm-rank-gap: an SSM with k >= 2 (k from numpy's rank of the explicit blocks)
    # is not represented by any single head: two optimisers over all input-independent single-head
    # models stop at σ_2(G)², and σ_2(G)² is a positive fraction of the energy.
    ssm, n = RANK_GAP_SSMS[case]
    assert rank_np(blocks_np(ssm, n)) >= 2
    sigma_2_squared = optimal_head_errors(ssm, n, 1)[1]
    energy = (blocks_np(ssm, n) ** 2).sum()
    assert sigma_2_squared > 1e-4 * energy
    for method in ("lbfgs", "als"):
        assert fit_heads(ssm, n, 1, method=method, seed=case).error >= sigma_2_squared * (1 - 1e-12)


def test_thm_rank_gap_single_head_represents_every_ssm_with_k_at_most_one():
    # The other side: lags on one line (k = 1) are represented by one relative-position head exactly.
    V = np.outer([1.0, 0.5], [1.0, 2.0])
    ssm = ssm_from(np.array([[0.8]]), np.array([[1.0, 2.0]]), np.array([[1.0], [0.5]]))   # L_ℓ = 0.8^ℓ V
    np.testing.assert_allclose(lags_np(ssm, 3)[2], 0.64 * V, atol=1e-15)
    model = heads_from_ssm(ssm, 12)
    assert model.H == 1 and rank_np(np.stack([model.V[0].ravel(), V.ravel()])) == 1
    X = np.random.default_rng(0).standard_normal((2, 12, 2))
    assert relative_error(model(X), ssm(X)) < 1e-13


@pytest.mark.parametrize("case", range(len(RANK_GAP_SSMS)))
def test_thm_rank_gap_map_witness_token_defeats_every_single_head(case):
    # Contrapositive of thm-rank-gap-map, constructively: for each candidate V — including the
    # strongest ones, V = L_0 and the optimal truncated head — some lag L_ℓ is not a multiple of V,
    # pointwise_witness gives a token u, and on the input (u, 0, …, 0) the best single-head output at
    # position 1 + ℓ misses L_ℓ u.  The miss is recomputed here by least squares, not by lib.
    ssm, n = RANK_GAP_SSMS[case]
    L = lags_np(ssm, n)
    rng = np.random.default_rng(case)
    candidates = [L[0], L[1], truncated_heads(ssm, n, 1).V[0]] + list(rng.standard_normal((5, ssm.p, ssm.d)))
    for V in candidates:
        ell = next(l for l in range(n) if rank_np(np.stack([L[l].ravel(), V.ravel()])) == 2)
        u = pointwise_witness(L[ell], V)
        assert u is not None
        X = np.zeros((n, ssm.d))
        X[0] = u
        y = np.asarray(ssm(X))[ell]
        np.testing.assert_allclose(y, L[ell] @ u, atol=1e-12)
        Vu = V @ u
        best = np.linalg.lstsq(Vu[:, None], y, rcond=None)[0] if np.linalg.norm(Vu) > 1e-12 * np.linalg.norm(V) \
            else np.zeros(1)
        miss = np.linalg.norm(y - best * Vu) / np.linalg.norm(y)
        assert miss > 1e-3


# -- prop-single-head-generic-inputs ------------------------------------------------------------


def test_prop_single_head_generic_inputs_exact_on_gaussian_tokens():
    # Both sides of the rank gap for maps.  On Gaussian tokens, a single head with token-dependent
    # coefficients and V = L_0 = I computes the damped rotation exactly (causal, d = 2); on the
    # single-token inputs of thm-rank-gap-map it cannot.
    ssm, n = LinearSSM.damped_rotation(0.9, 0.6), 12
    X = np.random.default_rng(0).standard_normal((200, n, 2))
    fit = token_dependent_single_head(ssm, X, np.eye(2))
    assert fit.errors.max() <= 1e-26 * (fit.targets ** 2).sum(2).max()
    np.testing.assert_allclose(fit.targets, ssm(X), atol=0)
    # ŷ recomputed from the coefficients: y_i = V Σ_j α_ij x_j with α_ij = 0 for j > i.
    assert np.all(np.triu(fit.coefficients[0], 1) == 0)
    np.testing.assert_allclose(np.einsum("bij,bjd->bid", fit.coefficients, X), ssm(X), atol=1e-11)
    single = np.zeros((1, n, 2))
    single[0, 0] = [1.0, 0.3]
    assert fit_error(token_dependent_single_head(ssm, single, np.eye(2))) > 1e-2


def fit_error(fit):
    return float(fit.errors.sum() / (fit.targets ** 2).sum())


def test_prop_single_head_generic_inputs_causal_error_only_before_position_d():
    # d = 3: positions i >= d are exact (tokens x_1..x_i span ℝ³); positions 1, 2 carry the error
    # dist(y_i, span{x_1..x_i})², recomputed here by QR projection; non-causal: exact everywhere.
    ssm, n, d = LinearSSM.random(4, 3, 3, seed=5), 8, 3
    X = np.random.default_rng(1).standard_normal((50, n, d))
    Y = ssm(X)
    causal = token_dependent_single_head(ssm, X, np.eye(3))
    scale = (Y ** 2).sum(2).max()
    assert causal.errors[:, d - 1:].max() <= 1e-20 * scale         # squared: 1e-10 in norm
    for b in range(5):
        for i in range(d - 1):
            Q = np.linalg.qr(X[b, : i + 1].T)[0]
            assert causal.errors[b, i] == pytest.approx(((Y[b, i] - Q @ Q.T @ Y[b, i]) ** 2).sum(), rel=1e-9)
    assert causal.errors[:, : d - 1].mean() > 1e-2 * (Y[:, : d - 1] ** 2).sum(2).mean()
    non_causal = token_dependent_single_head(ssm, X, np.eye(3), causal=False)
    assert non_causal.errors.max() <= 1e-24 * scale
    # An invertible V other than the identity, and a V of rank < p (which must miss: range V ≠ ℝ³).
    V = np.random.default_rng(2).standard_normal((3, 3))
    assert token_dependent_single_head(ssm, X, V, causal=False).errors.max() <= 1e-22 * scale
    low = token_dependent_single_head(ssm, X, np.diag([1.0, 1.0, 0.0]), causal=False)
    assert low.errors.mean() > 1e-3 * (Y ** 2).sum(2).mean()


def test_prop_map_level_two_heads_reproduces_any_2x2_ssm():
    ssm, n = LinearSSM.random(4, 2, 2, seed=3), 9
    assert min_heads(ssm, n) == 4
    model = TokenDependentHeads(ssm)
    X = np.random.default_rng(1).standard_normal((3, n, 2))
    X[0, 4] = 0.0                                          # a zero token is handled
    Y = ssm(X)
    assert relative_error(model(X), Y) < 1e-12
    assert relative_error(apply_operator(model.operator(X), X), Y) < 1e-12
    assert relative_error(model.operator(X), ssm.operator(X)) > 0.1   # different operators …
    assert interaction_rank(model, X) == 2                 # … of interaction rank 2 < k = 4
    np.testing.assert_array_equal(model.values(), [np.eye(2), [[0.0, -1.0], [1.0, 0.0]]])
    # The coefficients are the coordinates of L_{i−j} x_j in the basis (x_j, J x_j).
    a = model.coefficients(X[1])
    L = lags_np(ssm, n)
    x = X[1, 2]
    np.testing.assert_allclose(L[3] @ x, a[0, 5, 2] * x + a[1, 5, 2] * np.array([-x[1], x[0]]), atol=1e-13)
    assert np.all(a[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)


def test_prop_map_level_two_heads_torch_gradients():
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    X = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    TokenDependentHeads(ssm)(X).sum().backward()
    Xs = X.detach().clone().requires_grad_(True)
    ssm(Xs).sum().backward()
    assert torch.allclose(X.grad, Xs.grad, atol=1e-12)     # the same map, so the same gradient


# -- thm-map-level-head-count, lem-odd-nonsingular, prop-nonsingular-families -----------------------

MAP_SIZES = [(2, 2), (3, 3), (4, 4), (8, 8), (2, 3), (3, 5), (2, 6), (1, 4), (4, 1), (5, 5)]


def adversarial_tokens(values, d, rng):
    # Random tokens, the worst-conditioned of many random ones, tiny and huge scales, a zero token.
    U = rng.standard_normal((4000, d))
    cond = np.linalg.cond(token_matrix(values, U))
    worst = U[np.argsort(cond)[-3:]]
    return np.concatenate([rng.standard_normal((5, d)), worst, 1e-150 * worst, 1e150 * worst[:1],
                           np.eye(d)[:1], np.zeros((1, d))])


@pytest.mark.parametrize("p, d", MAP_SIZES)
def test_thm_map_level_head_count_construction_computes_the_ssm(p, d):
    # Sufficiency: with a nonsingular family, the token-dependent heads reproduce the SSM's outputs
    # to float64 on every input tried, adversarial tokens included (each token once, at position 1 —
    # the other positions then exercise every lag on it — and mixed in random sequences).
    ssm, n = LinearSSM.random(6, d, p, spectral_radius=0.9, seed=10 * p + d), 10
    rng = np.random.default_rng(p + d)
    for family in (polynomial_values, cayley_dickson_values, complex_values):
        try:
            values = family(p, d)
        except ValueError:
            continue
        model = TokenDependentHeads(ssm, values)
        assert model.H == len(values)
        tokens = adversarial_tokens(values, d, rng)
        single = np.zeros((len(tokens), n, d))
        single[:, 0] = tokens
        mixed = rng.standard_normal((len(tokens), n, d))
        mixed[:, 3] = tokens
        for X in (single, mixed):
            Y, Y_hat = ssm(X), model(X)
            scale = np.abs(Y).max(axis=(1, 2), keepdims=True)
            scale[scale == 0] = 1.0
            assert np.abs((Y - Y_hat) / scale).max() < 1e-12, family.__name__
        assert interaction_rank(model, mixed[:3]) <= len(values)


@pytest.mark.parametrize("p, d", [(3, 3), (2, 3), (4, 4), (1, 3)])
def test_thm_map_level_head_count_fewer_than_r_star_heads_fail_at_a_token(p, d):
    # Necessity: on the input (u, 0, …, 0) an H-head model outputs Σ_h a_h V_h u at every position, so it
    # misses Σ_ℓ dist(L_ℓ u, span{V_h u})² >= Σ_{r>H} σ_r(K(u))² (Eckart–Young, computed here by numpy).
    ssm, n = LinearSSM.random(p * d + 1, d, p, spectral_radius=0.9, seed=p * d), p * d + 4
    r_star = pointwise_lag_rank(ssm, n, np.random.default_rng(0).standard_normal(d))
    assert r_star == p
    rng = np.random.default_rng(1)
    u = rng.standard_normal(d)
    K = np.einsum("lpd,d->pl", lags_np(ssm, n), u)
    sigma = np.linalg.svd(K, compute_uv=False)
    for H in range(1, r_star):
        V = rng.standard_normal((H, p, d))
        B = np.einsum("hpd,d->ph", V, u)
        residual = K - B @ np.linalg.lstsq(B, K, rcond=None)[0]
        assert (residual ** 2).sum() >= (sigma[H:] ** 2).sum() * (1 - 1e-9) > 1e-6 * (sigma ** 2).sum()


def test_thm_map_level_head_count_bounds_and_exact_cases():
    # k = pd (certified pointwise-full): H_map = ν(p, d), exact where the bounds meet.
    for (p, d), nu in {(2, 2): 2, (3, 3): 4, (2, 3): 4, (4, 4): 4, (1, 3): 3}.items():
        ssm = LinearSSM.random(p * d, d, p, spectral_radius=0.9, seed=p + d)
        bounds = map_head_bounds(ssm, 3 * p * d)
        assert bounds.full and bounds.k == p * d
        assert bounds.lower == bounds.upper == nu
    # k < p + d − 1: the lag span bounds the count from above, r* from below.
    low = _rng_ssm(4, 3, 3, 0, np.diag([0.6, 0.6, -0.4, -0.4]))            # k = 2
    bounds = map_head_bounds(low, 12)
    assert bounds.k == 2 and bounds.upper == 2 and bounds.lower == pointwise_lag_rank(low, 12, np.ones(3)) == 2
    assert not bounds.full


@pytest.mark.parametrize("p, d", [(3, 3), (3, 2), (5, 2), (3, 4)])
def test_lem_odd_nonsingular_p_odd_heads_lose_rank_at_some_token(p, d):
    # Any p heads with p odd: det[V_1 u … V_p u] changes sign between u and −u, and singular_token finds
    # a zero: the smallest singular value of B(u) falls to rounding, for random and for the best-conditioned
    # families we have (the first p quaternion/octonion heads).
    rng = np.random.default_rng(p + d)
    families = [rng.standard_normal((p, p, d)) for _ in range(4)]
    if max(p, d) <= 8:
        families.append(cayley_dickson_values(p, d)[:p])
    for values in families:
        u0 = rng.standard_normal(d)
        assert np.linalg.det(token_matrix(values, u0)) * np.linalg.det(token_matrix(values, -u0)) <= 0
        u = singular_token(values, u0)
        assert np.linalg.norm(u) == pytest.approx(1.0, rel=1e-12)
        s = np.linalg.svd(token_matrix(values, u), compute_uv=False)
        assert s[-1] <= 1e-13 * s[0]


def test_lem_odd_nonsingular_needs_odd_p():
    # For even p the sign argument gives nothing, and indeed the quaternion heads never lose rank.
    Q = cayley_dickson_values(4, 4)
    U = np.random.default_rng(0).standard_normal((2000, 4))
    np.testing.assert_allclose(np.linalg.det(token_matrix(Q, U)), np.linalg.norm(U, axis=1) ** 4, rtol=1e-12)
    with pytest.raises(ValueError, match="p odd"):
        singular_token(Q, np.ones(4))


@pytest.mark.parametrize("p, d", [(1, 1), (2, 2), (3, 3), (4, 4), (2, 5), (7, 8), (8, 8), (6, 2), (2, 4)])
def test_prop_nonsingular_families_norm_preserving_families(p, d):
    # Cayley–Dickson and complex families: B(u)B(u)ᵀ = ‖u‖² I exactly (integer identity), checked also
    # on random tokens with numpy, and the octonion product against an independent multiplication
    # table built from quaternion pairs.
    families = [cayley_dickson_values(p, d)] + ([complex_values(p, d)] if 2 in (p, d) else [])
    for values in families:
        assert composition_defect(values) == 0.0
        U = np.random.default_rng(p * d).standard_normal((50, d))
        B = token_matrix(values, U)
        np.testing.assert_allclose(B @ B.transpose(0, 2, 1),
                                   (U ** 2).sum(1)[:, None, None] * np.eye(p), atol=1e-12 * np.abs(U).max() ** 2)
    assert composition_defect(polynomial_values(2, 2)) > 0                       # not norm-preserving


def _quaternion(x, y):
    a1, b1, c1, d1 = x
    a2, b2, c2, d2 = y
    return np.array([a1 * a2 - b1 * b2 - c1 * c2 - d1 * d2, a1 * b2 + b1 * a2 + c1 * d2 - d1 * c2,
                     a1 * c2 - b1 * d2 + c1 * a2 + d1 * b2, a1 * d2 + b1 * c2 - c1 * b2 + d1 * a2])


def test_prop_nonsingular_families_quaternions_are_hamilton_products():
    # The 4-head family is left multiplication by Hamilton's quaternions: V_h u = e_h · u.
    Q = cayley_dickson_values(4, 4)
    u = np.random.default_rng(3).standard_normal(4)
    for h in range(4):
        np.testing.assert_allclose(Q[h] @ u, _quaternion(np.eye(4)[h], u), atol=1e-15)


@pytest.mark.parametrize("p, d", [(1, 1), (2, 3), (3, 3), (4, 2), (5, 7)])
def test_prop_nonsingular_families_polynomial_product(p, d):
    # yᵀ V_h u is the t^h coefficient of y(t)u(t) (numpy.polymul, highest power first, reversed here),
    # and B(u) has full rank p for random, structured and root-on-the-unit-circle tokens.
    V = polynomial_values(p, d)
    assert V.shape == (p + d - 1, p, d)
    rng = np.random.default_rng(p + d)
    y, u = rng.standard_normal(p), rng.standard_normal(d)
    np.testing.assert_allclose(np.einsum("a,hab,b->h", y, V, u), np.polymul(y[::-1], u[::-1])[::-1], atol=1e-13)
    tokens = np.concatenate([rng.standard_normal((100, d)), np.eye(d),
                             [[1.0] * d, [(-1.0) ** b for b in range(d)]]])
    ranks = np.linalg.matrix_rank(token_matrix(V, tokens))
    assert np.all(ranks == p)


def test_nonsingular_values_picks_the_fewest_heads():
    assert [len(nonsingular_values(p, d)) for p, d in [(2, 2), (3, 3), (2, 6), (3, 5), (5, 5), (1, 9), (9, 9)]] \
        == [2, 4, 6, 7, 8, 9, 17]
    np.testing.assert_array_equal(nonsingular_values(2, 2), [np.eye(2), [[0.0, -1.0], [1.0, 0.0]]])
    assert nonsingular_dimension_bounds(3, 3) == (4, 4) and nonsingular_dimension_bounds(5, 5) == (6, 8)
    assert nonsingular_dimension_bounds(2, 7) == (8, 8) and nonsingular_dimension_bounds(1, 6) == (6, 6)
    assert nonsingular_dimension_bounds(6, 6) == (6, 8) and nonsingular_dimension_bounds(7, 7) == (8, 8)


def _nu_formula(p, d):
    # The exact values of cor-map-level-exact, or None where the corollary leaves a gap.
    big, small = max(p, d), min(p, d)
    if small == 1 or big in (2, 4, 8) or (small == 2 and big % 2 == 0):
        return big
    if (small >= 2 and big in (3, 7)) or (small == 2 and big % 2 == 1):
        return big + 1
    return None


def test_cor_map_level_exact_values_match_the_bounds():
    # Where the corollary states ν(p, d), the lower bound (lemma) and the upper bound (a family) meet
    # at that value; elsewhere (p, d <= 8) they leave a gap.
    for p in range(1, 9):
        for d in range(1, 9):
            lower, upper = nonsingular_dimension_bounds(p, d)
            nu = _nu_formula(p, d)
            assert (lower == upper == nu) if nu is not None else lower < upper, (p, d)


@pytest.mark.parametrize("p, d", [(2, 2), (3, 3), (2, 3), (4, 4), (1, 3), (2, 5)])
def test_cor_map_level_exact_one_head_fewer_misses_a_full_ssm(p, d):
    # For an SSM with k = pd: ν heads compute it, and ν − 1 value maps (random, or the first ν − 1 of the
    # family) miss it at the token of singular_token; the miss is recomputed here by least squares on
    # the SSM's outputs L_ℓ u, with B(u)'s range cut to its numerical rank.
    nu = _nu_formula(p, d)
    ssm, n = LinearSSM.random(p * d, d, p, spectral_radius=0.9, seed=p + 2 * d), p * d + 2
    assert map_head_bounds(ssm, n).full
    X = np.random.default_rng(0).standard_normal((3, n, d))
    assert relative_error(TokenDependentHeads(ssm, nonsingular_values(p, d))(X), ssm(X)) < 1e-12
    rng = np.random.default_rng(p * d)
    for values in [rng.standard_normal((nu - 1, p, d)), nonsingular_values(p, d)[: nu - 1]]:
        H = nu - 1
        u = singular_token(values, rng.standard_normal(d if H <= p else p))
        K = np.einsum("lpd,d->pl", lags_np(ssm, n), u)
        B = np.einsum("hpd,d->ph", values, u)
        left, sigma, _ = np.linalg.svd(B, full_matrices=False)
        basis = left[:, sigma > 1e-10 * np.linalg.norm(values)]
        miss = np.linalg.norm(K - basis @ basis.T @ K) / np.linalg.norm(K)
        assert miss > 1e-3
        assert token_miss(ssm, n, values, u) == pytest.approx(miss, rel=1e-9)


def test_single_head_witness_and_token_miss_edge_cases():
    ssm = LinearSSM.damped_rotation(0.9, 0.6)
    witness = single_head_witness(ssm, 8, np.eye(2))
    assert witness is not None and 0 < witness.miss <= 1 and witness.token.shape == (2,)
    # The miss is the sine of the angle between L_ℓ u and u (V = I), from the lags directly.
    L = lags_np(ssm, 8)[witness.lag]
    y = L @ witness.token
    assert witness.miss == pytest.approx(np.linalg.norm(np.cross(np.r_[y, 0], np.r_[witness.token, 0]))
                                         / np.linalg.norm(y), rel=1e-9)
    collinear = ssm_from(np.array([[0.8]]), np.array([[1.0, 2.0]]), np.array([[1.0], [0.5]]))
    assert single_head_witness(collinear, 8, np.outer([1.0, 0.5], [1.0, 2.0])) is None
    # A family that spans ℝ^p at u misses nothing; the zero family misses everything.
    assert token_miss(ssm, 8, cayley_dickson_values(2, 2), np.array([0.3, -1.0])) < 1e-14
    assert token_miss(ssm, 8, np.zeros((2, 2, 2)), np.array([0.3, -1.0])) == 1.0


def test_worst_conditioned_tokens_finds_the_binomial_token_for_polynomials():
    # For polynomial multiplication by u(t) = (1 + t)^{d−1} (roots on the unit circle) the convolution
    # matrix is badly conditioned; the search returns it (or a worse one), and norm-preserving
    # families have condition number 1 everywhere.
    V = polynomial_values(5, 5)
    tokens, condition = worst_conditioned_tokens(V, 2000, 2, seed=1)
    binomial = np.array([1.0, 4.0, 6.0, 4.0, 1.0])
    sigma = np.linalg.svd(token_matrix(V, binomial), compute_uv=False)
    assert condition[0] >= sigma[0] / sigma[-1] * (1 - 1e-12) and condition[0] >= condition[1]
    assert np.allclose(worst_conditioned_tokens(cayley_dickson_values(5, 5), 500, 1)[1], 1.0)


def test_token_dependent_heads_is_a_module_holding_its_values_frozen():
    # The SSM is a submodule, the value maps a frozen parameter exposed read-only; float32 follows the SSM.
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    model = TokenDependentHeads(ssm)
    assert dict(model.named_children())["ssm"] is ssm
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.values().flags.writeable and "H=2, N=3, d=2, p=2" in repr(model)
    single = TokenDependentHeads(LinearSSM.random(3, 2, 2, seed=0, dtype=torch.float32))
    X = np.random.default_rng(0).standard_normal((2, 7, 2))
    assert single(X).dtype == np.float32 and relative_error(single(X), ssm(X)) < 1e-5


def test_token_dependent_heads_refuse_a_family_that_misses_a_token():
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    degenerate = np.stack([np.eye(2), np.diag([1.0, 0.5])])           # B(e_1) = [e_1, e_1]: rank 1
    X = np.zeros((1, 4, 2))
    X[0, 0] = [1.0, 0.0]
    with pytest.raises(ValueError, match="values must span"):
        TokenDependentHeads(ssm, degenerate)(X)
    with pytest.raises(ValueError, match="values must have shape"):
        TokenDependentHeads(ssm, np.ones((2, 3, 2)))


# -- S4D-style constructor ---------------------------------------------------------------------


@pytest.mark.parametrize("init", ["lin", "real"])
@pytest.mark.parametrize("N", [1, 4, 7])
def test_s4d_ssm_has_requested_spectral_radius(init, N):
    rho = 0.9
    ssm = s4d_ssm(N, 3, rho, init=init, seed=0)
    eig = np.linalg.eigvals(ssm.A)
    assert ssm.N == N and ssm.d == ssm.p == 3
    assert np.abs(eig).max() == pytest.approx(rho, rel=1e-12)
    if init == "lin":
        np.testing.assert_allclose(np.abs(eig), rho, rtol=1e-12)
        step = -2 * np.log(rho)
        angles = np.sort(np.abs(np.angle(eig)))
        m = np.r_[np.arange(1, N // 2 + 1), -np.arange(1, N // 2 + 1), [0] * (N % 2)]
        expected = np.sort(np.abs(np.angle(np.exp(step * (-0.5 + 1j * np.pi * m)))))
        np.testing.assert_allclose(angles, expected, atol=1e-12)
    else:
        np.testing.assert_allclose(np.sort(eig.real), np.sort(rho ** np.arange(1, N + 1)), rtol=1e-12)
    assert s4d_ssm(4, 2, 0.5, p=3).p == 3


# -- prop-heads-needed-lag-bound and prop-heads-needed-continuous-limit --------------------------


def test_prop_heads_needed_lag_bound_holds_and_is_attained_by_its_construction():
    # H_ε <= L_ε; the span of the first L_ε lags, as value maps, has error <= the lag tail (explicit blocks).
    for rho, N in [(0.5, 16), (0.8, 8), (0.95, 32), (0.999, 16)]:
        ssm, n = s4d_ssm(N, 4, rho, seed=1), 128
        L = lags_np(ssm, n).reshape(n, -1)
        weighted = (n - np.arange(n)) * (L ** 2).sum(1)
        for eps in (1e-2, 1e-6):
            tails = np.concatenate([np.cumsum(weighted[::-1])[::-1], [0.0]])
            L_eps = int(np.argmax(tails <= eps * tails[0]))
            assert lag_energy_count(ssm, n, eps) == L_eps
            assert heads_needed(ssm, n, eps) <= L_eps
            # The bound's own construction: project every lag on span{L_0..L_{L_ε−1}}.
            Q = np.linalg.qr(L[:L_eps].T)[0] if L_eps else np.zeros((L.shape[1], 0))
            error = ((n - np.arange(n)) * ((L - L @ Q @ Q.T) ** 2).sum(1)).sum()
            assert error <= tails[L_eps] * (1 + 1e-9) + 1e-14 * tails[0]


def test_prop_heads_needed_lag_bound_is_tight_for_orthonormal_lags():
    # A shift register read out in full: L_ℓ = e_{ℓ+1} (ℓ < 4), orthonormal with decreasing weights n − ℓ,
    # so the best H heads keep exactly the first H lags and H_ε = L_ε for every ε.
    shift = ssm_from(np.eye(4, k=-1), np.eye(4)[:, :1], np.eye(4))
    n = 6
    weights = np.array([6.0, 5.0, 4.0, 3.0])          # n − ℓ for the four non-zero lags
    for eps in (0.7, 0.3, 0.1, 1e-3):
        expected = min(H for H in range(5) if weights[H:].sum() <= eps * weights.sum())
        assert heads_needed(shift, n, eps) == lag_energy_count(shift, n, eps) == expected


def _relative_tails(ssm, n, H_max):
    tails = optimal_head_errors(ssm, n, H_max)
    return tails / tails[0]


def test_prop_heads_needed_continuous_limit_converges_at_rate_one_over_n():
    # Fixed window T = nΔ: the relative least errors of the ZOH SSM approach those of Γ_T (closed form),
    # with a deviation that shrinks like Δ = T/n.  Independent of lib's closed form: a fine quadrature of
    # Γ_T from matrix exponentials (scipy-free: expm by torch).
    A_c, B_c, C = s4d_continuous(6, 2, seed=3)
    T, H_max = 3.0, 4
    limit = continuous_head_errors(A_c, B_c, C, T, H_max)
    steps = 4000                                      # midpoint rule, K(t_k) = C e^{A h/2} (e^{A h})^k B
    h = T / steps
    half, step = (torch.linalg.matrix_exp(torch.tensor(A_c * s)).numpy() for s in (h / 2, h))
    K, state = [], half @ B_c
    for _ in range(steps):
        K.append((C @ state).ravel())
        state = step @ state
    K, t = np.array(K), (np.arange(steps) + 0.5) * h
    gamma = np.einsum("t,ti,tj->ij", (1 - t / T) * h, K, K)
    eig = np.sort(np.linalg.eigvalsh(gamma))[::-1]
    quadrature = np.array([eig[H:].sum() for H in range(H_max + 1)])
    np.testing.assert_allclose(limit / limit[0], quadrature / quadrature[0], rtol=1e-4)
    deviations = []
    for n in (64, 256, 1024):
        rho = np.exp(-T / n / 2)                      # s4d "lin": Δ = −2 ln ρ
        ssm = s4d_ssm(6, 2, rho, seed=3)
        deviations.append(np.abs(_relative_tails(ssm, n, H_max) - limit / limit[0]).max())
    assert deviations[2] < 1e-2
    assert deviations[1] < 0.35 * deviations[0] and deviations[2] < 0.35 * deviations[1]


def test_prop_heads_needed_continuous_limit_short_and_long_windows():
    # (b) As T → 0 the window sees K(t) ≈ K(0): the relative tail beyond one head vanishes like T.
    # (c) For Hurwitz A_c, Γ_T → Γ_∞ as T → ∞: the relative tails stop changing.
    A_c, B_c, C = s4d_continuous(8, 3, seed=2)
    short = [continuous_head_errors(A_c, B_c, C, T, 2) for T in (1e-2, 1e-3)]
    ratios = [tails[1] / tails[0] for tails in short]
    assert ratios[1] < 0.2 * ratios[0] and ratios[1] < 1e-3
    long = [continuous_head_errors(A_c, B_c, C, T, 8) for T in (100.0, 400.0)]
    assert np.abs(long[0] / long[0][0] - long[1] / long[1][0]).max() < 2e-2
    far = continuous_head_errors(A_c, B_c, C, 1600.0, 8)
    assert np.abs(long[1] / long[1][0] - far / far[0]).max() < 0.3 * np.abs(long[0] / long[0][0]
                                                                              - long[1] / long[1][0]).max()


def test_prop_heads_needed_continuous_limit_counts_depend_on_n_and_rho_through_T():
    # Same T = nΔ, different (n, ρ): the same head counts; at fixed n, ρ → 1 shrinks T and the count.
    for T in (2.0, 10.0):
        counts = {n: heads_needed(s4d_ssm(16, 4, float(np.exp(-T / n / 2)), seed=0), n, 1e-2) for n in (512, 2048)}
        assert counts[512] == counts[2048]
    n = 1024
    near = heads_needed(s4d_ssm(32, 8, 0.99, seed=0), n, 1e-2)
    nearer = heads_needed(s4d_ssm(32, 8, 0.9995, seed=0), n, 1e-2)
    assert nearer < near                     # the count falls as ρ → 1 at fixed n (not "grows with ρ")


def test_s4d_continuous_is_the_system_behind_s4d_ssm():
    for init in ("lin", "real"):
        A_c, B_c, C = s4d_continuous(5, 3, init=init, p=2, seed=4)
        step = s4d_step(0.9, init)
        direct = s4d_ssm(5, 3, 0.9, init=init, p=2, seed=4)
        A = torch.linalg.matrix_exp(torch.tensor(step * A_c)).numpy()
        np.testing.assert_allclose(direct.A, A, atol=1e-14)
        np.testing.assert_allclose(direct.C, C, atol=0)
        assert np.abs(np.linalg.eigvals(direct.A)).max() == pytest.approx(0.9, rel=1e-12)


# -- prop-modal-lag-span ------------------------------------------------------------------------


def test_prop_modal_lag_span_equals_rank_of_rescaled_lags():
    # k from the residues vs the numerical rank of the lags of A/ρ (which do not decay for S4D-Lin):
    # two routes that agree, where the plain lag matrix loses two dimensions to rounding.
    ssm, n = s4d_ssm(32, 8, 0.5, seed=0), 1024
    rescaled = LinearSSM(ssm.A / 0.5, ssm.B, ssm.C)
    assert modal_lag_span_dimension(ssm, n) == rank_np(lags_np(rescaled, 200).reshape(200, -1)) == 32
    assert min_heads(ssm, n) < 32               # the numerical rank of the raw lag matrix


def test_prop_modal_lag_span_on_known_ranks():
    # Residues of rank-one structure: B = 0 on two modes drops k by two; p·d caps k.
    lam = np.array([0.9, 0.5, -0.3, 0.1])
    B = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    ssm = LinearSSM.diagonal(lam, B, np.ones((2, 4)))
    assert modal_lag_span_dimension(ssm, 10) == rank_np(lags_np(ssm, 10).reshape(10, -1)) == 2
    # A mode with a residue 1e-6 times the others' still counts (rank rule rtol = 1e-10, not looser).
    weak = LinearSSM.diagonal(lam, [[1.0, 0.0], [0.0, 1.0], [1e-6, 0.0], [0.0, 0.0]],
                              np.random.default_rng(0).standard_normal((2, 4)))
    assert modal_lag_span_dimension(weak, 10) == rank_np(lags_np(weak, 10).reshape(10, -1)) == 3
    big = LinearSSM.random(9, 2, 2, spectral_radius=0.8, seed=1)
    assert modal_lag_span_dimension(big, 20) == 4 == min_heads(big, 20)
    for N, d, p, seed in [(3, 2, 2, 0), (5, 3, 1, 1), (6, 2, 3, 2)]:
        ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=seed)
        assert modal_lag_span_dimension(ssm, 2 * N) == rank_np(lags_np(ssm, 2 * N).reshape(2 * N, -1))


def test_prop_modal_lag_span_refuses_repeated_eigenvalues_and_short_sequences():
    with pytest.raises(ValueError, match="repeated eigenvalues"):
        modal_lag_span_dimension(_rng_ssm(4, 2, 2, 1, np.diag([0.5, 0.5, 0.5, -0.3])), 12)
    with pytest.raises(ValueError, match="n must be >= N"):
        modal_lag_span_dimension(LinearSSM.random(4, 2, 2), 3)
    with pytest.raises(ValueError, match="diagonalisable"):
        modal_lag_span_dimension(_rng_ssm(4, 2, 3, 2, _jordan(0.7, 4)), 12)


# -- validation --------------------------------------------------------------------------------

SSM = LinearSSM.random(3, 2, 2, seed=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: min_heads(SSM, 0), ValueError, "n must be >= 1"),
    (lambda: min_heads(SSM, 2.5), TypeError, "n must be an integer"),
    (lambda: min_heads(SSM, True), TypeError, "n must be an integer"),
    (lambda: min_heads(SSM, 5, rtol=0.0), ValueError, "rtol"),
    (lambda: min_heads(SSM, 5, rtol=1.0), ValueError, "rtol"),
    (lambda: heads_from_ssm(SSM, 5, rtol=-1e-3), ValueError, "rtol"),
    (lambda: min_heads(np.eye(2), 5), TypeError, "ssm must be an LTI sequence map"),
    (lambda: heads_from_ssm(RelativeHeads.random(1, 4, 2, 2), 4), TypeError, "ssm must be an LTI sequence map"),
    (lambda: optimal_head_errors(SSM, 5, -1), ValueError, "H_max must be >= 0"),
    (lambda: optimal_head_errors(SSM, 5, 1.0), TypeError, "H_max must be an integer"),
    (lambda: truncated_heads(SSM, 5, -2), ValueError, "H must be >= 0"),
    (lambda: heads_needed(SSM, 5, 0.0), ValueError, "eps"),
    (lambda: heads_needed(SSM, 5, float("nan")), ValueError, "eps must be finite"),
    (lambda: lag_matrix(SSM, 5, weighted=1), TypeError, "weighted"),
    (lambda: min_heads(LinearSSM(10 * np.eye(2), np.eye(2), np.eye(2)), 400), ValueError, "ssm lags"),
    (lambda: population_error(SSM, RelativeHeads.random(1, 5, 2, 3), 5), ValueError, "student must have"),
    (lambda: population_error(SSM, RelativeHeads.random(1, 5, 2, 2), 6), ValueError, "student accepts"),
    (lambda: population_error(np.eye(2), SSM, 5), TypeError, "teacher must be"),
    (lambda: heads_from_ssm(SSM, 5)(np.zeros((6, 2))), ValueError, "X must have length n <= 5"),
    (lambda: heads_from_ssm(SSM, 5)(np.zeros((4, 3))), ValueError, "X must have shape"),
    (lambda: heads_from_ssm(SSM, 5)(np.full((4, 2), np.nan)), ValueError, "X must be finite"),
    (lambda: TokenDependentHeads(LinearSSM.random(2, 2, 3), np.ones((2, 2, 2))), ValueError,
     r"values must have shape \(H, p, d\) = \(2, 3, 2\)"),
    (lambda: TokenDependentHeads(SSM, np.zeros((0, 2, 2))), ValueError, "values must have shape"),
    (lambda: fit_heads(SSM, 5, 1, method="adam"), ValueError, "method"),
    (lambda: fit_heads(SSM, 5, -1), ValueError, "H must be >= 0"),
    (lambda: fit_heads(SSM, 5, 1, restarts=0), ValueError, "restarts must be >= 1"),
    (lambda: sampled_head_errors(SSM, 5, [0, 1], 1), ValueError, "samples must be >= 2"),
    (lambda: sampled_head_errors(SSM, 5, 3, 10), TypeError, "heads must be an iterable"),
    (lambda: sampled_head_errors(SSM, 5, [0], 10, tokens="uniform"), ValueError, "tokens"),
    (lambda: token_dependent_single_head(SSM, np.zeros((4, 2)), np.eye(3)), ValueError, "V must have shape"),
    (lambda: token_dependent_single_head(SSM, np.zeros((4, 3)), np.eye(2)), ValueError, "X must have shape"),
    (lambda: token_dependent_single_head(SSM, np.zeros((4, 2)), np.eye(2), causal=1), TypeError, "causal"),
    (lambda: lag_energy_count(SSM, 5, 1.0), ValueError, "eps"),
    (lambda: modal_lag_span_dimension(SSM, 2), ValueError, "n must be >= N"),
    (lambda: modal_lag_span_dimension(SSM, 5, separation=0.0), ValueError, "separation must be > 0"),
    (lambda: modal_lag_span_dimension(SSM, 5, max_condition=-1.0), ValueError, "max_condition must be > 0"),
    (lambda: single_head_witness(SSM, 5, np.eye(2), rtol=0.0), ValueError, "rtol"),
    (lambda: single_head_witness(SSM, 5, np.eye(3)), ValueError, "V must have shape"),
    (lambda: population_error(SSM, SSM, 0), ValueError, "n must be >= 1"),
    (lambda: token_miss(SSM, 5, np.ones((2, 2, 2)), np.ones(3)), ValueError, "token must have shape"),
    (lambda: token_miss(SSM, 5, np.ones((2, 3, 2)), np.ones(2)), ValueError, "values must have shape"),
    (lambda: TokenDependentHeads(SSM, np.full((2, 2, 2), np.nan)), ValueError, "values must be finite"),
    (lambda: singular_token(np.ones((2, 3, 5)), np.ones(3)), ValueError, r"start must have shape \(d,\) = \(5,\)"),
    (lambda: singular_token(np.ones((2, 2, 5)), np.zeros(2)), ValueError, "start must be non-zero"),
    (lambda: singular_token(np.ones((3, 3, 3)), np.ones(3), np.ones(2)), ValueError, "direction must have shape"),
    (lambda: polynomial_values(0, 2), ValueError, "p must be >= 1"),
    (lambda: complex_values(3, 3), ValueError, "p = 2 or d = 2"),
    (lambda: cayley_dickson_values(9, 2), ValueError, "p, d <= 8"),
    (lambda: composition_defect(np.ones((2, 2))), ValueError, "values must have shape"),
    (lambda: token_matrix(np.ones((2, 2, 3)), np.ones(2)), ValueError, "tokens must have shape"),
    (lambda: pointwise_lag_rank(SSM, 5, np.ones(3)), ValueError, "token must have shape"),
    (lambda: singular_token(np.ones((3, 3, 3)), np.zeros(3)), ValueError, "start must be a non-zero"),
    (lambda: singular_token(np.ones((4, 4, 4)), np.ones(4)), ValueError, "H < max"),
    (lambda: singular_token(np.ones((3, 3, 3)), np.ones(3), np.ones(3)), ValueError, "direction must not"),
    (lambda: continuous_head_errors(-np.eye(2), np.ones((2, 1)), np.ones((1, 2)), 1.0, 1), ValueError,
     "repeated eigenvalues"),
    (lambda: continuous_head_errors(-np.eye(1), np.ones((1, 1)), np.ones((1, 1)), 0.0, 1), ValueError,
     "T must be > 0"),
    (lambda: continuous_head_errors(-np.eye(2), np.ones((3, 1)), np.ones((1, 2)), 1.0, 1), ValueError,
     "B_c must have"),
    (lambda: s4d_step(1.5), ValueError, "spectral_radius"),
    (lambda: TokenDependentHeads("ssm"), TypeError, "ssm must be a LinearSSM"),
    (lambda: s4d_ssm(4, 2, 1.0), ValueError, "spectral_radius"),
    (lambda: s4d_ssm(4, 2, 0.9, init="diag"), ValueError, "init"),
    (lambda: s4d_ssm(0, 2, 0.9), ValueError, "N must be >= 1"),
])
def test_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_zero_head_model_is_a_relative_heads_with_no_heads():
    ssm = ssm_from(0.5 * np.eye(2), np.zeros((2, 3)), np.ones((2, 2)))
    for n in (4, 600):                                     # direct and FFT lengths
        model = heads_from_ssm(ssm, n)
        assert isinstance(model, RelativeHeads) and model.H == 0
        assert model.V.shape == (0, 2, 3) and model.coefficients.shape == (0, n)
        np.testing.assert_array_equal(model(np.ones((n, 3))), np.zeros((n, 2)))
    assert repr(heads_from_ssm(ssm, 4)).startswith("RelativeHeads(H=0")
    np.testing.assert_array_equal(optimal_head_errors(ssm, 4, 2), np.zeros(3))
    assert heads_needed(ssm, 4, 1e-3) == 0 and truncated_heads(ssm, 4, 2).H == 0


# -- minimal polynomial degree and the bound of prop-lag-span-bound -------------------

@pytest.mark.parametrize("A, degree", [
    (np.eye(3), 1),                                   # z − 1
    (np.zeros((3, 3)), 1),                            # z
    (np.diag([0.8, 0.8, 0.5, 0.5]), 2),               # repeated eigenvalues
    (0.7 * np.eye(4) + np.eye(4, k=1), 4),            # one Jordan block
    (np.eye(4, k=1), 4),                              # nilpotent shift: z^4
    (np.diag([0.9, 0.5]) @ np.diag([1.0, 1.0]), 2),   # distinct eigenvalues
])
def test_prop_lag_span_bound_minimal_polynomial_degree_on_known_matrices(A, degree):
    from lib.heads import minimal_polynomial_degree

    assert minimal_polynomial_degree(A) == degree


def test_prop_lag_span_bound_holds_and_is_attained_by_random_systems():
    from lib.heads import lag_span_bound

    for N, d, p, n in [(3, 2, 2, 10), (6, 2, 2, 10), (5, 3, 1, 4), (2, 1, 1, 8)]:
        ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=N + n)
        bound = lag_span_bound(ssm, n)
        assert bound == min(N, n, p * d)  # random A has m_A = N
        assert min_heads(ssm, n) == bound


def test_minimal_polynomial_degree_rejects_non_square():
    from lib.heads import minimal_polynomial_degree

    with pytest.raises(ValueError, match="A must be a square matrix"):
        minimal_polynomial_degree(np.ones((2, 3)))
