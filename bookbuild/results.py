"""Result tables: the build's (``_build/results``) against the committed copies
(``data/results``) within the tolerances stored beside them (``<name>.meta.yaml``, written by
``run.table``); ``make data`` copies the build's over the committed ones."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .book import Book, read_json

MAX_LINES_PER_TABLE = 8
NOT_FROM_NOTEBOOKS = ("bench",)  # folders of data/results that benchmarks write
OFFLINE = "offline"  # a folder of offline runs' tables (<chapter>/offline/): no notebook writes them
README_SCREENSHOT = ("chapters__head-count__index.png", Path("docs") / "screenshot.png")


def _files(folder: Path, pattern: str = "*") -> dict[str, Path]:
    """Files under ``folder`` that notebooks own, keyed by their path relative to it."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob(pattern))
            if p.is_file() and p.relative_to(folder).parts[0] not in NOT_FROM_NOTEBOOKS
            and OFFLINE not in p.relative_to(folder).parts[:-1]} \
        if folder.exists() else {}


def _meta(csv: Path) -> dict:
    meta = csv.with_name(csv.stem + ".meta.yaml")
    if not meta.exists():
        raise FileNotFoundError(f"{meta} is missing (tolerances for {csv.name})")
    return yaml.safe_load(meta.read_text()) or {}


def compare_table(run: Path, committed: Path, name: str) -> list[str]:
    """Readable differences between two versions of one table: numbers within
    ``|run - committed| <= atol + rtol |committed|`` (numpy.isclose, per-column tolerances
    from the meta's ``columns``), every other cell exactly as written."""
    meta = _meta(committed)
    new, ref = (pd.read_csv(p, dtype=str, keep_default_na=False) for p in (run, committed))
    if list(new.columns) != list(ref.columns):
        return [f"{name}: columns differ: committed {list(ref.columns)}, this build {list(new.columns)}"]
    if len(new) != len(ref):
        return [f"{name}: committed {len(ref)} rows, this build {len(new)}"]
    numbers = ref.apply(pd.to_numeric, errors="coerce")
    problems = []
    for col in ref.columns:
        tol = {"rtol": meta.get("rtol", 0.0), "atol": meta.get("atol", 0.0),
               **(meta.get("columns") or {}).get(col, {})}
        x, y = pd.to_numeric(new[col], errors="coerce"), numbers[col]
        close = x.notna() & y.notna() & np.isclose(x, y, rtol=float(tol["rtol"]),
                                                   atol=float(tol["atol"]), equal_nan=True)
        for r in np.flatnonzero((new[col] != ref[col]) & ~close):
            label = ", ".join(f"{h}={v}" for h, v in ref.iloc[r].items() if pd.isna(numbers.iloc[r][h]))
            detail = (f"committed {ref[col].iloc[r]}, this build {new[col].iloc[r]} "
                      f"(rtol={float(tol['rtol']):g}, atol={float(tol['atol']):g})"
                      if x.notna().iloc[r] and y.notna().iloc[r] else
                      f"committed {ref[col].iloc[r]!r}, this build {new[col].iloc[r]!r}")
            problems.append(f"{name}: [{label or f'row {r + 1}'}] {col}: {detail}")
    if len(problems) > MAX_LINES_PER_TABLE:
        problems[MAX_LINES_PER_TABLE:] = [
            f"{name}: ... {len(problems) - MAX_LINES_PER_TABLE} more values drift"]
    return problems


def changed_params(committed: dict, run: dict) -> dict:
    """{name: (committed, build)} for parameters both record that differ (an added one is no change)."""
    old, new = committed.get("params") or {}, run.get("params") or {}
    return {k: (old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}


def compare_all(book: Book) -> list[str]:
    """Every difference between the build's tables and the committed ones."""
    profile = read_json(book.report_path, {}).get("profile")
    if profile not in (None, "published"):
        return [f"the last build used the {profile!r} profile; result tables are compared only "
                "for the published profile (run `make book`)"]
    run, committed = _files(book.results, "*.csv"), _files(book.committed_results, "*.csv")
    problems = []
    for name in sorted(set(run) | set(committed)):
        if name not in committed:
            problems.append(f"{name}: produced by the build but not committed "
                            "(run `make data` and commit data/results)")
        elif name not in run:
            problems.append(f"{name}: committed but no notebook produced it in this build "
                            "(stale: remove it, or `make data`)")
        elif _meta(committed[name]).get("profile") != "published":
            problems.append(f"{name}: committed copy was made with profile "
                            f"{_meta(committed[name]).get('profile')!r}, not 'published'")
        elif changed := changed_params(_meta(committed[name]), _meta(run[name])):
            problems.append(f"{name}: parameters changed since the committed copy "
                            f"({changed}); run `make data` to accept")
        else:
            problems += compare_table(run[name], committed[name], name)
    return problems


def _copy(src: Path, dest: Path) -> bool:
    """Copy unless ``dest`` has the same bytes; True when it changed."""
    if dest.exists() and filecmp.cmp(src, dest, shallow=False):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
    return True


def refresh(book: Book, echo=print) -> int:
    """``make data``: the build's tables and tolerances into ``data/results`` (stale ones
    removed), and the site audit's screenshot of a chapter page into ``docs/``; #changed."""
    report = read_json(book.report_path, {})
    if report.get("profile") != "published" or any(
            v.get("status") in ("failed", "skipped") for v in report.get("notebooks", {}).values()):
        raise RuntimeError("`make data` needs a successful build with the published profile "
                           "first (run `make book`)")
    run, old = _files(book.results), _files(book.committed_results)
    changed = 0
    for name, src in sorted(run.items()):
        if _copy(src, book.committed_results / name):
            echo(f"  updated  data/results/{name}")
            changed += 1
    for name in sorted(set(old) - set(run)):
        if name.endswith((".csv", ".meta.yaml")):
            old[name].unlink()
            echo(f"  removed  data/results/{name}")
            changed += 1
    shot, target = book.build / "screenshots" / README_SCREENSHOT[0], README_SCREENSHOT[1]
    if not shot.exists():
        echo(f"  (no {shot.relative_to(book.root)}: run `make test` with Chromium to take it)")
    elif _copy(shot, book.root / target):
        echo(f"  updated  {target}")
        changed += 1
    return changed
