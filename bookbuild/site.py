"""Stage the sources with the executed notebooks, render them with a strict Jupyter Book build,
and swap the result into ``_build/html`` only on success (the site bundle shares both steps)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from .book import Book, BookError
from .ledger import LEDGER_FILE, ledger_inputs

#: What the staged tree holds besides the page folders: configuration, bibliography, assets.
STAGED = ("_config.yml", "_toc.yml", "references.bib", "_static", "images")
FIGURES_DIR = "_figures"  # in the staged tree: _build/figures/<topic>/<name>.png and .yaml
STAMP = ".stage-hash"  # in the built site: the hash of the staged tree it was built from


def tree_hash(root: Path) -> str:
    """sha256 of every file under ``root`` (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def stage(book: Book) -> Path:
    """Recreate ``_build/stage``: sources, page folders whole, executed notebooks, ledger inputs."""
    target = book.stage
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "*.ipynb")
    for name in STAGED:
        if (book.root / name).is_dir():
            shutil.copytree(book.root / name, target / name, ignore=ignore)
        elif (book.root / name).exists():
            shutil.copy2(book.root / name, target / name)
    for folder in sorted({page.parent for page in book.pages} - {Path(".")}):
        shutil.copytree(book.root / folder, target / folder, ignore=ignore, dirs_exist_ok=True)
    for page in book.pages:
        source = book.executed / page if page.suffix == ".ipynb" else book.root / page
        if not source.exists():
            raise BookError(f"{page} has not been executed ({source} missing)")
        (target / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / page)
    # The figures the notebooks saved (PNG + provenance), shown by the {book-figure} directive.
    if book.figures.exists():
        shutil.copytree(book.figures, target / FIGURES_DIR)
    (target / LEDGER_FILE).write_text(json.dumps(ledger_inputs(book), indent=1) + "\n")
    # lib's docstrings (the API page) and the Sphinx extension are inputs of the site too.
    code = sorted([*book.root.glob("lib/**/*.py"), Path(__file__).with_name("sphinx_ext.py")])
    digests = (f"{hashlib.sha256(f.read_bytes()).hexdigest()} {f.relative_to(f.parents[1])}\n" for f in code)
    (target / "_code.sha256").write_text("".join(digests))
    return target


def jupyter_book(book: Book, out: Path, builder: str, echo) -> Path | None:
    """``jupyter-book build --all -W -n --keep-going`` of the staged tree into ``out``: the built
    folder, or None after echoing the warnings (full log in ``_build/<builder>.log``)."""
    command = [str(Path(sys.executable).with_name("jupyter-book")), "build", "--all", "--builder",
               builder, "-W", "-n", "--keep-going", "--path-output", str(out), str(book.stage)]
    echo(f"[book] rendering: jupyter-book build --builder {builder} --all -W -n --keep-going")
    proc = subprocess.run(command, capture_output=True, text=True)
    log = book.build / f"{builder}.log"
    log.write_text(proc.stdout + proc.stderr)
    built = out / "_build" / builder
    if proc.returncode == 0 and (built / book.pages[0].with_suffix(".html")).exists():
        return built
    lines = (proc.stdout + proc.stderr).splitlines()
    for line in [x for x in lines if "WARNING" in x or "ERROR" in x or "Error" in x][:40] or lines[-20:]:
        echo(f"  {line}")
    echo(f"[book] FAILED: jupyter-book build --builder {builder} (full log: "
         f"{log.relative_to(book.root)})")
    return None


def swap(new: Path, target: Path) -> None:
    """Put ``new`` in the place of ``target`` (two renames; the old copy goes last)."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def build_site(book: Book, force: bool = False, echo=print) -> bool:
    """Stage and render; True when ``_build/html`` is current. Skipped when the staged tree is
    the one the current site was built from; a failed build leaves the previous site alone."""
    digest = tree_hash(stage(book))
    stamp = book.html / STAMP
    if not force and stamp.exists() and stamp.read_text().strip() == digest:
        echo("[book] site up to date (staged sources unchanged)")
        return True
    scratch = book.build / "site-new"
    shutil.rmtree(scratch, ignore_errors=True)
    built = jupyter_book(book, scratch, "html", echo)
    if built is None:
        echo("[book] the previous _build/html is untouched")
        return False
    (built / STAMP).write_text(digest + "\n")
    swap(built, book.html)
    shutil.rmtree(scratch, ignore_errors=True)
    return True
