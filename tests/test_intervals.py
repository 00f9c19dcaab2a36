"""Paired bootstrap intervals (eval.intervals) and the tables, sentences and figure built on them:
exact cases (no shift, a constant shift, per-family constants), hand-checked macro and plain means,
stratification, determinism, refusals, the verdict's wording, and the notebooks' helpers."""

from __future__ import annotations

import json
import math
import time

import matplotlib
import numpy as np
import pandas as pd
import pytest

from cosearch_lib.eval.intervals import (
    MIN_PER_FAMILY,
    _index_matrix,
    _layout,
    bootstrap_interval,
    compare_methods,
    method_interval,
    paired_bootstrap,
    question_scores,
    sample_problem,
    verdict,
    verdicts,
)
from cosearch_lib.eval.paper_reference import oracle_gap_beside_paper
from cosearch_lib.eval.tables import (
    COMPARISON_COLUMNS,
    comparison_table,
    oracle_gap_intervals,
    oracle_gap_table,
    summary_table,
)
from cosearch_lib.experiment import before_after_pairs
from cosearch_lib.records.docs import render_results_page
from cosearch_lib.run_schema import METRIC_DIGITS
from cosearch_lib.viz.plots import plot_oracle_gap

matplotlib.use("Agg")

FAMILIES = ["syn_nq", "syn_popqa", "syn_hotpotqa", "syn_musique"]


def synthetic(n_per_family=(30, 10, 20, 5), shifts=None, seed=0) -> pd.DataFrame:
    """Records of methods on the same questions: a common per-question difficulty plus per-method noise."""
    gen = np.random.default_rng(seed)
    shifts = shifts or {"agent_retrieval": 0.0, "agent_oracle": 0.1}
    rows = []
    for family, n in zip(FAMILIES, n_per_family):
        for q in range(n):
            base = gen.random()
            for method, shift in shifts.items():
                f1 = float(np.clip(base + shift + gen.normal(0, 0.1), 0, 1))
                rows.append({"method": method, "dataset": family, "question_id": f"{family}-{q}", "sample": 0, "f1": f1})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- exact cases


def test_identical_methods_give_a_zero_difference_and_a_zero_interval():
    scores = np.random.default_rng(1).random(40)
    families = np.repeat(FAMILIES, 10)
    for statistic in ("macro", "mean"):
        res = paired_bootstrap(scores, scores.copy(), families, statistic=statistic)
        assert res.diff == 0.0 and (res.ci_low, res.ci_high) == (0.0, 0.0)
        assert res.p_le_0 == 1.0 and not res.excludes_zero()
        assert res.n_questions == 40 and res.n_families == 4 and res.note is None


@pytest.mark.parametrize("shift", [0.125, -0.3])
def test_a_constant_shift_is_the_difference_and_the_whole_interval(shift):
    b = np.random.default_rng(2).random(50)
    families = np.repeat(FAMILIES[:2], [20, 30])
    res = paired_bootstrap(b + shift, b, families)
    assert res.diff == pytest.approx(shift, abs=1e-12)
    assert res.ci_low == pytest.approx(shift, abs=1e-12) and res.ci_high == pytest.approx(shift, abs=1e-12)
    assert res.p_le_0 == (1.0 if shift < 0 else 0.0)
    assert res.excludes_zero()
    # the single-method estimates are the method's own macro means, not the shift
    assert res.estimate_b == pytest.approx((b[:20].mean() + b[20:].mean()) / 2)


def test_stratified_resamples_keep_every_familys_question_count():
    families = np.array(["b"] * 3 + ["a"] * 5 + ["c"] * 2)
    layout = _layout(families, "macro", stratify=True)
    idx = _index_matrix(layout, 500, seed=3)
    sorted_families = families[layout.order]
    assert idx.shape == (500, 10)
    assert (sorted_families[idx] == sorted_families).all()  # column j always draws from its own family
    counts = {f: (sorted_families[idx] == f).sum(axis=1) for f in "abc"}
    assert all((counts[f] == (families == f).sum()).all() for f in "abc")
    assert len(np.unique(idx[:, 0])) > 1  # and they do resample


