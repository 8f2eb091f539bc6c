"""The Elman RNN against an independent numpy unrolling (lib.recurrent)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference_operators as ref
from lib import ElmanRNN, interaction_rank
from lib.recurrent import _tanh_secant


def numpy_rnn(model, X):
    """States, pre-activations and outputs by the textbook loop."""
    W, U, C = model.W, model.U, model.C
    s = np.zeros(model.N)
    states, pre = [], []
    for x in X:
        z = W @ s + U @ x
        s = np.tanh(z)
        pre.append(z)
        states.append(s)
    return np.array(states), np.array(pre), np.array(states) @ C.T


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 7), N=st.integers(1, 4), d=st.integers(1, 3), p=st.integers(1, 3), seed=st.integers(0, 999))
def test_prop_rnn_operator_is_product_of_secant_factors(n, N, d, p, seed):
    model = ElmanRNN.random(N, d, p, spectral_radius=1.2, seed=seed)
    X = np.random.default_rng(seed).standard_normal((n, d))
    _, z, Y = numpy_rnn(model, X)
    np.testing.assert_allclose(model(X), Y, rtol=1e-12, atol=1e-13)
    D = [np.diag(np.tanh(zi) / zi) for zi in z]
    W = model.operator(X)
    for i in range(n):
        for j in range(n):
            if j > i:
                assert np.all(W[i, j] == 0)
                continue
            # C D_i W D_{i−1} W ⋯ D_{j+1} W D_j U, multiplied out left to right.
            M = model.C @ D[i]
            for t in range(i - 1, j - 1, -1):
                M = M @ model.W @ D[t]
            np.testing.assert_allclose(W[i, j], M @ model.U, rtol=1e-9, atol=1e-12)


def test_prop_rnn_operator_is_input_dependent_unlike_its_linearisation():
    model = ElmanRNN.random(4, 2, 2, seed=0)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 2))
    # Scaling the input changes the operator (tanh saturates): not a linear map.
    assert not np.allclose(model.operator(X), model.operator(3 * X))
    # Tiny inputs: tanh(z)/z ≈ 1, so the operator approaches C W^{i−j} U.
    W = model.operator(1e-7 * X)
    expected = model.C @ np.linalg.matrix_power(model.W, 3) @ model.U
    np.testing.assert_allclose(W[4, 1], expected, rtol=1e-8, atol=1e-12)


def test_tanh_secant_is_stable_near_zero():
    z = torch.tensor([0.0, 1e-12, -1e-9, 1e-7, 0.5, -3.0, 40.0], dtype=torch.float64, requires_grad=True)
    values = _tanh_secant(z)
    expected = np.array([1.0, 1.0, 1.0, np.tanh(1e-7) / 1e-7, np.tanh(0.5) / 0.5, np.tanh(3.0) / 3.0, 1 / 40])
    np.testing.assert_allclose(values.detach().numpy(), expected, rtol=1e-14)
    values.sum().backward()
    assert torch.isfinite(z.grad).all()


# -- against the plain-numpy reference, on adversarial inputs, and the rank bound ------------


@pytest.mark.parametrize("N,d,p,radius", [(1, 1, 1, 0.9), (3, 2, 4, 1.2), (4, 3, 2, 3.0)])
def test_prop_rnn_matches_the_reference_on_adversarial_inputs(N, d, p, radius):
    model = ElmanRNN.random(N, d, p, spectral_radius=radius, seed=N + d)
    families = ref.input_families(7, d, np.random.default_rng(p))
    ratio, errors = ref.worst_ratio(model, families)
    assert ratio <= 1, errors


@pytest.mark.parametrize("N,d,p,rank_C", [(2, 3, 3, 2), (3, 3, 3, 1), (2, 4, 1, 1)])
def test_prop_rnn_interaction_rank_is_at_most_rank_C_times_rank_U(N, d, p, rank_C):
    # N < min(d, p) or a rank-deficient readout make the bound rank C · rank U smaller than pd.
    rng = np.random.default_rng(N * d + rank_C)
    C = rng.standard_normal((p, rank_C)) @ rng.standard_normal((rank_C, N))
    model = ElmanRNN(rng.standard_normal((N, N)), rng.standard_normal((N, d)), C)
    X = rng.standard_normal((6, 8, d)) * 2
    bound = np.linalg.matrix_rank(model.C) * np.linalg.matrix_rank(model.U)
    assert bound < p * d
    assert interaction_rank(model, X) <= bound
    # Every block lies in {C M U}: projecting onto col(C) on the left and row(U) on the right keeps it.
    W = np.asarray(model.operator(X[0]))
    P_C, P_U = model.C @ np.linalg.pinv(model.C), np.linalg.pinv(model.U) @ model.U
    np.testing.assert_allclose(np.einsum("ab,ijbc,cd->ijad", P_C, W, P_U), W, atol=1e-12)
