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


def _trained(root, method: str, *, steps_n: int, per_step: int, gain: float, hit1: float | None = None):
    """Training records of one method: ``steps_n`` steps of ``per_step`` questions, validated at the
    start and after each step on 8 dev questions (2 per family) whose F1 rises by ``gain`` per step
    (and, with ``hit1``, on 8 held-out sub-queries whose Hit@1 is ``hit1`` plus ``gain`` per step)."""
    folder = root / "training" / method
    folder.mkdir(parents=True)
    pd.DataFrame([{"method": method, "step": s, "rollout/n_questions": per_step, "rollout/agent_reward": 0.1,
                   "rollout/agent_f1": 0.1 + 0.01 * s, "rollout/agent_best_of_g_f1": 0.3, "rollout/searches_per_traj": 1.5,
                   "ranker/grouping_n_groups_post": 10.0 + s} for s in range(-1, steps_n)]).to_csv(folder / "steps.csv", index=False)
    rows = [{"step": s, "method": method, "kind": "agent", "question_id": f"{fam}-{i}", "dataset": fam,
             "f1": min(1.0, 0.1 + gain * (s + 1) + 0.1 * i)} for s in range(-1, steps_n) for fam in FAMILIES for i in range(2)]
    if hit1 is not None:
        rows += [{"step": s, "method": method, "kind": "ranker", "question_id": f"{fam}-{i}", "dataset": fam,
                  "hit@1": float(i < round(2 * min(1.0, hit1 + gain * (s + 1))))}
                 for s in range(-1, steps_n) for fam in FAMILIES for i in range(2)]
    pd.DataFrame(rows).to_csv(folder / "validation.csv", index=False)


def test_fig2s_ranker_panel_draws_the_retrievers_order_as_a_level_not_as_a_method_that_trains(outputs):
    """Retrieval Only trains no ranker: its held-out Hit@1 is the retriever's order's, a dashed level in the
    ranker panel beside CoSearch's curve (the table keeps its rows)."""
    _trained(outputs / "runs" / "laptop_curve", "search_r1", steps_n=4, per_step=12, gain=0.02, hit1=0.5)
    _trained(outputs / "runs" / "laptop_curve_wide", "cosearch", steps_n=2, per_step=24, gain=0.25, hit1=0.5)
    item = {i.key: i for i in report_items("laptop_curve", with_runs=["laptop_curve_wide"])}["fig2_validation"]
    ranker_ax = item.figure.axes[1]
    labels = [t.get_text() for t in ranker_ax.get_legend().get_texts()]
    assert sorted(labels) == ["cosearch", "retriever order (0.50)"]  # no search_r1 curve
    level = [line for line in ranker_ax.lines if line.get_linestyle() == "--"]
    assert len(level) == 1 and list(level[0].get_ydata()) == [0.5, 0.5]
    assert set(item.table.loc[item.table["panel"] == "ranker: Hit@1 on held-out sub-queries", "method"]) == {"search_r1", "cosearch"}


def test_methods_trained_under_two_profiles_share_one_figure_on_training_questions(outputs):
    """Notebook 05's ``with_runs``: Retrieval Only trained under one profile (4 steps of 12 questions)
    and CoSearch under another (2 steps of 24) share Fig. 2 and the learning-curve table; their
    validations line up on training questions (0, 24, 48), not on steps. A method trained under both
    profiles is refused."""
    from cosearch_lib.records.training_runs import read_runs
    from cosearch_lib.report import training_metrics

    _trained(outputs / "runs" / "laptop_curve", "search_r1", steps_n=4, per_step=12, gain=0.02)
    _trained(outputs / "runs" / "laptop_curve_wide", "cosearch", steps_n=2, per_step=24, gain=0.04)
    items = {i.key: i for i in report_items("laptop_curve", with_runs=["laptop_curve_wide"])}
    assert items["fig2_validation"].missing is None and items["learning_curves"].missing is None
    curve = items["fig2_validation"].table
    agent = curve[curve["panel"] == "agent: validation avg F1"]
    assert sorted(agent.loc[agent["method"] == "search_r1", "questions"]) == [0, 12, 24, 36, 48]
    assert sorted(agent.loc[agent["method"] == "cosearch", "questions"]) == [0, 24, 48]
    assert items["fig2_validation"].figure.axes[0].get_xlabel() == "training questions rolled out"
    only = {i.key: i for i in report_items("laptop_curve")}
    assert set(only["fig2_validation"].table["method"]) == {"search_r1"}  # without with_runs: its own records
    metrics = training_metrics("laptop_curve", with_runs=["laptop_curve_wide"])
    rows = {(r["method"], r["families"]): r for r in metrics["learning_curves"]["agent"]}
    assert rows[("search_r1", "all")]["diff"] == pytest.approx(0.08) and rows[("cosearch", "all")]["diff"] == pytest.approx(0.08)
    assert rows[("cosearch", "all")]["end_step"] == 2 and metrics["questions_per_step"] == {"search_r1": 12.0, "cosearch": 24.0}
    _trained(outputs / "runs" / "laptop_curve_wide", "search_r1", steps_n=1, per_step=24, gain=0.0)
    with pytest.raises(ValueError, match="search_r1 was trained under both 'laptop_curve' and 'laptop_curve_wide'"):
        read_runs(["laptop_curve", "laptop_curve_wide"])


