"""Sphinx extension of the book: the reproduction ledger on the page, run-locally notes, API docstrings.

- The claims of the book are found here, in the doctrees: every sphinx-proof theorem,
  proposition, lemma and corollary, recorded as each page is read and written, in the book's
  order, to ``_claims.json`` in the built site (the site check reads it).
- Under every claim, a line from the ledger — the claims joined with ``_ledger.json``
  (checks, tests and notes, written into the staged tree by the build): the verdict, the
  notebook and cell that check the claim with the measured discrepancy and its tolerance,
  and the pytest tests that assert it. Lines are added once every page has been read, since
  a test belongs to the longest label it starts with.
- The directives ``ledger-claims`` and ``ledger-figures`` render the reproduction-status
  tables of ``chapters/appendix/status``.
- At the end of every page, a short note with the exact command that re-runs it locally.
- ``lib`` docstrings are written for the MyST pages (``{prf:ref}`label```); autodoc reads
  them as reStructuredText, so the roles are rewritten to ``:prf:ref:`label``` on the way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

from .ledger import CLAIM_KINDS, CLAIMS_FILE, Claim, assemble

LEDGER_FILE = "_ledger.json"
VERDICT_MARK = {"reproduced": "✓ reproduced", "fails its check": "✗ fails its check", "incomplete": "◌ incomplete"}
_MYST_ROLE = re.compile(r"\{([a-z]+(?::[a-z]+)?)\}`([^`]+)`")


def _inputs(app) -> dict:
    if not hasattr(app.env, "book_ledger_inputs"):
        path = Path(app.srcdir) / LEDGER_FILE
        app.env.book_ledger_inputs = json.loads(path.read_text()) if path.exists() else {}
    return app.env.book_ledger_inputs


def collect_claims(app, doctree) -> None:
    """Record the claims of the page just read (sphinx-proof nodes), in document order."""
    found = []
    for node in doctree.findall(nodes.Element):
        if node.get("realtype") in CLAIM_KINDS and node.get("label"):
            title = str(node.get("title", "")).strip().removeprefix("(").removesuffix(")")
            found.append(Claim(node["label"], node["realtype"], title, app.env.docname))
    if not hasattr(app.env, "book_claims"):
        app.env.book_claims = {}
    app.env.book_claims[app.env.docname] = found


def purge_claims(app, env, docname) -> None:
    getattr(env, "book_claims", {}).pop(docname, None)


def book_claims(env) -> list[Claim]:
    """Every claim read so far, pages in the book's order (pages outside it last)."""
    found = getattr(env, "book_claims", {})
    order = {page: k for k, page in enumerate(_inputs(env.app).get("pages", []))}
    pages = sorted(found, key=lambda page: (order.get(page, len(order)), page))
    return [claim for page in pages for claim in found[page]]


def _ledger(app) -> dict:
    # Built on first use in the write phase, when every page has been read.
    if not hasattr(app.env, "book_ledger"):
        inputs = _inputs(app)
        ledger = assemble(inputs, book_claims(app.env)) if inputs else None
        app.env.book_ledger = ledger.to_json() if ledger else {}
    return app.env.book_ledger


def write_claims(app, exception) -> None:
    if exception is None:
        claims = [claim.__dict__ for claim in book_claims(app.env)]
        (Path(app.outdir) / CLAIMS_FILE).write_text(json.dumps(claims, indent=1) + "\n")


def _doc_link(docname: str, refdoc: str, text: str | None = None) -> nodes.Node:
    xref = addnodes.pending_xref("", nodes.inline("", text or docname), refdomain="std", reftype="doc",
                                 reftarget="/" + docname, refexplicit=text is not None, refwarn=True,
                                 refdoc=refdoc)
    return xref


def _claim_link(label: str, refdoc: str) -> nodes.Node:
    return addnodes.pending_xref("", nodes.inline("", label), refdomain="prf", reftype="ref", reftarget=label,
                                 refexplicit=False, refwarn=True, refdoc=refdoc)


