"""The one harness every benchmark script uses: threads, machine facts, the interleaved timer,
peak memory in a fresh process, targets, tables and the CSVs behind the Performance page.

Import it before numpy or torch (it pins their thread pools at import time)::

    import harness  # noqa: F401  (first import of a benchmark script)
    import numpy as np, torch

Method, in one place:

* **One thread.** numpy's OpenBLAS and torch's OpenMP pools are set to one thread before
  either is imported. On the shared two-core machine two pools competing with each other
  and with other jobs made timings swing by 10x; one thread is also how the book's
  notebooks run (``BOOK_THREADS=1``).
* **Interleaved pairs.** :func:`interleaved` warms every route up once, then calls them
  round-robin (ours, baseline, ours, baseline, ...) for ``pairs`` rounds, and
  :func:`median_ratio` takes the median over the rounds of baseline / ours. Both
  members of a pair see the same machine load, so the ratio holds on a noisy machine
  even when the absolute seconds do not. Garbage is collected before each timed call,
  outside its timing; the objects alive when the timing starts (torch's and lib's own,
  the inputs) are frozen out of the collector first (``gc.freeze``), so that collection
  takes microseconds instead of ~0.2 s with torch loaded, and an automatic collection
  inside a timed call does not walk them either.
* **Peak memory** (:func:`peak_mib`): the growth of the resident set while one call runs,
  in a fresh child process (so memory freed by earlier calls cannot be silently reused),
  after resetting the kernel's peak watermark VmHWM through ``/proc/self/clear_refs``
  (Linux; NaN elsewhere). Children are forked from a ``forkserver`` that has imported
  numpy, torch and lib but computed nothing.
* **Results**: one tidy CSV per capability (:data:`COLUMNS`) plus ``machine.csv``, written
  to ``data/results/bench/`` (the committed copy the Performance page reads) or, for
  ``--quick`` smoke runs, to ``_build/bench/`` so quick numbers never replace them.
"""

from __future__ import annotations

import os

THREADS = 1
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(THREADS)  # must precede the first import of numpy / torch

import argparse  # noqa: E402
import csv  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Iterable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "data" / "results" / "bench"
QUICK_OUT = ROOT / "_build" / "bench"
DEFAULT_PAIRS = 5
MIN_PAIRS = 5

#: Columns of every capability table, in order.
COLUMNS = (
    "capability", "operation", "model", "size", "ours", "baseline",
    "ours_s", "baseline_s", "ratio", "pairs", "max_rel_diff",
    "ours_peak_mib", "baseline_peak_mib", "target", "meets_target", "margin", "note",
    "ours_times_s", "baseline_times_s",
)


def pin_threads() -> None:
    """One thread for torch too (the environment variables cover OpenBLAS and OpenMP)."""
    import torch

    torch.set_num_threads(THREADS)


# --------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------
def _meminfo_gib(field: str) -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _blas_name() -> str:
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older numpy: no dict mode
        return "unknown"


