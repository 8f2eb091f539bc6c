"""Gradient profiles, the LTI decay bound, decay fits and planted keys (lib.gradients)."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import linregress
from scipy.stats import t as student_t

from lib import (SSD, CausalConv1d, Dense, ElmanRNN, FeedForward, KANLayer, LinearAttention, LinearSSM,
                 RelativeHeads, SelectiveSSM, SoftmaxAttention)
from lib.gradients import (DecayFit, decay_report, fit_decay_rate, frozen_gate_response, frozen_gate_search,
                           gate_closing_check, gate_closing_input, gate_closing_profile, gradient_reach,
                           jacobian_blocks, jacobian_norms, key_price, lag_norms, planted_key_input,
                           planted_key_profile, random_profiles, rnn_jacobian, saturating_input, saturation_subset,
                           selective_jacobian, ssm_decay_bound, with_constant_step)
from lib.zoo import architecture_zoo
from lib.stacks import Stack

FAST = settings(max_examples=15, deadline=None)
mpow = np.linalg.matrix_power


def full_jacobian(model, X):
    """The full Jacobian from torch.autograd.functional (an independent route), shape (n, p, n, d)."""
    return torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X)).numpy()


def autograd_block_norms(model, X, i):
    """‖∂y_i/∂x_j‖_F for j <= i from the full Jacobian of torch.autograd.functional (independent)."""
    J = full_jacobian(model, X)
    return np.array([np.linalg.norm(J[i, :, j, :]) for j in range(i + 1)])


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
    J = full_jacobian(model, X)
    for i in range(6):
        np.testing.assert_allclose(jacobian_norms(model, X, i), autograd_block_norms(model, X, i),
                                   rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(jacobian_blocks(model, X, i), J[i, :, : i + 1].transpose(1, 0, 2),
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


def test_thm_ssm_gradient_decay_needs_the_condition_number_for_non_normal_A():
    # Eigenvalues 0.9 and 0.8, off-diagonal 10: κ₂(P) = 200 and the profile exceeds ‖C‖₂‖B‖_F ρ^D
    # 70-fold, so a bound without κ₂(P) is false; with it the theorem holds at every distance.
    model = LinearSSM([[0.9, 10.0], [0.0, 0.8]], np.eye(2), np.eye(2))
    profile = lag_norms(model, 400)
    ell = np.arange(400)
    assert (profile / (np.sqrt(2) * 0.9 ** ell)).max() > 70
    bound = ssm_decay_bound(model)
    # Unit eigenvectors e1 and (−100, 1)/√10001: P = [[1, −100 s], [0, s]], s = 1/√10001, whose singular
    # values satisfy σ₁σ₂ = s and σ₁² + σ₂² = 2, so κ₂(P) = (1 + √(1 − s²))/s = 100 + √10001.
    assert bound.constant == pytest.approx(100 + math.sqrt(10001), rel=1e-10)
    assert np.all(profile <= bound.at(ell))
    # The diagonal case attains the bound: A = diag(0.8, 0.3), B = e1, C = e1ᵀ gives 0.8^ℓ exactly.
    diagonal = LinearSSM(np.diag([0.8, 0.3]), [[1.0], [0.0]], [[1.0, 0.0]])
    np.testing.assert_allclose(lag_norms(diagonal, 50), ssm_decay_bound(diagonal).at(np.arange(50)), rtol=1e-12)


def test_thm_ssm_gradient_decay_jordan_block_transient():
    # A = 0.9 I + N (size 4), B = C = I: ‖A^D‖_F² = Σ_k (4 − k) C(D, k)² 0.9^{2(D−k)} for every input;
    # the profile rises from 2 to about 238 at D = 29 and first drops below 2/e at D = 127.
    A = 0.9 * np.eye(4) + np.eye(4, k=1)
    model = LinearSSM(A, np.eye(4), np.eye(4))
    closed = np.sqrt([sum((4 - k) * (math.comb(D, k) * 0.9 ** (D - k)) ** 2 for k in range(4))
                      for D in range(300)])
    np.testing.assert_allclose(lag_norms(model, 300), closed, rtol=1e-12)
    X = np.random.default_rng(0).standard_normal((300, 4))
    np.testing.assert_allclose(jacobian_norms(model, X, 299)[::-1], closed, rtol=1e-10)
    assert closed[0] == 2.0 and int(closed.argmax()) == 29 and closed.max() == pytest.approx(238.45, abs=0.01)
    assert int(np.argmax(closed < 2 / np.e)) == 127
    # The asymptotic rate is still ρ: the local log-slope tends to ln 0.9 (like ln 0.9 + 3/D).
    slopes = np.diff(np.log(closed))
    assert abs(slopes[-1] - math.log(0.9)) < 3.5 / 298


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


def test_thm_ssm_gradient_decay_report_against_matrix_powers_and_scipy():
    ssm = LinearSSM.random(6, 3, 2, spectral_radius=0.8, seed=4)
    report = decay_report(ssm, 90, start=30)
    powers = np.array([np.linalg.norm(ssm.C @ mpow(ssm.A, ell) @ ssm.B) for ell in range(90)])
    np.testing.assert_allclose(report.norms, powers, rtol=1e-10)
    eigenvalues, P = np.linalg.eig(ssm.A)
    rho = np.abs(eigenvalues).max()
    bound = np.linalg.cond(P) * np.linalg.norm(ssm.C, 2) * np.linalg.norm(ssm.B) * rho ** np.arange(90)
    assert report.bound_ratio == pytest.approx((powers / bound).max(), rel=1e-9)
    assert report.bound_ratio <= 1
    line = linregress(np.arange(30, 90), np.log(powers[30:]))
    assert report.fit.log_rate == pytest.approx(line.slope, rel=1e-9)
    assert report.fit.points == 60
    assert report.relative_gap == pytest.approx(abs(line.slope - np.log(rho)) / abs(np.log(rho)), abs=1e-8)
    row = report.row()
    assert list(row) == ["radius", "ln rho", "fitted log-rate", "standard error", "relative gap", "points"]
    assert row["radius"] == pytest.approx(0.8, rel=1e-12) and row["ln rho"] == pytest.approx(np.log(0.8), rel=1e-12)
    assert row["standard error"] == pytest.approx(line.stderr, rel=1e-6)


def test_thm_ssm_gradient_decay_report_is_exact_for_a_scaled_identity():
    # A = ρI, B = C = I: ‖A^ℓ‖_F = √N ρ^ℓ is the bound itself (κ₂(P) = 1), a line of slope ln ρ.
    rho = 0.6
    report = decay_report(LinearSSM(rho * np.eye(3), np.eye(3), np.eye(3)), 40)
    assert report.bound_ratio == pytest.approx(1.0, rel=1e-12)
    assert report.fit.log_rate == pytest.approx(np.log(rho), rel=1e-12)
    assert report.relative_gap < 1e-12


def test_decay_report_bad_input():
    ssm = LinearSSM.random(3, 2, 2, spectral_radius=0.5, seed=0)
    with pytest.raises(TypeError, match="ssm must be a LinearSSM"):
        decay_report(SelectiveSSM.random(2), 10)
    with pytest.raises(ValueError, match="length must be >= 3"):
        decay_report(ssm, 2)
    with pytest.raises(ValueError, match="start must satisfy 0 <= start <= length − 3 = 7"):
        decay_report(ssm, 10, start=8)
    with pytest.raises(ValueError, match=r"ssm must be stable with 0 < ρ\(A\) < 1"):
        decay_report(LinearSSM(np.diag([1.0, 0.5]), np.eye(2), np.eye(2)), 10)
    with pytest.raises(ValueError, match=r"ssm must be stable with 0 < ρ\(A\) < 1"):
        decay_report(LinearSSM(np.zeros((2, 2)), np.eye(2), np.eye(2)), 10)


def test_lti_profile_to_distance_1e5():
    model = LinearSSM.random(8, 4, 4, spectral_radius=0.9999, seed=0)
    profile = lag_norms(model, 100_000)
    assert profile.shape == (100_000,) and np.all(np.isfinite(profile))
    fit = fit_decay_rate(profile, start=20_000)
    assert fit.rate == pytest.approx(0.9999, abs=1e-7)


# -- fit_decay_rate -------------------------------------------------------------


def test_fit_decay_rate_is_exact_on_an_exponential():
    ell = np.arange(50)
    fit = fit_decay_rate(3.0 * 0.7 ** ell)
    assert isinstance(fit, DecayFit)
    assert fit.rate == pytest.approx(0.7, rel=1e-12)
    assert fit.intercept == pytest.approx(math.log(3.0), abs=1e-10)
    assert fit.points == 50
    assert fit.log_rate_stderr < 1e-12
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'rate'"):
        fit.rate = 1.0


def within_t_interval(fit, rho, level=0.95):
    """Whether log ρ lies in the Student-t interval of the fitted slope (scipy's quantile, independent of lib)."""
    return abs(fit.log_rate - math.log(rho)) <= student_t.ppf((1 + level) / 2, fit.points - 2) * fit.log_rate_stderr


def test_fit_decay_rate_standard_error_covers_at_its_level_under_iid_noise():
    # Under iid Gaussian deviations of log‖J‖ the slope's t-interval from log_rate_stderr covers at its level.
    rng = np.random.default_rng(0)
    ell = np.arange(12)
    hits = sum(within_t_interval(fit_decay_rate(np.exp(-0.3 * ell + 0.2 * rng.standard_normal(12))), math.exp(-0.3))
               for _ in range(1000))
    assert 0.93 <= hits / 1000 <= 0.97  # ±3 binomial standard deviations


def test_fit_decay_rate_is_the_least_squares_line_of_scipy():
    # On noisy data: slope, intercept and the slope's standard error against scipy.stats.linregress.
    rng = np.random.default_rng(3)
    ell = np.arange(5, 40)
    log_norms = 0.7 - 0.2 * ell + 0.3 * rng.standard_normal(ell.size)
    fit = fit_decay_rate(np.exp(np.concatenate([np.zeros(5), log_norms])), start=5)
    line = linregress(ell, log_norms)
    assert fit.points == ell.size and fit.rate == pytest.approx(math.exp(line.slope), rel=1e-12)
    assert fit.log_rate == pytest.approx(line.slope, rel=1e-12) and fit.intercept == pytest.approx(line.intercept, rel=1e-12)
    assert fit.log_rate_stderr == pytest.approx(line.stderr, rel=1e-10)


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
    assert within_t_interval(fit, rho)
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
        weights = model.weights(X)[:, i, j]
        term = np.einsum("h,hpd->pd", weights, model.values())  # the one-hop term Σ_h α^h_ij V_h
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
    assert biased.weights(X)[1, 299, 10] >= 1 - 1e-9
    scores = biased.scores(X)[:, 299, 10]
    np.testing.assert_allclose(scores, [-30.0, 30.0], rtol=1e-9)
    bidirectional = SoftmaxAttention(*params.values(), causal=False)
    X = planted_key_input(bidirectional, 50, 3, 40, head=0, seed=rng)
    assert bidirectional.weights(X)[0, 3, 40] >= 1 - 1e-9
    V = np.linalg.norm(bidirectional.values()[0])
    # j > i is beyond jacobian_norms (j <= i only): take row 3 of the Jacobian directly.
    J = torch.autograd.functional.jacobian(lambda Z: bidirectional(Z)[3], torch.tensor(X))[:, 40, :]
    assert np.linalg.norm(J.numpy()) == pytest.approx(V, rel=1e-6)


def needed_strength(model, n, i, j, eps, seed=0):
    """The smallest planted strength with α^0_ij >= 1 − ε, by bisection on lib's weights (60 halvings)."""
    lo, hi = 1e-6, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        X = planted_key_input(model, n, i, j, strength=mid, seed=seed)
        lo, hi = (lo, mid) if model.weights(X)[0, i, j] >= 1 - eps else (mid, hi)
    return hi


def test_prop_attention_highway_needed_score_is_logsumexp_plus_logit():
    # (i): α_ij >= 1 − ε iff s_ij >= lse_{t≠j} s_it + ln((1−ε)/ε); the other scores are computed here in numpy.
    model = SoftmaxAttention.random(4, 4, heads=1, seed=3)
    eps = 1e-3
    for n in (3, 17, 129, 1025):
        i, j = n - 1, n // 2 - 1
        X = planted_key_input(model, n, i, j, strength=1.0, seed=n)  # background only matters
        q, K = model.W_Q[0] @ X[i], X @ model.W_K[0].T
        scores = np.delete(K @ q / math.sqrt(model.d_k), j)
        predicted = np.logaddexp.reduce(scores) + math.log((1 - eps) / eps)
        assert needed_strength(model, n, i, j, eps, seed=n) == pytest.approx(predicted, rel=1e-9)
        # max <= lse <= max + ln m with m = i other keys: the gap needed grows with the position.
        assert scores.max() <= predicted - math.log((1 - eps) / eps) <= scores.max() + math.log(i) + 1e-12


def bisected_score(model, n, i, j, eps, head, seed):
    """The smallest planted score with α^h_ij >= 1 − ε, by bisection on lib's torch weights (50 halvings)."""
    lo, hi = 1e-6, 200.0
    for _ in range(50):
        mid = (lo + hi) / 2
        X = planted_key_input(model, n, i, j, strength=mid, head=head, seed=seed)
        lo, hi = (lo, mid) if model.weights(X)[head, i, j] >= 1 - eps else (mid, hi)
    return hi


def test_prop_attention_highway_key_price_is_the_bisected_score_with_bias_and_non_causal():
    eps = 1e-3
    params = SoftmaxAttention._random_projections(4, 4, 2, None, None, 5)
    cases = [
        (SoftmaxAttention.random(4, 4, heads=1, seed=3), 0, lambda n: (n - 1, n // 2 - 1)),
        (SoftmaxAttention(*params.values(), position_bias=0.3 * np.random.default_rng(1).standard_normal((2, 200))),
         1, lambda n: (n - 1, 1)),
        (SoftmaxAttention(*params.values(), causal=False), 0, lambda n: (1, n - 1)),
    ]
    for model, head, positions in cases:
        for n in (3, 17, 65):
            i, j = positions(n)
            X = planted_key_input(model, n, i, j, strength=1.0, head=head, seed=n)
            price = key_price(model, X, i, j, eps, head=head)
            assert price.score == pytest.approx(bisected_score(model, n, i, j, eps, head, n), rel=1e-9, abs=1e-9)
            m = i if model.causal else n - 1  # other keys the query sees
            logit = math.log((1 - eps) / eps)
            assert logit - 1e-12 <= price.gap <= logit + math.log(m) + 1e-12


def test_prop_attention_highway_key_price_gap_is_ln_m_when_the_other_scores_are_equal():
    # The necessity half of (1): equal other scores need the full gap ln(m(1 − ε)/ε).
    model = SoftmaxAttention.random(3, 3, heads=1, seed=2)
    eps, n = 1e-2, 50
    X = np.tile(np.random.default_rng(0).standard_normal(3), (n, 1))
    price = key_price(model, X, n - 1, 10, eps)
    assert price.gap == pytest.approx(math.log((n - 1) * (1 - eps) / eps), rel=1e-12)


def test_key_price_bad_input():
    model = SoftmaxAttention.random(3, 3, heads=2, seed=0)
    X = np.zeros((6, 3))
    with pytest.raises(TypeError, match="attention must be a SoftmaxAttention"):
        key_price(LinearAttention.random(3, 3, seed=0), X, 5, 1, 0.1)
    with pytest.raises(ValueError, match="eps must satisfy 0 < eps < 1"):
        key_price(model, X, 5, 1, 1.0)
    with pytest.raises(ValueError, match="j must differ from i"):
        key_price(model, X, 5, 5, 0.1)
    with pytest.raises(ValueError, match="j must be < i for causal attention"):
        key_price(model, X, 2, 4, 0.1)
    with pytest.raises(ValueError, match="head must satisfy 0 <= head < H = 2"):
        key_price(model, X, 5, 1, 0.1, head=2)
    with pytest.raises(ValueError, match=r"i must satisfy 0 <= i < n = 6"):
        key_price(model, X, 6, 1, 0.1)


def test_random_profiles_are_jacobian_norms_on_the_generators_draws():
    model = MODELS["SelectiveSSM"]()
    rng, replay = np.random.default_rng(5), np.random.default_rng(5)
    profiles = random_profiles(model, 9, 3, rng)
    expected = [autograd_block_norms(model, replay.standard_normal((9, 3)), 8)[::-1] for _ in range(3)]
    np.testing.assert_allclose(profiles, expected, rtol=1e-10)
    assert rng.standard_normal() == replay.standard_normal()  # advanced by exactly those draws
    with pytest.raises(TypeError, match="rng must be a numpy Generator"):
        random_profiles(model, 9, 3, 5)
    with pytest.raises(ValueError, match="count must be >= 1"):
        random_profiles(model, 9, 0, rng)
    with pytest.raises(TypeError, match="model must be a SequenceMap"):
        random_profiles(np.eye(3), 9, 1, rng)


def test_prop_attention_highway_planted_key_profile_on_a_layer_and_through_a_stack():
    layer = SoftmaxAttention.random(4, 4, heads=2, seed=1)
    n, distances = 24, [1, 5, 23]
    norms = planted_key_profile(layer, n, distances, head=1, seed=7)
    for D, value in zip(distances, norms):
        X = planted_key_input(layer, n, n - 1, n - 1 - D, strength=30.0, head=1, seed=7 + D)
        assert value == pytest.approx(autograd_block_norms(layer, X, n - 1)[n - 1 - D], rel=1e-10)
    np.testing.assert_allclose(norms, np.linalg.norm(layer.values()[1]), rtol=1e-6)  # the highway
    stack = Stack.hybrid(4, 3, 2, seed=0)
    through = planted_key_profile(stack, n, distances, layer=stack.layers[0], strength=20.0, seed=3)
    for D, value in zip(distances, through):
        X = planted_key_input(stack.layers[0], n, n - 1, n - 1 - D, strength=20.0, seed=3 + D)
        assert value == pytest.approx(autograd_block_norms(stack, X, n - 1)[n - 1 - D], rel=1e-10)


def test_planted_key_profile_bad_input():
    layer = SoftmaxAttention.random(4, 4, seed=0)
    with pytest.raises(TypeError, match="layer must be a SoftmaxAttention or a LinearAttention"):
        planted_key_profile(LinearSSM.random(2, 4, 4), 10, [1])
    with pytest.raises(ValueError, match="distances entries must be >= 1"):
        planted_key_profile(layer, 10, [0, 1])
    with pytest.raises(ValueError, match=r"distances must hold at least one integer in \[1, n − 1 = 9\]"):
        planted_key_profile(layer, 10, [10])
    with pytest.raises(TypeError, match="distances must be a sequence of integers"):
        planted_key_profile(layer, 10, 3)
    with pytest.raises(ValueError, match="layer must take the model's input width d = 3"):
        planted_key_profile(Dense.random(3, 4), 10, [1], layer=layer)


def test_prop_attention_highway_needs_a_nonzero_value_map():
    # With V_h = 0 the conclusion ‖J − V_h‖ <= ε‖V_h‖ = 0 would need J = 0 exactly; the other head keeps it non-zero.
    params = SoftmaxAttention._random_projections(6, 6, 2, None, None, 0)
    params["W_O"][0] = 0.0
    model = SoftmaxAttention(*params.values())
    assert np.linalg.norm(model.values()[0]) == 0
    X = planted_key_input(model, 64, 63, 5, strength=30.0, head=0)
    assert model.weights(X)[0, 63, 5] >= 1 - 1e-9
    assert jacobian_norms(model, X, 63)[5] > 0


def test_prop_attention_highway_linear_attention_converges_like_one_over_strength():
    # (iii): for linear attention (elu + 1) the planted key gives ‖J − V_h‖ = O(m / s), not O(e^{−s}).
    model = LinearAttention.random(4, 4, heads=2, seed=10)
    V = model.values()[0]
    n = 64
    for D in (1, 20):
        errors = []
        for s in (1e4, 1e5, 1e6):
            X = planted_key_input(model, n, n - 1, n - 1 - D, strength=s, seed=D)
            errors.append(np.linalg.norm(jacobian_blocks(model, X, n - 1)[n - 1 - D] - V) / np.linalg.norm(V))
        slopes = np.diff(np.log(errors)) / np.log(10.0)
        np.testing.assert_allclose(slopes, -1.0, atol=0.05)
        assert errors[-1] < 0.05
    # At a fixed strength the weight is R/(R + a_j): far from 1 when the position (the number m of
    # competing keys) is large — the price grows linearly with m, not like ln m.
    weights = [model.weights(planted_key_input(model, m + 1, m, 0, strength=30.0, seed=m))[0, m, 0]
               for m in (8, 64, 512)]
    assert weights[0] > weights[1] > weights[2] and weights[2] < 0.5


def test_cor_attention_price_bounds_are_attained_by_the_one_dimensional_example():
    # W_Q = 1, W_K = −1, V = 1, R = 1 (S = 1): x_j = −1, every other token +1 gives α_ij = 1/(1 + i e^{−2})
    # and J_ij = α(1 + 2(1 − α)) — both bounds of the corollary with equality, at every position i.
    model = SoftmaxAttention([[[1.0]]], [[[-1.0]]], [[[1.0]]], [[[1.0]]])
    for n in (2, 5, 50, 400):
        i = n - 1
        for j in {0, i // 2, i - 1}:
            X = np.ones((n, 1))
            X[j] = -1.0
            alpha = 1 / (1 + i * math.exp(-2.0))
            assert model.weights(X)[0, i, j] == pytest.approx(alpha, rel=1e-12)
            assert jacobian_blocks(model, X, i)[j, 0, 0] == pytest.approx(alpha * (1 + 2 * (1 - alpha)), rel=1e-12)


def test_cor_attention_price_bounds_hold_on_random_and_planted_bounded_inputs():
    model = SoftmaxAttention.random(4, 3, heads=1, seed=7)
    R = 1.5
    S = np.linalg.norm(model.W_K[0].T @ model.W_Q[0], 2) * R ** 2 / math.sqrt(model.d_k)
    V = np.linalg.norm(model.values()[0], 2)
    rng = np.random.default_rng(0)
    n = 200
    worst = 0.0
    for trial in range(20):
        X = rng.standard_normal((n, 4))
        if trial % 2:  # a planted key, then every token projected back into the ball
            X = planted_key_input(model, n, n - 1, trial, strength=50.0, seed=trial)
        X *= R / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)  # ‖x_t‖ = R exactly
        alpha = model.weights(X)[0, n - 1, : n - 1]
        blocks = jacobian_blocks(model, X, n - 1)[: n - 1]
        i = n - 1
        assert np.all(alpha <= 1 / (1 + i * math.exp(-2 * S)) * (1 + 1e-12))
        norms = np.linalg.norm(blocks, 2, axis=(1, 2))
        assert np.all(norms <= alpha * (1 + 2 * S * (1 - alpha)) * V * (1 + 1e-10))
        worst = max(worst, float((norms / ((1 + 2 * S) * V / (1 + i * math.exp(-2 * S)))).max()))
    assert worst <= 1
    # The position limit: a highway of accuracy ε needs i <= e^{2S}(2S + ε)/(1 − ε).
    eps = 0.1
    limit = math.exp(2 * S) * (2 * S + eps) / (1 - eps)
    assert (1 + 2 * S) / (1 + (limit + 1) * math.exp(-2 * S)) < 1 - eps


def test_attention_jacobian_is_the_one_hop_term_plus_terms_through_the_weights():
    # ∂y_i/∂x_j = Σ_h α^h_ij V_h + Σ_h α^h_ij V_h (x_j − x̄^h_i) (W_Kᵀ q^h_i)ᵀ/√d_k for j != i.
    model = SoftmaxAttention.random(4, 3, heads=2, seed=2)
    X = np.random.default_rng(2).standard_normal((7, 4))
    alpha = model.weights(X)
    V, W_Q, W_K = model.values(), model.W_Q, model.W_K
    J = torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X)).numpy()
    for i, j in [(6, 0), (6, 3), (3, 1), (5, 4)]:
        term = np.einsum("h,hpd->pd", alpha[:, i, j], V)  # the one-hop term Σ_h α^h_ij V_h
        np.testing.assert_allclose(term, model.operator(X)[i, j], rtol=1e-12, atol=1e-15)
        rest = sum(alpha[h, i, j] * np.outer(V[h] @ (X[j] - alpha[h, i] @ X), W_K[h].T @ (W_Q[h] @ X[i]))
                   / math.sqrt(model.d_k) for h in range(2))
        np.testing.assert_allclose(J[i, :, j, :], term + rest, rtol=1e-10, atol=1e-13)


# -- selective SSMs ------------------------------------------------------------


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
    with pytest.raises(TypeError, match="attention must be a SoftmaxAttention or a LinearAttention"):
        planted_key_input(Dense.random(4, 4), 10, 9, 0)
    with pytest.raises(ValueError, match="stacked key maps"):
        planted_key_input(LinearAttention.random(2, 2, heads=2, d_k=2), 10, 9, 0)
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
        planted_key_input(model, 10, 9, 10)


# -- prop-selective-gradient ---------------------------------------------------------------------------

GATED = {
    "SelectiveSSM": lambda: SelectiveSSM.random(3, 4, step_range=(0.05, 0.5), seed=2),
    "SSD 2 heads": lambda: SSD.random(4, 3, N=3, heads=2, step_range=(0.05, 0.5), seed=3),
    "SSD 1 head": lambda: SSD.random(3, 2, N=2, heads=1, seed=4),
}


def hand_selective_jacobian(model, X, i, j):
    """∂y_i/∂x_j of a SelectiveSSM by central finite differences of a plain-numpy recurrence (independent)."""
    A = model.A

    def run(Z):
        pre = Z @ model.W_delta.T + model.b_delta
        delta = np.logaddexp(0, pre)
        h = np.zeros((model.d, model.N))
        for t in range(i + 1):
            h = np.exp(delta[t][:, None] * A) * h + (delta[t] * Z[t])[:, None] * (model.W_B @ Z[t])[None]
        return h @ (model.W_C @ Z[i])

    J = np.zeros((model.d, model.d))
    for k in range(model.d):
        step = np.zeros_like(X)
        step[j, k] = 1e-6
        J[:, k] = (run(X + step) - run(X - step)) / 2e-6
    return J


@pytest.mark.parametrize("name", GATED)
def test_prop_selective_gradient_formula_equals_autograd_on_open_random_and_closed_inputs(name):
    # (1): J_ij = Σ_k e^{−r_k τ_k} modes_k with τ the accumulated step after j — against autograd
    # through lib's scan, on random inputs, large inputs, and gate-closing inputs.
    model = GATED[name]()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((7, model.d)), 5 * rng.standard_normal((7, model.d)),
              gate_closing_input(model, 7, 2, closing=8.0)]
    for X in inputs:
        for i in range(7):
            blocks = jacobian_blocks(model, X, i)
            for j in range(i + 1):
                path = selective_jacobian(model, X, i, j)
                scale = np.abs(blocks[j]).max()
                np.testing.assert_allclose(path.block, blocks[j], rtol=0, atol=1e-11 * scale)
                # τ_k: the steps of t = j+1..i (not j), mode by mode.
                delta = model.selection(X)[0] if isinstance(model, SelectiveSSM) else None
                if delta is not None:
                    assert path.steps[0] == pytest.approx(delta[j + 1: i + 1, 0].sum(), abs=1e-14)


