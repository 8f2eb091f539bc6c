"""The trained-heads chapter's experiments (experiments.trained_heads): exact k, truncations, classifiers.

Independent references: ranks of small well-conditioned lag matrices by numpy, the witness of
the genericity proof built by hand, float64 singular values where float64 resolves them, the
layer run on a constant input, Monte Carlo, the network rebuilt block by block, scipy's Wilson
interval, and the attention draws made by hand.
"""

import copy
import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from experiments.trained_heads import (COUNT_CHANGE, DigitSequences, _extended_kernel_singular_values, accuracy,
                                       as_float64, classifier, correct, count_change, exact_lag_span_dimension,
                                       flat_real_mode_layer, generic_lag_span_dimension, heads_within, input_moments,
                                       lag_span_report, load_digit_sequences, logistic_baseline, logits, mcnemar,
                                       mean_path, paired_report, precision_report, select_baseline, select_setting,
                                       train_classifier, truncation_error_samples, truncation_errors,
                                       truncation_sweep, truncations, validation_split, wilson_interval,
                                       with_copied_channel, without_skip)
from experiments.trained_heads import (covariance_rank, covariance_singular_values, exact_rank_network, hippo_n_modes,
                                       measured_head_counts, raw_moments, skip_share, with_hippo_n, with_skip)
from lib import (DiagonalSSM, SharedStateSSM, apply_operator, heads_needed, min_heads, optimal_head_errors, population_error,
                 relative_error, truncated_heads)


def lags_np(layer, n):
    return layer.lags(n).numpy(force=True)


def lag_rank_np(lags, rtol=1e-10):
    M = lags.reshape(len(lags), -1)
    return int(np.linalg.matrix_rank(M, tol=rtol * np.linalg.norm(M, 2)))


def outputs(model, X):
    with torch.no_grad():
        return model(torch.from_numpy(X).to(model.dtype)).double().numpy()


# -- prop-trained-lag-span -------------------------------------------------------------------------


@pytest.mark.parametrize("d, M, n", [(3, 2, 2), (3, 2, 3), (3, 1, 8), (4, 3, 6)])
def test_prop_trained_lag_span_diagonal_generic_value_on_random_parameters(d, M, n, random_diagonal):
    for seed in range(3):
        for complex_modes in (True, False):
            layer = random_diagonal(d, M, complex_modes=complex_modes, seed=seed)
            exact = exact_lag_span_dimension(layer, n, digits=40)
            assert exact.k == generic_lag_span_dimension(layer, n) == min(n, d) == lag_rank_np(lags_np(layer, n))


@pytest.mark.parametrize("d, M, n", [(2, 1, 5), (3, 2, 8), (3, 3, 7), (3, 3, 4), (4, 2, 3)])
def test_prop_trained_lag_span_shared_generic_value_on_random_parameters(d, M, n, random_shared):
    for seed in range(3):
        layer = random_shared(d, M, seed=seed)
        assert generic_lag_span_dimension(layer, n) == min(2 * M + 1, n)
        assert lag_rank_np(lags_np(layer, n)) == min(2 * M + 1, n)   # small, well-conditioned: numpy's rank
        if n >= 2 * M + 1:
            assert exact_lag_span_dimension(layer, n).k == min(2 * M + 1, n)


def test_prop_trained_lag_span_witness_of_the_proof_attains_n_plus_one():
    # The proof's witness for d = 3, N = 6 = d(d − 1): Δ = 1, λ_m = −1 + iθ_m, B̄_m = e_β, C[:, m] = e_a + i e_a',
    # D = e_1; slots (a, β), (a', β) distinct and off (1, 1). k = N + 1 = 7 for n >= 7, n below.
    d, slots = 3, [((1, 2), 0), ((0, 1), 1), ((0, 1), 2)]          # rows (a, a') in column β (0-based)
    M = len(slots)
    theta = np.array([0.5, 1.3, 2.1])
    lam = -1.0 + 1j * theta
    factor = np.expm1(lam) / lam
    B, C = np.zeros((M, d), complex), np.zeros((d, M), complex)
    for m, ((a, a2), beta) in enumerate(slots):
        B[m, beta] = 1 / factor[m]
        C[a, m], C[a2, m] = 1.0, 1j
    layer = SharedStateSSM(np.zeros(M), np.zeros(M), theta, np.stack([B.real, B.imag], -1),
                           np.stack([C.real, C.imag], -1), np.array([1.0, 0.0, 0.0]))
    for n in (3, 5, 7, 12):
        assert lag_rank_np(lags_np(layer, n)) == min(2 * M + 1, n) == generic_lag_span_dimension(layer, n)
    assert exact_lag_span_dimension(layer, 12).k == 7
    # The Vandermonde step acts on the residues: R_m = (e_a + i e_a') e_βᵀ, R̄_m and diag(D), independent over C
    # (not elementary matrices: each R_m has two non-zero entries), and L_ℓ = Σ_j ν_j^ℓ P_j.
    nodes, residues = (t.numpy() for t in layer.modes())
    P = residues.reshape(len(nodes), -1)
    assert len(nodes) == 2 * M + 1 and np.linalg.matrix_rank(P) == 2 * M + 1
    assert all(np.count_nonzero(np.abs(r) > 1e-12) == 2 for r in P[:2 * M])
    for m, ((a, a2), beta) in enumerate(slots):
        expected = np.zeros((d, d), complex)
        expected[a, beta], expected[a2, beta] = 1.0, 1j
        np.testing.assert_allclose(residues[m], expected, atol=1e-12)
    vander = nodes[None, :] ** np.arange(12)[:, None]
    np.testing.assert_allclose(np.einsum("lj,jpd->lpd", vander, residues).real, lags_np(layer, 12), atol=1e-12)


def test_prop_trained_lag_span_upper_bounds_and_non_generic_points(random_diagonal, random_shared):
    # Bounds hold everywhere; equality is generic, not universal.
    n = 12
    s5 = SharedStateSSM.random(3, 6, seed=0)                  # S4D-Lin start: λ_0 = −½ is real, μ_0 = μ̄_0
    assert exact_lag_span_dimension(s5, n).k == 6 < generic_lag_span_dimension(s5, n) == 7
    assert lag_rank_np(lags_np(s5, n)) <= 6                    # float64 may see even less (small steps)
    twin = random_diagonal(3, 2, seed=5)                      # two channels with the same kernel and skip
    with torch.no_grad():
        for name in ("log_dt", "A_log", "A_imag", "C", "D"):
            getattr(twin, name)[1] = getattr(twin, name)[0]
    assert exact_lag_span_dimension(twin, n, digits=40).k == 2 < generic_lag_span_dimension(twin, n) == 3
    no_skip = random_shared(3, 2, seed=7)
    with torch.no_grad():
        no_skip.D.zero_()
    assert exact_lag_span_dimension(no_skip, n).k == 4           # N without the node 0
    for layer in (random_shared(2, 3, seed=1), random_diagonal(2, 4, seed=2)):
        assert lag_rank_np(lags_np(layer, n)) <= min(n, layer.d ** 2, getattr(layer, "N", n) + 1)
    # N = 6 > d(d − 1) = 2: part 2's generic value is not claimed (here k = d² = 4 < N + 1 = 7).
    wide = random_shared(2, 3, seed=1)
    assert generic_lag_span_dimension(wide, n) is None and exact_lag_span_dimension(wide, n).k == 4