def _number(value: float) -> str:
    return f"{value:.2g}" if value else "0"


def _check_nodes(check: dict, refdoc: str) -> list[nodes.Node]:
    cell = f", cell {check['cell']}" if check.get("cell") else ""
    return [_doc_link(check["notebook"], refdoc), nodes.Text(f"{cell}: {check['what']} = "),
            nodes.strong("", _number(check["discrepancy"])),
            nodes.Text(f" (tolerance {_number(check['tolerance'])})")]


def _test_nodes(tests: list[str]) -> list[nodes.Node]:
    if not tests:
        return [nodes.emphasis("", "no test")]
    more = f" and {len(tests) - 1} more" if len(tests) > 1 else ""
    return [nodes.literal("", tests[0]), nodes.Text(more)]


def ledger_line(entry: dict, refdoc: str) -> nodes.Node:
    """The paragraph printed under a claim: verdict · check(s) · test(s)."""
    verdict = entry["verdict"]
    para = nodes.paragraph(classes=["claim-ledger", "claim-" + verdict.split()[0]])
    para += nodes.strong("", VERDICT_MARK.get(verdict, verdict))
    para += nodes.Text(" · Checked in ")
    if not entry["checks"]:
        para += nodes.emphasis("", "no notebook")
    for k, check in enumerate(entry["checks"]):
        if k:
            para += nodes.Text("; and in ")
        para.extend(_check_nodes(check, refdoc))
    para += nodes.Text(" · Tested by ")
    para.extend(_test_nodes(entry["tests"]))
    return para


class ledger_claims_table(nodes.General, nodes.Element):
    """Where the status table goes; filled by :class:`LedgerPostTransform`."""


class LedgerPostTransform(SphinxPostTransform):
    """Ledger lines under the claims and the status table, once every page has been read.

    Runs before Sphinx resolves references (priority 10), so the links it adds resolve.
    """

    default_priority = 5

    def run(self, **kwargs) -> None:
        ledger = _ledger(self.app)
        claims, refdoc = ledger.get("claims", {}), self.env.docname
        for node in list(self.document.findall(nodes.Element)):
            if node.get("realtype") in CLAIM_KINDS and node.get("label") in claims:
                parent = node.parent
                parent.insert(parent.index(node) + 1, ledger_line(claims[node["label"]], refdoc))
        for placeholder in list(self.document.findall(ledger_claims_table)):
            placeholder.replace_self(status_table(claims, refdoc))


def add_run_locally_note(app, doctree) -> None:
    docname = app.env.docname
    source = Path(app.env.doc2path(docname))
    parts = Path(docname).parts
    if source.suffix == ".ipynb":
        notebook = f"{docname}.ipynb"
        text = [nodes.literal("", f"make book FORCE={notebook}"),
                nodes.Text(" re-executes this notebook and rebuilds the site; "),
                nodes.literal("", "make lab"), nodes.Text(f" opens it ({notebook}) in JupyterLab.")]
    elif len(parts) > 2 and parts[0] == "chapters":
        folder = "/".join(parts[:2])
        text = [nodes.literal("", f"make book FORCE={folder}"),
                nodes.Text(" re-executes this chapter's notebooks and rebuilds the site; "),
                nodes.literal("", "make lab"), nodes.Text(" opens them in JupyterLab.")]
    else:
        text = [nodes.literal("", "make book"), nodes.Text(" builds the whole book; "),
                nodes.literal("", "make test"), nodes.Text(" checks it.")]
    note = nodes.container(classes=["run-locally"])
    para = nodes.paragraph()
    para += nodes.strong("", "Run this locally. ")
    para += nodes.Text("From a clone of the book's repository, ")
    para.extend(text)
    note += para
    sections = [s for s in doctree.children if isinstance(s, nodes.section)]
    (sections[-1] if sections else doctree).append(note)


SHORT_SOURCE = {"abstract": "abstract", "precise": "precise version", "extension": "extension"}


