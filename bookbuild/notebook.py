"""What a notebook of the book calls: parameters, seeds, figures with provenance, tables, glue.

A notebook starts with a cell tagged ``parameters`` and then::

    from bookbuild.notebook import start
    run = start("chapters/framework/operators.ipynb", globals())

``start`` checks that the parameters named in ``data/params.yaml`` are defined, seeds
``random``, numpy and torch, makes torch deterministic with a fixed thread count and sets the
figure style. Then::

    run.figure(fig, "operator-grid")          # footer: notebook, parameters, seed, commit
    run.table(df, "identity", atol=1e-12)     # result table (CSV) + its tolerances
    run.glue("max_error", value)              # a number for the prose ({glue:text})
    run.check("thm-head-count", err, 1e-12, "what was measured")  # a claim's numerical check
    for item in run.progress(items, "sweep"): # progress in the terminal, not on the page
        ...

Under the build (``make book``), outputs go to a scratch directory the runner installs on
success. Run interactively (``make lab``), they go to ``_build/interactive/`` so the working
tree is never modified.
"""

from __future__ import annotations

import os
import random
import sys
import time
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import yaml

FIGURE_DPI = 110
#: Width of the page's content column (px) at the 1280 px window of the site audits' screenshots.
CONTENT_PX = 688
MAX_FIGURE_INCHES = 8.0
MIN_TEXT_PX = 10.0


def book_root() -> Path:
    """The book being built (the runner says which), else this checkout."""
    return Path(os.environ.get("BOOK_ROOT") or Path(__file__).resolve().parent.parent)


def _chapter_of(notebook: str) -> str:
    """``chapters/<topic>/x.ipynb`` -> ``<topic>``: the folder a notebook's outputs go to."""
    parts = Path(notebook).parts
    return parts[1] if len(parts) > 2 and parts[0] == "chapters" else Path(notebook).stem