def test_exact_lag_span_dimension_sees_through_rounding():
    # Twenty channels of real modes: float64 loses 9 of the 20 dimensions; 50 digits resolve σ_20/σ_1 ~ 1e-29,
    # and 80 digits agree (the kept singular values are no rounding artefacts).
    layer = DiagonalSSM.random(20, 4, init="real", seed=0)
    assert min_heads(layer, 32) == 11
    exact = exact_lag_span_dimension(layer, 32)
    assert exact.k == 20 == exact_lag_span_dimension(layer, 32, digits=80).k
    assert exact.route == "extended precision" and exact.smallest_kept < 1e-25
    # A genuinely rank-deficient case: channel 1 copies channel 0 (k = 19), σ_20 at the rounding floor.
    with torch.no_grad():
        for name in ("log_dt", "A_log", "C", "D"):
            getattr(layer, name)[1] = getattr(layer, name)[0]
    twin = exact_lag_span_dimension(layer, 32)
    assert twin.k == 19 and twin.largest_dropped < 1e-45


def test_prop_trained_lag_span_controls_and_precision_report(random_diagonal, random_shared):
    # The notebook's check: where the parameter forces k below the generic value, the exact route finds the
    # bound (copied channel: d − 1; no skip: N); with more digits a kept σ_k stays, a forced zero falls.
    layer = DiagonalSSM.random(12, 8, init="real", seed=4)
    copied = with_copied_channel(layer, 2, 5)
    assert torch.equal(copied.A_log[5], layer.A_log[2]) and torch.equal(copied.A_log[4], layer.A_log[4])
    assert lag_span_report(layer, 24)["k"] == 12 and lag_span_report(copied, 24)["k"] == 11
    report = precision_report(copied, 24, 40, 70)
    assert report["k"] == report["k, more digits"] == 11
    assert abs(report["change of σ_k"]) < 1e-15 and report["σ_k/σ_1"] > 1e-25
    assert report["σ_k+1/σ_1"] < 1e-35 and report["σ_k+1/σ_1, more digits"] < 1e-65
    s5 = random_shared(3, 2, seed=2)
    assert lag_span_report(s5, 12)["k"] == 5 and lag_span_report(without_skip(s5), 12)["k"] == 4
    assert s5.D.abs().min() > 0                                  # the copy is changed, not the layer


def test_flat_real_mode_layer_spreads_its_energy_over_every_direction():
    # Finding 2's counterexample: real modes do not force a fast-falling spectrum. 8 channels × 8 real modes,
    # rates geometric over [0.05, 2]: the weighted lag diagonals (from lib's lags) are orthonormal, every
    # σ_q(G) is 1 and H_ε = 8 = k at ε = 10⁻¹, 10⁻², 10⁻³.
    n, d = 64, 8
    layer = flat_real_mode_layer(d, np.geomspace(0.05, 2.0, d), n)
    assert not layer.complex and not layer.D.any() and layer.M == d
    weighted = np.einsum("lqq->lq", lags_np(layer, n)) * np.sqrt(n - np.arange(n))[:, None]
    np.testing.assert_allclose(weighted.T @ weighted, np.eye(d), atol=1e-10)
    tails = optimal_head_errors(layer, n, d)
    np.testing.assert_allclose(tails, (d - np.arange(d + 1)) * tails[0] / d, atol=1e-10 * tails[0])
    assert [heads_needed(layer, n, e) for e in (0.1, 0.01, 0.001)] == [d] * 3
    assert exact_lag_span_dimension(layer, n).k == d
    # With the same rates and a random C the spectrum falls fast (the trained layers' regime).
    random = DiagonalSSM(np.zeros(d), layer.A_log.detach().numpy(), np.random.default_rng(0).standard_normal((d, d)),
                         np.zeros(d))
    assert heads_needed(random, n, 0.01) < d


def test_extended_precision_lags_are_the_float64_lags(random_diagonal):
    # The 50-digit lag diagonals are the layer's own: their singular values match numpy's on the float64 lags
    # wherever float64 resolves them (a well-conditioned case), for complex and real modes.
    for layer in (random_diagonal(4, 3, seed=11), random_diagonal(3, 2, complex_modes=False, seed=12)):
        diagonals = np.einsum("lqq->lq", lags_np(layer, 9))
        np.testing.assert_allclose(_extended_kernel_singular_values(layer, 9, 50),
                                   np.linalg.svd(diagonals, compute_uv=False), rtol=1e-11)


# -- truncations with the mean path (prop-covariance-head-count, cor-truncation-exact) ---------------


def moments_of(d, rank, seed):
    """(x̄, Σ = S Sᵀ) with a random factor S (d × rank), and S."""
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((d, rank))
    return (rng.standard_normal(d) * 2, S @ S.T), S


def test_input_moments_match_numpy():
    X = np.random.default_rng(0).standard_normal((5, 7, 3)) + np.array([1.0, -2.0, 0.5])
    mean, covariance = input_moments(X)
    tokens = X.reshape(-1, 3)
    np.testing.assert_allclose(mean, tokens.mean(0), rtol=1e-14)
    np.testing.assert_allclose(covariance, np.cov(tokens.T, bias=True), rtol=1e-12)


def test_mean_path_is_the_output_on_a_constant_input(random_shared):
    layer, mu = random_shared(3, 2, seed=3), np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(mean_path(layer, 9, mu), outputs(layer, np.tile(mu, (9, 1))), atol=1e-13)


@pytest.mark.parametrize("law", ["gaussian", "uniform"])
def test_prop_covariance_head_count_centred_truncation_keeps_the_closed_form(law, random_diagonal):
    # Part 3: with the mean path, the error of the centred H-head model is Σ_{q>H} σ_q(G_Σ)² whatever the mean
    # (Monte Carlo, 4 standard errors), and the CentredHeads forward is heads(x − x̄) + ȳ.
    layer, n = random_diagonal(3, 2, seed=8), 10
    moments, S = moments_of(3, 3, 2)
    rng = np.random.default_rng(1)
    z = rng.standard_normal((30_000, n, 3)) if law == "gaussian" else rng.uniform(-3 ** 0.5, 3 ** 0.5, (30_000, n, 3))
    X = moments[0] + z @ S.T
    closed = optimal_head_errors(layer, n, 3, covariance=moments[1])
    samples = truncation_error_samples(layer, n, [1, 2], moments, X)   # k = 3: H < k keeps a random error
    for H, e in zip([1, 2], samples):
        assert abs(e.mean() - closed[H]) < 4 * e.std(ddof=1) / np.sqrt(len(e))
    for model in truncations(layer, n, [1, 2], moments).values():
        by_hand = outputs(model.heads, X[:50] - moments[0]) + mean_path(layer, n, moments[0])
        assert relative_error(outputs(model, X[:50]), by_hand) < 1e-12