def machine_facts() -> list[tuple[str, str]]:
    """(item, value) pairs that head every benchmark's output."""
    import numpy as np
    import torch

    from bookbuild.book import Book
    from bookbuild.environment import cpu_model

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    commit = Book(ROOT).commit(ignoring=(str(COMMITTED.relative_to(ROOT)),))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return [
        ("date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("CPU", cpu_model()),
        ("logical cores", f"{os.cpu_count()} ({usable} usable by this process)"),
        ("memory", f"{_meminfo_gib('MemTotal'):.1f} GiB total, "
                   f"{_meminfo_gib('MemAvailable'):.1f} GiB available at start"),
        ("load average (1, 5, 15 min) at start", load),
        ("threads", f"torch {torch.get_num_threads()}, OpenBLAS/OpenMP "
                    f"{os.environ.get('OPENBLAS_NUM_THREADS')}/{os.environ.get('OMP_NUM_THREADS')}"
                    " (pinned by benchmarks/harness.py)"),
        ("platform", platform.platform(terse=True)),
        ("Python", platform.python_version()),
        ("numpy", f"{np.__version__} ({_blas_name()})"),
        ("torch", torch.__version__),
        ("commit", commit),
    ]


def print_header(title: str, facts: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in facts)
    print(f"== {title}", flush=True)
    for key, value in facts:
        print(f"   {key:<{width}}  {value}")
    print(flush=True)


# --------------------------------------------------------------------------------------
# The interleaved timer
# --------------------------------------------------------------------------------------
@contextmanager
def _settled():
    """Collect once, then freeze the survivors out of the collector while timing."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def interleaved(routes: dict[str, Callable[[], object]], pairs: int = DEFAULT_PAIRS,
                warmup: int = 1) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Warm each route up, then time them round-robin for ``pairs`` rounds.

    Returns the per-round seconds of each route and each route's warm-up result (for the
    correctness check that every benchmark makes before it reports a ratio).
    """
    if pairs < MIN_PAIRS:
        raise ValueError(f"at least {MIN_PAIRS} interleaved pairs; got {pairs}")
    results = {}
    for _ in range(warmup):
        for name, route in routes.items():
            results[name] = route()
    times: dict[str, list[float]] = {name: [] for name in routes}
    with _settled():
        for _ in range(pairs):
            for name, route in routes.items():
                gc.collect()  # the previous call's garbage is not freed inside this one's timing
                start = time.perf_counter()
                route()
                times[name].append(time.perf_counter() - start)
    return times, results


def median_ratio(baseline: list[float], ours: list[float]) -> float:
    """Median over the rounds of baseline / ours (> 1: ours is faster)."""
    return statistics.median(b / a for a, b in zip(ours, baseline))


def repeat(route: Callable[[], object], times: int = DEFAULT_PAIRS, warmup: int = 1) -> list[float]:
    """Seconds of ``times`` calls after ``warmup`` (for a route without a baseline)."""
    for _ in range(warmup):
        route()
    out = []
    with _settled():
        for _ in range(times):
            gc.collect()
            start = time.perf_counter()
            route()
            out.append(time.perf_counter() - start)
    return out


# --------------------------------------------------------------------------------------
# Peak memory in a fresh process
# --------------------------------------------------------------------------------------
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["numpy", "torch", "lib", "harness"])
    return _CONTEXT


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _peak_child(factory, args, conn) -> None:
    try:
        pin_threads()
        prepared = factory(*args)
        warm, call = prepared if isinstance(prepared, tuple) else (None, prepared)
        if warm is not None:
            warm()  # load code paths and lazily built state before the watermark is reset
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset the peak-RSS watermark VmHWM to the current RSS
        before = _status_kib("VmRSS")
        call()
        conn.send((_status_kib("VmHWM") - before) / 1024)
    except OSError:
        conn.send(float("nan"))
    except BaseException as err:  # report, do not hang the parent
        conn.send(f"{type(err).__name__}: {err}")
    finally:
        conn.close()


def peak_mib(factory: Callable, *args) -> float:
    """Peak growth of the resident set (MiB) while one call runs, in a fresh child process.

    ``factory(*args)`` runs in the child and returns ``call`` or ``(warm, call)``: inputs
    are built (and ``warm()`` run) before the watermark is reset, so the figure is the
    working memory of ``call()`` itself, its output included. ``factory`` must be a
    module-level function (it is sent to the child by name).
    """
    context = _context()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_peak_child, args=(factory, args, send))
    child.start()
    send.close()
    try:
        value = receive.recv()
    except EOFError:
        value = f"child exited with code {child.exitcode} (killed for memory?)"
    child.join()
    if isinstance(value, str):
        raise RuntimeError(f"peak-memory child failed: {value}")
    return value


