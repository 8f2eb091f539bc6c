"""Normalise an executed notebook so that two executions with the same inputs are byte-identical.

papermill and nbclient record wall-clock times, paths and a random id on the cell they
inject; everything else (outputs, PNG bytes included) is deterministic once seeds and thread
counts are fixed. We strip the former and present the injected parameters as the one
parameters cell of the rendered page.
"""

from __future__ import annotations

import nbformat

INJECTED_TAG = "injected-parameters"
PARAMETERS_TAG = "parameters"
HIDE = "remove-cell"
FOLD = "hide-input"  # shown collapsed: a reader can open it, the page does not spend space on it


def normalize(nb: nbformat.NotebookNode, profile: str) -> nbformat.NotebookNode:
    """Strip run-dependent metadata in place and return ``nb``.

    * top-level ``metadata.papermill`` (times, paths, parameters: the footer and the
      reproducibility appendix say which parameters were in force);
    * each cell's ``metadata.execution`` and ``metadata.papermill``;
    * the injected cell's random id becomes a fixed one;
    * the notebook's own ``parameters`` cell (its defaults) is hidden and the injected cell,
      which holds the values actually in force, takes its place, folded, with a header saying so.
    """
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("widgets", None)
    has_injected = any(INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        tags = cell.metadata.get("tags", [])
        if INJECTED_TAG in tags:
            cell["id"] = INJECTED_TAG
            lines = cell.source.splitlines()
            if lines and lines[0].startswith("# Parameters"):
                lines = lines[1:]
            header = f"# Parameters in force (profile: {profile}; from data/params.yaml)"
            cell.source = "\n".join([header, *lines])
            if FOLD not in tags:
                cell.metadata["tags"] = [*tags, FOLD]
        elif PARAMETERS_TAG in tags and has_injected and HIDE not in tags:
            cell.metadata["tags"] = [*tags, HIDE]
    return nb


def normalized_bytes(path, profile: str) -> bytes:
    """Read an executed notebook and return its normalised serialisation."""
    nb = nbformat.read(path, as_version=4)
    return nbformat.writes(normalize(nb, profile)).encode() + b"\n"