def test_prop_selective_gradient_formula_matches_finite_differences_of_plain_numpy():
    model = GATED["SelectiveSSM"]()
    X = np.random.default_rng(1).standard_normal((6, 3))
    for i, j in [(5, 0), (5, 3), (4, 4), (2, 1)]:
        np.testing.assert_allclose(selective_jacobian(model, X, i, j).block, hand_selective_jacobian(model, X, i, j),
                                   rtol=1e-6, atol=1e-8)


def test_prop_selective_gradient_bounds_2_and_3_hold_and_are_equalities_for_one_state():
    # (2) ‖row c‖ <= e^{−a_min τ} ‖C_i‖‖G_c‖ and (3) ‖row c − undecayed row c‖ <= (1 − e^{−a_max τ}) ‖C_i‖‖G_c‖;
    # with N = 1 both are equalities, so a wrong exponent (a_max for a_min, τ off by a step) fails.
    for N, equality in ((1, True), (4, False)):
        model = SelectiveSSM.random(3, N=N, step_range=(0.05, 0.5), seed=N)
        X = np.random.default_rng(N).standard_normal((12, 3))
        A = np.abs(model.A)
        delta = model.selection(X)[0]
        for j in (0, 4, 10):
            path = selective_jacobian(model, X, 11, j)
            tau = delta[j + 1: 12].sum(0)
            C = model.W_C @ X[11]
            blocks = jacobian_blocks(model, X, 11)[j]
            for c in range(3):
                rows = path.modes[c * N:(c + 1) * N, c, :] / C[:, None]  # G_c = ∂h_j[c]/∂x_j, (N, d)
                factor = np.linalg.norm(C) * np.linalg.norm(rows, 2)
                upper = np.exp(-A[c].min() * tau[c]) * factor
                change = (1 - np.exp(-A[c].max() * tau[c])) * factor
                measured = np.linalg.norm(blocks[c])
                moved = np.linalg.norm(blocks[c] - path.undecayed[c])
                assert measured <= upper * (1 + 1e-10) and moved <= change * (1 + 1e-10)
                if equality:
                    assert measured == pytest.approx(upper, rel=1e-10)
                    assert moved == pytest.approx(change, rel=1e-9)


