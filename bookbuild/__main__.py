"""Command line of the build tooling (the Makefile calls these).

    python -m bookbuild build [--quick] [--force PATH ...] [--jobs N]   # make book
    python -m bookbuild audit [--require-browser]                       # site audits
    python -m bookbuild data                                            # make data
    python -m bookbuild bundle                                          # make bundle
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .book import Book, BookError


def _summary(report, echo) -> None:
    executed = [o for o in report.outcomes if o.status == "executed"]
    cached = [o for o in report.outcomes if o.status == "cached"]
    echo(f"[book] {len(executed)} executed, {len(cached)} up to date, "
         f"{len(report.failed)} failed; notebooks took {report.seconds:.1f} s "
         f"(profile {report.profile})")
    slowest = sorted(report.outcomes, key=lambda o: o.seconds, reverse=True)[:3]
    if slowest and slowest[0].seconds:
        echo("[book] slowest (last execution): " + ", ".join(
            f"{o.notebook} {o.seconds:.1f} s" for o in slowest if o.seconds))


def cmd_build(args, book: Book, echo) -> int:
    from .execute import execute_notebooks
    from .site import build_site

    started = time.perf_counter()
    profile = "quick" if args.quick else "published"
    report = execute_notebooks(book, profile=profile, jobs=args.jobs, force=args.force,
                               cell_timeout=args.cell_timeout, echo=echo)
    _summary(report, echo)
    if report.failed:
        for outcome in report.failed:
            echo(outcome.message)
        echo("[book] the site was NOT rebuilt; the previous _build/html is untouched")
        return 1
    if not build_site(book, echo=echo):
        return 1
    echo(f"[book] done in {time.perf_counter() - started:.1f} s. "
         f"Open file://{book.html / 'index.html'}")
    return 0


def cmd_audit(args, book: Book, echo) -> int:
    from .audit import run_audits

    return 0 if run_audits(book, require_browser=args.require_browser, echo=echo) else 1


def cmd_data(args, book: Book, echo) -> int:
    from .results import refresh, refresh_screenshot

    changed = refresh(book, echo=echo) + refresh_screenshot(book, echo=echo)
    echo(f"[data] {changed} file(s) changed under data/results and docs/"
         + ("; review and commit them" if changed else ""))
    return 0


def cmd_bundle(args, book: Book, echo) -> int:
    from .bundle import build_bundle, inspect_bundle

    archive = build_bundle(book, echo=echo)
    summary = inspect_bundle(book, archive)
    pdf = summary.pdf
    echo(f"[bundle] {archive} ({summary.size / 1e6:.1f} MB)")
    if pdf is not None:
        echo(f"[bundle] book.pdf: {pdf.pages} pages, {len(pdf.math_pages)} with math, "
             f"{pdf.image_count} images")
    for problem in summary.problems:
        echo(f"[bundle] PROBLEM {problem}")
    return 1 if summary.problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookbuild")
    parser.add_argument("--root", type=Path, default=None,
                        help="book root (default: the checkout this package is installed from)")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="execute stale notebooks, then render the site")
    build.add_argument("--quick", action="store_true", help="use the quick parameter profile")
    build.add_argument("--force", nargs="*", default=[], metavar="PATH",
                       help="re-execute notebooks under these paths even if unchanged")
    build.add_argument("--jobs", type=int, default=None,
                       help="notebooks executed at once (default: CPU count)")
    build.add_argument("--cell-timeout", type=int, default=None, help="seconds per cell")
    audit = sub.add_parser("audit", help="site audits on the last build")
    audit.add_argument("--require-browser", action="store_true",
                       help="fail (instead of skipping) when Chromium is missing")
    sub.add_parser("data", help="copy the build's result tables to data/results")
    sub.add_parser("bundle", help="zip the site, executed notebooks, requirements and a PDF")
    args = parser.parse_args(argv)
    book = Book(args.root.resolve()) if args.root else Book.here()

    def echo(line: str) -> None:
        print(line, flush=True)

    try:
        return {"build": cmd_build, "audit": cmd_audit, "data": cmd_data,
                "bundle": cmd_bundle}[args.command](
            args, book, echo)
    except BookError as err:
        echo(f"[book] ERROR: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
