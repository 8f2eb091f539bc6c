"""Execute the book's notebooks with papermill: in parallel, only those whose input hash
changed, with one line per failure, normalised so that two runs give the same bytes."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat

from .book import Book, read_json, write_json

DEFAULT_CELL_TIMEOUT = 600  # seconds; a hung cell fails the build instead of hanging CI
INJECTED = "injected-parameters"


def normalize(nb, profile: str):
    """Strip what differs between two runs (papermill's times and paths, nbclient's timestamps,
    the injected cell's random id) and show the injected parameters, folded, in place of the
    notebook's own parameters cell. Changes ``nb`` in place and returns it."""
    for key in ("papermill", "widgets"):
        nb.metadata.pop(key, None)
    injected = any(INJECTED in c.metadata.get("tags", []) for c in nb.cells)
    for cell in nb.cells:
        for key in ("execution", "papermill"):
            cell.metadata.pop(key, None)
        tags = cell.metadata.get("tags", [])
        if INJECTED in tags:
            cell["id"] = INJECTED
            lines = cell.source.splitlines()
            lines = lines[1:] if lines and lines[0].startswith("# Parameters") else lines
            cell.source = "\n".join(
                [f"# Parameters in force (profile: {profile}; from data/params.yaml)", *lines])
            cell.metadata["tags"] = tags if "hide-input" in tags else [*tags, "hide-input"]
        elif "parameters" in tags and injected and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
    return nb


def execute_one(job: dict) -> dict:
    """Execute one notebook (in a worker process): ``{"ok": True, "seconds"}`` or the failure."""
    import papermill

    source, work = Path(job["root"]) / job["notebook"], Path(job["workdir"])
    # The kernel inherits this environment: where the helper writes, and fixed thread counts so
    # results do not depend on how many notebooks run side by side.
    os.environ.update(BOOK_ROOT=job["root"], BOOK_NOTEBOOK=job["notebook"],
                      BOOK_PROFILE=job["profile"], BOOK_OUTPUT_DIR=str(work / "artifacts"),
                      BOOK_COMMIT=job["commit"], BOOK_THREADS="1", PYTHONHASHSEED="0",
                      OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    current = {}  # the cell running when something goes wrong (a raise, a timeout, a dead kernel)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(source), str(work / "executed.ipynb"), parameters=job["parameters"],
            kernel_name="python3", progress_bar=False, cwd=str(source.parent),
            execution_timeout=job["cell_timeout"],
            # No start-up noise; fd 2 not captured: run.log reaches the terminal, not the page.
            extra_arguments=["--IPKernelApp.log_level=CRITICAL", "--IPKernelApp.capture_fd_output=False"],
            on_cell_start=lambda cell, cell_index: current.update(id=cell.get("id")))
    except Exception as err:
        # Numbered as in the source notebook (what an editor shows), without the injected cell.
        ids = [c.get("id") for c in nbformat.read(source, as_version=4).cells]
        cell = ids.index(current["id"]) + 1 if current.get("id") in ids else "?"
        name = getattr(err, "ename", type(err).__name__)  # PapermillExecutionError: the cell raised
        first = f"cell did not finish within {job['cell_timeout']} s" if "Timeout" in name else next(
            (x.strip() for x in str(getattr(err, "evalue", err)).splitlines() if x.strip()), repr(err))
        return {"ok": False, "message": f"FAILED {job['notebook']} cell {cell}: {name}: {first}"}
    return {"ok": True, "seconds": time.perf_counter() - start}


def _install(book: Book, notebook: str, work: Path, profile: str, previous: dict) -> dict:
    """Put a successful run's normalised notebook and artifacts in place; returns the artifacts."""
    target = book.executed / notebook
    target.parent.mkdir(parents=True, exist_ok=True)
    nb = normalize(nbformat.read(work / "executed.ipynb", as_version=4), profile)
    target.with_suffix(".tmp").write_bytes(nbformat.writes(nb).encode() + b"\n")
    target.with_suffix(".tmp").replace(target)
    installed = {}
    for kind, dest in (("results", book.results), ("figures", book.figures), ("checks", book.checks)):
        for name in previous.get(kind, []):
            (dest / name).unlink(missing_ok=True)
        src = work / "artifacts" / kind
        src.mkdir(parents=True, exist_ok=True)
        installed[kind] = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
        shutil.copytree(src, dest, dirs_exist_ok=True)
    return installed


def refresh_prose(source: Path, executed: Path) -> bool:
    """Give a cached executed notebook the source's markdown cells (the cache ignores prose):
    its code cells, with their outputs, in the source's order. Returns whether it changed."""
    src, done = nbformat.read(source, as_version=4), nbformat.read(executed, as_version=4)
    runs = []  # each executed code cell with the injected-parameters cell that follows it
    for cell in (c for c in done.cells if c.cell_type == "code"):
        if INJECTED in cell.metadata.get("tags", []) and runs:
            runs[-1].append(cell)
        else:
            runs.append([cell])
    code = [c for c in src.cells if c.cell_type == "code"]
    if [c.source for c in code] != [run[0].source for run in runs]:
        raise ValueError(f"{executed} does not hold the code cells of {source}: re-execute it")
    merged = [part for c in src.cells for part in (runs.pop(0) if c.cell_type == "code" else [c])]
    if merged == done.cells:
        return False
    done.cells = merged
    executed.write_bytes(nbformat.writes(done).encode() + b"\n")
    return True


def failures(report: dict) -> list[str]:
    return [o["message"] for o in report["notebooks"].values() if o["status"] == "failed"]


def execute_notebooks(book: Book, profile: str = "published", jobs: int | None = None, force=(),
                      cell_timeout: int | None = None, echo=print) -> dict:
    """Execute the notebooks whose input hash changed, or that lie under a ``force`` path.
    Returns the report written to ``_build/build-report.json``: profile, seconds, and per
    notebook its status (executed, cached, failed, skipped), seconds and failure message."""
    started = time.perf_counter()
    book.check_params_cover_toc()
    manifest, commit = read_json(book.manifest_path, {}), book.commit()
    report = {"profile": profile, "notebooks": {}}
    outcomes = report["notebooks"]
    tmp_root = book.build / "tmp"
    shutil.rmtree(tmp_root, ignore_errors=True)
    notebooks = [str(p) for p in book.notebooks]
    last = [nb for nb in notebooks if book.entry(nb).get("run_last")]
    first = [nb for nb in notebooks if nb not in last]
    forced = [p.rstrip("/") for p in force]
    for number, wave in enumerate((first, last)):
        if wave and failures(report):
            outcomes.update({nb: dict(status="skipped", seconds=0.0, message="an earlier notebook failed")
                             for nb in wave})
            continue
        # Run-last notebooks report the others' execution times: those are inputs of theirs.
        extra = {nb: round(manifest.get(nb, {}).get("seconds", 0.0), 1) for nb in first} \
            if number else None
        pending = []
        for nb in wave:
            digest, entry = book.input_hash(nb, profile, extra), manifest.get(nb, {})
            if (entry.get("hash") == digest and (book.executed / nb).exists()
                    and not any(nb == p or nb.startswith(p + "/") for p in forced)):
                refresh_prose(book.root / nb, book.executed / nb)
                outcomes[nb] = dict(status="cached", seconds=entry.get("seconds", 0.0))
            else:
                pending.append((nb, digest))
        if wave and not pending:
            echo(f"[book] all {len(wave)} notebook(s) up to date (profile {profile})")
        if not pending:
            continue
        workers = min(jobs or os.cpu_count() or 1, len(pending))
        echo(f"[book] executing {len(pending)} notebook(s), {workers} at a time "
             f"({len(wave) - len(pending)} up to date; profile {profile})")
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {}
            for nb, digest in pending:
                work = tmp_root / nb
                work.mkdir(parents=True)
                timeout = book.entry(nb).get("cell_timeout") or cell_timeout or DEFAULT_CELL_TIMEOUT
                job = dict(root=str(book.root), notebook=nb, profile=profile, workdir=str(work),
                           commit=commit, cell_timeout=int(timeout),
                           parameters=book.parameters(nb, profile))
                futures[pool.submit(execute_one, job)] = (nb, digest, work)
            for future in as_completed(futures):
                nb, digest, work = futures[future]
                try:
                    result = future.result()
                except Exception as err:  # the worker process itself died
                    result = {"ok": False, "message": f"FAILED {nb} cell ?: {type(err).__name__}: {err}"}
                if result["ok"]:
                    installed = _install(book, nb, work, profile, manifest.get(nb, {}))
                    manifest[nb] = {"hash": digest, "seconds": round(result["seconds"], 2),
                                    "profile": profile, **installed}
                    write_json(book.manifest_path, manifest)
                    outcomes[nb] = dict(status="executed", seconds=round(result["seconds"], 2))
                    echo(f"  done     {nb}  {result['seconds']:.1f} s")
                    continue
                outcomes[nb] = dict(status="failed", seconds=0.0, message=result["message"])
                echo(result["message"])
                if (work / "executed.ipynb").exists():  # never built from: red error cells
                    (book.failed / nb).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(work / "executed.ipynb", book.failed / nb)
                    echo(f"         partial output kept in {(book.failed / nb).relative_to(book.root)}")
    report["seconds"] = round(time.perf_counter() - started, 2)
    write_json(book.report_path, report)
    shutil.rmtree(tmp_root, ignore_errors=True)
    return report
