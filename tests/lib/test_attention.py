"""Softmax and linear attention, relative-position heads: the factorized class (lib.attention).

Against the page's formulas in numpy (the `reference` package): weights α^h_ij, values V_h, the
forward pass by explicit sums or running sums, and the operator Σ_h α^h_ij V_h.
"""

import numpy as np
import pytest
import torch

import reference as ref
from lib import (SSD, Dense, LinearAttention, LinearSSM, RelativeHeads, SoftmaxAttention, interaction_rank,
                 interaction_span, operator_span, relative_error)
from lib.attention import elu_plus_one


def t(a):
    return torch.from_numpy(np.asarray(a, dtype=float))


def params(model, *names):
    return [getattr(model, name).numpy(force=True) for name in names]


def projections(model):
    return params(model, "W_Q", "W_K", "W_V", "W_O")


def call(model, X):
    with torch.no_grad():
        return model(t(X)).numpy(), model.operator(t(X)).numpy()


def coefficients(model, x):
    """(α (H, n, n), V (H, p, d)) of a factorized model at one sequence x, from the page's formulas in numpy."""
    if isinstance(model, Dense):
        return np.eye(len(x))[None], params(model, "W")[0][None]
    if isinstance(model, SSD):
        P = params(model, "A_log", "W_delta", "dt_bias", "W_B", "W_C", "W_O")
        return ref.ssd_coefficients(*P[:5], x), ref.ssd_values(P[5], model.H)
    if isinstance(model, RelativeHeads):
        V, c = params(model, "V", "coefficients")
        lag = np.subtract.outer(np.arange(len(x)), np.arange(len(x)))
        return np.where(lag >= 0, c[:, np.clip(lag, 0, None)], 0.0), V
    W_Q, W_K, W_V, W_O = projections(model)
    if isinstance(model, SoftmaxAttention):
        bias = None if model.position_bias is None else params(model, "position_bias")[0]
        return ref.softmax_weights(W_Q, W_K, x, model.causal, bias), ref.attention_values(W_V, W_O)
    return ref.linear_weights(W_Q, W_K, x, model.causal), ref.attention_values(W_V, W_O)


def coefficient_rank(model, inputs):
    """dim span{(α^1_ij(X), …, α^H_ij(X)) : i, j, X ∈ inputs} (prop-factorized-rank)."""
    alphas = [coefficients(model, x)[0] for x in inputs]
    return ref.numerical_rank(np.concatenate([alpha.reshape(len(alpha), -1).T for alpha in alphas]))


def value_rank(model):
    return ref.numerical_rank(coefficients(model, np.zeros((1, model.d)))[1])


def forward(model, x):
    W_Q, W_K, W_V, W_O = projections(model)
    if isinstance(model, SoftmaxAttention):
        bias = None if model.position_bias is None else params(model, "position_bias")[0]
        return ref.softmax_forward(W_Q, W_K, W_V, W_O, x, model.causal, bias)
    return ref.linear_forward(W_Q, W_K, W_V, W_O, x, model.causal)


def assert_matches_reference(model, n=7, seed=0, scale=30.0):
    """forward, weights and operator against the formulas, sequence by sequence, on every input family."""
    for family, X in ref.input_families(n, model.d, np.random.default_rng(seed), scale=scale).items():
        Y, W = call(model, X)
        with torch.no_grad():
            alphas = model.weights(t(X)).numpy()
        for x, y, w, alpha in zip(X, Y, W, alphas):
            expected_alpha, V = coefficients(model, x)
            assert ref.itemwise_error(y, forward(model, x), 1) <= 1e-10, family
            assert ref.itemwise_error(w, ref.factorized_operator(expected_alpha, V), 2) <= 1e-10, family
            np.testing.assert_allclose(alpha, expected_alpha, rtol=1e-10, atol=1e-14, err_msg=family)
            assert np.all(alpha >= 0) and np.allclose(alpha.sum(-1), 1)  # rows are probability vectors
        np.testing.assert_allclose(model.values().numpy(force=True), V, rtol=1e-13, atol=1e-15)


