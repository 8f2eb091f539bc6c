"""``python -m bookbuild build [--quick] [--force PATH ...] [--jobs N] | audit
[--require-browser] | data | bundle`` (the Makefile's targets)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .book import Book, BookError


def cmd_build(args, book: Book, echo) -> int:
    from .execute import execute_notebooks, failures
    from .site import build_site
    started = time.perf_counter()
    report = execute_notebooks(book, profile="quick" if args.quick else "published", jobs=args.jobs,
                               force=args.force, cell_timeout=args.cell_timeout, echo=echo)
    outcomes = report["notebooks"]
    count = {s: sum(o["status"] == s for o in outcomes.values()) for s in ("executed", "cached", "failed")}
    echo(f"[book] {count['executed']} executed, {count['cached']} up to date, {count['failed']} "
         f"failed; notebooks took {report['seconds']:.1f} s (profile {report['profile']})")
    slowest = sorted((o["seconds"], nb) for nb, o in outcomes.items() if o["seconds"])[::-1][:3]
    if slowest:
        echo("[book] slowest (last execution): " + ", ".join(f"{nb} {s:.1f} s" for s, nb in slowest))
    if failures(report):
        echo("\n".join([*failures(report),
                         "[book] the site was NOT rebuilt; the previous _build/html is untouched"]))
        return 1
    if not build_site(book, echo=echo):
        return 1
    echo(f"[book] done in {time.perf_counter() - started:.1f} s. Open file://{book.html / 'index.html'}")
    return 0


def cmd_audit(args, book: Book, echo) -> int:
    from .audit import run_audits
    return 0 if run_audits(book, require_browser=args.require_browser, echo=echo) else 1


def cmd_data(args, book: Book, echo) -> int:
    from .results import refresh
    changed = refresh(book, echo=echo)
    echo(f"[data] {changed} file(s) changed under data/results and docs/"
         + ("; review and commit them" if changed else ""))
    return 0


def cmd_bundle(args, book: Book, echo) -> int:
    from .bundle import build_bundle, inspect_bundle
    summary = inspect_bundle(book, build_bundle(book, echo=echo))
    echo(f"[bundle] {summary.archive}: {summary.describe()}")
    for problem in summary.problems:
        echo(f"[bundle] PROBLEM {problem}")
    return 1 if summary.problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookbuild")
    parser.add_argument("--root", type=Path, help="book root (default: this checkout)")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="execute stale notebooks, then render the site")
    build.add_argument("--quick", action="store_true", help="the quick parameter profile")
    build.add_argument("--force", nargs="*", default=[], metavar="PATH",
                       help="re-execute the notebooks under these paths even if unchanged")
    build.add_argument("--jobs", type=int, help="notebooks at once (default: CPUs)")
    build.add_argument("--cell-timeout", type=int, help="seconds per cell")
    sub.add_parser("audit", help="site audits on the last build").add_argument(
        "--require-browser", action="store_true", help="fail, not skip, without Chromium")
    sub.add_parser("data", help="copy the build's result tables to data/results")
    sub.add_parser("bundle", help="zip the site, executed notebooks, requirements and a PDF")
    args = parser.parse_args(argv)
    book = Book(args.root.resolve()) if args.root else Book.here()
    commands = {"build": cmd_build, "audit": cmd_audit, "data": cmd_data, "bundle": cmd_bundle}
    try:
        return commands[args.command](args, book, lambda line: print(line, flush=True))
    except BookError as err:
        print(f"[book] ERROR: {err}", flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
