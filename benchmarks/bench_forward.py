"""Benchmark 3: SSM forward (and forward+backward) passes, fast routes vs the sequential loop.

    .venv/bin/python benchmarks/bench_forward.py [--quick] [--pairs 9]

Baseline: method "recurrence", the step-by-step loop over time (for the selective SSM the
loop of Mamba's reference `selective_scan_ref`). Ours, per model (`model(X, method=...)`):

* `LinearSSM` (float64, N = 16, p = d = 8, spectral radius 0.99): "scan" (a convolution
  inside chunks of 64 steps, the state carried across them) and "auto" (the route every
  `model(X)` in the book takes). L ∈ {16, 64, 256, 1024, 4096, 16384}. Target: ≥ 5× for
  "auto" at L = 4096.
* `SelectiveSSM` (float32, N = 16, Mamba's initialisation) at widths d = 8, 64, 256 — the
  width sweep: "scan" (lib.scan.selective_scan, a two-pass chunked scan with a
  hand-written backward) and "auto", forward and forward+backward
  (y = model(X); torch.autograd.grad(y, [X, *parameters], w)). L = 4096 for d = 8, 64 and
  2048 for d = 256, plus L ∈ {16, 32, 64, 256, 1024} to show where "auto" switches from the
  loop to the scan. Targets, for "auto" at the longest L, forward and forward+backward:
  ≥ 5× at d = 64, ≥ 3× at d = 256; ≥ 20× at d = 8 is the stretch goal (reported, never failing).
  Every model-level time includes the selection Δ_t, B_t, C_t (three projections of X),
  which both routes pay; the rows "... route alone" time the two routes on the
  same precomputed Δ, A, B, C, x at the longest L, without it (no target).
* `SSD` (float32, d = p = 64, H = 4 heads of 16 channels, N = 16): "scan" (Mamba-2's chunked
  block decomposition, chunks of 32), "quadratic" (the dual form, O(H L²)) and "auto",
  L ∈ {16, 64, 256, 1024, 4096}; forward+backward without the quadratic form beyond
  L = 1024 (its L × L decay matrices and their gradients).

Forward, the models' parameters are frozen (`requires_grad_(False)`: no graph is built);
forward+backward, they require grad. Method (benchmarks/harness.py): one thread; all
routes of one (model, L, mode) run round-robin in one process after a warm-up, 9 rounds by
default; a ratio is the median over the rounds of loop time / route time. Every row is
checked: outputs (and, forward+backward, every gradient) equal the loop's to
max |Δ| / max |loop| ≤ 1e-10 in float64, ≤ 1e-4 in float32 (the largest over the
tensors); a row outside its tolerance makes the script exit 1. "auto"'s route is observed
(the route functions are wrapped), never re-derived. Peak memory of every route in a
fresh process at L ≥ 1024. --quick: L ≤ 256, and the longest and the target lengths
divided by 8 (targets applied there: a smoke run, never committed).
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import sys  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import lib.scan  # noqa: E402
import lib.ssm  # noqa: E402
from harness import Target, begin, finish, interleaved, max_rel_diff, peak_mib, row  # noqa: E402
from lib import SSD, LinearSSM, SelectiveSSM  # noqa: E402

CAPABILITY = "forward"
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
MEMORY_FROM = 1024  # peak memory is measured at L >= this
QUICK_DIVISOR = 8  # --quick: the longest L of each model divided by this
#: Interleaved pairs by default (the harness's minimum is 5): the loop's per-step cost moves
#: with the machine's load, and with 5 pairs two timings of the same route (scan and "auto"
#: beyond L = 64) differed by up to 2x on the shared two-core machine.
PAIRS = 9
FORWARD, BOTH = "forward", "forward+backward"

ROUTE_NAMES = {"scan": "chunked scan", "quadratic": "quadratic (dual) form",
               "auto": 'method="auto"', "recurrence": "sequential loop"}
#: lib.ssm's module globals that the models look up at call time, by route.
ROUTE_FUNCTIONS = {"lti_loop": "recurrence", "lti_chunked": "scan", "selective_loop": "recurrence",
                   "selective_scan": "scan", "ssd_loop": "recurrence", "ssd_chunked": "scan",
                   "ssd_quadratic": "quadratic"}


@dataclass(frozen=True)
class Case:
    """One model of the table: its routes, lengths, modes and targets."""

    family: str                      # LinearSSM, SelectiveSSM, SSD (the operation's prefix)
    label: str                       # the model column
    make: Callable[[], object]
    routes: tuple[str, ...]          # ours (the loop is the baseline of every row)
    lengths: tuple[int, ...]
    modes: tuple[str, ...] = (FORWARD,)
    targets: dict = field(default_factory=dict)   # (mode, L) -> (value, label)
    skip: dict = field(default_factory=dict)      # (mode, route) -> longest L it runs at

    def quick_lengths(self) -> tuple[int, ...]:
        """--quick: the lengths up to 256, and the longest and target lengths shortened."""
        short = {L for L in self.lengths if L <= 256}
        shortened = {L // QUICK_DIVISOR for L in (max(self.lengths), *(L for _, L in self.targets))}
        return tuple(sorted(short | shortened))

    def quick_targets(self) -> dict:
        """--quick: the targets at the shortened lengths (a smoke run of the same rows)."""
        return {(mode, L // QUICK_DIVISOR): t for (mode, L), t in self.targets.items()}


def _selective(d: int, longest: int, targets: tuple[float, str]) -> Case:
    return Case("SelectiveSSM", f"SelectiveSSM d={d} N=16 float32",
                lambda: SelectiveSSM.random(d, 16, seed=0, dtype=torch.float32),
                ("scan", "auto"), (16, 32, 64, 256, 1024, longest), (FORWARD, BOTH),
                {(FORWARD, longest): targets, (BOTH, longest): targets})


STRETCH = (20.0, "≥ 20× (stretch goal)")
CASES = {
    "LinearSSM": Case("LinearSSM", "LinearSSM N=16 p=d=8 rho=0.99 float64",
                      lambda: LinearSSM.random(16, 8, 8, spectral_radius=0.99, seed=0),
                      ("scan", "auto"), (16, 64, 256, 1024, 4096, 16384),
                      targets={(FORWARD, 4096): (5.0, "≥ 5×")}),
    "SelectiveSSM d=8": _selective(8, 4096, STRETCH),
    "SelectiveSSM d=64": _selective(64, 4096, (5.0, "≥ 5×")),
    "SelectiveSSM d=256": _selective(256, 2048, (3.0, "≥ 3×")),
    "SSD": Case("SSD", "SSD d=p=64 H=4 N=16 float32",
                lambda: SSD.random(64, 64, 16, heads=4, seed=0, dtype=torch.float32),
                ("scan", "quadratic", "auto"), (16, 64, 256, 1024, 4096), (FORWARD, BOTH),
                skip={(BOTH, "quadratic"): 1024}),
}


# --------------------------------------------------------------------------------------
# Inputs and calls
# --------------------------------------------------------------------------------------
def frozen(case: Case):
    """The case's model with frozen parameters: a forward pass builds no graph."""
    return case.make().requires_grad_(False)


