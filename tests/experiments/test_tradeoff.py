"""Rank and attenuation within input-independent dynamics (experiments.tradeoff)."""

import math

import numpy as np
import pytest
import torch

from experiments.gradient_highway import read_profile
from experiments.tradeoff import margin_needed, margin_reading, reach, resonant_input, rotation_ssm, scaled_ssm
from lib import LinearSSM, jacobian_norms, min_heads, s4d_ssm

mpow = np.linalg.matrix_power


def lags_by_powers(A, B, C, n):
    """C A^ℓ B for ℓ < n by numpy matrix powers (independent of lib's doubling)."""
    return np.stack([C @ mpow(A, ell) @ B for ell in range(n)])


def span_dimension(lags, rtol=1e-10):
    """The rank of the n × pd matrix of the flattened lags, by numpy's SVD."""
    sigma = np.linalg.svd(lags.reshape(len(lags), -1), compute_uv=False)
    return int((sigma > rtol * sigma[0]).sum())


def numpy_ssm(ssm):
    return tuple(M.detach().numpy() for M in (ssm.A, ssm.B, ssm.C))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("c", [-1.7, 0.3, 1.2])
def test_prop_rank_attenuation_independent_scaling_keeps_the_span_and_moves_rho(seed, c):
    base = LinearSSM.random(3, 2, 2, spectral_radius=0.7, seed=seed)
    scaled = scaled_ssm(base, c)
    A, B, C = numpy_ssm(base)
    n = 12
    np.testing.assert_allclose(lags_by_powers(*numpy_ssm(scaled), n),
                               c ** np.arange(n)[:, None, None] * lags_by_powers(A, B, C, n), rtol=1e-11, atol=1e-15)
    assert span_dimension(lags_by_powers(*numpy_ssm(scaled), n)) == span_dimension(lags_by_powers(A, B, C, n))
    assert min_heads(scaled, n) == min_heads(base, n)
    assert scaled.spectral_radius == pytest.approx(abs(c) * 0.7, rel=1e-12)


def test_prop_rank_attenuation_independent_the_referees_instance():
    # The zoo's LTI SSM (seed 4): k = 4 at ρ = 0.8 and at ρ = 0.99; gradient at D = 127 of
    # 1.6e-12 and 0.93; reach (against g(1)) 35 and the whole sequence.
    base = LinearSSM.random(4, 4, 4, spectral_radius=0.8, seed=4)
    n = 128
    for rho, far, expected_reach in ((0.8, 1.638e-12, 35), (0.99, 0.9281, 127)):
        ssm = scaled_ssm(base, rho / 0.8)
        g = np.linalg.norm(lags_by_powers(*numpy_ssm(ssm), n), axis=(1, 2))
        assert min_heads(ssm, n) == 4
        assert g[-1] == pytest.approx(far, rel=1e-3)
        assert reach(g, 1e-3) == expected_reach == read_profile(g, 1e-3).reach


@pytest.mark.parametrize("angles", [[1.0, 2.0], [0.3, 2.9, 1.7], [0.01, 3.1]])
def test_prop_rank_attenuation_independent_rotations_have_full_rank_and_no_decay(angles):
    ssm = rotation_ssm(angles)
    N = 2 * len(angles)
    A, B, C = numpy_ssm(ssm)
    assert np.abs(np.linalg.eigvals(A)) == pytest.approx(np.ones(N))
    lags = lags_by_powers(A, B, C, 3 * N)
    assert span_dimension(lags) == N == min_heads(ssm, 3 * N)
    assert span_dimension(lags[:N - 1]) == N - 1  # n >= N is needed
    X = np.random.default_rng(0).standard_normal((300, N)) * 1e3
    np.testing.assert_allclose(jacobian_norms(ssm, X, 299), math.sqrt(N), rtol=1e-12)
    J = torch.autograd.functional.jacobian(ssm, torch.from_numpy(X[:7])).numpy()  # independent route
    for D in range(7):
        np.testing.assert_allclose(J[6, :, 6 - D, :], mpow(A, D), atol=1e-12)


def test_prop_rank_attenuation_independent_needs_distinct_nodes():
    # Equal angles, or θ = π (e^{iπ} = e^{−iπ}), lose dimensions: the hypothesis is needed.
    assert min_heads(rotation_ssm([1.0, 1.0]), 16) == 2
    assert min_heads(rotation_ssm([math.pi, 1.0]), 16) == 3