def test_prop_covariance_head_count_part4_mean_term_of_the_truncation_without_bias(random_diagonal, random_shared):
    # Part 4: the part-2 truncation with H >= rank G_Σ, used on raw tokens, errs by Σ_i ‖Σ_{ℓ<i} L_ℓ x̄_⊥‖²; zero when
    # x̄ ∈ range Σ or when the lags annihilate x̄_⊥; and heads spanning the lags (E = 0) err by 0 whatever x̄.
    layer, n = random_shared(3, 2, seed=6), 9
    (mu, Sigma), S = moments_of(3, 2, 7)                        # singular Σ: a null direction
    P = S @ np.linalg.pinv(S)
    full = truncated_heads(layer, n, 6, covariance=Sigma)
    lags = lags_np(layer, n)
    by_hand = float((np.cumsum(lags @ (mu - P @ mu), axis=0) ** 2).sum())
    scale = optimal_head_errors(layer, n, 0, covariance=Sigma)[0]
    assert by_hand > 1e-3 * scale
    assert population_error(layer, full, n, covariance=Sigma, mean=mu) == pytest.approx(by_hand, rel=1e-9)
    assert population_error(layer, full, n, covariance=Sigma, mean=P @ mu) < 1e-12 * scale
    spanning = truncated_heads(layer, n, exact_lag_span_dimension(layer, n).k)
    assert population_error(layer, spanning, n, covariance=Sigma, mean=mu) < 1e-12 * scale
    # x̄_⊥ = e_0 ≠ 0 but every lag annihilates it: channel 0 of an S4D layer silenced, Σ null on e_0.
    quiet = random_diagonal(3, 2, seed=3)
    with torch.no_grad():
        quiet.C[0] = 0.0
        quiet.D[0] = 0.0
    S0 = np.vstack([np.zeros((1, 2)), np.random.default_rng(8).standard_normal((2, 2))])
    Sigma0, mu0 = S0 @ S0.T, np.array([1.5, 0.3, -0.7])
    full0 = truncated_heads(quiet, n, 6, covariance=Sigma0)
    scale0 = optimal_head_errors(quiet, n, 0, covariance=Sigma0)[0]
    assert population_error(quiet, full0, n, covariance=Sigma0, mean=mu0) < 1e-12 * scale0
    with torch.no_grad():
        quiet.D[0] = 0.5                                       # now L_0 e_0 ≠ 0: the term is back
    full0 = truncated_heads(quiet, n, 6, covariance=Sigma0)
    term = float((np.cumsum(lags_np(quiet, n) @ np.array([1.5, 0.0, 0.0]), axis=0) ** 2).sum())
    assert term > 0.1 and population_error(quiet, full0, n, covariance=Sigma0, mean=mu0) == pytest.approx(term, rel=1e-9)


def test_cor_truncation_exact_on_range_of_sigma_and_not_beyond(random_shared):
    # H >= rank G_Σ: the centred truncation equals the layer when x_j − x̄ ∈ range Σ; off that range it need not.
    layer, n = random_shared(3, 2, seed=4), 10
    moments, S = moments_of(3, 2, 5)                          # singular Σ
    k = exact_lag_span_dimension(layer, n).k
    model = truncations(layer, n, [k], moments)[k]
    X = moments[0] + np.random.default_rng(0).standard_normal((4, n, 2)) @ S.T
    assert relative_error(outputs(model, X), outputs(layer, X)) < 1e-10
    null = np.linalg.svd(moments[1])[2][-1]
    off = X + null
    assert relative_error(outputs(model, off), outputs(layer, off)) > 1e-3
    smaller = truncations(layer, n, [1], moments)[1]
    assert relative_error(outputs(smaller, X), outputs(layer, X)) > 1e-3


def test_cor_truncation_exact_classifier_logits_at_k():
    # Every block replaced by its k-head truncation with the mean path (moments of the model's layer inputs):
    # the logits do not change; with fewer heads they do. Random classifiers, random inputs.
    X = np.random.default_rng(0).random((40, 10, 1))
    y = np.random.default_rng(1).integers(0, 10, 40)
    for kind in ("s5", "s4d-lin", "s4d-real"):
        model = as_float64(classifier(kind, 4, state=4, n=10, seed=3))
        moments = [input_moments(x) for x in model.layer_inputs(X)]
        k = max(exact_lag_span_dimension(layer, 10, digits=30).k for layer in model.layers)
        records = truncation_sweep(model, X, y, moments, [1, k], [0, 1])
        assert records[1]["logit change"] < 1e-10
        assert records[0]["logit change"] > 1e-4
        assert records[1]["accuracy"] == accuracy(model, X, y)
        # The blocks asked for, and only those, are replaced: the sweep against the network rebuilt by hand.
        reference = logits(model, X)
        for blocks in ([0], [1], [0, 1]):
            swept = truncation_sweep(model, X, y, moments, [1], blocks)[0]
            h = torch.from_numpy(X)
            with torch.no_grad():
                h = model.encoder(h)
                for m in range(2):
                    layer = truncations(model.layers[m], 10, [1], moments[m])[1] if m in blocks else model.layers[m]
                    h = h + model.mixers[m](torch.nn.functional.gelu(layer(model.norms[m](h))))
                manual = model.decoder(h.mean(1)).numpy()
            change = np.abs(manual - reference).max() / np.abs(reference).max()
            assert change > 1e-6 and swept["logit change"] == pytest.approx(change, rel=1e-9)


def test_cor_truncation_exact_rank_r_network_at_r_and_not_below_and_the_mean_path_control():
    # The notebook's check: every layer replaced by its r-head truncation has lags of exact rank r; truncating
    # it to r heads leaves the logits (rounding), r − 1 heads change them, a mean path ×1.001 fails the check.
    X = np.random.default_rng(0).random((40, 10, 1))
    y = np.random.default_rng(1).integers(0, 10, 40)
    r = 3
    for kind in ("s5", "s4d-lin", "s4d-real"):
        model = as_float64(classifier(kind, 4, state=4, n=10, seed=3))
        net = exact_rank_network(model, 10, r, [input_moments(x) for x in model.layer_inputs(X)])
        assert net.layers[0] is not model.layers[0] and model.layers[0].D is not None   # the model is kept
        inner = [input_moments(x) for x in net.layer_inputs(X)]
        for layer, (_, S) in zip(net.layers, inner):
            assert layer.H == r and lag_rank_np(lags_np(layer, 10)) == r
            s = covariance_singular_values(layer, 10, S)
            assert s[r - 1] > 1e-6 * s[0] and s[r] < 1e-12 * s[0]
        fewer, exact = truncation_sweep(net, X, y, inner, [r - 1, r], [0, 1])
        assert exact["logit change"] < 1e-12 and fewer["logit change"] > 1e-6
        control = truncation_sweep(net, X, y, inner, [r], [0, 1], path_scale=1.001)[0]
        assert control["logit change"] > 1e-9
        # the control scales the mean path of the truncation only: by hand, ȳ ×1.001 in block 1 alone
        cut = truncations(net.layers[0], 10, [r], inner[0])[r]
        cut.mean_path.mul_(1.001)
        with torch.no_grad():
            h = net.encode(torch.from_numpy(X))
            manual = net.decoder(net.block(1, net.block(0, h, cut)).mean(1)).numpy()
        reference = logits(net, X)
        assert np.abs(manual - reference).max() / np.abs(reference).max() > 1e-9


def test_covariance_singular_values_are_the_closed_form_of_lib(random_shared, random_diagonal):
    # Σ_{q>H} σ_q² from numpy's eigh + svd against lib's optimal_head_errors (Σ^{1/2}, QR, its own SVD).
    for layer in (random_shared(3, 2, seed=5), random_diagonal(3, 2, seed=6)):
        (_, Sigma), _ = moments_of(3, 2, 7)                     # singular Σ
        s = covariance_singular_values(layer, 9, Sigma)
        tails = optimal_head_errors(layer, 9, 4, covariance=Sigma)
        mine = np.array([(s[H:] ** 2).sum() for H in range(5)])
        np.testing.assert_allclose(mine, tails, rtol=1e-9, atol=1e-12 * tails[0])


