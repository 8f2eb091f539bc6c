"""Gradient profiles, the LTI decay bound, decay fits and planted keys (lib.gradients)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import (SSD, CausalConv1d, Dense, ElmanRNN, FeedForward, KANLayer, LinearAttention, LinearSSM,
                 RelativeHeads, SelectiveSSM, SoftmaxAttention)
from lib.gradients import (DecayFit, _student_t_two_sided, fit_decay_rate, jacobian_norms, lag_norms, one_hop,
                           planted_key_input, ssm_decay_bound, with_constant_step)
from lib.stacks import Stack

FAST = settings(max_examples=15, deadline=None)
mpow = np.linalg.matrix_power


def autograd_block_norms(model, X, i):
    """‖∂y_i/∂x_j‖_F for j <= i from the full Jacobian of torch.autograd.functional (independent)."""
    J = torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X))  # (n, p, n, d)
    return np.array([np.linalg.norm(J[i, :, j, :].numpy()) for j in range(i + 1)])


MODELS = {
    "LinearSSM": lambda: LinearSSM.random(4, 3, 2, seed=1),
    "SelectiveSSM": lambda: SelectiveSSM.random(3, 4, step_range=(0.05, 0.5), seed=2),
    "SSD": lambda: SSD.random(4, 3, N=3, heads=2, step_range=(0.05, 0.5), seed=3),
    "SoftmaxAttention causal": lambda: SoftmaxAttention.random(3, 2, heads=2, seed=4),
    "SoftmaxAttention non-causal": lambda: SoftmaxAttention.random(3, 2, heads=2, causal=False, seed=5),
    "SoftmaxAttention position bias": lambda: SoftmaxAttention(
        *SoftmaxAttention._random_projections(3, 2, 1, None, None, 6).values(),
        position_bias=np.random.default_rng(6).standard_normal((1, 8))),
    "LinearAttention": lambda: LinearAttention.random(3, 2, heads=1, seed=7),
    "LinearAttention non-causal": lambda: LinearAttention.random(3, 2, heads=1, causal=False, seed=8),
    "ElmanRNN": lambda: ElmanRNN.random(4, 3, 2, seed=9),
    "FeedForward": lambda: FeedForward.random(3, 2, seed=10),
    "Dense": lambda: Dense.random(3, 2, seed=11),
    "CausalConv1d": lambda: CausalConv1d.random(3, 2, r=3, seed=12),
    "KANLayer": lambda: KANLayer.random(3, 2, seed=13),
    "RelativeHeads": lambda: RelativeHeads.random(2, 8, 3, 2, seed=14),
    "Stack": lambda: Stack([LinearSSM.random(4, 3, 3, seed=15), SoftmaxAttention.random(3, 3, heads=1, seed=16),
                            FeedForward.random(3, 2, seed=17)]),
    "Stack residual hybrid": lambda: Stack.hybrid(3, 3, 2, state_size=3, seed=18),
}


# -- jacobian_norms -----------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_jacobian_norms_equal_full_autograd_jacobian_for_every_model(name):
    model = MODELS[name]()
    X = np.random.default_rng(0).standard_normal((6, model.d))
    for i in range(6):
        np.testing.assert_allclose(jacobian_norms(model, X, i), autograd_block_norms(model, X, i),
                                   rtol=1e-10, atol=1e-14)


def test_jacobian_norms_accept_torch_and_leave_it_alone():
    model = SoftmaxAttention.random(3, 3, heads=1, seed=0)
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    norms = jacobian_norms(model, X, 4)
    assert isinstance(norms, np.ndarray) and norms.shape == (5,) and norms.dtype == np.float64
    assert X.grad is None
    np.testing.assert_array_equal(norms, jacobian_norms(model, X.detach().numpy(), 4))


def test_jacobian_norms_of_a_map_that_ignores_X_are_zero():
    np.testing.assert_array_equal(jacobian_norms(Dense(np.zeros((2, 2))), np.ones((3, 2)), 2), np.zeros(3))


def test_jacobian_norms_in_float32_model():
    model = LinearSSM.random(3, 2, 2, seed=0, dtype=torch.float32)
    norms = jacobian_norms(model, np.ones((10, 2)), 9)
    np.testing.assert_allclose(norms[::-1], lag_norms(model, 10), rtol=1e-5)


@FAST
@given(n=st.integers(1, 12), N=st.integers(1, 4), d=st.integers(1, 3), p=st.integers(1, 3),
       radius=st.floats(0.1, 1.2), scale=st.sampled_from([0.0, 1.0, 1e3]), seed=st.integers(0, 999))
def test_jacobian_norms_of_lti_ssm_are_C_A_pow_B_for_every_input(n, N, d, p, radius, scale, seed):
    model = LinearSSM.random(N, d, p, spectral_radius=radius, seed=seed)
    A, B, C = model.A, model.B, model.C
    X = scale * np.random.default_rng(seed).standard_normal((n, d))
    norms = jacobian_norms(model, X, n - 1)
    expected = [np.linalg.norm(C @ mpow(A, n - 1 - j) @ B) for j in range(n)]
    np.testing.assert_allclose(norms, expected, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(lag_norms(model, n)[::-1], expected, rtol=1e-10, atol=1e-300)


def test_far_norms_do_not_underflow_when_squared():
    # Blocks of size ~1e-200: squaring their entries underflows, the norms must not.
    model = LinearSSM.diagonal([0.1], [[1.0]], [[1.0]])
    norms = lag_norms(model, 300)
    np.testing.assert_allclose(norms[:300], 0.1 ** np.arange(300), rtol=1e-12)
    np.testing.assert_allclose(jacobian_norms(model, np.zeros((200, 1)), 199)[::-1], 0.1 ** np.arange(200),
                               rtol=1e-12)


# -- thm-ssm-gradient-decay ---------------------------------------------------


@pytest.mark.parametrize("rho", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thm_ssm_gradient_decay_bound_holds_on_random_stable_systems(rho, seed):
    N, d, p, n = 6, 3, 2, 80
    model = LinearSSM.random(N, d, p, spectral_radius=rho, seed=seed)  # non-normal Gaussian A
    A, B, C = model.A, model.B, model.C
    # (1) Gelfand form, any r in (ρ, 1): K = sup_ℓ ‖A^ℓ‖₂ / r^ℓ.  The ratio is checked to have
    # decayed by the end of the horizon, so the maximum over the horizon is the supremum.
    r = (1 + 2 * rho) / 3
    lags = min(4000, int(math.log(1e-200) / math.log(r)))  # r^ℓ stays a normal float
    ratios = [np.linalg.norm(mpow(A, ell), 2) / r ** ell for ell in range(0, lags, 7)]
    assert ratios[-1] < 1e-3 * max(ratios)
    K = max(ratios) * (1 + 1e-9)
    scale = K * np.linalg.norm(C, 2) * np.linalg.norm(B)
    # (2) diagonalisable form with the exact rate: K = κ₂(P), r = ρ.
    _, P = np.linalg.eig(A)
    kappa = np.linalg.cond(P)
    exact_scale = kappa * np.linalg.norm(C, 2) * np.linalg.norm(B) * (1 + 1e-9)
    ell = np.arange(lags)
    profile = lag_norms(model, lags)
    assert np.all(profile <= scale * r ** ell)
    assert np.all(profile <= exact_scale * rho ** ell)
    # For all inputs: the measured Jacobian is the same at zero, Gaussian and huge inputs.
    rng = np.random.default_rng(seed)
    for X in (np.zeros((n, d)), rng.standard_normal((n, d)), 1e6 * rng.standard_normal((n, d))):
        norms = jacobian_norms(model, X, n - 1)[::-1]
        np.testing.assert_allclose(norms, profile[:n], rtol=1e-9)
        assert np.all(norms <= exact_scale * rho ** np.arange(n))


def test_ssm_decay_bound_is_condition_number_times_norms():
    model = LinearSSM.random(5, 3, 2, spectral_radius=0.8, seed=3)
    bound = ssm_decay_bound(model)
    _, P = np.linalg.eig(model.A)
    assert bound.constant == pytest.approx(np.linalg.cond(P), rel=1e-10)
    assert bound.rate == pytest.approx(0.8, rel=1e-10)
    assert bound.scale == pytest.approx(bound.constant * np.linalg.norm(model.C, 2) * np.linalg.norm(model.B),
                                        rel=1e-12)
    np.testing.assert_allclose(bound.at([0, 1, 3]), bound.scale * 0.8 ** np.array([0, 1, 3]), rtol=1e-12)
    assert np.all(lag_norms(model, 500) <= bound.at(np.arange(500)))
    with pytest.raises(ValueError, match="distances"):
        bound.at([-1])


def test_ssm_decay_bound_refuses_defective_A():
    jordan = LinearSSM([[0.5, 1.0], [0.0, 0.5]], np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="ssm must have a diagonalisable A"):
        ssm_decay_bound(jordan)
    with pytest.raises(TypeError, match="ssm must be a LinearSSM"):
        ssm_decay_bound(Dense.random(2, 2))


def test_lti_profile_to_distance_1e5():
    model = LinearSSM.random(8, 4, 4, spectral_radius=0.9999, seed=0)
    profile = lag_norms(model, 100_000)
    assert profile.shape == (100_000,) and np.all(np.isfinite(profile))
    fit = fit_decay_rate(profile, start=20_000)
    assert fit.rate == pytest.approx(0.9999, abs=1e-7)


# -- fit_decay_rate -------------------------------------------------------------


def test_student_t_quantiles_match_tables():
    for dof, expected in [(1, 12.7062047), (2, 4.3026527), (3, 3.1824463), (10, 2.2281389), (30, 2.0422725),
                          (100_000, 1.9599877)]:
        assert _student_t_two_sided(0.95, dof) == pytest.approx(expected, abs=1e-6)
    assert _student_t_two_sided(0.99, 5) == pytest.approx(4.0321430, abs=1e-6)


def test_fit_decay_rate_is_exact_on_an_exponential():
    ell = np.arange(50)
    fit = fit_decay_rate(3.0 * 0.7 ** ell)
    assert isinstance(fit, DecayFit)
    assert fit.rate == pytest.approx(0.7, rel=1e-12)
    assert fit.intercept == pytest.approx(math.log(3.0), abs=1e-10)
    assert fit.points == 50 and fit.level == 0.95
    assert fit.log_rate_stderr < 1e-12
    with pytest.raises(Exception):  # frozen
        fit.rate = 1.0


def test_fit_decay_rate_interval_covers_at_its_level_under_iid_noise():
    # The assumption the interval is built on: iid Gaussian deviations of log‖J‖.
    rng = np.random.default_rng(0)
    ell = np.arange(12)
    hits = sum(fit_decay_rate(np.exp(-0.3 * ell + 0.2 * rng.standard_normal(12))).contains(math.exp(-0.3))
               for _ in range(1000))
    assert 0.93 <= hits / 1000 <= 0.97  # ±3 binomial standard deviations


def test_fit_decay_rate_skips_floor_and_respects_window():
    norms = 0.5 ** np.arange(40.0)
    norms[30:] = 0.0  # underflowed
    norms[5] = 7.0  # outside the window
    fit = fit_decay_rate(norms, start=10, stop=35)
    assert fit.points == 20
    assert fit.rate == pytest.approx(0.5, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_fit_decay_rate_recovers_rho_for_diagonalisable_A_within_its_interval(seed):
    # Dominant complex pair ρ e^{±iθ}: the profile is ρ^ℓ times a bounded oscillation,
    # the regime where residual-based intervals are meaningful.
    rng = np.random.default_rng(seed)
    rho = rng.uniform(0.6, 0.97)
    radii = [rho, rho * rng.uniform(0.3, 0.9), rho * rng.uniform(0.3, 0.9)]
    eigenvalues = [r * np.exp(s * 1j * theta) for r in radii for theta in [rng.uniform(0.2, 3.0)] for s in (1, -1)]
    base = LinearSSM.diagonal(eigenvalues, np.eye(6), np.eye(6))
    P = rng.standard_normal((6, 6))
    model = LinearSSM(P @ base.A @ np.linalg.inv(P), rng.standard_normal((6, 3)), rng.standard_normal((2, 6)))
    stop = int(math.log(1e-250) / math.log(rho))
    fit = fit_decay_rate(lag_norms(model, stop), start=50)
    assert fit.contains(rho)
    assert fit.rate == pytest.approx(rho, abs=1e-4)


def test_fit_decay_rate_recovers_a_real_dominant_eigenvalue_to_rounding():
    # Dominant real eigenvalue: after the transient the profile is exactly exponential, and
    # the interval shrinks to rounding level, so compare with a tolerance instead.
    rng = np.random.default_rng(1)
    lam = np.array([0.8, -0.5, 0.3, 0.6])
    P = rng.standard_normal((4, 4))
    model = LinearSSM(P @ np.diag(lam) @ np.linalg.inv(P), rng.standard_normal((4, 2)), rng.standard_normal((2, 4)))
    fit = fit_decay_rate(lag_norms(model, 2000), start=200)
    assert fit.rate == pytest.approx(0.8, abs=1e-12)


def test_fit_decay_rate_validation():
    good = 0.5 ** np.arange(10.0)
    with pytest.raises(ValueError, match="norms must have shape"):
        fit_decay_rate(np.ones((3, 3)))
    with pytest.raises(ValueError, match="norms must be >= 0"):
        fit_decay_rate(-good)
    with pytest.raises(ValueError, match="norms must be finite"):
        fit_decay_rate(np.array([1.0, np.nan, 0.5]))
    with pytest.raises(ValueError, match="at least 3 entries above floor"):
        fit_decay_rate(np.array([1.0, 0.5, 0.0, 0.0]))
    with pytest.raises(ValueError, match="start and stop"):
        fit_decay_rate(good, start=5, stop=3)
    with pytest.raises(ValueError, match="start and stop"):
        fit_decay_rate(good, stop=11)
    with pytest.raises(ValueError, match="level"):
        fit_decay_rate(good, level=1.0)
    with pytest.raises(ValueError, match="floor"):
        fit_decay_rate(good, floor=-1.0)


# -- prop-attention-highway ----------------------------------------------------

DISTANCES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 511]


@pytest.mark.parametrize("heads, head", [(1, 0), (4, 2)])
def test_prop_attention_highway_planted_key_keeps_jacobian_near_V(heads, head):
    # Factor [c₁, c₂] = [0.5, 2] at strength s = 30: ‖J_ij − V_h‖ <= (1 − α)‖V_h‖ + (other
    # heads' weights)·Σ‖V‖ + O(s(1 − α)) and every one of these is < 1e-6 here, so the
    # stated factor holds with a wide margin; the tighter 1e-6 is checked as well.
    model = SoftmaxAttention.random(8, 6, heads=heads, seed=heads)
    V = np.linalg.norm(model.values()[head])
    n = 512
    i = n - 1
    for D in DISTANCES:
        j = i - D
        X = planted_key_input(model, n, i, j, strength=30.0, head=head, seed=D)
        weights, term = one_hop(model, X, i, j)
        assert weights[head] >= 1 - 1e-9
        norm = jacobian_norms(model, X, i)[j]
        assert 0.5 * V <= norm <= 2 * V
        assert norm == pytest.approx(V, rel=1e-6)
        np.testing.assert_allclose(term, model.values()[head], rtol=1e-6, atol=1e-9)
    # The contrast, for every input: an LTI SSM with ρ = 0.9 is below 1e-3 of its start by D = 100.
    ssm = LinearSSM.random(6, 8, 6, spectral_radius=0.9, seed=0)
    profile = jacobian_norms(ssm, np.random.default_rng(0).standard_normal((n, 8)), i)[::-1]
    assert profile[100] < 1e-3 * profile[0]


def test_prop_attention_highway_needs_the_planted_input():
    # "There exist inputs": on generic inputs the far Jacobian blocks are ~1/n of ‖V‖.
    model = SoftmaxAttention.random(8, 6, heads=1, seed=1)
    V = np.linalg.norm(model.values()[0])
    X = np.random.default_rng(0).standard_normal((512, 8))
    far = jacobian_norms(model, X, 511)[:511 - 64]
    assert np.mean(far) < 0.02 * V


def test_prop_attention_highway_with_position_bias_and_non_causal():
    rng = np.random.default_rng(0)
    params = SoftmaxAttention._random_projections(6, 6, 2, None, None, 0)
    biased = SoftmaxAttention(*params.values(), position_bias=-0.1 * np.arange(300.0)[None].repeat(2, 0))
    X = planted_key_input(biased, 300, 299, 10, head=1)
    assert one_hop(biased, X, 299, 10)[0][1] >= 1 - 1e-9
    scores = biased.scores(X)[:, 299, 10]
    np.testing.assert_allclose(scores, [-30.0, 30.0], rtol=1e-9)
    bidirectional = SoftmaxAttention(*params.values(), causal=False)
    X = planted_key_input(bidirectional, 50, 3, 40, head=0, seed=rng)
    assert one_hop(bidirectional, X, 3, 40)[0][0] >= 1 - 1e-9
    V = np.linalg.norm(bidirectional.values()[0])
    # j > i is beyond jacobian_norms (j <= i only): take row 3 of the Jacobian directly.
    J = torch.autograd.functional.jacobian(lambda Z: bidirectional(Z)[3], torch.tensor(X))[:, 40, :]
    assert np.linalg.norm(J.numpy()) == pytest.approx(V, rel=1e-6)


def test_one_hop_decomposition_of_the_attention_jacobian():
    # ∂y_i/∂x_j = Σ_h α^h_ij V_h + Σ_h α^h_ij V_h (x_j − x̄^h_i) (W_Kᵀ q^h_i)ᵀ/√d_k for j != i.
    model = SoftmaxAttention.random(4, 3, heads=2, seed=2)
    X = np.random.default_rng(2).standard_normal((7, 4))
    alpha = model.weights(X)
    V, W_Q, W_K = model.values(), model.W_Q, model.W_K
    J = torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X)).numpy()
    for i, j in [(6, 0), (6, 3), (3, 1), (5, 4)]:
        weights, term = one_hop(model, X, i, j)
        np.testing.assert_allclose(weights, alpha[:, i, j], rtol=1e-12)
        np.testing.assert_allclose(term, model.operator(X)[i, j], rtol=1e-12, atol=1e-15)
        rest = sum(alpha[h, i, j] * np.outer(V[h] @ (X[j] - alpha[h, i] @ X), W_K[h].T @ (W_Q[h] @ X[i]))
                   / math.sqrt(model.d_k) for h in range(2))
        np.testing.assert_allclose(J[i, :, j, :], term + rest, rtol=1e-10, atol=1e-13)


# -- selective SSMs ------------------------------------------------------------


def test_constant_step_trades_reach_for_amplitude():
    base = SelectiveSSM.random(2, N=4, seed=0)  # A = −(1, 2, 3, 4) per channel
    X = np.tile(np.random.default_rng(0).standard_normal(2), (801, 1))  # one token repeated
    profiles = {}
    for step in (0.001, 0.002, 0.01, 0.02, 0.2):
        model = with_constant_step(base, step)
        delta, _, _ = model.selection(X)
        np.testing.assert_allclose(delta, step, rtol=1e-12)
        profiles[step] = jacobian_norms(model, X, 800)[::-1]
    # The slowest mode (|A| = 1) sets the rate exp(−step) once the faster ones are gone.
    for step in (0.01, 0.02, 0.2):
        assert fit_decay_rate(profiles[step], start=400).rate == pytest.approx(math.exp(-step), abs=2e-5)
    # The input enters as Δ·B_t x_t: for j < i, J_ij = Δ Σ_n (…) e^{−Δ|A_n|(i−j)}, so doubling a
    # small Δ about doubles it (exactly 2 e^{−Δ|A_n|} mode by mode).
    assert profiles[0.002][1] == pytest.approx(2 * profiles[0.001][1], rel=0.01)
    # A small step keeps gradients alive far away (but small); a large one loses them.
    assert profiles[0.001][800] > 0.01 * profiles[0.001][1]
    assert profiles[0.001][1] < 0.1 * profiles[0.2][1]
    assert profiles[0.2][800] < 1e-60 * profiles[0.2][1]


def test_with_constant_step_validation():
    with pytest.raises(TypeError, match="model must be a SelectiveSSM"):
        with_constant_step(LinearSSM.random(2, 2, 2), 0.1)
    with pytest.raises(ValueError, match="step must be > 0"):
        with_constant_step(SelectiveSSM.random(2), 0.0)


# -- validation ----------------------------------------------------------------


def test_jacobian_norms_validation():
    model = LinearSSM.random(3, 2, 2)
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match=r"i must satisfy 0 <= i < n = 5"):
        jacobian_norms(model, X, 5)
    with pytest.raises(ValueError, match="i must be >= 0"):
        jacobian_norms(model, X, -1)
    with pytest.raises(TypeError, match="i must be an integer"):
        jacobian_norms(model, X, 2.0)
    with pytest.raises(TypeError, match="i must be an integer"):
        jacobian_norms(model, X, True)
    with pytest.raises(ValueError, match="X must have shape"):
        jacobian_norms(model, np.zeros((5, 3)), 0)
    with pytest.raises(ValueError, match=r"X must have shape \(n, 2\) \(one sequence\)"):
        jacobian_norms(model, np.zeros((2, 5, 2)), 0)
    with pytest.raises(ValueError, match="X must be finite"):
        jacobian_norms(model, np.full((5, 2), np.inf), 0)
    with pytest.raises(TypeError, match="model must be a SequenceMap"):
        jacobian_norms(lambda Z: Z, X, 0)
    with pytest.raises(ValueError, match="X must have length"):
        jacobian_norms(RelativeHeads.random(1, 4, 2, 2), np.zeros((5, 2)), 0)


def test_lag_norms_validation():
    with pytest.raises(TypeError, match="ssm must be a LinearSSM"):
        lag_norms(SelectiveSSM.random(2), 5)
    with pytest.raises(ValueError, match="n must be >= 1"):
        lag_norms(LinearSSM.random(2, 2, 2), 0)


def test_planted_key_validation():
    model = SoftmaxAttention.random(4, 4, heads=2)
    with pytest.raises(TypeError, match="attention must be a SoftmaxAttention"):
        planted_key_input(LinearAttention.random(4, 4), 10, 9, 0)
    with pytest.raises(ValueError, match="j must differ from i"):
        planted_key_input(model, 10, 5, 5)
    with pytest.raises(ValueError, match="j must be < i for causal attention"):
        planted_key_input(model, 10, 5, 7)
    with pytest.raises(ValueError, match=r"i must satisfy 0 <= i < n = 10"):
        planted_key_input(model, 10, 10, 0)
    with pytest.raises(ValueError, match="head must satisfy"):
        planted_key_input(model, 10, 9, 0, head=2)
    with pytest.raises(ValueError, match="strength must be > 0"):
        planted_key_input(model, 10, 9, 0, strength=0.0)
    with pytest.raises(ValueError, match="cannot be planted"):
        planted_key_input(SoftmaxAttention.random(2, 2, heads=3), 10, 9, 0)
    with pytest.raises(ValueError, match="n must be <= 8"):
        planted_key_input(MODELS["SoftmaxAttention position bias"](), 9, 8, 0)
    with pytest.raises(ValueError, match=r"j must satisfy 0 <= j < n = 10"):
        one_hop(model, np.zeros((10, 4)), 9, 10)


# -- prop-selective-gradient -------------------------------------------------------------------------

@pytest.mark.parametrize("D", [5, 50, 500])
def test_prop_selective_gradient_frozen_gate_best_response_is_one_over_e_a_D(D):
    # One mode in Mamba's parametrisation: Ā = e^{−Δa}, B̄ = Δb, C = c; lag D = c b Δ e^{−ΔaD}.
    a, b, c = 0.7, 1.3, -0.4
    steps = np.geomspace(1e-6, 10.0, 3001)
    responses = [lag_norms(LinearSSM([[np.exp(-s * a)]], [[s * b]], [[c]]), D + 1)[D] for s in steps]
    best = int(np.argmax(responses))
    assert responses[best] <= abs(b * c) / (np.e * a * D) * (1 + 1e-12)
    assert responses[best] == pytest.approx(abs(b * c) / (np.e * a * D), rel=1e-4)
    assert steps[best] == pytest.approx(1 / (a * D), rel=1e-2)


@pytest.mark.parametrize("step", [0.05, 0.3])
def test_prop_selective_gradient_frozen_gate_decays_at_the_accumulated_step_rate(step):
    model = with_constant_step(SelectiveSSM.random(3, N=4, seed=1), step)
    a_min = float(np.abs(model.A).min())
    X = np.random.default_rng(2).standard_normal((200, 3))
    norms = jacobian_norms(model, X, 199)[::-1]
    fit = fit_decay_rate(norms, start=40, floor=1e-250)
    # At least the accumulated-step rate e^{−a_min Δ} per step, and not much faster (slowest mode).
    assert fit.log_rate <= -a_min * step + 3 * fit.log_rate_stderr
    assert fit.log_rate >= -a_min * step * 1.2 - 3 * fit.log_rate_stderr


# -- gradient_reach ----------------------------------------------------------------------------------------

def test_gradient_reach_of_an_lti_ssm_is_log_eps_over_log_rho():
    from lib.gradients import gradient_reach

    rho = 0.8
    ssm = LinearSSM([[rho]], [[1.0]], [[1.0]])
    assert gradient_reach(lag_norms(ssm, 200), 1e-3) == int(np.floor(np.log(1e-3) / np.log(rho)))


def test_gradient_reach_edge_cases_and_bad_input():
    from lib.gradients import gradient_reach

    assert gradient_reach(np.array([1.0, 0.0, 0.0]), 0.5) == 0
    assert gradient_reach(np.zeros(4)) == 0
    assert gradient_reach(np.ones(7)) == 6
    with pytest.raises(ValueError, match="eps must satisfy"):
        gradient_reach(np.ones(3), 1.5)
    with pytest.raises(ValueError, match="profile must"):
        gradient_reach(-np.ones(3))
