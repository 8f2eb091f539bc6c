"""The head-count chapter's experiments (experiments.head_count).

Expected values come from independent routes: lags C A^ℓ B by numpy.linalg.matrix_power, ranks
by numpy.linalg.matrix_rank, minimal-polynomial degrees from Krylov matrices, least squares by
numpy.linalg.lstsq, Γ_T by quadrature, quaternions by Hamilton's table, polynomial products by
numpy.polymul, students built from their documented draws and trained one at a time.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.head_count import (
    TokenDependentHeads,
    aliased_eigenvalue_count,
    cayley_dickson_values,
    complex_values,
    composition_defect,
    continuous_head_errors,
    distinct_eigenvalue_count,
    elementary_nonsingular_bound,
    half_circle_bisection,
    hopf_stiefel_number,
    lag_energy_count,
    lag_span_bound,
    map_head_bounds,
    memory_output_error,
    memoryless_output_error,
    memoryless_softmax_heads,
    minimal_polynomial_degree,
    modal_lag_span_dimension,
    nonsingular_dimension_bounds,
    nonsingular_values,
    operator_head_errors,
    output_relative_error,
    pointwise_lag_rank,
    polynomial_values,
    rank_limited_head_error,
    rank_one_pair,
    rank_one_triple,
    sampled_head_errors,
    search_singular_token,
    impulse_slope_max,
    short_window_bound,
    short_window_step_ratio,
    short_window_threshold,
    singular_token,
    softmax_heads,
    token_matrix,
    token_miss,
    train_students,
    truncated_binomial_vanishes,
    value_span_error,
    worst_conditioned_tokens,
)
from lib import (
    DiagonalSSM,
    LinearSSM,
    SharedStateSSM,
    fit_rank_limited_heads,
    RelativeHeads,
    SoftmaxAttention,
    apply_operator,
    heads_needed,
    imitate,
    interaction_rank,
    min_heads,
    optimal_head_errors,
    population_error,
    relative_error,
    s4d_continuous,
    s4d_ssm,
)

# -- independent references ---------------------------------------------------------------------


def numpy_of(ssm):
    return tuple(m.numpy(force=True) for m in (ssm.A, ssm.B, ssm.C))


def lags_np(ssm, n):
    """C A^ℓ B, ℓ = 0..n−1, shape (n, p, d), with explicit matrix powers."""
    A, B, C = numpy_of(ssm)
    return np.stack([C @ np.linalg.matrix_power(A, ell) @ B for ell in range(n)])


def rank_np(M, rtol=1e-10):
    sigma_max = np.linalg.norm(M, 2) if M.size else 0.0
    return 0 if sigma_max == 0 else int(np.linalg.matrix_rank(M, tol=rtol * sigma_max))


def minpoly_degree(A):
    """deg of A's minimal polynomial = rank of the Krylov matrix [vec(I), vec(A), …, vec(A^N)]."""
    K = np.stack([np.linalg.matrix_power(A, j).ravel() for j in range(len(A) + 1)], axis=1)
    return int(np.linalg.matrix_rank(K, tol=1e-9 * np.linalg.norm(K, 2)))


def ssm_from(A, B, C):
    return LinearSSM(np.asarray(A, float), np.asarray(B, float), np.asarray(C, float))


def _rng_ssm(N, d, p, seed, A):
    rng = np.random.default_rng(seed)
    return ssm_from(A, rng.standard_normal((N, d)), rng.standard_normal((p, N)))


def outputs(model, X):
    """model(X) for a numpy X, as numpy."""
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(X, float))).numpy()


# -- prop-lag-span-bound ------------------------------------------------------------------------


def test_prop_lag_span_bound_on_adversarial_ssms(degenerate_ssm):
    ssm, n = degenerate_ssm
    k = min_heads(ssm, n)
    assert k == rank_np(lags_np(ssm, n).reshape(n, -1))
    A = ssm.A.numpy(force=True)
    assert lag_span_bound(ssm, n) == min(minpoly_degree(A), n, ssm.p * ssm.d) >= k


def test_prop_lag_span_bound_is_attained_by_each_term():
    # deg minpoly binds: repeated eigenvalue, N = 4 but minpoly degree 2.
    ssm = _rng_ssm(4, 3, 3, 0, np.diag([0.6, 0.6, -0.4, -0.4]))
    assert minpoly_degree(ssm.A.numpy(force=True)) == 2 and min_heads(ssm, 10) == 2 == lag_span_bound(ssm, 10)
    # n binds: short sequences.
    short = LinearSSM.random(6, 3, 3, seed=1)
    assert min_heads(short, 2) == 2 == lag_span_bound(short, 2)
    # pd binds: many states, small widths.
    wide = LinearSSM.random(9, 2, 2, seed=2)
    assert min_heads(wide, 20) == 4 == lag_span_bound(wide, 20)
    # Nilpotent of index 3: only L_0, L_1, L_2 are non-zero.
    nilpotent = _rng_ssm(3, 3, 3, 3, np.eye(3, k=-1))
    assert min_heads(nilpotent, 10) == 3 == lag_span_bound(nilpotent, 10)


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 7), d=st.integers(1, 3), p=st.integers(1, 3), n=st.integers(1, 10),
       seed=st.integers(0, 10_000))
def test_prop_lag_span_bound_random(N, d, p, n, seed):
    ssm = LinearSSM.random(N, d, p, spectral_radius=0.8, seed=seed)
    k = min_heads(ssm, n)
    assert k == rank_np(lags_np(ssm, n).reshape(n, -1))
    assert k <= lag_span_bound(ssm, n) == min(minpoly_degree(ssm.A.numpy(force=True)), n, p * d)


@pytest.mark.parametrize("A, degree", [
    (np.eye(3), 1),                                   # z − 1
    (np.zeros((3, 3)), 1),                            # z
    (np.diag([0.8, 0.8, 0.5, 0.5]), 2),               # repeated eigenvalues
    (0.7 * np.eye(4) + np.eye(4, k=1), 4),            # one Jordan block
    (np.eye(4, k=1), 4),                              # nilpotent shift: z^4
    (np.diag([0.9, 0.5]), 2),                         # distinct eigenvalues
    (np.diag([1e3, 1e3, -2e3]), 2),                   # large entries (scaled first)
])
def test_prop_lag_span_bound_minimal_polynomial_degree_on_known_matrices(A, degree):
    assert minimal_polynomial_degree(A) == degree


def test_prop_lag_span_bound_holds_and_is_attained_by_random_systems():
    for N, d, p, n in [(3, 2, 2, 10), (6, 2, 2, 10), (5, 3, 1, 4), (2, 1, 1, 8)]:
        ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=N + n)
        bound = lag_span_bound(ssm, n)
        assert bound == min(N, n, p * d)  # random A has m_A = N
        assert min_heads(ssm, n) == bound


# -- prop-modal-lag-span ------------------------------------------------------------------------


def test_prop_modal_lag_span_equals_rank_of_rescaled_lags():
    # k from the residues vs the numerical rank of the lags of A/ρ (which do not decay for S4D-Lin):
    # two routes that agree, where the plain lag matrix loses two dimensions to rounding.
    ssm, n = s4d_ssm(32, 8, 0.5, seed=0), 1024
    rescaled = LinearSSM(ssm.A / 0.5, ssm.B, ssm.C)
    assert modal_lag_span_dimension(ssm) == rank_np(lags_np(rescaled, 200).reshape(200, -1)) == 32
    assert min_heads(ssm, n) < 32               # the numerical rank of the raw lag matrix


def test_prop_modal_lag_span_on_known_ranks():
    # Residues of rank-one structure: B = 0 on two modes drops k by two; p·d caps k.
    lam = np.array([0.9, 0.5, -0.3, 0.1])
    B = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    ssm = LinearSSM.diagonal(lam, B, np.ones((2, 4)))
    assert modal_lag_span_dimension(ssm) == rank_np(lags_np(ssm, 10).reshape(10, -1)) == 2
    # A mode with a residue 1e-6 times the others' still counts (rank rule rtol = 1e-10, not looser).
    weak = LinearSSM.diagonal(lam, [[1.0, 0.0], [0.0, 1.0], [1e-6, 0.0], [0.0, 0.0]],
                              np.random.default_rng(0).standard_normal((2, 4)))
    assert modal_lag_span_dimension(weak) == rank_np(lags_np(weak, 10).reshape(10, -1)) == 3
    big = LinearSSM.random(9, 2, 2, spectral_radius=0.8, seed=1)
    assert modal_lag_span_dimension(big) == 4 == min_heads(big, 20)
    for N, d, p, seed in [(3, 2, 2, 0), (5, 3, 1, 1), (6, 2, 3, 2)]:
        ssm = LinearSSM.random(N, d, p, spectral_radius=0.9, seed=seed)
        assert modal_lag_span_dimension(ssm) == rank_np(lags_np(ssm, 2 * N).reshape(2 * N, -1))
    # Complex modes in conjugate pairs: the real span of the residues.
    assert modal_lag_span_dimension(LinearSSM.damped_rotation(0.9, 0.7)) == 2
    for N, d in [(3, 1), (6, 2)]:
        ssm = s4d_ssm(N, d, 0.9, seed=N)
        assert modal_lag_span_dimension(ssm) == rank_np(lags_np(ssm, 2 * N).reshape(2 * N, -1)) == min(N, d * d)


@pytest.mark.parametrize("degenerate_ssm, refusal", [("repeated eigenvalues", "repeated eigenvalues"),
                                                     ("jordan block", "diagonalisable")],
                         indirect=["degenerate_ssm"])
def test_prop_modal_lag_span_refuses_repeated_eigenvalues_and_jordan_blocks(degenerate_ssm, refusal):
    with pytest.raises(ValueError, match=refusal):
        modal_lag_span_dimension(degenerate_ssm[0])