# -- softmax attention -----------------------------------------------------------------------------


@pytest.mark.parametrize("d,p,H,causal,scale", [(1, 1, 1, True, 30.0), (3, 2, 2, True, 1000.0),
                                                (4, 3, 3, False, 30.0), (2, 4, 2, False, 1000.0)])
def test_prop_softmax_attention_operator_is_sum_of_alpha_times_values_on_adversarial_inputs(d, p, H, causal, scale):
    model = SoftmaxAttention.random(d, p, heads=H, causal=causal, seed=d + H)
    assert_matches_reference(model, seed=H, scale=scale)


def test_prop_softmax_attention_relative_position_bias():
    rng = np.random.default_rng(0)
    W_Q, W_K, W_V, W_O = (rng.standard_normal(s) for s in ((2, 3, 4), (2, 3, 4), (2, 2, 4), (2, 3, 2)))
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=rng.standard_normal((2, 9)))
    assert model.max_length == 9
    assert_matches_reference(model, n=9, seed=1)
    with torch.no_grad():
        scores = model.scores(t(rng.standard_normal((7, 4)))).numpy()
    assert np.all(np.isneginf(scores[:, np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]]))
    assert np.all(np.isfinite(scores[:, np.tril_indices(7)[0], np.tril_indices(7)[1]]))