def test_prop_selective_gradient_bounded_tokens_keep_every_gate_open():
    # (a): ‖x_t‖ <= R gives Δ_t[c] >= softplus(b[c] − ‖W_Δ[c]‖ R); the token −R w_c/‖w_c‖ attains it.
    model = SelectiveSSM.random(3, N=2, seed=5)
    R = 2.0
    W, b = model.W_delta, model.b_delta
    floor = np.logaddexp(0, b - np.linalg.norm(W, axis=1) * R)
    X = np.random.default_rng(0).standard_normal((400, 3))
    X *= R / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), R)  # inside the ball
    X[:3] = -R * W / np.linalg.norm(W, axis=1, keepdims=True)          # the minimising tokens
    delta = model.selection(X)[0]
    assert np.all(delta >= floor * (1 - 1e-12))
    np.testing.assert_allclose(np.diag(delta[:3]), floor, rtol=1e-12)


@pytest.mark.parametrize("name", GATED)
def test_cor_gate_closing_profile_is_flat_to_a_max_D_e_minus_M(name):
    model = GATED[name]()
    n, M = 60, 12.0
    rates = np.abs(model.A).max() if isinstance(model, SelectiveSSM) else np.abs(model.a).max()
    reference = None
    for D in range(1, n):
        j = n - 1 - D
        X = gate_closing_input(model, n, j, closing=M, seed=0)
        J = jacobian_blocks(model, X, n - 1)[j]
        path = selective_jacobian(model, X, n - 1, j)
        undecayed = path.undecayed  # independent of D for D >= 1: the same w, z and h_{j−1} = 0
        if reference is None:
            reference = undecayed
        np.testing.assert_allclose(undecayed, reference, rtol=1e-12, atol=1e-12 * np.abs(reference).max())
        allowed = rates * D * np.exp(-M) * sum(np.linalg.norm(m) for m in path.modes)
        assert np.linalg.norm(J - undecayed) <= allowed
    assert np.linalg.norm(reference) > 0
    # The gates are closed: every step after j is softplus(−M).
    X = gate_closing_input(model, n, 10, closing=M)
    steps = model.selection(X)[0] if isinstance(model, SelectiveSSM) else model._steps(torch.tensor(X)[None])[0].numpy()
    np.testing.assert_allclose(steps[11:], np.log1p(np.exp(-M)), rtol=1e-6)
    np.testing.assert_allclose(X[:10], 0.0)


