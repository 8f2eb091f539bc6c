"""The Mamba and Mamba-2 blocks as built (lib.blocks) against transformers' torch paths and numpy.

Independent routes: transformers' `MambaMixer` / `Mamba2Mixer` (offline, random configs, their
torch fallbacks: no mamba_ssm or causal_conv1d kernels installed), the plain-numpy recurrences
and coefficient formulas of `reference`, and autograd for the Jacobians.

Tolerances against transformers. Its Mamba path computes in the weights' dtype (float64) but
rounds A = −exp(A_log), D, the step bias, B and the scan input to float32 on the way
(`.float()` in `mamba_selective_scan`), relative errors of 2⁻²⁴ ≈ 6e-8 each; its Mamba-2 path
runs the chunked scan and the gated norm in float32 whatever the weights. Both are held to
1e-6 relative over the output, 16 float32 unit roundoffs (measured: at most 8.1e-8 over the
ten configurations, n <= 40); a float64 reference would allow 1e-12. Everything internal to
lib (routes, operator identity, numpy references) is float64: 1e-12.
"""

import math

import numpy as np
import pytest
import torch

import reference as ref
from lib import Mamba2Block, MambaBlock, identity_error, relative_error
from lib.scan import selective_loop, ssd_chunked, ssd_loop, ssd_quadratic

transformers = pytest.importorskip("transformers")
from transformers.models.mamba.modeling_mamba import MambaConfig, MambaMixer  # noqa: E402
from transformers.models.mamba2.modeling_mamba2 import Mamba2Config, Mamba2Mixer  # noqa: E402

F64 = torch.float64
MAMBA_TOLERANCE = MAMBA2_TOLERANCE = 1e-6  # the references' float32 (module docstring)
EXACT = 1e-12

# (d_model, d_state, d_conv, expand, dt_rank, bias, conv_bias)
MAMBA_CONFIGS = [(8, 4, 4, 2, "auto", False, True), (6, 3, 2, 1, 2, True, True), (20, 8, 3, 2, "auto", False, False),
                 (4, 2, 1, 3, 4, True, False), (33, 16, 4, 2, "auto", True, True)]
# (d_model, d_state, d_conv, expand, headdim, ngroups, bias, conv_bias, chunk_size)
MAMBA2_CONFIGS = [(8, 4, 4, 2, 4, 1, False, True, 8), (8, 6, 3, 2, 2, 2, True, True, 5),
                  (12, 5, 2, 1, 3, 4, False, False, 16), (6, 8, 4, 2, 6, 2, True, False, 3),
                  (16, 16, 4, 2, 8, 4, False, True, 7)]