# -- thm-approx-head-count by Monte Carlo -------------------------------------------------------


@pytest.mark.parametrize("tokens", ["gaussian", "rademacher"])
def test_thm_approx_head_count_monte_carlo_per_head_count(tokens):
    # Σ_i E‖y_i − ŷ_i‖² sampled on Gaussian and on Rademacher tokens (E[x xᵀ] = I for both) agrees
    # with the closed form for every H < k, relative to that H's own error, within 4 standard errors,
    # and the standard error is small enough (< 0.5 %) that a 2 % error in the closed form would show.
    ssm, n = LinearSSM.random(5, 3, 2, spectral_radius=0.9, seed=11), 10
    k = min_heads(ssm, n)
    closed = optimal_head_errors(ssm, n, k)
    mean, stderr = sampled_head_errors(ssm, n, range(k + 1), 40_000, tokens=tokens, seed=1)
    for H in range(k):
        assert abs(mean[H] - closed[H]) < 4 * stderr[H]
        assert stderr[H] < 0.005 * closed[H]
    assert mean[k] < 1e-20 * closed[0]           # exact from k heads on


def test_sampled_head_errors_estimates_a_hand_computed_mean():
    # One lag: y = x (n = 1, p = d = 1) against the zero model: E y² = 1 exactly, for either token law;
    # chunks of 7 sequences give the same numbers as one chunk.
    ssm = ssm_from([[0.0]], [[1.0]], [[1.0]])
    for tokens in ("gaussian", "rademacher"):
        mean, stderr = sampled_head_errors(ssm, 1, [0], 20_000, tokens=tokens, seed=2)
        assert abs(mean[0] - 1.0) < 4 * stderr[0] + (1e-12 if tokens == "rademacher" else 0)
    assert sampled_head_errors(ssm, 1, [0], 50, tokens="rademacher")[1][0] == 0.0   # x² = 1 always
    X = np.random.default_rng(3).standard_normal((50, 1, 1))
    mean, stderr = sampled_head_errors(ssm, 1, [0], 50, seed=3, chunk=7)
    assert mean[0] == pytest.approx((X ** 2).mean(), rel=1e-12)
    assert stderr[0] == pytest.approx((X ** 2).std(ddof=1) / np.sqrt(50), rel=1e-12)


# -- prop-map-level-two-heads -------------------------------------------------------------------


def test_prop_map_level_two_heads_reproduces_any_2x2_ssm():
    ssm, n = LinearSSM.random(4, 2, 2, seed=3), 9
    assert min_heads(ssm, n) == 4
    model = TokenDependentHeads(ssm)
    X = np.random.default_rng(1).standard_normal((3, n, 2))
    X[0, 4] = 0.0                                          # a zero token is handled
    Y = lags_np(ssm, n)
    Y = np.stack([[sum(Y[i - j] @ x[j] for j in range(i + 1)) for i in range(n)] for x in X])
    assert relative_error(outputs(model, X), Y) < 1e-12
    W = model.operator(torch.from_numpy(X))
    assert relative_error(apply_operator(W, X), Y) < 1e-12
    assert relative_error(W, ssm.operator(torch.from_numpy(X))) > 0.1   # different operators …
    assert interaction_rank(model, X) == 2                 # … of interaction rank 2 < k = 4
    np.testing.assert_array_equal(model.values().numpy(force=True), [np.eye(2), [[0.0, -1.0], [1.0, 0.0]]])
    # The coefficients are the coordinates of L_{i−j} x_j in the basis (x_j, J x_j).
    a = model.coefficients(torch.from_numpy(X[1])).numpy(force=True)
    x = X[1, 2]
    np.testing.assert_allclose(lags_np(ssm, n)[3] @ x, a[0, 5, 2] * x + a[1, 5, 2] * np.array([-x[1], x[0]]),
                               atol=1e-13)
    assert np.all(a[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)


def test_prop_map_level_two_heads_torch_gradients():
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    X = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    TokenDependentHeads(ssm)(X).sum().backward()
    Xs = X.detach().clone().requires_grad_(True)
    ssm(Xs).sum().backward()
    assert torch.allclose(X.grad, Xs.grad, atol=1e-12)     # the same map, so the same gradient


def test_token_dependent_heads_is_a_module_with_its_values_a_parameter():
    # The SSM is a submodule, the value maps the parameter V; the dtype follows the SSM.
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    model = TokenDependentHeads(ssm)
    assert dict(model.named_children())["ssm"] is ssm and model.H == 2 and (model.d, model.p) == (2, 2)
    assert isinstance(model.V, torch.nn.Parameter) and model.values() is model.V
    single = TokenDependentHeads(LinearSSM.random(3, 2, 2, seed=0, dtype=torch.float32))
    X = np.random.default_rng(0).standard_normal((2, 7, 2))
    Y = single(torch.from_numpy(X).float())
    assert Y.dtype == torch.float32 and relative_error(Y, outputs(ssm, X)) < 1e-5


def test_token_dependent_heads_refuse_a_family_that_misses_a_token():
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    degenerate = np.stack([np.eye(2), np.diag([1.0, 0.5])])           # B(e_1) = [e_1, e_1]: rank 1
    X = torch.zeros(4, 2, dtype=torch.float64)
    X[0] = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="values must span"):
        TokenDependentHeads(ssm, degenerate)(X)
    with pytest.raises(ValueError, match="V must have shape"):
        TokenDependentHeads(ssm, np.ones((2, 3, 2)))


# -- thm-map-level-head-count, lem-odd-nonsingular, prop-nonsingular-families ------------------

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
        if (family is complex_values and 2 not in (p, d)) or (family is cayley_dickson_values and max(p, d) > 8):
            continue
        values = family(p, d)
        model = TokenDependentHeads(ssm, values)
        assert model.H == len(values)
        tokens = adversarial_tokens(values, d, rng)
        single = np.zeros((len(tokens), n, d))
        single[:, 0] = tokens
        mixed = rng.standard_normal((len(tokens), n, d))
        mixed[:, 3] = tokens
        for X in (single, mixed):
            Y, Y_hat = outputs(ssm, X), outputs(model, X)
            scale = np.abs(Y).max(axis=(1, 2), keepdims=True)
            scale[scale == 0] = 1.0
            assert np.abs((Y - Y_hat) / scale).max() < 1e-12, family.__name__
        assert interaction_rank(model, mixed[:3]) <= len(values)


@pytest.mark.parametrize("p, d", [(3, 3), (2, 3), (4, 4), (1, 3)])
def test_thm_map_level_head_count_fewer_than_r_star_heads_fail_at_a_token(p, d):
    # Necessity: on the input (u, 0, …, 0) an H-head model outputs Σ_h a_h V_h u at every position, so it
    # misses Σ_ℓ dist(L_ℓ u, span{V_h u})² >= Σ_{r>H} σ_r(K(u))² (Eckart–Young, computed here by numpy).
    ssm, n = LinearSSM.random(p * d + 1, d, p, spectral_radius=0.9, seed=p * d), p * d + 4
    u0 = np.random.default_rng(0).standard_normal(d)
    r_star = pointwise_lag_rank(ssm, n, u0)
    assert r_star == p == rank_np(lags_np(ssm, n) @ u0)
    rng = np.random.default_rng(1)
    u = rng.standard_normal(d)
    K = np.einsum("lpd,d->pl", lags_np(ssm, n), u)
    sigma = np.linalg.svd(K, compute_uv=False)
    for H in range(1, r_star):
        V = rng.standard_normal((H, p, d))
        B = np.einsum("hpd,d->ph", V, u)
        residual = K - B @ np.linalg.lstsq(B, K, rcond=None)[0]
        assert (residual ** 2).sum() >= (sigma[H:] ** 2).sum() * (1 - 1e-9) > 1e-6 * (sigma ** 2).sum()
        assert token_miss(ssm, n, V, u) ** 2 == pytest.approx((residual ** 2).sum() / (K ** 2).sum(), rel=1e-9)


def test_thm_map_level_head_count_bounds_and_exact_cases():
    # k = pd (certified pointwise-full): H_map = ν(p, d), exact where the bounds meet.
    for (p, d), nu in {(2, 2): 2, (3, 3): 4, (2, 3): 4, (4, 4): 4, (1, 3): 3}.items():
        ssm = LinearSSM.random(p * d, d, p, spectral_radius=0.9, seed=p + d)
        assert map_head_bounds(ssm, 3 * p * d) == (p * d, nu, nu)
    # k < p + d − 1: the lag span bounds the count from above, r* from below (min_heads: repeated eigenvalues).
    low = _rng_ssm(4, 3, 3, 0, np.diag([0.6, 0.6, -0.4, -0.4]))            # k = 2
    assert map_head_bounds(low, 12) == (2, 2, 2) and pointwise_lag_rank(low, 12, np.ones(3)) == 2
    # n < N: k from the lag matrix, which sees n lags only.
    short = LinearSSM.random(6, 2, 2, seed=5)
    assert map_head_bounds(short, 3)[0] == 3 == rank_np(lags_np(short, 3).reshape(3, -1))
    # r* counts the directions L_ℓ u reaches: at most n, and 0 on a token that B maps to 0.
    tall = LinearSSM.random(6, 2, 3, seed=6)
    assert pointwise_lag_rank(tall, 2, np.ones(2)) == 2 == rank_np(lags_np(tall, 2) @ np.ones(2))
    blind = ssm_from(np.diag([0.5, -0.3]), [[1.0, 0.0], [0.0, 0.0]], np.eye(2))
    assert pointwise_lag_rank(blind, 6, np.array([0.0, 1.0])) == 0 and pointwise_lag_rank(blind, 6, np.ones(2)) == 1


