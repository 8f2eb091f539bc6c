"""benchmarks/bench_forward.py: the route "auto" takes is observed, not guessed; agreement is
measured over every tensor; the quick sizes keep the targets. No timing is asserted."""

from __future__ import annotations

import pytest
import torch

from lib import SSD, LinearSSM, SelectiveSSM, SoftmaxAttention

from .conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_forward")


MODELS = {
    "LinearSSM": lambda: LinearSSM.random(4, 2, 3, seed=1),
    "SelectiveSSM": lambda: SelectiveSSM.random(3, 4, seed=1),
    "SSD": lambda: SSD.random(4, 3, 4, heads=2, seed=1),
}
METHODS = {"LinearSSM": ("recurrence", "scan"), "SelectiveSSM": ("recurrence", "scan"),
           "SSD": ("recurrence", "scan", "quadratic")}  # every route besides "auto"


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("L", [1, 15, 16, 17, 63, 64, 65, 256, 257, 300])
def test_auto_route_names_the_route_whose_output_auto_returns(bench, kind, L):
    # Independent of the recorder: auto's output is bit for bit the output of the route it
    # names, and differs from every other route's (so the comparison can tell them apart).
    model = MODELS[kind]().requires_grad_(False)
    X = torch.tensor(bench.np.random.default_rng(L).standard_normal((1, L, model.d)))
    picked = bench.auto_route(model, L)
    assert picked in METHODS[kind]
    auto = model(X, method="auto")
    assert torch.equal(auto, model(X, method=picked))
    others = [m for m in METHODS[kind] if m != picked]
    distinguishable = [m for m in others if not torch.equal(auto, model(X, method=m))]
    # At L = 1 every route computes the same single step; SSD's chunked form is its
    # quadratic form while L fits in one chunk (32 steps), bit for bit.
    same = {"quadratic", "scan"} - {picked} if kind == "SSD" and L <= 32 else set()
    if L > 1:
        assert distinguishable == [m for m in others if m not in same]


def test_recording_restores_the_routes(bench):
    import lib.ssm

    before = {name: getattr(lib.ssm, name) for name in bench.ROUTE_FUNCTIONS}
    model = MODELS["LinearSSM"]()
    bench.auto_route(SelectiveSSM.random(2, 2), 70)
    bench.auto_route(model, 300)
    assert {name: getattr(lib.ssm, name) for name in bench.ROUTE_FUNCTIONS} == before


def test_auto_route_rejects_bad_arguments(bench):
    with pytest.raises(TypeError, match="model must be"):
        bench.auto_route(SoftmaxAttention.random(2, 2, heads=1), 8)
    for L in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="L must be"):
            bench.auto_route(MODELS["SSD"](), L)


def test_agreement_is_the_worst_tensor(bench):
    loop = (torch.ones(3), torch.full((2,), 2.0))
    ours = (torch.ones(3), torch.tensor([2.0, 2.2]))
    assert bench.agreement(ours, loop) == pytest.approx(0.1)
    assert bench.agreement(ours[1], loop[1]) == pytest.approx(0.1)
    with pytest.raises(ValueError):  # a missing gradient is not silently skipped
        bench.agreement(ours[:1], loop)


def test_backward_call_differentiates_inputs_and_every_parameter(bench):
    model = SelectiveSSM.random(3, 4, seed=2).requires_grad_()
    X, w = bench.inputs(model, 20), bench.cotangent(model, 20)
    grads = bench.backward_call(model, X, "scan", w)()
    assert len(grads) == 1 + len(list(model.parameters())) == 6
    # ⟨w, y⟩ is linear in w: d⟨w, y⟩/dX by autograd of the loop equals the scan's
    Z = X.clone().requires_grad_()
    (expected,) = torch.autograd.grad((model(Z, method="recurrence") * w).sum(), Z)
    assert torch.allclose(grads[0], expected, rtol=1e-10, atol=1e-12)


def test_quick_sizes_keep_the_targets_at_the_shortened_longest_length(bench):
    for case in bench.CASES.values():
        quick = case.quick_lengths()
        assert max(quick) == max(case.lengths) // bench.QUICK_DIVISOR
        assert {L for _, L in case.quick_targets()} <= set(quick)
        assert len(case.quick_targets()) == len(case.targets)
    widths = {c.label.split()[1] for c in bench.CASES.values() if c.family == "SelectiveSSM"}
    assert widths == {"d=8", "d=64", "d=256"}
