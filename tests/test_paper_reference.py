"""The transcribed paper numbers are internally consistent (catches typos in data/paper_reference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

REF = Path(__file__).resolve().parents[1] / "data" / "paper_reference"
SINGLE, MULTI = ["nq", "triviaqa", "popqa"], ["hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


#: Rows whose reported avg is not the mean of their seven numbers *in the source itself*
#: (PAPER_NOTES section 9 as given): kept as reported, flagged here and in data/paper_reference/README.md.
SOURCE_AVG_MISMATCH = {("3B", "Direct"), ("3B", "RAG"), ("3B", "Search-o1")}


def test_table2_avg_is_the_mean_of_the_seven_benchmarks():
    t2 = pd.read_csv(REF / "table2_main.csv")
    assert len(t2) == 20 and set(t2["agent"]) == {"7B", "3B"}
    ok = (t2[SINGLE + MULTI].mean(axis=1) - t2["avg"]).abs() < 0.0015
    mismatched = {(a, m) for a, m, good in zip(t2["agent"], t2["method"], ok) if not good}
    assert mismatched == SOURCE_AVG_MISMATCH


def test_table1_standard_and_oracle_rows_match_table2_group_means():
    t1 = pd.read_csv(REF / "table1_oracle_gap.csv").set_index(["agent", "setting"])
    t2 = pd.read_csv(REF / "table2_main.csv").set_index(["agent", "method"])
    for agent in ("7B", "3B"):
        oracle = t2.loc[(agent, "Oracle")]
        assert abs(oracle[SINGLE].mean() - t1.loc[(agent, "oracle"), "single_hop_avg"]) < 0.0015
        assert abs(oracle[MULTI].mean() - t1.loc[(agent, "oracle"), "multi_hop_avg"]) < 0.0015
        assert abs(oracle["avg"] - t1.loc[(agent, "oracle"), "avg"]) < 0.0015


def test_table1_relative_gains_match_the_notes():
    t1 = pd.read_csv(REF / "table1_oracle_gap.csv").set_index(["agent", "setting"])
    gain = (t1.xs("oracle", level="setting") / t1.xs("standard", level="setting") - 1) * 100
    np.testing.assert_allclose(gain.loc["7B"].to_numpy(), [18.2, 11.5, 14.7], atol=0.1)
    np.testing.assert_allclose(gain.loc["3B"].to_numpy(), [19.8, 34.5, 26.8], atol=0.1)


def test_table7_rows_are_distributions_with_the_stated_means():
    t7 = pd.read_csv(REF / "table7_search_turns.csv").set_index("method")
    pct = t7[[f"t{i}" for i in range(7)]]
    np.testing.assert_allclose(pct.sum(axis=1), 100.0, atol=0.15)
    np.testing.assert_allclose((pct.to_numpy() @ np.arange(7)) / 100, t7["mean"], atol=0.011)


def test_table3_and_4_shapes():
    t3 = pd.read_csv(REF / "table3_ablations.csv")
    assert t3.loc[t3["variant"] == "full", "avg"].item() == t3["avg"].max()
    t4 = pd.read_csv(REF / "table4_topk.csv")
    assert list(t4["k"]) == [1, 3, 5, 10] and (t4["Oracle"] > t4["CoSearch"]).all()