# --------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A requirement on one column of a row: ``ratio >= 100``, ``ours_s <= 1`` …"""

    column: str
    op: str  # ">=" or "<="
    value: float
    label: str  # how the page states it, e.g. "≥ 100×"

    def met(self, row: dict) -> bool:
        x = row.get(self.column)
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return False
        return x >= self.value if self.op == ">=" else x <= self.value

    def margin(self, row: dict) -> str:
        """'477x (≥ 100×)', '47.6x (≥ 50×): short by 5%', '360 s (≤ 300 s): over by 20%'."""
        x = row.get(self.column)
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return f"{self.column} not measured ({self.label})"
        if self.column == "max_rel_diff":  # a tolerance: where the value is, not a percentage
            return f"max rel diff {x:.1e} ({self.label}){'' if self.met(row) else ': OUTSIDE'}"
        stated = f"{_fmt(x, self.column)} ({self.label})"
        if self.met(row):
            return stated
        if self.op == ">=":
            return f"{stated}: short by {100 * (1 - x / self.value):.0f}%"
        return f"{stated}: over by {100 * (x / self.value - 1):.0f}%"


def _fmt(x: float, column: str) -> str:
    if column == "ratio":
        return f"{x:.3g}×"
    if column.endswith("_mib"):
        return f"{x:.0f} MiB"
    if column.endswith("_s"):
        return f"{x:.3g} s"
    return f"{x:.3g}"


def verdict(meets_target, target: str) -> str:
    """'MET  ' or 'SHORT' for a row's target (``meets_target`` as in the row or its CSV);
    a target labelled "stretch goal" is reported, never required: 'SHORT (stretch goal)'."""
    if meets_target is True or meets_target == "True":
        return "MET  "
    return "SHORT (stretch goal)" if "stretch goal" in target else "SHORT"


def apply_targets(row: dict, targets: Iterable[Target]) -> dict:
    """Fill ``target``, ``meets_target`` and ``margin`` of ``row`` (left empty without targets)."""
    targets = list(targets)
    if targets:
        row["target"] = "; ".join(f"{t.column} {t.label}" for t in targets)
        row["meets_target"] = all(t.met(row) for t in targets)
        row["margin"] = "; ".join(t.margin(row) for t in targets)
    return row


# --------------------------------------------------------------------------------------
# Rows, tables, files
# --------------------------------------------------------------------------------------
def row(capability: str, operation: str, size: int, *, model: str = "", ours: str = "",
        baseline: str = "", ours_times=(), baseline_times=(), max_rel_diff=float("nan"),
        ours_peak_mib=float("nan"), baseline_peak_mib=float("nan"), note: str = "",
        targets: Iterable[Target] = ()) -> dict:
    """One tidy result row: medians and the median pairwise ratio from the raw time lists."""
    ours_times, baseline_times = list(ours_times), list(baseline_times)
    paired = bool(ours_times) and len(ours_times) == len(baseline_times)
    out = {
        "capability": capability, "operation": operation, "model": model, "size": int(size),
        "ours": ours, "baseline": baseline,
        "ours_s": statistics.median(ours_times) if ours_times else float("nan"),
        "baseline_s": statistics.median(baseline_times) if baseline_times else float("nan"),
        "ratio": median_ratio(baseline_times, ours_times) if paired else float("nan"),
        "pairs": len(ours_times) if paired else 0,
        "max_rel_diff": max_rel_diff,
        "ours_peak_mib": ours_peak_mib, "baseline_peak_mib": baseline_peak_mib,
        "target": "", "meets_target": "", "margin": "", "note": note,
        "ours_times_s": " ".join(f"{t:.6g}" for t in ours_times),
        "baseline_times_s": " ".join(f"{t:.6g}" for t in baseline_times),
    }
    return apply_targets(out, targets)


