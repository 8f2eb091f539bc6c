"""lib.scan: the fast routes of SelectiveSSM and SSD against their loops, in values and gradients,
and the FFT convolution against a direct sum.

The loops themselves are tested against the numpy reference in test_ssm.py. Tolerances:
max |fast − loop| / max |loop| <= 1e-12 in float64 and <= 1e-4 in float32 (against the float64
loop), for y and for the gradient with respect to every input (Δ, A, B, C, x); the gradients of
the selective scan come from its hand-written backward, those of the loops from autograd.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lib.scan as scan
from lib import SSD, SelectiveSSM
from lib.scan import fft_causal_conv, selective_loop, selective_scan, ssd_chunked, ssd_loop, ssd_quadratic

TOL = {torch.float64: 1e-12, torch.float32: 1e-4}
VARIANTS = {"chunks-batched": {"inner": False}, "chunks-inner": {"inner": True}, "default": {}}  # the two layouts


def rel(fast: torch.Tensor, ref: torch.Tensor) -> float:
    """max |fast − ref| / max |ref| (absolute when ref is all zero)."""
    scale = ref.abs().max().item()
    return (fast - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def selective_inputs(b, n, d, N, dtype=torch.float64, seed=0, log_decay=None):
    """Δ = softplus(·) spread over (0.01, 3); A = −(0.1..3); or, with log_decay (b, n, d), Δ·A fixed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, d, generator=g, dtype=torch.float64)
    delta = torch.nn.functional.softplus(2 * torch.randn(b, n, d, generator=g, dtype=torch.float64))
    A = -(0.1 + 2.9 * torch.rand(d, N, generator=g, dtype=torch.float64))
    B, C = (torch.randn(b, n, N, generator=g, dtype=torch.float64) for _ in range(2))
    if log_decay is not None:  # A = −1: Δ_t[c] = −log_decay, so Δ·A[c, n] = log_decay
        A, delta = -torch.ones(d, N, dtype=torch.float64), -log_decay
    return [z.to(dtype) for z in (delta, A, B, C, x)]


def ssd_inputs(b, n, H, N, P, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, H, P, generator=g, dtype=torch.float64)
    delta = torch.nn.functional.softplus(2 * torch.randn(b, n, H, generator=g, dtype=torch.float64))
    A = -(1 + 15 * torch.rand(H, generator=g, dtype=torch.float64))
    B, C = (torch.randn(b, n, N, generator=g, dtype=torch.float64) for _ in range(2))
    return [z.to(dtype) for z in (delta, A, B, C, x)]


def values_and_grads(route, inputs, seed=1):
    """y and the gradient of ⟨w, y⟩ (w random) with respect to every input, in float64."""
    inputs = [z.clone().requires_grad_() for z in inputs]
    y = route(*inputs)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    return [z.double() for z in [y.detach()] + list(torch.autograd.grad(y, inputs, w))]


def assert_agree(fast, ref, tol, what=""):
    for name, f, r in zip(["y", "∂Δ", "∂A", "∂B", "∂C", "∂x"], fast, ref):
        assert f.shape == r.shape and torch.isfinite(f).all(), (what, name)
        assert rel(f, r) <= tol, f"{what} {name}: {rel(f, r):.2e} > {tol:.0e}"


# -- the selective scan ---------------------------------------------------------------------------

# n = 1, 16, 17, 65, 100, 257 with chunks 1, 4, 7 and the default cover n < T, n = T, T ∤ n, K = 1, T = 1.
SHAPES = [(1, 1, 1, 1), (2, 7, 3, 2), (3, 16, 2, 4), (1, 17, 5, 3), (1, 65, 3, 3), (2, 100, 8, 4), (1, 257, 2, 16)]


@pytest.mark.parametrize("b,n,d,N", SHAPES)
def test_selective_scan_equals_the_loop_in_values_and_gradients_float64(b, n, d, N):
    inputs = selective_inputs(b, n, d, N, seed=n + d)
    ref = values_and_grads(selective_loop, inputs)
    for variant, options in VARIANTS.items():
        for chunk in (None, 1, 4, 7):
            fast = values_and_grads(lambda *z: selective_scan(*z, chunk=chunk, **options), inputs)
            assert_agree(fast, ref, 1e-12, f"{variant} chunk={chunk}")


