"""Execute the book's notebooks with papermill: in parallel, incrementally, loudly.

Each notebook runs in a worker process of its own (papermill starts a kernel for it) with
the parameters in force from ``data/params.yaml``. A notebook is skipped when its inputs
hash (see :mod:`bookbuild.cache`) is unchanged since its last successful execution.
Successful executions are normalised into ``_build/executed/`` and their result tables and
figures installed under ``_build/results/`` and ``_build/figures/``; a failed execution
leaves everything from the last success in place and keeps its partial output under
``_build/failed/``.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, read_json, write_json
from .cache import notebook_hash
from .normalize import normalized_bytes

DEFAULT_CELL_TIMEOUT = 600  # seconds; a hung cell fails the build instead of hanging CI
POLL_SECONDS = 0.5


@dataclass
class Outcome:
    notebook: str
    status: str  # "executed" | "cached" | "failed" | "skipped"
    seconds: float = 0.0  # wall time of the last successful execution
    message: str = ""  # the one-line failure, for status "failed"


@dataclass
class Report:
    profile: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "seconds": round(self.seconds, 2),
            "notebooks": {
                o.notebook: {"status": o.status, "seconds": round(o.seconds, 2)}
                for o in self.outcomes
            },
        }


# --------------------------------------------------------------------------------------
# The worker: one notebook, one process, one kernel.
# --------------------------------------------------------------------------------------
def _cell_number(source_path: Path, cell_id: str | None) -> str:
    """1-based position, in the source notebook, of the cell with id ``cell_id``.

    Numbering follows the source notebook (what an editor shows), not papermill's executed
    copy, which holds an extra injected cell and, after a failure, error banners.
    """
    import nbformat

    try:
        source = nbformat.read(source_path, as_version=4)
    except Exception:
        return "?"
    for i, cell in enumerate(source.cells):
        if cell_id is not None and cell.get("id") == cell_id:
            return str(i + 1)
    return "?"


def _first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def execute_one(job: dict) -> dict:
    """Execute one notebook (runs in a worker process). Returns a plain dict."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    root = Path(job["root"])
    source = root / job["notebook"]
    work = Path(job["workdir"])
    output = work / "executed.ipynb"
    # The kernel inherits this environment: it tells the notebook helper where to write and
    # pins thread counts so results do not depend on how many notebooks run side by side.
    os.environ.update(
        BOOK_ROOT=str(root),
        BOOK_NOTEBOOK=job["notebook"],
        BOOK_PROFILE=job["profile"],
        BOOK_OUTPUT_DIR=str(work / "artifacts"),
        BOOK_PROGRESS_LOG=str(job["progress_log"]),
        BOOK_COMMIT=job["commit"],
        BOOK_THREADS="1",
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
    )
    # The cell being executed when something goes wrong (a raise, a timeout, a dead kernel).
    current = {"id": None}

    def on_cell_start(cell, cell_index):
        current["id"] = cell.get("id")

    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source),
            str(output),
            parameters=job["parameters"],
            kernel_name="python3",
            progress_bar=False,
            log_output=False,
            cwd=str(source.parent),
            execution_timeout=job["cell_timeout"],
            # The kernel's own start-up warnings (TCP without encryption on loopback) are
            # noise in the terminal; its errors still show.
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
            on_cell_start=on_cell_start,
        )
    except PapermillExecutionError as err:
        cell = _cell_number(source, current["id"])
        return {"ok": False, "cell": cell, "error": f"{err.ename}: {_first_line(err.evalue)}"}
    except Exception as err:  # timeouts, dead kernels, unreadable notebooks
        cell = _cell_number(source, current["id"])
        name = type(err).__name__
        detail = _first_line(str(err)) or repr(err)
        if "Timeout" in name:
            detail = f"cell did not finish within {job['cell_timeout']} s"
        return {"ok": False, "cell": cell, "error": f"{name}: {detail}",
                "trace": traceback.format_exc()}
    return {"ok": True, "seconds": time.perf_counter() - start}


# --------------------------------------------------------------------------------------
# The scheduler.
# --------------------------------------------------------------------------------------
class _Progress:
    """Echo new lines from the notebooks' progress logs to the terminal."""

    def __init__(self, echo):
        self.echo = echo
        self.offsets: dict[Path, int] = {}
        self.names: dict[Path, str] = {}

    def watch(self, notebook: str, log: Path) -> None:
        self.offsets[log] = 0
        self.names[log] = notebook

    def flush(self) -> None:
        for log, offset in list(self.offsets.items()):
            try:
                with log.open() as fh:
                    fh.seek(offset)
                    text = fh.read()
                    self.offsets[log] = fh.tell()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                if line.strip():
                    self.echo(f"      {self.names[log]}: {line.strip()}")

    def forget(self, log: Path) -> None:
        self.flush()
        self.offsets.pop(log, None)
        self.names.pop(log, None)


def _matches(notebook: str, prefixes) -> bool:
    return any(notebook == p.rstrip("/") or notebook.startswith(p.rstrip("/") + "/")
               for p in prefixes)


