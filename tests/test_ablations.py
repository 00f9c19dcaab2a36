"""Tables 3 and 4 from a grid's runs (records.ablations): finished cells only, paired intervals
against the reference cell, the paper's rows beside ours, and what is missing said with its command."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from cosearch_lib.records.ablations import ablation_table, cell_topk, grid_records, missing_cells, topk_table
from cosearch_lib.records.grid_cells import load_grid

FAMILIES = ["syn_nq", "syn_popqa", "syn_hotpotqa", "syn_musique"]  # two single-hop, two multi-hop


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def finish(folder, policies: dict[str, list[float]]) -> None:
    """A finished notebook-03 run: an ok record and evaluation records, 3 questions per family."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "03_joint_grpo_training.run.json").write_text(json.dumps({"status": "ok"}))
    rows = [{"method": policy, "dataset": fam, "question_id": f"{fam}-{i}", "sample": 0, "f1": f1s[j * 3 + i],
             "golds": ["x"], "prediction": None, "error": None} for policy, f1s in policies.items() for j, fam in enumerate(FAMILIES) for i in range(3)]
    pd.DataFrame(rows).to_parquet(folder / "03_eval_records.parquet")


def grid(tmp_path, cells: dict) -> object:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"grid": "g", "notebooks": ["03"], "cells": cells}))
    return load_grid(path)


def test_table3_pairs_every_cell_with_full_and_sets_the_paper_beside_it(tmp_path, runs):
    g = grid(tmp_path, {"full": {"paper": "full"}, "no-r-main": {"paper": "w/o r_main",
                                                                 "training": {"ranker_reward": {"use_main": False}}},
                        "ndcg": {"paper": "nDCG instead of Hit"}})
    good = [1.0] * 12
    worse = [1.0] * 6 + [0.0] * 6  # the multi-hop questions all fail
    finish(runs / "ci" / "g" / "full", {"cosearch: warm start": [0.0] * 12, "cosearch: after GRPO": good})
    finish(runs / "ci" / "g" / "no-r-main", {"cosearch: after GRPO": worse})
    records = grid_records("ci", g)
    assert set(records["cell"]) == {"full", "no-r-main"} and set(records["policy"]) >= {"cosearch: after GRPO"}
    table = ablation_table(records, g)
    assert list(table.index) == ["full", "no-r-main"]
    row = table.loc["no-r-main"]
    assert row["single-hop avg"] == 1.0 and row["multi-hop avg"] == 0.0 and row["avg"] == 0.5
    assert row["diff"] == pytest.approx(-0.5) and row["ci_high"] < 0 and row["n_questions"] == 12
    assert row["paper row"] == "w/o r_main" and row["paper avg"] == pytest.approx(0.560)
    assert row["paper diff"] == pytest.approx(0.560 - 0.568)
    assert pd.isna(table.loc["full", "diff"])  # the reference itself
    missing = missing_cells("ci", g)
    assert missing["cell"].tolist() == ["ndcg"] and missing["command"].iloc[0] == "cosearch grid g --profile ci --cells ndcg"


def test_table3_without_the_reference_cell_says_so(tmp_path, runs):
    g = grid(tmp_path, {"full": {}, "ndcg": {}})
    finish(runs / "ci" / "g" / "ndcg", {"cosearch: after GRPO": [0.5] * 12})
    table = ablation_table(grid_records("ci", g), g)
    assert list(table.index) == ["ndcg"] and "diff" not in table and table.attrs["skipped"]
    assert ablation_table(grid_records("ci", grid(tmp_path, {"x": {}})), g).empty  # nothing finished


def test_table4_reads_k_from_each_cell_and_pairs_cosearch_with_the_fixed_ranker(tmp_path, runs):
    g = grid(tmp_path, {"k1": {"search": {"topk": 1}}, "k3": {"search": {"topk": 3}}})
    finish(runs / "ci" / "g" / "k1", {"fixed_ranker: after GRPO": [0.0] * 12, "cosearch: after GRPO": [1.0] * 12,
                                      "oracle: after GRPO": [0.5] * 12})
    before = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    ks = cell_topk("ci", g)
    assert ks == {"k1": 1, "k3": 3}
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == before  # reading K writes no profile file
    table = topk_table(grid_records("ci", g), ks)
    assert table[["K", "method"]].values.tolist() == [[1, "fixed_ranker"], [1, "cosearch"], [1, "oracle"]]
    cos = table[table["method"] == "cosearch"].iloc[0]
    assert cos["avg"] == 1.0 and cos["paper avg"] == pytest.approx(0.538)
    assert cos["vs fixed ranker"] == 1.0 and cos["vs fixed ci_low"] == 1.0
    assert table.loc[table["method"] == "oracle", "paper avg"].iloc[0] == pytest.approx(0.612)


def test_results_page_shows_tables_3_and_4_of_a_profile_and_the_cells_it_did_not_run(tmp_path):
    import json

    from cosearch_lib.records.docs import render_results_page

    metrics = {"table3": [{"cell": "full", "avg": 0.5}, {"cell": "no-r-main", "paper row": "w/o r_main", "avg": 0.4,
                                                         "diff": -0.1, "ci_low": -0.2, "ci_high": 0.05}],
               "table4": [], "missing": {"table3": ["ndcg"], "table4": ["k1", "k3"]}}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "04_ablations.metrics.json").write_text(json.dumps(metrics))
    page = render_results_page(tmp_path)
    assert "| no-r-main | w/o r_main |  |  | 0.400 | -0.100 | -0.200 | 0.050 |" in page
    assert "No finished Table 4 cell." in page and "table3: ndcg; table4: k1, k3" in page
