"""Stacks: operator = product of the layers' operators, gradient paths through hybrids (lib.stacks)."""

from itertools import combinations
from math import comb

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import (SSD, CausalConv1d, Dense, ElmanRNN, FeedForward, KANLayer, LinearAttention, LinearSSM,
                 RelativeHeads, SelectiveSSM, SoftmaxAttention, apply_operator, identity_error, s4d_ssm)
from lib.gradients import jacobian_norms, planted_key_input, ssm_decay_bound, stack_decay_bound
from lib.stacks import Stack, ssm_layer

FAST = settings(max_examples=20, deadline=None)

# d → d layers (d = 3) to compose.
LAYERS = [
    lambda s: LinearSSM.random(3, 3, 3, seed=s),
    lambda s: SelectiveSSM.random(3, 2, seed=s),
    lambda s: SSD.random(3, 3, N=2, seed=s),
    lambda s: SoftmaxAttention.random(3, 3, heads=1, seed=s),
    lambda s: LinearAttention.random(3, 3, seed=s),
    lambda s: ElmanRNN.random(3, 3, 3, seed=s),
    lambda s: FeedForward.random(3, 3, seed=s),
    lambda s: Dense.random(3, 3, seed=s),
    lambda s: CausalConv1d.random(3, 3, seed=s),
    lambda s: KANLayer.random(3, 3, seed=s),
    lambda s: RelativeHeads.random(2, 8, 3, 3, seed=s),
]


def product_of_layer_operators(stack, X):
    """Π_k (I +) 𝒲ᵏ(Z_{k−1}) as (n·p) × (n·d) matrices, each layer evaluated with numpy calls."""
    n, Z, M = len(X), X, np.eye(len(X) * X.shape[1])
    for layer in stack.layers:
        W = layer.operator(Z)  # (n, n, p, d)
        block = W.transpose(0, 2, 1, 3).reshape(n * layer.p, n * layer.d)
        out = layer(Z)
        if stack.residual:
            block, Z = block + np.eye(n * layer.d), Z + out
        else:
            Z = out
        M = block @ M
    return M.reshape(n, stack.p, n, stack.d).transpose(0, 2, 1, 3)


@FAST
@given(kinds=st.lists(st.integers(0, len(LAYERS) - 1), min_size=1, max_size=3), residual=st.booleans(),
       n=st.integers(1, 6), batched=st.booleans(), seed=st.integers(0, 999))