def test_cor_gate_closing_gives_full_reach_where_random_inputs_decay():
    model = SelectiveSSM.random(4, N=4, step_range=(0.1, 1.0), seed=5)
    n = 64
    closed = [np.linalg.norm(jacobian_blocks(model, gate_closing_input(model, n, n - 1 - D), n - 1)[n - 1 - D])
              for D in (1, 8, 63)]
    random = jacobian_norms(model, np.random.default_rng(0).standard_normal((n, 4)), n - 1)[::-1]
    np.testing.assert_allclose(closed, closed[0], rtol=1e-12)
    assert random[40] < 1e-3 * random.max()  # the same layer on a random input: gone by D = 40


def test_cor_gate_closing_profile_is_the_autograd_norm_on_each_gate_closing_input():
    model = GATED["SSD 2 heads"]()
    n, distances = 30, [0, 1, 7, 29]
    norms = gate_closing_profile(model, n, distances, closing=12.0, seed=4)
    for D, value in zip(distances, norms):
        X = gate_closing_input(model, n, n - 1 - D, closing=12.0, seed=4)
        assert value == pytest.approx(autograd_block_norms(model, X, n - 1)[n - 1 - D], rel=1e-10)
    np.testing.assert_allclose(norms[1:], norms[1], rtol=1e-3)  # flat beyond D = 0
    with pytest.raises(TypeError, match="model must be a SelectiveSSM or an SSD"):
        gate_closing_profile(LinearSSM.random(2, 2, 2), 10, [1])
    with pytest.raises(ValueError, match=r"distances must hold at least one integer in \[0, n − 1 = 9\]"):
        gate_closing_profile(model, 10, [10])