def test_stratification_removes_the_spread_between_families():
    # every question of a family scores the family's constant: a stratified resample always has
    # 3 ones out of 8, whatever it draws; an unstratified one does not
    scores = np.array([1.0] * 3 + [0.0] * 5)
    families = ["x"] * 3 + ["y"] * 5
    strat = bootstrap_interval(scores, families, statistic="mean")
    assert [strat.estimate, strat.ci_low, strat.ci_high] == pytest.approx([3 / 8] * 3, abs=1e-12)
    free = bootstrap_interval(scores, families, statistic="mean", stratify=False)
    assert free.estimate == pytest.approx(3 / 8) and free.ci_low < 3 / 8 < free.ci_high
    with pytest.raises(ValueError, match="stratified"):
        bootstrap_interval(scores, families, statistic="macro", stratify=False)


def test_macro_and_plain_mean_differ_on_unequal_families_hand_checked():
    rows = [("nq", "n1", 1.0), ("nq", "n2", 0.0), ("nq", "n3", 0.0), ("nq", "n4", 0.0),
            ("hotpotqa", "h1", 1.0), ("hotpotqa", "h2", 1.0)]
    records = pd.DataFrame([{"method": m, "dataset": d, "question_id": q, "sample": 0, "f1": f if m == "a" else 0.0}
                            for m in ("a", "b") for d, q, f in rows])
    macro = compare_methods(records, "a", "b", statistic="macro")
    plain = compare_methods(records, "a", "b", statistic="mean")
    assert macro.estimate_a == pytest.approx((0.25 + 1.0) / 2)  # families weigh the same
    assert plain.estimate_a == pytest.approx(3 / 6)  # questions weigh the same
    assert macro.diff == pytest.approx(0.625) and plain.diff == pytest.approx(0.5)
    assert macro.estimate_a == pytest.approx(summary_table(records).loc["a", "avg"])  # the paper's avg
    # hotpotqa is all ones: its mean never moves, so the macro interval is 0.5 + nq's spread / 2
    assert 0.5 <= macro.ci_low < macro.ci_high <= 1.0


def test_a_questions_samples_are_averaged_before_resampling():
    records = pd.DataFrame({"method": ["a"] * 4 + ["b"] * 2, "dataset": ["nq"] * 6,
                            "question_id": ["q1", "q1", "q2", "q2", "q1", "q2"], "sample": [0, 1, 0, 1, 0, 0],
                            "f1": [1.0, 0.0, 1.0, 1.0, 0.5, 1.0]})
    scores = question_scores(records, "a")
    assert scores.tolist() == [0.5, 1.0] and list(scores.index) == [("nq", "q1"), ("nq", "q2")]
    res = compare_methods(records, "a", "b")
    assert res.n_questions == 2 and res.diff == 0.0 and (res.ci_low, res.ci_high) == (0.0, 0.0)


# --------------------------------------------------------------------------- randomness


def test_same_seed_same_interval_other_seed_other_draws():
    records = synthetic()
    one = compare_methods(records, "agent_oracle", "agent_retrieval", seed=7)
    assert compare_methods(records, "agent_oracle", "agent_retrieval", seed=7) == one
    other = compare_methods(records, "agent_oracle", "agent_retrieval", seed=8)
    assert other.diff == one.diff and (other.ci_low, other.ci_high) != (one.ci_low, one.ci_high)


def test_interval_width_matches_the_normal_approximation_of_a_mean():
    scores = np.random.default_rng(4).random(400)
    res = bootstrap_interval(scores, ["nq"] * 400, statistic="mean", n_resamples=4000)
    half = 1.96 * scores.std(ddof=1) / math.sqrt(400)
    assert (res.ci_high - res.ci_low) / 2 == pytest.approx(half, rel=0.1)
    assert res.ci_low < res.estimate < res.ci_high


def test_a_larger_level_gives_a_wider_interval_and_the_shift_is_found():
    records = synthetic()
    narrow = compare_methods(records, "agent_oracle", "agent_retrieval", level=0.8)
    wide = compare_methods(records, "agent_oracle", "agent_retrieval", level=0.99)
    assert wide.ci_low < narrow.ci_low < narrow.diff < narrow.ci_high < wide.ci_high
    assert 0 < wide.ci_low and wide.p_le_0 == 0.0  # +0.1 on every question, 65 questions