def inputs(model, L: int) -> torch.Tensor:
    """One sequence (batch 1) of standard normal tokens, shape (1, L, d), in the model's dtype."""
    X = np.random.default_rng(L).standard_normal((1, L, model.d))
    return torch.tensor(X, dtype=model.dtype)


def cotangent(model, L: int) -> torch.Tensor:
    """The fixed w of the reverse pass (dL/dY), shape (1, L, p)."""
    w = np.random.default_rng([L, 1]).standard_normal((1, L, model.p))
    return torch.tensor(w, dtype=model.dtype)


def forward_call(model, X: torch.Tensor, method: str) -> Callable[[], torch.Tensor]:
    return lambda: model(X, method=method)


def backward_call(model, X: torch.Tensor, method: str, w: torch.Tensor) -> Callable[[], tuple]:
    """y = model(X); the gradients of ⟨w, y⟩ with respect to X and every parameter.

    ``model`` must require gradients (``model.requires_grad_()``) and X is made a leaf.
    """
    X = X.detach().clone().requires_grad_()
    leaves = [X, *model.parameters()]
    return lambda: torch.autograd.grad(model(X, method=method), leaves, w)


def calls(case: Case, model, trainable, L: int, mode: str) -> dict[str, Callable]:
    """The routes timed at (L, mode): the loop first, then ours (those not skipped there)."""
    X = inputs(model, L)
    routes = ("recurrence",) + tuple(r for r in case.routes if L <= case.skip.get((mode, r), L))
    if mode == FORWARD:
        return {r: forward_call(model, X, r) for r in routes}
    w = cotangent(model, L)
    return {r: backward_call(trainable, X, r, w) for r in routes}