@pytest.mark.parametrize("name", GATED)
def test_cor_gate_closing_check_holds_and_fails_when_the_gates_stay_open(name, monkeypatch):
    model = GATED[name]()
    check = gate_closing_check(model, 16, closing=12.0)
    assert 0 < check.ratio <= 1 and check.spread <= 1e-12
    # The check can fail: gates closed only to μ = 2 while the bound is taken at μ = 12.
    import lib.gradients as gradients

    close = gradients.gate_closing_input
    monkeypatch.setattr(gradients, "gate_closing_input",
                        lambda m, n, j, closing, seed: close(m, n, j, closing=2.0, seed=seed))
    assert gate_closing_check(model, 16, closing=12.0).ratio > 100


def test_gate_closing_check_bad_input():
    with pytest.raises(TypeError, match="model must be a SelectiveSSM or an SSD"):
        gate_closing_check(LinearSSM.random(2, 2, 2), 10)
    with pytest.raises(ValueError, match="n must be >= 2"):
        gate_closing_check(GATED["SelectiveSSM"](), 1)
    with pytest.raises(ValueError, match="closing must be > 0"):
        gate_closing_check(GATED["SelectiveSSM"](), 5, closing=-1.0)


def test_gate_closing_input_validation():
    with pytest.raises(TypeError, match="model must be a SelectiveSSM or an SSD"):
        gate_closing_input(LinearSSM.random(2, 2, 2), 5, 1)
    singular = SelectiveSSM(np.zeros((2, 2)), [[1.0, 1.0], [1.0, 1.0]], [0.0, 0.0], np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="must have full row rank"):
        gate_closing_input(singular, 5, 1)
    model = SelectiveSSM.random(2)
    with pytest.raises(ValueError, match="closing must be > 0"):
        gate_closing_input(model, 5, 1, closing=0.0)
    with pytest.raises(ValueError, match=r"j must satisfy 0 <= j < n = 5"):
        gate_closing_input(model, 5, 5)
    with pytest.raises(ValueError, match="j must satisfy j <= i"):
        selective_jacobian(model, np.zeros((5, 2)), 1, 3)
    with pytest.raises(TypeError, match="model must be a SelectiveSSM or an SSD"):
        selective_jacobian(LinearSSM.random(2, 2, 2), np.zeros((5, 2)), 1, 0)