@dataclass
class NotebookRun:
    """One execution of one notebook. Build it with :func:`start`."""

    notebook: str
    params: dict
    profile: str
    commit: str
    output_dir: Path
    progress_log: Path | None
    glued: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return int(self.params["seed"])

    @property
    def chapter(self) -> str:
        return _chapter_of(self.notebook)

    def rng(self, offset: int = 0):
        """A numpy Generator seeded from the notebook's seed (``offset`` separates streams)."""
        import numpy as np

        return np.random.default_rng([self.seed, offset])

    # --- provenance ---------------------------------------------------------------------
    def provenance(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items() if k != "device")
        return (f"{self.notebook} · profile {self.profile} · {shown} · "
                f"commit {self.commit}")

    def figure(self, fig, name: str):
        """Add the provenance footer to ``fig``, save it as ``<name>.png``; return ``fig``.

        The footer names the notebook, the parameters in force (seed included) and the
        commit, so a figure taken out of the book still says where it came from. A figure
        must fit the page: at most 8 in wide, and no text smaller than 10 px once the page
        scales it to the content width (ValueError naming the figure and the text otherwise).
        """
        from matplotlib.layout_engine import ConstrainedLayoutEngine

        _check_name(name)
        width_chars = max(60, int(fig.get_figwidth() * 12))
        lines = textwrap.wrap(self.provenance(), width_chars)
        footer_in = 0.16 * len(lines) + 0.1
        height = fig.get_figheight() + footer_in
        fig.set_figheight(height)
        fraction = footer_in / height
        fig.set_layout_engine(ConstrainedLayoutEngine(rect=(0, fraction, 1, 1 - fraction)))
        fig.text(0.01, 0.02 * fraction, "\n".join(lines), fontsize=FOOTER_PT, color="0.35", ha="left",
                 va="bottom", family="monospace")
        for problem in figure_problems(fig):
            raise ValueError(f"figure {name!r}: {problem}")
        path = self.output_dir / "figures" / self.chapter / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=FIGURE_DPI, facecolor="white", metadata={"Software": None})
        return fig

    def table(self, df, name: str, rtol: float = 1e-9, atol: float = 0.0,
              columns: dict | None = None, description: str = ""):
        """Write ``df`` as the result table ``<name>.csv`` with its tolerances; return ``df``.

        ``make test`` compares the table from the build with the committed copy under
        ``data/results/<chapter>/`` value by value: numeric columns within
        ``|run - committed| <= atol + rtol * |committed|`` (per-column overrides in
        ``columns={"col": {"rtol": ..., "atol": ...}}``), other columns exactly.
        """
        _check_name(name)
        for key, value in (("rtol", rtol), ("atol", atol)):
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"{key} must be a number >= 0; got {value!r}")
        unknown = set(columns or {}) - set(df.columns)
        if unknown:
            raise ValueError(f"columns names {sorted(unknown)}, which the table does not have")
        folder = self.output_dir / "results" / self.chapter
        folder.mkdir(parents=True, exist_ok=True)
        df.to_csv(folder / f"{name}.csv", index=False, lineterminator="\n")
        meta = {
            "notebook": self.notebook,
            "profile": self.profile,
            "description": description,
            "rtol": rtol,
            "atol": atol,
            "columns": columns or {},
            "params": self.params,
        }
        (folder / f"{name}.meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=True))
        return df

    def show(self, df, formats: dict | str | None = None) -> "Table":
        """``df`` as a table for the page: numbers formatted, no index, nothing run-dependent.

        ``formats`` maps columns to format strings (``{"error": "{:.1e}"}``) or is one format
        for every numeric column. The HTML carries no random ids and the plain-text form is
        the formatted table, so two executions give byte-identical outputs.
        """
        return Table(df, formats)

    def glue(self, key: str, value) -> None:
        """Glue ``value`` under ``key`` for the prose: ``{glue:text}`nb.ipynb::key:fmt```.

        Returns None so that a glue on a cell's last line adds nothing to the page. A numpy
        scalar is glued as the Python number it holds (its repr would not format).
        """
        from myst_nb import glue as myst_glue

        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()
        self.glued[key] = value
        myst_glue(key, value, display=False)

    def check(self, label: str, discrepancy: float, tolerance: float, what: str) -> None:
        """Record the numerical check of the claim ``label`` (a ``{prf:...}`` label).

        ``discrepancy`` is the measured number that should be small (an error, a gap) and
        ``tolerance`` the largest value the claim allows; ``what`` says in a few words what
        was measured. The value is glued as ``check-<label>`` and recorded for the
        reproduction ledger, which shows it under the claim with the test that asserts the
        same statement, and fails ``make test`` when it exceeds the tolerance.
        """
        if not isinstance(label, str) or not label or any(c.isspace() for c in label):
            raise ValueError(f"label must be a claim label like 'thm-head-count'; got {label!r}")
        discrepancy, tolerance = float(discrepancy), float(tolerance)
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be a number >= 0; got {tolerance!r}")
        if label in self.checks:
            raise ValueError(f"{label} is already checked in this notebook")
        self.checks[label] = {"discrepancy": discrepancy, "tolerance": tolerance, "what": what,
                              "ok": bool(discrepancy <= tolerance)}
        folder = self.output_dir / "checks" / self.chapter
        folder.mkdir(parents=True, exist_ok=True)
        record = {"notebook": self.notebook, "checks": self.checks}
        (folder / f"{Path(self.notebook).stem}.yaml").write_text(yaml.safe_dump(record, sort_keys=True))
        self.glue(f"check-{label}", discrepancy)

    # --- progress -----------------------------------------------------------------------
    def log(self, message: str) -> None:
        """A line in the terminal of whoever runs the notebook (never on the page)."""
        line = f"{time.strftime('%H:%M:%S')} {message}\n"
        if self.progress_log is not None:
            with self.progress_log.open("a") as fh:
                fh.write(line)
        else:
            sys.__stderr__.write(line)
            sys.__stderr__.flush()

    def throttled_log(self, every: float = 5.0):
        """A `log` that prints at most one line every `every` seconds (for chatty callbacks)."""
        last = [float("-inf")]

        def log(message: str) -> None:
            now = time.perf_counter()
            if now - last[0] >= every:
                last[0] = now
                self.log(message)

        return log

    def progress(self, items, desc: str, every: float = 5.0):
        """Iterate over ``items``, logging ``desc i/n`` at most every ``every`` seconds."""
        items = list(items)
        total = len(items)
        last = time.perf_counter()
        self.log(f"{desc}: 0/{total}")
        for i, item in enumerate(items, 1):
            yield item
            now = time.perf_counter()
            if now - last >= every or i == total:
                self.log(f"{desc}: {i}/{total}")
                last = now


class Table:
    """A formatted table whose HTML and text forms are the same on every run (see ``run.show``)."""

    def __init__(self, df, formats: dict | str | None = None):
        if isinstance(formats, str):
            formats = {c: formats for c in df.columns if df[c].dtype.kind in "fiu"}
        formats = formats or {}
        # Formatted numbers sit in a no-wrap span, so that text and headers may wrap to fit
        # the page while a number never breaks ("9.8e-" / "33").
        spans = {column: (lambda v, spec=spec: f'<span class="num">{spec.format(v)}</span>')
                 for column, spec in formats.items()}
        styler = df.style.hide(axis="index").format(spans, na_rep="—")
        # exclude_styles drops Styler's random table id and its CSS: the theme styles tables.
        self.html = styler.to_html(exclude_styles=True).replace(
            "<table>", '<table class="dataframe book-table">', 1)
        shown = df.copy()
        for column in shown.columns:
            spec = formats.get(column)
            if spec is not None and shown[column].dtype.kind in "fiu":
                shown[column] = [spec.format(v) if v == v else "—" for v in shown[column]]
        self.text = shown.to_string(index=False)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


FOOTER_PT = 8.5


def figure_problems(fig) -> list[str]:
    """Why ``fig`` would not fit the page: too wide, or text below MIN_TEXT_PX once shown."""
    import matplotlib.text

    width = fig.get_figwidth()
    if width > MAX_FIGURE_INCHES:
        return [f"{width:.1f} in wide (at most {MAX_FIGURE_INCHES:g} in at {FIGURE_DPI} dpi)"]
    fig.canvas.draw()  # creates tick labels, so that every text is seen
    shown = min(1.0, CONTENT_PX / (width * FIGURE_DPI))
    problems = []
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_visible() and text.get_text().strip():
            px = text.get_fontsize() * FIGURE_DPI / 72 * shown
            if px < MIN_TEXT_PX - 1e-9:
                problems.append(f"text {text.get_text()[:30]!r} is {px:.1f} px on the page "
                                f"(at least {MIN_TEXT_PX:g}): use a larger font or a narrower figure")
    return problems[:1]


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ ."):
        raise ValueError(f"name must be a plain file stem like 'operator-grid'; got {name!r}")


def _load_entry(notebook: str) -> dict:
    from .book import Book

    return Book(book_root()).entry(notebook)


def set_style() -> None:
    """One figure style for the book: white backgrounds (readable in dark mode), fixed dpi."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({
        "figure.facecolor": "white",
        "axes.facecolor": "white",
        "savefig.facecolor": "white",
        "figure.dpi": FIGURE_DPI,
        "savefig.dpi": FIGURE_DPI,
        "figure.figsize": (CONTENT_PX / FIGURE_DPI, 3.8),  # the content width: shown at 1:1
        "figure.constrained_layout.use": True,
        "font.size": 10,
        "axes.titlesize": 10.5,
        "axes.labelsize": 10,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "legend.fontsize": 9,
        "legend.title_fontsize": 9,
    })


def seed_everything(seed: int, threads: int) -> None:
    """Seed Python, numpy and torch; deterministic torch kernels on a fixed thread count."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        import torch
    except ImportError:  # a notebook that never touches torch need not pay for it
        return
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def start(notebook: str, namespace: dict) -> NotebookRun:
    """Begin a run of ``notebook`` (its path from the book root) with its parameters.

    ``namespace`` is the notebook's ``globals()``: the values of the parameters that
    ``data/params.yaml`` lists for this notebook are read from it.
    """
    env_notebook = os.environ.get("BOOK_NOTEBOOK")
    if env_notebook is not None and env_notebook != notebook:
        raise ValueError(f"notebook is {notebook!r} but the build is executing {env_notebook!r}")
    entry = _load_entry(notebook)
    names = list((entry.get("published") or {}).keys())
    missing = [name for name in names if name not in namespace]
    if missing:
        raise NameError(f"the parameters cell of {notebook} does not define {missing}")
    params = {name: namespace[name] for name in names}
    output = os.environ.get("BOOK_OUTPUT_DIR")
    log = os.environ.get("BOOK_PROGRESS_LOG")
    run = NotebookRun(
        notebook=notebook,
        params=params,
        profile=os.environ.get("BOOK_PROFILE", "interactive"),
        commit=os.environ.get("BOOK_COMMIT") or _interactive_commit(),
        output_dir=Path(output) if output else book_root() / "_build" / "interactive",
        progress_log=Path(log) if log else None,
    )
    seed_everything(run.seed, int(os.environ.get("BOOK_THREADS", "1")))
    set_style()
    return run


def _interactive_commit() -> str:
    from .book import Book

    return Book(book_root()).commit()


__all__ = ["NotebookRun", "Table", "start", "set_style", "seed_everything", "book_root"]