def test_two_thousand_resamples_of_seven_hundred_questions_are_fast():
    gen = np.random.default_rng(5)
    a, b = gen.random(700), gen.random(700)
    families = np.repeat([f"f{i}" for i in range(7)], 100)
    start = time.perf_counter()
    res = paired_bootstrap(a, b, families, n_resamples=2000)
    assert time.perf_counter() - start < 3.0  # vectorised: ~0.1 s; a Python loop over resamples takes far longer
    assert res.n_questions == 700 and res.ci_low < res.diff < res.ci_high


# --------------------------------------------------------------------------- refusals


def test_methods_on_different_questions_cannot_be_paired():
    records = synthetic()
    fewer = records[~((records["method"] == "agent_oracle") & (records["question_id"] == "syn_nq-3"))]
    with pytest.raises(ValueError, match=r"same questions.*1 only in 'agent_retrieval' \(syn_nq/syn_nq-3\)"):
        compare_methods(fewer, "agent_oracle", "agent_retrieval")
    with pytest.raises(ValueError, match="no records for method 'cosearch'"):
        compare_methods(records, "cosearch", "agent_retrieval")
    with pytest.raises(ValueError, match="shape"):
        paired_bootstrap([0.1, 0.2, 0.3], [0.1, 0.2], ["nq"] * 3)


def test_too_few_questions_refuse_or_leave_a_note():
    with pytest.raises(ValueError, match="at least 2"):
        paired_bootstrap([1.0], [0.0], ["nq"])
    families = ["nq", "nq", "hotpotqa"]  # hotpotqa has one question: no spread to resample
    with pytest.raises(ValueError, match=f"fewer than {MIN_PER_FAMILY} questions \\(hotpotqa\\)"):
        paired_bootstrap([1.0, 0.0, 1.0], [0.0, 0.0, 0.0], families)
    noted = paired_bootstrap([1.0, 0.0, 1.0], [0.0, 0.0, 0.0], families, when_too_few="note")
    assert noted.diff == pytest.approx(0.75) and math.isnan(noted.ci_low) and math.isnan(noted.p_le_0)
    assert "hotpotqa" in noted.note and not noted.excludes_zero()
    # without stratification three questions are enough
    assert sample_problem(["nq", "nq", "hotpotqa"]) and paired_bootstrap(
        [1.0, 0.0, 1.0], [0.0, 0.0, 0.0], families, statistic="mean", stratify=False).note is None
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap([1.0, float("nan")], [0.0, 0.0], ["nq", "nq"])
    with pytest.raises(ValueError, match="level"):
        paired_bootstrap([1.0, 0.0], [0.0, 0.0], ["nq", "nq"], level=95)


# --------------------------------------------------------------------------- sentences


def _row(low, high, diff=0.05):
    return {"a": "agent_oracle", "b": "agent_retrieval", "diff": diff, "ci_low": low, "ci_high": high,
            "n_questions": 140}


def test_the_verdict_says_excludes_0_only_when_the_interval_excludes_it():
    above = verdict(_row(0.02, 0.125, 0.071))
    assert above == ("agent_oracle - agent_retrieval = +0.071 avg F1 (95% CI +0.020 to +0.125, 140 questions): "
                     "the interval excludes 0, agent_oracle scores higher")
    below = verdict(_row(-0.1, -0.02, -0.06), level=0.9)
    assert "90% CI -0.100 to -0.020" in below and below.endswith("excludes 0, agent_retrieval scores higher")
    for low, high in ((-0.01, 0.1), (0.0, 0.1), (-0.1, 0.0), (0.0, 0.0)):
        text = verdict(_row(low, high))
        assert "excludes" not in text and text.endswith("includes 0: no difference shown at this sample size")
    missing = verdict({**_row(float("nan"), float("nan")), "note": "1 of 7 families ..."}, statistic="mean")
    assert "mean F1" in missing and missing.endswith("no interval, 1 of 7 families ...")


