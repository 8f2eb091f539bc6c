"""Where things are in a book checkout, and what its table of contents and parameters say.

Every other module of the build tooling takes a :class:`Book`, so the tests can point the
whole machinery at a small fixture book in a temporary directory.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

PROFILES = ("published", "quick")

#: Files (relative to the book root, glob patterns) that every notebook's result depends on.
SHARED_INPUTS = ("lib/**/*.py", "experiments/**/*.py", "reference/**/*.py", "data/params.yaml",
                 "requirements.txt")

#: The notebook-side helper: part of every notebook's inputs (it draws footers, writes tables).
HELPER_SOURCE = Path(__file__).with_name("notebook.py")


class BookError(RuntimeError):
    """A problem with the book's configuration (toc, parameters), reported without a traceback."""


@dataclass(frozen=True)
class Book:
    """A book checkout rooted at ``root``; all paths of the build live under ``root/_build``."""

    root: Path

    @classmethod
    def here(cls) -> "Book":
        """The book this package was installed from (the repository checkout)."""
        return cls(Path(__file__).resolve().parent.parent)

    # --- locations under _build -------------------------------------------------------
    @property
    def build(self) -> Path:
        return self.root / "_build"

    @property
    def executed(self) -> Path:
        """Normalised executed notebooks, mirroring the source paths."""
        return self.build / "executed"

    @property
    def results(self) -> Path:
        """Result tables written by the last successful execution of each notebook."""
        return self.build / "results"

    @property
    def figures(self) -> Path:
        """Figures (PNG with provenance footer) written by the notebooks."""
        return self.build / "figures"

    @property
    def checks(self) -> Path:
        """Numerical checks of claims recorded by the notebooks (``run.check``), per notebook."""
        return self.build / "checks"

    @property
    def failed(self) -> Path:
        """Partial output of notebooks whose execution failed (for debugging)."""
        return self.build / "failed"

    @property
    def logs(self) -> Path:
        """Per-notebook progress logs of the last execution."""
        return self.build / "logs"

    @property
    def stage(self) -> Path:
        """The staged source tree that Jupyter Book renders (sources + executed notebooks)."""
        return self.build / "stage"

    @property
    def html(self) -> Path:
        return self.build / "html"

    @property
    def manifest_path(self) -> Path:
        """Cache manifest: hash and timing of each notebook's last successful execution."""
        return self.build / "manifest.json"

    @property
    def report_path(self) -> Path:
        """The last build's report (profile, per-notebook status and seconds)."""
        return self.build / "build-report.json"

    @property
    def committed_results(self) -> Path:
        return self.root / "data" / "results"

    @property
    def params_path(self) -> Path:
        return self.root / "data" / "params.yaml"

    # --- table of contents --------------------------------------------------------------
    @cached_property
    def pages(self) -> list[Path]:
        """Every page listed in ``_toc.yml`` as a path relative to the root (with suffix)."""
        from sphinx_external_toc.parsing import parse_toc_yaml

        toc_file = self.root / "_toc.yml"
        if not toc_file.exists():
            raise BookError(f"{toc_file} not found")
        site_map = parse_toc_yaml(toc_file)
        pages = []
        for docname in site_map:
            matches = [self.root / f"{docname}{suffix}" for suffix in (".md", ".ipynb")]
            found = [m for m in matches if m.exists()]
            if len(found) != 1:
                raise BookError(
                    f"_toc.yml lists {docname!r}: expected exactly one of {docname}.md or "
                    f"{docname}.ipynb, found {len(found)}"
                )
            pages.append(found[0].relative_to(self.root))
        return pages

    @property
    def notebooks(self) -> list[Path]:
        return [p for p in self.pages if p.suffix == ".ipynb"]

    # --- parameters ---------------------------------------------------------------------
    @cached_property
    def params(self) -> dict:
        """``data/params.yaml`` as a dict keyed by notebook path (str)."""
        if not self.params_path.exists():
            raise BookError(f"{self.params_path} not found")
        try:
            data = yaml.safe_load(self.params_path.read_text()) or {}
        except yaml.YAMLError as err:
            raise BookError(f"{_yaml_error(err, self.params_path.relative_to(self.root))}") from None
        if not isinstance(data, dict):
            raise BookError(f"{self.params_path}: expected a mapping from notebook path to entry")
        return data

    def entry(self, notebook: Path | str) -> dict:
        """The params.yaml entry of one notebook, validated."""
        key = str(notebook)
        if key not in self.params:
            raise BookError(f"data/params.yaml has no entry for {key} (every notebook needs one)")
        entry = self.params[key] or {}
        unknown = set(entry) - {"published", "quick", "run_last", "inputs", "cell_timeout"}
        if unknown:
            raise BookError(f"data/params.yaml, {key}: unknown keys {sorted(unknown)}")
        published = entry.get("published") or {}
        if "seed" not in published:
            raise BookError(f"data/params.yaml, {key}: published parameters need a 'seed'")
        extra = set(entry.get("quick") or {}) - set(published)
        if extra:
            raise BookError(
                f"data/params.yaml, {key}: quick profile sets {sorted(extra)}, "
                "which the published profile does not define"
            )
        return entry

    def parameter_cell_names(self, notebook: Path | str) -> set[str]:
        """Names assigned in the cell tagged ``parameters`` of a source notebook."""
        import ast

        import nbformat

        path = self.root / str(notebook)
        cells = [c for c in nbformat.read(path, as_version=4).cells
                 if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
        if len(cells) != 1:
            raise BookError(f"{notebook}: needs exactly one code cell tagged 'parameters'; "
                            f"found {len(cells)}")
        try:
            tree = ast.parse(cells[0].source)
        except SyntaxError as err:
            raise BookError(f"{notebook}: parameters cell line {err.lineno}: {err.msg}") from None
        names = set()
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        return names

    def parameters(self, notebook: Path | str, profile: str) -> dict:
        """Parameters in force for ``notebook`` under ``profile`` (quick overrides published)."""
        if profile not in PROFILES:
            raise BookError(f"profile must be one of {PROFILES}; got {profile!r}")
        entry = self.entry(notebook)
        values = dict(entry.get("published") or {})
        if profile == "quick":
            values.update(entry.get("quick") or {})
        return values

    def check_params_cover_toc(self) -> None:
        """Every toc notebook has an entry, every entry names a toc notebook, and every
        parameter an entry sets is defined in that notebook's parameters cell."""
        listed = {str(p) for p in self.notebooks}
        for nb in sorted(listed):
            published = self.entry(nb).get("published") or {}
            defined = self.parameter_cell_names(nb)
            undefined = sorted(set(published) - defined)
            if undefined:
                # papermill would inject them as new variables that the notebook never reads.
                raise BookError(
                    f"data/params.yaml, {nb}: {', '.join(map(repr, undefined))} not defined in "
                    f"the notebook's parameters cell (it defines {', '.join(sorted(defined))})")
        stale = sorted(set(self.params) - listed)
        if stale:
            raise BookError(f"data/params.yaml has entries for notebooks not in _toc.yml: {stale}")

    # --- provenance ---------------------------------------------------------------------
    def commit(self, ignoring: tuple[str, ...] = ()) -> str:
        """Short commit of the checkout, with ``-dirty`` for uncommitted changes.

        Changes under the folders in ``ignoring`` do not count (a benchmark run
        rewrites its own result tables before the next script records the commit).
        """
        excluded = [f":(exclude){folder}" for folder in ignoring]
        try:
            head = subprocess.run(
                ["git", "rev-parse", "--short=10", "HEAD"], cwd=self.root, check=True,
                capture_output=True, text=True,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *excluded],
                cwd=self.root, check=True, capture_output=True, text=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
        return head + ("-dirty" if dirty else "")


def _yaml_error(err: "yaml.YAMLError", name: Path) -> str:
    """One line naming the file and line of a YAML syntax error."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{name}, line {mark.line + 1}" if mark is not None else str(name)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}: invalid YAML ({problem})"


def read_json(path: Path, default):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def write_json(path: Path, data) -> None:
    """Write atomically, so an interrupted build never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
