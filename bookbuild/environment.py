"""Facts about the machine and the build, for the reproducibility appendix."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

from .book import Book, read_json

#: Packages whose versions the appendix reports (requirements.txt pins the rest).
REPORTED_PACKAGES = (
    "jupyter-book", "sphinx", "myst-nb", "sphinx-proof", "sphinxcontrib-bibtex",
    "papermill", "nbclient", "ipykernel", "numpy", "torch", "matplotlib", "seaborn", "pandas",
)


def cpu_model() -> str:
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                platform.processor() or "unknown")


def environment_rows() -> list[tuple[str, str]]:
    """(item, value): Python, platform, CPU, threads, package versions."""
    import torch

    return [("Python", platform.python_version()), ("Platform", platform.platform(terse=True)),
            ("CPU", cpu_model()), ("CPU cores", str(os.cpu_count())),
            ("torch threads per notebook", str(torch.get_num_threads())),
            ("torch deterministic algorithms", str(torch.are_deterministic_algorithms_enabled())),
            *((name, next((d.version for d in metadata.distributions(name=name)), "not installed"))
              for name in REPORTED_PACKAGES)]


def parameter_rows(book: Book, profile: str) -> list[tuple[str, str, str]]:
    """(notebook, parameter, value) for every notebook of the book under ``profile``."""
    return [(str(nb), name, repr(value)) for nb in book.notebooks
            for name, value in book.parameters(nb, profile).items()]


def timing_rows(book: Book) -> list[tuple[str, float, str]]:
    """(notebook, seconds, profile) of each notebook's last successful execution."""
    manifest = read_json(book.manifest_path, {})
    return [(str(nb), manifest.get(str(nb), {}).get("seconds", float("nan")),
             manifest.get(str(nb), {}).get("profile", "never executed")) for nb in book.notebooks]
