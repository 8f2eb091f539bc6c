"""Benchmark 4: the book itself: a clean build, a no-op rebuild, and each notebook's time.

    .venv/bin/python benchmarks/bench_book.py [--quick] [--keep]

`git clone`s HEAD into a temporary directory (the working tree and its `_build` are never
touched) and runs `python -m bookbuild --root <clone> build` twice with this interpreter:
first clean (every notebook executed, the site rendered), then again with nothing
changed (the no-op rebuild). Per-notebook seconds come from the build's own records,
`<clone>/_build/build-report.json` and `<clone>/_build/manifest.json`.

This is a timing of the whole build, not a ratio: it is compared with the budget (5
minutes clean, 20 s no-op), so it depends on the machine's load; the header records the
load average. Note: the clone holds HEAD's notebooks, data and configuration, but the
build tooling and the notebooks import `bookbuild` and `lib` from the installed checkout,
i.e. the working tree this script runs from (uncommitted changes to lib/ included).
"""

from __future__ import annotations

import harness  # noqa: F401  (pins the thread pools before numpy / torch load)

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from harness import ROOT, Target, begin, finish, row  # noqa: E402

CAPABILITY = "book"
CLEAN_BUDGET_S = 300.0
NOOP_BUDGET_S = 20.0
TIMEOUT_S = 1800


def build(clone: Path, quick: bool, log: Path) -> tuple[float, int]:
    """Run one build of the clone; return (wall seconds, exit status). Output goes to `log`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOK_")}
    command = [sys.executable, "-m", "bookbuild", "--root", str(clone), "build"]
    if quick:
        command.append("--quick")
    start = time.perf_counter()
    with log.open("w") as fh:
        try:
            status = subprocess.run(command, cwd=clone, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            status = -1
    return time.perf_counter() - start, status


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text().splitlines()[-lines:])


def main() -> int:
    parser = harness.parser(__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary clone")
    args = parser.parse_args()
    begin(CAPABILITY, "Benchmark 4: the book build (clean, no-op) against its budget", args)
    scratch = Path(tempfile.mkdtemp(prefix="bench-book-"))
    clone = scratch / "book"
    try:
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=clone, check=True,
                                capture_output=True, text=True).stdout.strip()
        print(f"[book] building HEAD {commit} in {clone} with {sys.executable}\n"
              f"[book] notebooks import lib and bookbuild from the installed checkout {ROOT}",
              flush=True)
        logs = {}
        seconds = {}
        for phase in ("clean", "no-op"):
            logs[phase] = scratch / f"{phase}.log"
            seconds[phase], status = build(clone, args.quick, logs[phase])
            print(f"[book] {phase} build: {seconds[phase]:.1f} s (exit {status})", flush=True)
            if status != 0:
                print(_tail(logs[phase]))
                print(f"[book] FAILED: the {phase} build did not succeed", flush=True)
                return 1
            if phase == "clean":
                report = json.loads((clone / "_build" / "build-report.json").read_text())
                manifest = json.loads((clone / "_build" / "manifest.json").read_text())
        noop_report = json.loads((clone / "_build" / "build-report.json").read_text())
        executed_again = [nb for nb, o in noop_report["notebooks"].items() if o["status"] != "cached"]
        site_skipped = "site up to date" in logs["no-op"].read_text()
    finally:
        if args.keep:
            print(f"[book] kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    notebooks = report["notebooks"]
    profile = report["profile"]
    quick_note = " (quick profile: budgets do not apply)" if args.quick else ""
    clean_targets = [] if args.quick else [Target("ours_s", "<=", CLEAN_BUDGET_S, "≤ 300 s")]
    noop_targets = [] if args.quick else [Target("ours_s", "<=", NOOP_BUDGET_S, "≤ 20 s")]
    rows = [
        row(CAPABILITY, "clean build", len(notebooks), model=f"HEAD {commit}", ours=f"profile {profile}",
            ours_times=[seconds["clean"]], targets=clean_targets,
            note=f"execute every notebook ({os.cpu_count()} at a time) and render the site{quick_note}"),
        row(CAPABILITY, "  executing notebooks", len(notebooks), model=f"HEAD {commit}",
            ours=f"profile {profile}", ours_times=[report["seconds"]],
            note="wall time of the execution phase (build-report.json)"),
        row(CAPABILITY, "  rendering the site", len(notebooks), model=f"HEAD {commit}",
            ours=f"profile {profile}", ours_times=[seconds["clean"] - report["seconds"]],
            note="the rest: jupyter-book build -W -n, staging, start-up"),
        row(CAPABILITY, "no-op rebuild", len(notebooks), model=f"HEAD {commit}", ours=f"profile {profile}",
            ours_times=[seconds["no-op"]], targets=noop_targets,
            note=(f"{len(notebooks) - len(executed_again)} of {len(notebooks)} notebooks cached, site "
                  f"{'skipped (staged sources unchanged)' if site_skipped else 'RENDERED AGAIN'}"
                  + (f"; executed again: {', '.join(executed_again)}" if executed_again else ""))),
    ]
    for nb, outcome in sorted(notebooks.items(), key=lambda kv: -manifest.get(kv[0], {}).get("seconds", 0)):
        rows.append(row(CAPABILITY, "notebook execution", 1, model=nb, ours=f"profile {profile}",
                        ours_times=[manifest.get(nb, {}).get("seconds", outcome["seconds"])],
                        note="one kernel, one thread; run side by side with the others"))
    return finish(rows, CAPABILITY, args)


if __name__ == "__main__":
    sys.exit(main())
