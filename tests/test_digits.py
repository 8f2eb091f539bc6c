"""Trained SSMs (lib.ssm's DiagonalSSM and SharedStateSSM, lib.digits): layers, exact k, truncations, classifiers.

Independent references: the S4D and S5 layers recomputed in plain numpy complex arithmetic from their
parameters (a step-by-step loop), ranks of small well-conditioned lag matrices by numpy, the witness
of the genericity proof built by hand, scipy's Wilson interval, and Monte Carlo for the mean path.
"""

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from lib import (CentredHeads, DiagonalSSM, DigitSequences, InputMoments, RelativeHeads, SequenceClassifier,
                 SharedStateSSM, accuracy, accuracy_knee, as_float64, classifier, exact_lag_span_dimension,
                 generic_lag_span_dimension, input_moments, load_digit_sequences, logistic_baseline, logits,
                 mean_path, min_heads, optimal_head_errors, population_error, relative_error, train_classifier,
                 truncated_heads, truncation_errors, truncation_sweep, truncations, wilson_interval)

# -- references in numpy --------------------------------------------------------------------------


def diagonal_np(layer, X):
    """S4D by hand: per channel and mode, s ← μ s + x, y = 2 Re Σ_m C_m B̄_m s_m (or Re for real modes) + D x."""
    lam = -np.exp(layer._A_log.detach().numpy()).astype(complex)
    if layer.complex:
        lam = lam + 1j * layer._A_imag.detach().numpy()
        C = layer._C.detach().numpy() @ np.array([1.0, 1j])
    else:
        C = layer._C.detach().numpy().astype(complex)
    step = np.exp(layer._log_step.detach().numpy())[:, None]
    mu, B = np.exp(step * lam), (np.exp(step * lam) - 1) / lam
    factor = 2.0 if layer.complex else 1.0
    b, n, d = X.shape
    s, Y = np.zeros((b, d, lam.shape[1]), dtype=complex), np.zeros((b, n, d))
    for i in range(n):
        s = mu * s + B * X[:, i, :, None]
        Y[:, i] = factor * (C * s).sum(-1).real + layer.D * X[:, i]
    return Y


def shared_np(layer, X):
    """S5 by hand: s ← μ ⊙ s + B̄ x, y = 2 Re(C s) + D x, complex state."""
    lam = -np.exp(layer._A_log.detach().numpy()) + 1j * layer._A_imag.detach().numpy()
    step = np.exp(layer._log_step.detach().numpy())
    B = layer._B.detach().numpy() @ np.array([1.0, 1j])
    C = layer._C.detach().numpy() @ np.array([1.0, 1j])
    mu, B_bar = np.exp(step * lam), ((np.exp(step * lam) - 1) / lam)[:, None] * B
    b, n, d = X.shape
    s, Y = np.zeros((b, len(lam)), dtype=complex), np.zeros((b, n, d))
    for i in range(n):
        s = mu * s + X[:, i] @ B_bar.T
        Y[:, i] = 2 * (s @ C.T).real + layer.D * X[:, i]
    return Y


def random_diagonal(d, M, *, complex_modes=True, seed=0):
    """A DiagonalSSM at a random parameter (not an initialisation: random imaginary parts too)."""
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((d, M, 2) if complex_modes else (d, M))
    return DiagonalSSM(rng.uniform(-3, 0, d), rng.standard_normal((d, M)), C, rng.standard_normal(d),
                       rng.uniform(-4, 4, (d, M)) if complex_modes else None)


def random_shared(d, M, seed=0):
    rng = np.random.default_rng(seed)
    return SharedStateSSM(rng.uniform(-3, 0, M), rng.standard_normal(M), rng.uniform(-4, 4, M),
                          rng.standard_normal((M, d, 2)), rng.standard_normal((d, M, 2)), rng.standard_normal(d))


def lag_rank_np(lags, rtol=1e-10):
    M = lags.reshape(len(lags), -1)
    return int(np.linalg.matrix_rank(M, tol=rtol * np.linalg.norm(M, 2)))


LAYERS = {
    "S4D-Lin init": lambda: DiagonalSSM.random(3, 4, seed=1),
    "S4D-Real init": lambda: DiagonalSSM.random(3, 3, init="real", seed=2),
    "diagonal random": lambda: random_diagonal(3, 2, seed=3),
    "diagonal random real": lambda: random_diagonal(2, 3, complex_modes=False, seed=4),
    "S5 init": lambda: SharedStateSSM.random(3, 4, seed=5),
    "shared random": lambda: random_shared(3, 3, seed=6),
}


