"""Validation curves with intervals and the paired validation comparisons of notebook 03
(records.training_runs), their figure (viz.plots) and their RESULTS.md section (records.docs)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cosearch_lib.eval.intervals import verdicts
from cosearch_lib.records.docs import _learning_curves, _validation_comparisons
from cosearch_lib.records.training_runs import learning_curve_table, training_summary, validation_comparisons, validation_curves
from cosearch_lib.run_schema import METRIC_DIGITS
from cosearch_lib.viz.plots import plot_validation_curves


def agent_rows(method: str, step: int, f1_by_family: dict[str, list[float]]) -> list[dict]:
    return [{"step": step, "method": method, "kind": "agent", "question_id": f"{fam}-{i}", "dataset": fam, "f1": f1}
            for fam, scores in f1_by_family.items() for i, f1 in enumerate(scores)]


def ranker_rows(method: str, step: int, hits_by_family: dict[str, list[float]]) -> list[dict]:
    return [{"step": step, "method": method, "kind": "ranker", "question_id": f"{fam}-{i}/hop0", "dataset": fam,
             "hit@1": h, "hit@K": h, "valid": 1.0}
            for fam, hits in hits_by_family.items() for i, h in enumerate(hits)]


# Two families of unequal size: the agent's avg F1 is a macro average, the ranker's Hit@1 a plain mean.
START = {"syn_nq": [0.0, 0.0, 0.0, 0.0], "syn_hotpotqa": [0.0, 1.0]}
TRAINED = {"syn_nq": [1.0, 1.0, 1.0, 1.0], "syn_hotpotqa": [1.0, 1.0]}
HALF = {"syn_nq": [1.0, 0.0, 1.0, 0.0], "syn_hotpotqa": [1.0, 0.0]}


def frame() -> pd.DataFrame:
    rows = (agent_rows("cosearch", -1, START) + agent_rows("cosearch", 3, TRAINED)
            + agent_rows("search_r1", -1, START) + agent_rows("search_r1", 3, HALF)
            + agent_rows("fixed_ranker", 3, HALF)  # validated after training only
            + ranker_rows("cosearch", -1, START) + ranker_rows("cosearch", 3, TRAINED))
    return pd.DataFrame(rows)


def test_curves_estimate_what_the_step_columns_hold_with_an_interval_around_it():
    curves = validation_curves(frame(), kind="agent")
    start = curves[(curves["method"] == "cosearch") & (curves["step"] == -1)].iloc[0]
    assert start["x"] == 0 and start["n"] == 6
    assert start["estimate"] == pytest.approx((0.0 + 0.5) / 2)  # macro: family means 0 and 0.5
    assert start["ci_low"] <= start["estimate"] <= start["ci_high"] and start["ci_high"] > start["ci_low"]
    trained = curves[(curves["method"] == "cosearch") & (curves["step"] == 3)].iloc[0]
    assert trained["x"] == 4 and trained["estimate"] == trained["ci_low"] == trained["ci_high"] == 1.0  # no spread
    ranker = validation_curves(frame(), kind="ranker")
    assert ranker.iloc[0]["estimate"] == pytest.approx(1 / 6)  # plain mean over the 6 sub-queries, not 0.25


def test_one_item_per_family_gives_no_interval_and_says_why():
    one = pd.DataFrame(agent_rows("cosearch", 1, {"syn_nq": [1.0], "syn_popqa": [0.0]}))
    row = validation_curves(one).iloc[0]
    assert row["estimate"] == 0.5 and math.isnan(row["ci_low"]) and "syn_nq" in row["note"]


def test_comparisons_pair_each_method_with_its_start_and_cosearch_with_the_others():
    table = validation_comparisons(frame(), ["cosearch", "search_r1", "fixed_ranker"], kind="agent")
    pairs = list(zip(table["a"], table["b"]))
    assert pairs == [("cosearch @ 4", "cosearch @ 0"), ("search_r1 @ 4", "search_r1 @ 0"),
                     ("cosearch @ 4", "search_r1 @ 4"), ("cosearch @ 4", "fixed_ranker @ 4")]
    rows = table.set_index(["a", "b"])
    assert rows.loc[("cosearch @ 4", "cosearch @ 0"), "diff"] == pytest.approx(1 - 0.25)
    assert rows.loc[("cosearch @ 4", "search_r1 @ 4"), "diff"] == pytest.approx(0.5)
    # paired on the same items: search_r1's zeros at start are the same items as cosearch's
    assert rows.loc[("cosearch @ 4", "search_r1 @ 4"), "ci_low"] > 0
    assert table.attrs["skipped"] == ["fixed_ranker: last vs before training (not validated at start)"]
    lines = verdicts(table)
    assert lines[0].startswith("cosearch @ 4 - cosearch @ 0 = +0.750 avg F1") and "excludes 0" in lines[0]
    assert lines[-1] == "not compared: fixed_ranker: last vs before training (not validated at start)"


def test_learning_curve_rows_give_each_methods_end_minus_start_on_all_families_and_on_multi_hop_alone():
    table = learning_curve_table(frame(), ["search_r1", "cosearch", "fixed_ranker"])
    rows = table.set_index(["method", "families"])
    assert list(rows.index) == [("search_r1", "all"), ("search_r1", "multi"), ("cosearch", "all"), ("cosearch", "multi")]
    everything = rows.loc[("cosearch", "all")]
    assert (everything["start_step"], everything["end_step"]) == (0, 4)
    assert everything["start"] == pytest.approx(0.25) and everything["end"] == pytest.approx(1.0)  # macro over 2 families
    assert everything["diff"] == pytest.approx(0.75) and everything["n_questions"] == 6
    multi = rows.loc[("search_r1", "multi")]  # syn_hotpotqa alone: [0, 1] -> [1, 0]
    assert multi["diff"] == pytest.approx(0.0) and multi["n_questions"] == 2 and multi["n_families"] == 1
    assert rows.loc[("cosearch", "multi"), "diff"] == pytest.approx(0.5)
    assert "all: fixed_ranker: last vs before training (not validated at start)" in table.attrs["skipped"]
    ranker = learning_curve_table(frame(), ["cosearch"], kind="ranker")
    assert ranker.attrs["metric"] == "hit@1" and ranker.iloc[0]["diff"] == pytest.approx(1 - 1 / 6)


def test_results_section_gives_the_learning_curves_under_their_own_heading():
    table = learning_curve_table(frame(), ["search_r1", "cosearch"])
    text = "\n".join(_learning_curves({"learning_curves": {"agent": table.round(METRIC_DIGITS).to_dict(orient="records"), "ranker": []}}))
    assert "#### Learning curve (agent)" in text and "Learning curve (ranker)" not in text
    assert "| search_r1 | multi | 0 | 4 | 0.500 | 0.500 | 0.000 |" in text and "| cosearch | all | 0 | 4 | 0.250 | 1.000 | 0.750 |" in text


def test_ranker_comparisons_use_the_plain_mean_and_missing_kinds_raise():
    table = validation_comparisons(frame(), ["cosearch"], kind="ranker")
    assert table.attrs["statistic"] == "mean" and table.attrs["metric"] == "hit@1"
    assert table.iloc[0]["diff"] == pytest.approx(1 - 1 / 6)
    assert "mean hit@1" in verdicts(table)[0] and "6 sub-queries" in verdicts(table)[0]
    with pytest.raises(ValueError, match="no 'ranker' validation rows"):
        validation_comparisons(pd.DataFrame(agent_rows("cosearch", 1, START)), ["cosearch"], kind="ranker")


def test_validation_figure_draws_one_errorbar_line_per_method_and_says_when_empty():
    curves = {"agent": validation_curves(frame(), kind="agent"), "ranker": pd.DataFrame()}
    fig = plot_validation_curves(curves)
    agent_ax, empty_ax = fig.axes
    assert [t.get_text() for t in agent_ax.get_legend().get_texts()] == ["cosearch", "search_r1", "fixed_ranker"]
    colors = [line.get_color() for line in agent_ax.lines if line.get_marker() == "o"]
    assert colors == ["#d62728", "#7f7f7f", "#1f77b4"]  # one colour per method (METHOD_COLORS), in legend order
    xs = [np.asarray(line.get_xdata(), dtype=float) for line in agent_ax.lines if len(line.get_xdata()) > 0
          and line.get_marker() == "o"]
    assert len(xs) == 3
    # nudged apart around the true x (0 and 4) by 8% of the x range
    assert xs[0] == pytest.approx([-0.32, 3.68]) and xs[1] == pytest.approx([0, 4]) and xs[2] == pytest.approx([4.32])
    assert any(t.get_text() == "no data: no validation records" for t in empty_ax.texts)


def test_a_learning_curve_is_drawn_as_a_line_with_its_interval_band():
    from matplotlib.collections import PolyCollection

    from cosearch_lib.viz.plots import BAND_MIN_POINTS

    steps = [-1, *range(1, 10, 2)]  # validated at start and every 2 steps: a curve of 6 points
    rows = [r for k, s in enumerate(steps) for r in agent_rows("search_r1", s, {fam: [min(1.0, 0.1 * k + 0.2 * i) for i in
                                                                                      range(4)]
                                                                                for fam in ("syn_nq", "syn_hotpotqa")})]
    rows += agent_rows("cosearch", -1, START) + agent_rows("cosearch", 3, TRAINED)  # 2 points: error bars
    fig = plot_validation_curves({"agent": validation_curves(pd.DataFrame(rows))})
    ax = fig.axes[0]
    assert len(steps) >= BAND_MIN_POINTS
    curve = [line for line in ax.lines if line.get_label() == "search_r1"]
    assert len(curve) == 1 and list(curve[0].get_xdata()) == [0, 2, 4, 6, 8, 10]  # not nudged: one line, its own x
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # search_r1's band; cosearch keeps error bars
    table = validation_curves(pd.DataFrame(rows))
    low, high = ax.get_ylim()  # the y-range holds every interval, with a margin, within [-0.02, 1.02]
    assert -0.02 <= low < table["ci_low"].min() and table["ci_high"].max() < high <= 1.02
    narrow = [r for s in (-1, 3, 7) for r in agent_rows("search_r1", s, {fam: [0.1, 0.2, 0.2, 0.3] for fam in ("syn_nq", "syn_hotpotqa")})]
    low, high = plot_validation_curves({"agent": validation_curves(pd.DataFrame(narrow))}).axes[0].get_ylim()
    assert 0 < low < 0.1 and 0.3 < high < 0.5  # scores between 0.1 and 0.3 fill the panel, not its bottom third
    top = bands[0].get_paths()[0].vertices[:, 1].max()
    assert top <= 1.0 and top > float(curve[0].get_ydata().max())  # the band reaches above the estimates


def test_results_section_lists_the_validation_comparisons():
    table = validation_comparisons(frame(), ["cosearch", "search_r1"], kind="agent")
    lines = _validation_comparisons({"validation_comparisons": {"agent": table.round(METRIC_DIGITS).to_dict(orient="records"),
                                                                "ranker": []}})
    text = "\n".join(lines)
    assert "Validation (agent)" in text and "| cosearch @ 4 | cosearch @ 0 |" in text and "Validation (ranker)" not in text


def steps_frame() -> pd.DataFrame:
    rows = [{"method": "cosearch", "step": -1, "val/f1": 0.2}]
    rows += [{"method": "cosearch", "step": s, "rollout/agent_reward": r, "rollout/searches_per_traj": n, "time/step_s": 100.0 + s}
             for s, (r, n) in enumerate([(0.1, 1.0), (0.2, 1.0), (0.3, 2.0), (0.5, 2.0), (0.6, 3.0), (0.7, 3.0)])]
    return pd.DataFrame(rows)


def test_training_summary_reads_the_records_and_names_what_shows_a_difference():
    val = {"agent": validation_comparisons(frame(), ["cosearch", "search_r1", "fixed_ranker"], kind="agent")}
    lines = training_summary(steps_frame(), None, val)
    # first and last third (2 of 6 steps) of the training signal; the step -1 row is not a step
    assert lines[0] == ("cosearch: 6 GRPO steps, 102 s per step; agent reward 0.150 (first 2) -> 0.650 (last 2), "
                        "searches per trajectory 1.00 -> 3.00")
    assert lines[1].startswith("validation (agent): cosearch @ 4 - cosearch @ 0 = +0.750")
    assert "validation (agent): not compared: fixed_ranker: last vs before training" in lines[-2]
    assert lines[-1].startswith("A difference is shown by: cosearch @ 4 vs cosearch @ 0 (validation (agent))")


def test_training_summary_says_when_no_interval_excludes_zero():
    flat = pd.DataFrame(agent_rows("cosearch", -1, HALF) + agent_rows("cosearch", 3, HALF))
    lines = training_summary(steps_frame(), None, {"agent": validation_comparisons(flat, ["cosearch"])})
    assert "includes 0" in lines[1] and lines[-1].startswith("No comparison shows a difference")
    assert training_summary(steps_frame())[-1].startswith("cosearch: 6 GRPO steps")  # no comparisons: no verdict line


def test_grpo_signal_table_averages_the_first_and_last_steps_and_goes_under_the_learning_curves():
    from cosearch_lib.records.training_runs import grpo_signal_table

    steps = pd.DataFrame([{"step": -1, "method": "cosearch", "val/f1": 0.2}]  # the validation-at-start row is no step
                         + [{"step": s, "method": "cosearch", "rollout/agent_f1": 0.1 * s, "rollout/agent_best_of_g_f1": 0.2 + 0.1 * s,
                             "rollout/agent_groups_without_signal": 0.5, "rollout/searches_per_traj": 2.0 - 0.1 * s,
                             "ranker/grouping_n_groups_post": 10 + s} for s in range(6)]
                         + [{"step": s, "method": "search_r1", "rollout/agent_f1": 0.3, "rollout/agent_best_of_g_f1": 0.5,
                             "rollout/agent_groups_without_signal": 0.25, "rollout/searches_per_traj": 1.0,
                             "ranker/grouping_n_groups_post": 6} for s in range(3)])  # grouped for the diagnostics only
    table = grpo_signal_table(steps, ["search_r1", "cosearch"], span=2)
    rows = {(r["method"], r["part"]): r for r in table.to_dict(orient="records")}
    assert list(table["method"]) == ["search_r1"] * 3 + ["cosearch"] * 3
    first, last, every = rows["cosearch", "first"], rows["cosearch", "last"], rows["cosearch", "all"]
    assert (first["steps"], last["steps"], every["steps"]) == ("0-1", "4-5", "0-5")
    assert first["rollout/agent_f1"] == pytest.approx(0.05) and last["rollout/agent_best_of_g_f1"] == pytest.approx(0.65)
    assert every["ranker/grouping_n_groups_post"] == pytest.approx(12.5) and last["rollout/searches_per_traj"] == pytest.approx(1.55)
    assert math.isnan(rows["search_r1", "all"]["ranker/grouping_n_groups_post"])  # no ranker trained: no groups
    curve = learning_curve_table(frame(), ["search_r1", "cosearch"])
    text = "\n".join(_learning_curves({"learning_curves": {"agent": curve.round(METRIC_DIGITS).to_dict(orient="records")},
                                       "grpo_signal": table.to_dict(orient="records")}))
    assert "| cosearch | last | 4-5 | 0.450 | 0.650 | 0.500 | 1.550 | 14.500 |" in text
    assert text.index("Learning curve (agent)") < text.index("What GRPO had to work with")


def test_three_validations_of_two_methods_are_bands_and_of_four_methods_error_bars():
    from matplotlib.collections import PolyCollection

    def rows(methods):
        return [r for m in methods for k, s in enumerate((-1, 3, 7))
                for r in agent_rows(m, s, {fam: [min(1.0, 0.1 * k + 0.2 * i) for i in range(4)]
                                           for fam in ("syn_nq", "syn_hotpotqa")})]

    def bands(methods):
        ax = plot_validation_curves({"agent": validation_curves(pd.DataFrame(rows(methods)))}).axes[0]
        return [c for c in ax.collections if isinstance(c, PolyCollection)]

    assert len(bands(["search_r1", "cosearch"])) == 2  # the learning-curve figure: Retrieval Only beside CoSearch
    assert bands(["search_r1", "fixed_ranker", "cosearch", "oracle"]) == []  # four bands would cover each other
