"""The Elman RNN against the page's formulas in numpy (lib.recurrent)."""

import numpy as np
import pytest
import torch

import reference as ref
from lib import ElmanRNN, LinearSSM, interaction_rank


def t(a):
    return torch.from_numpy(np.asarray(a, dtype=float))


def rnn(model):
    return [getattr(model, name).numpy(force=True) for name in ("W", "U", "C")]


def call(model, X):
    with torch.no_grad():
        return model(t(X)).numpy(), model.operator(t(X)).numpy()


@pytest.mark.parametrize("N,d,p,radius", [(1, 1, 1, 0.9), (3, 2, 4, 1.2), (4, 3, 2, 3.0)])
def test_prop_rnn_operator_is_the_product_of_secant_factors_on_adversarial_inputs(N, d, p, radius):
    # 𝒲_ij = C Φ_i W Φ_{i−1} ⋯ W Φ_j U with Φ_i = diag(tanh(z_i)/z_i), and y_i = C tanh(z_i), in numpy,
    # on random, zero, constant, short and large (saturating) inputs.
    model = ElmanRNN.random(N, d, p, spectral_radius=radius, seed=N + d)
    W, U, C = rnn(model)
    for family, X in ref.input_families(7, d, np.random.default_rng(p)).items():
        Y, ops = call(model, X)
        for x, y, w in zip(X, Y, ops):
            assert ref.itemwise_error(y, ref.rnn_forward(W, U, C, x), 1) <= 1e-10, family
            assert ref.itemwise_error(w, ref.rnn_operator(W, U, C, x), 2) <= 1e-10, family


def test_prop_rnn_operator_is_input_dependent_and_tends_to_the_linearisation_at_zero():
    model = ElmanRNN.random(4, 2, 2, seed=0)
    W, U, C = rnn(model)
    X = np.random.default_rng(1).standard_normal((5, 2))
    assert not np.allclose(call(model, X)[1], call(model, 3 * X)[1])  # tanh saturates: not a linear map
    # Tiny inputs: tanh(z)/z ≈ 1, so 𝒲_ij → C W^{i−j} U; at X = 0 exactly (z = 0, where the secant is 1).
    expected = C @ np.linalg.matrix_power(W, 3) @ U
    np.testing.assert_allclose(call(model, 1e-7 * X)[1][4, 1], expected, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(call(model, 0 * X)[1][4, 1], expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(call(model, 0 * X)[1], ref.lti_operator(W, U, C, 5), rtol=1e-13, atol=1e-15)


def test_rnn_operator_has_finite_gradients_where_pre_activations_vanish():
    # The secant tanh(z)/z is taken as 1 − z²/3 below |z| = 1e-8: no 0/0, in values or gradients.
    model = ElmanRNN.random(3, 2, 2, seed=0)
    X = torch.zeros(4, 2, dtype=torch.float64)
    X[1, 0] = 1e-12
    X.requires_grad_()
    (g,) = torch.autograd.grad(model.operator(X).sum(), X)
    assert torch.isfinite(g).all()


def test_rnn_random_draws_are_those_of_linear_ssm():
    # ElmanRNN.random(N, d, p) documents LinearSSM.random's draws as (W, U, C), rescaled to the spectral radius.
    rnn_model = ElmanRNN.random(3, 2, 2, spectral_radius=0.7, seed=5)
    ssm = LinearSSM.random(3, 2, 2, spectral_radius=0.7, seed=5)
    for a, b in zip(rnn(rnn_model), (ssm.A, ssm.B, ssm.C)):
        np.testing.assert_array_equal(a, b.numpy(force=True))
    assert np.abs(np.linalg.eigvals(rnn(rnn_model)[0])).max() == pytest.approx(0.7, rel=1e-12)


@pytest.mark.parametrize("N,d,p,rank_C", [(2, 3, 3, 2), (3, 3, 3, 1), (2, 4, 1, 1)])
def test_prop_rnn_interaction_rank_is_at_most_rank_C_times_rank_U(N, d, p, rank_C):
    # N < min(d, p) or a rank-deficient readout make the bound rank C · rank U smaller than pd.
    rng = np.random.default_rng(N * d + rank_C)
    C = rng.standard_normal((p, rank_C)) @ rng.standard_normal((rank_C, N))
    U = rng.standard_normal((N, d))
    model = ElmanRNN(rng.standard_normal((N, N)), U, C)
    X = rng.standard_normal((6, 8, d)) * 2
    bound = np.linalg.matrix_rank(C) * np.linalg.matrix_rank(U)
    assert bound < p * d
    assert interaction_rank(model, X) <= bound
    # Every block lies in {C M U}: projecting onto col(C) on the left and row(U) on the right keeps it.
    W = call(model, X[0])[1]
    P_C, P_U = C @ np.linalg.pinv(C), np.linalg.pinv(U) @ U
    np.testing.assert_allclose(np.einsum("ab,ijbc,cd->ijad", P_C, W, P_U), W, atol=1e-12)


@pytest.mark.parametrize("call_,error,match", [
    (lambda: ElmanRNN(np.zeros((3, 3)), np.zeros((3, 2)), np.zeros((2, 4))), ValueError,
     r"C must have shape \(p, N\) = \(-?\d+, 3\)"),
    (lambda: ElmanRNN(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((2, 3))), ValueError, r"W must have shape \(N, N\)"),
    (lambda: ElmanRNN.random(3, 2, 2, spectral_radius=-1.0), ValueError, "spectral_radius must be finite"),
    (lambda: ElmanRNN.random(3, 2, 2, spectral_radius=None), TypeError, "spectral_radius must be a real number"),
])
def test_rnn_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()
