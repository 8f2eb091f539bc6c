"""Jacobian profiles (lib.jacobians): against closed forms, the full autograd Jacobian and central
differences of the numpy reference."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from lib import (SSD, CausalConv1d, Dense, DiagonalSSM, ElmanRNN, FeedForward, KANLayer, LinearAttention,
                 LinearSSM, RelativeHeads, SelectiveSSM, SharedStateSSM, SoftmaxAttention, Stack, jacobian_blocks,
                 jacobian_norms)
from lib.jacobians import block_norms

mpow = np.linalg.matrix_power



def full_jacobian(model, X):
    """The full Jacobian from torch.autograd.functional (all n·p outputs), shape (n, p, n, d)."""
    return torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X)).numpy()


def with_position_scores(seed):
    model = SoftmaxAttention.random(3, 2, 1, max_length=8, seed=seed)
    with torch.no_grad():
        model.position_bias.copy_(torch.from_numpy(np.random.default_rng(seed).standard_normal((1, 8))))
    return model


MODELS = {
    "LinearSSM": lambda: LinearSSM.random(4, 3, 2, seed=1),
    "SelectiveSSM": lambda: SelectiveSSM.random(3, 4, step_range=(0.05, 0.5), seed=2),
    "SSD": lambda: SSD.random(4, 3, N=3, heads=2, step_range=(0.05, 0.5), seed=3),
    "DiagonalSSM": lambda: DiagonalSSM.random(3, 4, step_range=(0.1, 0.5), seed=3),
    "SharedStateSSM": lambda: SharedStateSSM.random(3, 4, step_range=(0.1, 0.5), seed=3),
    "SoftmaxAttention causal": lambda: SoftmaxAttention.random(3, 2, heads=2, seed=4),
    "SoftmaxAttention non-causal": lambda: SoftmaxAttention.random(3, 2, heads=2, causal=False, seed=5),
    "SoftmaxAttention position scores": lambda: with_position_scores(6),
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
    "Stack residual": lambda: Stack([SoftmaxAttention.random(3, 3, heads=1, seed=18),
                                     SelectiveSSM.random(3, 2, step_range=(0.1, 0.5), seed=19)], residual=True),
}


@pytest.mark.parametrize("name", MODELS)
def test_jacobian_blocks_equal_the_full_autograd_jacobian_for_every_model(name):
    model = MODELS[name]()
    X = np.random.default_rng(0).standard_normal((6, model.d))
    J = full_jacobian(model, X)
    for i in (0, 3, 5):
        blocks = jacobian_blocks(model, X, i)
        assert blocks.shape == (i + 1, model.p, model.d) and blocks.dtype == np.float64
        np.testing.assert_allclose(blocks, J[i, :, : i + 1].transpose(1, 0, 2), rtol=1e-10, atol=1e-14)
        expected = np.linalg.norm(J[i, :, : i + 1].transpose(1, 0, 2), axis=(1, 2))
        np.testing.assert_allclose(jacobian_norms(model, X, i), expected, rtol=1e-10, atol=1e-14)


def test_jacobian_blocks_match_central_differences_of_the_numpy_reference():
    # The selective SSM and the Elman RNN as the reference writes them (plain numpy loops), one output
    # entry y_i[k] at a time: its gradient in X is row k of J_ij for every j <= i, 0 beyond i.
    rng = np.random.default_rng(1)
    X = rng.standard_normal((5, 3))
    ssm = SelectiveSSM.random(3, 2, step_range=(0.1, 0.5), seed=2)
    A_log, W_delta, dt_bias, W_B, W_C = (t.numpy(force=True) for t in (ssm.A_log, ssm.W_delta, ssm.dt_bias,
                                                                         ssm.W_B, ssm.W_C))
    rnn = ElmanRNN.random(4, 3, 2, seed=3)
    W, U, C = (t.numpy(force=True) for t in (rnn.W, rnn.U, rnn.C))
    cases = [(ssm, lambda Z: reference.selective_forward(A_log, W_delta, dt_bias, W_B, W_C, Z)),
             (rnn, lambda Z: reference.rnn_forward(W, U, C, Z))]
    for model, forward in cases:
        for i in (0, 2, 4):
            blocks = jacobian_blocks(model, X, i)
            for k in range(model.p):
                grad = reference.central_difference_gradient(lambda Z: forward(Z)[i, k], X, h=1e-6)
                np.testing.assert_allclose(blocks[:, k], grad[: i + 1], rtol=1e-6, atol=1e-8)
                np.testing.assert_allclose(grad[i + 1:], 0.0, atol=1e-9)  # causal


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), N=st.integers(1, 4), d=st.integers(1, 3), p=st.integers(1, 3),
       radius=st.floats(0.1, 1.2), scale=st.sampled_from([0.0, 1.0, 1e3]), seed=st.integers(0, 999))
def test_jacobian_of_an_lti_ssm_is_C_A_pow_B_for_every_input(n, N, d, p, radius, scale, seed):
    model = LinearSSM.random(N, d, p, spectral_radius=radius, seed=seed)
    A, B, C = (t.numpy(force=True) for t in (model.A, model.B, model.C))
    X = scale * np.random.default_rng(seed).standard_normal((n, d))
    expected = np.stack([C @ mpow(A, n - 1 - j) @ B for j in range(n)])   # J_ij = C A^{i−j} B
    np.testing.assert_allclose(jacobian_blocks(model, X, n - 1), expected, rtol=1e-10,
                               atol=1e-13 * np.abs(expected).max())
    np.testing.assert_allclose(jacobian_norms(model, X, n - 1), np.linalg.norm(expected, axis=(1, 2)), rtol=1e-10,
                               atol=1e-300)


def test_jacobian_norms_accept_torch_and_leave_it_alone():
    model = SoftmaxAttention.random(3, 3, heads=1, seed=0)
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    before = X.detach().clone()
    norms = jacobian_norms(model, X, 4)
    assert isinstance(norms, np.ndarray) and norms.shape == (5,) and norms.dtype == np.float64
    assert X.grad is None and torch.equal(X.detach(), before)
    np.testing.assert_array_equal(norms, jacobian_norms(model, X.detach().numpy(), 4))


def test_jacobian_of_a_map_that_ignores_X_is_zero():
    np.testing.assert_array_equal(jacobian_norms(Dense(np.zeros((2, 2))), np.ones((3, 2)), 2), np.zeros(3))
    zero_heads = RelativeHeads(np.zeros((0, 2, 3)), np.zeros((0, 4)))     # H = 0: y ignores X entirely
    np.testing.assert_array_equal(jacobian_blocks(zero_heads, np.ones((4, 3)), 3), np.zeros((4, 2, 3)))


def test_jacobian_norms_of_a_float32_model():
    model = LinearSSM.random(3, 2, 2, seed=0, dtype=torch.float32)
    A, B, C = (t.numpy(force=True).astype(np.float64) for t in (model.A, model.B, model.C))
    norms = jacobian_norms(model, np.ones((10, 2)), 9)
    assert norms.dtype == np.float64
    expected = [np.linalg.norm(C @ mpow(A, ell) @ B) for ell in range(10)]
    np.testing.assert_allclose(norms[::-1], expected, rtol=1e-5)


def test_far_norms_do_not_underflow_when_squared():
    # Blocks of size ~1e-200: squaring their entries underflows, the norms must not.
    model = LinearSSM.diagonal([0.1], [[1.0]], [[1.0]])
    np.testing.assert_allclose(jacobian_norms(model, np.zeros((200, 1)), 199)[::-1], 0.1 ** np.arange(200),
                               rtol=1e-12)
    M = np.random.default_rng(0).standard_normal((3, 2, 4))
    scales = np.array([1e-200, 1.0, 1e200])
    expected = scales * np.sqrt((M ** 2).sum(axis=(1, 2)))
    np.testing.assert_allclose(block_norms(scales[:, None, None] * M), expected, rtol=1e-14)
    np.testing.assert_array_equal(block_norms(np.zeros((2, 3, 3))), np.zeros(2))


@pytest.mark.parametrize("call, error, match", [
    (lambda m: jacobian_norms(m, np.zeros((5, 2)), 5), ValueError, r"i must satisfy 0 <= i < n = 5"),
    (lambda m: jacobian_blocks(m, np.zeros((5, 2)), -1), ValueError, "i must be >= 0"),
    (lambda m: jacobian_norms(m, np.zeros((5, 2)), 2.0), TypeError, "i must be an integer"),
    (lambda m: jacobian_blocks(m, np.zeros((5, 2)), True), TypeError, "i must be an integer"),
    (lambda m: jacobian_norms(m, np.zeros((5, 3)), 0), ValueError, r"X must have shape \(n, 2\)"),
    (lambda m: jacobian_blocks(m, np.zeros((2, 5, 2)), 0), ValueError, r"X must have shape \(n, 2\) \(one sequence\)"),
    (lambda m: jacobian_norms(m, np.zeros((0, 2)), 0), ValueError, r"X must have shape \(n, 2\)"),
    (lambda m: jacobian_norms(m, np.full((5, 2), np.inf), 0), ValueError, "X must be finite"),
    (lambda m: jacobian_blocks(m, np.zeros((5, 2), dtype=int), 0), TypeError, "X must have a real floating dtype"),
    (lambda m: jacobian_norms(m, "X", 0), TypeError, "X must be a torch tensor or numpy array"),
    (lambda m: jacobian_norms(lambda Z: Z, np.zeros((5, 2)), 0), TypeError, "model must be a SequenceMap"),
    (lambda m: jacobian_blocks(torch.nn.Linear(2, 2), np.zeros((5, 2)), 0), TypeError, "model must be a SequenceMap"),
    (lambda m: jacobian_norms(RelativeHeads.random(1, 4, 2, 2), np.zeros((5, 2)), 0), ValueError,
     "X must have length n <= 4"),
])
def test_bad_inputs_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(LinearSSM.random(3, 2, 2))