def agreement(ours, loop) -> float:
    """max |ours − loop| / max |loop|, the largest over the tensors (output or gradients)."""
    if isinstance(ours, torch.Tensor):
        return max_rel_diff(ours, loop)
    return max(max_rel_diff(a, b) for a, b in zip(ours, loop, strict=True))


def prepare(key: str, method: str, L: int, mode: str):
    """(warm, call) for the peak-memory child: one call of ``method`` at length L."""
    case = CASES[key]
    model = frozen(case)
    trainable = case.make().requires_grad_()
    warm = calls(case, model, trainable, 64, mode)[method]
    return warm, calls(case, model, trainable, L, mode)[method]


# --------------------------------------------------------------------------------------
# Which route "auto" takes
# --------------------------------------------------------------------------------------
@contextmanager
def _recording(model, seen: list):
    """Record which route a forward pass takes, by wrapping the route functions: the module
    globals of lib.ssm (``lti_loop``, ``lti_chunked``, ``selective_loop``, ``selective_scan``,
    ``ssd_loop``, ``ssd_chunked``, ``ssd_quadratic``), which ``forward`` looks up at call time.
    """
    if isinstance(model, (LinearSSM, SelectiveSSM, SSD)):
        originals = {name: getattr(lib.ssm, name) for name in ROUTE_FUNCTIONS}
        for name, route in ROUTE_FUNCTIONS.items():
            setattr(lib.ssm, name,
                    lambda *a, _f=originals[name], _r=route, **k: (seen.append(_r), _f(*a, **k))[1])
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(lib.ssm, name, original)
    else:
        raise TypeError(f"model must be a LinearSSM, SelectiveSSM or SSD; got {type(model).__name__}")


