"""lib._scan: the fast routes of SelectiveSSM and SSD against their loops, in values and gradients.

Tolerances: max |fast − loop| / max |loop| <= 1e-12 in float64 and <= 1e-4 in float32 (against
the float64 loop), for y and for the gradient with respect to every input (Δ, A, B, C, x).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lib import SSD, SelectiveSSM
from lib._scan import _segment_sums, selective_loop, selective_scan, ssd_chunked, ssd_loop, ssd_quadratic

TOL = {torch.float64: 1e-12, torch.float32: 1e-4}
# Both layouts of the selective scan, and the default choice.
VARIANTS = [{"inner": False}, {"inner": True}, {}]
VARIANT_IDS = ["chunks-batched", "chunks-inner", "default"]


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
    """y and the gradient of ⟨w, y⟩ (w random) with respect to every input."""
    inputs = [z.clone().requires_grad_() for z in inputs]
    y = route(*inputs)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(y.dtype)
    return [y.detach()] + list(torch.autograd.grad(y, inputs, w))


def assert_agree(fast, ref, tol, what=""):
    names = ["y", "∂Δ", "∂A", "∂B", "∂C", "∂x"]
    for name, f, r in zip(names, fast, ref):
        assert f.shape == r.shape, (what, name)
        assert torch.isfinite(f).all(), (what, name)
        assert rel(f, r) <= tol, f"{what} {name}: {rel(f, r):.2e} > {tol:.0e}"


# -- the selective scan ---------------------------------------------------------------------

SHAPES = [(1, 1, 1, 1), (1, 2, 3, 2), (2, 7, 3, 2), (3, 16, 2, 4), (1, 17, 5, 3), (2, 63, 4, 2),
          (1, 65, 3, 3), (2, 100, 8, 4), (1, 257, 2, 16)]


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("b,n,d,N", SHAPES)
@pytest.mark.parametrize("chunk", [None, 1, 4, 7])
def test_selective_scan_equals_the_loop_in_values_and_gradients_float64(b, n, d, N, chunk, variant):
    # n = 1, 16, 17, 63, 65, 257 and chunks 1, 4, 7 cover n < T, n = T, T ∤ n, K = 1, T = 1.
    inputs = selective_inputs(b, n, d, N, seed=n + d)
    scan = lambda *z: selective_scan(*z, chunk=chunk, **variant)
    assert_agree(values_and_grads(scan, inputs), values_and_grads(selective_loop, inputs), 1e-12)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("b,n,d,N", [(1, 33, 3, 2), (2, 130, 8, 16), (1, 300, 64, 16)])
def test_selective_scan_equals_the_loop_float32(b, n, d, N, variant):
    inputs = selective_inputs(b, n, d, N, torch.float32, seed=n)
    ref = values_and_grads(selective_loop, [z.double() for z in inputs])  # the exact answer
    assert values_and_grads(lambda *z: selective_scan(*z, **variant), inputs)[0].dtype == torch.float32
    assert_agree([z.double() for z in values_and_grads(lambda *z: selective_scan(*z, **variant), inputs)],
                 ref, 1e-4)


@pytest.mark.parametrize("variant", VARIANTS[:2], ids=VARIANT_IDS[:2])
def test_selective_scan_passes_gradcheck(variant):
    inputs = [z.requires_grad_() for z in selective_inputs(2, 7, 3, 2, seed=3)]
    assert torch.autograd.gradcheck(lambda *z: selective_scan(*z, chunk=3, **variant), inputs)


def extreme_log_decays(b, n, d):
    """Δ·A per step: −50 (state wiped), 0 (decay exactly 1, Δ = 0), −1e−12, and blocks of each."""
    g = torch.Generator().manual_seed(0)
    choice = torch.randint(0, 4, (b, n, d), generator=g)
    values = torch.tensor([-50.0, 0.0, -1e-12, -0.5], dtype=torch.float64)
    log_decay = values[choice]
    log_decay[:, : n // 4] = -50.0          # a long wiping stretch …
    log_decay[:, n // 4: n // 2] = -1e-12   # … then decays ≈ 1
    log_decay[:, n // 2: n // 2 + 40] = 0.0  # and exactly 1 (Δ = 0: no input either)
    return log_decay


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_selective_scan_agrees_under_extreme_decays(variant, dtype):
    b, n, d, N = 2, 517, 3, 4
    inputs = selective_inputs(b, n, d, N, dtype, log_decay=extreme_log_decays(b, n, d))
    fast = values_and_grads(lambda *z: selective_scan(*z, chunk=16, **variant), inputs)
    ref = values_and_grads(selective_loop, [z.double() for z in inputs])
    assert_agree([z.double() for z in fast], ref, TOL[dtype], "extreme")


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_selective_scan_float32_is_stable_at_n_4096(variant):
    # Real-width-like shape, long sequence, Mamba-like steps (Δ ~ 1e-3..1e-1 and some large ones).
    b, n, d, N = 1, 4096, 16, 16
    inputs = selective_inputs(b, n, d, N, seed=7)
    inputs[0] = torch.exp(torch.empty(b, n, d, dtype=torch.float64).uniform_(math.log(1e-3), math.log(5.0)))
    inputs32 = [z.float() for z in inputs]
    fast = values_and_grads(lambda *z: selective_scan(*z, **variant), inputs32)
    ref = values_and_grads(selective_loop, inputs)  # float64 loop: the exact answer
    assert_agree([z.double() for z in fast], ref, 1e-4, "float32 n=4096")


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_selective_scan_keeps_tiny_outputs_to_relative_accuracy(variant):
    # An impulse at t = 0 decaying by e^{-0.7} a step: y_t spans 1 .. 1e-240.  Products of decays,
    # never differences of large cumulative sums, keep each y_t to ~1e-13 relative; a log-space
    # scan (exp of cumsum differences) would lose them all past the first few hundred steps.
    n, d, N = 800, 2, 3
    delta = torch.full((1, n, d), 0.7, dtype=torch.float64)
    A = -torch.ones(d, N, dtype=torch.float64)
    B, C = torch.ones(1, n, N, dtype=torch.float64), torch.ones(1, n, N, dtype=torch.float64)
    x = torch.zeros(1, n, d, dtype=torch.float64)
    x[0, 0] = 1.0
    y = selective_scan(delta, A, B, C, x, chunk=16, **variant)[0, :, 0]
    exact = N * 0.7 * torch.exp(-0.7 * torch.arange(n, dtype=torch.float64))
    assert exact[-1] < 1e-240
    torch.testing.assert_close(y, exact, rtol=1e-12, atol=0)


def test_selective_scan_backward_survives_retain_graph_and_vectorised_jacobian():
    # jacobian_norms runs p backward passes over one graph; the benchmarks use
    # jacobian(vectorize=True), which vmaps the backward (the in-place backward falls back).
    inputs = selective_inputs(1, 9, 2, 3, seed=4)
    f = lambda x: selective_scan(inputs[0], inputs[1], inputs[2], inputs[3], x, chunk=4)[0]
    x = inputs[4].clone().requires_grad_()
    y = f(x)
    first = torch.autograd.grad(y[5, 0], x, retain_graph=True)[0]
    again = torch.autograd.grad(y[5, 0], x, retain_graph=True)[0]
    assert torch.equal(first, again)
    J_vec = torch.autograd.functional.jacobian(f, inputs[4], vectorize=True)
    J_loop = torch.autograd.functional.jacobian(lambda x: selective_loop(*inputs[:4], x)[0], inputs[4])
    assert rel(J_vec, J_loop) <= 1e-12
    assert rel(J_vec[5, 0], first) <= 1e-12


def test_selective_scan_has_second_derivatives():
    # create_graph=True takes the loop's autograd (the in-place backward is first order only).
    inputs = [z.requires_grad_() for z in selective_inputs(1, 6, 2, 2, seed=6)]
    assert torch.autograd.gradgradcheck(lambda *z: selective_scan(*z, chunk=4), inputs)


def test_first_order_backward_takes_the_fast_path(monkeypatch):
    import lib._scan as fastscan

    def refuse(*args):
        raise AssertionError("the slow autograd fallback ran")
    monkeypatch.setattr(fastscan, "_vjp_by_autograd", refuse)
    inputs = [z.requires_grad_() for z in selective_inputs(2, 40, 3, 2, seed=8)]
    selective_scan(*inputs).sum().backward()                      # .backward()
    torch.autograd.grad(selective_scan(*inputs)[0, 7, 1], inputs)  # jacobian_norms' call


def test_selective_scan_gradients_are_causal():
    inputs = selective_inputs(2, 37, 3, 2, seed=5)
    x = inputs[4].clone().requires_grad_()
    (g,) = torch.autograd.grad(selective_scan(*inputs[:4], x, chunk=8)[:, 20].sum(), x)
    assert torch.all(g[:, 21:] == 0) and torch.any(g[:, :21] != 0)


# -- SSD --------------------------------------------------------------------------------------

SSD_SHAPES = [(1, 1, 1, 1, 1), (2, 7, 2, 3, 2), (1, 33, 3, 4, 2), (2, 65, 1, 2, 5), (1, 257, 2, 16, 4)]


@pytest.mark.parametrize("b,n,H,N,P", SSD_SHAPES)
@pytest.mark.parametrize("chunk", [1, 4, 7, 32])
def test_ssd_chunked_equals_the_loop_in_values_and_gradients_float64(b, n, H, N, P, chunk):
    inputs = ssd_inputs(b, n, H, N, P, seed=n)
    ref = values_and_grads(ssd_loop, inputs)
    assert_agree(values_and_grads(lambda *z: ssd_chunked(*z, chunk=chunk), inputs), ref, 1e-12, "chunked")


@pytest.mark.parametrize("b,n,H,N,P", SSD_SHAPES)
def test_ssd_quadratic_equals_the_loop(b, n, H, N, P):
    inputs = ssd_inputs(b, n, H, N, P, seed=n)
    assert_agree(values_and_grads(ssd_quadratic, inputs), values_and_grads(ssd_loop, inputs), 1e-12)


def test_ssd_chunked_passes_gradcheck():
    inputs = [z.requires_grad_() for z in ssd_inputs(2, 7, 2, 3, 2, seed=3)]
    assert torch.autograd.gradcheck(lambda *z: ssd_chunked(*z, chunk=3), inputs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ssd_chunked_agrees_under_extreme_decays(dtype):
    b, n, H, N, P = 1, 301, 3, 4, 2
    inputs = ssd_inputs(b, n, H, N, P, seed=2)
    log_decay = extreme_log_decays(b, n, H)
    inputs[1] = -torch.ones(H, dtype=torch.float64)
    inputs[0] = -log_decay
    inputs = [z.to(dtype) for z in inputs]
    fast = values_and_grads(lambda *z: ssd_chunked(*z, chunk=32), inputs)
    ref = values_and_grads(ssd_loop, [z.double() for z in inputs])
    assert_agree([z.double() for z in fast], ref, TOL[dtype], "ssd extreme")


def test_ssd_chunked_float32_is_stable_at_n_4096():
    inputs = ssd_inputs(1, 4096, 4, 16, 8, seed=3)
    fast = values_and_grads(ssd_chunked, [z.float() for z in inputs])
    assert_agree([z.double() for z in fast], values_and_grads(ssd_loop, inputs), 1e-4, "ssd f32")


def test_segment_sums_are_accurate_where_differences_of_cumulative_sums_are_not():
    # 63 steps of −50 then tiny steps, in float32.  The decays exp(Σ_{t=j+1}^{i} z_t) between
    # late i, j are ~0.94..1; differences of cumulative sums subtract two numbers ~3150
    # (ulp 2.4e-4) and get them wrong by ~1e-4 relative, the segment sums by ~1e-7.
    z = torch.cat([torch.full((63,), -50.0), torch.full((64,), -1e-3)]).float()
    late = (slice(63, None), slice(63, None))
    lower = torch.tril(torch.ones(64, 64, dtype=torch.bool))
    exact = torch.exp(_segment_sums(z.double())[late][lower])
    ours = torch.exp(_segment_sums(z)[late][lower].double())
    naive = torch.exp((torch.cumsum(z, 0)[:, None] - torch.cumsum(z, 0)[None, :])[late][lower].double())
    assert ((ours - exact).abs() / exact).max() < 1e-6
    assert ((naive - exact).abs() / exact).max() > 1e-4


# -- "auto" on the models ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 63, 64, 200])
def test_selective_auto_loops_below_64_steps_then_scans(n):
    model = SelectiveSSM.random(3, 4, step_range=(0.05, 2.0), seed=n)
    X = np.random.default_rng(n).standard_normal((2, n, 3))
    expected = "recurrence" if n < 64 else "scan"
    np.testing.assert_array_equal(model(X), model(X, method=expected))


@pytest.mark.parametrize("n", [1, 64, 65, 200])
def test_ssd_auto_takes_the_quadratic_form_up_to_64_steps_then_the_chunked_scan(n):
    model = SSD.random(4, 3, N=5, heads=2, step_range=(0.05, 2.0), seed=n)
    X = np.random.default_rng(n).standard_normal((2, n, 4))
    expected = "quadratic" if n <= 64 else "scan"
    np.testing.assert_array_equal(model(X), model(X, method=expected))
    np.testing.assert_allclose(model(X, method="quadratic"), model(X, method="recurrence"), rtol=1e-10,
                               atol=1e-12 * np.abs(model(X)).max())


def test_vectorised_jacobian_through_the_model_scan_equals_the_loops():
    # jacobian(vectorize=True) runs the backward once per batched cotangent: the fallback must not
    # reach into the outer graph that the first backward freed (it did, at n >= 64 under "auto").
    model = SelectiveSSM.random(4, 8, seed=0)
    X = torch.randn(100, 4, dtype=torch.float64)
    fast = torch.autograd.functional.jacobian(lambda Z: model(Z, method="scan"), X, vectorize=True)
    loop = torch.autograd.functional.jacobian(lambda Z: model(Z, method="recurrence"), X)
    torch.testing.assert_close(fast, loop, rtol=1e-12, atol=1e-14)