def test_results_show_notebook_05s_learning_curves_under_their_heading():
    from cosearch_lib.records.docs import RESULT_SECTIONS

    title, render = RESULT_SECTIONS["05_figures"]
    row = {"method": "search_r1", "families": "all", "start_step": 0, "end_step": 16, "start": 0.11, "end": 0.29,
           "diff": 0.17, "ci_low": 0.09, "ci_high": 0.26, "n_questions": 70}
    text = "\n".join(render({"profiles": ["laptop_curve", "laptop_curve_wide"], "methods": ["search_r1", "cosearch"],
                             "questions_per_step": {"search_r1": 12.0, "cosearch": 24.0},
                             "learning_curves": {"agent": [row]}, "grpo_signal": []}))
    assert "Learning curve (agent)" in text and "| search_r1 | all | 0 | 16 |" in text
    assert "`laptop_curve`, `laptop_curve_wide`" in text and "search_r1 12, cosearch 24" in text


def test_training_metrics_read_each_runs_ranker_calls_against_its_training_split(outputs, monkeypatch):
    """Notebook 05's hop-group tables (records.hop_signal): each method's ranker calls, split by the hop group of
    their training questions; a profile whose training split file is absent is named, not guessed."""
    from types import SimpleNamespace

    import cosearch_lib.report as report
    from cosearch_lib.report import training_metrics

    _trained(outputs / "runs" / "laptop_curve", "search_r1", steps_n=2, per_step=2, gain=0.02)
    folder = outputs / "runs" / "laptop_curve" / "training" / "search_r1"
    steps = pd.read_csv(folder / "steps.csv")
    steps.assign(**{"rollout/n_trajectories": steps["rollout/n_questions"] * 8}).to_csv(folder / "steps.csv", index=False)  # G = 8
    calls = pd.DataFrame([{"step": s, "question_id": q, "traj_id": f"{q}/{g}", "turn": t, "r_main": float(q == "q1") * g / 7}
                          for s in (0, 1) for q in ("q0", "q1") for g in range(8) for t in range(1 + (q == "q1") * (g % 2))])
    calls.to_parquet(outputs / "runs" / "laptop_curve" / "training" / "search_r1" / "ranker_calls.parquet")
    split = outputs / "train.parquet"
    monkeypatch.setattr(report, "corpus_paths", lambda cfg: SimpleNamespace(qa={"train": split}))
    assert training_metrics("laptop_curve")["hop_signal_missing"] == [f"laptop_curve: no 'train' split file ({split})"]
    pd.DataFrame({"id": ["q0"], "question": ["a?"], "golden_answers": [["x"]], "data_source": ["syn_nq"]}).to_parquet(split)
    stale = training_metrics("laptop_curve")["hop_signal_missing"]  # a split without q1: another world, named
    assert len(stale) == 1 and stale[0].startswith("laptop_curve, search_r1: 1 question(s)") and "q1" in stale[0]
    pd.DataFrame({"id": ["q0", "q1"], "question": ["a?", "b?"], "golden_answers": [["x"], ["y"]],
                  "data_source": ["syn_nq", "syn_musique"]}).to_parquet(split)
    metrics = training_metrics("laptop_curve")
    signal = {(r["hop"], r["part"]): r for r in metrics["hop_signal"]}
    assert signal[("multi", "all")]["searches_per_traj"] == pytest.approx(1.5)  # odd trajectories searched twice
    assert signal[("single", "all")]["best_of_g"] == 0.0 and signal[("multi", "all")]["best_of_g"] == pytest.approx(1.0)
    second = {(r["hop"], r["part"]): r for r in metrics["second_search"]}
    assert second[("multi", "all")]["diff"] == pytest.approx((16 / 7 - 12 / 7) / 4, abs=1e-6)  # odd g: 1,3,5,7 vs even 0,2,4,6; kept to 6 decimals, rounded once by RESULTS
    assert second[("single", "all")]["questions"] == 0 and "hop_signal_missing" not in metrics
    assert metrics["coverage"] == [{"method": "search_r1", "group_size": 8, "rolled_out": 4, "with_a_search": 4}]
    item = {i.key: i for i in report_items("laptop_curve")}["hop_signal"]
    assert item.missing is None and set(item.table["hop"]) == {"single", "multi"}
    labels = [t.get_text() for t in item.figure.axes[0].get_yticklabels()]
    assert "search_r1 · multi · all (0-1, n=2)" in labels  # the questions with both one search and more
    assert not any("single" in label for label in labels)  # never searched twice: no pair, no point
    plt.close(item.figure)