def auto_route(model, L: int) -> str:
    """The route `method="auto"` takes at length L (observed, not re-derived from lib)."""
    if isinstance(L, bool) or not isinstance(L, int) or L < 1:
        raise ValueError(f"L must be a positive integer; got {L!r}")
    seen: list = []
    with _recording(model, seen), torch.no_grad():
        model(torch.zeros(1, L, model.d, dtype=model.dtype), method="auto")
    if len(seen) != 1:
        raise RuntimeError(f"expected one route call at L = {L}; saw {seen}")
    return seen[0]


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------
def measure(key: str, case: Case, L: int, mode: str, args, targets: dict) -> tuple[list, bool]:
    """The rows of one (model, L, mode): every route of ours against the loop."""
    model = frozen(case)
    trainable = case.make().requires_grad_()
    tolerance = TOLERANCE[model.dtype]
    times, out = interleaved(calls(case, model, trainable, L, mode), args.pairs)
    picked = auto_route(model, L)
    medians = {r: float(np.median(t)) for r, t in times.items() if r != "auto"}
    fastest = min(medians, key=medians.get)
    memory = L >= MEMORY_FROM and not args.quick
    mib = {r: peak_mib(prepare, key, r, L, mode) if memory else float("nan") for r in times}
    rows, failed = [], False
    for r in (r for r in times if r != "recurrence"):
        diff = agreement(out[r], out["recurrence"])
        note = f'"auto" takes {picked} at this length; fastest measured: {fastest}'
        if not diff <= tolerance:
            failed = True
            note = f"OUTPUTS DIFFER: {diff:.1e} > {tolerance:.0e}; " + note
        checks = [Target("max_rel_diff", "<=", tolerance, f"≤ {tolerance:.0e}")]
        if r == "auto" and (mode, L) in targets:
            value, label = targets[mode, L]
            checks.insert(0, Target("ratio", ">=", value, label))
        name = ROUTE_NAMES[r] + (f" (= {picked})" if r == "auto" else "")
        rows.append(row(CAPABILITY, f"{case.family} {mode}", L, model=case.label, ours=name,
                        baseline=ROUTE_NAMES["recurrence"], ours_times=times[r],
                        baseline_times=times["recurrence"], max_rel_diff=diff,
                        ours_peak_mib=mib[r], baseline_peak_mib=mib["recurrence"], note=note,
                        targets=checks))
    return rows, failed


def routes_alone(case: Case, L: int, mode: str, args) -> tuple[dict, bool]:
    """lib.scan.selective_scan vs selective_loop on the model's own Δ, A, B, C, x (no selection)."""
    model = frozen(case)
    X = inputs(model, L)
    delta, B, C = model.selection(X)
    factors = [delta, -torch.exp(model.A_log), B, C, X]  # Δ, A, B, C, x
    routes = {"recurrence": lib.scan.selective_loop, "scan": lib.scan.selective_scan}
    if mode == FORWARD:
        timed = {r: (lambda f=f: f(*factors)) for r, f in routes.items()}
    else:
        leaves = [z.clone().requires_grad_() for z in factors]
        w = cotangent(model, L)
        timed = {r: (lambda f=f: torch.autograd.grad(f(*leaves), leaves, w)) for r, f in routes.items()}
    times, out = interleaved(timed, args.pairs)
    tolerance = TOLERANCE[model.dtype]
    diff = agreement(out["scan"], out["recurrence"])
    note = "both routes on the same precomputed Δ, A, B, C, x: the model's time without the selection"
    failed = not diff <= tolerance
    if failed:
        note = f"OUTPUTS DIFFER: {diff:.1e} > {tolerance:.0e}; " + note
    return row(CAPABILITY, f"{case.family} {mode}, route alone", L, model=case.label,
               ours="lib.scan.selective_scan", baseline="lib.scan.selective_loop",
               ours_times=times["scan"], baseline_times=times["recurrence"], max_rel_diff=diff,
               note=note, targets=[Target("max_rel_diff", "<=", tolerance, f"≤ {tolerance:.0e}")]), failed


def main() -> int:
    parser = harness.parser(__doc__.splitlines()[0])
    parser.set_defaults(pairs=PAIRS)
    args = parser.parse_args()
    begin(CAPABILITY, "Benchmark 3: SSM forward passes vs the sequential loop", args)
    rows, failed = [], False
    for key, case in CASES.items():
        lengths = case.quick_lengths() if args.quick else case.lengths
        targets = case.quick_targets() if args.quick else case.targets
        for mode in case.modes:
            for L in lengths:
                new, bad = measure(key, case, L, mode, args, targets)
                rows += new
                failed |= bad
                print(f"[forward] {case.label}, {mode}, L = {L}: "
                      + ", ".join(f"{r['ours']} {r['ratio']:.2f}x" for r in new), flush=True)
            if case.family == "SelectiveSSM":
                alone, bad = routes_alone(case, max(lengths), mode, args)
                rows.append(alone)
                failed |= bad
    status = finish(rows, CAPABILITY, args)
    return 1 if failed else status


if __name__ == "__main__":
    sys.exit(main())