def test_verdicts_read_the_tables_settings_and_list_skipped_pairs():
    records = synthetic(shifts={"agent_retrieval": 0.0, "agent_oracle": 0.1, "agent_fixed_ranker": 0.0})
    pairs = [("agent_oracle", "agent_retrieval"), ("agent_fixed_ranker", "agent_retrieval"),
             ("agent_trained_ranker", "agent_retrieval")]
    table = comparison_table(records, pairs, metric="f1", level=0.9, skip_missing=True)
    lines = verdicts(table)
    assert len(lines) == 3 and "90% CI" in lines[0] and "excludes 0, agent_oracle scores higher" in lines[0]
    assert lines[2] == "not compared: agent_trained_ranker vs agent_retrieval (no records for agent_trained_ranker)"
    gap_lines = verdicts(oracle_gap_intervals(records))
    assert [line.split(":")[0] for line in gap_lines] == ["single-hop avg", "multi-hop avg", "avg"]
    assert all("agent_oracle - agent_retrieval" in line for line in gap_lines)


# --------------------------------------------------------------------------- tables, figure, helpers


def test_comparison_table_rows_match_compare_methods():
    records = synthetic(shifts={"agent_retrieval": 0.0, "agent_oracle": 0.1, "agent_fixed_ranker": 0.02})
    pairs = [("agent_oracle", "agent_retrieval"), ("agent_fixed_ranker", "agent_retrieval")]
    table = comparison_table(records, pairs, seed=3)
    assert list(table.columns) == list(COMPARISON_COLUMNS) and len(table) == 2
    for (_, row), (a, b) in zip(table.iterrows(), pairs):
        res = compare_methods(records, a, b, seed=3)
        assert (row["a"], row["b"]) == (a, b)
        assert [row[c] for c in ("mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_le_0")] == \
            [res.estimate_a, res.estimate_b, res.diff, res.ci_low, res.ci_high, res.p_le_0]
        assert row["n_questions"] == 65 and row["n_families"] == 4 and row["note"] is None
    assert table.attrs["statistic"] == "macro" and table.attrs["n_resamples"] == 2000 and table.attrs["skipped"] == []
    with pytest.raises(ValueError, match="agent_trained_ranker"):
        comparison_table(records, [("agent_trained_ranker", "agent_retrieval")])
    empty = comparison_table(records.iloc[:0], pairs, skip_missing=True)
    assert empty.empty and len(empty.attrs["skipped"]) == 2


def test_one_question_per_family_gives_estimates_and_a_note_not_an_interval():
    records = synthetic(n_per_family=(1, 1, 1, 1))
    row = comparison_table(records, [("agent_oracle", "agent_retrieval")]).iloc[0]
    assert row["diff"] == pytest.approx(oracle_gap_table(records).loc["oracle", "avg"]
                                        - oracle_gap_table(records).loc["standard", "avg"])
    assert math.isnan(row["ci_low"]) and "4 of 4 families" in row["note"]
    assert "no interval" in verdicts(comparison_table(records, [("agent_oracle", "agent_retrieval")]))[0]


def test_oracle_gap_intervals_agree_with_the_gap_table_and_the_comparison():
    records = synthetic()
    gap, ci = oracle_gap_table(records), oracle_gap_intervals(records, seed=2)
    assert list(ci.index) == ["single-hop avg", "multi-hop avg", "avg"]
    for setting in ("standard", "oracle"):
        assert ci[setting].tolist() == pytest.approx(gap.loc[setting].tolist())
        assert (ci[f"{setting}_ci_low"] < ci[setting]).all() and (ci[setting] < ci[f"{setting}_ci_high"]).all()
    assert ci["diff"].tolist() == pytest.approx((gap.loc["oracle"] - gap.loc["standard"]).tolist())
    pair = compare_methods(records, "agent_oracle", "agent_retrieval", seed=2)
    assert (ci.loc["avg", "ci_low"], ci.loc["avg", "ci_high"]) == (pair.ci_low, pair.ci_high)
    single = compare_methods(records[records["dataset"].isin(["syn_nq", "syn_popqa"])], "agent_oracle",
                             "agent_retrieval", seed=2)
    assert ci.loc["single-hop avg", "ci_low"] == single.ci_low and ci.loc["single-hop avg", "n_questions"] == 40
    assert ci.loc["avg", "standard_ci_low"] == method_interval(records, "agent_retrieval", seed=2).ci_low
    only_single = oracle_gap_intervals(records[records["dataset"] == "syn_nq"])
    assert only_single.loc["multi-hop avg", "note"] == "no multi-hop questions"
    assert math.isnan(only_single.loc["multi-hop avg", "diff"]) and only_single.loc["avg", "n_questions"] == 30


