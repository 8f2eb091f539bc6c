"""Benchmark 1: head counts from the lags vs from the materialised operator.

    .venv/bin/python benchmarks/bench_heads.py [--quick] [--pairs 5] [--dense-max 1024]

Ours: `lib.min_heads` / `lib.optimal_head_errors` from the n lags only (O(n p d N) work,
O(n p d) memory). Baseline ("dense"): materialise the operator ssm.operator(X) of shape
(n, n, p, d) (the parameters are frozen: no autograd graph), stack the n(n+1)/2 blocks
with j ≤ i and take their singular values (rank with the same rule σ > 1e-10 σ_max; tail
energies Σ_{r>H} σ_r², which equal optimal_head_errors because the block stack and the
weighted lag matrix G have the same Gram matrix). Every timed pair is checked: equal
ranks, equal error curves (rtol 1e-6 relative to the total energy).

Sizes: p = d = 8, N = 64, spectral radius 0.99, n ∈ {256, 1024, 4096}; the dense route
runs where it fits (see `dense_fits`), ours alone at n = 16384 (targets: about 1 s, under
1 GB). Timer, threads and peak memory: benchmarks/harness.py.

Also timed: the lags themselves, `LinearSSM.lags(n)` (A^ℓ B by doubling: O(log n) batched
products) against the per-lag loop L_ℓ = C A^ℓ B by repeated multiplication, at
n ∈ {256, 1024, 4096, 16384} (target at 16384: under 1 s; this replaces a wall-clock
assertion that used to sit in tests/test_ssm.py). Outputs must agree to 1e-10
(max |Δ| / max |L|).
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness import Target, begin, finish, interleaved, peak_mib, repeat, row  # noqa: E402
from lib import LinearSSM, min_heads, optimal_head_errors  # noqa: E402

CAPABILITY = "heads"
P = D = 8
N_STATE = 64
RTOL = 1e-10
MODEL = f"LinearSSM N={N_STATE} p=d={P} rho=0.99"
DENSE_BYTES_PER_OPERATOR_BYTE = 2.1  # measured: the operator, then its stacked lower blocks
GB = 1e9 / 2**20  # 1 GB in MiB


def make_ssm() -> LinearSSM:
    """The SSM with frozen parameters: its lags and operator are plain tensors (no graph)."""
    return LinearSSM.random(N_STATE, D, P, spectral_radius=0.99, seed=0).requires_grad_(False)


def dense_singular_values(ssm: LinearSSM, n: int) -> np.ndarray:
    W = ssm.operator(torch.zeros(n, ssm.d, dtype=ssm.dtype)).numpy()  # (n, n, p, d)
    rows, cols = np.tril_indices(n)
    blocks = W[rows, cols].reshape(len(rows), ssm.p * ssm.d)  # every block with j <= i
    del W
    return np.linalg.svd(blocks, compute_uv=False)


def dense_rank(ssm: LinearSSM, n: int) -> int:
    sigma = dense_singular_values(ssm, n)
    return int((sigma > RTOL * sigma[0]).sum()) if sigma[0] > 0 else 0


def dense_errors(ssm: LinearSSM, n: int, H_max: int) -> np.ndarray:
    squares = dense_singular_values(ssm, n) ** 2
    return np.array([squares[H:].sum() for H in range(H_max + 1)])


#: operation -> (ours, dense), each f(ssm, n).
ROUTES = {
    "min_heads": (lambda s, n: min_heads(s, n), lambda s, n: dense_rank(s, n)),
    "optimal_head_errors": (lambda s, n: optimal_head_errors(s, n, P * D),
                            lambda s, n: dense_errors(s, n, P * D)),
}


def loop_lags(ssm: LinearSSM, n: int) -> np.ndarray:
    """The baseline of the lags: L_ℓ = C A^ℓ B, one matrix product per lag."""
    A, B, C = (t.numpy() for t in (ssm.A, ssm.B, ssm.C))
    power_B, lags = B, np.empty((n, ssm.p, ssm.d))
    for ell in range(n):
        lags[ell] = C @ power_B
        power_B = A @ power_B
    return lags


def lag_rows(ssm: LinearSSM, sizes, pairs: int, quick: bool) -> list[dict]:
    """Rows of the lags benchmark: `ssm.lags(n)` (doubling) vs `loop_lags` (per-lag loop)."""
    rows = []
    for n in sizes:
        times, out = interleaved({"ours": lambda: ssm.lags(n).numpy(), "loop": lambda: loop_lags(ssm, n)},
                                 pairs)
        diff = float(np.abs(out["ours"] - out["loop"]).max() / np.abs(out["loop"]).max())
        assert diff <= 1e-10, diff
        targets = [Target("ours_s", "<=", 1.0, "≤ 1 s")] if n == 16384 and not quick else []
        rows.append(row(CAPABILITY, "lags", n, model=MODEL, ours="LinearSSM.lags (doubling)",
                        baseline="per-lag loop C A^ℓ B", ours_times=times["ours"],
                        baseline_times=times["loop"], max_rel_diff=diff, targets=targets))
    return rows


def prepare(operation: str, which: int, n: int):
    """(warm, call) for the peak-memory child: route `which` (0 ours, 1 dense) at size n."""
    route, ssm = ROUTES[operation][which], make_ssm()
    return (lambda: route(ssm, 8)), (lambda: route(ssm, n))


def dense_fits(n: int, dense_max: int) -> tuple[bool, str]:
    """Whether the dense route runs at n: within --dense-max and half the available memory."""
    need_gib = DENSE_BYTES_PER_OPERATOR_BYTE * n * n * P * D * 8 / 2**30
    available = harness._meminfo_gib("MemAvailable")
    if n > dense_max:
        return False, (f"dense route not run at n = {n}: it would need about {need_gib:.0f} GiB "
                       f"({available:.0f} GiB available) and, scaling the n = 1024 time by n^2, "
                       f"about a minute per call, i.e. over 10 minutes for the warm-up and "
                       f"{{pairs}} pairs of both operations (--dense-max {dense_max}; raise it "
                       f"to measure)")
    if need_gib > available / 2:
        return False, (f"dense route not run at n = {n}: it needs about {need_gib:.0f} GiB, more "
                       f"than half of the {available:.0f} GiB available on this shared machine")
    return True, ""


def agree(operation: str, a, b) -> float:
    """Check the two routes agree; return the max relative difference."""
    if operation == "min_heads":
        assert a == b, (a, b)
        return 0.0
    assert np.allclose(a, b, rtol=1e-6, atol=1e-9 * b[0]), (a[:4], b[:4])
    return float(np.abs(a - b).max() / b[0])


def main() -> int:
    parser = harness.parser(__doc__.splitlines()[0])
    parser.add_argument("--dense-max", type=int, default=1024,
                        help="largest n at which the dense route runs (memory permitting)")
    args = parser.parse_args()
    begin(CAPABILITY, "Benchmark 1: min_heads / optimal_head_errors vs the dense operator", args)
    sizes = (64, 256) if args.quick else (256, 1024, 4096)
    long_n = 2048 if args.quick else 16384
    ssm = make_ssm()
    rows = []
    for operation, (ours, dense) in ROUTES.items():
        for n in sizes:
            fits, why = dense_fits(n, args.dense_max)
            if fits:
                times, out = interleaved({"ours": lambda: ours(ssm, n), "dense": lambda: dense(ssm, n)},
                                         args.pairs)
                diff = agree(operation, out["ours"], out["dense"])
                targets = [Target("ratio", ">=", 100, "≥ 100×")] if n == 1024 else []
                rows.append(row(CAPABILITY, operation, n, model=MODEL, ours="lags + QR/SVD",
                                baseline="dense operator + SVD", ours_times=times["ours"],
                                baseline_times=times["dense"], max_rel_diff=diff,
                                ours_peak_mib=peak_mib(prepare, operation, 0, n),
                                baseline_peak_mib=peak_mib(prepare, operation, 1, n),
                                targets=targets))
            else:
                rows.append(row(CAPABILITY, operation, n, model=MODEL, ours="lags + QR/SVD",
                                baseline="dense operator + SVD (not run)",
                                ours_times=repeat(lambda: ours(ssm, n), args.pairs),
                                ours_peak_mib=peak_mib(prepare, operation, 0, n),
                                note=why.format(pairs=args.pairs)))
        operator_gib = long_n * long_n * P * D * 8 / 2**30
        rows.append(row(CAPABILITY, operation, long_n, model=MODEL, ours="lags + QR/SVD",
                        ours_times=repeat(lambda: ours(ssm, long_n), args.pairs),
                        ours_peak_mib=peak_mib(prepare, operation, 0, long_n),
                        note=f"ours alone: the dense operator by itself would take "
                             f"{operator_gib:.0f} GiB",
                        targets=[] if args.quick else [Target("ours_s", "<=", 1.0, "≤ about 1 s"),
                                                       Target("ours_peak_mib", "<=", GB, "under 1 GB")]))
    rows += lag_rows(ssm, (256, 1024) if args.quick else (256, 1024, 4096, 16384), args.pairs, args.quick)
    return finish(rows, CAPABILITY, args)


if __name__ == "__main__":
    sys.exit(main())