def test_lag_span_report_names_the_matrix_of_its_singular_values(random_diagonal, random_shared):
    assert lag_span_report(random_diagonal(3, 2, seed=1), 8)["matrix"] == "lag diagonals, n × d"
    assert lag_span_report(random_shared(3, 2, seed=1), 8)["matrix"] == "residues, nodes × d²"


def test_truncation_errors_predicted_column_is_the_closed_form_and_iid_inputs_match_it(random_shared):
    layer, n = random_shared(3, 2, seed=9), 12
    moments, S = moments_of(3, 3, 4)
    X = moments[0] + np.random.default_rng(2).standard_normal((8_000, n, 3)) @ S.T
    records = truncation_errors(layer, n, [1, 2], moments, X)
    tails = optimal_head_errors(layer, n, 2, covariance=moments[1])
    for record in records:
        assert record["predicted"] == pytest.approx(tails[record["H"]] / tails[0], rel=1e-12)
        assert record["measured"] == pytest.approx(record["predicted"], rel=0.03)
        assert record["measured, no mean path"] == pytest.approx(record["predicted, no mean path"], rel=0.03)
        assert record["predicted, no mean path"] > record["predicted"]


# -- classifiers and data ----------------------------------------------------------------------------


def test_load_digit_sequences_is_a_fixed_stratified_split():
    data = load_digit_sequences()
    assert data.X_train.shape == (1347, 64, 1) and data.X_test.shape == (450, 64, 1)
    assert data.X_train.min() == 0.0 and data.X_train.max() == 1.0
    assert np.abs(np.bincount(data.y_test) * 3 - np.bincount(data.y_train)).max() <= 3
    again = load_digit_sequences()
    assert np.array_equal(again.X_test, data.X_test) and np.array_equal(again.y_train, data.y_train)
    assert accuracy(logistic_baseline(data), data.X_test, data.y_test) > 0.9


def test_wilson_interval_matches_scipy():
    for k, n in ((0, 10), (3, 10), (437, 450), (450, 450)):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n, z=1.959963984540054) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_heads_within():
    assert heads_within([1, 2, 3, 4], [0.1, 0.95, 0.5, 0.96], 0.96, 0.02) == 4
    assert heads_within([1, 2, 3, 4], [0.1, 0.95, 0.955, 0.96], 0.96, 0.02) == 2
    assert heads_within([1, 2, 3, 4], [0.1, 0.95, 0.955, 0.96], 0.96, 0.005) == 3   # the answer moves with τ
    assert heads_within([1, 2], [0.97, 0.96], 0.96, 0.01) == 1
    assert heads_within([1, 2, 3], [0.5, 0.99, 0.96], 0.96, 0.01) == 2   # one-sided: above the reference is within
    assert heads_within([1, 2, 20], [0.5, 0.99, 0.96], 0.96, 0.01) == 2  # the grid only: 3..19 are not looked at
    with pytest.raises(ValueError, match="never stay"):
        heads_within([1, 2], [0.5, 0.6], 0.9, 0.01)


def test_count_change_is_the_mean_over_blocks_and_epsilons():
    before, after = np.array([[1, 3, 10], [1, 6, 13]]), np.array([[8, 15, 20], [7, 12, 17]])
    assert count_change(before, after) == pytest.approx((7 + 12 + 10 + 6 + 6 + 4) / 6)
    assert count_change(after, after) == 0.0 and COUNT_CHANGE == 1.0


def test_mcnemar_matches_scipy_exact_binomial_test():
    rng = np.random.default_rng(0)
    for only, only_baseline in ((12, 12), (4, 100), (8, 4), (0, 5), (3, 0), (30, 45)):
        right = np.r_[np.ones(only, bool), np.zeros(only_baseline, bool), np.ones(200, bool), np.zeros(50, bool)]
        base = np.r_[np.zeros(only, bool), np.ones(only_baseline, bool), np.ones(200, bool), np.zeros(50, bool)]
        order = rng.permutation(len(right))
        found = mcnemar(right[order], base[order])
        assert found[:2] == (only, only_baseline)
        assert found[2] == pytest.approx(binomtest(only, only + only_baseline, 0.5).pvalue, rel=1e-12)
    assert mcnemar([True, False], [True, False]) == (0, 0, 1.0)


def test_validation_split_is_stratified_disjoint_and_leaves_the_test_images_alone():
    data = load_digit_sequences()
    split = validation_split(data, 0.2, 0)
    assert len(split.y_train) + len(split.y_test) == len(data.y_train) and len(split.y_test) == 270
    pieces = sorted(x.tobytes() for x in np.concatenate([split.X_train, split.X_test]))
    assert pieces == sorted(x.tobytes() for x in data.X_train)        # a partition of the training images
    assert np.abs(np.bincount(split.y_test) * 4 - np.bincount(split.y_train)).max() <= 4
    assert np.array_equal(validation_split(data, 0.2, 0).y_test, split.y_test)


def test_select_baseline_keeps_the_best_validation_score_and_the_first_of_ties():
    data = load_digit_sequences()
    split = DigitSequences(data.X_train[:300], data.y_train[:300], data.X_train[300:500], data.y_train[300:500])
    model, rows = select_baseline(split, [1e-4, 1.0, 1.0 + 1e-9])   # the last two: the same model, a tie
    scores = [r["validation accuracy"] for r in rows]
    assert scores[1] == scores[2] > scores[0] and model.C == 1.0
    assert accuracy(model, split.X_test, split.y_test) == pytest.approx(scores[1])
    assert select_baseline(split, [1e-4])[0].C == 1e-4


def test_select_setting_snapshots_are_shorter_runs_and_the_best_is_kept():
    # A run of e epochs at a constant rate is the start of the longest one: the snapshot after 1 epoch of a
    # 2-epoch run equals a fresh 1-epoch run (same batches), so the grid lrs × epochs costs len(lrs) runs.
    data = load_digit_sequences()
    small = DigitSequences(data.X_train[:120, :12], data.y_train[:120], data.X_train[120:180, :12],
                           data.y_train[120:180])
    kept, rows = select_setting("s4d-lin", small, [1e-2, 3e-2], [1, 2], width=4, state=4, n=12, batch=40, seed=3)
    assert [(r["lr"], r["epochs"]) for r in rows] == [(1e-2, 1), (1e-2, 2), (3e-2, 1), (3e-2, 2)]
    best = max(rows, key=lambda r: r["validation accuracy"])
    assert accuracy(kept, small.X_test, small.y_test) == best["validation accuracy"]
    for r in rows[::2]:                                           # the 1-epoch snapshots
        fresh = classifier("s4d-lin", 4, state=4, n=12, seed=3)
        train_classifier(fresh, small, epochs=r["epochs"], batch=40, lr=r["lr"], seed=3)
        assert accuracy(fresh, small.X_test, small.y_test) == r["validation accuracy"]
    fresh = classifier("s4d-lin", 4, state=4, n=12, seed=3)
    train_classifier(fresh, small, epochs=best["epochs"], batch=40, lr=best["lr"], seed=3)
    np.testing.assert_array_equal(logits(fresh, small.X_test), logits(kept, small.X_test))