def test_oracle_gap_figure_draws_our_intervals_and_keeps_the_paper_panels_plain():
    records = synthetic()
    beside = oracle_gap_beside_paper(oracle_gap_table(records), "ours")
    ci = oracle_gap_intervals(records)
    fig = plot_oracle_gap(beside, intervals={"ours": ci})
    ours, paper = fig.axes[0], fig.axes[1]
    bars = ours.containers[2:]  # two bar containers, then one error-bar container per setting
    assert len(bars) == 2
    segments = np.concatenate([c.lines[2][0].get_segments() for c in bars])  # (low, high) per bar
    lows, highs = sorted(s[0][1] for s in segments), sorted(s[1][1] for s in segments)
    assert lows == pytest.approx(sorted([*ci["standard_ci_low"], *ci["oracle_ci_low"]]))
    assert highs == pytest.approx(sorted([*ci["standard_ci_high"], *ci["oracle_ci_high"]]))
    texts = [t.get_text() for t in ours.texts]
    assert f"Δ {ci.loc['avg', 'diff']:+.3f}" in texts[2] and f"{ci.loc['avg', 'ci_low']:+.3f}" in texts[2]
    assert len(paper.containers) == 2 and all("Δ" not in t.get_text() for t in paper.texts)
    with pytest.raises(ValueError, match="unknown source"):
        plot_oracle_gap(beside, intervals={"theirs": ci})


def test_before_after_pairs_name_the_records_of_evaluate_before_after():
    assert before_after_pairs(["search_r1", "cosearch", "oracle"]) == [
        ("search_r1: after GRPO", "search_r1: warm start"), ("cosearch: after GRPO", "cosearch: warm start"),
        ("oracle: after GRPO", "oracle: warm start"), ("oracle: after GRPO", "search_r1: after GRPO"),
        ("cosearch: after GRPO", "search_r1: after GRPO")]
    four = before_after_pairs(["search_r1", "fixed_ranker", "cosearch", "oracle"])[4:]
    assert four == [("oracle: after GRPO", "search_r1: after GRPO"), ("fixed_ranker: after GRPO", "search_r1: after GRPO"),
                    ("cosearch: after GRPO", "fixed_ranker: after GRPO"), ("cosearch: after GRPO", "search_r1: after GRPO")]
    assert before_after_pairs(["fixed_ranker"], labels=("before", "after")) == [("fixed_ranker: after", "fixed_ranker: before")]


def test_results_page_shows_comparisons_when_a_run_recorded_them(tmp_path):
    records = synthetic()
    table = comparison_table(records, [("agent_oracle", "agent_retrieval")])
    metrics = {"eval_config": {}, "n_records": len(records), "f1": {}, "oracle_gap": {}, "turns": {},
               "comparisons": table.round(METRIC_DIGITS).to_dict(orient="records")}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "02_oracle_gap_study.metrics.json").write_text(json.dumps(metrics))
    page = render_results_page(tmp_path)
    assert "Paired comparisons" in page and f"| agent_oracle | agent_retrieval | {table.loc[0, 'mean_a']:.3f}" in page
    del metrics["comparisons"]
    (tmp_path / "x" / "02_oracle_gap_study.metrics.json").write_text(json.dumps(metrics))
    assert "Paired comparisons" not in render_results_page(tmp_path)