# -- the layers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(LAYERS))
def test_trained_layers_match_numpy_and_their_lags(case):
    layer = LAYERS[case]()
    X = np.random.default_rng(0).standard_normal((3, 20, layer.d))
    reference = (shared_np if isinstance(layer, SharedStateSSM) else diagonal_np)(layer, X)
    for method in ("recurrence", "convolution", "auto"):
        assert relative_error(layer(X, method=method), reference) < 1e-13
    L = layer.lags(20)
    by_lags = np.stack([sum(X[:, i - ell] @ L[ell].T for ell in range(i + 1)) for i in range(20)], 1)
    assert relative_error(by_lags, reference) < 1e-13
    W = layer.operator(X[0])
    np.testing.assert_allclose(np.einsum("ijpd,jd->ip", W, X[0]), reference[0], atol=1e-12)
    if isinstance(layer, DiagonalSSM):                     # lags are diagonal; the kernel is their diagonal
        assert np.abs(L - np.einsum("lq,qp->lqp", np.einsum("lqq->lq", L), np.eye(layer.d))).max() == 0
        np.testing.assert_allclose(np.einsum("lqq->ql", L)[:, 1:], layer.kernel(20)[:, 1:], atol=1e-15)


@pytest.mark.parametrize("case", list(LAYERS))
def test_modes_reproduce_the_lags(case):
    layer = LAYERS[case]()
    nodes, residues = layer.modes()
    L = np.einsum("kl,kpd->lpd", nodes[:, None] ** np.arange(15), residues)
    np.testing.assert_allclose(L.real, layer.lags(15), atol=1e-13)
    assert np.abs(L.imag).max() < 1e-13


def test_trained_layers_train_and_keep_float32():
    layer = DiagonalSSM.random(4, 4, seed=0, dtype=torch.float32)
    X = torch.randn(8, 16, 4)
    loss = layer(X).square().mean()
    assert loss.dtype == torch.float32 and not loss.requires_grad        # frozen until fit trains it
    layer.requires_grad_(True)
    layer(X).square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("call, error, match", [
    (lambda: DiagonalSSM.random(3, 5), ValueError, "N must be even"),
    (lambda: DiagonalSSM.random(3, 4, init="diag"), ValueError, "init"),
    (lambda: DiagonalSSM.random(3, 4, step_range=(0.1, 0.01)), ValueError, "step_range must have lo <= hi"),
    (lambda: DiagonalSSM.random(3, 4, step_range=0.1), TypeError, "step_range must be a pair"),
    (lambda: SharedStateSSM.random(3, 5), ValueError, "P must be even"),
    (lambda: DiagonalSSM(np.zeros(3), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(2)), ValueError, "D must have"),
    (lambda: DiagonalSSM(np.zeros(3), np.zeros((3, 2)), np.zeros((3, 2)), np.zeros(3), np.zeros((3, 2))),
     ValueError, "C must have shape"),
    (lambda: SharedStateSSM(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros((2, 3, 2)), np.zeros((3, 2, 2)),
                            np.zeros(4)), ValueError, "D must have shape"),
    (lambda: LAYERS["S5 init"]()(np.zeros((4, 3)), method="scan"), ValueError, "method"),
])
def test_trained_layer_arguments_are_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_lib_heads_accepts_the_trained_layers():
    # min_heads, optimal_head_errors and truncated_heads read the lags through the LTI protocol.
    for layer in (random_diagonal(3, 2, seed=1), random_shared(3, 2, seed=2)):
        n = 8
        L = layer.lags(n)
        assert min_heads(layer, n) == lag_rank_np(L)
        G = L.reshape(n, -1) * np.sqrt(np.arange(n, 0, -1))[:, None]
        sigma = np.linalg.svd(G, compute_uv=False)
        np.testing.assert_allclose(optimal_head_errors(layer, n, 4), [(sigma[H:] ** 2).sum() for H in range(5)],
                                   rtol=1e-10, atol=1e-12 * (sigma ** 2).sum())
        model = truncated_heads(layer, n, 2)
        assert population_error(layer, model, n) == pytest.approx((sigma[2:] ** 2).sum(), rel=1e-9)


# -- prop-trained-lag-span -------------------------------------------------------------------------


@pytest.mark.parametrize("d, M, n", [(3, 2, 2), (3, 2, 3), (3, 1, 8), (4, 3, 6)])
def test_prop_trained_lag_span_diagonal_generic_value_on_random_parameters(d, M, n):
    for seed in range(3):
        for complex_modes in (True, False):
            layer = random_diagonal(d, M, complex_modes=complex_modes, seed=seed)
            exact = exact_lag_span_dimension(layer, n, digits=40)
            assert exact.k == generic_lag_span_dimension(layer, n) == min(n, d) == lag_rank_np(layer.lags(n))