@pytest.mark.parametrize("p, d", [(3, 3), (3, 2), (5, 2), (3, 4)])
def test_lem_odd_nonsingular_p_odd_heads_lose_rank_at_some_token(p, d):
    # Any p heads with p odd: det[V_1 u … V_p u] changes sign between u and −u, and singular_token finds
    # a zero: the smallest singular value of 𝒱(u) falls to rounding, for random and for the best-conditioned
    # families we have (the first p quaternion/octonion heads).
    rng = np.random.default_rng(p + d)
    families = [rng.standard_normal((p, p, d)) for _ in range(4)] + [cayley_dickson_values(p, d)[:p]]
    for values in families:
        u0 = rng.standard_normal(d)
        B = np.einsum("hpd,d->ph", values, u0)
        assert np.linalg.det(B) * np.linalg.det(-B) <= 0
        u = singular_token(values, u0)
        assert np.linalg.norm(u) == pytest.approx(1.0, rel=1e-12)
        s = np.linalg.svd(np.einsum("hpd,d->ph", values, u), compute_uv=False)
        assert s[-1] <= 1e-13 * s[0]


def test_lem_odd_nonsingular_transposed_case_and_fewer_heads():
    # H = d odd, p >= 2 (the transposed family), and H < p, H < d: every token found leaves 𝒱(u) of rank < p.
    rng = np.random.default_rng(7)
    for H, p, d in [(3, 4, 3), (5, 6, 5), (2, 3, 4), (3, 2, 5)]:
        values = rng.standard_normal((H, p, d))
        u = singular_token(values, rng.standard_normal(d if H <= p else p))
        assert np.linalg.norm(u) == pytest.approx(1.0, rel=1e-12)
        s = np.linalg.svd(np.einsum("hpd,d->ph", values, u), compute_uv=False)
        assert len(s) < p or s[p - 1] <= 1e-12 * s[0]


def test_lem_odd_nonsingular_needs_odd_p():
    # For even p the sign argument gives nothing, and indeed the quaternion heads never lose rank.
    Q = cayley_dickson_values(4, 4)
    U = np.random.default_rng(0).standard_normal((2000, 4))
    np.testing.assert_allclose(np.linalg.det(token_matrix(Q, U)), np.linalg.norm(U, axis=1) ** 4, rtol=1e-12)
    with pytest.raises(ValueError, match="H = p odd"):
        singular_token(Q, np.ones(4))
    # The bisection itself, run where the lemma does not apply, finds no zero: it runs to −u_0 and B there
    # keeps full rank (σ = ‖u‖ = 1 for norm-preserving families), for p = 2, 4, 8 and d <= p.
    for p, d in [(2, 2), (4, 3), (4, 4), (8, 5), (8, 8)]:
        values = cayley_dickson_values(p, d)[:p]
        u0 = np.random.default_rng(p + d).standard_normal(d)
        u = half_circle_bisection(values, u0)
        np.testing.assert_allclose(u, -u0 / np.linalg.norm(u0), atol=1e-12)
        np.testing.assert_allclose(np.linalg.svd(token_matrix(values, u), compute_uv=False), 1.0, atol=1e-12)


@pytest.mark.parametrize("p, d", [(1, 1), (2, 2), (3, 3), (4, 4), (2, 5), (7, 8), (8, 8), (6, 2), (2, 4)])
def test_prop_nonsingular_families_norm_preserving_families(p, d):
    # Cayley–Dickson and complex families: 𝒱(u)𝒱(u)ᵀ = ‖u‖² I exactly (integer identity), checked also
    # on random tokens with numpy.
    families = [cayley_dickson_values(p, d)] + ([complex_values(p, d)] if 2 in (p, d) else [])
    for values in families:
        assert values.shape[1:] == (p, d)
        assert composition_defect(values) == 0.0
        U = np.random.default_rng(p * d).standard_normal((50, d))
        B = np.einsum("hpd,bd->bph", values, U)
        np.testing.assert_array_equal(token_matrix(values, U), B)
        np.testing.assert_allclose(B @ B.transpose(0, 2, 1),
                                   (U ** 2).sum(1)[:, None, None] * np.eye(p), atol=1e-12 * np.abs(U).max() ** 2)
    assert composition_defect(polynomial_values(2, 2)) > 0                       # not norm-preserving
    assert composition_defect(2 * cayley_dickson_values(2, 2)) == 6.0            # 2² · 2 − 2


def _quaternion(x, y):
    a1, b1, c1, d1 = x
    a2, b2, c2, d2 = y
    return np.array([a1 * a2 - b1 * b2 - c1 * c2 - d1 * d2, a1 * b2 + b1 * a2 + c1 * d2 - d1 * c2,
                     a1 * c2 - b1 * d2 + c1 * a2 + d1 * b2, a1 * d2 + b1 * c2 - c1 * b2 + d1 * a2])


def test_prop_nonsingular_families_cut_cayley_dickson_is_rows_of_the_uncut_scaled_orthogonal_matrix():
    # Part 3's proof through the uncut matrix: for p, d <= H, 𝒱(u) of the cut family is the first p rows
    # of M(ũ) of the H × H family, ũ = (u, 0); M(ũ)ᵀM(ũ) = M(ũ)M(ũ)ᵀ = ‖u‖² I_H, so 𝒱(u)𝒱(u)ᵀ = ‖u‖² I_p;
    # the cut product x ↦ 𝒱(u)x does not preserve norms when p < H.
    rng = np.random.default_rng(7)
    for p, d in [(3, 5), (2, 7), (5, 3), (1, 4), (3, 3)]:
        cut = cayley_dickson_values(p, d)
        H = len(cut)
        full = cayley_dickson_values(H, H)
        for _ in range(5):
            u = rng.standard_normal(d)
            padded = np.concatenate([u, np.zeros(H - d)])
            M, V = token_matrix(full, padded), token_matrix(cut, u)
            np.testing.assert_allclose(V, M[:p], atol=1e-12)
            np.testing.assert_allclose(M.T @ M, u @ u * np.eye(H), atol=1e-12)
            np.testing.assert_allclose(M @ M.T, u @ u * np.eye(H), atol=1e-12)
            np.testing.assert_allclose(V @ V.T, u @ u * np.eye(p), atol=1e-12)
        x = rng.standard_normal(H)
        if p < H:
            assert np.linalg.norm(V @ x) < np.linalg.norm(x) * np.linalg.norm(u) * (1 - 1e-6)


def test_prop_nonsingular_families_quaternions_are_hamilton_products():
    # The 4-head family is left multiplication by Hamilton's quaternions: V_h u = e_h · u.
    Q = cayley_dickson_values(4, 4)
    u = np.random.default_rng(3).standard_normal(4)
    for h in range(4):
        np.testing.assert_allclose(Q[h] @ u, _quaternion(np.eye(4)[h], u), atol=1e-15)


@pytest.mark.parametrize("p, d", [(1, 1), (2, 3), (3, 3), (4, 2), (5, 7)])
def test_prop_nonsingular_families_polynomial_product(p, d):
    # yᵀ V_h u is the t^h coefficient of y(t)u(t) (numpy.polymul, highest power first, reversed here),
    # and 𝒱(u) has full rank p for random, structured and root-on-the-unit-circle tokens.
    V = polynomial_values(p, d)
    assert V.shape == (p + d - 1, p, d)
    rng = np.random.default_rng(p + d)
    y, u = rng.standard_normal(p), rng.standard_normal(d)
    np.testing.assert_allclose(np.einsum("a,hab,b->h", y, V, u), np.polymul(y[::-1], u[::-1])[::-1], atol=1e-13)
    tokens = np.concatenate([rng.standard_normal((100, d)), np.eye(d),
                             [[1.0] * d, [(-1.0) ** b for b in range(d)]]])
    assert np.all(np.linalg.matrix_rank(token_matrix(V, tokens)) == p)


def test_nonsingular_values_picks_the_fewest_heads():
    assert [len(nonsingular_values(p, d)) for p, d in [(2, 2), (3, 3), (2, 6), (3, 5), (5, 5), (1, 9), (9, 9)]] \
        == [2, 4, 6, 7, 8, 9, 17]
    np.testing.assert_array_equal(nonsingular_values(2, 2), [np.eye(2), [[0.0, -1.0], [1.0, 0.0]]])
    assert nonsingular_dimension_bounds(3, 3) == (4, 4) and nonsingular_dimension_bounds(5, 5) == (8, 8)
    assert nonsingular_dimension_bounds(2, 7) == (8, 8) and nonsingular_dimension_bounds(1, 6) == (6, 6)
    assert nonsingular_dimension_bounds(6, 6) == (8, 8) and nonsingular_dimension_bounds(3, 5) == (7, 7)
    assert nonsingular_dimension_bounds(9, 9) == (16, 17)                       # open beyond 8 in the book


def test_worst_conditioned_tokens_finds_the_binomial_token_for_polynomials():
    # For polynomial multiplication by u(t) = (1 + t)^{d−1} (roots on the unit circle) the convolution
    # matrix is badly conditioned; the search returns it (or a worse one), and norm-preserving
    # families have condition number 1 everywhere.
    V = polynomial_values(5, 5)
    tokens, condition = worst_conditioned_tokens(V, 2000, 2, seed=1)
    binomial = np.array([1.0, 4.0, 6.0, 4.0, 1.0])
    sigma = np.linalg.svd(token_matrix(V, binomial), compute_uv=False)
    assert condition[0] >= sigma[0] / sigma[-1] * (1 - 1e-12) and condition[0] >= condition[1]
    np.testing.assert_allclose(np.linalg.cond(token_matrix(V, tokens)), condition, rtol=1e-9)
    assert np.allclose(worst_conditioned_tokens(cayley_dickson_values(5, 5), 500, 1)[1], 1.0)


# -- thm-head-count: necessity by the operator route -------------------------------------------


