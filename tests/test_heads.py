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
from lib.heads import (
    TokenDependentHeads,
    heads_from_ssm,
    heads_needed,
    lag_matrix,
    min_heads,
    optimal_head_errors,
    population_error,
    s4d_ssm,
    truncated_heads,
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


def test_thm_approx_head_count_monte_carlo():
    # Σ_i E‖y_i − ŷ_i‖² estimated on Gaussian tokens agrees with the closed form.
    ssm, n = LinearSSM.random(5, 3, 2, spectral_radius=0.9, seed=11), 10
    X = np.random.default_rng(0).standard_normal((20_000, n, 3))
    Y = ssm(X)
    for H in (1, 3):
        squared = ((Y - truncated_heads(ssm, n, H)(X)) ** 2).sum(axis=(1, 2))
        estimate, stderr = squared.mean(), squared.std() / np.sqrt(len(squared))
        assert abs(estimate - optimal_head_errors(ssm, n, H)[H]) < 4 * stderr
        assert stderr < 0.02 * estimate


def test_thm_approx_head_count_zero_exactly_from_k_heads():
    ssm, n = LinearSSM.random(3, 2, 2, seed=5), 12
    errors = optimal_head_errors(ssm, n, 6)
    k = min_heads(ssm, n)
    assert np.all(errors[:k] > 1e-8 * errors[0]) and np.all(errors[k:] <= 1e-24 * errors[0])
    assert errors[0] == pytest.approx(sum((n - ell) * (L ** 2).sum() for ell, L in enumerate(lags_np(ssm, n))))
    assert truncated_heads(ssm, n, 6).H == k     # extra heads are not materialised


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


def test_heads_needed_grows_with_memory():
    # Slower decay (ρ → 1) and tighter tolerance need more heads; never more than min(N, pd).
    previous = 0
    for rho in (0.5, 0.9, 0.99):
        H = heads_needed(s4d_ssm(16, 4, rho, seed=0), 256, 1e-4)
        assert previous <= H <= 16
        previous = H
    ssm = s4d_ssm(16, 4, 0.9, seed=0)
    assert heads_needed(ssm, 256, 1e-2) <= heads_needed(ssm, 256, 1e-4) <= heads_needed(ssm, 256, 1e-8)


# -- validation --------------------------------------------------------------------------------

SSM = LinearSSM.random(3, 2, 2, seed=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: min_heads(SSM, 0), ValueError, "n must be >= 1"),
    (lambda: min_heads(SSM, 2.5), TypeError, "n must be an integer"),
    (lambda: min_heads(SSM, True), TypeError, "n must be an integer"),
    (lambda: min_heads(SSM, 5, rtol=0.0), ValueError, "rtol"),
    (lambda: min_heads(SSM, 5, rtol=1.0), ValueError, "rtol"),
    (lambda: heads_from_ssm(SSM, 5, rtol=-1e-3), ValueError, "rtol"),
    (lambda: min_heads(np.eye(2), 5), TypeError, "ssm must be a LinearSSM"),
    (lambda: heads_from_ssm(RelativeHeads.random(1, 4, 2, 2), 4), TypeError, "ssm must be a LinearSSM"),
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
    (lambda: TokenDependentHeads(LinearSSM.random(2, 2, 3)), ValueError, "ssm must have p = d = 2"),
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