def test_notebook_05_builds_the_hop_tables_once_for_its_figure_and_its_metrics(outputs, monkeypatch):
    """report_items draws the hop-group figure and training_metrics saves the same tables: one build, until a
    file they read is rewritten."""
    from types import SimpleNamespace

    import cosearch_lib.report as report
    from cosearch_lib.report import training_metrics

    _trained(outputs / "runs" / "laptop_curve", "search_r1", steps_n=2, per_step=2, gain=0.02)
    folder = outputs / "runs" / "laptop_curve" / "training" / "search_r1"
    steps = pd.read_csv(folder / "steps.csv")
    steps.assign(**{"rollout/n_trajectories": steps["rollout/n_questions"] * 4}).to_csv(folder / "steps.csv", index=False)  # G = 4
    calls_path = folder / "ranker_calls.parquet"
    calls = pd.DataFrame([{"step": s, "question_id": q, "traj_id": f"{q}/{g}", "turn": t, "r_main": float(q == "q1") * g / 3}
                          for s in (0, 1) for q in ("q0", "q1") for g in range(4) for t in range(1 + (q == "q1") * (g % 2))])
    calls.to_parquet(calls_path)
    split = outputs / "train.parquet"
    pd.DataFrame({"id": ["q0", "q1"], "question": ["a?", "b?"], "golden_answers": [["x"], ["y"]],
                  "data_source": ["syn_nq", "syn_musique"]}).to_parquet(split)
    monkeypatch.setattr(report, "corpus_paths", lambda cfg: SimpleNamespace(qa={"train": split}))
    builds = []
    real = report.run_hop_tables
    monkeypatch.setattr(report, "run_hop_tables", lambda *a, **k: builds.append(1) or real(*a, **k))
    item = {i.key: i for i in report_items("laptop_curve")}["hop_signal"]
    assert item.missing is None, item.missing
    plt.close(item.figure)
    first = training_metrics("laptop_curve")
    assert len(builds) == 1
    pd.testing.assert_frame_equal(item.table.round(report.METRIC_DIGITS), pd.DataFrame(first["second_search"]), check_dtype=False)
    calls.assign(r_main=calls["r_main"] * 0.5).to_parquet(calls_path)  # a rewrite: built again, from the new calls
    rebuilt = training_metrics("laptop_curve")
    assert len(builds) == 2
    assert pd.DataFrame(rebuilt["hop_signal"])["mean_of_g"].tolist() != pd.DataFrame(first["hop_signal"])["mean_of_g"].tolist()


def test_a_split_given_as_a_folder_is_stamped_by_the_files_load_qa_reads(tmp_path, monkeypatch):
    """The hop tables' cache key (``_hop_stamps``) takes the stamp of every QA file of a folder split: a shard
    rewritten in place (the folder's mtime unchanged) changes it; a hidden download-metadata file does not."""
    import os
    from types import SimpleNamespace

    import cosearch_lib.report as report

    folder = tmp_path / "train"
    (folder / "part").mkdir(parents=True)
    (folder / ".cache").mkdir()
    shard = folder / "part" / "0.parquet"
    pd.DataFrame({"id": ["q0"], "question": ["a?"], "golden_answers": [["x"]], "data_source": ["syn_nq"]}).to_parquet(shard)
    monkeypatch.setattr(report, "corpus_paths", lambda cfg: SimpleNamespace(qa={"train": folder}))
    os.utime(folder, ns=(1, 1))
    before = report._hop_stamps(["laptop_curve"])
    assert str(shard) in {s[0] for s in before}
    (folder / ".cache" / "lock").write_text("x")  # huggingface_hub's metadata: load_qa skips it, so does the key
    os.utime(folder, ns=(1, 1))
    assert report._hop_stamps(["laptop_curve"]) == before
    pd.DataFrame({"id": ["q0", "q1"], "question": ["a?", "b?"], "golden_answers": [["x"], ["y"]],
                  "data_source": ["syn_nq", "syn_nq"]}).to_parquet(shard)  # in place
    os.utime(folder, ns=(1, 1))
    assert report._hop_stamps(["laptop_curve"]) != before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report._split_stamp(empty) == (report._stamp(empty),)