def test_thm_head_count_necessity_operator_route_matches_a_dense_numpy_operator(degenerate_ssm):
    # operator_head_errors reads 𝒲 off the forward pass; here 𝒲_ij = C A^(i−j) B (numpy powers) is
    # stacked into F (n², pd) and Eckart–Young is applied by numpy: the least errors agree, the
    # rank of F is min_heads, and k − 1 heads leave a positive error.
    ssm, n = degenerate_ssm
    lags = lags_np(ssm, n)
    F = np.zeros((n, n) + lags.shape[1:])
    for i in range(n):
        for j in range(i + 1):
            F[i, j] = lags[i - j]
    sigma2 = np.linalg.svd(F.reshape(n * n, -1), compute_uv=False) ** 2
    tails = np.array([sigma2[H:].sum() for H in range(len(sigma2) + 1)])
    got = operator_head_errors(ssm, n, len(sigma2))
    np.testing.assert_allclose(got, tails, rtol=1e-9, atol=1e-12 * max(tails[0], 1e-300))
    k = min_heads(ssm, n)
    assert rank_np(F.reshape(n * n, -1)) == k
    if k:
        assert got[k - 1] > 1e-10 * got[0] and got[k] <= 1e-20 * got[0]


def test_thm_head_count_necessity_operator_route_equals_the_closed_form():
    for seed, (N, d, p, n) in enumerate([(4, 3, 3, 16), (6, 2, 3, 9), (3, 1, 2, 5)]):
        ssm = LinearSSM.random(N, d, p, spectral_radius=0.8, seed=seed)
        np.testing.assert_allclose(operator_head_errors(ssm, n, p * d), optimal_head_errors(ssm, n, p * d),
                                   rtol=1e-8, atol=1e-14 * optimal_head_errors(ssm, n, 0)[0])


# -- prop-softmax-map-obstruction ----------------------------------------------------------------


def _explicit_softmax(scores, values, X):
    # y_i = Σ_h Σ_{j<=i} softmax_j(s_ij) V_h x_j by loops (the independent side of softmax_heads).
    H, n = scores.shape[0], X.shape[1]
    out = np.zeros(X.shape[:2] + (values.shape[1],))
    for i in range(n):
        for h in range(H):
            w = np.exp(scores[h, i, : i + 1] - scores[h, i, : i + 1].max())
            w /= w.sum()
            out[:, i] += np.einsum("j,pd,bjd->bp", w, values[h], X[:, : i + 1])
    return out


def test_prop_softmax_map_obstruction_two_heads_compute_any_memoryless_map():
    # Part 3: the two heads compute y_i = L_0 x_i (softmax_heads and a loop); their weights are a
    # softmax of finite scores that depend on i and j only; with any real scores, by part 1, a constant
    # input gives outputs constant in i.
    rng = np.random.default_rng(0)
    for p, d, n in [(3, 2, 7), (1, 1, 2), (2, 4, 12)]:
        L0 = rng.standard_normal((p, d))
        scores, values = memoryless_softmax_heads(L0, n)
        assert np.isfinite(np.tril(scores)).all()
        X = rng.standard_normal((4, n, d))
        Y = softmax_heads(torch.from_numpy(scores), torch.from_numpy(values), torch.from_numpy(X)).numpy()
        np.testing.assert_allclose(Y, np.einsum("pd,bnd->bnp", L0, X), atol=1e-13)
        np.testing.assert_allclose(_explicit_softmax(scores, values, X), Y, atol=1e-13)
        random_scores = rng.standard_normal((3, n, n)) * 3
        V = rng.standard_normal((3, p, d))
        constant = np.tile(rng.standard_normal(d), (2, n, 1))
        Yc = _explicit_softmax(random_scores, V, constant)
        np.testing.assert_allclose(Yc, np.broadcast_to(V.sum(0) @ constant[0, 0], Yc.shape), atol=1e-12)


def test_prop_softmax_map_obstruction_one_head_misses_by_one_minus_alpha22():
    # Part 2 on lib's SoftmaxAttention (one head, random projections and position bias): output 1 on (u, 0, …)
    # is V u, output 2 on (0, u, 0, …) is α_22 V u with α_22 < 1, so no LTI map fits both unless V u = 0.
    layer = SoftmaxAttention.random(3, 2, heads=1, seed=3)
    layer = SoftmaxAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O, position_bias=np.array([[0.3, -1.0, 2.0, 0.5]]))
    V = layer.values().detach().numpy()[0]
    rng = np.random.default_rng(1)
    for _ in range(20):
        u = rng.standard_normal(3) * 10.0 ** rng.uniform(-2, 0.5)  # larger tokens saturate α_22 to 1 in floats
        first, second = np.zeros((1, 4, 3)), np.zeros((1, 4, 3))
        first[0, 0], second[0, 1] = u, u
        y1, y2 = outputs(layer, first)[0, 0], outputs(layer, second)[0, 1]
        alpha22 = layer.weights(torch.from_numpy(second)).detach().numpy()[0, 0, 1, 1]
        np.testing.assert_allclose(y1, V @ u, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(y2, alpha22 * (V @ u), rtol=1e-12, atol=1e-14)
        assert alpha22 < 1 and np.linalg.norm(y2 - y1) > 1e-6 * np.linalg.norm(y1)


def test_prop_softmax_map_obstruction_continuity_zero_expected_error_is_not_attained():
    # The continuity argument after the proposition: on a constant input the heads' outputs are constant
    # in i (part 1) while an SSM with memory's are not, and the difference of the two continuous maps moves
    # by O(δ) within a ball of radius δ around it, so it stays above half its value on a ball of positive
    # Gaussian probability: a positive expected squared error, whatever the (continuous) scores.
    layer = SoftmaxAttention.random(3, 2, heads=2, max_length=6, seed=4)
    layer = SoftmaxAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O,
                             position_bias=np.random.default_rng(2).standard_normal((2, 6)))
    teacher = LinearSSM.random(4, 3, 2, spectral_radius=0.9, seed=6)
    rng = np.random.default_rng(3)

    def miss(X):
        return np.linalg.norm(outputs(layer, X) - outputs(teacher, X), axis=(1, 2))

    constant = np.tile(rng.standard_normal(3), (1, 6, 1))
    at_constant = miss(constant)[0]
    heads = outputs(layer, constant)[0]
    np.testing.assert_allclose(heads, np.broadcast_to(heads[0], heads.shape), atol=1e-12)
    assert at_constant > 0.1 * np.linalg.norm(outputs(teacher, constant))
    for delta in (1e-1, 1e-3):
        Z = rng.uniform(-1, 1, size=(200, 6, 3)) * delta / np.sqrt(18)  # inside the ball of radius δ
        assert np.abs(miss(constant + Z) - at_constant).max() <= 20 * delta * (1 + np.abs(constant).max())
    assert (miss(constant + Z) > at_constant / 2).all()


# -- prop-rank-limited-heads --------------------------------------------------------------------


def _rotation_least(radius=0.9, angle=0.6, n=32):
    ssm = LinearSSM.damped_rotation(radius, angle)
    least = optimal_head_errors(ssm, n, 2)
    return ssm, n, least[0] - least[1], least[1]


def test_prop_rank_limited_heads_value_span_error_is_least_squares():
    # value_span_error against numpy least squares of every weighted lag on span{V_h}.
    ssm, n = LinearSSM.random(4, 3, 2, seed=3), 9
    V = np.random.default_rng(0).standard_normal((2, 2, 3))
    lags = lags_np(ssm, n).reshape(n, -1)
    coef = np.linalg.lstsq(V.reshape(2, -1).T, lags.T, rcond=None)[0]
    residual = ((lags - (V.reshape(2, -1).T @ coef).T) ** 2).sum(1)
    assert value_span_error(ssm, n, V) == pytest.approx((np.arange(n, 0, -1) * residual).sum(), rel=1e-10)
    assert value_span_error(ssm, n, np.zeros((1, 2, 3))) == pytest.approx(optimal_head_errors(ssm, n, 0)[0])


def test_output_relative_error_against_the_optimal_heads_and_the_fit():
    # Two other routes: the least error of H free heads (thm-approx-head-count, from the singular
    # values), reached by the top H right singular vectors of the weighted lags; and the error
    # fit_rank_limited_heads(weighted=True) reports for its own value maps (lib's _span_error).
    ssm, n = LinearSSM.random(3, 2, 3, seed=1), 11
    least = optimal_head_errors(ssm, n, 3)
    G = np.sqrt(np.arange(n, 0, -1))[:, None] * lags_np(ssm, n).reshape(n, -1)
    top = np.linalg.svd(G)[2]
    for H in range(4):
        error = output_relative_error(ssm, n, top[:H].reshape(H, 3, 2))
        assert error ** 2 == pytest.approx(least[H] / least[0], rel=1e-8, abs=1e-14)
    e, V = fit_rank_limited_heads(ssm, n, 2, 1, weighted=True, restarts=2)
    assert output_relative_error(ssm, n, V) == pytest.approx(e, rel=1e-6)
    assert output_relative_error(ssm, n, np.zeros((0, 3, 2))) == 1.0
    with pytest.raises(ValueError, match=r"values must be a finite \(H, p, d\) = \(H, 3, 2\)"):
        output_relative_error(ssm, n, np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="values must be a finite"):
        output_relative_error(ssm, n, np.full((1, 3, 2), np.nan))
    zero = LinearSSM(np.eye(3) / 2, np.ones((3, 2)), np.zeros((3, 3)))  # the zero map: nothing to miss
    assert output_relative_error(zero, n, np.zeros((0, 3, 2))) == 0.0