def perturbed(block, seed, scale=0.3):
    """The block with every parameter moved by iid N(0, scale²) (A_log, D, norm too): not only the init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return block


def mamba(config, seed=0):
    d, N, K, e, R, bias, conv_bias = config
    return perturbed(MambaBlock(d, N, K, e, R, conv_bias, bias, seed=seed), seed + 100)


def mamba2(config, seed=0):
    d, N, K, e, P, G, bias, conv_bias, Q = config
    return perturbed(Mamba2Block(d, N, K, e, P, G, bias=bias, conv_bias=conv_bias, chunk_size=Q, seed=seed), seed + 100)


def mamba_mixer(block):
    config = MambaConfig(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                         intermediate_size=block.d_inner, time_step_rank=block.dt_rank,
                         use_bias=block.in_proj.bias is not None, use_conv_bias=block.conv1d.bias is not None)
    return MambaMixer(config, layer_idx=0).to(F64).eval()


def mamba2_mixer(block):
    config = Mamba2Config(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                          expand=block.d_inner // block.d_model, num_heads=block.nheads, head_dim=block.headdim,
                          n_groups=block.ngroups, use_bias=block.in_proj.bias is not None,
                          use_conv_bias=block.conv1d.bias is not None, chunk_size=block.chunk_size,
                          layer_norm_epsilon=block.norm.eps)
    return Mamba2Mixer(config, layer_idx=0).to(F64).eval()


def inputs(b, n, d, seed=0, scale=1.0):
    return scale * torch.randn(b, n, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def numpy_params(block):
    return {k: v.numpy(force=True) for k, v in block.state_dict().items()}


# -- agreement with transformers --------------------------------------------------------------------


@pytest.mark.parametrize("config", MAMBA_CONFIGS, ids=str)
def test_prop_mamba_block_agrees_with_transformers_mamba_mixer(config):
    block = mamba(config)
    mixer = mamba_mixer(block)
    mixer.load_state_dict(block.state_dict(), strict=True)
    for n in (1, 3, 37):
        X = inputs(3, n, block.d, seed=n)
        with torch.no_grad():
            expected = mixer(X)
            for method in ("recurrence", "scan"):
                assert relative_error(block(X, method=method), expected) < MAMBA_TOLERANCE, (n, method)


@pytest.mark.parametrize("config", MAMBA2_CONFIGS, ids=str)
def test_prop_mamba2_block_agrees_with_transformers_mamba2_mixer(config):
    block = mamba2(config)
    mixer = mamba2_mixer(block)
    mixer.load_state_dict(block.state_dict(), strict=True)
    for n in (1, 2, 11, 40):  # chunk sizes 3..16: n below, at and not a multiple of the chunk
        X = inputs(3, n, block.d, seed=n)
        with torch.no_grad():
            expected = mixer(X)
            for method in ("recurrence", "scan", "quadratic"):
                assert relative_error(block(X, method=method), expected) < MAMBA2_TOLERANCE, (n, method)


def test_prop_mamba_block_loads_a_mixer_state_dict_and_the_mixer_loads_the_block():
    block = mamba(MAMBA_CONFIGS[1])
    mixer = mamba_mixer(block)                                  # transformers' own random init
    fresh = MambaBlock(6, 3, 2, 1, 2, True, True, seed=5)
    fresh.load_state_dict(mixer.state_dict(), strict=True)
    X = inputs(2, 9, 6)
    with torch.no_grad():
        assert relative_error(fresh(X), mixer(X)) < MAMBA_TOLERANCE
        assert set(block.state_dict()) == set(mixer.state_dict())


def test_prop_mamba2_block_loads_a_mixer_state_dict_and_the_mixer_loads_the_block():
    block = mamba2(MAMBA2_CONFIGS[1])
    mixer = mamba2_mixer(block)
    fresh = Mamba2Block(8, 6, 3, 2, 2, 2, bias=True, chunk_size=5, seed=5)
    fresh.load_state_dict(mixer.state_dict(), strict=True)
    X = inputs(2, 9, 8)
    with torch.no_grad():
        assert relative_error(fresh(X), mixer(X)) < MAMBA2_TOLERANCE
        assert set(block.state_dict()) == set(mixer.state_dict())


def test_a_state_dict_with_a_wrong_key_or_shape_is_refused_naming_the_key():
    block = MambaBlock(4, 2)
    state = block.state_dict()
    renamed = dict(state)
    renamed["dt_bias"] = renamed.pop("dt_proj.bias")
    with pytest.raises(RuntimeError, match="dt_proj.bias"):
        block.load_state_dict(renamed, strict=True)
    wrong = dict(state, A_log=torch.zeros(8, 3, dtype=F64))
    with pytest.raises(RuntimeError, match="A_log"):
        block.load_state_dict(wrong, strict=True)
    block2 = Mamba2Block(4, 2, headdim=2)
    with pytest.raises(RuntimeError, match="norm.weight"):
        block2.load_state_dict(dict(block2.state_dict(), **{"norm.weight": torch.ones(3, dtype=F64)}))


# -- the operator ---------------------------------------------------------------------------------


def adversarial(d, K, Q=4, seed=0):
    """Inputs (b, n, d) at the edges: n = 1, n < d_conv, n not a multiple of the chunk, saturating SiLU
    (entries ~ 30), zero input, zero tokens, a repeated token."""
    rng = np.random.default_rng(seed)
    zeros = rng.standard_normal((2, 9, d))
    zeros[:, ::3] = 0.0
    families = {"random": rng.standard_normal((3, 10, d)), "n = 1": rng.standard_normal((2, 1, d)),
                "n < d_conv": rng.standard_normal((2, max(1, K - 1), d)), "n = chunk + 1": rng.standard_normal((2, Q + 1, d)),
                "large": 30 * rng.standard_normal((2, 9, d)), "zero": np.zeros((2, 5, d)), "zero tokens": zeros,
                "constant": np.broadcast_to(rng.standard_normal((2, 1, d)), (2, 7, d)).copy()}
    return {name: torch.from_numpy(X) for name, X in families.items()}


@pytest.mark.parametrize("config", MAMBA_CONFIGS[:4], ids=str)
def test_prop_mamba_block_identity_and_numpy_formulas_on_adversarial_inputs(config):
    block = mamba(config)
    P = numpy_params(block)
    for name, X in adversarial(block.d, block.d_conv).items():
        assert identity_error(block, X) < EXACT, name
        with torch.no_grad():
            g, beta = block.coefficients(X), block.offset(X)
            assert torch.all(torch.triu(torch.ones(X.shape[1], X.shape[1]), 1)[..., None] * g == 0), name
            for b in range(X.shape[0]):
                y, g_ref, beta_ref = ref.mamba_block(P, X[b].numpy())
                assert relative_error(block(X[b], method="scan"), y) < EXACT, name
                assert relative_error(g[b], g_ref) < EXACT, name
                assert relative_error(beta[b], beta_ref) < EXACT, name


@pytest.mark.parametrize("config", MAMBA2_CONFIGS[:4], ids=str)
def test_prop_mamba2_block_identity_and_numpy_formulas_on_adversarial_inputs(config):
    block = mamba2(config)
    P = numpy_params(block)
    for name, X in adversarial(block.d, block.d_conv, block.chunk_size).items():
        assert identity_error(block, X) < EXACT, name
        with torch.no_grad():
            g, beta = block.coefficients(X), block.offset(X)
            for b in range(X.shape[0]):
                y, g_ref, beta_ref = ref.mamba2_block(P, X[b].numpy(), block.headdim, block.ngroups, block.norm.eps)
                assert relative_error(block(X[b], method="scan"), y) < EXACT, name
                assert relative_error(g[b], g_ref) < EXACT, name
                assert relative_error(beta[b], beta_ref) < EXACT, name


@pytest.mark.parametrize("make", [lambda: mamba(MAMBA_CONFIGS[1]), lambda: mamba2(MAMBA2_CONFIGS[1])])
def test_prop_mamba_block_operator_is_U_diag_g_V_and_the_identity_holds_on_the_fast_routes(make):
    block = make()
    U, V = block.factors()
    assert U.shape == (block.d_model, block.d_inner) and V.shape == (block.d_inner, block.d_model)
    X = inputs(2, 70, block.d)                                   # n > 64: "auto" takes the fast routes
    with torch.no_grad():
        W, g = block.operator(X), block.coefficients(X)
        assert W.shape == (2, 70, 70, block.d, block.d)
        dense = torch.stack([U @ torch.diag(g[1, 40, 38]) @ V, U @ torch.diag(g[0, 5, 5]) @ V])
        assert relative_error(torch.stack([W[1, 40, 38], W[0, 5, 5]]), dense) < EXACT
    assert identity_error(block, X) < EXACT


def test_prop_mamba_block_offset_comes_from_the_biases_and_vanishes_at_zero_without_in_proj_bias():
    """No biases: β = 0. A conv bias alone: β(X) ≠ 0, but β(0) = 0 = y(0) (the gate silu(z), z = W_z x,
    vanishes at 0). An in_proj bias too: y(0) = β(0) ≠ 0, an affine map."""
    X, zero = inputs(2, 6, 5), torch.zeros(1, 4, 5, dtype=F64)
    for cls, kwargs in ((MambaBlock, {}), (Mamba2Block, dict(headdim=5))):
        with torch.no_grad():
            bare = perturbed(cls(5, 3, bias=False, conv_bias=False, **kwargs), 1)
            assert torch.count_nonzero(bare.offset(X)) == 0
            conv = perturbed(cls(5, 3, bias=False, conv_bias=True, **kwargs), 1)
            assert torch.linalg.vector_norm(conv.offset(X)) > 1e-3
            assert torch.count_nonzero(conv.offset(zero)) == 0 and torch.count_nonzero(conv(zero)) == 0
            full = perturbed(cls(5, 3, bias=True, conv_bias=True, **kwargs), 1)
            full.out_proj.bias.zero_()          # y(0) ≠ 0 from the in-projection's bias alone
            assert torch.linalg.vector_norm(full(zero)) > 1e-3
            assert relative_error(full.offset(zero), full(zero)) < EXACT


def test_identity_error_adds_the_offset_only_for_models_that_have_one():
    block = mamba(MAMBA_CONFIGS[1])                          # biases on: β ≠ 0
    X = inputs(2, 6, block.d)
    with torch.no_grad():
        without = relative_error(torch.einsum("bijpd,bjd->bip", block.operator(X), X), block(X))
    assert without > 1e-3 and identity_error(block, X) < EXACT


@pytest.mark.parametrize("make", [lambda: mamba(MAMBA_CONFIGS[0]), lambda: mamba2(MAMBA2_CONFIGS[0])])
def test_prop_mamba_block_operator_is_not_the_jacobian_but_differs_by_the_coefficients_derivative(make):
    """𝒲 depends on X, so ∂y_i/∂x_j = 𝒲_ij + Σ_l ∂_{x_j}(𝒲_il) x_l + ∂_{x_j} β_i ≠ 𝒲_ij in general. The
    Jacobian (autograd through the fast forward) equals the operator plus the Jacobian of
    X ↦ Σ_l 𝒲_il(X) x̄_l + β_i(X) at x̄ = X (autograd through the dense operator): the identity,
    differentiated: a consistency check of the identity, which can fail only where the identity
    does. The claims of the remark are J ≠ 𝒲 and causality (the other asserts)."""
    block = make()
    X = inputs(1, 6, block.d, seed=3)[0]
    J = torch.autograd.functional.jacobian(lambda Z: block(Z, method="scan"), X).permute(0, 2, 1, 3)
    with torch.no_grad():
        W = block.operator(X)
    assert relative_error(W, J) > 0.05                           # they differ
    frozen = X.detach().clone()
    moving = lambda Z: torch.einsum("ijpd,jd->ip", block.operator(Z), frozen) + block.offset(Z)
    correction = torch.autograd.functional.jacobian(moving, X).permute(0, 2, 1, 3)  # (i, j, p, d)
    assert relative_error(W + correction, J) < 1e-10
    upper = torch.triu(torch.ones(6, 6), 1).bool()
    assert torch.count_nonzero(J[upper]) == 0 and torch.count_nonzero(W[upper]) == 0


# -- the SSD routes with groups ----------------------------------------------------------------------


@pytest.mark.parametrize("G", [1, 2, 4])
def test_ssd_routes_with_B_C_per_group_equal_the_shared_loop_run_group_by_group(G):
    gen = torch.Generator().manual_seed(G)
    b, n, H, N, P = 2, 13, 4, 3, 2
    delta = torch.rand(b, n, H, generator=gen, dtype=F64)
    A = -torch.rand(H, generator=gen, dtype=F64) * 3
    B, C = (torch.randn(b, n, G, N, generator=gen, dtype=F64) for _ in range(2))
    x = torch.randn(b, n, H, P, generator=gen, dtype=F64)
    per = H // G
    expected = torch.cat([ssd_loop(delta[:, :, g * per:(g + 1) * per], A[g * per:(g + 1) * per], B[:, :, g], C[:, :, g],
                                   x[:, :, g * per:(g + 1) * per]) for g in range(G)], 2)
    for route in (ssd_loop, ssd_quadratic, lambda *z: ssd_chunked(*z, chunk=4)):
        assert relative_error(route(delta, A, B, C, x), expected) < EXACT


# -- initialisation and bad input --------------------------------------------------------------------


def test_mamba_block_has_mambas_initialisation_reproducible_from_the_seed():
    block = MambaBlock(32, d_state=5, dt_min=1e-3, dt_max=1e-1)
    assert block.dt_rank == 2 and block.d_inner == 64 and MambaBlock(33, 2).dt_rank == 3  # ⌈d_model/16⌉
    assert torch.equal(block.A_log, torch.log(torch.arange(1, 6, dtype=F64)).expand(64, 5))
    assert torch.equal(block.D, torch.ones(64, dtype=F64))
    step = torch.nn.functional.softplus(block.dt_proj.bias.detach())
    assert float(step.min()) >= 1e-3 * (1 - 1e-12) and float(step.max()) <= 1e-1 * (1 + 1e-12)
    assert float(block.dt_proj.weight.detach().abs().max()) <= 2 ** -0.5
    assert float(block.in_proj.weight.abs().max()) <= 32 ** -0.5
    assert all(torch.equal(a, b) for a, b in zip(block.state_dict().values(), MambaBlock(32, d_state=5).state_dict().values()))
    assert not torch.equal(block.in_proj.weight, MambaBlock(32, d_state=5, seed=1).in_proj.weight)
    assert MambaBlock(4, 2, dtype=torch.float32).dtype == torch.float32
    floored = MambaBlock(4, 2, dt_min=1e-6, dt_max=1e-5, dt_init_floor=1e-4)
    assert torch.allclose(torch.nn.functional.softplus(floored.dt_proj.bias), torch.full((8,), 1e-4, dtype=F64))


def test_mamba_block_torch_default_draws_are_uniform_at_their_bounds():
    # Both sides of each torch-default tensor's draw: U(±b) has max |w| just below b, standard deviation
    # b/√3 and mean 0 (a draw scaled by 0.9, or a Gaussian of another width, fails).
    block = MambaBlock(64, d_state=16, seed=3)
    D_in, K = block.d_inner, block.d_conv
    tensors = {"in_proj.weight": 64, "conv1d.weight": K, "conv1d.bias": K, "x_proj.weight": D_in,
               "dt_proj.weight": block.dt_rank, "out_proj.weight": D_in}
    params = dict(block.named_parameters())
    for name, fan_in in tensors.items():
        w, bound = params[name].detach().numpy().ravel(), fan_in ** -0.5
        assert w.size >= 128, name
        assert 0.95 <= np.abs(w).max() / bound <= 1, name
        assert abs(w.std() / (bound / np.sqrt(3)) - 1) < 0.1, name
        assert abs(w.mean()) < 4 * bound / np.sqrt(3 * w.size), name


def test_mamba2_block_torch_default_draws_and_steps_are_at_their_bounds():
    # Mamba-2's torch-default tensors from both sides (as for Mamba above), its steps log-uniform in
    # [dt_min, dt_max] (the log-steps' spread of a uniform) and A in A_init_range.
    block = Mamba2Block(64, d_state=16, headdim=4, seed=3)  # mamba_ssm's defaults: dt in [1e-3, 1e-1]
    params = dict(block.named_parameters())
    for name, fan_in in {"in_proj.weight": 64, "conv1d.weight": 4, "conv1d.bias": 4,
                         "out_proj.weight": block.d_inner}.items():
        w, bound = params[name].detach().numpy().ravel(), fan_in ** -0.5
        assert w.size >= 128 and 0.95 <= np.abs(w).max() / bound <= 1, name
        assert abs(w.std() / (bound / np.sqrt(3)) - 1) < 0.1, name
        assert abs(w.mean()) < 4 * bound / np.sqrt(3 * w.size), name
    log_step = np.log(torch.nn.functional.softplus(block.dt_bias.detach()).numpy())
    lo, hi = np.log(1e-3), np.log(1e-1)
    assert block.nheads == 32 and lo - 1e-12 <= log_step.min() and log_step.max() <= hi + 1e-12
    assert abs(log_step.std() / ((hi - lo) / np.sqrt(12)) - 1) < 0.25
    A = np.exp(block.A_log.detach().numpy())
    assert 1 <= A.min() and A.max() <= 16 and A.max() - A.min() > 10   # mamba_ssm's (1, 16)


def test_mamba2_block_has_mamba2s_initialisation():
    block = Mamba2Block(16, d_state=4, headdim=8, ngroups=2, A_init_range=(2, 3))
    assert block.nheads == 4 and block.in_proj.weight.shape == (2 * 32 + 2 * 2 * 4 + 4, 16)
    assert float(block.A_log.min()) >= math.log(2) and float(block.A_log.max()) <= math.log(3)
    assert torch.equal(block.D, torch.ones(4, dtype=F64)) and torch.equal(block.norm.weight, torch.ones(32, dtype=F64))


@pytest.mark.parametrize("call, error, words", [
    (lambda: MambaBlock(0), ValueError, "d_model"),
    (lambda: MambaBlock(2.5), TypeError, "d_model"),
    (lambda: MambaBlock(True), TypeError, "d_model"),
    (lambda: MambaBlock(4, dt_rank="full"), TypeError, "dt_rank"),
    (lambda: MambaBlock(4, bias=1), TypeError, "bias"),
    (lambda: MambaBlock(4, dt_min=0.2, dt_max=0.1), ValueError, "dt_max"),
    (lambda: Mamba2Block(4, headdim=3), ValueError, "headdim must divide d_inner"),
    (lambda: Mamba2Block(4, headdim=2, ngroups=3), ValueError, "ngroups must divide"),
    (lambda: Mamba2Block(4, headdim=2, A_init_range=(0, 1)), ValueError, r"A_init_range\[0\]"),
    (lambda: Mamba2Block(4, headdim=2, norm_eps=0), ValueError, "norm_eps"),
    (lambda: Mamba2Block(4, headdim=2, dtype=torch.float16), TypeError, "dtype"),
    (lambda: MambaBlock(4)(torch.zeros(3, 5, dtype=F64)), ValueError, r"X must have shape \(n, 4\)"),
    (lambda: MambaBlock(4)(torch.zeros(3, 4, dtype=torch.float32)), TypeError, "X must have the model's dtype"),
    (lambda: Mamba2Block(4, headdim=2).coefficients(np.zeros((3, 4))), TypeError, "X must be a torch tensor"),
    (lambda: Mamba2Block(4, headdim=2).operator(torch.full((3, 4), math.nan, dtype=F64)), ValueError, "finite"),
    (lambda: MambaBlock(4)(torch.zeros(3, 4, dtype=F64), method="fast"), ValueError, "method"),
])
def test_blocks_refuse_bad_input_naming_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("cls, kwargs", [(MambaBlock, {}), (Mamba2Block, dict(headdim=4, ngroups=2))])
def test_prop_mamba_block_at_zero_the_jacobian_sees_the_gate_projection_the_operator_never_does(cls, kwargs):
    """Without in_proj bias, with a conv bias, at X = 0: 𝒲(0) = 0 (the gate silu(0) = 0), but
    J_ij(0) = δ_ij U diag(½ o_i(0)) W_z (Mamba-2: ½ w_N ⊙ o_i(0)/√ε), o the scan output with its skip."""
    block = perturbed(cls(4, 3, bias=False, conv_bias=True, **kwargs), 2)
    n, X = 5, torch.zeros(5, 4, dtype=F64)
    J = torch.autograd.functional.jacobian(lambda Z: block(Z, method="scan"), X).permute(0, 2, 1, 3)
    with torch.no_grad():
        assert torch.count_nonzero(block.operator(X)) == 0
        z, _, v, delta, B, C = block._inner(X[None])          # at X = 0: v = silu(conv bias), constants
        A, D_in = -torch.exp(block.A_log), block.d_inner
        if cls is MambaBlock:
            o = (selective_loop(delta, A, B, C, v) + block.D * v)[0]
            scale, W_z = 0.5 * o, block.in_proj.weight[D_in:]         # rows (u, z)
        else:
            heads = v.unflatten(-1, (block.nheads, block.headdim))
            o = (ssd_loop(delta, A, B, C, heads) + block.D[:, None] * heads).flatten(-2)[0]
            scale, W_z = 0.5 * block.norm.weight * o / math.sqrt(block.norm.eps), block.in_proj.weight[:D_in]
        expected = torch.zeros_like(J)
        for i in range(n):
            expected[i, i] = block.out_proj.weight @ torch.diag(scale[i]) @ W_z
        assert torch.linalg.vector_norm(expected) > 1e-3
        assert relative_error(J, expected) < 1e-10
    bare = perturbed(cls(4, 3, bias=False, conv_bias=False, **kwargs), 2)      # no biases: both are 0 at 0
    J = torch.autograd.functional.jacobian(lambda Z: bare(Z, method="scan"), X)
    with torch.no_grad():
        assert torch.count_nonzero(J) == 0 and torch.count_nonzero(bare.operator(X)) == 0


def test_blocks_compute_in_float32_when_built_so():
    for make in (lambda dt: MambaBlock(6, 3, seed=1, dtype=dt), lambda dt: Mamba2Block(6, 3, headdim=3, ngroups=2,
                                                                                       seed=1, dtype=dt)):
        low, high = make(torch.float32), make(F64)
        X = inputs(2, 70, 6)
        with torch.no_grad():
            y = low(X.float())
            assert y.dtype == torch.float32 and low.coefficients(X[:, :5].float()).dtype == torch.float32
            assert relative_error(y, high(X)) < 1e-5
