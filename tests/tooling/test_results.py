"""Result tables agree with the committed copies within their tolerances, column by column."""

from __future__ import annotations

import yaml

from bookbuild.results import _files, changed_params, compare_table


def write_table(folder, name, text, **meta):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.csv").write_text(text)
    (folder / f"{name}.meta.yaml").write_text(yaml.safe_dump({"profile": "published", **meta}))
    return folder / f"{name}.csv"


def test_compare_table_within_and_beyond_tolerance(tmp_path):
    committed = write_table(tmp_path / "ref", "t", "model,err,n\nssm,1.0,3\nattn,2.0,4\n",
                            rtol=1e-3, atol=0.0)
    close = write_table(tmp_path / "a", "t", "model,err,n\nssm,1.0005,3\nattn,2.0,4\n")
    far = write_table(tmp_path / "b", "t", "model,err,n\nssm,1.01,3\nattn,2.0,5\n")
    renamed = write_table(tmp_path / "c", "t", "model,err,n\nS4,1.0,3\nattn,2.0,4\n")
    assert compare_table(close, committed, "t.csv") == []
    assert compare_table(far, committed, "t.csv") == [
        "t.csv: [model=ssm] err: committed 1.0, this build 1.01 (rtol=0.001, atol=0)",
        "t.csv: [model=attn] n: committed 4, this build 5 (rtol=0.001, atol=0)"]
    assert compare_table(renamed, committed, "t.csv") == [
        "t.csv: [model=ssm] model: committed 'ssm', this build 'S4'"]


def test_compare_table_per_column_tolerance_and_structure(tmp_path):
    committed = write_table(tmp_path / "ref", "t", "k,err\n1,1e-15\n", rtol=0.0, atol=0.0,
                            columns={"err": {"atol": 1e-12}})
    assert compare_table(write_table(tmp_path / "a", "t", "k,err\n1,3e-15\n"), committed, "t") == []
    assert compare_table(write_table(tmp_path / "d", "t", "k,err\n2,1e-15\n"), committed, "t") == [
        "t: [row 1] k: committed 1, this build 2 (rtol=0, atol=0)"]
    assert "columns differ" in compare_table(
        write_table(tmp_path / "b", "t", "k,error\n1,1e-15\n"), committed, "t")[0]
    assert "rows" in compare_table(
        write_table(tmp_path / "c", "t", "k,err\n1,1e-15\n2,0\n"), committed, "t")[0]


def test_compare_table_reports_a_few_lines_per_table(tmp_path):
    committed = write_table(tmp_path / "ref", "t", "x\n" + "1\n" * 20)
    problems = compare_table(write_table(tmp_path / "a", "t", "x\n" + "2\n" * 20), committed, "t")
    assert len(problems) == 9 and problems[-1] == "t: ... 12 more values drift"


def test_changed_params_ignores_added_and_removed_parameters():
    committed = {"params": {"seed": 0, "n": 64, "old": 1}}
    assert changed_params(committed, {"params": {"seed": 0, "n": 64, "new": [1, 2]}}) == {}
    assert changed_params(committed, {"params": {"seed": 1, "n": 64}}) == {"seed": (0, 1)}
    assert changed_params({}, {"params": {"seed": 0}}) == {}


def test_offline_tables_are_not_the_notebooks(tmp_path):
    # tables of offline runs (<chapter>/offline/) are neither compared with a build nor removed by `make data`
    write_table(tmp_path / "chapter", "made", "a\n1\n")
    write_table(tmp_path / "chapter" / "offline", "run", "a\n1\n")
    assert sorted(_files(tmp_path, "*.csv")) == ["chapter/made.csv"]
