"""Result tables: compare the build's tables with the committed copies; refresh them on purpose.

Each table ``<chapter>/<name>.csv`` travels with ``<name>.meta.yaml`` holding its tolerances
(written by :meth:`bookbuild.notebook.NotebookRun.table`). ``make test`` compares the tables
of the last build (``_build/results``) with ``data/results`` under the committed tolerances;
``make data`` copies the build's tables over the committed ones.
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import numpy as np
import yaml

from .book import Book, read_json

MAX_LINES_PER_TABLE = 8
#: Folders of data/results written by other tools (benchmarks), not by notebooks.
NOT_FROM_NOTEBOOKS = ("bench",)


def _files(folder: Path, pattern: str = "*") -> dict[str, Path]:
    """Files under ``folder`` that notebooks own, keyed by their path relative to it."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob(pattern))
            if p.is_file() and p.relative_to(folder).parts[0] not in NOT_FROM_NOTEBOOKS}


def _tables(folder: Path) -> dict[str, Path]:
    return _files(folder, "*.csv")


def _meta(csv: Path) -> dict:
    meta = csv.with_name(csv.stem + ".meta.yaml")
    if not meta.exists():
        raise FileNotFoundError(f"{meta} is missing (tolerances for {csv.name})")
    return yaml.safe_load(meta.read_text()) or {}


def _as_float(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def compare_table(run: Path, committed: Path, name: str) -> list[str]:
    """Readable differences between two versions of one table (empty when they agree)."""
    # The csv module, not pandas: cells stay the strings that were written, so labels and other
    # non-numeric columns compare exactly, and each drift is reported with its row's labels.
    import csv

    meta = _meta(committed)
    problems = []
    with run.open(newline="") as fh:
        run_rows = list(csv.reader(fh))
    with committed.open(newline="") as fh:
        ref_rows = list(csv.reader(fh))
    if not run_rows or not ref_rows:
        return [f"{name}: empty table"]
    header, ref_header = run_rows[0], ref_rows[0]
    if header != ref_header:
        return [f"{name}: columns differ: committed {ref_header}, this build {header}"]
    if len(run_rows) != len(ref_rows):
        return [f"{name}: committed {len(ref_rows) - 1} rows, this build {len(run_rows) - 1}"]
    rtol, atol = float(meta.get("rtol", 0.0)), float(meta.get("atol", 0.0))
    per_column = meta.get("columns") or {}
    drift = 0
    for r, (row, ref) in enumerate(zip(run_rows[1:], ref_rows[1:]), start=1):
        for col, value, expected in zip(header, row, ref):
            if value == expected:
                continue
            tol = per_column.get(col, {})
            c_rtol, c_atol = float(tol.get("rtol", rtol)), float(tol.get("atol", atol))
            x, y = _as_float(value), _as_float(expected)
            if x is not None and y is not None:
                if np.isclose(x, y, rtol=c_rtol, atol=c_atol, equal_nan=True):  # |x − y| <= atol + rtol |y|
                    continue
                detail = f"committed {expected}, this build {value} (rtol={c_rtol:g}, atol={c_atol:g})"
            else:
                detail = f"committed {expected!r}, this build {value!r}"
            drift += 1
            if drift <= MAX_LINES_PER_TABLE:
                label = ", ".join(f"{h}={v}" for h, v in zip(header, ref)
                                  if _as_float(v) is None) or f"row {r}"
                problems.append(f"{name}: [{label}] {col}: {detail}")
    if drift > MAX_LINES_PER_TABLE:
        problems.append(f"{name}: ... {drift - MAX_LINES_PER_TABLE} more values drift")
    return problems


def compare_all(book: Book) -> list[str]:
    """Every difference between the build's tables and the committed ones."""
    report = read_json(book.report_path, {})
    if report.get("profile") not in (None, "published"):
        return [f"the last build used the {report.get('profile')!r} profile; result tables are "
                "compared only for the published profile (run `make book`)"]
    run, committed = _tables(book.results), _tables(book.committed_results)
    problems = []
    for name in sorted(set(run) | set(committed)):
        if name not in committed:
            problems.append(f"{name}: produced by the build but not committed "
                            "(run `make data` and commit data/results)")
        elif name not in run:
            problems.append(f"{name}: committed but no notebook produced it in this build "
                            "(stale: remove it, or `make data`)")
        else:
            meta_run, meta_ref = _meta(run[name]), _meta(committed[name])
            if meta_ref.get("profile") != "published":
                problems.append(f"{name}: committed copy was made with profile "
                                f"{meta_ref.get('profile')!r}, not 'published'")
                continue
            if meta_run.get("params") != meta_ref.get("params"):
                problems.append(f"{name}: parameters changed since the committed copy "
                                f"({meta_ref.get('params')} -> {meta_run.get('params')}); "
                                "run `make data` to accept")
                continue
            problems += compare_table(run[name], committed[name], name)
    return problems


def refresh(book: Book, echo=print) -> int:
    """Copy the build's tables (and their tolerances) to ``data/results``; return #changed."""
    report = read_json(book.report_path, {})
    if report.get("profile") != "published" or any(
            v.get("status") in ("failed", "skipped") for v in report.get("notebooks", {}).values()):
        raise RuntimeError("`make data` needs a successful build with the published profile "
                           "first (run `make book`)")
    run = _files(book.results)
    old = _files(book.committed_results)
    changed = 0
    for name, src in sorted(run.items()):
        dest = book.committed_results / name
        if dest.exists() and filecmp.cmp(src, dest, shallow=False):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        echo(f"  updated  data/results/{name}")
        changed += 1
    for name in sorted(set(old) - set(run)):
        if name.endswith((".csv", ".meta.yaml")):
            old[name].unlink()
            echo(f"  removed  data/results/{name}")
            changed += 1
    return changed


#: The rendered page shown in the README, from the screenshots the site check takes.
README_SCREENSHOT = ("chapters__head-count__index.png", Path("docs") / "screenshot.png")


def refresh_screenshot(book: Book, echo=print) -> bool:
    """Copy the site check's screenshot of a chapter page to ``docs/`` for the README."""
    name, target = README_SCREENSHOT
    source = book.build / "screenshots" / name
    if not source.exists():
        echo(f"  (no {source.relative_to(book.root)}: run `make test` with Chromium to take it)")
        return False
    dest = book.root / target
    if dest.exists() and filecmp.cmp(source, dest, shallow=False):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, dest)
    echo(f"  updated  {target}")
    return True