def test_paired_report_counts_by_hand():
    data = load_digit_sequences()
    X, y = data.X_test[:80], data.y_test[:80]
    baseline = logistic_baseline(DigitSequences(data.X_train[:300], data.y_train[:300], X, y))
    model = classifier("s5", 4, state=4, seed=0)
    row = paired_report({"S5": model}, baseline, X, y)[0]
    mine, theirs = logits(model, X).argmax(1) == y, baseline.predict(X[..., 0]) == y
    assert row["test accuracy"] == mine.mean() and correct(baseline, X, y).tolist() == theirs.tolist()
    assert (row["only this"], row["only baseline"]) == ((mine & ~theirs).sum(), (~mine & theirs).sum())
    assert row["McNemar p"] == mcnemar(mine, theirs)[2] and row["parameters"] == sum(
        p.numel() for p in model.parameters())


def test_train_classifier_is_deterministic_and_learns():
    data = load_digit_sequences()
    small = DigitSequences(data.X_train[:200, :16], data.y_train[:200], data.X_test[:50, :16], data.y_test[:50])
    runs = []
    for _ in range(2):
        model = classifier("s4d-lin", 4, state=4, seed=1)
        runs.append(train_classifier(model, small, epochs=3, batch=50, lr=1e-2, seed=2))
    assert runs[0].shape == (12,)
    np.testing.assert_array_equal(runs[0], runs[1])
    assert runs[0][-4:].mean() < runs[0][:4].mean()


def test_classifier_kinds_and_float64_copy():
    X = np.random.default_rng(0).random((3, 10, 1))
    for kind in ("s4d-lin", "s4d-real", "s5", "attention"):
        model = classifier(kind, 4, state=4, heads=2, n=10, seed=0)
        double = as_float64(model)
        assert double.encoder.weight.dtype == torch.float64
        assert all(layer.dtype == torch.float64 for layer in double.layers)
        np.testing.assert_allclose(logits(double, X), logits(model, X), rtol=1e-4, atol=1e-5)
    assert classifier("attention", 4, heads=2, n=10).positions.shape == (10, 4)
    assert classifier("s5", 4, state=4).positions is None