@pytest.mark.parametrize("b,n,d,N", [(1, 33, 3, 2), (2, 130, 8, 16), (1, 300, 64, 16)])
def test_selective_scan_equals_the_loop_float32(b, n, d, N):
    inputs = selective_inputs(b, n, d, N, torch.float32, seed=n)
    ref = values_and_grads(selective_loop, [z.double() for z in inputs])  # the exact answer
    for variant, options in VARIANTS.items():
        assert selective_scan(*inputs, **options).dtype == torch.float32
        assert_agree(values_and_grads(lambda *z: selective_scan(*z, **options), inputs), ref, 1e-4, variant)


@pytest.mark.parametrize("inner", [False, True])
def test_selective_scan_passes_gradcheck(inner):
    inputs = [z.requires_grad_() for z in selective_inputs(1, 7, 2, 2, seed=3)]
    assert torch.autograd.gradcheck(lambda *z: selective_scan(*z, chunk=3, inner=inner), inputs)


def extreme_log_decays(b, n, d):
    """Δ·A per step: −50 (state wiped), 0 (decay exactly 1, Δ = 0), −1e−12, and blocks of each."""
    g = torch.Generator().manual_seed(0)
    choice = torch.randint(0, 4, (b, n, d), generator=g)
    log_decay = torch.tensor([-50.0, 0.0, -1e-12, -0.5], dtype=torch.float64)[choice]
    log_decay[:, : n // 4] = -50.0          # a long wiping stretch …
    log_decay[:, n // 4: n // 2] = -1e-12   # … then decays ≈ 1
    log_decay[:, n // 2: n // 2 + 40] = 0.0  # and exactly 1 (Δ = 0: no input either)
    return log_decay


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_selective_scan_agrees_under_extreme_decays(dtype):
    b, n, d, N = 2, 517, 3, 4
    inputs = selective_inputs(b, n, d, N, dtype, log_decay=extreme_log_decays(b, n, d))
    ref = values_and_grads(selective_loop, [z.double() for z in inputs])
    for variant, options in VARIANTS.items():
        fast = values_and_grads(lambda *z: selective_scan(*z, chunk=16, **options), inputs)
        assert_agree(fast, ref, TOL[dtype], f"extreme {variant}")


def test_selective_scan_float32_is_stable_at_n_4096():
    # Real-width-like shape, long sequence, Mamba-like steps (Δ ~ 1e-3..1e-1 and some large ones).
    b, n, d, N = 1, 4096, 16, 16
    inputs = selective_inputs(b, n, d, N, seed=7)
    inputs[0] = torch.exp(torch.empty(b, n, d, dtype=torch.float64).uniform_(math.log(1e-3), math.log(5.0)))
    ref = values_and_grads(selective_loop, inputs)  # float64 loop: the exact answer
    for variant, options in VARIANTS.items():
        fast = values_and_grads(lambda *z: selective_scan(*z, **options), [z.float() for z in inputs])
        assert_agree(fast, ref, 1e-4, f"float32 n=4096 {variant}")


def test_selective_scan_keeps_tiny_outputs_to_relative_accuracy():
    # An impulse at t = 0 decaying by e^{-0.7} a step: y_t spans 1 .. 1e-240.  Products of decays,
    # never differences of large cumulative sums, keep each y_t to ~1e-13 relative; a log-space
    # scan (exp of cumsum differences) would lose them all past the first few hundred steps.
    n, d, N = 800, 2, 3
    delta = torch.full((1, n, d), 0.7, dtype=torch.float64)
    A = -torch.ones(d, N, dtype=torch.float64)
    B = C = torch.ones(1, n, N, dtype=torch.float64)
    x = torch.zeros(1, n, d, dtype=torch.float64)
    x[0, 0] = 1.0
    exact = N * 0.7 * np.exp(-0.7 * np.arange(n))
    assert exact[-1] < 1e-240
    for options in VARIANTS.values():
        y = selective_scan(delta, A, B, C, x, chunk=16, **options)[0, :, 0].numpy()
        np.testing.assert_allclose(y, exact, rtol=1e-12, atol=0)


def test_selective_scan_backward_survives_retain_graph_and_vectorised_jacobian():
    # jacobian_norms runs p backward passes over one graph; the benchmarks use
    # jacobian(vectorize=True), which vmaps the backward (the in-place backward falls back).
    inputs = selective_inputs(1, 9, 2, 3, seed=4)
    f = lambda x: selective_scan(*inputs[:4], x, chunk=4)[0]
    x = inputs[4].clone().requires_grad_()
    y = f(x)
    first = torch.autograd.grad(y[5, 0], x, retain_graph=True)[0]
    assert torch.equal(first, torch.autograd.grad(y[5, 0], x, retain_graph=True)[0])
    J_vec = torch.autograd.functional.jacobian(f, inputs[4], vectorize=True)
    J_loop = torch.autograd.functional.jacobian(lambda x: selective_loop(*inputs[:4], x)[0], inputs[4])
    assert rel(J_vec, J_loop) <= 1e-12 and rel(J_vec[5, 0], first) <= 1e-12


def test_selective_scan_has_second_derivatives():
    # create_graph=True takes the loop's autograd (the in-place backward is first order only).
    inputs = [z.requires_grad_() for z in selective_inputs(1, 5, 2, 2, seed=6)]
    assert torch.autograd.gradgradcheck(lambda *z: selective_scan(*z, chunk=2), inputs)


def test_first_order_backward_takes_the_fast_path(monkeypatch):
    def refuse(*args):
        raise AssertionError("the slow autograd fallback ran")
    monkeypatch.setattr(scan, "_vjp_by_autograd", refuse)
    inputs = [z.requires_grad_() for z in selective_inputs(2, 40, 3, 2, seed=8)]
    selective_scan(*inputs).sum().backward()                      # .backward()
    torch.autograd.grad(selective_scan(*inputs)[0, 7, 1], inputs)  # jacobian_norms' call


def test_selective_scan_gradients_are_causal():
    inputs = selective_inputs(2, 37, 3, 2, seed=5)
    x = inputs[4].clone().requires_grad_()
    (g,) = torch.autograd.grad(selective_scan(*inputs[:4], x, chunk=8)[:, 20].sum(), x)
    assert torch.all(g[:, 21:] == 0) and torch.any(g[:, :21] != 0)


# -- SSD ------------------------------------------------------------------------------------------

SSD_SHAPES = [(1, 1, 1, 1, 1), (2, 7, 2, 3, 2), (1, 33, 3, 4, 2), (2, 65, 1, 2, 5), (1, 257, 2, 16, 4)]


@pytest.mark.parametrize("b,n,H,N,P", SSD_SHAPES)
def test_ssd_chunked_and_quadratic_equal_the_loop_in_values_and_gradients_float64(b, n, H, N, P):
    inputs = ssd_inputs(b, n, H, N, P, seed=n)
    ref = values_and_grads(ssd_loop, inputs)
    for chunk in (1, 4, 7, 32):
        assert_agree(values_and_grads(lambda *z: ssd_chunked(*z, chunk=chunk), inputs), ref, 1e-12, f"chunk={chunk}")
    assert_agree(values_and_grads(ssd_quadratic, inputs), ref, 1e-12, "quadratic")


def test_ssd_chunked_passes_gradcheck():
    inputs = [z.requires_grad_() for z in ssd_inputs(1, 7, 2, 2, 2, seed=3)]
    assert torch.autograd.gradcheck(lambda *z: ssd_chunked(*z, chunk=3), inputs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ssd_chunked_agrees_under_extreme_decays(dtype):
    b, n, H, N, P = 1, 301, 3, 4, 2
    inputs = ssd_inputs(b, n, H, N, P, seed=2)
    inputs[1] = -torch.ones(H, dtype=torch.float64)
    inputs[0] = -extreme_log_decays(b, n, H)
    inputs = [z.to(dtype) for z in inputs]
    fast = values_and_grads(lambda *z: ssd_chunked(*z, chunk=32), inputs)
    assert_agree(fast, values_and_grads(ssd_loop, [z.double() for z in inputs]), TOL[dtype], "ssd extreme")


def test_ssd_chunked_float32_is_stable_at_n_4096():
    inputs = ssd_inputs(1, 4096, 4, 16, 8, seed=3)
    fast = values_and_grads(ssd_chunked, [z.float() for z in inputs])
    assert_agree(fast, values_and_grads(ssd_loop, inputs), 1e-4, "ssd f32")


def test_segment_sums_are_accurate_where_differences_of_cumulative_sums_are_not():
    # 63 steps of −50 then tiny steps, in float32.  The decays exp(Σ_{t=j+1}^{i} z_t) between
    # late i, j are ~0.94..1; differences of cumulative sums subtract two numbers ~3150
    # (ulp 2.4e-4) and get them wrong by ~1e-4 relative, the segment sums by ~1e-7.
    z = torch.cat([torch.full((63,), -50.0), torch.full((64,), -1e-3)]).float()
    late = (slice(63, None), slice(63, None))
    lower = torch.tril(torch.ones(64, 64, dtype=torch.bool))
    exact = torch.exp(scan._segment_sums(z.double())[late][lower])
    ours = torch.exp(scan._segment_sums(z)[late][lower].double())
    naive = torch.exp((torch.cumsum(z, 0)[:, None] - torch.cumsum(z, 0)[None, :])[late][lower].double())
    assert ((ours - exact).abs() / exact).max() < 1e-6
    assert ((naive - exact).abs() / exact).max() > 1e-4
    assert torch.all(torch.exp(scan._segment_sums(z)).triu(1) == 0)  # −inf above the diagonal: decay 0


# -- "auto" on the models -------------------------------------------------------------------------


def test_auto_takes_the_loop_or_the_quadratic_form_on_short_sequences_and_the_scan_on_long_ones():
    for n in (1, 63, 64, 65, 200):
        X = torch.from_numpy(np.random.default_rng(n).standard_normal((2, n, 4)))
        selective = SelectiveSSM.random(4, 4, step_range=(0.05, 2.0), seed=n)
        ssd = SSD.random(4, 3, N=5, heads=2, step_range=(0.05, 2.0), seed=n)
        with torch.no_grad():
            assert torch.equal(selective(X), selective(X, method="recurrence" if n < 64 else "scan")), n
            assert torch.equal(ssd(X), ssd(X, method="quadratic" if n <= 64 else "scan")), n


def test_vectorised_jacobian_through_the_model_scan_equals_the_loops():
    # jacobian(vectorize=True) runs the backward once per batched cotangent: the fallback must not
    # reach into the outer graph that the first backward freed (it did, at n >= 64 under "auto").
    model = SelectiveSSM.random(2, 4, seed=0)
    X = torch.randn(66, 2, dtype=torch.float64)
    fast = torch.autograd.functional.jacobian(lambda Z: model(Z, method="scan"), X, vectorize=True)
    loop = torch.autograd.functional.jacobian(lambda Z: model(Z, method="recurrence"), X)
    assert rel(fast, loop) <= 1e-12


# -- the FFT convolution ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,m", [(1, 1), (1, 5), (7, 3), (7, 7), (64, 100), (300, 17)])
def test_fft_causal_conv_equals_the_direct_sum(n, m):
    # y[:, t] = Σ_{ℓ<=t, ℓ<m} K_ℓ x[:, t−ℓ] with K (m, p, d), x (b, n, d); taps ℓ >= n never act.
    rng = np.random.default_rng(n + m)
    x, K = rng.standard_normal((2, n, 3)), rng.standard_normal((m, 2, 3))
    expected = np.zeros((2, n, 2))
    for t in range(n):
        for ell in range(min(t + 1, m)):
            expected[:, t] += x[:, t - ell] @ K[ell].T
    y = fft_causal_conv(torch.from_numpy(x), torch.from_numpy(K), "fpd,bfd->bfp").numpy()
    assert y.shape == (2, n, 2)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