def _cell(value, column: str) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if column == "ratio":
            return f"{value:.1f}x" if value < 100 else f"{value:.0f}x"
        if column.endswith("_s"):
            return f"{value:.4g}"
        if column.endswith("_mib"):
            return f"{value:.1f}"
        if column == "max_rel_diff":
            return f"{value:.1e}"
        return f"{value:.4g}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def print_table(rows: list[dict], columns=("operation", "model", "size", "ours", "baseline",
                                          "ours_s", "baseline_s", "ratio", "max_rel_diff",
                                          "ours_peak_mib", "baseline_peak_mib",
                                          "meets_target")) -> None:
    """A fixed-width table of ``rows`` (operation, size, ours, baseline, ratio, …)."""
    constant = [c for c in columns if c in ("model", "ours", "baseline") and len(rows) > 1
                and len({str(r.get(c, "")) for r in rows}) == 1]
    for c in constant:
        if rows[0].get(c):
            print(f"{c}: {rows[0].get(c)}")
    empty = [c for c in columns if all(_cell(r.get(c, ""), c) in ("", "—") for r in rows)]
    columns = [c for c in columns if c not in constant and c not in empty]
    headers = {"ours_s": "ours s", "baseline_s": "baseline s", "max_rel_diff": "max rel diff",
               "ours_peak_mib": "ours MiB", "baseline_peak_mib": "base MiB",
               "meets_target": "target met"}
    cells = [[_cell(r.get(c, ""), c) for c in columns] for r in rows]
    names = [headers.get(c, c) for c in columns]
    widths = [max([len(n)] + [len(line[i]) for line in cells]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths)))
    print("  ".join("-" * w for w in widths))
    for line in cells:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)), flush=True)
    for r in rows:  # headline targets, and any target missed (tolerances met are not repeated)
        if r.get("margin") and (r["meets_target"] is False or "max_rel_diff" not in r["target"]
                                or ";" in r["target"]):
            print(f"   {verdict(r['meets_target'], r['target'])} {r['operation']}, {r['model']}, "
                  f"size {r['size']}: {r['margin']}")
    notes = dict.fromkeys(f"{r['operation']} size {r['size']}: {r['note']}" for r in rows if r.get("note"))
    for note in notes:
        print(f"   note, {note}")
    print(flush=True)


def _csv_value(value):
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def write_rows(rows: list[dict], capability: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{capability}.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({c: _csv_value(r.get(c, "")) for c in COLUMNS})
    return path


def write_machine(capability: str, facts: list[tuple[str, str]], out: Path) -> Path:
    """Update this capability's rows of ``machine.csv`` (capability, item, value)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "machine.csv"
    kept = []
    if path.exists():
        with path.open(newline="") as fh:
            kept = [r for r in csv.DictReader(fh) if r["capability"] != capability]
    kept += [{"capability": capability, "item": k, "value": v} for k, v in facts]
    order = {"heads": 0, "gradients": 1, "forward": 2, "book": 3}
    kept.sort(key=lambda r: order.get(r["capability"], 9))  # stable: items keep their order
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=("capability", "item", "value"), lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
    return path


# --------------------------------------------------------------------------------------
# The command line every script shares
# --------------------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes for a smoke run; results go to _build/bench/, never to "
                        "the committed data/results/bench/")
    p.add_argument("--pairs", type=int, default=DEFAULT_PAIRS,
                   help=f"interleaved (ours, baseline) rounds after one warm-up (>= {MIN_PAIRS})")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: data/results/bench, or _build/bench with --quick)")
    return p


def output_dir(args) -> Path:
    return args.out if args.out is not None else (QUICK_OUT if args.quick else COMMITTED)


def begin(capability: str, title: str, args) -> list[tuple[str, str]]:
    """Pin threads, print the machine-facts header, record it; returns the facts."""
    pin_threads()
    facts = machine_facts()
    print_header(f"{title}  [{capability}; {args.pairs} interleaved pairs after one warm-up"
                 f"{'; QUICK sizes' if args.quick else ''}]", facts)
    write_machine(capability, facts, output_dir(args))
    return facts


def finish(rows: list[dict], capability: str, args) -> int:
    """Print the table and write the CSV; returns the exit status (0)."""
    print_table(rows)
    path = write_rows(rows, capability, output_dir(args))
    print(f"[bench] wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
          flush=True)
    return 0


def max_rel_diff(a, b) -> float:
    """max |a − b| / max |b| over all entries (numpy arrays or tensors)."""
    import numpy as np

    a = np.asarray(a.detach() if hasattr(a, "detach") else a, dtype=np.float64)
    b = np.asarray(b.detach() if hasattr(b, "detach") else b, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {a.shape} vs {b.shape}")
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())
