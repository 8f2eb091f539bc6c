"""Benchmark 3: forward passes of the LTI and the selective SSM, fast routes vs the sequential loop.

    .venv/bin/python benchmarks/bench_forward.py [--quick] [--pairs 5]

Baseline: method "recurrence", the plain per-step loop (for the selective SSM the loop of
Mamba's reference `selective_scan_ref`). Ours: for `LinearSSM` the FFT convolution with
its kernel ("fft"), the chunked scan ("scan") and what `method="auto"` picks (the route
every caller of `model(X)` in the book gets); for `SelectiveSSM` the two-level chunked
scan ("scan", which "auto" picks). All routes of one model run round-robin in the same
process (recurrence, fft, scan, auto, recurrence, …) after a warm-up; each ratio is the
median over the rounds of recurrence / route. Outputs must equal the loop's to 1e-10
(max |Δ| / max |y|, float64). Peak memory of every route in a fresh process at
L ≥ 1024. Target: ≥ 5× over the loop at L = 4096 for the route "auto" picks.

"auto" never picks the FFT: its rounding error is absolute (about 1e-16 times the largest
output), so outputs many orders of magnitude smaller than the largest — the far end of a
decaying impulse response, hence of a gradient profile — come out as noise, while the loop
and the scan keep them to relative accuracy (tests/test_fast_routes.py shows both).

Sizes: one sequence (batch 1); LinearSSM N = 16, p = d = 8, spectral radius 0.99;
SelectiveSSM d = 8, N = 16 (Mamba's initialisation); L ∈ {16, 64, 256, 1024, 4096, 16384}
(the short ones show where "auto" switches routes). Timer, threads and peak memory:
benchmarks/harness.py.
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import sys  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lib.ssm  # noqa: E402
from harness import Target, begin, finish, interleaved, max_rel_diff, peak_mib, row  # noqa: E402
from lib import LinearSSM, SelectiveSSM  # noqa: E402

CAPABILITY = "forward"
TOLERANCE = 1e-10
TARGET_L = 4096
MEMORY_FROM = 1024  # peak memory is measured at L >= this

MODELS = {
    "LinearSSM": ("LinearSSM N=16 p=d=8 rho=0.99",
                  lambda: LinearSSM.random(16, 8, 8, spectral_radius=0.99, seed=0),
                  ("fft", "scan", "auto")),
    "SelectiveSSM": ("SelectiveSSM d=8 N=16",
                     lambda: SelectiveSSM.random(8, 16, seed=0),
                     ("scan",)),
}
ROUTE_NAMES = {"fft": "FFT convolution with the kernel", "scan": "chunked scan",
               "auto": 'method="auto"', "recurrence": "sequential loop"}


def inputs(model, L: int) -> torch.Tensor:
    return torch.tensor(np.random.default_rng(L).standard_normal((1, L, model.d)))


@contextmanager
def _recording(model, seen: list):
    """Record which route a forward pass takes (by wrapping the route functions)."""
    if isinstance(model, LinearSSM):
        for name in ("recurrence", "fft", "scan"):
            original = getattr(model, f"_{name}")
            setattr(model, f"_{name}", lambda X, _f=original, _n=name: (seen.append(_n), _f(X))[1])
        try:
            yield
        finally:
            for name in ("recurrence", "fft", "scan"):
                delattr(model, f"_{name}")
    else:
        loop, scan = lib.ssm._affine_loop, lib.ssm._TimeChunks.scan
        lib.ssm._affine_loop = lambda a, u: (seen.append("recurrence"), loop(a, u))[1]
        lib.ssm._TimeChunks.scan = lambda self, a, u: (seen.append("scan"), scan(self, a, u))[1]
        try:
            yield
        finally:
            lib.ssm._affine_loop, lib.ssm._TimeChunks.scan = loop, scan


def auto_route(model, L: int) -> str:
    """The route `method="auto"` takes at length L (observed, not re-derived from lib)."""
    seen: list = []
    with _recording(model, seen):
        model(torch.zeros(1, L, model.d, dtype=model.dtype), method="auto")
    return seen[0]


def prepare(key: str, method: str, L: int):
    """(warm, call) for the peak-memory child: one forward pass by `method` at length L."""
    model = MODELS[key][1]()
    X, small = inputs(model, L), inputs(model, 64)
    return (lambda: model(small, method=method)), (lambda: model(X, method=method))


def main() -> int:
    args = harness.parser(__doc__.splitlines()[0]).parse_args()
    begin(CAPABILITY, "Benchmark 3: SSM forward passes vs the sequential loop", args)
    lengths = (16, 64, 256, 1024) if args.quick else (16, 64, 256, 1024, 4096, 16384)
    rows, failed = [], False
    for key, (label, make, routes) in MODELS.items():
        model = make()
        for L in lengths:
            X = inputs(model, L)
            calls = {"recurrence": lambda: model(X, method="recurrence")}
            calls.update({r: (lambda r=r: model(X, method=r)) for r in routes})
            times, out = interleaved(calls, args.pairs)
            picked = auto_route(model, L)
            medians = {r: float(np.median(t)) for r, t in times.items() if r != "auto"}
            fastest = min(medians, key=medians.get)
            accurate = {r: t for r, t in medians.items() if r != "fft"}
            fastest_accurate = min(accurate, key=accurate.get)
            memory = L >= MEMORY_FROM and not args.quick
            base_mib = peak_mib(prepare, key, "recurrence", L) if memory else float("nan")
            for r in routes:
                diff = max_rel_diff(out[r], out["recurrence"])
                note = f'"auto" takes {picked} at this length; fastest measured: {fastest}'
                if fastest == "fft":
                    note += f" (of the entrywise-accurate routes: {fastest_accurate})"
                if diff > TOLERANCE:
                    failed = True
                    note = f"OUTPUTS DIFFER: {diff:.1e} > {TOLERANCE:.0e}; " + note
                is_auto = r == "auto" or (r == picked and "auto" not in routes)
                targets = [Target("max_rel_diff", "<=", TOLERANCE, "≤ 1e-10")]
                if is_auto and L == TARGET_L:
                    targets.insert(0, Target("ratio", ">=", 5, "≥ 5×"))
                name = ROUTE_NAMES[r] + (f" (= {picked})" if r == "auto" else "")
                rows.append(row(CAPABILITY, f"{key} forward", L, model=label, ours=name,
                                baseline=ROUTE_NAMES["recurrence"], ours_times=times[r],
                                baseline_times=times["recurrence"], max_rel_diff=diff,
                                ours_peak_mib=peak_mib(prepare, key, r, L) if memory else float("nan"),
                                baseline_peak_mib=base_mib, note=note, targets=targets))
    status = finish(rows, CAPABILITY, args)
    return 1 if failed else status


if __name__ == "__main__":
    sys.exit(main())