def test_results_page_leads_with_the_findings_of_each_seed(tmp_path):
    comparisons = [{"a": "oracle: after GRPO", "b": "search_r1: after GRPO", "mean_a": 0.4, "mean_b": 0.3, "diff": 0.1,
                    "ci_low": 0.02, "ci_high": 0.18, "n_questions": 140},
                   {"a": "cosearch: after GRPO", "b": "fixed_ranker: after GRPO", "mean_a": 0.3, "mean_b": 0.31,
                    "diff": -0.01, "ci_low": -0.05, "ci_high": 0.03, "n_questions": 140}]
    f1 = {f"{m}: after GRPO": {"single-hop avg": 0.5, "multi-hop avg": 0.1, "avg": 0.27} for m in ("oracle", "cosearch")}
    for profile, seed in (("lap", 0), ("lap_seed1", 1)):
        (tmp_path / profile).mkdir()
        metrics = {"steps": 1, "first": {}, "last": {}, "warmstart": {}, "eval_f1": f1, "comparisons": comparisons,
                   "seed": seed}
        (tmp_path / profile / "03_joint_grpo_training.metrics.json").write_text(json.dumps(metrics))
    page = render_results_page(tmp_path)
    head = page[: page.index("## Profile")]
    assert head.count("| the oracle gap |") == 2 and head.count("| CoSearch - Fixed Ranker |") == 2
    assert "a > b (interval excludes 0)" in head and "no difference shown (interval includes 0)" in head
    assert "| lap_seed1 | 1 | oracle | 0.500 | 0.100 | 0.270 | 0.626 |" in head  # the paper's 7B Oracle avg beside ours
    # each row is read in words that follow its verdict, with what it cannot show either way
    assert ("- `lap`, seed 0, the oracle gap (+0.100, interval [+0.020, +0.180]). Shows: promoting answer-bearing "
            "passages makes this agent answer better") in head
    assert "- `lap_seed1`, seed 1, CoSearch - Fixed Ranker (-0.010, interval [-0.050, +0.030]). Shows: joint training and " \
           "the frozen ranker are not told apart" in head
    assert head.count("Cannot show:") == 4
    from cosearch_lib.records.findings_page import FINDINGS, READINGS
    assert {what for _, _, what in FINDINGS} == set(READINGS)


def test_results_page_lists_the_ranker_sft_probes_and_no_probe_folder_as_a_profile(tmp_path):
    probes = tmp_path / "_ranker_sft"
    probes.mkdir()
    for name, diff, low, high, minutes in (("short", 0.0, 0.0, 0.0, 14), ("long", 0.06, 0.01, 0.11, 60)):
        record = {"profile": name, "settings": {"N": 5, "candidates": "shuffled", "gold_rankings": 1200, "epochs": 1.0},
                  "sft": {"wall_s": minutes * 60, "losses": [{"step": i, "loss": 0.05} for i in range(20)]},
                  "comparisons": [{"a": "listwise SFT", "b": "retriever order", "mean_a": 0.5 + diff, "mean_b": 0.5,
                                   "diff": diff, "ci_low": low, "ci_high": high, "n_questions": 180}]}
        (probes / f"{name}.json").write_text(json.dumps(record))
    page = render_results_page(tmp_path)
    assert "## Profile `_ranker_sft`" not in page  # a folder of probe records is not a profile
    section = page[page.index("## Teaching the 135M ranker to read"):]
    short, long = (line for line in section.splitlines() if line.startswith(("| short", "| long")))
    assert section.index("| short") < section.index("| long")  # cheapest first
    assert "| 5 | shuffled | 1200 | 1 | 60 | 0.050 | 180 | 0.500 | 0.560 | 0.060 | 0.010 | 0.110 | a > b (interval excludes 0) |" in long
    assert short.endswith("| no difference shown (interval includes 0) |")


def test_results_page_gives_the_steps_each_method_completed(tmp_path):
    """Notebook 03's records say how many steps each method had completed (its last step record), not the
    step rows of every method together (``steps`` of the records before 2026-12: laptop_curve's notebook 03
    after 8 steps, once committed under docs/results/, now a fixture)."""
    from pathlib import Path

    metrics = json.loads(Path("tests/fixtures/results/laptop_curve_03_metrics_before_2026_12.json").read_text())
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "03_joint_grpo_training.metrics.json").write_text(json.dumps(metrics))
    assert metrics["steps"] == 16 and "8 GRPO step(s) per method;" in render_results_page(tmp_path)
    metrics["last"]["search_r1"]["step"] = 15
    (tmp_path / "x" / "03_joint_grpo_training.metrics.json").write_text(json.dumps(metrics))
    assert "GRPO steps per method: cosearch 8, search_r1 16;" in render_results_page(tmp_path)
