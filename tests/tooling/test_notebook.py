"""The notebook-side helper: tables that never differ between runs, figures that fit the page."""

from __future__ import annotations

import pandas as pd


def test_table_keeps_each_formatted_number_on_one_line_and_lets_text_wrap():
    from bookbuild.notebook import Table

    table = Table(pd.DataFrame({"model": ["S4D Lin"], "error": [9.8e-33], "n": [64]}),
                  {"error": "{:.1e}", "n": "{:d}"})
    assert '<span class="num">9.8e-33</span>' in table.html  # no break at the exponent's '-'
    assert '<span class="num">64</span>' in table.html
    assert ">S4D Lin<" in table.html and "T_" not in table.html
    assert table.text.split() == ["model", "error", "n", "S4D", "Lin", "9.8e-33", "64"]
    labelled = Table(pd.DataFrame({"a": [1]}), label='x.ipynb 2 "')  # numbered by run.show
    assert '<table class="dataframe book-table" data-book-table="x.ipynb 2 &quot;">' in labelled.html


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


def test_run_show_numbers_its_tables_and_records_the_count_with_the_checks(tmp_path):
    import yaml

    from bookbuild.notebook import NotebookRun

    run = NotebookRun("chapters/x/y.ipynb", {"seed": 0}, "published", "c", tmp_path)
    df = pd.DataFrame({"a": [1.0]})
    first, second = run.show(df), run.show(df, "{:.1f}")
    assert 'data-book-table="chapters/x/y.ipynb 1"' in first.html
    assert 'data-book-table="chapters/x/y.ipynb 2"' in second.html
    run.checks["thm-x"] = {"discrepancy": 0.0}  # as run.check leaves it, without the glue
    run.show(df)
    record = yaml.safe_load((tmp_path / "checks" / "x" / "y.yaml").read_text())
    assert record == {"notebook": "chapters/x/y.ipynb", "tables": 3,
                      "checks": {"thm-x": {"discrepancy": 0.0}}}
