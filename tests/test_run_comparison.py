"""The paper's findings among methods trained in different runs (records.run_comparison): each method
from the run that trained it longest, paired on the same test questions; runs that cannot be paired refused."""

from __future__ import annotations

import pandas as pd
import pytest

from cosearch_lib.records.run_comparison import findings_across_runs, runs_eval_records

FAMILIES = ["syn_nq", "syn_hotpotqa"]


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def evaluated(folder, policies: dict[str, list[float]], text: str = "Q") -> None:
    """Notebook 03's records of a run: 4 test questions per family, one F1 per question."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"method": policy, "dataset": fam, "question_id": f"test_{j * 4 + i}", "question": f"{text} {j * 4 + i}",
             "sample": 0, "f1": f1s[j * 4 + i], "golds": ["x"], "prediction": None, "error": None}
            for policy, f1s in policies.items() for j, fam in enumerate(FAMILIES) for i in range(4)]
    pd.DataFrame(rows).to_parquet(folder / "03_eval_records.parquet")


def trained(folder, method: str, steps: int, questions: int, group: int) -> None:
    (folder / "training" / method).mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"step": -1, "method": method}] +  # the validation before the first update is no step
                 [{"step": s, "method": method, "rollout/n_questions": questions, "rollout/n_trajectories": questions * group}
                  for s in range(steps)]).to_csv(folder / "training" / method / "steps.csv", index=False)


def test_each_method_comes_from_its_longest_training_and_pairs_over_the_same_questions(runs):
    good, half, low = [1.0] * 8, [1.0, 0.0] * 4, [0.0] * 8
    # "laptop_curve_wide" trained Retrieval Only and CoSearch long; "laptop" all four, short (the same warm start)
    wide, short = "laptop_curve_wide", "laptop"
    evaluated(runs / wide, {"search_r1: warm start": low, "search_r1: after GRPO": half, "cosearch: after GRPO": good})
    for m in ("search_r1", "cosearch"):
        trained(runs / wide, m, steps=8, questions=24, group=8)
    evaluated(runs / short, {"search_r1: after GRPO": low, "fixed_ranker: after GRPO": half,
                             "cosearch: after GRPO": low, "oracle: after GRPO": good})
    for m in ("search_r1", "fixed_ranker", "cosearch", "oracle"):
        trained(runs / short, m, steps=4, questions=4, group=4)
    records, budgets = runs_eval_records([short, wide])
    assert f"search_r1 @ {wide}" in set(records["method"]) and not records["method"].str.contains("warm start").any()
    assert budgets.set_index("label").loc[f"cosearch @ {wide}", "trajectories"] == 8 * 24 * 8
    table = findings_across_runs([short, wide]).set_index(["a", "b"])
    assert list(table.index) == [(f"oracle @ {short}", f"search_r1 @ {wide}"), (f"fixed_ranker @ {short}", f"search_r1 @ {wide}"),
                                 (f"cosearch @ {wide}", f"fixed_ranker @ {short}"), (f"cosearch @ {wide}", f"search_r1 @ {wide}")]
    assert table.loc[(f"cosearch @ {wide}", f"search_r1 @ {wide}"), "diff"] == pytest.approx(0.5)
    assert table.loc[(f"fixed_ranker @ {short}", f"search_r1 @ {wide}"), "diff"] == pytest.approx(0.0)
    assert (table["n_questions"] == 8).all()
    assert table.loc[(f"cosearch @ {wide}", f"fixed_ranker @ {short}"), "trained_a"] == f"8 steps, 1536 trajectories ({wide})"
    assert table.loc[(f"cosearch @ {wide}", f"fixed_ranker @ {short}"), "trained_b"] == f"4 steps, 64 trajectories ({short})"
    # demo's policies start from another warm start (one epoch): not a difference of training alone
    evaluated(runs / "demo", {"search_r1: after GRPO": low})
    with pytest.raises(ValueError, match="other settings .*the warm start"):
        runs_eval_records([short, "demo"])


def test_a_wider_candidate_list_pairs_with_retrieval_only_at_any_n_but_not_with_a_ranker_at_another_n(runs):
    """``laptop_n20`` ranks 20 candidates from laptop's starts (``warmstart.topn: 10``): its Fixed Ranker pairs with
    a Retrieval Only trained at N = 10 (which reads the retriever's top K whatever N is), while CoSearch taken from
    a run at N = 10 is not set against it: that pair would differ by N, not by training."""
    evaluated(runs / "laptop_curve_wide", {"search_r1: after GRPO": [0.5] * 8, "cosearch: after GRPO": [1.0] * 8})
    for m in ("search_r1", "cosearch"):
        trained(runs / "laptop_curve_wide", m, steps=8, questions=24, group=8)
    evaluated(runs / "laptop_n20", {"fixed_ranker: after GRPO": [0.75] * 8})
    trained(runs / "laptop_n20", "fixed_ranker", steps=4, questions=4, group=4)
    table = findings_across_runs(["laptop_n20", "laptop_curve_wide"])
    assert list(zip(table["a"], table["b"])) == [("fixed_ranker @ laptop_n20", "search_r1 @ laptop_curve_wide"),
                                                 ("cosearch @ laptop_curve_wide", "search_r1 @ laptop_curve_wide")]
    assert table.set_index("a").loc["fixed_ranker @ laptop_n20", "diff"] == pytest.approx(0.25)
    skipped = table.attrs["skipped"]
    assert skipped[0] == "the oracle gap" and skipped[1].startswith("CoSearch - Fixed Ranker (cosearch @ laptop_curve_wide and "
                                                                   "fixed_ranker @ laptop_n20 were ranked under other settings")
    assert "search.topn 10 and 20" in skipped[1] and "warm start" not in skipped[1]
    # once laptop_n20 has its own CoSearch, CoSearch - Fixed Ranker pairs the two at N = 20, though the longest
    # CoSearch (N = 10) still serves the finding against Retrieval Only
    evaluated(runs / "laptop_n20", {"fixed_ranker: after GRPO": [0.75] * 8, "cosearch: after GRPO": [0.5] * 8})
    trained(runs / "laptop_n20", "cosearch", steps=4, questions=4, group=4)
    table = findings_across_runs(["laptop_n20", "laptop_curve_wide"])
    assert list(zip(table["a"], table["b"])) == [("fixed_ranker @ laptop_n20", "search_r1 @ laptop_curve_wide"),
                                                 ("cosearch @ laptop_n20", "fixed_ranker @ laptop_n20"),
                                                 ("cosearch @ laptop_curve_wide", "search_r1 @ laptop_curve_wide")]
    assert table.attrs["skipped"] == ["the oracle gap"]
    assert table.set_index("a").loc["cosearch @ laptop_n20", "diff"] == pytest.approx(-0.25)


def test_a_finding_without_its_methods_is_named_not_made_up(runs):
    evaluated(runs / "ci", {"search_r1: after GRPO": [0.5] * 8, "cosearch: after GRPO": [1.0] * 8})
    table = findings_across_runs(["ci"])
    assert list(zip(table["a"], table["b"])) == [("cosearch @ ci", "search_r1 @ ci")]
    assert table.attrs["skipped"] == ["the oracle gap", "Fixed Ranker - Retrieval Only", "CoSearch - Fixed Ranker"]


def test_runs_that_cannot_be_paired_are_refused(runs, tmp_path):
    evaluated(runs / "laptop", {"search_r1: after GRPO": [0.5] * 8})  # the same models, N, K, cap and warm start
    evaluated(runs / "laptop_curve_wide", {"oracle: after GRPO": [1.0] * 8}, text="another world's question")
    with pytest.raises(ValueError, match="evaluated different test questions"):
        runs_eval_records(["laptop", "laptop_curve_wide"])
    evaluated(runs / "laptop_seed1", {"oracle: after GRPO": [1.0] * 8})
    with pytest.raises(ValueError, match="different seeds"):
        runs_eval_records(["laptop", "laptop_seed1"])
    evaluated(runs / "laptop_curve_wide", {"search_r1: warm start": [0.5] * 8})  # no trained policy evaluated there: not a run to pair
    assert set(runs_eval_records(["laptop", "laptop_curve_wide"])[0]["profile"]) == {"laptop"}
    evaluated(runs / "ci", {"oracle: after GRPO": [1.0] * 8})  # the same questions; K = 3 and 2 searches where laptop has 2 and 4
    with pytest.raises(ValueError, match="other settings .*search.topk"):
        runs_eval_records(["laptop", "ci"])
    with pytest.raises(FileNotFoundError, match="evaluate_policies=true"):
        runs_eval_records(["laptop_curve"])


def test_results_md_shows_the_findings_across_runs_with_what_each_side_trained(runs):
    from cosearch_lib.records.docs import RESULT_SECTIONS

    evaluated(runs / "ci", {"search_r1: after GRPO": [0.5] * 8, "cosearch: after GRPO": [1.0] * 8})
    trained(runs / "ci", "cosearch", steps=8, questions=24, group=8)
    table = findings_across_runs(["ci"])
    metrics = {"profiles": ["ci"], "compare_runs": ["ci"], "methods": ["cosearch"], "findings_across_runs": table.round(4).to_dict(orient="records"),
               "findings_skipped": table.attrs["skipped"]}
    text = "\n".join(RESULT_SECTIONS["05_figures"][1](metrics))
    assert "#### The paper's findings across runs" in text and "not available: the oracle gap" in text
    assert "| cosearch @ ci | search_r1 @ ci | 1.000 | 0.500 | 0.500 |" in text
    assert "8 steps, 1536 trajectories (ci) | no step records (ci) |" in text  # search_r1's training: not here


def test_notebook_05_compares_runs_that_trained_the_same_methods_and_says_why_it_cannot(runs):
    """The curves refuse a method trained under two of their profiles (``with_runs``); the findings are
    read from other runs (``compare_runs``), where the same methods trained at two budgets is the point."""
    from cosearch_lib.report import training_metrics

    wide, short = "laptop_curve_wide", "laptop"
    evaluated(runs / wide, {"search_r1: after GRPO": [0.5] * 8, "cosearch: after GRPO": [1.0] * 8})
    evaluated(runs / short, {m + ": after GRPO": [0.5] * 8 for m in ("search_r1", "fixed_ranker", "cosearch", "oracle")})
    for profile, steps in ((wide, 8), (short, 2)):
        for m in ("search_r1", "cosearch"):
            trained(runs / profile, m, steps=steps, questions=4, group=4)
    m = training_metrics(wide, compare_runs=[short])
    assert m["compare_runs"] == [wide, short] and "learning_curves" not in m  # no validation records here
    assert [(r["a"], r["b"]) for r in m["findings_across_runs"]][-1] == (f"cosearch @ {wide}", f"search_r1 @ {wide}")
    evaluated(runs / "ci", {"oracle: after GRPO": [1.0] * 8})
    m = training_metrics(wide, compare_runs=["ci"])
    assert "findings_across_runs" not in m and "other settings" in m["findings_missing"]
    assert training_metrics(wide) is None  # neither curves nor runs to compare