def _dense_operator(ssm, n):
    """𝒲 (n, n, p, d) read off the forward pass on the n·d unit impulses (no lags)."""
    impulses = torch.eye(n * ssm.d, dtype=torch.float64).reshape(n * ssm.d, n, ssm.d)
    with torch.no_grad():
        Y = ssm.to(torch.float64)(impulses).numpy()  # Y[j·d + b, i, a] = 𝒲_ij[a, b]
    return Y.reshape(n, ssm.d, n, ssm.p).transpose(2, 0, 3, 1)


@pytest.mark.parametrize("ssm", [DiagonalSSM.random(3, 4, seed=2), SharedStateSSM.random(3, 4, seed=1),
                                 LinearSSM.random(3, 2, 3, seed=4)], ids=["S4D layer", "S5 layer", "LinearSSM"])
def test_memory_output_errors_against_the_dense_operator(ssm):
    # Another route: the operator 𝒲 from impulses, the fitted operator Σ_h c_{h,i−j} V_h with
    # the coefficients of numpy least squares lag by lag, and the Frobenius norms of their
    # strictly causal parts (the memory, i > j) and of everything (white tokens).
    n, (p, d) = 7, (ssm.p, ssm.d)
    W = _dense_operator(ssm, n)
    i, j = np.tril_indices(n, -1)
    total, memory = (W ** 2).sum(), (W[i, j] ** 2).sum()
    assert memoryless_output_error(ssm, n) == pytest.approx(np.sqrt(memory / total), rel=1e-10)
    V = np.random.default_rng(0).standard_normal((2, p, d))
    lags = np.stack([W[ell, 0] for ell in range(n)]).reshape(n, -1)
    coef = np.linalg.lstsq(V.reshape(2, -1).T, lags.T, rcond=None)[0]  # (2, n)
    fitted = (V.reshape(2, -1).T @ coef).T.reshape(n, p, d)
    miss = ((W[i, j] - fitted[i - j]) ** 2).sum()
    assert memory_output_error(ssm, n, V) == pytest.approx(np.sqrt(miss / memory), rel=1e-8)
    # no heads: all the memory missed; all lags as maps: none missed; and the split of e_y
    assert memory_output_error(ssm, n, np.zeros((0, p, d))) == 1.0
    assert memory_output_error(ssm, n, lags.reshape(n, p, d)) < 1e-7
    e_y, e_mem, e_0 = output_relative_error(ssm, n, V), memory_output_error(ssm, n, V), memoryless_output_error(ssm, n)
    assert e_y >= e_0 * e_mem * (1 - 1e-12)


def test_memory_output_errors_check_their_arguments():
    ssm = LinearSSM.random(3, 2, 3, seed=4)
    with pytest.raises(ValueError, match="n must be"):
        memoryless_output_error(ssm, 0)
    with pytest.raises(TypeError, match="ssm must be"):
        memoryless_output_error("ssm", 4)
    with pytest.raises(ValueError, match=r"values must be a finite \(H, p, d\) = \(H, 3, 2\)"):
        memory_output_error(ssm, 4, np.zeros((1, 2, 3)))
    with pytest.raises(ValueError, match="n must be"):
        memory_output_error(ssm, 0, np.zeros((1, 3, 2)))
    assert memory_output_error(ssm, 1, np.zeros((0, 3, 2))) == 0.0   # n = 1: no memory to miss
    assert memoryless_output_error(ssm, 1) == 0.0
    zero = LinearSSM(np.eye(3) / 2, np.ones((3, 2)), np.zeros((3, 3)))  # the zero map
    assert memoryless_output_error(zero, 4) == 0.0 and memory_output_error(zero, 4, np.zeros((0, 3, 2))) == 0.0


def test_prop_rank_limited_heads_damped_rotation_closed_forms():
    # One rank-one head: σ_2² + σ_1²/2 (attained); two: σ_2²/2, approached by rank_one_pair (error − σ_2²/2 =
    # O(t²)) and never reached by the optimiser; three: 0 (RelativeHeads with the triple, population error);
    # full rank: the closed form of thm-approx-head-count. Other radii and angles too.
    for radius, angle in [(0.9, 0.6), (0.7, 1.3), (0.95, 0.2)]:
        ssm, n, s1, s2 = _rotation_least(radius, angle, 24)
        energy = s1 + s2
        if angle == 0.6:  # the optimiser, on one instance (it is slow near the infimum)
            assert rank_limited_head_error(ssm, n, 1, 1, restarts=3, max_iter=100) == pytest.approx(s2 + s1 / 2, rel=1e-9)
            assert rank_limited_head_error(ssm, n, 1, 2, restarts=3, max_iter=100) == pytest.approx(s2, rel=1e-9)
            found = rank_limited_head_error(ssm, n, 2, 1, restarts=5, max_iter=100)
            assert s2 / 2 * (1 - 1e-12) <= found <= s2 / 2 + 1e-2 * energy
        gaps = []
        for t in (1e-2, 1e-3):
            pair = rank_one_pair(ssm, n, t)
            assert all(np.linalg.matrix_rank(v, tol=1e-9 * np.linalg.norm(v)) == 1 for v in pair)
            gaps.append(value_span_error(ssm, n, pair) - s2 / 2)
        assert 0 < gaps[1] < gaps[0] / 50
        triple = rank_one_triple()
        c = np.linalg.lstsq(triple.reshape(3, -1).T, lags_np(ssm, n).reshape(n, -1).T, rcond=None)[0]
        assert population_error(ssm, RelativeHeads(triple, c), n) <= 1e-24 * energy


def test_prop_rank_limited_heads_random_two_rank_one_families_never_beat_the_infimum():
    # Any two rank-one maps (random factors) leave more than σ_2²/2; so does the one-head bound.
    ssm, n, s1, s2 = _rotation_least()
    rng = np.random.default_rng(4)
    for _ in range(400):
        a, b = rng.standard_normal((2, 2, 1)), rng.standard_normal((2, 1, 2))
        assert value_span_error(ssm, n, a @ b) > s2 / 2
    for _ in range(200):
        M = rng.standard_normal((2, 1)) @ rng.standard_normal((1, 2))
        assert value_span_error(ssm, n, M[None]) >= (s2 + s1 / 2) * (1 - 1e-12)


def test_prop_rank_limited_heads_part_1_generic_ssm_needs_more_rank_one_heads():
    # A random 3 × 3 SSM with k = 9: full-rank heads need 9; rank-one heads cannot do with 9 either unless
    # their span is everything (it can: E_ab), and 9 rank-one heads E_ab represent it; with k = 2 and
    # r = 1 the bound k ⌈min(p, d)/r⌉ = 6 is met by splitting a basis by its SVD.
    ssm, n = LinearSSM.random(9, 3, 3, spectral_radius=0.8, seed=2), 12
    assert min_heads(ssm, n) == 9
    units = np.eye(9).reshape(9, 3, 3)
    assert value_span_error(ssm, n, units) <= 1e-24 * optimal_head_errors(ssm, n, 0)[0]
    low = _rng_ssm(4, 3, 3, 0, np.diag([0.6, 0.6, -0.4, -0.4]))  # k = 2
    basis = np.linalg.svd(lags_np(low, n).reshape(n, -1))[2][:2].reshape(2, 3, 3)
    pieces = []
    for B in basis:
        U, sig, Wt = np.linalg.svd(B)
        pieces += [sig[i] * np.outer(U[:, i], Wt[i]) for i in range(3)]
    assert len(pieces) == 6 and value_span_error(low, n, np.array(pieces)) <= 1e-24 * optimal_head_errors(low, n, 0)[0]


# -- cor-map-level-exact ------------------------------------------------------------------------


def _nu_formula(p, d):
    # The values of cor-map-level-exact, written as the corollary states them (p, d <= 8).
    a, b = min(p, d), max(p, d)
    if a == 1 or b in (2, 4, 8) or (a == 2 and b % 2 == 0):
        return b
    if (a >= 2 and b in (3, 7)) or (a == 2 and b % 2 == 1):
        return b + 1
    return 7 if (a, b) == (3, 5) else 8


def test_cor_map_level_exact_values_match_the_bounds():
    # For every p, d <= 8 the Hopf–Stiefel number (lower bound) and the smallest family (upper bound)
    # meet at the corollary's value; the lemma's bound is below it exactly at the 7 sizes p <= d the
    # referee listed (and their transposes).
    gaps = set()
    for p in range(1, 9):
        for d in range(1, 9):
            assert nonsingular_dimension_bounds(p, d) == (_nu_formula(p, d),) * 2, (p, d)
            if elementary_nonsingular_bound(p, d) < _nu_formula(p, d):
                gaps.add((min(p, d), max(p, d)))
    assert gaps == {(3, 5), (3, 6), (4, 5), (4, 6), (5, 5), (5, 6), (6, 6)}


