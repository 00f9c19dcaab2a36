"""Run records, atomic writes, and the house style of the committed notebooks."""

from __future__ import annotations

import ast
import json

import nbformat
import pandas as pd
import pytest

from cosearch_lib.runs import atomic_path, environment_snapshot, list_notebooks, select_notebooks, write_json, write_table


def test_atomic_path_leaves_nothing_on_failure_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "result.json"
    write_json({"v": 1}, target)
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-writ")
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_write_table_round_trips_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    for suffix in ("csv", "parquet"):
        path = write_table(df, tmp_path / f"t.{suffix}")
        back = pd.read_csv(path) if suffix == "csv" else pd.read_parquet(path)
        pd.testing.assert_frame_equal(back, df)
    with pytest.raises(ValueError, match=".csv or .parquet"):
        write_table(df, tmp_path / "t.txt")


def test_environment_snapshot_names_versions_and_device():
    snap = environment_snapshot()
    assert snap["device"] == "cpu" or snap["device"].startswith("cuda")
    assert {"torch", "transformers", "numpy"} <= set(snap["packages"])
    assert snap["git_sha"] is None or len(snap["git_sha"]) == 40


def test_notebook_selection():
    books = list_notebooks()
    assert books and books[0].name.startswith("01_")
    assert select_notebooks(["01"]) == [books[0]]
    with pytest.raises(FileNotFoundError, match="99"):
        select_notebooks(["99"])


@pytest.mark.parametrize("path", list_notebooks(), ids=lambda p: p.name)
def test_notebooks_follow_house_style(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit notebooks without outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    tree = ast.parse(params[0].source)
    for node in tree.body:  # flat literals only: papermill overrides them by name
        assert isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        ast.literal_eval(node.value)
    names = {n.targets[0].id for n in tree.body}
    assert {"profile", "seed"} <= names
    # papermill reads the cell with its own line parser (a quote in a comment can defeat it)
    import papermill

    assert set(papermill.inspect_notebook(str(path))) == names, "papermill must see every parameter"
    lines = sorted(len(c.source.splitlines()) for c in code)
    assert lines[len(lines) // 2] <= 8, "cells stay short (median <= 8 lines): logic belongs in cosearch_lib"