def test_stack_operator_is_the_product_of_layer_operators_and_obeys_the_identity(kinds, residual, n, batched, seed):
    stack = Stack([LAYERS[k](seed + m) for m, k in enumerate(kinds)], residual=residual)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((2, n, 3) if batched else (n, 3))
    assert identity_error(stack, X) < 1e-11
    if not batched:
        np.testing.assert_allclose(stack.operator(X), product_of_layer_operators(stack, X), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(apply_operator(stack.operator(X), X), stack(X), rtol=1e-10, atol=1e-12)


def test_stack_forward_is_the_composition():
    layers = [LinearSSM.random(3, 3, 3, seed=0), FeedForward.random(3, 3, seed=1)]
    X = np.random.default_rng(0).standard_normal((5, 3))
    np.testing.assert_allclose(Stack(layers)(X), layers[1](layers[0](X)), rtol=1e-13)
    Z = X + layers[0](X)
    np.testing.assert_allclose(Stack(layers, residual=True)(X), Z + layers[1](Z), rtol=1e-13)


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_stacked_scalar_ssms_have_binomial_times_exponential_lags(L):
    # L copies of s_i = a s_{i−1} + b x_i, y = c s: lags (cb)^L C(ℓ+L−1, L−1) a^ℓ — the
    # polynomial factor ℓ^{L−1} times the same exponential ρ^ℓ.
    a, b, c = 0.9, 0.7, 1.3
    layer = LinearSSM([[a]], [[b]], [[c]])
    n = 200
    norms = jacobian_norms(Stack([layer] * L), np.ones((n, 1)), n - 1)[::-1]
    expected = [abs(c * b) ** L * comb(ell + L - 1, L - 1) * a ** ell for ell in range(n)]
    np.testing.assert_allclose(norms, expected, rtol=1e-10)


def test_stack_of_stable_ssms_decays_but_one_attention_layer_restores_a_path():
    hybrid = Stack.hybrid(4, 4, attention_every=4, state_size=6, spectral_radius=0.9, seed=0)
    attention = hybrid.layers[0]
    assert isinstance(attention, SoftmaxAttention)
    ssm_only = Stack(hybrid.layers[1:], residual=True)  # the same SSM layers without attention
    V = np.linalg.norm(attention.values()[0])
    n = 512
    i = n - 1
    with_attention, without = {}, {}
    for D in (64, 128, 256, 511):
        X = planted_key_input(attention, n, i, i - D, strength=30.0, seed=D)
        with_attention[D] = jacobian_norms(hybrid, X, i)[i - D]
        without[D] = jacobian_norms(ssm_only, X, i)[::-1]
    # A distance-independent lower bound through attention.  (Its size varies with the
    # background: later queries also attend to the large planted key and add SSM-carried paths.)
    assert min(with_attention.values()) >= 0.5 * V
    # Exponential (times a polynomial) without it, for these and all other inputs.
    for D in (256, 511):
        assert without[D][D] < 1e-6 * without[D][0]


def test_hybrid_layout_and_seeding():
    stack = Stack.hybrid(4, 6, attention_every=3, heads=2, state_size=5, seed=7)
    kinds = [type(layer).__name__ for layer in stack.layers]
    assert kinds == ["SoftmaxAttention", "LinearSSM", "LinearSSM"] * 2
    assert stack.residual and stack.causal and stack.max_length is None
    assert stack.layers[0].H == 2 and stack.layers[1].N == 5
    assert abs(np.abs(np.linalg.eigvals(stack.layers[1].A)).max() - 0.9) < 1e-12
    shifted = Stack.hybrid(4, 6, attention_every=3, offset=1, seed=7)
    assert [type(layer).__name__ for layer in shifted.layers] == ["LinearSSM", "SoftmaxAttention", "LinearSSM"] * 2
    again = Stack.hybrid(4, 6, attention_every=3, heads=2, state_size=5, seed=7)
    X = np.random.default_rng(0).standard_normal((6, 4))
    np.testing.assert_array_equal(stack(X), again(X))
    assert not np.allclose(stack.layers[1].A, stack.layers[2].A)  # independent layer streams
    assert not np.allclose(stack(X), Stack.hybrid(4, 6, attention_every=3, heads=2, state_size=5, seed=8)(X))
    assert "(0): SoftmaxAttention(H=2" in repr(stack) and "residual=True" in repr(stack)


def test_stack_kinds_flags_and_gradients():
    limited = Stack([RelativeHeads.random(1, 6, 2, 2), LinearSSM.random(2, 2, 2), RelativeHeads.random(1, 4, 2, 2)])
    assert limited.max_length == 4 and limited.causal
    assert not Stack([SoftmaxAttention.random(2, 2, causal=False)]).causal
    stack = Stack([Dense.random(3, 2), LinearSSM.random(2, 2, 4)])
    assert (stack.d, stack.p) == (3, 4)
    X = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    Y = stack(X)
    assert isinstance(Y, torch.Tensor) and Y.shape == (5, 4)
    Y.sum().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all()
    assert isinstance(stack(X.detach().numpy()), np.ndarray)
    float32 = Stack([Dense.random(2, 2, dtype=torch.float32)] * 2)
    assert float32.dtype == torch.float32 and float32(np.ones((3, 2))).dtype == np.float32


def test_stack_validation():
    with pytest.raises(ValueError, match="layers must contain at least one layer"):
        Stack([])
    with pytest.raises(TypeError, match="layers must be a sequence"):
        Stack(Dense.random(2, 2))
    with pytest.raises(TypeError, match=r"layers\[1\] must be a SequenceMap"):
        Stack([Dense.random(2, 2), "dense"])
    with pytest.raises(ValueError, match=r"layers\[1\] must take d = 3"):
        Stack([Dense.random(2, 3), Dense.random(2, 2)])
    with pytest.raises(ValueError, match=r"layers\[0\] must have p == d for residual"):
        Stack([Dense.random(2, 3)], residual=True)
    with pytest.raises(TypeError, match=r"layers\[1\] must have dtype"):
        Stack([Dense.random(2, 2), Dense.random(2, 2, dtype=torch.float32)])
    with pytest.raises(TypeError, match="residual must be a bool"):
        Stack([Dense.random(2, 2)], residual=1)
    with pytest.raises(ValueError, match="offset must satisfy"):
        Stack.hybrid(2, 4, attention_every=2, offset=2)
    with pytest.raises(ValueError, match="attention_every must be >= 1"):
        Stack.hybrid(2, 4, attention_every=0)
    with pytest.raises(ValueError, match="X must have shape"):
        Stack([Dense.random(2, 2)])(np.zeros((3, 3)))


# -- prop-stack-decay -----------------------------------------------------------------------------------

def dense_stack_profile(stack, n):
    """‖J_{n−1, n−1−D}‖_F from the product of the layers' block-Toeplitz matrices, with lags C A^ℓ B
    from numpy matrix powers and residual identities added explicitly (independent of lib's Stack)."""
    d = stack.d
    M = np.eye(n * d)
    for layer in stack.layers:
        lags = [layer.C @ np.linalg.matrix_power(layer.A, ell) @ layer.B for ell in range(n)]
        T = np.zeros((n * d, n * d))
        for i in range(n):
            for j in range(i + 1):
                T[i * d:(i + 1) * d, j * d:(j + 1) * d] = lags[i - j]
        M = ((np.eye(n * d) + T) if stack.residual else T) @ M
    last = M[(n - 1) * d:, :].reshape(d, n, d)
    return np.array([np.linalg.norm(last[:, n - 1 - D, :]) for D in range(n)])


def subset_bound(constants, r, n, d, residual):
    """The bound of prop-stack-decay written out here: products over subsets of layers (independent)."""
    L = len(constants)
    bound = np.zeros(n)
    sizes = range(1, L + 1) if residual else [L]
    for s in sizes:
        for S in combinations(range(L), s):
            K = np.prod([constants[m] for m in S])
            bound += K * np.array([comb(D + s - 1, s - 1) * r ** D for D in range(n)])
    if residual:
        bound[0] += np.sqrt(d)
    return bound


@pytest.mark.parametrize("depth, residual", [(1, True), (1, False), (3, True), (3, False), (5, True)])
def test_prop_stack_decay_bound_holds_and_the_jacobian_is_the_dense_kernel(depth, residual):
    rho, n, width = 0.8, 40, 2
    stack = Stack([s4d_ssm(4, width, rho, seed=10 + k) for k in range(depth)], residual=residual)
    X = np.random.default_rng(depth).standard_normal((n, width))
    profile = jacobian_norms(stack, X, n - 1)[::-1]
    np.testing.assert_allclose(profile, dense_stack_profile(stack, n), rtol=1e-9, atol=1e-14)
    for constants in (None, [ssm_decay_bound(layer).scale for layer in stack.layers]):
        bound = stack_decay_bound(stack, n, rho, constants=constants)
        assert bound.shape == (n,) and (profile <= bound * (1 + 1e-9)).all()
        if constants is not None:  # the theorem's constants, written out independently
            np.testing.assert_allclose(bound, subset_bound(constants, rho, n, width, residual), rtol=1e-10)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("residual", [False, True])
def test_prop_stack_decay_bound_is_attained_by_scalar_layers(depth, residual):
    # Layers y_t = Σ_ℓ K_m r^ℓ x_{t−ℓ}: every path is positive, so the stack's kernel is the bound.
    r, n = 0.9, 40
    constants = [1.0, 0.5, 2.0, 1.5][:depth]
    stack = Stack([LinearSSM([[r]], [[K]], [[1.0]]) for K in constants], residual=residual)
    exact = subset_bound(constants, r, n, 1, residual)
    np.testing.assert_allclose(stack_decay_bound(stack, n, r), exact, rtol=1e-12)
    profile = jacobian_norms(stack, np.ones((n, 1)), n - 1)[::-1]
    np.testing.assert_allclose(profile, exact, rtol=1e-10)


def test_prop_stack_decay_the_folded_constant_statement_fails_with_residuals():
    # The old statement K^L C(D+L−1, L−1) r^D for residual stacks (K = 1 here): at D = 0 the residual
    # stack's Jacobian is 2^L, twice, four, eight times that bound for L = 1, 2, 3.
    r, n = 0.9, 10
    for L, ratio in ((1, 2.0), (2, 4.0), (3, 8.0)):
        layers = [LinearSSM([[r]], [[1.0]], [[1.0]])] * L
        residual = Stack(layers, residual=True)
        old_bound = stack_decay_bound(Stack(layers), n, r)  # K^L C(D+L−1, L−1) r^D with K = 1
        profile = jacobian_norms(residual, np.ones((n, 1)), n - 1)[::-1]
        assert profile[0] / old_bound[0] == pytest.approx(ratio, rel=1e-12)
        assert (profile <= stack_decay_bound(residual, n, r) * (1 + 1e-12)).all()


def test_stack_decay_bound_keeps_tiny_far_lags():
    # A Jordan block has lags L_ℓ = ℓ r^{ℓ−1} (B = e2, C = e1ᵀ), so K = max_ℓ ℓ / r = (n − 1) / r
    # sits at the farthest lag, about 1e-177 here: squaring it would underflow to 0.
    r, n = 0.5, 600
    stack = Stack([LinearSSM([[r, 1.0], [0.0, r]], [[0.0], [1.0]], [[1.0, 0.0]])])
    expected = (n - 1) / r * r ** np.arange(n)
    np.testing.assert_allclose(stack_decay_bound(stack, n, r), expected, rtol=1e-12)


def test_stack_decay_bound_bad_input():
    ssm = s4d_ssm(2, 2, 0.5, seed=0)
    with pytest.raises(TypeError, match="stack must be a Stack"):
        stack_decay_bound(ssm, 5, 0.5)
    with pytest.raises(TypeError, match=r"stack.layers\[1\] must be a LinearSSM"):
        stack_decay_bound(Stack([ssm, SoftmaxAttention.random(2, 2, seed=0)]), 5, 0.5)
    with pytest.raises(ValueError, match="rate must be in"):
        stack_decay_bound(Stack([ssm]), 5, 1.0)
    with pytest.raises(ValueError, match="n must be"):
        stack_decay_bound(Stack([ssm]), 0, 0.5)
    with pytest.raises(ValueError, match=r"constants must have one entry per layer \(2\)"):
        stack_decay_bound(Stack([ssm, ssm]), 5, 0.5, constants=[1.0])
    with pytest.raises(ValueError, match=r"constants\[0\] = 0.001 does not bound layer 0's lags"):
        stack_decay_bound(Stack([ssm]), 5, 0.5, constants=[1e-3])
    with pytest.raises(ValueError, match=r"constants\[1\] must be >= 0"):
        stack_decay_bound(Stack([ssm, ssm]), 5, 0.5, constants=[1.0, -1.0])
    with pytest.raises(TypeError, match="constants must be a sequence"):
        stack_decay_bound(Stack([ssm]), 5, 0.5, constants=1.0)


# -- SSM layer kinds --------------------------------------------------------------------------------------

def test_ssm_layer_kinds_and_the_hybrid_uses_them():
    for kind, normal in (("gaussian", False), ("s4d-lin", True), ("s4d-real", True)):
        layer = ssm_layer(kind, 6, 3, 0.8, seed=1)
        A = layer.A
        assert np.abs(np.linalg.eigvals(A)).max() == pytest.approx(0.8, rel=1e-12)
        assert np.allclose(A @ A.T, A.T @ A, atol=1e-12) == normal
        moduli, angles = np.abs(np.linalg.eigvals(A)), np.angle(np.linalg.eigvals(A))
        assert np.allclose(moduli, 0.8, rtol=1e-12) == (kind == "s4d-lin")  # every S4D-Lin mode has |λ| = ρ
        assert np.allclose(angles, 0.0, atol=1e-12) == (kind == "s4d-real")  # S4D-Real: positive real λ
    hybrid = Stack.hybrid(3, 8, 4, ssm="s4d-lin", state_size=6, spectral_radius=0.8, seed=2)
    attention = [k for k, layer in enumerate(hybrid.layers) if isinstance(layer, SoftmaxAttention)]
    assert attention == [0, 4]
    seeds = np.random.SeedSequence(2).spawn(8)
    np.testing.assert_array_equal(hybrid.layers[1].A, ssm_layer("s4d-lin", 6, 3, 0.8, seed=seeds[1]).A)
    with pytest.raises(ValueError, match="ssm must be one of"):
        Stack.hybrid(3, 4, 2, ssm="hippo")
    with pytest.raises(ValueError, match="kind must be one of"):
        ssm_layer("hippo", 2, 2, 0.5)


def test_stack_lti_is_ssm_layers_on_spawned_seeds_plain_and_residual_alike():
    seeds = np.random.SeedSequence([0, 3]).spawn(3)
    plain = Stack.lti(3, 3, state_size=6, spectral_radius=0.8, ssm="s4d-lin", seed=[0, 3])
    residual = Stack.lti(3, 3, state_size=6, spectral_radius=0.8, ssm="s4d-lin", residual=True, seed=[0, 3])
    assert not plain.residual and residual.residual and len(plain.layers) == 3
    for k, s in enumerate(seeds):
        expected = ssm_layer("s4d-lin", 6, 3, 0.8, seed=s)
        for layers in (plain.layers, residual.layers):
            for name in ("A", "B", "C"):
                np.testing.assert_array_equal(getattr(layers[k], name), getattr(expected, name))
    assert not np.array_equal(plain.layers[0].B, plain.layers[1].B)  # one stream per layer
    with pytest.raises(ValueError, match="ssm must be one of"):
        Stack.lti(3, 2, ssm="hippo")
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Stack.lti(3, 0)
    with pytest.raises(ValueError, match="spectral_radius must be >= 0"):
        Stack.lti(3, 2, spectral_radius=-0.5)


@pytest.mark.parametrize("residual", [False, True])
def test_prop_stack_decay_stack_scalar_has_lags_kappa_gamma_pow_and_attains_the_bound(residual):
    gamma, n, constants = 0.7, 30, [1.0, 0.5, 2.0]
    stack = Stack.scalar(constants, gamma, residual=residual)
    for layer, K in zip(stack.layers, constants):
        lags = [(layer.C @ np.linalg.matrix_power(layer.A, ell) @ layer.B).item() for ell in range(n)]
        np.testing.assert_allclose(lags, K * gamma ** np.arange(n), rtol=1e-13)
    profile = jacobian_norms(stack, np.ones((n, 1)), n - 1)[::-1]
    np.testing.assert_allclose(profile, subset_bound(constants, gamma, n, 1, residual), rtol=1e-10)


def test_stack_scalar_bad_input():
    with pytest.raises(TypeError, match="constants must be a sequence"):
        Stack.scalar(1.0, 0.5)
    with pytest.raises(ValueError, match="constants must hold at least one"):
        Stack.scalar([], 0.5)
    with pytest.raises(ValueError, match="constants entries must be >= 0"):
        Stack.scalar([1.0, -1.0], 0.5)
    with pytest.raises(ValueError, match="rate must satisfy 0 <= rate < 1"):
        Stack.scalar([1.0], 1.0)
    with pytest.raises(TypeError, match="residual must be a bool"):
        Stack.scalar([1.0], 0.5, residual=1)