def _radon_hurwitz(m):
    # ρ(m) = 8a + 2^b for m = 2^(4a + b) · odd, 0 <= b <= 3.
    v = (m & -m).bit_length() - 1
    return 8 * (v // 4) + 2 ** (v % 4)


def test_cor_map_level_exact_hopf_stiefel_number_against_known_values():
    # p = m: ℝ^m × ℝ^d → ℝ^m is allowed by the condition iff d <= 2^v (v = 2-adic valuation of m); that
    # is the Radon–Hurwitz number for m < 16, and above it at m = 16 (ρ(16) = 9): a necessary condition
    # only. The GF(2) ring route gives the same least m (no binomial coefficients); the number is
    # symmetric, at least the lemma's bound, at most p + d − 1 (polynomial family).
    for m in range(1, 17):
        allowed = max(d for d in range(1, 2 * m + 1) if hopf_stiefel_number(m, d) <= m)
        assert allowed == 2 ** ((m & -m).bit_length() - 1)
        assert (allowed == _radon_hurwitz(m)) == (m < 16)
    for p in range(1, 12):
        for d in range(1, 12):
            number = hopf_stiefel_number(p, d)
            assert number == hopf_stiefel_number(d, p)
            assert truncated_binomial_vanishes(p, d, number) and not truncated_binomial_vanishes(p, d, number - 1)
            assert elementary_nonsingular_bound(p, d) <= number <= p + d - 1
    assert [hopf_stiefel_number(p, d) for p, d in [(3, 5), (5, 5), (9, 9), (3, 3), (2, 5)]] == [7, 8, 16, 4, 6]


def test_cor_map_level_exact_search_finds_the_tokens_hopf_stiefel_promises():
    # One map fewer than ν where the lemma says nothing (H > max(p, d)): the search finds a token with
    # rank 𝒱(u) < p, for random and structured families; on a nonsingular family it cannot (σ_p stays
    # at ‖u‖ for the octonions, at a positive floor for the polynomial family).
    rng = np.random.default_rng(11)
    for p, d in [(3, 5), (5, 5), (3, 6), (4, 6), (6, 6)]:
        H = hopf_stiefel_number(p, d) - 1
        for values in [rng.standard_normal((H, p, d)), nonsingular_values(p, d)[:H]]:
            u = search_singular_token(values, seed=1)
            s = np.linalg.svd(token_matrix(values, u), compute_uv=False)
            assert np.linalg.norm(u) == pytest.approx(1.0) and s[p - 1] <= 1e-12 * s[0]
    for values in [cayley_dickson_values(5, 5), polynomial_values(3, 5)]:
        u = search_singular_token(values, restarts=5, seed=2)
        s = np.linalg.svd(token_matrix(values, u), compute_uv=False)
        assert s[-1] >= 1e-3 * s[0]


@pytest.mark.parametrize("p, d", [(2, 2), (3, 3), (2, 3), (4, 4), (1, 3), (2, 5), (3, 5), (5, 5)])
def test_cor_map_level_exact_one_head_fewer_misses_a_full_ssm(p, d):
    # For an SSM with k = pd: ν heads compute it, and ν − 1 value maps (random, or the first ν − 1 of the
    # family) miss it at the token of singular_token (or of the search, where only Hopf–Stiefel promises
    # one); the miss is recomputed here by least squares on the lags L_ℓ u, with 𝒱(u)'s range cut to
    # its numerical rank.
    nu = _nu_formula(p, d)
    ssm, n = LinearSSM.random(p * d, d, p, spectral_radius=0.9, seed=p + 2 * d), p * d + 2
    assert map_head_bounds(ssm, n)[0] == p * d
    X = np.random.default_rng(0).standard_normal((3, n, d))
    assert relative_error(outputs(TokenDependentHeads(ssm, nonsingular_values(p, d)), X), outputs(ssm, X)) < 1e-12
    rng = np.random.default_rng(p * d)
    H = nu - 1
    for values in [rng.standard_normal((H, p, d)), nonsingular_values(p, d)[:H]]:
        if H > max(p, d):
            u = search_singular_token(values)
        else:
            u = singular_token(values, rng.standard_normal(d if H <= p else p))
        K = np.einsum("lpd,d->pl", lags_np(ssm, n), u)
        B = np.einsum("hpd,d->ph", values, u)
        left, sigma, _ = np.linalg.svd(B, full_matrices=False)
        basis = left[:, sigma > 1e-10 * np.linalg.norm(values)]
        miss = np.linalg.norm(K - basis @ basis.T @ K) / np.linalg.norm(K)
        assert miss > 1e-3
        assert token_miss(ssm, n, values, u) == pytest.approx(miss, rel=1e-9)


def test_token_miss_edge_cases():
    # A family that spans ℝ^p at u misses nothing; the zero family misses everything; an SSM that
    # outputs 0 is missed by nothing.
    ssm = LinearSSM.damped_rotation(0.9, 0.6)
    assert token_miss(ssm, 8, cayley_dickson_values(2, 2), np.array([0.3, -1.0])) < 1e-14
    assert token_miss(ssm, 8, np.zeros((2, 2, 2)), np.array([0.3, -1.0])) == 1.0
    silent = ssm_from(0.5 * np.eye(2), np.zeros((2, 2)), np.ones((2, 2)))
    assert token_miss(silent, 8, np.zeros((1, 2, 2)), np.array([0.3, -1.0])) == 0.0


# -- prop-heads-needed-lag-bound and prop-heads-needed-continuous-limit -------------------------


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
    assert lag_energy_count(ssm_from(0.5 * np.eye(2), np.zeros((2, 1)), np.ones((1, 2))), n, 0.1) == 0


# -- prop-heads-needed-aliasing ------------------------------------------------------------------


def test_prop_heads_needed_aliasing_counts_distinct_eigenvalues_and_caps_k():
    # At Δ = 1/j the eigenvalues ρe^{±iπm/j} of the S4D-Lin system coincide modulo 2j: three counts
    # of the distinct ones agree (residues; the closed-form eigenvalues; numpy on the built A), and
    # k_n (rank of the non-decaying lags of A/ρ) is at most min(N, 2j) — here equal to the count.
    for N, j in [(6, 1), (7, 1), (8, 2), (16, 5), (16, 20), (24, 3), (9, 4)]:
        rho = float(np.exp(-1 / (2 * j)))
        ssm = s4d_ssm(N, 8, rho, init="lin", seed=2)
        A = ssm.A.numpy(force=True)
        closed = np.exp(1j * np.pi * np.concatenate([np.arange(1, N // 2 + 1), -np.arange(1, N // 2 + 1),
                                                    [0] * (N % 2)]) / j)
        distinct = len({(round(z.real, 9) + 0.0, round(z.imag, 9) + 0.0) for z in closed})
        count = aliased_eigenvalue_count(N, j)
        assert count == distinct == distinct_eigenvalue_count(A) <= min(N, 2 * j)
        rescaled = ssm_from(A / rho, ssm.B.numpy(force=True), ssm.C.numpy(force=True))
        lags = lags_np(rescaled, 2 * N).reshape(2 * N, -1)
        s = np.linalg.svd(lags, compute_uv=False)
        k = int((s > 1e-9 * s[0]).sum())
        assert k == count <= min(N, 2 * j)
    # Off the special steps no two eigenvalues coincide: k = N.
    generic = s4d_ssm(16, 8, 0.6, init="lin", seed=2)
    assert distinct_eigenvalue_count(generic.A.numpy(force=True)) == 16 == min_heads(generic, 64)


def _relative_tails(ssm, n, H_max):
    tails = optimal_head_errors(ssm, n, H_max)
    return tails / tails[0]


def test_prop_heads_needed_continuous_limit_converges_at_rate_one_over_n():
    # Fixed window T = nΔ: the relative least errors of the ZOH SSM approach those of Γ_T (closed form),
    # with a deviation that shrinks like Δ = T/n.  Independent of the closed form: a fine quadrature of
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
    np.testing.assert_allclose(limit, quadrature, rtol=1e-5)
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
    # trace Γ_T = ∫_0^T (1 − t/T) ‖K(t)‖² dt → T ‖K(0)‖²/2 as T → 0.
    assert short[1][0] == pytest.approx(1e-3 * ((C @ B_c) ** 2).sum() / 2, rel=1e-2)
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


def _heads_needed_np(ssm, n, eps):
    # The least H with Σ_{q>H} σ_q(G)² ≤ ε ‖G‖_F², G with rows √(n−ℓ) vec(L_ℓ), lags by iterated products.
    A, B, C = numpy_of(ssm)
    rows, state = [], B.copy()
    for ell in range(n):
        rows.append(np.sqrt(n - ell) * (C @ state).ravel())
        state = A @ state
    s2 = np.linalg.svd(np.array(rows), compute_uv=False) ** 2
    tails = s2.sum() - np.concatenate([[0.0], np.cumsum(s2)])
    return int(np.argmax(tails <= eps * s2.sum()))


def test_heads_needed_near_one_fewer_than_k_for_small_states():
    # Referee A 1: beyond the grid ρ ≤ 0.999 the small states need fewer heads than k_n = N too.
    for N, expected in ((4, 2), (8, 2)):
        ssm = s4d_ssm(N, 8, 0.9999, init="lin", seed=0)
        count = heads_needed(ssm, 1024, 1e-2)
        assert count == _heads_needed_np(ssm, 1024, 1e-2) == expected
        assert count < N == modal_lag_span_dimension(ssm)


def test_heads_needed_does_not_fall_when_the_decay_slows_at_a_fixed_step():
    # Referee A 2: the S5-like N = 64 system at the step of ρ = 0.9, modes rescaled to a slower decay.
    base = s4d_ssm(64, 8, 0.9, init="lin", seed=0)
    counts = []
    for radius in (0.9, 0.99, 0.999, 0.9999):
        ssm = LinearSSM(base.A * (radius / base.spectral_radius), base.B, base.C)
        counts.append(heads_needed(ssm, 1024, 1e-2))
    assert counts == [13, 19, 29, 29]
    assert _heads_needed_np(LinearSSM(base.A * (0.99 / 0.9), base.B, base.C), 1024, 1e-2) == 19


def _zoh_lags_by_quadrature(A_c, B_c, C, step, n, points=2001):
    # L_ℓ = ∫_{ℓΔ}^{(ℓ+1)Δ} C e^{t A_c} B_c dt by the trapezoidal rule on eigen-decomposed exponentials.
    mu, R = np.linalg.eig(A_c)
    Rinv = np.linalg.inv(R)
    out = []
    for ell in range(n):
        t = np.linspace(ell * step, (ell + 1) * step, points)
        K = np.einsum("pm,tm,md->tpd", C @ R, np.exp(np.outer(t, mu)), Rinv @ B_c).real
        out.append(np.trapezoid(K, t, axis=0))
    return np.stack(out)


def test_prop_heads_needed_short_window_lags_are_integrals_of_the_impulse_response():
    # The proof's first step: with ZOH, L_ℓ = ∫_{ℓΔ}^{(ℓ+1)Δ} K(t) dt (lib's block exponential against quadrature).
    A_c, B_c, C = s4d_continuous(6, 3, seed=2)
    ssm = LinearSSM.from_continuous(A_c, B_c, C, 0.05, "zoh")
    np.testing.assert_allclose(lags_np(ssm, 5), _zoh_lags_by_quadrature(A_c, B_c, C, 0.05, 5), atol=1e-9)


def _short_window_system(system):
    # An S4D-Lin system, or a non-normal A_c (its symmetric part has a positive eigenvalue: μ > 0).
    if system == "s4d-lin":
        return s4d_continuous(16, 4, seed=1)
    rng = np.random.default_rng(5)
    A_c = rng.standard_normal((5, 5)) + 3 * np.eye(5, k=1)
    return A_c, rng.standard_normal((5, 3)), rng.standard_normal((2, 5))


@pytest.mark.parametrize("system", ["s4d-lin", "non-normal"])
def test_prop_heads_needed_short_window_bound_holds_at_every_length(system):
    # The relative one-head least error (SVD of G by numpy) never exceeds the bound, for n from 1 to 500
    # and windows on both sides of the threshold; for a non-normal A_c (μ > 0 possible) too.
    A_c, B_c, C = _short_window_system(system)
    assert np.linalg.eigvalsh((A_c + A_c.T) / 2).max() > 0 or system == "s4d-lin"
    finite = 0
    for T in (1e-1, 1e-2, 1e-3, 1e-4):
        bound = short_window_bound(A_c, B_c, C, T)
        for n in (1, 2, 7, 60, 500):
            ssm = LinearSSM.from_continuous(A_c, B_c, C, T / n, "zoh")
            G = lags_np(ssm, n).reshape(n, -1) * np.sqrt(np.arange(n, 0, -1.0))[:, None]
            sigma2 = np.linalg.svd(G, compute_uv=False) ** 2
            assert sigma2[1:].sum() / sigma2.sum() <= bound * (1 + 1e-9)
        finite += np.isfinite(bound)
    assert finite >= 2


def test_prop_heads_needed_short_window_one_head_below_the_threshold_and_order_T_squared():
    # Below T* one head reaches ε at every n (zero heads never do: ε < 1); the one-head error is
    # of order T² like the bound (it shrinks ~100-fold per 10-fold T); the bound matches its formula.
    A_c, B_c, C = s4d_continuous(8, 3, seed=0)
    eps = 1e-2
    T_star = short_window_threshold(A_c, B_c, C, eps)
    assert short_window_bound(A_c, B_c, C, T_star) <= eps < short_window_bound(A_c, B_c, C, T_star * 1.001)
    for n in (1, 5, 100, 2000):
        ssm = LinearSSM.from_continuous(A_c, B_c, C, T_star / n, "zoh")
        assert heads_needed(ssm, n, eps) == 1
    errors = []
    for T in (1e-3, 1e-4):
        tails = optimal_head_errors(LinearSSM.from_continuous(A_c, B_c, C, T / 300, "zoh"), 300, 1)
        errors.append(tails[1] / tails[0])
    assert 80 < errors[0] / errors[1] < 120
    K0 = np.linalg.norm(C @ B_c)
    M = impulse_slope_max(A_c, B_c, C, 1e-3)[1]
    assert short_window_bound(A_c, B_c, C, 1e-3) == pytest.approx((1e-3 * M / (K0 - 1e-3 * M)) ** 2, rel=1e-12)
    T_big = 1.0
    assert T_big * impulse_slope_max(A_c, B_c, C, T_big)[1] >= K0
    assert short_window_bound(A_c, B_c, C, T_big) == np.inf
    assert short_window_threshold(A_c, np.zeros_like(B_c), C, eps) == 0.0


def _impulse_slope_by_modes(A_c, B_c, C, T, points):
    # ‖C A_c e^{t A_c} B_c‖_F on a grid, from numpy's eigendecomposition (not lib's or torch's exponential).
    mu, R = np.linalg.eig(A_c)
    left, right = C @ A_c @ R, np.linalg.inv(R) @ B_c
    t = np.linspace(0.0, T, points)
    K1 = np.einsum("pm,tm,md->tpd", left, np.exp(np.outer(t, mu)), right).real
    return np.sqrt((K1 ** 2).sum(axis=(1, 2)))


@pytest.mark.parametrize("system", ["s4d-lin", "non-normal"])
def test_prop_heads_needed_short_window_kappa_is_bracketed(system):
    # κ_T = max_{t<=T} ‖K'(t)‖_F: a 20× finer grid by eigen-modes stays within [lower, upper], and the bracket
    # is narrow (the upper end is the grid maximum plus a bound on the rise between grid points).
    A_c, B_c, C = _short_window_system(system)
    for T in (1e-3, 1e-1, 1.0):
        lower, upper = impulse_slope_max(A_c, B_c, C, T)
        fine = _impulse_slope_by_modes(A_c, B_c, C, T, 40_961).max()
        assert lower <= fine * (1 + 1e-9) and fine <= upper
        assert upper - lower <= 0.05 * lower
    assert impulse_slope_max(A_c, B_c, C, 1e-3)[0] >= np.linalg.norm(C @ A_c @ B_c) * (1 - 1e-12)


@pytest.mark.parametrize("system", ["s4d-lin", "non-normal"])
def test_prop_heads_needed_short_window_key_step_holds_and_is_nearly_tight(system):
    # The proof's key step ‖L_ℓ − ΔK(0)‖_F <= (ℓ + ½)Δ²κ_T: the largest ratio over ℓ is at most 1 at every
    # window and length, and within 1e-3 of 1 on short windows (a κ_T too small by 1e-3 would break it).
    A_c, B_c, C = _short_window_system(system)
    for T in (1e-1, 1e-2, 1e-4):
        for n in (1, 7, 300):
            ratio = short_window_step_ratio(A_c, B_c, C, T, n)
            assert ratio <= 1.0
            if T == 1e-4:
                assert ratio > 0.999
    kappa, ssm = impulse_slope_max(A_c, B_c, C, 1e-2)[1], LinearSSM.from_continuous(A_c, B_c, C, 1e-2 / 7, "zoh")
    assert short_window_step_ratio(A_c, B_c, C, 1e-2, 7, ssm=ssm, kappa=kappa) == short_window_step_ratio(
        A_c, B_c, C, 1e-2, 7)
    assert short_window_bound(A_c, B_c, C, 1e-2, kappa) == short_window_bound(A_c, B_c, C, 1e-2)


def test_continuous_head_errors_refuses_repeated_modes():
    with pytest.raises(ValueError, match="repeated eigenvalues"):
        continuous_head_errors(-np.eye(2), np.ones((2, 1)), np.ones((1, 2)), 1.0, 1)


# -- the training sweep -------------------------------------------------------------------------

N_SEQ, D = 8, 2
TEACHER = LinearSSM.random(3, D, D, spectral_radius=0.8, seed=1)   # k = 3 on length 8
SECOND = LinearSSM.random(2, D, D, spectral_radius=0.7, seed=4)    # k = 2 on length 8


def test_train_students_factorized_rows_equal_students_built_and_trained_by_hand():
    # The sweep against the plain route: the students built here from their documented draws (V ~ N(0, 1/d),
    # then c ~ N(0, 0.1²), default_rng(3 + s)) and trained by lib.imitate on the batch stream of seed 3;
    # errors by population_error, optima by optimal_head_errors; order teachers × heads × seeds; heads a
    # function of k.
    rows = train_students([TEACHER, SECOND], N_SEQ, lambda k: (1, k), seeds=2, steps=30, seed=3)
    assert [(r["k"], r["H"], r["seed"]) for r in rows] == (
        [(3, H, 3 + s) for H in (1, 3) for s in (0, 1)] + [(2, H, 3 + s) for H in (1, 2) for s in (0, 1)])
    for teacher, k, part in ((TEACHER, 3, rows[:4]), (SECOND, 2, rows[4:])):
        optimum = optimal_head_errors(teacher, N_SEQ, k)
        students = []
        for row in part:
            rng = np.random.default_rng(row["seed"])
            V = rng.standard_normal((row["H"], D, D)) / np.sqrt(D)
            students.append(RelativeHeads(V, 0.1 * rng.standard_normal((row["H"], N_SEQ))))
        imitate(students, teacher, steps=30, seed=3)
        for row, student in zip(part, students):
            assert row["model"] == "factorized (trained)"
            assert row["error"] == pytest.approx(population_error(teacher, student, N_SEQ), rel=1e-12)
            assert row["optimum"] == optimum[row["H"]] and row["energy"] == optimum[0]
            assert row["relative squared error"] == pytest.approx(row["error"] / optimum[0], rel=1e-15)


def test_train_students_softmax_rows_equal_separate_training_runs():
    # Softmax students from their documented draws (W_Q, W_K, W_V ~ N(0, 1/d) with d_k = d_v = d,
    # W_O ~ N(0, 1/(H d)), zero position scores), each trained alone.
    rows = train_students([SECOND], N_SEQ, [2, 1], model="softmax", steps=20, batch=8, seed=5)
    assert [(r["k"], r["H"], r["seed"], r["model"]) for r in rows] == [
        (2, 2, 5, "softmax attention (trained)"), (2, 1, 5, "softmax attention (trained)")]
    optimum = optimal_head_errors(SECOND, N_SEQ, 2)
    for row in rows:
        H, rng = row["H"], np.random.default_rng(5)
        W_Q, W_K, W_V = (rng.standard_normal((H, D, D)) / np.sqrt(D) for _ in range(3))
        W_O = rng.standard_normal((H, D, D)) / np.sqrt(H * D)
        student = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=np.zeros((H, N_SEQ)))
        [(error, _)] = imitate([student], SECOND, steps=20, batch=8, seed=5)
        assert row["error"] == error and row["optimum"] == optimum[row["H"]]


# -- prop-softmax-obstruction with the residual connection ------------------------------------------


def test_prop_softmax_obstruction_residual_block_rows_sum_to_i_plus_values():
    from experiments.head_count import row_sum_deviation
    from lib import Stack
    rng = np.random.default_rng(7)
    base = SoftmaxAttention.random(3, 3, heads=2, seed=7)
    layer = SoftmaxAttention(base.W_Q, base.W_K, base.W_V, base.W_O, causal=True,
                             position_bias=rng.standard_normal((2, 6)))
    X = torch.from_numpy(3 * rng.standard_normal((4, 6, 3)))
    values = np.einsum("hpv,hvd->pd", *(w.numpy(force=True) for w in (layer.W_O, layer.W_V)))
    block = Stack([layer], residual=True)
    assert row_sum_deviation(layer, X, values) < 1e-13
    assert row_sum_deviation(block, X, values + np.eye(3)) < 1e-13
    assert row_sum_deviation(block, X, values) > 0.1  # the identity path is there


def test_heads_needed_width_raises_the_slow_count_and_barely_the_fast_one():
    # heads-needed.ipynb "Width": at a slow radius the count at ε = 1e-2 does not fall as p = d grows
    # (and stays under min(N, pd)); at a fast radius it moves by less than half as much.
    counts = {r: np.array([heads_needed(s4d_ssm(32, d, r, init="lin", seed=0), 256, 1e-2) for d in (4, 8, 16)])
              for r in (0.9, 0.99)}
    slow, fast = counts[0.99], counts[0.9]
    assert (slow <= np.minimum(32, np.array([4, 8, 16]) ** 2)).all()
    assert (np.diff(slow) >= 0).all() and slow[-1] - slow[0] > 2 * (fast[-1] - fast[0])


# -- thm-rank-limited-heads, cor-heads-as-built: the notebook's helpers ----------------------------


def test_as_built_verdict_reads_the_bounds():
    from experiments.head_count import as_built_verdict
    assert [as_built_verdict(3, 3, H) for H in (2, 3, 4)] == ["no", "yes", "yes"]
    assert as_built_verdict(3, 5, 4) == "open"


def test_thm_rank_limited_heads_survey_counts_a_fit_below_the_floor_as_a_failure():
    from experiments.head_count import rank_limited_survey
    rotation = LinearSSM.damped_rotation(0.9, 0.6)
    honest = rank_limited_survey(rotation, 8, 2, [1], lambda H: [1.0, 0.71, 0.0][H])
    assert (honest["lower"], honest["upper"], honest["failures"]) == (2, 2, 0)
    assert honest["e at 1"] == 0.71
    lying = rank_limited_survey(rotation, 8, 2, [], lambda H: [1.0, 0.5, 0.0][H])  # below √(1/2)
    assert lying["failures"] == 1
    # an optimiser that stops above 0 at the upper bound is a measurement, not a failure: the
    # upper bound's value maps are built and checked instead
    stuck = rank_limited_survey(rotation, 8, 2, [], lambda H: [1.0, 0.71, 1e-3][H])
    assert stuck["failures"] == 0 and stuck["built"] < 1e-12


def test_thm_rank_limited_heads_survey_counts_built_maps_that_miss_a_lag(monkeypatch):
    import experiments.head_count as hc
    rotation = LinearSSM.damped_rotation(0.9, 0.6)
    monkeypatch.setattr(hc, "rank_limited_values", lambda ssm, r, n: np.eye(2)[None])  # I alone: misses J
    broken = hc.rank_limited_survey(rotation, 8, 2, [], lambda H: [1.0, 0.71, 0.0][H])
    assert broken["built"] > 0.1 and broken["failures"] == 1


def test_thm_rank_limited_heads_built_residual_per_lag_and_per_largest_entry(monkeypatch):
    # Closed forms: lags L_0 = 100 E_11, L_1 = E_12 + ε E_21 and maps E_11, E_12 (rank one): the
    # residual is ε E_21 at ℓ = 1, so ε/100 relative to the largest lag entry, ε/√(1 + ε²) per lag.
    import experiments.head_count as hc
    eps = 1e-3
    model = RelativeHeads(np.array([[[100.0, 0], [0, 0]], [[0, 1.0], [eps, 0]]]), np.eye(2))
    maps = np.array([[[1.0, 0], [0, 0]], [[0, 1.0], [0, 0]]])
    monkeypatch.setattr(hc, "rank_limited_values", lambda ssm, r, n: maps)
    assert hc.built_values_residual(model, 2, 1) == pytest.approx(eps / 100, rel=1e-9)
    assert hc.built_values_residual(model, 2, 1, per_lag=True) == pytest.approx(eps / np.hypot(1, eps), rel=1e-9)
    with pytest.raises(TypeError, match="per_lag must be a bool"):
        hc.built_values_residual(model, 2, 1, per_lag=1)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_thm_rank_limited_heads_each_construction_on_its_own(r):
    # part 2's constructions, unfiltered: the modal one gives N_ℝ + 3N_ℂ maps at r = 1 and N at
    # r >= 2, the SVD split Σ⌈rank Q_b / r⌉, the c·q one k_col·k_row; each holds every lag
    from experiments.head_count import construction_misses
    ssm = LinearSSM.random(5, 3, 3, seed=4)  # one complex pair at least (checked)
    lam = np.linalg.eigvals(ssm.A.detach().numpy().astype(float))
    pairs = int((np.abs(lam.imag) > 1e-9).sum()) // 2
    assert pairs >= 1
    out = construction_misses(ssm, 12, r)
    assert out["modal"][:2] == ((5 + pairs,) * 2 if r == 1 else (5, 5))
    assert set(out) == {"split", "outer", "modal", "misses"} and out["misses"] == 0
    assert all(residual < 1e-10 for _, _, residual in (out["split"], out["outer"], out["modal"]))


@pytest.mark.parametrize("which", ["_modal_values", "_split", "_outer_basis"])
def test_thm_rank_limited_heads_a_broken_construction_is_a_failure(monkeypatch, which):
    # the referee's probe: one map off by 1e-3 (modal, split) or one map dropped (c·q, a
    # spanning set that would otherwise still hold the lags): the survey counts it, where the
    # smallest-survivor rule of rank_limited_values would hide it
    import experiments.head_count as hc
    original = getattr(hc, which)

    def broken(*args):
        V = original(*args).copy()
        if which == "_outer_basis":
            return V[1:]
        V[-1] = V[-1] + 1e-3 * np.outer(np.arange(V.shape[1]) == 0, np.arange(V.shape[2]))
        return V
    monkeypatch.setattr(hc, which, broken)
    ssm = LinearSSM.random(3, 4, 4, seed=1)
    assert hc.construction_misses(ssm, 32, 1)["misses"] == 1
    row = hc.rank_limited_survey(ssm, 32, 1, [], lambda H: 1.0 if H < 4 else 0.0)
    assert row["constructions"] == 1 and row["failures"] >= 1


def test_thm_rank_limited_heads_a_construction_missing_a_resolved_direction_is_a_failure(monkeypatch):
    # The referee's probe (T3, finding 4): on the S5 layer (skip D) the lag span's last resolved
    # direction is ~3e-9 of the first, so maps missing it leave a residual below 1e-8 of the
    # largest lag entry (L_0's) but far above 1e-8 of the later lags' own norms. The split is
    # given the right count and ranks, its last map replaced by a copy of the first.
    import experiments.head_count as hc
    ssm, n, r = SharedStateSSM.random(4, 8, seed=0), 32, 4
    assert hc.construction_misses(ssm, n, r)["misses"] == 0
    original = hc._split

    def broken(*args):
        V = original(*args).copy()
        V[-1] = V[0]
        return V
    monkeypatch.setattr(hc, "_split", broken)
    V = broken(hc.operator_span(ssm.lags(n).detach(), 1e-10).basis, r, 1e-10)
    assert hc._lags_residual(ssm, n, V, r) < 1e-8  # relative to L_0: would pass
    built, count, residual = hc.construction_misses(ssm, n, r)["split"]
    assert built == count and residual > 1e-7
    assert hc.construction_misses(ssm, n, r)["misses"] == 1


def test_memory_lag_span_zeroes_lag_zero_only():
    from experiments.head_count import memory_lag_span, memory_output_error
    ssm = SharedStateSSM.random(3, 4, seed=1)
    lags, memory = ssm.lags(6).detach().numpy(), memory_lag_span(ssm, 6)
    assert np.abs(memory.lags(6).detach().numpy()[0]).max() == 0
    assert np.abs(memory.lags(6).detach().numpy()[1:] - lags[1:]).max() < 1e-15
    # its exact fit (all pd maps) holds the memory of the SSM; L_0 = CB + D is not in it
    assert memory_output_error(ssm, 6, memory.lags(6).detach().numpy()[1:]) < 1e-12


def test_residual_lag_span_shifts_lag_zero_only():
    from experiments.head_count import residual_lag_span
    ssm = LinearSSM.random(3, 2, 2, seed=1)
    lags = ssm.lags(5).detach().numpy()
    shifted = residual_lag_span(ssm, 5).lags(5).detach().numpy()
    assert np.abs(shifted[0] - (lags[0] - np.eye(2))).max() < 1e-15
    assert np.abs(shifted[1:] - lags[1:]).max() < 1e-15
    with pytest.raises(ValueError, match="p = d"):
        residual_lag_span(LinearSSM.random(3, 2, 3, seed=1), 5)