def test_attention_classifier_draws_its_projections_by_hand():
    # Layer m: W_Q, W_K, W_V (H, d/H, d) and W_O (H, d, d/H) with iid N(0, 1/d) entries from default_rng(seed + m),
    # in that order, and zero relative-position scores.
    d, H, n, seed = 8, 2, 10, 4
    model = classifier("attention", d, heads=H, n=n, seed=seed, dtype=torch.float64)
    for m, layer in enumerate(model.layers):
        rng = np.random.default_rng(seed + m)
        for name, shape in (("W_Q", (H, d // H, d)), ("W_K", (H, d // H, d)), ("W_V", (H, d // H, d)),
                            ("W_O", (H, d, d // H))):
            np.testing.assert_array_equal(getattr(layer, name).numpy(force=True),
                                          rng.standard_normal(shape) / math.sqrt(d))
        assert layer.causal and not layer.position_bias.detach().any() and layer.max_length == n


def test_seeds_notebook_trains_at_the_settings_digits_kept():
    # seeds.ipynb retrains every SSM at the (lr, epochs) that digits.ipynb kept on the validation images; its
    # parameters name them, so they must be the best rows (first of ties: smaller rate, then fewer epochs) of the
    # committed selection table.
    from pathlib import Path

    import pandas as pd
    import yaml

    root = Path(__file__).resolve().parents[2]
    params = yaml.safe_load((root / "data/params.yaml").read_text())
    settings = params["chapters/trained-heads/seeds.ipynb"]["published"]["settings"]
    digits = params["chapters/trained-heads/digits.ipynb"]["published"]
    selection = pd.read_csv(root / "data/results/trained-heads/selection.csv")
    names = {"s4d-lin": "S4D-Lin", "s4d-real": "S4D-Real", "s5": "S5"}
    assert sorted(settings) == sorted(digits["kinds"])
    for kind, (lr, epochs) in settings.items():
        part = selection[selection["model"] == names[kind]].sort_values(["lr", "epochs"], kind="stable")
        assert sorted(set(part["lr"])) == sorted(digits["lrs"]) and sorted(set(part["epochs"])) == digits["epoch_grid"]
        best = part.loc[part["validation accuracy"].idxmax()]
        assert (best["lr"], best["epochs"]) == pytest.approx((lr, epochs), rel=1e-12)


# -- referee C: the skip's share, D = 0 for S4D, HiPPO-N, Σ's rank per block ---------------------


def test_skip_share_by_a_loop_and_its_limits():
    # Independent route: Σ_ℓ (n − ℓ) tr(L_ℓ Σ L_ℓᵀ) by a loop over lags; share 0 without skip, 1 without kernel.
    n, rng = 9, np.random.default_rng(0)
    for layer in (DiagonalSSM.random(4, 2, init="lin", seed=1), SharedStateSSM.random(3, 4, seed=2)):
        layer = layer.double()
        A = rng.standard_normal((layer.d, layer.d))
        for S in (None, A @ A.T):
            M = np.eye(layer.d) if S is None else S
            L, D = lags_np(layer, n), layer.D.detach().numpy()
            L[0] -= np.diag(D)                                       # the kernel alone
            rest = sum((n - l) * np.trace(L[l] @ M @ L[l].T) for l in range(n))
            skip = sum(n * D[i] ** 2 * M[i, i] for i in range(layer.d))
            assert abs(skip_share(layer, n, S) - skip / (skip + rest)) < 1e-12
            assert skip_share(without_skip(layer), n, S) == 0.0
        kernel_free = without_skip(layer)
        with torch.no_grad():
            kernel_free.C.zero_()
            kernel_free.D.copy_(layer.D)
        assert abs(skip_share(kernel_free, n) - 1) < 1e-12


def test_without_skip_keeps_the_kernel_of_an_s4d_layer():
    layer = DiagonalSSM.random(5, 2, init="real", seed=3).double()
    bare = without_skip(layer)
    L, B = lags_np(layer, 6), lags_np(bare, 6)
    assert np.array_equal(L[1:], B[1:]) and np.allclose(L[0] - B[0], np.diag(layer.D.detach().numpy()))
    assert bare.D.abs().max() == 0 and layer.D.abs().min() > 0


def test_prop_trained_lag_span_hippo_n_initialisation_is_generic():
    # S5's own initialisation: HiPPO-N eigenvalues, real parts −½, none real, so k = N + 1 (the page's check).
    A_log, A_imag = hippo_n_modes(32)
    assert np.allclose(np.exp(A_log), 0.5) and A_imag.min() > 0.3 and len(A_imag) == 16
    i = np.arange(4)  # independent route for N = 4: the normal part built entry by entry
    S = np.array([[(-(a + 1) if a == b else -np.sqrt((2 * a + 1) * (2 * b + 1)) * (a > b))
                   + np.sqrt((a + .5) * (b + .5)) for b in i] for a in i])
    ref = np.linalg.eigvals(S)
    ref = np.sort(ref[ref.imag > 0].imag) * 1j - 0.5  # the real parts: −½
    assert np.allclose(-np.exp(hippo_n_modes(4)[0]) + 1j * hippo_n_modes(4)[1], ref, atol=1e-12)
    for d, N in ((32, 32), (4, 8)):
        layer = SharedStateSSM.random(d, N, seed=0)
        assert exact_lag_span_dimension(layer, 64).k == N                 # S4D-Lin: a real mode
        assert exact_lag_span_dimension(with_hippo_n(layer), 64).k == N + 1


def test_covariance_rank_of_the_block_inputs_is_two_then_d_minus_one():
    # Block 1 sees LayerNorm(w·pixel + b): a plane, rank 2; block 2 a LayerNorm hyperplane, rank d − 1.
    data = load_digit_sequences(0.25, 0)
    model = as_float64(classifier("s4d-lin", 8, state=8, seed=0))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for norm in model.norms:
            norm.weight.add_(0.3 * torch.randn(8, generator=g, dtype=norm.weight.dtype))
            norm.bias.add_(0.3 * torch.randn(8, generator=g, dtype=norm.bias.dtype))
    first, second = (input_moments(x) for x in model.layer_inputs(data.X_train[:200]))
    assert covariance_rank(first[1])[0] == 2 and covariance_rank(second[1])[0] == 7
    assert covariance_rank(np.diag([1.0, 1e-3, 1e-14]))[0] == 2 and covariance_rank(np.eye(3)) == (3, 0.0)
    # every pixel value, seen or not, gives a token in x̄ + range Σ: the corollary's hypothesis
    unseen = model.layer_inputs(np.linspace(-3, 20, 64)[None, :, None])[0][0] - first[0]
    w, V = np.linalg.eigh(first[1])
    basis = V[:, w > 1e-10 * w.max()]
    assert np.abs(unseen - unseen @ basis @ basis.T).max() < 1e-10


# -- the bias-free truncation, measured counts and the skip swap (referee F2) ---------------------------


def test_raw_moments_truncation_is_bias_free_and_errs_by_part_1(random_shared):
    # (0, Σ + x̄x̄ᵀ): the truncation has no centring and no bias (a factorized H-head model, relative-position
    # coefficients), and its error on raw tokens with mean x̄ is part 1 of the proposition with its mean term
    # (Monte Carlo, 4 standard errors). It is not the centred model's error: the bias is worth something here.
    layer, n = random_shared(3, 2, seed=4), 8
    moments, S = moments_of(3, 3, 5)
    zero, second = raw_moments(moments)
    np.testing.assert_array_equal(zero, 0.0)
    np.testing.assert_allclose(second, moments[1] + np.outer(moments[0], moments[0]), rtol=1e-15)
    X = moments[0] + np.random.default_rng(3).standard_normal((20_000, n, 3)) @ S.T
    centred = optimal_head_errors(layer, n, 2, covariance=moments[1])
    for H, model in truncations(layer, n, [1, 2], (zero, second)).items():
        assert model.mean.abs().max() == 0 and model.mean_path.abs().max() == 0
        exact = population_error(layer, model.heads, n, covariance=moments[1], mean=moments[0])
        e = truncation_error_samples(layer, n, [H], (zero, second), X)[0]
        assert abs(e.mean() - exact) < 4 * e.std(ddof=1) / np.sqrt(len(e))
        assert exact > 1.5 * centred[H]


def test_truncations_cut_from_one_truncation_are_the_truncations_to_H(random_shared):
    layer, n = random_shared(3, 3, seed=2), 9
    moments, _ = moments_of(3, 3, 6)
    for H, model in truncations(layer, n, [0, 1, 3, 5, 40], moments).items():
        alone = truncated_heads(layer, n, H, covariance=moments[1])
        assert model.heads.H == alone.H
        assert relative_error(model.heads.lags(n), alone.lags(n)) < 1e-12 or alone.H == 0


def test_measured_head_counts_are_the_least_H_of_the_measured_errors(random_shared):
    # Independent route: the "measured" column of truncation_errors over every H, its least H below each ε.
    layer, n = random_shared(3, 3, seed=5), 10
    moments, S = moments_of(3, 3, 8)
    X = moments[0] + np.random.default_rng(4).standard_normal((300, n, 3)) @ S.T
    epsilons = [0.1, 0.01, 1e-3]
    errors = [1.0] + [r["measured"] for r in truncation_errors(layer, n, list(range(1, 8)), moments, X)]
    by_hand = {f"H ε={e:g}": next(H for H, v in enumerate(errors) if v <= e) for e in epsilons}
    assert measured_head_counts(layer, n, epsilons, moments, X) == by_hand
    assert len(set(by_hand.values())) == 3                      # the three ε tell the counts apart


def test_with_skip_swaps_only_the_skip(random_diagonal, random_shared):
    for layer, other in ((random_diagonal(4, 2, seed=1), random_diagonal(4, 2, seed=2)),
                         (random_shared(3, 2, seed=1), random_shared(3, 2, seed=2))):
        twin = with_skip(layer, other.D)
        L, T = lags_np(layer, 6), lags_np(twin, 6)
        assert np.array_equal(L[1:], T[1:])
        np.testing.assert_allclose(T[0] - L[0], np.diag((other.D - layer.D).detach().numpy()), atol=1e-14)
        assert not np.array_equal(layer.D.detach().numpy(), twin.D.detach().numpy())


def test_resolvable_tolerances_match_the_binomial_test():
    from scipy.stats import binomtest

    from experiments.trained_heads import resolvable_tolerances

    m, resolved = resolvable_tolerances([0.05, 0.02, 0.01, 0.005], 450)
    assert binomtest(m, m, 0.5).pvalue < 0.05 <= binomtest(m - 1, m - 1, 0.5).pvalue
    assert m == 6 and resolved == [0.05, 0.02]  # 4.5 and 2.25 items are below 6
    assert resolvable_tolerances([0.01], 600)[1] == [0.01]
    assert resolvable_tolerances([0.05], 450, alpha=0.001)[0] == 11
    assert binomtest(11, 11, 0.5).pvalue < 0.001 <= binomtest(10, 10, 0.5).pvalue


# -- the Mamba classifier (mamba.ipynb) ------------------------------------------------------------


def dense_blocks(layer, X, min_lag=0, max_lag=None):
    # The rows vec 𝒲_ij(X), min_lag <= i − j (< max_lag), over the sequences of X, from the dense operator.
    W = layer.operator(torch.as_tensor(X, dtype=layer.dtype)).detach().double().numpy()  # (b, n, n, d, d)
    i, j = np.tril_indices(W.shape[1], -min_lag)
    keep = (i - j < max_lag) if max_lag is not None else np.ones(len(i), bool)
    return W[:, i[keep], j[keep]].reshape(-1, W.shape[-2] * W.shape[-1])


def dense_spectrum(layer, X, min_lag=0, max_lag=None):
    # Singular values of the matrix with rows vec 𝒲_ij(X), min_lag <= i − j (< max_lag), by numpy.
    return np.linalg.svd(dense_blocks(layer, X, min_lag, max_lag), compute_uv=False)


def test_mamba_classifier_layers_are_mamba_blocks_at_their_initialisation():
    from lib import MambaBlock

    model = classifier("mamba", 4, state=3, seed=5)
    for m, layer in enumerate(model.layers):
        reference = MambaBlock(4, d_state=3, seed=5 + m, dtype=torch.float32)
        assert isinstance(layer, MambaBlock) and (layer.d_inner, layer.d_state, layer.d_conv) == (8, 3, 4)
        for (name, value), (other, expected) in zip(layer.state_dict().items(), reference.state_dict().items()):
            assert name == other
            torch.testing.assert_close(value, expected, rtol=0, atol=0)
    X = np.random.default_rng(0).random((3, 10, 1))
    np.testing.assert_allclose(logits(as_float64(model), X), logits(model, X), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("singular_K", [False, True])  # True: Ω singular (fixed in channel_span)
def test_block_head_counts_against_the_dense_operator_by_numpy(singular_K):
    from experiments.blocks import spans_by_lag
    from experiments.trained_heads import block_head_counts

    model = as_float64(classifier("mamba", 4, state=2, seed=1))
    with torch.no_grad():  # longer memory: at the initialisation the pairs beyond the window carry ~1e-7 of the energy
        for layer in model.layers:
            layer.dt_proj.bias.fill_(0.5), layer.x_proj.weight.mul_(5), layer.A_log.fill_(math.log(0.1))
    if singular_K:  # two equal columns of U = out_proj.weight: u_1 v_1ᵀ ∝ u_2 v_2ᵀ needs v equal too
        with torch.no_grad():
            for layer in model.layers:
                layer.out_proj.weight[:, 1] = layer.out_proj.weight[:, 0]
                layer.in_proj.weight[1] = layer.in_proj.weight[0]
    X = np.random.default_rng(2).random((2, 9, 1))
    spectra = [{"H": dense_spectrum(layer, inputs),  # all pairs; inside the conv's window; beyond it
                "within window H": dense_spectrum(layer, inputs, max_lag=layer.d_conv),
                "beyond window H": dense_spectrum(layer, inputs, min_lag=layer.d_conv)}
               for layer, inputs in zip(model.layers, model.layer_inputs(X))]
    tails = [{k: np.cumsum((v ** 2)[::-1])[::-1] for k, v in s.items()} for s in spectra]  # t[H] = Σ_{q>H} σ_q²
    # ε just above every tail ratio t[H]/t[0] (>= 1e-6): H_ε must be exactly H, so any other spectrum fails
    epsilons = sorted({float(r) * (1 + 1e-6) for t in tails for v in t.values() for r in v[1:] / v[0] if r > 1e-6})
    rows = block_head_counts(model, X, epsilons)
    for row, layer, inputs, spectrum, tail in zip(rows, model.layers, model.layer_inputs(X), spectra, tails):
        sigma, near, far = spectrum.values()
        dense_dim = int((sigma > 1e-10 * sigma[0]).sum())
        g = layer.coefficients(torch.from_numpy(inputs)).detach().numpy()
        i, j = np.tril_indices(9)
        gamma = g[:, i, j].reshape(-1, g.shape[-1])
        assert row["heads at X"] == dense_dim <= row["channels D"] == 8
        assert row["rank Γ"] == np.linalg.matrix_rank(gamma, tol=1e-10 * np.linalg.norm(gamma, 2))
        assert row["rows of Γ"] == 2 * 9 * 10 // 2 == len(gamma)
        assert len(far) == min(2 * 5 * 6 // 2, 16) and not np.allclose(far, sigma[:len(far)])
        assert not np.allclose(near, sigma[:len(near)])
        energy = [(dense_blocks(layer, inputs, *lags) ** 2).sum() for lags in ((layer.d_conv,), ())]
        assert row["beyond window energy"] == pytest.approx(energy[0] / energy[1], rel=1e-10)
        assert energy[0] > 1e-3 * energy[1]
        scan_only = copy.deepcopy(layer)  # the scan's part: the dense operator with D_skip = 0
        with torch.no_grad():
            scan_only.D.zero_()
        scan = [(dense_blocks(scan_only, inputs, *lags) ** 2).sum() for lags in ((layer.d_conv,), ())]
        assert row["scan share"] == pytest.approx(scan[1] / energy[1], rel=1e-10)
        assert row["scan beyond window share"] == pytest.approx(scan[0] / scan[1], rel=1e-10)
        assert scan[0] == pytest.approx(energy[0], rel=1e-12)  # beyond the window the skip does not act
        assert 1e-3 < row["scan share"] < 0.9  # the skip's part matters here, so D_skip = 0 is seen
        # the scan's part of the linear output: the dense operators applied (lib.apply_operator)
        X_m = torch.from_numpy(inputs)
        parts = [np.linalg.norm(apply_operator(block.operator(X_m).detach(), inputs)) for block in (scan_only, layer)]
        assert row["scan output ratio"] == pytest.approx(parts[0] / parts[1], rel=1e-10)
        assert abs(row["scan output ratio"] - math.sqrt(row["scan share"])) > 1e-3  # not the energy's root
        # and the skip's part subtracted by its closed form (experiments.blocks), one sequence
        _, skip = spans_by_lag(layer, torch.from_numpy(inputs[0]))
        one = block_head_counts(model, X[:1], epsilons)[row["block"] - 1]
        assert one["scan share"] == pytest.approx(skip["scan share"], rel=1e-10)
        for prefix, t in tail.items():
            for e in epsilons:
                H = row[f"{prefix} ε={e:g}"]
                assert (t[H] if H < len(t) else 0.0) <= e * t[0] < t[H - 1], (prefix, e)
        if singular_K:  # K singular: the count falls below rank Γ (part 2 of prop-channel-span)
            assert row["λmin(Ω)/λmax(Ω)"] < 1e-12 and row["heads at X"] < row["rank Γ"]
        else:
            assert row["λmin(Ω)/λmax(Ω)"] > 1e-8 and row["heads at X"] == row["rank Γ"]


def test_block_head_counts_beyond_the_window_need_a_pair_there():
    from experiments.trained_heads import block_head_counts

    model = as_float64(classifier("mamba", 4, state=2, seed=1))
    short = block_head_counts(model, np.random.default_rng(2).random((1, 4, 1)), [0.1])  # n = d_conv: no pair
    assert all(row["beyond window H ε=0.1"] is None and row["H ε=0.1"] >= 1 for row in short)
    assert all(row["beyond window energy"] == 0.0 and row["within window H ε=0.1"] == row["H ε=0.1"] for row in short)
    assert all(row["scan beyond window share"] == 0.0 and row["scan share"] > 0 for row in short)
    longer = block_head_counts(model, np.random.default_rng(2).random((1, 5, 1)), [0.1])  # one pair per block
    assert all(row["beyond window H ε=0.1"] == 1 for row in longer)


def test_block_offsets_identity_shares_and_a_wrong_coefficient_or_offset():
    from experiments.trained_heads import block_offsets
    from lib import MambaBlock, apply_operator

    model = as_float64(classifier("mamba", 4, state=2, seed=3))
    X = np.random.default_rng(4).random((3, 9, 1))
    rows = block_offsets(model, X)
    for row, layer, inputs in zip(rows, model.layers, model.layer_inputs(X)):
        X_m = torch.from_numpy(inputs)
        Y, beta = layer(X_m).detach().numpy(), layer.offset(X_m).detach().numpy()
        linear = apply_operator(layer.operator(X_m).detach(), X_m)  # the dense operator, by lib's einsum
        assert row["identity error"] < 1e-12
        assert row["offset ratio"] == pytest.approx(np.linalg.norm(beta) / np.linalg.norm(Y), rel=1e-12)
        assert row["linear ratio"] == pytest.approx(np.linalg.norm(linear) / np.linalg.norm(Y), rel=1e-12)
        assert 0.05 < row["offset ratio"] < 2  # the conv bias gives an offset of the output's size
    without = copy.deepcopy(model)
    for layer in without.layers:
        layer.conv1d.bias = None  # no bias: a linear block, no offset
    assert all(r["offset ratio"] == 0 and r["identity error"] < 1e-12 for r in block_offsets(without, X))

    class Coefficients(MambaBlock):  # coefficients 1.001 × the block's: the identity must see it
        def coefficients(self, X):
            return 1.001 * super().coefficients(X)

    class Offset(MambaBlock):  # an offset 1.001 × the block's
        def offset(self, X):
            return 1.001 * super().offset(X)

    for wrong in (Coefficients, Offset):
        broken = copy.deepcopy(model)
        for layer in broken.layers:
            layer.__class__ = wrong
        assert min(r["identity error"] for r in block_offsets(broken, X)) > 1e-5

    class Blind(MambaBlock):  # coefficients off along U(δ_ij ⊙ V x_j) = 0: what the identity cannot see
        def coefficients(self, X):
            g = super().coefficients(X)
            U, V = self.factors()
            A = U[None, None] * (X @ V.T)[:, :, None, :]  # (b, n, d, D): δ ↦ U(δ ⊙ V x_j)
            null = torch.linalg.svd(A).Vh[..., U.shape[0]:, :]  # (b, n, D − d, D), for full-rank A
            r = torch.from_numpy(np.random.default_rng(0).standard_normal(g.shape[:3] + null.shape[2:3]))
            delta = torch.einsum("bijk,bjkq->bijq", r, null) * torch.tril(torch.ones(g.shape[1], g.shape[1]))[..., None]
            return g + 0.3 * g.norm() / delta.norm() * delta

    blind = copy.deepcopy(model)
    for layer in blind.layers:
        layer.__class__ = Blind
    assert max(r["identity error"] for r in block_offsets(blind, X)) < 1e-12  # passes, though
    for layer, wrong, inputs in zip(model.layers, blind.layers, model.layer_inputs(X)):
        X_m = torch.from_numpy(inputs)
        assert relative_error(wrong.coefficients(X_m), layer.coefficients(X_m).detach()) > 0.29  # 30 % off


def test_dense_span_check_agrees_and_fails_on_a_scaled_operator():
    from experiments.trained_heads import dense_span_check
    from lib import MambaBlock

    model = as_float64(classifier("mamba", 4, state=2, seed=3))
    X = np.random.default_rng(4).random((2, 8, 1))
    for row in dense_span_check(model, X):
        assert row["heads at X"] == row["dense"] and row["σ error"] < 1e-12 and row["dense σ_D+1/σ_1"] < 1e-12

    class Scaled(MambaBlock):  # a dense operator 1.001 × the coefficients' one: the check must see it
        def operator(self, X):
            return 1.001 * super().operator(X)

    broken = copy.deepcopy(model)
    for layer in broken.layers:
        layer.__class__ = Scaled
    errors = [row["σ error"] for row in dense_span_check(broken, X)]
    assert min(errors) > 5e-4


def test_mamba_notebook_baseline_is_the_one_digits_keeps():
    # mamba.ipynb fits the baseline at one C (its runtime budget); it must be the C that digits.ipynb selects.
    from pathlib import Path

    import yaml

    from experiments.trained_heads import select_baseline

    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "data/params.yaml").read_text())
    mine = params["chapters/trained-heads/mamba.ipynb"]["published"]
    digits = params["chapters/trained-heads/digits.ipynb"]["published"]
    data = load_digit_sequences(digits["test_size"], digits["split_seed"])
    split = validation_split(data, digits["validation_size"], digits["split_seed"])
    assert select_baseline(split, digits["baseline_Cs"])[0].C == mine["baseline_C"]
    assert all(mine[k] == digits[k] for k in ("split_seed", "test_size", "validation_size", "batch", "alpha"))


def test_wider_mamba_readings_follow_the_pages_recipe_by_hand(monkeypatch):
    import experiments.trained_heads as module
    from experiments.trained_heads import block_head_counts, wider_mamba_readings

    seen = []
    monkeypatch.setattr(module, "block_head_counts", lambda model, X, *a: seen.append(X) or block_head_counts(model, X, *a))

    full = load_digit_sequences(0.25, 0)
    data = DigitSequences(full.X_train[:60], full.y_train[:60], full.X_test[:8], full.y_test[:8])
    split = validation_split(data, 0.25, 0)
    base = logistic_baseline(split, 1.0)
    options, epsilons = {"width": 2, "state": 2, "batch": 16}, [0.1, 0.01, 1e-3, 1e-4, 1e-5]
    selection, rows = wider_mamba_readings(data, split, base, lrs=[0.03, 0.01], epoch_grid=[1, 2], seeds=[3, 4],
                                           jobs=2,
                                           epsilons=epsilons, span_images=3, subsets=2, **options)
    found, by_hand = select_setting("mamba", split, [0.03, 0.01], [1, 2], seed=3, **options)
    assert selection == by_hand and [r["seed"] for r in rows] == [3, 4]
    kept = max(by_hand, key=lambda r: r["validation accuracy"])
    model = classifier("mamba", 2, state=2, seed=4)  # seed 4 trained at the kept setting, by hand
    initial = as_float64(model)
    train_classifier(model, split, epochs=kept["epochs"], lr=kept["lr"], batch=16, seed=4)
    trained = as_float64(model)
    row = rows[1]
    assert (row["lr"], row["epochs"]) == (kept["lr"], kept["epochs"])
    assert row["test accuracy"] == accuracy(trained, data.X_test, data.y_test)
    assert row["fitted images"] == accuracy(trained, split.X_train, split.y_train)
    assert row["baseline fitted"] == accuracy(base, split.X_train, split.y_train)
    assert rows[0]["test accuracy"] == accuracy(as_float64(found), data.X_test, data.y_test)
    right, right_base = correct(trained, data.X_test, data.y_test), correct(base, data.X_test, data.y_test)
    assert (row["only this"], row["only baseline"]) == ((right & ~right_base).sum(), (right_base & ~right).sum())
    for a, b in ((0, 2), (3, 5)):  # both groups of 3 images, 0-based a..b
        X = data.X_test[a:b + 1]
        before, after = (np.array([[r[f"H ε={e:g}"] for e in epsilons] for r in block_head_counts(m, X, epsilons)])
                         for m in (initial, trained))
        assert row[f"mean change {a}–{b}"] == pytest.approx((after - before).mean())
        for m in (1, 2):
            assert row[f"block {m} change {a}–{b}"] == pytest.approx((after - before)[m - 1].mean())
    # the images read: each group twice (initial, trained) per seed, in order (counts alone barely move here)
    assert len(seen) == 8 and all(np.array_equal(X, data.X_test[3 * (k // 2 % 2):][:3]) for k, X in enumerate(seen))
    assert set(row) >= {"mean change 0–2", "block 1 change 0–2", "McNemar p", "parameters"}
    with pytest.raises(ValueError, match="subsets"):
        wider_mamba_readings(data, split, base, lrs=[0.01], epoch_grid=[1], seeds=[3], epsilons=[0.1],
                             span_images=5, subsets=2, **options)


def test_wider_mamba_table_splits_the_parts(tmp_path):
    from experiments.trained_heads import WIDER_MAMBA_TABLE, wider_mamba_table

    csv = tmp_path / f"{WIDER_MAMBA_TABLE}.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text("part,lr,epochs,validation accuracy,seed,test accuracy\n"
                   "selection,0.01,20,0.5,,\nseed,0.01,20,,3,0.75\n")
    selection, seeds = wider_mamba_table(tmp_path)
    assert selection.to_dict("records") == [{"lr": 0.01, "epochs": 20, "validation accuracy": 0.5}]
    assert seeds.to_dict("records") == [{"lr": 0.01, "epochs": 20, "seed": 3, "test accuracy": 0.75}]
    assert seeds["seed"].dtype.kind == "i"
