"""Run every benchmark, one after the other, each in its own process (`make bench`).

    .venv/bin/python benchmarks/run_all.py [--quick] [--pairs 5] [--only heads forward ...]

Each script prints its machine-facts header and its table, and writes
`<capability>.csv` (plus its rows of `machine.csv`) to data/results/bench/ — the
committed copy the Performance appendix reads — or, with --quick, to _build/bench/.
The scripts run one at a time so that no benchmark shares the machine with another.
Ends with one line per target: met, or short by how much.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import COMMITTED, QUICK_OUT, ROOT, verdict  # noqa: E402

#: capability -> script, in the order they run (the book build last: it is the longest).
SCRIPTS = {
    "heads": "bench_heads.py",
    "gradients": "bench_gradients.py",
    "forward": "bench_forward.py",
    "book": "bench_book.py",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: smaller sizes, results to _build/bench/ (never committed)")
    parser.add_argument("--pairs", type=int, default=None, help="interleaved pairs (default 5)")
    parser.add_argument("--only", nargs="*", choices=list(SCRIPTS), default=list(SCRIPTS))
    args = parser.parse_args()
    out = QUICK_OUT if args.quick else COMMITTED
    started = time.perf_counter()
    failed = []
    for capability in args.only:
        command = [sys.executable, str(HERE / SCRIPTS[capability])]
        if args.quick:
            command.append("--quick")
        if args.pairs is not None:
            command += ["--pairs", str(args.pairs)]
        print(f"\n######## {SCRIPTS[capability]}", flush=True)
        t0 = time.perf_counter()
        status = subprocess.run(command, cwd=ROOT).returncode
        print(f"######## {SCRIPTS[capability]}: {time.perf_counter() - t0:.0f} s, exit {status}", flush=True)
        if status:
            failed.append(capability)

    print(f"\n######## summary ({out.relative_to(ROOT)}; {time.perf_counter() - started:.0f} s in all)")
    for capability in args.only:
        path = out / f"{capability}.csv"
        if not path.exists():
            continue
        with path.open(newline="") as fh:
            for r in csv.DictReader(fh):
                if r["target"] and (r["meets_target"] != "True" or "ratio" in r["target"]
                                    or "ours_s" in r["target"]):
                    print(f"{verdict(r['meets_target'], r['target'])} {capability}: "
                          f"{r['operation'].strip()}, {r['model']}, size {r['size']}: {r['margin']}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (see above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
