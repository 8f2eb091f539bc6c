"""What a chapter notebook calls after its cell tagged ``parameters``:
``run = start("chapters/x/y.ipynb", globals())``, then ``run.figure``, ``run.table``,
``run.show``, ``run.glue``, ``run.check``, ``run.progress``, ``run.log``. Under ``make book``
outputs go to a scratch folder the runner installs on success; run by hand, to
``_build/interactive/``."""

from __future__ import annotations

import html
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

FIGURE_DPI = 110
CONTENT_PX = 688  # width of the page's content column at the site audits' 1280 px window
MAX_FIGURE_INCHES = 8.0
MIN_TEXT_PX = 10.0
FIGURE_SCALE = 2  # saved PNGs have 2 pixels per CSS pixel: sharp on HiDPI screens and in print


def book_root() -> Path:
    """The book being built (the runner says which), else this checkout."""
    return Path(os.environ.get("BOOK_ROOT") or Path(__file__).resolve().parent.parent)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ ."):
        raise ValueError(f"name must be a plain file stem like 'operator-grid'; got {name!r}")


@dataclass
class NotebookRun:
    """One execution of one notebook; made by :func:`start`."""

    notebook: str
    params: dict
    profile: str
    commit: str
    output_dir: Path
    checks: dict = field(default_factory=dict)
    tables: int = 0  # how many run.show has built: audit (j) finds each on the site

    @property
    def seed(self) -> int:
        return int(self.params["seed"])

    @property
    def chapter(self) -> str:
        """``chapters/<topic>/x.ipynb`` -> ``<topic>``: the folder its outputs go to."""
        parts = Path(self.notebook).parts
        return parts[1] if len(parts) > 2 and parts[0] == "chapters" else Path(self.notebook).stem

    def rng(self, offset: int = 0):
        """A numpy Generator seeded from the notebook's seed (``offset`` separates streams)."""
        import numpy as np

        return np.random.default_rng([self.seed, offset])

    def figure(self, fig, name: str):
        """Check that the figure fits the page (:func:`figure_problems`), save ``<name>.png``
        at 2× resolution and its provenance ``<name>.yaml`` (notebook, parameters, commit),
        shown under it by the page's ``{book-figure}`` directive, outside the pixels. Under the
        build the cell shows nothing (the directive shows the figure); run by hand, returns
        ``fig`` to be shown inline."""
        _check_name(name)
        for problem in figure_problems(fig):
            raise ValueError(f"figure {name!r}: {problem}")
        path = self.output_dir / "figures" / self.chapter / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=FIGURE_SCALE * FIGURE_DPI, facecolor="white",
                    metadata={"Software": None})
        provenance = {"notebook": self.notebook, "profile": self.profile, "commit": self.commit,
                      "params": {k: v for k, v in self.params.items() if k != "device"},
                      "width_px": round(fig.get_figwidth() * FIGURE_DPI)}
        path.with_suffix(".yaml").write_text(yaml.safe_dump(provenance, sort_keys=True))
        if os.environ.get("BOOK_NOTEBOOK"):
            import matplotlib.pyplot as plt

            plt.close(fig)
            return None
        return fig

    def table(self, df, name: str, rtol: float = 1e-9, atol: float = 0.0,
              columns: dict | None = None, description: str = ""):
        """Write ``df`` as the result table ``<name>.csv`` with its tolerances (``columns``:
        per-column ``{"rtol", "atol"}``), compared by ``make test``; return ``df``."""
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
        meta = {"notebook": self.notebook, "profile": self.profile, "description": description,
                "rtol": rtol, "atol": atol, "columns": columns or {}, "params": self.params}
        (folder / f"{name}.meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=True))
        return df

    def show(self, df, formats: dict | str | None = None) -> "Table":
        """``df`` for the page: formatted (``{"col": "{:.1e}"}``, or one format for every
        numeric column), no index, nothing that differs between runs. Tables are numbered
        in the notebook (``data-book-table``) and counted, so that audit (j) fails on one
        built but on no page (dropped in a loop, mid-cell, by ``;`` or a hidden output)."""
        self.tables += 1
        self._record()
        return Table(df, formats, label=f"{self.notebook} {self.tables}")

    def glue(self, key: str, value) -> None:
        """Glue ``value`` for the prose (``{glue:text}`nb.ipynb::key:fmt```); a numpy scalar
        as the Python number it holds. Returns None: nothing is added to the page."""
        from myst_nb import glue as myst_glue

        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()
        myst_glue(key, value, display=False)

    def check(self, label: str, discrepancy: float, tolerance: float, what: str) -> None:
        """Record the numerical check of the claim ``label`` for the reproduction ledger
        (glued as ``check-<label>``); ``make test`` fails when discrepancy > tolerance."""
        if not isinstance(label, str) or not label or any(c.isspace() for c in label):
            raise ValueError(f"label must be a claim label like 'thm-head-count'; got {label!r}")
        discrepancy, tolerance = float(discrepancy), float(tolerance)
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be a number >= 0; got {tolerance!r}")
        if label in self.checks:
            raise ValueError(f"{label} is already checked in this notebook")
        self.checks[label] = {"discrepancy": discrepancy, "tolerance": tolerance, "what": what,
                              "ok": bool(discrepancy <= tolerance)}
        self._record()
        self.glue(f"check-{label}", discrepancy)

    def _record(self) -> None:  # the checks and the table count, read by the ledger and audit
        folder = self.output_dir / "checks" / self.chapter
        folder.mkdir(parents=True, exist_ok=True)
        record = {"notebook": self.notebook, "checks": self.checks, "tables": self.tables}
        (folder / f"{Path(self.notebook).stem}.yaml").write_text(
            yaml.safe_dump(record, sort_keys=True))

    def log(self, message: str) -> None:
        """A line on the terminal of whoever runs the notebook (the kernel's stderr), never
        on the page; under the build it names the notebook."""
        prefix = f"      {self.notebook}: " if os.environ.get("BOOK_NOTEBOOK") else ""
        print(f"{prefix}{time.strftime('%H:%M:%S')} {message}", file=sys.__stderr__, flush=True)

    def throttled_log(self, every: float = 5.0):
        """A :meth:`log` that prints at most one line every ``every`` seconds."""
        last = [float("-inf")]

        def log(message: str) -> None:
            if time.perf_counter() - last[0] >= every:
                last[0] = time.perf_counter()
                self.log(message)

        return log

    def progress(self, items, desc: str, every: float = 5.0):
        """Iterate over ``items``, logging ``desc: i/n`` at most every ``every`` seconds."""
        items = list(items)
        last = time.perf_counter()
        self.log(f"{desc}: 0/{len(items)}")
        for i, item in enumerate(items, 1):
            yield item
            if time.perf_counter() - last >= every or i == len(items):
                self.log(f"{desc}: {i}/{len(items)}")
                last = time.perf_counter()


class Table:
    """A formatted table whose HTML and text are the same on every run (see ``run.show``)."""

    def __init__(self, df, formats: dict | str | None = None, label: str | None = None):
        if isinstance(formats, str):
            formats = {c: formats for c in df.columns if df[c].dtype.kind in "fiu"}
        formats = formats or {}
        # Each number sits in a no-wrap span: text and headers may wrap, "9.8e-33" never breaks.
        spans = {column: (lambda v, spec=spec: f'<span class="num">{spec.format(v)}</span>')
                 for column, spec in formats.items()}
        styler = df.style.hide(axis="index").format(spans, na_rep="—")
        # exclude_styles drops Styler's random table id and its CSS: the theme styles tables.
        numbered = f' data-book-table="{html.escape(label, quote=True)}"' if label else ""
        self.html = styler.to_html(exclude_styles=True).replace(
            "<table>", f'<table class="dataframe book-table"{numbered}>', 1)
        shown = df.copy()
        for column, spec in formats.items():
            if column in shown and shown[column].dtype.kind in "fiu":
                shown[column] = [spec.format(v) if v == v else "—" for v in shown[column]]
        self.text = shown.to_string(index=False)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def figure_problems(fig) -> list[str]:
    """Why ``fig`` would not fit the page: wider than 8 in, or text under 10 px as shown."""
    import matplotlib.text

    width = fig.get_figwidth()
    if width > MAX_FIGURE_INCHES:
        return [f"{width:.1f} in wide (at most {MAX_FIGURE_INCHES:g} in at {FIGURE_DPI} dpi)"]
    fig.canvas.draw()  # creates tick labels, so that every text is seen
    shown = min(1.0, CONTENT_PX / (width * FIGURE_DPI))
    for text in fig.findobj(matplotlib.text.Text):
        px = text.get_fontsize() * FIGURE_DPI / 72 * shown
        if text.get_visible() and text.get_text().strip() and px < MIN_TEXT_PX - 1e-9:
            return [f"text {text.get_text()[:30]!r} is {px:.1f} px on the page (at least "
                    f"{MIN_TEXT_PX:g}): use a larger font or a narrower figure"]
    return []


def set_style() -> None:
    """One figure style for the book: white backgrounds (readable in dark mode), fixed dpi."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({  # the default size is the content width: shown at 1:1
        "figure.facecolor": "white", "axes.facecolor": "white", "savefig.facecolor": "white",
        "figure.dpi": FIGURE_DPI, "savefig.dpi": FIGURE_DPI, "figure.constrained_layout.use": True,
        "figure.figsize": (CONTENT_PX / FIGURE_DPI, 3.8), "font.size": 10, "axes.titlesize": 10.5,
        "axes.labelsize": 10, "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9,
        "legend.title_fontsize": 9})


def seed_everything(seed: int, threads: int) -> None:
    """Seed Python, numpy and torch; deterministic torch kernels on a fixed thread count."""
    import numpy as np

    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def start(notebook: str, namespace: dict) -> NotebookRun:
    """Begin a run of ``notebook`` (its path from the book root); ``namespace`` is the
    notebook's ``globals()``, where the parameters listed in data/params.yaml are read."""
    from .book import Book

    if os.environ.get("BOOK_NOTEBOOK", notebook) != notebook:
        raise ValueError(f"notebook is {notebook!r} but the build is executing "
                         f"{os.environ['BOOK_NOTEBOOK']!r}")
    book = Book(book_root())
    names = list(book.entry(notebook).get("published") or {})
    missing = [name for name in names if name not in namespace]
    if missing:
        raise NameError(f"the parameters cell of {notebook} does not define {missing}")
    output = os.environ.get("BOOK_OUTPUT_DIR")
    run = NotebookRun(notebook=notebook, params={name: namespace[name] for name in names},
                      profile=os.environ.get("BOOK_PROFILE", "interactive"),
                      commit=os.environ.get("BOOK_COMMIT") or book.commit(),
                      output_dir=Path(output) if output else book.build / "interactive")
    seed_everything(run.seed, int(os.environ.get("BOOK_THREADS", "1")))
    set_style()
    return run
