"""Stage the book (sources + executed notebooks) and render it with Jupyter Book.

The site is built in a scratch directory and swapped into ``_build/html`` only when the
strict build (``-W -n``) succeeded, so a failed build never damages the last good site. A
build whose staged tree is byte-identical to the one the current site was built from is
skipped (the no-op rebuild).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .book import Book
from .cache import tree_hash
from .ledger import write_inputs
from .sphinx_ext import LEDGER_FILE

#: What the staged tree holds besides the pages: configuration, bibliography, assets.
STAGED_FILES = ("_config.yml", "_toc.yml", "references.bib")
STAGED_DIRS = ("_static", "images")
STAMP = ".stage-hash"


def stage(book: Book) -> Path:
    """Recreate ``_build/stage`` from the sources, with executed notebooks in place."""
    target = book.stage
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in STAGED_FILES:
        if (book.root / name).exists():
            shutil.copy2(book.root / name, target / name)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    for name in STAGED_DIRS:
        if (book.root / name).is_dir():
            shutil.copytree(book.root / name, target / name, ignore=ignore)
    # Each page folder comes along whole, so pages can include images and files beside them.
    folders = {page.parent for page in book.pages}
    for folder in sorted(folders):
        if folder == Path("."):
            continue
        shutil.copytree(book.root / folder, target / folder, ignore=ignore, dirs_exist_ok=True)
    for page in book.pages:
        (target / page).parent.mkdir(parents=True, exist_ok=True)
        if page.suffix == ".ipynb":
            executed = book.executed / page
            if not executed.exists():
                raise FileNotFoundError(f"{page} has not been executed ({executed} missing)")
            shutil.copy2(executed, target / page)
        else:
            shutil.copy2(book.root / page, target / page)
    # Source notebooks that are not pages (none should exist) must not reach the site raw.
    for stray in target.rglob("*.ipynb"):
        if stray.relative_to(target) not in book.pages:
            stray.unlink()
    # The ledger's checks, tests and notes, for the lines under the claims and the status table.
    write_inputs(book, target / LEDGER_FILE)
    return target


def build_site(book: Book, force: bool = False, echo=print) -> bool:
    """Stage and render; returns True when ``_build/html`` is current and was built cleanly."""
    staged = stage(book)
    digest = tree_hash(staged)
    stamp = book.html / STAMP
    if not force and stamp.exists() and stamp.read_text().strip() == digest:
        echo("[book] site up to date (staged sources unchanged)")
        return True
    scratch = book.build / "site-new"
    shutil.rmtree(scratch, ignore_errors=True)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book), "build", "--all", "-W", "-n", "--keep-going",
               "--path-output", str(scratch), str(staged)]
    echo("[book] rendering the site (jupyter-book build --all -W -n --keep-going)")
    proc = subprocess.run(command, capture_output=True, text=True)
    log = book.build / "jupyter-book.log"
    log.write_text(proc.stdout + proc.stderr)
    built = scratch / "_build" / "html"
    if proc.returncode != 0 or not (built / "index.html").exists():
        problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                    if "WARNING" in line or "ERROR" in line or "Error" in line]
        for line in problems[:40] or (proc.stdout + proc.stderr).splitlines()[-20:]:
            echo(f"  {line}")
        echo(f"[book] FAILED: the site build did not succeed (full log: "
             f"{log.relative_to(book.root)}); the previous _build/html is untouched")
        return False
    (built / STAMP).write_text(digest + "\n")
    old = book.build / "html.old"
    shutil.rmtree(old, ignore_errors=True)
    if book.html.exists():
        book.html.rename(old)
    built.rename(book.html)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return True