def status_table(claims: dict, refdoc: str) -> nodes.table:
    """One row per claim of the book, in the book's order."""
    rows = []
    for label, entry in claims.items():
        checks = nodes.paragraph()
        for k, check in enumerate(entry["checks"]):
            if k:
                checks += nodes.Text("; ")
            cell = f", cell {check['cell']}" if check.get("cell") else ""
            checks += nodes.strong("", _number(check["discrepancy"]))
            checks += nodes.Text(f" ≤ {_number(check['tolerance'])} (")
            checks += _doc_link(check["notebook"], refdoc, "notebook" + cell)
            checks += nodes.Text(")")
        tests = entry["tests"]
        test_cell = ([nodes.literal("", tests[0].rsplit("::", 1)[-1]),
                      nodes.Text(f" (+{len(tests) - 1})" if len(tests) > 1 else "")]
                     if tests else [nodes.emphasis("", "none")])
        rows.append([
            [_claim_link(label, refdoc)],
            [nodes.Text(entry["summary"])],
            [nodes.Text(SHORT_SOURCE.get(entry["source"], entry["source"]))],
            [checks] if entry["checks"] else [nodes.emphasis("", "none")],
            test_cell,
            [nodes.strong("", VERDICT_MARK.get(entry["verdict"], entry["verdict"]).split()[0])],
        ])
    return _table(["Claim", "In one line", "Source", "Check: measured ≤ allowed", "Test", ""], rows,
                  widths=[10, 38, 9, 20, 20, 3])


class LedgerClaims(SphinxDirective):
    """The status table (filled in once every page has been read)."""

    def run(self):
        return [ledger_claims_table()]


class LedgerFigures(SphinxDirective):
    """The status table of the paper's result figures and the figures that reproduce them."""

    def run(self):
        rows = [[[nodes.Text(fig["paper"])],
                 [_doc_link(fig["ours"], self.env.docname), nodes.Text(f" (figure {fig.get('figure', '')})")],
                 [nodes.Text(fig.get("how", ""))]]
                for fig in _inputs(self.env.app).get("figures", [])]
        return [_table(["The paper's figure", "Reproduced by", "How (our settings)"], rows, widths=[30, 25, 45])]


def _table(header: list[str], rows: list[list[list[nodes.Node]]], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["ledger-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    head += _row([[nodes.Text(h)] for h in header])
    body = nodes.tbody()
    group += body
    for cells in rows:
        body += _row(cells)
    return table


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    row = nodes.row()
    for content in cells:
        entry = nodes.entry()
        para = content[0] if len(content) == 1 and isinstance(content[0], nodes.paragraph) else None
        if para is None:
            para = nodes.paragraph()
            para.extend(content)
        entry += para
        row += entry
    return row


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
        for name in lib.API[title]:
            kind = "autoclass" if isinstance(getattr(lib, name), type) else "autofunction"
            options = [":members:", ":exclude-members: extra_repr"] if kind == "autoclass" else []
            lines += [f"```{{{kind}}} lib.{name}", *options, "```", ""]
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


def myst_roles_to_rst(app, what, name, obj, options, lines) -> None:
    """``{prf:ref}`x``` (MyST, as written in lib's docstrings) -> ``:prf:ref:`x``` for autodoc."""
    for k, line in enumerate(lines):
        lines[k] = _MYST_ROLE.sub(lambda m: f":{m.group(1)}:`{m.group(2)}`", line)


def setup(app):
    app.setup_extension("sphinx.ext.autodoc")
    app.connect("doctree-read", collect_claims)
    app.connect("env-purge-doc", purge_claims)
    app.connect("build-finished", write_claims)
    app.add_node(ledger_claims_table)
    app.add_post_transform(LedgerPostTransform)
    app.connect("doctree-read", add_run_locally_note)
    app.connect("autodoc-process-docstring", myst_roles_to_rst)
    app.add_directive("ledger-claims", LedgerClaims)
    app.add_directive("ledger-figures", LedgerFigures)
    app.add_directive("lib-api", LibApi)
    return {"parallel_read_safe": False, "parallel_write_safe": True, "version": "1"}
