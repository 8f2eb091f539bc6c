"""The page measures of issue-14 quality: each can fail, and names the notebook and the measure."""

from __future__ import annotations

import base64
import struct
import zlib

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from bookbuild.notebook import FIGURE_DPI
from bookbuild.reading import measure, png_width


def png(width: int, height: int = 2) -> str:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\xff" * (3 * width) for _ in range(height))
    body = (chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def page(*cells):
    nb = new_notebook()
    nb.cells = list(cells)
    return nb


def code(source, tags=(), outputs=()):
    cell = new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    cell.outputs = list(outputs)
    return cell


PROSE = new_markdown_cell(" ".join(["word"] * 100))


def test_png_width_reads_the_header():
    assert png_width(png(123)) == 123


def test_a_page_that_reads_well_has_no_problems():
    good = page(PROSE, code("import x", ["remove-input"]), code("y = f(x)\ny"),
                code("plot()", outputs=[new_output("display_data", data={
                    "image/png": png(int(7.9 * FIGURE_DPI)), "text/plain": "<Figure size 700x400>"})]))
    m = measure(good, "good.ipynb")
    assert m.problems() == [] and m.code_lines == 3 and m.prose_words == 100


def test_each_measure_fails_and_names_notebook_and_measure():
    long_line = "x = " + "1 + " * 30 + "1"
    bad = page(PROSE,
               code("\n".join(f"a{k} = {k}" for k in range(16))),             # 16 lines > 15
               code(long_line),                                                  # > 88 chars
               code("df.style", outputs=[new_output("execute_result", data={
                   "text/plain": "<pandas.io.formats.style.Styler at 0x7f00deadbeef>",
                   "text/html": '<table id="T_1a2b3_">'})]),
               code("len(x)", outputs=[new_output("execute_result", data={"text/plain": "7168"})]),
               code("plot()", outputs=[new_output("display_data", data={
                   "image/png": png(int(12.5 * FIGURE_DPI))})]))
    problems = measure(bad, "chapters/x/bad.ipynb").problems()
    text = "\n".join(problems)
    assert all(p.startswith("chapters/x/bad.ipynb: ") for p in problems)
    for name in ("largest visible cell = 16", "lines over 88 characters = 1",
                 "object reprs and stray values = 3", "figures wider than 8 in = 1",
                 "code lines per 100 words = 20"):
        assert name in text, name
    assert "stray value '7168'" in text and "12.5 in" in text


def test_figures_must_fit_the_page():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bookbuild.notebook import figure_problems, set_style

    set_style()
    fig, ax = plt.subplots()                      # the default size: the content width
    ax.plot([0, 1]); ax.set_xlabel("distance D")
    assert figure_problems(fig) == []
    ax.legend(["tiny"], fontsize=6)               # 6 pt = 9.2 px at 110 dpi, shown 1:1
    [problem] = figure_problems(fig)
    assert problem.startswith("text 'tiny' is 9.2 px on the page")
    wide, _ = plt.subplots(figsize=(12.5, 4))
    assert figure_problems(wide) == ["12.5 in wide (at most 8 in at 110 dpi)"]
    scaled, ax = plt.subplots(figsize=(8, 4))     # shown at 688/880 of its size
    ax.set_title("t", fontsize=8)                 # 8 pt = 12.2 px saved, 9.6 px shown
    assert "9.6 px" in figure_problems(scaled)[0]
    plt.close("all")
