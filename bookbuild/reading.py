"""How a notebook page reads: measures computed from an executed notebook, and their goals.

A chapter's notebook should read like *The Annotated S4*: prose, a short visible cell, its
output, a sentence on what it shows. What a reader sees of a cell is its source unless the
cell is tagged to hide or remove it, and its outputs. The measures:

- visible code lines (non-blank) per 100 words of prose on the page;
- the largest visible code cell, in lines;
- code lines longer than 88 characters, shown or one click away (hide-input): they
  scroll sideways;
- object reprs in outputs (``<... at 0x...>``, pandas Styler ids ``T_xxxxx``) and stray
  values (a cell whose result is a bare text value, not a table or figure);
- figures wider than 8 in at the book's figure dpi.
"""

from __future__ import annotations

import base64
import re
import struct
from dataclasses import dataclass, field

from .notebook import FIGURE_DPI

HIDDEN = {"remove-input", "remove-cell", "hide-input", "hide-cell"}
GOALS = {
    "code lines per 100 words": 15,
    "largest visible cell": 15,
    "lines over 88 characters": 0,
    "object reprs and stray values": 0,
    "figures wider than 8 in": 0,
}
MAX_LINE = 88
MAX_FIGURE_INCHES = 8.0
_REPR = re.compile(r"<[A-Za-z_][\w.]*(?: object)? at 0x[0-9a-fA-F]+>|\bT_[0-9a-f]{5}(?:_|\b)")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")


@dataclass
class PageMeasures:
    notebook: str
    code_lines: int = 0
    prose_words: int = 0
    largest_cell: int = 0
    long_lines: list[str] = field(default_factory=list)
    reprs: list[str] = field(default_factory=list)
    wide_figures: list[str] = field(default_factory=list)

    def values(self) -> dict[str, float]:
        return {
            "code lines per 100 words": 100 * self.code_lines / max(self.prose_words, 1),
            "largest visible cell": self.largest_cell,
            "lines over 88 characters": len(self.long_lines),
            "object reprs and stray values": len(self.reprs),
            "figures wider than 8 in": len(self.wide_figures),
        }

    def problems(self) -> list[str]:
        """One line per measure beyond its goal, naming the notebook and the measure."""
        found = []
        details = {"lines over 88 characters": self.long_lines,
                   "object reprs and stray values": self.reprs,
                   "figures wider than 8 in": self.wide_figures}
        for name, value in self.values().items():
            if value > GOALS[name]:
                where = "; ".join(details.get(name, [])[:3])
                found.append(f"{self.notebook}: {name} = {value:.3g} (goal ≤ {GOALS[name]})"
                             + (f": {where}" if where else ""))
        return found


def png_width(data: str) -> int:
    """Pixel width of a base64 PNG (from its IHDR chunk)."""
    return struct.unpack(">I", base64.b64decode(data[:44])[16:20])[0]


def _visible(cell) -> bool:
    tags = set(cell.metadata.get("tags", []))
    return cell.cell_type == "code" and not tags & HIDDEN and bool(cell.source.strip())


def measure(nb, notebook: str) -> PageMeasures:
    """The measures of one executed notebook (an nbformat node)."""
    m = PageMeasures(notebook)
    for number, cell in enumerate(nb.cells, 1):
        if cell.cell_type == "markdown":
            m.prose_words += len(_WORD.findall(re.sub(r"\$[^$]*\$", " ", cell.source)))
            continue
        if cell.cell_type != "code":
            continue
        lines = [line for line in cell.source.splitlines() if line.strip()]
        if _visible(cell):
            m.code_lines += len(lines)
            m.largest_cell = max(m.largest_cell, len(lines))
        if not set(cell.metadata.get("tags", [])) & {"remove-input", "remove-cell"}:
            # hide-input code is one click away: it must fit the page too
            m.long_lines += [f"cell {number}: {len(line)} chars" for line in lines
                             if len(line) > MAX_LINE]
        if "remove-output" in cell.metadata.get("tags", []) or "remove-cell" in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            texts = [out.get("text", "")] + [data.get(k, "") for k in ("text/plain", "text/html")]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else text
                m.reprs += [f"cell {number}: {hit}" for hit in _REPR.findall(text)]
            if out.get("output_type") == "execute_result" and set(data) == {"text/plain"}:
                m.reprs.append(f"cell {number}: stray value {''.join(data['text/plain'])[:30]!r}")
            if "image/png" in data:
                inches = png_width(data["image/png"]) / FIGURE_DPI
                if inches > MAX_FIGURE_INCHES:
                    m.wide_figures.append(f"cell {number}: {inches:.1f} in")
    return m