def _install(book: Book, notebook: str, work: Path, profile: str, manifest_entry: dict) -> dict:
    """Move a successful execution's notebook and artifacts into their persistent places."""
    target = book.executed / notebook
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".ipynb.tmp")
    tmp.write_bytes(normalized_bytes(work / "executed.ipynb", profile))
    tmp.replace(target)
    installed = {}
    for kind, dest in (("results", book.results), ("figures", book.figures), ("checks", book.checks)):
        for old in manifest_entry.get(kind, []):
            (dest / old).unlink(missing_ok=True)
        src = work / "artifacts" / kind
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.exists() else []
        installed[kind] = []
        for path in files:
            rel = path.relative_to(src)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
            installed[kind].append(str(rel))
    return installed


def execute_notebooks(
    book: Book,
    profile: str = "published",
    jobs: int | None = None,
    force=(),
    cell_timeout: int | None = None,
    echo=print,
) -> Report:
    """Execute every stale notebook of ``book`` and return the report.

    ``force`` is a list of path prefixes (a chapter folder or one notebook) to execute even
    when their hash is unchanged.
    """
    started = time.perf_counter()
    book.check_params_cover_toc()
    jobs = max(1, jobs or os.cpu_count() or 1)
    manifest = read_json(book.manifest_path, {})
    report = Report(profile)
    commit = book.commit()
    tmp_root = book.build / "tmp"
    shutil.rmtree(tmp_root, ignore_errors=True)
    notebooks = [str(p) for p in book.notebooks]
    last = [nb for nb in notebooks if book.entry(nb).get("run_last")]
    waves = [[nb for nb in notebooks if nb not in last], last]

    for wave_number, wave in enumerate(waves):
        if not wave:
            continue
        if wave_number and report.failed:
            for nb in wave:
                report.outcomes.append(Outcome(nb, "skipped", message="an earlier notebook failed"))
            continue
        extra = None
        if wave_number:  # run-last notebooks report the others' execution times
            extra = {nb: round(manifest.get(nb, {}).get("seconds", 0.0), 1)
                     for nb in waves[0]}
        pending = []
        for nb in wave:
            digest = notebook_hash(book, Path(nb), profile, extra)
            entry = manifest.get(nb, {})
            fresh = (entry.get("hash") == digest and (book.executed / nb).exists()
                     and not _matches(nb, force))
            if fresh:
                report.outcomes.append(Outcome(nb, "cached", entry.get("seconds", 0.0)))
            else:
                pending.append((nb, digest))
        cached = len(wave) - len(pending)
        if pending:
            echo(f"[book] executing {len(pending)} notebook(s), {min(jobs, len(pending))} at a "
                 f"time ({cached} up to date; profile {profile})")
        else:
            echo(f"[book] all {len(wave)} notebook(s) up to date (profile {profile})")
        _run_wave(book, pending, profile, jobs, cell_timeout, commit, tmp_root, manifest,
                  report, echo)

    report.seconds = time.perf_counter() - started
    write_json(book.report_path, report.to_json())
    shutil.rmtree(tmp_root, ignore_errors=True)
    return report


def _run_wave(book, pending, profile, jobs, cell_timeout, commit, tmp_root, manifest, report,
              echo):
    if not pending:
        return
    progress = _Progress(echo)
    queue = list(pending)
    running = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(queue)), mp_context=context) as pool:
        while queue or running:
            while queue and len(running) < jobs:
                nb, digest = queue.pop(0)
                work = tmp_root / nb
                work.mkdir(parents=True, exist_ok=True)
                log = book.logs / (nb + ".log")
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text("")
                timeout = book.entry(nb).get("cell_timeout") or cell_timeout or DEFAULT_CELL_TIMEOUT
                job = dict(root=str(book.root), notebook=nb, profile=profile, workdir=str(work),
                           progress_log=str(log), commit=commit, cell_timeout=int(timeout),
                           parameters=book.parameters(nb, profile))
                future = pool.submit(execute_one, job)
                running[future] = (nb, digest, work, log)
                progress.watch(nb, log)
                echo(f"  started  {nb}")
            done, _ = wait(running, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            progress.flush()
            for future in done:
                nb, digest, work, log = running.pop(future)
                progress.forget(log)
                try:
                    result = future.result()
                except Exception as err:  # the worker itself died
                    result = {"ok": False, "cell": "?", "error": f"{type(err).__name__}: {err}"}
                if result["ok"]:
                    entry = manifest.get(nb, {})
                    installed = _install(book, nb, work, profile, entry)
                    manifest[nb] = {"hash": digest, "seconds": round(result["seconds"], 2),
                                    "profile": profile, **installed}
                    write_json(book.manifest_path, manifest)
                    report.outcomes.append(Outcome(nb, "executed", result["seconds"]))
                    echo(f"  done     {nb}  {result['seconds']:.1f} s")
                else:
                    message = f"FAILED {nb} cell {result['cell']}: {result['error']}"
                    partial = work / "executed.ipynb"
                    kept = book.failed / nb
                    if partial.exists():
                        kept.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(partial, kept)
                    report.outcomes.append(Outcome(nb, "failed", message=message))
                    echo(message)
                    if partial.exists():
                        echo(f"         partial output kept in {kept.relative_to(book.root)}")