@pytest.mark.parametrize("rho", [0.3, 0.8, 0.95, 0.999])
def test_prop_rank_attenuation_independent_the_margin_bounds_the_distance(rho):
    eps = 1e-3
    for ssm in (s4d_ssm(6, 3, rho, seed=1), LinearSSM.random(4, 3, 3, spectral_radius=rho, seed=2)):
        A, B, C = numpy_ssm(ssm)
        _, P = np.linalg.eig(A)
        kappa = np.linalg.cond(P)
        scale = np.linalg.norm(C, 2) * np.linalg.norm(B)
        g = np.linalg.norm(lags_by_powers(A, B, C, 400), axis=(1, 2))
        for D in np.flatnonzero(g >= eps * scale)[1:]:
            assert 1 - rho <= -math.log(rho) <= margin_needed(eps, int(D), kappa) * (1 + 1e-12)
    normal = s4d_ssm(6, 3, rho, seed=1)
    reading = margin_reading(normal, np.linalg.norm(lags_by_powers(*numpy_ssm(normal), 200), axis=(1, 2)), eps)
    assert reading["bound ratio"] <= 1 + 1e-12
    assert reading["margin −ln ρ"] <= reading["allowed ln(1/ε)/D"] * (1 + 1e-12)


def test_margin_reading_fails_on_a_profile_beyond_the_bound():
    ssm = s4d_ssm(6, 3, 0.9, seed=1)
    g = np.linalg.norm(lags_by_powers(*numpy_ssm(ssm), 100), axis=(1, 2))
    assert margin_reading(ssm, 1.001 * g / margin_reading(ssm, g, 1e-3)["bound ratio"], 1e-3)["bound ratio"] > 1
    far = g.copy()
    far[90] = g[0]  # a gradient kept to D = 90 that a margin of 0.105 cannot allow
    assert margin_reading(ssm, far, 1e-3)["margin −ln ρ"] > margin_reading(ssm, far, 1e-3)["allowed ln(1/ε)/D"]


def test_prop_rank_attenuation_independent_resonant_input_grows_and_stable_normal_outputs_do_not():
    ssm = rotation_ssm([0.7, 2.3])
    u = np.array([0.3, -1.2, 0.5, 2.0])
    X = resonant_input(ssm, 50, u)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), np.linalg.norm(u))
    with torch.no_grad():
        y = ssm(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.arange(1, 51) * np.linalg.norm(u), rtol=1e-12)
    stable = s4d_ssm(6, 4, 0.9, seed=3)
    A, B, C = numpy_ssm(stable)
    bound = np.linalg.norm(C, 2) * np.linalg.norm(B, 2) / (1 - 0.9)
    constant = np.tile(np.linalg.svd(B)[2][0], (300, 1))  # every token along B's top direction
    for X in (constant, np.random.default_rng(1).standard_normal((300, 4))):
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
        with torch.no_grad():
            out = stable(torch.from_numpy(X)).numpy()
        assert np.linalg.norm(out, axis=1).max() <= bound


def test_prop_rank_attenuation_independent_part3_bounds_the_scale_reach_not_the_g1_reach():
    # Referee B 2: two normal modes 0.9, 0.89 with residues ±1 keep eps·‖C‖₂‖B‖_F only within
    # ln(1/eps)/ln(1/ρ) steps (part 3), but their reach relative to g(1) goes well beyond it.
    from experiments.tradeoff import scale_reach

    two = LinearSSM(np.diag([0.9, 0.89]), np.ones((2, 1)), [[1.0, -1.0]])
    g = jacobian_norms(two, np.zeros((128, 1)), 127)[::-1]
    count = math.log(1e3) / math.log(1 / 0.9)
    assert np.allclose(g, np.abs(0.9 ** np.arange(128) - 0.89 ** np.arange(128)), atol=1e-15)
    assert scale_reach(g, math.sqrt(2) * math.sqrt(2), 1e-3) <= count < reach(g, 1e-3)
    assert reach(g, 1e-3) == 105
    single = 0.9 ** np.arange(128)  # one mode: the count is exact (g(1) = ρ: one step more)
    assert scale_reach(single, 1.0, 1e-3) == math.floor(count) == reach(single, 1e-3) - 1


def test_slowest_mode_reach_is_where_a_mode_falls_to_eps():
    from experiments.tradeoff import slowest_mode_reach

    D = slowest_mode_reach(1e-3, 0.5)
    assert math.isclose(math.exp(-1e-3 * 0.5 * D), 1e-3)
    assert round(slowest_mode_reach(1e-3, 1.0)) == 6908 and round(D) == 13816


def test_recall_design_near_unit_start_beats_default_at_every_state_size_per_seed():
    # Referee B2 3: the reading "both factors matter and interact", from the committed table
    import pandas as pd
    from pathlib import Path

    table = Path(__file__).resolve().parents[2] / "data/results/gradient-highway/recall-design.csv"
    acc = pd.read_csv(table).groupby(["states", "start"])["accuracy"]
    gains = {}
    for size in (16, 128):
        assert acc.min()[size, "near 1"] > acc.max()[size, "default"]
        gains[size] = acc.mean()[size, "near 1"] - acc.mean()[size, "default"]
    assert 0 < gains[16] < gains[128]  # the effect interacts with the state size
    assert acc.max().max() < 0.5  # no cell near the attention head's 1.00
