"""The book's Sphinx extension: finds the claims, prints the ledger line under each and the
status tables (``ledger-claims``, ``ledger-figures``), a run-locally note at the end of every
page, the API reference of ``lib`` (``lib-api``, from ``lib.API``) and the notebooks' figures
with numbered captions and their provenance (``book-figure``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

from .ledger import CLAIM_KINDS, CLAIMS_FILE, LEDGER_FILE, SOURCES, assemble
from .site import FIGURES_DIR

VERDICT_MARK = {"reproduced": "✓ reproduced", "fails its check": "✗ fails its check",
                "incomplete": "◌ incomplete"}
_MYST_ROLE = re.compile(r"\{([a-z]+(?::[a-z]+)?)\}`([^`]+)`")


def _inputs(env) -> dict:
    """The staged tree's ``_ledger.json`` (checks, tests, notes), read once."""
    if not hasattr(env, "book_ledger_inputs"):
        path = Path(env.srcdir) / LEDGER_FILE
        env.book_ledger_inputs = json.loads(path.read_text()) if path.exists() else {}
    return env.book_ledger_inputs


def collect_claims(app, doctree) -> None:
    """doctree-read: the claims of this page (sphinx-proof nodes), in document order."""
    app.env.__dict__.setdefault("book_claims", {})[app.env.docname] = [
        {"label": node["label"], "kind": node["realtype"], "page": app.env.docname,
         "title": str(node.get("title", "")).strip().removeprefix("(").removesuffix(")")}
        for node in doctree.findall(nodes.Element)
        if node.get("realtype") in CLAIM_KINDS and node.get("label")]


def book_claims(env) -> list[dict]:
    """Every claim read, pages in the book's order (pages outside it last)."""
    found = getattr(env, "book_claims", {})
    order = {page: k for k, page in enumerate(_inputs(env).get("pages", []))}
    return [c for page in sorted(found, key=lambda p: (order.get(p, len(order)), p)) for c in found[page]]


def _ledger(env) -> dict:
    """label -> ledger entry; built on first use in the write phase, once every page is read."""
    if not hasattr(env, "book_ledger"):
        env.book_ledger = assemble(_inputs(env), book_claims(env))[0] if _inputs(env) else {}
    return env.book_ledger


def write_claims(app, exception) -> None:
    if exception is None:
        (Path(app.outdir) / CLAIMS_FILE).write_text(json.dumps(book_claims(app.env), indent=1) + "\n")


def _doc_link(doc: str, refdoc: str, text: str | None = None) -> nodes.Node:
    return addnodes.pending_xref("", nodes.inline("", text or doc), refdomain="std", reftype="doc",
                                 reftarget="/" + doc, refexplicit=text is not None, refwarn=True, refdoc=refdoc)


def _number(value: float) -> str:
    return f"{value:.2g}" if value else "0"


def _cell(check: dict) -> str:
    return f", cell {check['cell']}" if check.get("cell") else ""


def _measured(check: dict) -> list[nodes.Node]:
    """measured ≤ allowed; a bound check's measured ÷ bound as a "ratio" against 1."""
    return [nodes.Text("ratio " * (check["kind"] == "bound")), nodes.strong("", _number(check["discrepancy"])),
            nodes.Text(f" ≤ {_number(check['tolerance'])}")]


def ledger_line(entry: dict, refdoc: str, details: str | None = None) -> nodes.paragraph:
    """Under a claim, one line: verdict · checked: measured ≤ allowed · tested · details (a link
    to the claim's row of the status table, ``details``, where notebooks and tests are named)."""
    para = nodes.paragraph(classes=["claim-ledger", "claim-" + entry["verdict"].split()[0]])
    para += [nodes.strong("", VERDICT_MARK[entry["verdict"]]), nodes.Text(" · ")]
    checks, tests = entry["checks"], entry["tests"]
    para += [nodes.Text("checked: "), *_measured(checks[0]),
             nodes.Text(f" (+{len(checks) - 1} more)" if len(checks) > 1 else "")] \
        if checks else [nodes.emphasis("", "not checked")]
    para += [nodes.Text(" · "), nodes.Text("tested") if tests else nodes.emphasis("", "no test")]
    if details:
        para += [nodes.Text(" · "), nodes.reference("", "details", refuri=details)]
    return para


