"""Benchmark 2: gradient profiles by p reverse passes (lib.jacobian_norms) vs the full Jacobian.

    .venv/bin/python benchmarks/bench_gradients.py [--quick] [--pairs 5]

Ours: `jacobian_norms(model, X, i)`, one forward pass and p reverse passes from y_i.
Baseline: `torch.autograd.functional.jacobian` of the whole map X ↦ Y (an (n·p) × (n·d)
Jacobian; `vectorize=True`, i.e. all n·p vector–Jacobian products batched with vmap, its
fastest mode), followed by the norms of the blocks ∂y_i/∂x_j. i = n − 1 (the full
profile). Both call the model's default forward route (`method="auto"`), with the model's
parameters frozen (`requires_grad_(False)`: only X is differentiated). Every pair of
results must agree to 1e-10 relative to the largest norm, float64. Target: ≥ 50× at
n = 2048. Timer and threads: benchmarks/harness.py.
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness import Target, begin, finish, interleaved, max_rel_diff, row  # noqa: E402
from lib import LinearSSM, SelectiveSSM, SoftmaxAttention, jacobian_norms  # noqa: E402

CAPABILITY = "gradients"
TOLERANCE = 1e-10

#: name -> (constructor, sizes at which the baseline is run)
MODELS = {
    # The LTI SSM of the gradient-highway chapter (state 8, width 4), and a smaller one.
    "LinearSSM N=8 p=d=4": (lambda: LinearSSM.random(8, 4, 4, seed=0), (256, 2048)),
    "LinearSSM N=4 p=d=2": (lambda: LinearSSM.random(4, 2, 2, seed=0), (256, 2048)),
    # The baseline's cost grows much faster than n^2 through the selective scan; the two
    # sizes measure that growth (the Performance page extrapolates it to n = 2048, where
    # a single call would take minutes).
    "SelectiveSSM N=4 d=2": (lambda: SelectiveSSM.random(2, 4, seed=0), (256, 512)),
    # n = 2048 is out of reach for the baseline: the vmapped Jacobian batches n·p = 4096
    # reverse passes, each holding an n × n attention matrix (4096 · 2048² floats = 137 GB).
    "SoftmaxAttention H=1 p=d=2": (lambda: SoftmaxAttention.random(2, 2, heads=1, seed=0), (256,)),
}
QUICK_SIZES = (64, 128)


def baseline_norms(model, X: np.ndarray, i: int) -> np.ndarray:
    """Norms of ∂y_i/∂x_j, j <= i, from the full Jacobian (n, p, n, d)."""
    J = torch.autograd.functional.jacobian(lambda Z: model(Z), torch.tensor(X), vectorize=True)
    return np.linalg.norm(J[i, :, : i + 1, :].permute(1, 0, 2).numpy(), axis=(1, 2))


def main() -> int:
    args = harness.parser(__doc__.splitlines()[0]).parse_args()
    begin(CAPABILITY, "Benchmark 2: jacobian_norms vs torch.autograd.functional.jacobian", args)
    rows, failed = [], False
    for name, (make, sizes) in MODELS.items():
        model = make().requires_grad_(False)
        for n in (QUICK_SIZES if args.quick else sizes):
            X = np.random.default_rng(0).standard_normal((n, model.d))
            i = n - 1
            times, out = interleaved({"ours": lambda: jacobian_norms(model, X, i),
                                      "baseline": lambda: baseline_norms(model, X, i)}, args.pairs)
            diff = max_rel_diff(out["ours"], out["baseline"])
            note = ""
            if diff > TOLERANCE:
                failed, note = True, f"VALUES DIFFER: {diff:.1e} > {TOLERANCE:.0e}"
            targets = [Target("ratio", ">=", 50, "≥ 50×"), Target("max_rel_diff", "<=", TOLERANCE, "≤ 1e-10")] \
                if n == 2048 else [Target("max_rel_diff", "<=", TOLERANCE, "≤ 1e-10")]
            rows.append(row(CAPABILITY, "jacobian_norms", n, model=name,
                            ours="p reverse passes from y_i",
                            baseline="autograd.functional.jacobian (vectorize=True)",
                            ours_times=times["ours"], baseline_times=times["baseline"],
                            max_rel_diff=diff, note=note, targets=targets))
            if n == 2048:  # the same call timed back to back, for comparison with the pairs
                rows.append(row(CAPABILITY, "jacobian_norms, ours alone", n, model=name,
                                ours="p reverse passes from y_i", baseline="",
                                ours_times=harness.repeat(lambda: jacobian_norms(model, X, i), args.pairs),
                                note="ours timed back to back, not right after a baseline call: for "
                                     "comparison with the interleaved row above only"))
    status = finish(rows, CAPABILITY, args)
    return 1 if failed else status


if __name__ == "__main__":
    sys.exit(main())
