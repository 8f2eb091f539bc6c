"""Stack: composition and residual connections of sequence maps (lib.stacks)."""

from math import comb

import numpy as np
import pytest
import torch

from lib import (SSD, CausalConv1d, Dense, DiagonalSSM, ElmanRNN, FeedForward, KANLayer, LinearAttention,
                 LinearSSM, RelativeHeads, SelectiveSSM, SoftmaxAttention, Stack, apply_operator, relative_error)

# d → d layers (d = 3) to compose.
LAYERS = {
    "LinearSSM": lambda s: LinearSSM.random(3, 3, 3, seed=s),
    "SelectiveSSM": lambda s: SelectiveSSM.random(3, 2, seed=s),
    "SSD": lambda s: SSD.random(3, 3, N=2, seed=s),
    "SoftmaxAttention": lambda s: SoftmaxAttention.random(3, 3, heads=1, seed=s),
    "LinearAttention": lambda s: LinearAttention.random(3, 3, seed=s),
    "ElmanRNN": lambda s: ElmanRNN.random(3, 3, 3, seed=s),
    "FeedForward": lambda s: FeedForward.random(3, 3, seed=s),
    "Dense": lambda s: Dense.random(3, 3, seed=s),
    "CausalConv1d": lambda s: CausalConv1d.random(3, 3, seed=s),
    "KANLayer": lambda s: KANLayer.random(3, 3, seed=s),
    "RelativeHeads": lambda s: RelativeHeads.random(2, 8, 3, 3, seed=s),
    "DiagonalSSM": lambda s: DiagonalSSM.random(3, 4, seed=s),
}
STACKS = [  # (layers, residual, n): every layer kind, plain and residual, n = 1 and longer
    (["LinearSSM"], False, 5), (["KANLayer"], True, 1), (["SelectiveSSM", "SoftmaxAttention"], False, 6),
    (["SSD", "FeedForward", "LinearAttention"], True, 4), (["ElmanRNN", "CausalConv1d"], True, 6),
    (["Dense", "RelativeHeads", "DiagonalSSM"], False, 3), (["SoftmaxAttention", "KANLayer", "SSD"], True, 5),
]


def product_of_layer_operators(stack, X):
    """Π_k (I +) 𝒲ᵏ(Z_{k−1}) as (n·p) × (n·d) matrices in numpy, each layer's operator at its own input."""
    n, Z, M = len(X), X, np.eye(X.numel())
    with torch.no_grad():
        for layer in stack.layers:
            W = layer.operator(Z).numpy()  # (n, n, p, d)
            block = W.transpose(0, 2, 1, 3).reshape(n * layer.p, n * layer.d)
            out = layer(Z)
            if stack.residual:
                block, Z = block + np.eye(n * layer.d), Z + out
            else:
                Z = out
            M = block @ M
    return M.reshape(n, stack.p, n, stack.d).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("kinds,residual,n", STACKS)
def test_stack_operator_is_the_product_of_layer_operators_and_obeys_the_identity(kinds, residual, n):
    stack = Stack([LAYERS[k](m) for m, k in enumerate(kinds)], residual=residual)
    X = torch.from_numpy(np.random.default_rng(n).standard_normal((2, n, 3)))
    with torch.no_grad():
        W, Y = stack.operator(X), stack(X)
    for k in range(2):
        np.testing.assert_allclose(W[k].numpy(), product_of_layer_operators(stack, X[k]), rtol=1e-10, atol=1e-12)
    assert relative_error(apply_operator(W, X), Y) < 1e-11


def test_stack_forward_is_the_composition():
    layers = [LinearSSM.random(3, 3, 3, seed=0), FeedForward.random(3, 3, seed=1)]
    X = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 3)))
    with torch.no_grad():
        np.testing.assert_allclose(Stack(layers)(X), layers[1](layers[0](X)), rtol=1e-13, atol=0)
        Z = X + layers[0](X)
        np.testing.assert_allclose(Stack(layers, residual=True)(X), Z + layers[1](Z), rtol=1e-13, atol=0)


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_stacked_scalar_ssms_have_binomial_times_exponential_lags(L):
    # L copies of s_i = a s_{i−1} + b x_i, y = c s: lags (cb)^L C(ℓ+L−1, L−1) a^ℓ — the
    # polynomial factor ℓ^{L−1} times the same exponential ρ^ℓ.
    a, b, c, n = 0.9, 0.7, 1.3, 60
    layer = LinearSSM([[a]], [[b]], [[c]])
    with torch.no_grad():
        lags = Stack([layer] * L).operator(torch.ones(n, 1, dtype=torch.float64))[-1, :, 0, 0].numpy()[::-1]
    expected = [(c * b) ** L * comb(ell + L - 1, L - 1) * a ** ell for ell in range(n)]
    np.testing.assert_allclose(lags, expected, rtol=1e-10)


def test_stack_flags_sizes_and_gradients():
    limited = Stack([RelativeHeads.random(1, 6, 2, 2), LinearSSM.random(2, 2, 2), RelativeHeads.random(1, 4, 2, 2)])
    assert limited.max_length == 4 and limited.causal
    assert Stack([LinearSSM.random(2, 2, 2)]).max_length is None
    assert not Stack([Dense.random(2, 2), SoftmaxAttention.random(2, 2, causal=False)]).causal
    stack = Stack([Dense.random(3, 2), LinearSSM.random(2, 2, 4)])
    assert (stack.d, stack.p) == (3, 4)
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    Y = stack(X)
    assert Y.shape == (5, 4)
    Y.sum().backward()
    assert torch.isfinite(X.grad).all() and X.grad.abs().sum() > 0
    assert all(p.grad is not None for p in stack.parameters())
    float32 = Stack([Dense.random(2, 2, dtype=torch.float32)] * 2)
    assert float32.dtype == torch.float32 and float32(torch.ones(3, 2)).dtype == torch.float32


@pytest.mark.parametrize("call_,error,match", [
    (lambda: Stack([]), TypeError, "layers must be a non-empty sequence of SequenceMaps; got \\[\\]"),
    (lambda: Stack(Dense.random(2, 2)), TypeError, "layers must be a non-empty sequence of SequenceMaps; got Dense"),
    (lambda: Stack(None), TypeError, "layers must be a non-empty sequence"),
    (lambda: Stack([Dense.random(2, 2), "dense"]), TypeError, r"layers must be .* got \['Dense', 'str'\]"),
    (lambda: Stack([Dense.random(2, 3), Dense.random(2, 2)]), ValueError,
     r"layers\[1\] must take d = 3 inputs; got d = 2"),
    (lambda: Stack([Dense.random(2, 3)], residual=True), ValueError, r"layers\[0\] must have p == d in a residual"),
    (lambda: Stack([Dense.random(2, 2), Dense.random(2, 2, dtype=torch.float32)]), TypeError,
     r"layers\[1\] must have dtype torch.float64 like layers\[0\]"),
    (lambda: Stack([Dense.random(2, 2)], residual=1), TypeError, "residual must be a bool; got int"),
    (lambda: Stack([Dense.random(2, 2)])(torch.zeros(3, 3, dtype=torch.float64)), ValueError, "X must have shape"),
    (lambda: Stack([RelativeHeads.random(1, 4, 2, 2)])(torch.zeros(5, 2, dtype=torch.float64)), ValueError,
     "X must have length n <= 4"),
])
def test_stack_bad_input_names_the_argument(call_, error, match):
    with pytest.raises(error, match=match):
        call_()