def status_table(claims: dict, refdoc: str) -> nodes.table:
    """One row per claim of the book, in the book's order."""
    rows = []
    for label, entry in claims.items():
        checks = nodes.paragraph()
        for k, check in enumerate(entry["checks"]):
            checks += [nodes.Text("; " if k else ""), *_measured(check), nodes.Text(" ("),
                       _doc_link(check["notebook"], refdoc, "notebook" + _cell(check)), nodes.Text(")")]
        tests, mark = entry["tests"], VERDICT_MARK[entry["verdict"]].split()[0]
        kinds = ", ".join(dict.fromkeys(str(c["kind"]) for c in entry["checks"]))  # what was verified
        rows.append([
            [nodes.target("", "", ids=[f"status-{label}"]),
             addnodes.pending_xref("", nodes.inline("", label), refdomain="prf", reftype="ref",
                                   reftarget=label, refexplicit=False, refwarn=True, refdoc=refdoc)],
            [nodes.Text(entry["summary"])],
            [nodes.Text(SOURCES.get(entry["source"], entry["source"]))],
            [checks] if entry["checks"] else [nodes.emphasis("", "none")],
            [nodes.literal("", tests[0].rsplit("::", 1)[-1]),
             nodes.Text(f" (+{len(tests) - 1})" if len(tests) > 1 else "")] if tests
            else [nodes.emphasis("", "none")],
            [nodes.strong("", mark), nodes.Text(f" {kinds}")]])
    return _table(["Claim", "In one line", "Source", "Check: measured ≤ allowed", "Test", "Verified"],
                  rows, widths=[10, 36, 9, 19, 17, 9])


def _table(header: list[str], rows: list[list[list[nodes.Node]]], widths: list[int]) -> nodes.table:
    group = nodes.tgroup(cols=len(header))
    group += [nodes.colspec(colwidth=w) for w in widths]
    group += nodes.thead("", _row([[nodes.Text(h)] for h in header]))
    group += nodes.tbody("", *[_row(cells) for cells in rows])
    return nodes.table("", group, classes=["ledger-table"])


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    return nodes.row("", *[nodes.entry("", c[0] if len(c) == 1 and isinstance(c[0], nodes.paragraph)
                                       else nodes.paragraph("", "", *c)) for c in cells])


class ledger_claims_table(nodes.General, nodes.Element):
    """Where the status table goes; filled in by :class:`LedgerPostTransform`."""


class LedgerPostTransform(SphinxPostTransform):
    """Ledger lines and the status table, once every page has been read; runs before Sphinx
    resolves references (priority 10) so that their links resolve."""

    default_priority = 5

    def run(self, **kwargs) -> None:
        claims, status, builder = _ledger(self.env), getattr(self.env, "book_status_doc", None), self.app.builder
        for node in list(self.document.findall(nodes.Element)):
            if node.get("realtype") in CLAIM_KINDS and node.get("label") in claims:
                details = None if status is None else (
                    "" if builder.name == "singlehtml" else builder.get_relative_uri(self.env.docname, status)
                ) + f"#status-{node['label']}"
                node.parent.insert(node.parent.index(node) + 1,
                                   ledger_line(claims[node["label"]], self.env.docname, details))
        for placeholder in list(self.document.findall(ledger_claims_table)):
            placeholder.replace_self(status_table(claims, self.env.docname))


class LedgerClaims(SphinxDirective):
    def run(self):
        self.env.book_status_doc = self.env.docname  # where ledger lines link to
        return [ledger_claims_table()]


class LedgerFigures(SphinxDirective):
    """The paper's result figures and the pages of this book that reproduce them."""

    def run(self):
        rows = [[[nodes.Text(fig["paper"])],
                 [_doc_link(fig["ours"], self.env.docname), nodes.Text(f" (figure {fig.get('figure', '')})")],
                 [nodes.Text(fig.get("how", ""))]] for fig in _inputs(self.env).get("figures", [])]
        return [_table(["The paper's figure", "Reproduced by", "How (our settings)"], rows, widths=[30, 25, 45])]


def add_run_locally_note(app, doctree) -> None:
    """doctree-read: the command that re-runs this page, at its end."""
    docname, parts, target = app.env.docname, Path(app.env.docname).parts, None
    if Path(app.env.doc2path(docname)).suffix == ".ipynb":
        target, what, lab = f"{docname}.ipynb", "this notebook", f"it ({docname}.ipynb)"
    elif len(parts) > 2 and parts[0] == "chapters":
        target, what, lab = "/".join(parts[:2]), "this chapter's notebooks", "them"
    text = ([nodes.literal("", f"make book FORCE={target}"),
             nodes.Text(f" re-executes {what} and rebuilds the site; "),
             nodes.literal("", "make lab"), nodes.Text(f" opens {lab} in JupyterLab.")]
            if target else
            [nodes.literal("", "make book"), nodes.Text(" builds the whole book; "),
             nodes.literal("", "make test"), nodes.Text(" checks it.")])
    para = nodes.paragraph("", "", nodes.strong("", "Run this locally. "),
                           nodes.Text("From a clone of the book's repository, "), *text)
    sections = [s for s in doctree.children if isinstance(s, nodes.section)]
    (sections[-1] if sections else doctree).append(nodes.container("", para, classes=["run-locally"]))