@pytest.mark.parametrize("d, M, n", [(2, 1, 5), (3, 2, 8), (3, 3, 7), (3, 3, 4), (4, 2, 3)])
def test_prop_trained_lag_span_shared_generic_value_on_random_parameters(d, M, n):
    for seed in range(3):
        layer = random_shared(d, M, seed=seed)
        assert generic_lag_span_dimension(layer, n) == min(2 * M + 1, n)
        assert lag_rank_np(layer.lags(n)) == min(2 * M + 1, n)        # small, well-conditioned: numpy's rank
        if n >= 2 * M + 1:
            assert exact_lag_span_dimension(layer, n).k == min(2 * M + 1, n)


def test_prop_trained_lag_span_witness_of_the_proof_attains_p_plus_one():
    # The proof's witness for d = 3, P = 6 = d(d − 1): Δ = 1, λ_m = −1 + iθ_m, B̄_m = e_β, C[:, m] = e_a + i e_a',
    # D = e_1; slots (a, β), (a', β) distinct and off (1, 1).  k = P + 1 = 7 for n >= 7, n below.
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
        assert lag_rank_np(layer.lags(n)) == min(2 * M + 1, n) == generic_lag_span_dimension(layer, n)
    assert exact_lag_span_dimension(layer, 12).k == 7


def test_prop_trained_lag_span_upper_bounds_and_non_generic_points():
    # Bounds hold everywhere; equality is generic, not universal.
    n = 12
    s5 = SharedStateSSM.random(3, 6, seed=0)                  # S4D-Lin start: λ_0 = −½ is real, μ_0 = μ̄_0
    assert exact_lag_span_dimension(s5, n).k == 6 < generic_lag_span_dimension(s5, n) == 7
    assert lag_rank_np(s5.lags(n)) <= 6                        # float64 may see even less (small steps)
    twin = random_diagonal(3, 2, seed=5)                      # two channels with the same kernel and skip
    with torch.no_grad():
        for name in ("_log_step", "_A_log", "_A_imag", "_C", "_D"):
            getattr(twin, name)[1] = getattr(twin, name)[0]
    assert exact_lag_span_dimension(twin, n, digits=40).k == 2 < generic_lag_span_dimension(twin, n) == 3
    no_skip = random_shared(3, 2, seed=7)
    with torch.no_grad():
        no_skip._D.zero_()
    assert exact_lag_span_dimension(no_skip, n).k == 4           # P without the node 0
    for layer in (random_shared(2, 3, seed=1), random_diagonal(2, 4, seed=2)):
        assert lag_rank_np(layer.lags(n)) <= min(n, layer.d ** 2, getattr(layer, "P", n) + 1)


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
        for name in ("_log_step", "_A_log", "_C", "_D"):
            getattr(layer, name)[1] = getattr(layer, name)[0]
    twin = exact_lag_span_dimension(layer, 32)
    assert twin.k == 19 and twin.largest_dropped < 1e-45


@pytest.mark.parametrize("call, error, match", [
    (lambda: exact_lag_span_dimension(random_shared(3, 2), 4), ValueError, "n must be >= 5"),
    (lambda: exact_lag_span_dimension(RelativeHeads.random(1, 4, 2, 2), 4), TypeError, "DiagonalSSM or"),
    (lambda: exact_lag_span_dimension(random_diagonal(2, 1), 4, digits=10), ValueError, "digits must be >= 20"),
    (lambda: generic_lag_span_dimension(SharedStateSSM.random(2, 4), 8), ValueError, "P <= d"),
    (lambda: generic_lag_span_dimension(np.eye(2), 8), TypeError, "DiagonalSSM or"),
])
def test_lag_span_arguments_are_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_extended_precision_lags_are_the_float64_lags():
    # The 50-digit lag diagonals are the layer's own: their singular values match numpy's on the float64 lags
    # wherever float64 resolves them (a well-conditioned case), for complex and real modes.
    from lib.digits import _extended_kernel_singular_values

    for layer in (random_diagonal(4, 3, seed=11), random_diagonal(3, 2, complex_modes=False, seed=12)):
        diagonals = np.einsum("lqq->lq", layer.lags(9))
        np.testing.assert_allclose(_extended_kernel_singular_values(layer, 9, 50),
                                   np.linalg.svd(diagonals, compute_uv=False), rtol=1e-11)


