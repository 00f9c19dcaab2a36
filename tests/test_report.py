"""The report of notebook 05 (cosearch_lib.report): every paper item from a profile's records, the
paper beside ours, missing runs named with their commands, and the files it writes."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from cosearch_lib.paths import project_root
from cosearch_lib.report import REPORT_ITEMS, report_items, table2_beside_paper, write_report

FAMILIES = ["syn_nq", "syn_popqa", "syn_hotpotqa", "syn_musique"]


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("COSEARCH_FIGURES", str(tmp_path / "figures"))
    return tmp_path


def eval_records() -> pd.DataFrame:
    rows = []
    for method, base in (("direct", 0.0), ("agent_retrieval", 0.25), ("agent_oracle", 0.75)):
        for fam in FAMILIES:
            for i in range(3):
                rows.append({"method": method, "dataset": fam, "question_id": f"{fam}-{i}", "sample": 0,
                             "f1": base + (0.25 if i == 0 else 0.0), "n_searches": 0 if method == "direct" else 1 + i % 2,
                             "finish": "answer" if i < 2 else "max_searches", "golds": ["x"], "prediction": None,
                             "error": None})
    return pd.DataFrame(rows)


def steps() -> pd.DataFrame:
    cols = ("ranker/main_pre", "ranker/main_post", "ranker/r_rel_pre", "ranker/r_rel_post", "ranker/reward_pre", "ranker/reward_post",
            "ranker/grouping_mean_group_size_pre", "ranker/grouping_mean_group_size_post")
    return pd.DataFrame([{"method": "cosearch", "step": s, "rollout/agent_reward": 0.1 * s, "ranker/hit@K": 0.5, "rollout/searches_per_traj": 1.0,
                          **dict.fromkeys(cols, 0.5)} for s in range(3)])


def test_every_item_says_what_is_missing_and_how_to_make_it(outputs):
    items = report_items("ci")
    assert [i.key for i in items] == [key for key, _, _ in REPORT_ITEMS]
    assert all(i.figure is None and i.missing for i in items)
    by_key = {i.key: i.missing for i in items}
    assert "run `cosearch run --profile ci --notebooks 02`" in by_key["table1_oracle_gap"]
    assert "run `cosearch grid table3 --profile ci`" in by_key["table3_ablations"]
    assert "run `cosearch run --profile ci --notebooks 03`" in by_key["fig3_ranker_dynamics"]
    page = write_report(items, "ci").read_text()
    assert page.count("*Missing:*") == len(items) and "![" not in page
    assert "Answer F1: `plain` (the paper's metric)" in page  # no records yet: the profile's metric


def test_items_with_records_draw_the_paper_beside_ours_and_are_written(outputs):
    runs = outputs / "runs" / "ci"
    runs.mkdir(parents=True)
    eval_records().to_parquet(runs / "02_eval_records.parquet")
    (runs / "training" / "cosearch").mkdir(parents=True)
    steps().to_csv(runs / "training" / "cosearch" / "steps.csv", index=False)
    open_before = set(plt.get_fignums())
    items = {i.key: i for i in report_items("ci")}
    for key in ("table1_oracle_gap", "table2_main", "table7_search_turns", "fig2_training_curves", "fig3_ranker_dynamics"):
        assert items[key].figure is not None and items[key].missing is None, key
    assert set(plt.get_fignums()) <= open_before  # closed: a notebook shows each figure once, where it displays it
    assert items["table3_ablations"].missing and items["fig2_validation"].missing
    gap = items["table1_oracle_gap"].table.set_index(["source", "row"])
    assert gap.loc[("ours (ci)", "oracle"), "avg"] == pytest.approx(0.75 + 0.25 / 3)
    assert ("paper 7B", "oracle") in gap.index
    turns = items["table7_search_turns"].table.set_index(["source", "method"])
    assert turns.loc[("ours (ci)", "agent_oracle"), "no answer"] == pytest.approx(100 / 3)
    page = write_report(list(items.values()), "ci")
    text = page.read_text()
    assert "Answer F1: `plain` (the paper's metric)" in text  # no metrics file of notebook 02: the profile's
    metrics = runs / "02_oracle_gap_study.metrics.json"
    metrics.write_text('{"eval_config": {"split": "test"}}')  # written before evaluation.f1 existed
    assert "Answer F1: `yes_no` (HotpotQA's yes/no rule; recorded before" in write_report(list(items.values()), "ci").read_text()
    metrics.write_text('{"eval_config": {"f1": "yes_no"}}')
    assert "Answer F1: `yes_no`." in write_report(list(items.values()), "ci").read_text()
    for key in ("table1_oracle_gap", "table2_main", "fig3_ranker_dynamics"):
        assert f"]({key}.png)" in text and (page.parent / f"{key}.pdf").exists() and (page.parent / f"{key}.csv").exists()


def test_table2_puts_the_papers_avg_beside_ours_by_method():
    table = table2_beside_paper(eval_records())
    assert table.loc["agent_oracle", "paper 7B avg"] == pytest.approx(
        float(pd.read_csv(project_root() / "data" / "paper_reference" / "table2_main.csv").query("agent == '7B' and method == 'Oracle'")["avg"].iloc[0]))
    assert table.loc["direct", "avg"] == pytest.approx(0.25 / 3)