def test_softmax_forward_in_query_blocks_matches_numpy_weights_on_long_sequences():
    rng = np.random.default_rng(5)
    W_Q, W_K, W_V, W_O = (rng.standard_normal(s) / 2 for s in ((2, 3, 4), (2, 3, 4), (2, 2, 4), (2, 3, 2)))
    bias = rng.standard_normal((2, 1200))
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O, position_bias=bias)
    X = rng.standard_normal((1100, 4))  # more than one block of 512 queries
    # The weights in numpy (vectorised: the reference's loops are too slow at n = 1100).
    lag = np.subtract.outer(np.arange(1100), np.arange(1100))
    Q, K = X @ W_Q.transpose(0, 2, 1), X @ W_K.transpose(0, 2, 1)  # (H, n, d_k)
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(3) + bias[:, np.clip(lag, 0, None)]
    alpha = np.exp(np.where(lag >= 0, scores, -np.inf) - scores.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    with torch.no_grad():
        Y = model(t(X)).numpy()
    expected = sum(alpha[h] @ X @ (W_O[h] @ W_V[h]).T for h in range(2))
    np.testing.assert_allclose(Y, expected, rtol=1e-10, atol=1e-13)


def score_directions_independent(model, seed=0):
    """Whether W_K^{hᵀ} W_Q^h x*, h = 1..H, are independent at a random token x*."""
    W_Q, W_K, _, _ = projections(model)
    x = np.random.default_rng(seed).standard_normal(model.d)
    return ref.numerical_rank(np.array([W_K[h].T @ (W_Q[h] @ x) for h in range(model.H)])) == model.H


@pytest.mark.parametrize("causal", [True, False])
def test_prop_softmax_attention_interaction_rank_is_H_for_n_at_least_2_and_1_for_n_1(causal):
    rng = np.random.default_rng(0)
    for H in (1, 2, 3):  # H <= d = 3: the proposition's conditions can hold
        model = SoftmaxAttention.random(3, 3, heads=H, causal=causal, seed=H)
        assert value_rank(model) == H and score_directions_independent(model)
        for n in (2, 5):
            assert interaction_rank(model, rng.standard_normal((H, n, 3))) == H  # H inputs suffice (almost surely)
        assert interaction_rank(model, rng.standard_normal((4, 1, 3))) == 1  # n = 1: the block Σ_h V_h
    # One head: every block is a multiple of the single V.
    model = SoftmaxAttention.random(3, 2, heads=1, seed=0)
    basis = interaction_span(model, rng.standard_normal((4, 8, 3))).basis
    V = coefficients(model, np.zeros((1, 3)))[1][0]
    assert abs(np.sum(basis[0] * V)) == pytest.approx(np.linalg.norm(V), rel=1e-12)


def test_prop_softmax_attention_rank_is_the_coefficient_span_when_more_heads_than_d():
    # H = 5 > d = 3: the proposition's second condition cannot hold and it claims only <= H; the
    # exact value is still dim span{α_ij(X)} (prop-factorized-rank), here computed in numpy.
    model = SoftmaxAttention.random(3, 3, heads=5, seed=5)
    X = np.random.default_rng(1).standard_normal((4, 8, 3))
    assert interaction_rank(model, X) == coefficient_rank(model, X) <= 5


# -- linear attention ------------------------------------------------------------------------------


@pytest.mark.parametrize("d,p,H,causal,scale", [(1, 1, 1, True, 30.0), (3, 2, 2, True, 100.0),
                                                (4, 3, 3, False, 30.0), (2, 4, 2, False, 100.0)])
def test_prop_linear_attention_operator_is_sum_of_alpha_times_values_on_adversarial_inputs(d, p, H, causal, scale):
    model = LinearAttention.random(d, p, heads=H, causal=causal, seed=d + H)
    assert_matches_reference(model, seed=H, scale=scale)


@pytest.mark.parametrize("causal", [True, False])
def test_prop_linear_attention_interaction_rank_is_the_coefficient_span(causal):
    X = np.random.default_rng(0).standard_normal((4, 8, 3))
    for H in (1, 2, 3):
        model = LinearAttention.random(3, 3, heads=H, causal=causal, seed=H)
        assert value_rank(model) == H
        assert interaction_rank(model, X) == coefficient_rank(model, X) == H
        assert interaction_rank(model, X[:, :1]) == 1  # n = 1: the block Σ_h V_h


def test_prop_linear_attention_coefficients_fill_an_open_set_near_a_regular_token():
    # The proof's construction: inputs (x* + v, x*), v small; the weights α_21 of the H heads move
    # in H independent directions when g_h = W_K^{hᵀ}(φ(W_Q^h x*) ⊙ φ'(W_K^h x*)) are independent,
    # so the blocks 𝒲_21 span H dims.
    model = LinearAttention.random(3, 3, heads=3, seed=3)
    W_Q, W_K, _, _ = projections(model)
    rng = np.random.default_rng(4)
    x_star = rng.standard_normal(3)
    slope = lambda u: np.where(u > 0, 1.0, np.exp(np.minimum(u, 0)))
    g = np.array([W_K[h].T @ (ref.elu_plus_one(W_Q[h] @ x_star) * slope(W_K[h] @ x_star)) for h in range(3)])
    assert np.linalg.matrix_rank(g) == 3
    inputs = np.array([[x_star + 1e-3 * rng.standard_normal(3), x_star] for _ in range(3)])
    assert interaction_rank(model, inputs) == 3
    with torch.no_grad():
        alpha_21 = model.weights(t(inputs)).numpy()[:, :, 1, 0]
    assert np.linalg.matrix_rank(alpha_21 - 0.5, tol=1e-9) == 3


def test_elu_plus_one_keeps_relative_accuracy_far_below_zero():
    # e^u itself, not (e^u − 1) + 1, which is off by 1e-3 at u = −30 and 0 below u ≈ −37.
    u = torch.tensor([-700.0, -300.0, -40.0, -30.0, -1e-3, 0.0, 1e-3, 2.0], dtype=torch.float64, requires_grad=True)
    phi = elu_plus_one(u)
    expected = ref.elu_plus_one(u.detach().numpy())
    np.testing.assert_allclose(phi.detach().numpy(), expected, rtol=1e-15)
    (g,) = torch.autograd.grad(phi.sum(), u)
    np.testing.assert_allclose(g.numpy(), np.where(u.detach().numpy() > 0, 1.0, expected), rtol=1e-15)


def test_linear_attention_custom_feature_map_and_positivity_check():
    model = LinearAttention(*projections(LinearAttention.random(3, 2, heads=2)), feature_map=torch.exp)
    X = np.random.default_rng(0).standard_normal((5, 3))
    W_Q, W_K, _, _ = projections(model)
    kernel = np.tril(np.einsum("hik,hjk->hij", np.exp(np.einsum("hkd,nd->hnk", W_Q, X)),
                               np.exp(np.einsum("hkd,nd->hnk", W_K, X))))
    with torch.no_grad():
        np.testing.assert_allclose(model.weights(t(X)).numpy(), kernel / kernel.sum(-1, keepdims=True), rtol=1e-12)
    bad = LinearAttention(*projections(model), feature_map=torch.zeros_like)
    with pytest.raises(ValueError, match="feature_map must return positive features"):
        bad(t(X))


def test_linear_attention_reports_features_that_underflow():
    # Queries far below −745 in every coordinate make φ(q) = 0 in float64: a clear error, not NaN.
    model = LinearAttention(np.full((1, 1, 1), -1.0), np.ones((1, 1, 1)), np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    with pytest.raises(ValueError, match="feature_map must return positive features.*underflow"):
        model(t([[800.0], [1.0]]))


def test_long_sequences_run():
    X = t(np.random.default_rng(0).standard_normal((2000, 4)))
    for model in (LinearAttention.random(4, 4, heads=2), SoftmaxAttention.random(4, 4, heads=2)):
        with torch.no_grad():
            assert torch.isfinite(model(X)).all()


# -- prop-softmax-obstruction ------------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 3])
def test_prop_softmax_obstruction_rows_sum_to_the_value_maps_for_every_input(heads):
    rng = np.random.default_rng(heads)
    base = SoftmaxAttention.random(3, 2, heads=heads, seed=heads)
    layer = SoftmaxAttention(*projections(base), causal=True, position_bias=rng.standard_normal((heads, 9)))
    row_sums = call(layer, 3 * rng.standard_normal((5, 9, 3)))[1].sum(axis=2)
    _, _, W_V, W_O = projections(layer)
    values = np.einsum("hpv,hvd->pd", W_O, W_V)  # Σ_h W_O^h W_V^h, in numpy
    np.testing.assert_allclose(row_sums, np.broadcast_to(values, row_sums.shape), rtol=1e-12, atol=1e-12)


def test_prop_softmax_obstruction_an_ssm_with_memory_has_varying_row_sums():
    # The SSM's row sums Σ_{ℓ<i} L_ℓ change with i as soon as L_1 ≠ 0, so no causal softmax layer
    # (whose row sums are constant) has its operator.
    ssm = LinearSSM.random(3, 3, 2, spectral_radius=0.8, seed=2)
    lags = ref.lti_lags(*params(ssm, "A", "B", "C"), 9)
    sums = call(ssm, np.ones((9, 3)))[1].sum(axis=1)
    np.testing.assert_allclose(sums, np.cumsum(lags, axis=0), rtol=1e-12, atol=1e-14)
    assert np.abs(lags[1]).max() > 0 and np.abs(sums[1:] - sums[:-1]).max() > 1e-3


# -- RelativeHeads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,H,d,p,seed", [(1, 1, 1, 1, 0), (5, 2, 3, 2, 1), (8, 3, 2, 3, 2)])
def test_def_factorized_relative_heads_operator_and_forward(n, H, d, p, seed):
    model = RelativeHeads.random(H, 8, d, p, seed=seed)
    V, c = params(model, "V", "coefficients")
    X = np.random.default_rng(seed).standard_normal((n, d))
    Y, W = call(model, X)
    expected = np.zeros((n, n, p, d))
    for i in range(n):
        for j in range(i + 1):
            expected[i, j] = sum(c[h, i - j] * V[h] for h in range(H))
    np.testing.assert_allclose(W, expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(Y, ref.apply(expected, X), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(model.lags(n).numpy(force=True), expected[:, 0], rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(model.values().numpy(force=True), V)


def test_relative_heads_long_sequences_use_the_fft_and_agree():
    model = RelativeHeads.random(2, 1000, 3, 2, decay=0.999, seed=0)
    V, c = params(model, "V", "coefficients")
    X = np.random.default_rng(0).standard_normal((1, 800, 3))
    lag = np.subtract.outer(np.arange(800), np.arange(800))
    alpha = np.where((lag >= 0)[..., None], c.T[np.clip(lag, 0, None)], 0.0)
    with torch.no_grad():
        assert relative_error(model(t(X)), np.einsum("ijh,hpd,bjd->bip", alpha, V, X, optimize=True)) < 1e-12


def test_relative_heads_with_no_heads_are_the_zero_map():
    model = RelativeHeads(np.zeros((0, 2, 3)), np.zeros((0, 600)))
    assert model.H == 0
    for n in (4, 600):  # direct and FFT lengths
        with torch.no_grad():
            Y = model(torch.ones(n, 3, dtype=torch.float64))
        assert Y.shape == (n, 2) and torch.all(Y == 0)
    assert np.all(call(model, np.ones((4, 3)))[1] == 0)
    assert np.all(model.lags(5).numpy(force=True) == 0)


def test_def_factorized_interaction_rank_equals_heads_for_generic_values():
    X = np.random.default_rng(0).standard_normal((2, 10, 3))
    for H in (1, 2, 4, 6):
        assert interaction_rank(RelativeHeads.random(H, 10, 3, 2, seed=H), X) == H


def test_relative_heads_reproduce_an_ssm_with_k_heads():
    # The sufficiency construction of the head-count theorem: a basis of span{L_ℓ} as values and the
    # coordinates of L_ℓ in it as coefficients.
    ssm = LinearSSM.random(3, 2, 2, seed=0)
    n = 20
    lags = ref.lti_lags(*params(ssm, "A", "B", "C"), n)
    basis = operator_span(lags).basis
    coordinates = np.linalg.lstsq(basis.reshape(len(basis), -1).T, lags.reshape(n, -1).T, rcond=None)[0]
    heads = RelativeHeads(basis, coordinates)
    assert heads.H == 3
    X = t(np.random.default_rng(1).standard_normal((4, n, 2)))
    with torch.no_grad():
        assert relative_error(heads(X), ssm(X)) < 1e-12


# -- prop-factorized-rank ---------------------------------------------------------------------------


def factorized_models(H):
    return {
        "Dense": Dense.random(4, 3, seed=H),
        "SSD": SSD.random(4 * H, 3, N=3, heads=H, step_range=(0.1, 1.0), seed=H),
        "SoftmaxAttention": SoftmaxAttention.random(4 * H, 3, heads=H, seed=H),
        "SoftmaxAttention(non-causal)": SoftmaxAttention.random(4 * H, 3, heads=H, causal=False, seed=H),
        "LinearAttention": LinearAttention.random(4 * H, 3, heads=H, seed=H),
        "RelativeHeads": RelativeHeads.random(H, 6, 4 * H, 3, seed=H),
    }


@pytest.mark.parametrize("H", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_prop_factorized_rank_equals_dim_span_of_the_coefficient_vectors(H, n):
    # With independent value maps, rank = dim span{(α^1_ij(X), …, α^H_ij(X))}: lib's measured rank
    # against the coefficient vectors computed in numpy from the model's parameters.
    for name, model in factorized_models(H).items():
        X = np.random.default_rng(n + H).standard_normal((5, n, model.d))
        heads = 1 if name == "Dense" else H
        assert value_rank(model) == heads, name
        assert interaction_rank(model, X) == coefficient_rank(model, X) <= heads, name


def test_prop_factorized_rank_is_at_most_dim_span_of_the_values_when_they_are_dependent():
    # V_1 = V_2 (W_O^2 W_V^2 = W_O^1 W_V^1): the blocks lie in a 1-dimensional space whatever α does.
    W_Q, W_K, W_V, W_O = projections(SoftmaxAttention.random(4, 3, heads=2, seed=0))
    W_V[1], W_O[1] = W_V[0], W_O[0]
    model = SoftmaxAttention(W_Q, W_K, W_V, W_O)
    X = np.random.default_rng(0).standard_normal((5, 6, 4))
    assert coefficient_rank(model, X) == 2 and value_rank(model) == 1
    assert interaction_rank(model, X) == 1


@pytest.mark.parametrize("H", [1, 2, 3])
def test_prop_factorized_rank_every_block_lies_in_the_span_of_the_value_maps(H):
    inputs = np.random.default_rng(H).standard_normal((6, 7, 6))
    models = [RelativeHeads.random(H, 7, 6, 5, seed=H), SoftmaxAttention.random(6, 5, heads=H, seed=H),
              LinearAttention.random(6, 5, heads=H, seed=H), SSD.random(6, 5, N=4, heads=H, seed=H)]
    for model in models:
        V = model.values().numpy(force=True).reshape(H, -1)   # rows vec(V_h)
        blocks = call(model, inputs)[1].reshape(-1, 30)
        Q = np.linalg.qr(V.T)[0]                                # an orthonormal basis of span{V_h}
        residual = np.linalg.norm(blocks - blocks @ Q @ Q.T) / np.linalg.norm(blocks)
        assert residual < 1e-12, type(model).__name__
        assert interaction_rank(model, inputs) <= H


# -- bad input -------------------------------------------------------------------------------------

Z = np.zeros


@pytest.mark.parametrize("call_,error,match", [
    (lambda: SoftmaxAttention(Z((2, 3, 4)), Z((2, 3, 4)), Z((2, 2, 4)), Z((1, 3, 2))), ValueError,
     r"W_O must have shape \(H, p, d_v\)"),
    (lambda: LinearAttention(Z((2, 3, 4)), Z((2, 5, 4)), Z((2, 2, 4)), Z((2, 3, 2))), ValueError,
     r"W_K must have shape \(H, d_k, d\)"),
    (lambda: SoftmaxAttention(Z((1, 1, 2)), Z((1, 1, 2)), Z((1, 1, 2)), Z((1, 2, 1)), causal=False,
                              position_bias=Z((1, 4))), ValueError, "position_bias needs causal=True"),
    (lambda: SoftmaxAttention(Z((2, 1, 2)), Z((2, 1, 2)), Z((2, 1, 2)), Z((2, 2, 1)), position_bias=Z((1, 4))),
     ValueError, r"position_bias must have shape \(H, n_max\)"),
    (lambda: SoftmaxAttention(Z((2, 1, 2)), Z((2, 1, 2)), Z((2, 1, 2)), Z((2, 2, 1)), position_bias=Z(4)),
     ValueError, r"position_bias must have shape \(H, n_max\)"),
    (lambda: SoftmaxAttention.random(2, 2, causal=1), TypeError, "causal must be a bool; got int"),
    (lambda: LinearAttention.random(2, 2, causal="yes"), TypeError, "causal must be a bool; got str"),
    (lambda: SoftmaxAttention.random(2, 2, causal=False, max_length=4), ValueError, "position_bias needs causal"),
    (lambda: LinearAttention(Z((1, 1, 2)), Z((1, 1, 2)), Z((1, 1, 2)), Z((1, 2, 1)), feature_map="elu"), TypeError,
     "feature_map must be callable; got str"),
    (lambda: RelativeHeads(Z((2, 1, 1)), Z((3, 4))), ValueError, r"coefficients must have shape \(H, n_max\) = \(2, "),
    (lambda: RelativeHeads(Z((2, 2)), Z((2, 4))), ValueError, r"V must have shape \(H, p, d\)"),
    (lambda: RelativeHeads.random(1, 4, 2, 2, decay=np.nan), ValueError, "decay must be finite"),
    (lambda: RelativeHeads.random(1, 4, 2, 2, scale=-1.0), ValueError, r"scale must be finite and in \[0, inf\]"),
    (lambda: RelativeHeads.random(1, 4, 2, 2, scale="1"), TypeError, "scale must be a real number"),
    (lambda: RelativeHeads.random(1, 4, 2, 2).lags(5), ValueError, "n must be <= n_max = 4; got 5"),
    (lambda: RelativeHeads.random(1, 4, 2, 2).lags(0), ValueError, "n must be >= 1"),
    (lambda: RelativeHeads.random(1, 4, 2, 2).lags(2.0), TypeError, "n must be an integer"),
])
def test_attention_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()


# -- MultiheadAttention: multi-head softmax attention as built, against torch ----------------------

from lib import MultiheadAttention  # noqa: E402
from lib.attention import alibi_slopes  # noqa: E402


def torch_reference(d, H, seed):
    """nn.MultiheadAttention(d, H, batch_first=True), float64, every parameter N(0, 1/2)."""
    torch.manual_seed(seed)
    reference = torch.nn.MultiheadAttention(d, H, batch_first=True).double()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.7)
    return reference


# ALiBi's slopes written down by hand from Press et al.'s recipe (their `get_slopes`): for H a power
# of two, 2^(−8/H), 2^(−16/H), …; otherwise the slopes of the largest power of two P < H, then every
# other slope of 2P (the first H − P of them). Exponents of 2:
ALIBI_EXPONENTS = {
    1: [-8],
    2: [-4, -8],
    3: [-4, -8, -2],                                  # P = 2: −4, −8; of 4 (−2, −4, −6, −8): −2
    4: [-2, -4, -6, -8],
    5: [-2, -4, -6, -8, -1],                          # P = 4; of 8: −1
    6: [-2, -4, -6, -8, -1, -3],                      # P = 4; of 8: −1, −3
    8: [-1, -2, -3, -4, -5, -6, -7, -8],
    12: [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5],  # P = 8; of 16: −0.5, −1.5, …
}


def alibi_mask(H, n, b):
    """Causal + ALiBi float mask (b·H, n, n), from the hand-written slopes above."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    slopes = [2.0 ** e for e in ALIBI_EXPONENTS[H]]
    mask = np.stack([np.where(j <= i, -m * (i - j), -np.inf) for m in slopes])
    return torch.from_numpy(np.tile(mask, (b, 1, 1)))


@pytest.mark.parametrize("d, H, bias", [(8, 4, None), (8, 4, "alibi"), (6, 3, "alibi"), (4, 1, None), (5, 5, "alibi")])
def test_multihead_attention_as_built_agrees_with_torch(d, H, bias):
    reference = torch_reference(d, H, seed=d + H)
    model = MultiheadAttention(d, H, position_bias=bias)
    model.load_state_dict(reference.state_dict(), strict=True)
    b, n = 3, 9
    X = torch.randn(b, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    if bias == "alibi":
        mask = alibi_mask(H, n, b)
    else:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(X, X, X, attn_mask=mask, need_weights=False)[0]
        assert relative_error(model(X), expected) < 1e-13
        assert relative_error(model(X[1]), expected[1]) < 1e-13          # one sequence, no batch axis


def test_multihead_attention_learned_bias_agrees_with_torch():
    d, H, n, b = 8, 2, 7, 2
    reference = torch_reference(d, H, seed=5)
    model = MultiheadAttention(d, H, position_bias="learned", max_length=10)
    missing = model.load_state_dict(reference.state_dict(), strict=False)
    assert missing.missing_keys == ["position_bias"] and not missing.unexpected_keys
    beta = np.random.default_rng(0).standard_normal((H, 10))
    with torch.no_grad():
        model.position_bias.copy_(torch.from_numpy(beta))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mask = np.stack([np.where(j <= i, beta[h][np.clip(i - j, 0, None)], -np.inf) for h in range(H)])
    X = torch.randn(b, n, d, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(X, X, X, attn_mask=torch.from_numpy(np.tile(mask, (b, 1, 1))), need_weights=False)[0]
        assert relative_error(model(X), expected) < 1e-13


@pytest.mark.parametrize("bias", [None, "alibi"])
def test_multihead_attention_operator_plus_offset_is_the_forward_pass(bias):
    # y_i = Σ_j 𝒲_ij x_j + offset, computed here by explicit sums with numpy; the offset is
    # Σ_h W_O^h b_V^h + b_O because each row of weights sums to one.
    d, H, n = 6, 3, 5
    model = MultiheadAttention(d, H, position_bias=bias)
    model.load_state_dict(torch_reference(d, H, seed=2).state_dict())
    X = torch.randn(2, n, d, dtype=torch.float64)
    with torch.no_grad():
        W, offset, Y = model.operator(X).numpy(), model.offset(X).numpy(), model(X).numpy()
        alpha = model.weights(X).numpy()
    x = X.numpy()
    summed = np.einsum("bijpd,bjd->bip", W, x) + offset
    assert np.abs(summed - Y).max() < 1e-12 * np.abs(Y).max()
    np.testing.assert_allclose(alpha.sum(-1), 1.0, atol=1e-14)
    assert np.abs(np.triu(alpha, 1)).max() == 0.0                              # causal
    W_in, b_in = model.in_proj_weight.detach().numpy(), model.in_proj_bias.detach().numpy()
    W_O, b_O = model.out_proj.weight.detach().numpy(), model.out_proj.bias.detach().numpy()
    r = d // H
    values = [W_O[:, h * r:(h + 1) * r] @ W_in[2 * d + h * r:2 * d + (h + 1) * r] for h in range(H)]
    np.testing.assert_allclose(model.values().detach().numpy(), values, atol=1e-14)
    np.testing.assert_allclose(offset[0, 0], W_O @ b_in[2 * d:] + b_O, atol=1e-13)
    assert [np.linalg.matrix_rank(v) for v in values] == [r] * H


def test_alibi_slopes_are_powers_of_two():
    np.testing.assert_allclose(alibi_slopes(8).numpy(), [2.0 ** -k for k in range(1, 9)], rtol=0)
    np.testing.assert_allclose(alibi_slopes(4).numpy(), [2.0 ** -(2 * k) for k in range(1, 5)], rtol=0)


@pytest.mark.parametrize("H", sorted(ALIBI_EXPONENTS))
def test_alibi_slopes_follow_the_published_recipe(H):
    # H = 3, 5, 6, 12 are not powers of two: the slopes interleave, they are not 2^(−8h/H)
    np.testing.assert_allclose(alibi_slopes(H).numpy(), [2.0 ** e for e in ALIBI_EXPONENTS[H]], rtol=1e-15)


@pytest.mark.parametrize("call_, error, match", [
    (lambda: MultiheadAttention(6, 4), ValueError, "H must divide d"),
    (lambda: MultiheadAttention(6, 0), ValueError, "H must be >= 1"),
    (lambda: MultiheadAttention(6, 2, position_bias="rope"), ValueError, "position_bias must be"),
    (lambda: MultiheadAttention(6, 2, position_bias="learned"), ValueError, "max_length must be given"),
    (lambda: MultiheadAttention(6, 2, max_length=4), ValueError, "max_length must be given"),
    (lambda: MultiheadAttention(6, 2, dtype=torch.int64), TypeError, "dtype must be"),
    (lambda: MultiheadAttention(6, 2, position_bias="learned", max_length=3)(torch.zeros(4, 6, dtype=torch.float64)),
     ValueError, "length n <= 3"),
    (lambda: MultiheadAttention(6, 2)(torch.zeros(4, 5, dtype=torch.float64)), ValueError, "X must have shape"),
    (lambda: alibi_slopes(0), ValueError, "H must be >= 1"),
])
def test_multihead_attention_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()
