"""Content hashes that decide whether a notebook must be executed again.

A notebook is skipped when the hash of (the notebook, its parameters in force, ``lib/**``,
``data/params.yaml``, ``requirements.txt``, the notebook helper, and any extra inputs it
declares) equals the hash recorded at its last successful execution.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .book import HELPER_SOURCE, SHARED_INPUTS, Book


def _files(root: Path, patterns) -> list[Path]:
    """Files matched by glob patterns; a matched folder (e.g. from ``dir/**``) brings all its files."""
    found = set()
    for pattern in patterns:
        for path in root.glob(pattern):
            for file in (path.rglob("*") if path.is_dir() else [path]):
                if file.is_file() and "__pycache__" not in file.parts:
                    found.add(file)
    return sorted(found)


def notebook_hash(book: Book, notebook: Path, profile: str, extra: dict | None = None) -> str:
    """Hex digest of everything the executed ``notebook`` depends on.

    ``extra`` carries inputs that are not files (e.g. the timings a run-last notebook reports).
    """
    entry = book.entry(notebook)
    digest = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    feed("notebook", (book.root / notebook).read_bytes())
    feed("profile", profile.encode())
    feed("parameters", json.dumps(book.parameters(notebook, profile), sort_keys=True).encode())
    feed("helper", HELPER_SOURCE.read_bytes())
    patterns = [*SHARED_INPUTS, *(entry.get("inputs") or [])]
    for path in _files(book.root, patterns):
        feed(str(path.relative_to(book.root)), path.read_bytes())
    if extra:
        feed("extra", json.dumps(extra, sort_keys=True).encode())
    return digest.hexdigest()


def tree_hash(root: Path) -> str:
    """Hex digest of every file under ``root`` (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