# -- prop-frozen-gate ------------------------------------------------------------------------------------

def closed_form_response(delta, a, D, B, C):
    """|C B Δ e^{−ΔaD}|: the lag-D response of prop-frozen-gate written out (lib reads it from the lags)."""
    return abs(C * B * delta * math.exp(-delta * a * D))


@pytest.mark.parametrize("delta, a, D", [(1e-3, 0.7, 0), (0.1, 2.0, 50), (1.0, 0.01, 1000), (3.0, 5.0, 7)])
def test_prop_frozen_gate_response_from_the_lags_is_the_closed_form(delta, a, D):
    expected = closed_form_response(delta, a, D, 1.3, -0.4)
    assert frozen_gate_response(delta, a, D, B=1.3, C=-0.4) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("D", [5, 50, 500])
def test_prop_frozen_gate_best_response_with_a_rate_floor_is_one_over_e_a_min_D(D):
    # (1): over Δ > 0 and a >= a_min the sup of |CBΔ e^{−ΔaD}| is |CB|/(e a_min D), at a = a_min, Δ = 1/(a_min D).
    a_min, B, C = 0.7, 1.3, -0.4
    best = abs(B * C) / (np.e * a_min * D)
    assert frozen_gate_response(1 / (a_min * D), a_min, D, B=B, C=C) == pytest.approx(best, rel=1e-12)
    steps, rates = np.geomspace(1e-6, 10.0, 301), a_min * np.geomspace(1, 50, 9)
    found = frozen_gate_search(D, steps, rates, B=B, C=C)
    grid = [closed_form_response(s, a, D, B, C) for s in steps for a in rates]
    assert found.response == pytest.approx(max(grid), rel=1e-12)
    assert (found.step, found.rate) == (steps[np.argmax(grid) // 9], rates[np.argmax(grid) % 9])
    assert found.response <= best * (1 + 1e-12)
    assert found.response == pytest.approx(best, rel=1e-3)
    exact = frozen_gate_search(D, [0.5 / (a_min * D), 1 / (a_min * D), 2 / (a_min * D)], [a_min, 2 * a_min], B=B, C=C)
    assert exact.response == pytest.approx(best, rel=1e-12) and exact.rate == a_min


@pytest.mark.parametrize("delta", [0.01, 0.1, 1.0])
def test_prop_frozen_gate_learnable_rate_removes_the_one_over_D_price(delta):
    # (2): a = 1/(ΔD) gives |CB|Δ/e at every D, and smaller rates approach |CB|Δ: no 1/D.
    B, C = 1.3, -0.4
    for D in (10, 100, 1000):
        assert frozen_gate_response(delta, 1 / (delta * D), D, B=B, C=C) == pytest.approx(abs(B * C) * delta / np.e,
                                                                                          rel=1e-12)
        assert frozen_gate_response(delta, 1e-9, D, B=B, C=C) == pytest.approx(abs(B * C) * delta, rel=1e-5)


def test_frozen_gate_bad_input():
    with pytest.raises(ValueError, match="step must be > 0"):
        frozen_gate_response(0.0, 1.0, 3)
    with pytest.raises(ValueError, match="rate must be > 0"):
        frozen_gate_response(0.1, -1.0, 3)
    with pytest.raises(ValueError, match="D must be >= 0"):
        frozen_gate_response(0.1, 1.0, -1)
    with pytest.raises(TypeError, match="C must be a real number"):
        frozen_gate_response(0.1, 1.0, 3, C="1")
    with pytest.raises(ValueError, match="D must be >= 1"):
        frozen_gate_search(0, [0.1], [1.0])
    with pytest.raises(ValueError, match="steps must be a non-empty 1-d sequence"):
        frozen_gate_search(3, [], [1.0])
    with pytest.raises(ValueError, match="rates must hold finite numbers > 0"):
        frozen_gate_search(3, [0.1], [1.0, -2.0])
    with pytest.raises(ValueError, match="steps must be a non-empty 1-d sequence"):
        frozen_gate_search(3, "0.1", [1.0])


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
    # The input enters as Δ·B_t x_t: doubling a small Δ about doubles J_ij (exactly 2 e^{−Δ|A_n|} mode by mode).
    assert profiles[0.002][1] == pytest.approx(2 * profiles[0.001][1], rel=0.01)
    assert profiles[0.001][800] > 0.01 * profiles[0.001][1]
    assert profiles[0.001][1] < 0.1 * profiles[0.2][1]
    assert profiles[0.2][800] < 1e-60 * profiles[0.2][1]


def test_with_constant_step_validation():
    with pytest.raises(TypeError, match="model must be a SelectiveSSM"):
        with_constant_step(LinearSSM.random(2, 2, 2), 0.1)
    with pytest.raises(ValueError, match="step must be > 0"):
        with_constant_step(SelectiveSSM.random(2), 0.0)


# -- prop-rnn-gradient ----------------------------------------------------------------------------------

def saturated_product(rnn, subset, M, D):
    """C (ΦW)^D Φ U with Φ = P_S + sech²(M) P_{S^c}, by numpy matrix powers (independent of lib)."""
    phi = np.full(rnn.N, 1 / np.cosh(M) ** 2)
    phi[list(subset)] = 1.0
    return rnn.C @ np.linalg.matrix_power(phi[:, None] * rnn.W, D) @ (phi[:, None] * rnn.U)


def test_prop_rnn_gradient_formula_equals_autograd():
    rnn = ElmanRNN.random(4, 5, 3, seed=1)
    X = 2 * np.random.default_rng(1).standard_normal((8, 5))
    for i in range(8):
        blocks = jacobian_blocks(rnn, X, i)
        for j in range(i + 1):
            np.testing.assert_allclose(rnn_jacobian(rnn, X, i, j), blocks[j], rtol=1e-10, atol=1e-13)


def test_prop_rnn_gradient_saturating_input_gives_the_principal_block_power():
    # (b): on one input, J_{i,i−D} = C (ΦW)^D Φ U for every D; here W has ρ(W) = 0.5 but W_00 = 1.5.
    W = np.array([[1.5, 1.0], [-2.0, -1.5]])
    assert np.abs(np.linalg.eigvals(W)).max() == pytest.approx(0.5)
    rnn = ElmanRNN(W, [[1.0, 0.3], [0.2, 1.0]], [[1.0, 0.5]])
    assert saturation_subset(rnn) == ((0,), pytest.approx(1.5))
    n = 40
    for M in (3.0, 20.0):
        X = saturating_input(rnn, n, (0,), saturation=M)
        blocks = jacobian_blocks(rnn, X, n - 1)
        for D in range(n):
            np.testing.assert_allclose(blocks[n - 1 - D], saturated_product(rnn, (0,), M, D), rtol=1e-8, atol=1e-300)
    # The limit C_{:,S} W_SS^D U_{S,:} = 1.5^D C_0 U_0: the gradient grows although ρ(W) = 0.5.
    np.testing.assert_allclose(blocks[0], 1.5 ** (n - 1) * np.outer(rnn.C[:, 0], rnn.U[0]), rtol=1e-10)


def test_prop_rnn_gradient_contractive_scaling_bounds_every_input_including_adversarial_ones():
    # (a): W = Λ⁻¹ (0.9 Q) Λ with Q orthogonal, Λ = diag(1, 10, 100): ‖W‖₂ ≫ 1 but ‖ΛWΛ⁻¹‖₂ = 0.9.
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    scale = np.array([1.0, 10.0, 100.0])
    W = (0.9 * Q) * scale[None, :] / scale[:, None]     # Λ⁻¹ (0.9 Q) Λ
    assert np.linalg.norm(W, 2) > 5
    rnn = ElmanRNN(W, rng.standard_normal((3, 3)), rng.standard_normal((2, 3)))
    constant = np.linalg.norm(rnn.C / scale[None, :], 2) * np.linalg.norm(scale[:, None] * rnn.U, 2)
    n = 30
    inputs = [rng.standard_normal((n, 3)), 10 * rng.standard_normal((n, 3))]
    inputs += [saturating_input(rnn, n, S, saturation=M) for M in (1.0, 20.0)
               for size in (1, 2, 3) for S in itertools.combinations(range(3), size)]
    for X in inputs:
        blocks = jacobian_blocks(rnn, X, n - 1)
        for D in range(n):
            assert np.linalg.norm(blocks[n - 1 - D], 2) <= constant * 0.9 ** D * (1 + 1e-9)
    # (c): every principal block of W has spectral radius <= 0.9.
    assert saturation_subset(rnn)[1] <= 0.9 + 1e-12
    # Equality for one state held at z = 0: J = C W^D U exactly.
    scalar = ElmanRNN([[0.8]], [[1.0]], [[2.0]])
    blocks = jacobian_blocks(scalar, saturating_input(scalar, 20, (0,)), 19)[::-1]
    np.testing.assert_allclose(blocks[:, 0, 0], 2.0 * 0.8 ** np.arange(20), rtol=1e-12)


def test_prop_rnn_gradient_the_zoo_rnn_grows_on_a_saturating_input():
    rnn = next(a.model for a in architecture_zoo(d=4, p=4, n=32, seed=0) if isinstance(a.model, ElmanRNN))
    assert np.abs(np.linalg.eigvals(rnn.W)).max() == pytest.approx(0.9)
    subset, radius = saturation_subset(rnn)
    # Exhaustive check of the subset search against a brute force written here.
    brute = max((np.abs(np.linalg.eigvals(rnn.W[np.ix_(S, S)])).max(), S)
                for size in range(1, 5) for S in itertools.combinations(range(4), size))
    assert subset == brute[1] and radius == pytest.approx(brute[0], rel=1e-12)
    assert radius > 1
    n = 128
    profile = jacobian_norms(rnn, saturating_input(rnn, n), n - 1)[::-1]
    assert profile[-1] > 100 * profile[1]


def test_prop_rnn_gradient_saturation_subset_is_the_brute_force_maximum_on_random_W():
    # Random W (N = 5): the best principal block is often not a single coordinate; compare with a search written here.
    sizes = set()
    for seed in range(8):
        rnn = ElmanRNN.random(5, 5, 2, spectral_radius=1.5, seed=seed)
        W = rnn.W
        best = max(((np.abs(np.linalg.eigvals(W[np.ix_(S, S)])).max(), S)
                    for size in range(1, 6) for S in itertools.combinations(range(5), size)), key=lambda r: r[0])
        subset, radius = saturation_subset(rnn)
        assert subset == best[1] and radius == pytest.approx(best[0], rel=1e-12)
        sizes.add(len(subset))
    assert max(sizes) >= 2


def test_rnn_helpers_validation():
    rnn = ElmanRNN.random(3, 2, 2)  # U is 3 × 2: not of full row rank
    with pytest.raises(ValueError, match="must have full row rank"):
        saturating_input(rnn, 5, (0,))
    square = ElmanRNN.random(3, 3, 2)
    with pytest.raises(ValueError, match="subset must hold distinct indices"):
        saturating_input(square, 5, (0, 0))
    with pytest.raises(ValueError, match="subset must hold distinct indices"):
        saturating_input(square, 5, (3,))
    with pytest.raises(TypeError, match="subset must be a collection"):
        saturating_input(square, 5, 1)
    with pytest.raises(ValueError, match="saturation must be > 0"):
        saturating_input(square, 5, (0,), saturation=-1.0)
    with pytest.raises(TypeError, match="rnn must be a ElmanRNN"):
        saturation_subset(LinearSSM.random(2, 2, 2))
    with pytest.raises(ValueError, match="N <= 12"):
        saturation_subset(ElmanRNN.random(13, 2, 2))
    with pytest.raises(ValueError, match="j must satisfy j <= i"):
        rnn_jacobian(square, np.zeros((4, 3)), 1, 2)


# -- gradient_reach ----------------------------------------------------------------------------------------

def test_gradient_reach_of_an_lti_ssm_is_log_eps_over_log_rho():
    rho = 0.8
    ssm = LinearSSM([[rho]], [[1.0]], [[1.0]])
    assert gradient_reach(lag_norms(ssm, 200), 1e-3) == int(np.floor(np.log(1e-3) / np.log(rho)))


def test_gradient_reach_edge_cases_and_bad_input():
    assert gradient_reach(np.array([1.0, 0.0, 0.0]), 0.5) == 0
    assert gradient_reach(np.zeros(4)) == 0
    assert gradient_reach(np.ones(7)) == 6
    with pytest.raises(ValueError, match="eps must satisfy"):
        gradient_reach(np.ones(3), 1.5)
    with pytest.raises(ValueError, match="profile must"):
        gradient_reach(-np.ones(3))