def test_exact_lag_span_dimension_refuses_nearly_repeated_nodes():
    layer = random_shared(3, 2, seed=1)
    with torch.no_grad():
        layer._A_imag[1] = layer._A_imag[0] + 1e-12
        layer._A_log[1], layer._log_step[1] = layer._A_log[0], layer._log_step[0]
    with pytest.raises(ValueError, match="repeated nodes"):
        exact_lag_span_dimension(layer, 10)


# -- truncations with the mean path (prop-covariance-head-count, cor-truncation-exact) ---------------


def moments_of(d, rank, seed):
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((d, rank))
    return InputMoments(rng.standard_normal(d) * 2, S @ S.T, 0), S


def test_input_moments_match_numpy():
    X = np.random.default_rng(0).standard_normal((5, 7, 3)) + np.array([1.0, -2.0, 0.5])
    m = input_moments(X)
    tokens = X.reshape(-1, 3)
    np.testing.assert_allclose(m.mean, tokens.mean(0), rtol=1e-14)
    np.testing.assert_allclose(m.covariance, np.cov(tokens.T, bias=True), rtol=1e-12)
    assert m.count == 35


def test_mean_path_is_the_output_on_a_constant_input():
    layer, mu = random_shared(3, 2, seed=3), np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(mean_path(layer, 9, mu), layer(np.tile(mu, (9, 1))), atol=1e-13)


@pytest.mark.parametrize("law", ["gaussian", "uniform"])
def test_prop_covariance_head_count_centred_truncation_keeps_the_closed_form(law):
    # Part 3: with the mean path, the error of the centred H-head model is Σ_{q>H} σ_q(G_Σ)² whatever the mean
    # (Monte Carlo, 4 standard errors), and the CentredHeads forward is heads(x − μ) + m.
    layer, n = random_diagonal(3, 2, seed=8), 10
    moments, S = moments_of(3, 3, 2)
    rng = np.random.default_rng(1)
    z = rng.standard_normal((30_000, n, 3)) if law == "gaussian" else rng.uniform(-3 ** 0.5, 3 ** 0.5, (30_000, n, 3))
    X = moments.mean + z @ S.T
    Y = layer(X)
    closed = optimal_head_errors(layer, n, 3, covariance=moments.covariance)
    models = truncations(layer, n, [1, 2], moments)                # k = 3: H < k keeps a random error
    for H, model in models.items():
        e = ((Y - model(X)) ** 2).sum(axis=(1, 2))
        assert abs(e.mean() - closed[H]) < 4 * e.std(ddof=1) / np.sqrt(len(e))
        by_hand = model.heads(X - moments.mean) + mean_path(layer, n, moments.mean)
        assert relative_error(model(X), by_hand) < 1e-12
    # The one-SVD truncations are those of truncated_heads.
    single = truncated_heads(layer, n, 2, covariance=moments.covariance)
    np.testing.assert_allclose(models[2].heads.V, single.V, atol=1e-12)


def test_cor_truncation_exact_on_range_of_sigma_and_not_beyond():
    # H >= rank G_Σ: the centred truncation equals the layer when x_j − μ ∈ range Σ; off that range it need not.
    layer, n = random_shared(3, 2, seed=4), 10
    moments, S = moments_of(3, 2, 5)                          # singular Σ
    k = exact_lag_span_dimension(layer, n).k
    model = truncations(layer, n, [k], moments)[k]
    X = moments.mean + np.random.default_rng(0).standard_normal((4, n, 2)) @ S.T
    assert relative_error(model(X), layer(X)) < 1e-10
    null = np.linalg.svd(moments.covariance)[2][-1]
    off = X + null
    assert relative_error(model(off), layer(off)) > 1e-3
    smaller = truncations(layer, n, [1], moments)[1]
    assert relative_error(smaller(X), layer(X)) > 1e-3


def small_classifier(kind="s5", seed=0):
    return as_float64(classifier(kind, 4, state=4, heads=2, n=10, seed=seed))


def test_cor_truncation_exact_classifier_logits_at_k():
    # Every block replaced by its k-head truncation with the mean path (moments of the trained model's layer
    # inputs): the logits do not change; with fewer heads they do.  Random classifiers, random inputs.
    for kind in ("s5", "s4d-lin", "s4d-real"):
        model = small_classifier(kind, seed=3)
        X = np.random.default_rng(0).random((40, 10, 1))
        y = np.random.default_rng(1).integers(0, 10, 40)
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
            h = torch.tensor(X)
            with torch.no_grad():
                h = model.encoder(h)
                for m in range(2):
                    cut = truncations(model.layers[m], 10, [1], moments[m])[1] if m in blocks else None
                    h = model._block(m, h, cut)
                manual = model.decoder(h.mean(1)).numpy()
            change = np.abs(manual - reference).max() / np.abs(reference).max()
            assert change > 1e-6 and swept["logit change"] == pytest.approx(change, rel=1e-9)


