"""A book checkout: where the build puts things, what the toc and data/params.yaml say, and
the hash of each notebook's inputs (the execution cache key)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import cached_property
from pathlib import Path

import yaml

PROFILES = ("published", "quick")
#: Globs (from the root) that every notebook's cache hash depends on; a missing folder matches nothing.
SHARED_INPUTS = ("lib/**/*.py", "experiments/**/*.py", "reference/**/*.py",
                 "data/params.yaml", "requirements.txt")
#: The notebook-side helper draws footers and writes tables: part of every notebook's inputs.
HELPER_SOURCE = Path(__file__).with_name("notebook.py")
ENTRY_KEYS = {"published", "quick", "run_last", "inputs", "cell_timeout"}


def executable_part(notebook: Path) -> str:
    """What executing ``notebook`` depends on: its code cells (ids, sources, metadata) and the
    kernel. Prose (markdown cells) is left out: editing it re-stages, never re-executes."""
    nb = json.loads(Path(notebook).read_text())
    cells = [[c.get("id"), c["source"], c.get("metadata", {})] for c in nb["cells"]
             if c["cell_type"] == "code"]
    return json.dumps([nb.get("metadata", {}).get("kernelspec"), cells], sort_keys=True)


class BookError(RuntimeError):
    """A configuration problem (toc, parameters), reported in one line without a traceback."""


class Book:
    """A book rooted at ``root``; everything the build writes lives under ``root/_build``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.build = build = self.root / "_build"
        self.executed = build / "executed"  # normalised executed notebooks
        self.results, self.figures, self.checks = build / "results", build / "figures", build / "checks"
        self.failed = build / "failed"  # partial output of failed executions
        self.stage, self.html = build / "stage", build / "html"
        self.manifest_path = build / "manifest.json"  # hash, seconds, artifacts per notebook
        self.report_path = build / "build-report.json"
        self.committed_results = self.root / "data" / "results"
        self.params_path = self.root / "data" / "params.yaml"

    @classmethod
    def here(cls) -> "Book":
        """The checkout this package is installed from."""
        return cls(Path(__file__).resolve().parent.parent)

    @cached_property
    def pages(self) -> list[Path]:
        """Every page of ``_toc.yml``, relative to the root, with its suffix."""
        from sphinx_external_toc.parsing import parse_toc_yaml

        toc_file = self.root / "_toc.yml"
        if not toc_file.exists():
            raise BookError(f"{toc_file} not found")
        pages = []
        for docname in parse_toc_yaml(toc_file):  # Sphinx fails (-W) on both .md and .ipynb
            found = [Path(f"{docname}{s}") for s in (".md", ".ipynb") if (self.root / f"{docname}{s}").exists()]
            if not found:
                raise BookError(f"_toc.yml lists {docname!r}, but neither {docname}.md nor .ipynb exists")
            pages.append(found[0])
        return pages

    @property
    def notebooks(self) -> list[Path]:
        return [p for p in self.pages if p.suffix == ".ipynb"]

    @cached_property
    def params(self) -> dict:
        """``data/params.yaml``: notebook path -> entry."""
        name = self.params_path.relative_to(self.root)
        if not self.params_path.exists():
            raise BookError(f"{self.params_path} not found")
        try:
            data = yaml.safe_load(self.params_path.read_text()) or {}
        except yaml.MarkedYAMLError as err:
            raise BookError(f"{name}, line {err.problem_mark.line + 1}: invalid YAML "
                            f"({err.problem})") from None
        if not isinstance(data, dict):
            raise BookError(f"{name}: expected a mapping from notebook path to entry")
        return data

    def entry(self, notebook) -> dict:
        """The params.yaml entry of one notebook, validated."""
        key = str(notebook)
        if key not in self.params:
            raise BookError(f"data/params.yaml has no entry for {key} (every notebook needs one)")
        entry = self.params[key] or {}
        if set(entry) - ENTRY_KEYS:
            raise BookError(f"data/params.yaml, {key}: unknown keys {sorted(set(entry) - ENTRY_KEYS)}")
        published = entry.get("published") or {}
        if "seed" not in published:
            raise BookError(f"data/params.yaml, {key}: published parameters need a 'seed'")
        extra = set(entry.get("quick") or {}) - set(published)
        if extra:
            raise BookError(f"data/params.yaml, {key}: quick profile sets {sorted(extra)}, "
                            "which the published profile does not define")
        return entry

    def parameters(self, notebook, profile: str) -> dict:
        """Parameters in force for ``notebook`` under ``profile`` (quick overrides published)."""
        if profile not in PROFILES:
            raise BookError(f"profile must be one of {PROFILES}; got {profile!r}")
        entry = self.entry(notebook)
        return {**(entry.get("published") or {}),
                **((entry.get("quick") or {}) if profile == "quick" else {})}

    def check_params_cover_toc(self) -> None:
        """Every toc notebook has an entry whose parameters its parameters cell defines, and
        every entry names a toc notebook (papermill would inject an unknown name silently)."""
        import papermill

        listed = {str(p) for p in self.notebooks}
        for nb in sorted(listed):
            defined = set(papermill.inspect_notebook(str(self.root / nb)))
            undefined = sorted(set(self.entry(nb).get("published") or {}) - defined)
            if undefined:
                raise BookError(
                    f"data/params.yaml, {nb}: {', '.join(map(repr, undefined))} not defined in "
                    f"the notebook's parameters cell (it defines {', '.join(sorted(defined))})")
        stale = sorted(set(self.params) - listed)
        if stale:
            raise BookError(f"data/params.yaml has entries for notebooks not in _toc.yml: {stale}")

    def input_hash(self, notebook, profile: str, extra=None) -> str:
        """sha256 of everything an execution depends on: the notebook's code cells, its parameters, the
        helper, SHARED_INPUTS, the entry's ``inputs`` globs and ``extra`` (non-file inputs)."""
        patterns = [*SHARED_INPUTS, *(self.entry(notebook).get("inputs") or [])]
        files = sorted({f for pattern in patterns for match in self.root.glob(pattern)
                        for f in (match.rglob("*") if match.is_dir() else [match])
                        if f.is_file() and "__pycache__" not in f.parts})
        parts = {"notebook": executable_part(self.root / notebook), "profile": profile.encode(),
                 "parameters": json.dumps(self.parameters(notebook, profile), sort_keys=True),
                 "helper": HELPER_SOURCE.read_bytes(), "extra": json.dumps(extra, sort_keys=True),
                 **{str(f.relative_to(self.root)): f.read_bytes() for f in files}}
        digest = hashlib.sha256()
        for label, data in parts.items():
            data = data.encode() if isinstance(data, str) else data
            digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())
        return digest.hexdigest()

    def commit(self, ignoring: tuple[str, ...] = ()) -> str:
        """Short commit, ``-dirty`` with uncommitted changes outside the folders ``ignoring``."""
        def git(*args):
            return subprocess.run(["git", *args], cwd=self.root, check=True,
                                  capture_output=True, text=True).stdout.strip()
        try:
            head = git("rev-parse", "--short=10", "HEAD")
            dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                        *(f":(exclude){folder}" for folder in ignoring))
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
        return head + ("-dirty" if dirty else "")


def read_json(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


def write_json(path: Path, data) -> None:
    """Write atomically, so an interrupted build never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