class LibApi(SphinxDirective):
    """``{lib-api} <section>``: autodoc entries for the names of one section of ``lib.API``."""

    required_arguments = 1
    final_argument_whitespace = True

    def run(self):
        import lib

        title = self.arguments[0]
        if title not in lib.API:
            raise self.error(f"lib.API has no section {title!r}; it has {', '.join(map(repr, lib.API))}")
        lines = []
        for name in lib.API[title]:  # autodoc writes reST, which eval-rst parses inside this MyST page
            kind = "autoclass" if isinstance(getattr(lib, name), type) else "autofunction"
            options = ["   :members:", "   :exclude-members: extra_repr"] if kind == "autoclass" else []
            lines += ["```{eval-rst}", f".. {kind}:: lib.{name}", *options, "```"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


class BookFigure(SphinxDirective):
    """``{book-figure} <topic>/<name>``: a figure a notebook saved with ``run.figure``, with a
    numbered caption (the content's first paragraph), required ``:alt:`` text, and its
    provenance (notebook, profile, parameters, commit) in a line under it, outside the pixels."""

    required_arguments = 1
    has_content = True
    option_spec = {"alt": directives.unchanged_required, "name": directives.unchanged}

    def run(self):
        key = self.arguments[0]
        png = Path(self.env.srcdir) / FIGURES_DIR / f"{key}.png"
        if not re.fullmatch(r"[\w-]+/[\w-]+", key) or not png.exists():
            raise self.error(f"book-figure {key!r}: no figure {FIGURES_DIR}/{key}.png: give "
                             "<topic>/<name> of a figure a notebook saved with run.figure")
        alt = self.options.get("alt", "").strip()
        if not alt:
            raise self.error(f"book-figure {key!r}: :alt: is required (what the figure shows)")
        if not self.content:
            raise self.error(f"book-figure {key!r}: a caption is required")
        meta = yaml.safe_load(png.with_suffix(".yaml").read_text())
        image = nodes.image(uri=f"/{FIGURES_DIR}/{key}.png", alt=alt, width=f"{meta['width_px']}px",
                            classes=["book-figure-image"])
        figure = nodes.figure("", image, classes=["book-figure"])
        self.set_source_info(figure)
        self.add_name(figure)
        parsed = nodes.Element()
        self.state.nested_parse(self.content, self.content_offset, parsed)
        if not parsed.children or not isinstance(parsed[0], nodes.paragraph):
            raise self.error(f"book-figure {key!r}: the caption must start with a paragraph")
        figure += nodes.caption(parsed[0].rawsource, "", *parsed[0].children)
        shown = ", ".join(f"{k}={v}" for k, v in meta["params"].items())
        source = nodes.paragraph(classes=["figure-provenance"])
        source += [nodes.Text("Made by "),
                   _doc_link(str(Path(meta["notebook"]).with_suffix("")), self.env.docname,
                             Path(meta["notebook"]).name),
                   nodes.Text(f" · profile {meta['profile']} · {shown} · commit {meta['commit']}")]
        figure += nodes.legend("", *parsed[1:], source)
        return [figure]


def myst_roles_to_rst(app, what, name, obj, options, lines) -> None:
    """lib's docstrings use MyST roles ({prf:ref}`x`); autodoc reads reST (:prf:ref:`x`)."""
    lines[:] = [_MYST_ROLE.sub(r":\1:`\2`", line) for line in lines]


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("doctree-read", collect_claims)
    app.connect("doctree-read", add_run_locally_note)
    app.connect("env-purge-doc", lambda app, env, docname: getattr(env, "book_claims", {}).pop(docname, None))
    app.connect("build-finished", write_claims)
    app.connect("autodoc-process-docstring", myst_roles_to_rst)
    app.add_node(ledger_claims_table)
    app.add_post_transform(LedgerPostTransform)
    app.add_directive("ledger-claims", LedgerClaims)
    app.add_directive("ledger-figures", LedgerFigures)
    app.add_directive("lib-api", LibApi)
    app.add_directive("book-figure", BookFigure)
    return {"parallel_read_safe": False, "parallel_write_safe": True, "version": "1"}