def test_truncation_errors_predicted_column_is_the_closed_form_and_iid_inputs_match_it():
    layer, n = random_shared(3, 2, seed=9), 12
    moments, S = moments_of(3, 3, 4)
    X = moments.mean + np.random.default_rng(2).standard_normal((20_000, n, 3)) @ S.T
    records = truncation_errors(layer, n, [1, 2], moments, X)
    tails = optimal_head_errors(layer, n, 2, covariance=moments.covariance)
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
    assert np.array_equal(np.bincount(data.y_test), np.round(np.bincount(data.y_train) / 3).astype(int)) or \
        np.abs(np.bincount(data.y_test) * 3 - np.bincount(data.y_train)).max() <= 3
    again = load_digit_sequences()
    assert np.array_equal(again.X_test, data.X_test) and np.array_equal(again.y_train, data.y_train)
    assert logistic_baseline(data) > 0.9


def test_wilson_interval_matches_scipy():
    for k, n in ((0, 10), (3, 10), (437, 450), (450, 450)):
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n, z=1.959963984540054) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_accuracy_knee():
    assert accuracy_knee([1, 2, 3, 4], [0.1, 0.95, 0.5, 0.96], 0.96, 0.02) == 4
    assert accuracy_knee([1, 2, 3, 4], [0.1, 0.95, 0.955, 0.96], 0.96, 0.02) == 2
    assert accuracy_knee([1, 2], [0.97, 0.96], 0.96) == 1
    with pytest.raises(ValueError, match="never stay"):
        accuracy_knee([1, 2], [0.5, 0.6], 0.9)
    with pytest.raises(ValueError, match="increasing"):
        accuracy_knee([2, 1], [0.5, 0.6], 0.9)


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


@pytest.mark.parametrize("call, error, match", [
    (lambda: classifier("lstm", 4), ValueError, "kind"),
    (lambda: classifier("attention", 6, heads=4), ValueError, "heads must divide"),
    (lambda: SequenceClassifier([]), ValueError, "at least one"),
    (lambda: SequenceClassifier([DiagonalSSM.random(3, 2), DiagonalSSM.random(4, 2)]), ValueError, "width d = p = 3"),
    (lambda: logits(small_classifier(), np.zeros((2, 10, 2))), ValueError, r"X must have shape \(b, n, 1\)"),
    (lambda: logits(small_classifier("attention"), np.zeros((2, 11, 1))), ValueError, "length n <= 10"),
    (lambda: accuracy(small_classifier(), np.zeros((2, 10, 1)), [1, 2, 3]), ValueError, r"y must have shape"),
    (lambda: wilson_interval(5, 4), ValueError, "successes must be <= trials"),
    (lambda: load_digit_sequences(test_size=1.0), ValueError, "test_size"),
    (lambda: input_moments(np.zeros((3, 4))), ValueError, r"inputs must have shape \(b, n, d\)"),
    (lambda: mean_path(random_shared(3, 2), 5, np.zeros(2)), ValueError, r"mean must have shape \(3,\)"),
    (lambda: truncations(random_shared(3, 2), 5, [1], np.eye(3)), TypeError, "moments must be InputMoments"),
    (lambda: truncations(np.eye(3), 5, [1], moments_of(3, 3, 0)[0]), TypeError, "ssm must be an LTI"),
    (lambda: CentredHeads(np.eye(2), np.zeros(2), np.zeros((4, 2))), TypeError, "heads must be a RelativeHeads"),
    (lambda: CentredHeads(RelativeHeads.random(1, 4, 2, 2), np.zeros(3), np.zeros((4, 2))), ValueError,
     "mean must have shape"),
    (lambda: truncation_errors(random_shared(3, 2), 5, [1], moments_of(3, 3, 0)[0], np.zeros((2, 4, 3))),
     ValueError, r"inputs must have shape \(b, 5, 3\)"),
    (lambda: truncation_sweep(small_classifier(), np.zeros((2, 10, 1)), [0, 1], [], [1], [0]), ValueError,
     "one InputMoments per layer"),
    (lambda: train_classifier(torch.nn.Linear(1, 1), None, epochs=1), TypeError, "SequenceClassifier"),
])
def test_digits_arguments_are_checked(call, error, match):
    with pytest.raises(error, match=match):
        call()
