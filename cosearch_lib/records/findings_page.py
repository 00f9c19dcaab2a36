"""The findings of RESULTS.md, across seeds: each trained method's paired comparisons from the
profiles' notebook 03 records, read in words whichever way they come out (``READINGS``), the Table 2
analogue beside the paper's 7B row, the hop-level ceiling with the questions each difference needs,
and the rankers' held-out Hit@1 per validation. ``records.docs`` puts the page together."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.config.methods import PAPER_FINDINGS
from cosearch_lib.eval.paper_reference import paper_table
from cosearch_lib.eval.tables import AVG_COLUMNS
from cosearch_lib.records.markdown_tables import markdown_table
from cosearch_lib.run_schema import current_step_record

#: The paper's findings among trained methods (experiment.before_after_pairs), as (a, b, what it measures).
FINDINGS = PAPER_FINDINGS
#: The paper's Table 2 rows of the trained methods (its 7B agent), by our method name.
PAPER_ROWS = {"search_r1": "Retrieval Only", "fixed_ranker": "Fixed Ranker", "cosearch": "CoSearch", "oracle": "Oracle"}


#: What a comparison shows, by verdict, and what it cannot show whichever way it comes out:
#: the page's reading of each row, generated so that it follows the numbers.
READINGS = {
    "the oracle gap": {
        ">": "promoting answer-bearing passages makes this agent answer better: the paper's motivation holds here",
        "<": "promoting answer-bearing passages made this agent worse: the motivation does not hold here",
        "=": "the test questions cannot tell whether promoting answer-bearing passages helps this agent",
        "never": "how large the gap is for a 7B agent on real corpora (the paper: Table 1)"},
    "Fixed Ranker - Retrieval Only": {
        ">": "the agent trained and evaluated with the relevance-trained ranker answers better than Retrieval Only's",
        "<": "the agent trained and evaluated with the relevance-trained ranker answers worse than Retrieval Only's",
        "=": "no effect of the relevance-trained ranker on the agent's answers is shown at this sample size",
        "never": "whether the ranking or the agent's own training made the difference (benchmarks/ranker_swap.py holds "
                 "one of them fixed); the ranker-quality table says how well the ranker ranks"},
    "CoSearch - Fixed Ranker": {
        ">": "training the ranker jointly on the agent's reward beats a frozen relevance-trained ranker: the paper's finding",
        "<": "joint training did worse than the frozen ranker at this budget",
        "=": "joint training and the frozen ranker are not told apart at this budget",
        "never": "what more steps, a larger G or a 7B ranker would give (the paper: 100+ steps of 512 x 8)"},
    "CoSearch - Retrieval Only": {
        ">": "CoSearch's agent with its ranker beats the same agent trained without one",
        "<": "CoSearch's agent with its trained ranker answers worse than Retrieval Only's",
        "=": "CoSearch and Retrieval Only are not told apart",
        "never": "which part of the difference comes from the ranker and which from the agent's own training"},
}


def _reading(comparison: str, verdict: str) -> tuple[str, str]:
    """(what this row shows, what it cannot show) for a FINDINGS comparison and its verdict."""
    readings = READINGS.get(comparison)
    if readings is None:
        return "", ""
    key = ">" if verdict.startswith("a > b") else "<" if verdict.startswith("a < b") else "="
    shows = readings[key] if verdict != "no interval" else "nothing (no interval: too few questions)"
    return shows, readings["never"]


def verdict_label(row: Mapping[str, Any]) -> str:
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or high is None or low != low or high != high:
        return "no interval"
    if low > 0:
        return "a > b (interval excludes 0)"
    if high < 0:
        return "a < b (interval excludes 0)"
    return "no difference shown (interval includes 0)"


def findings_section(root: Path, profiles: Sequence[str]) -> list[str]:
    """The trained methods' paired comparisons and their F1 beside the paper's, over every profile
    (one per seed) whose notebook 03 recorded them: the page's summary."""
    recorded = _notebook_03_metrics(root, profiles)
    rows, table2, readings = [], [], []
    for profile, m in recorded:
        by_pair = {(c["a"], c["b"]): c for c in m.get("comparisons") or []}
        for a, b, what in FINDINGS:
            c = by_pair.get((f"{a}: after GRPO", f"{b}: after GRPO"))
            if c:
                rows.append({"profile": profile, "seed": m.get("seed"), "comparison": what, "mean_a": c["mean_a"],
                             "mean_b": c["mean_b"], "diff": c["diff"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                             "n_questions": c["n_questions"], "verdict": verdict_label(c)})
                shows, never = _reading(what, rows[-1]["verdict"])
                seed = "" if m.get("seed") is None else f", seed {m['seed']}"
                readings.append(f"- `{profile}`{seed}, {what} ({c['diff']:+.3f}, interval [{c['ci_low']:+.3f}, "
                                f"{c['ci_high']:+.3f}]). Shows: {shows}. Cannot show: {never}.")
        for method in PAPER_ROWS:
            f1 = (m.get("eval_f1") or {}).get(f"{method}: after GRPO")
            if f1:
                table2.append({"profile": profile, "seed": m.get("seed"), "method": method,
                               **{k: f1.get(k) for k in AVG_COLUMNS}})
    if not rows:
        return []
    paper = paper_table("table2")
    ceiling, power, ranker_val = _ceiling_rows(recorded)
    paper = paper[paper["agent"] == "7B"].set_index("method")
    for row in table2:
        row["paper avg (7B)"] = float(paper.loc[PAPER_ROWS[row["method"]], "avg"])
    return ["## The findings, per seed", "",
            "Each trained method after the same GRPO budget, evaluated greedily on the same test questions; a - b of "
            "avg F1 with its paired 95% bootstrap interval, stratified by family (generated from each profile's "
            "notebook 03 records below):", "", markdown_table(rows, list(rows[0])), "",
            "What each row shows, and what it cannot show whichever way it came out:", "", *readings, "",
            "Table 2 analogue: answer F1 of the trained methods, the paper's 7B avg beside:", "",
            markdown_table(table2, list(table2[0])) if table2 else "No trained method was evaluated.", "",
            *(["The ceiling, a diagnostic row (not a paper method): the same trained agent reading the passages that "
               "hold the current hop's answer first (`agent_hop_oracle`) against it reading the retriever's order. "
               "What a perfect reader of each search could give this agent:", "", markdown_table(ceiling, list(ceiling[0])), "",
               "Test questions a paired comparison needs to show the difference measured, with 80% power at the 5% "
               "level (normal approximation, equal questions per family; `eval.intervals.questions_for_power`):", "",
               markdown_table(power, list(power[0])), ""] if ceiling else []),
            *(["The rankers' held-out Hit@1 at each validation of the joint training (greedy, on the gold hops of the "
               "validation questions; step -1: before the first update):", "", markdown_table(ranker_val, list(ranker_val[0])), ""]
              if ranker_val else [])]


def _notebook_03_metrics(root: Path, profiles: Sequence[str]) -> list[tuple[str, dict]]:
    """(profile, its notebook 03 metrics) for the profiles that recorded them, each file read once."""
    paths = [(profile, root / profile / "03_joint_grpo_training.metrics.json") for profile in profiles]
    return [(profile, json.loads(path.read_text())) for profile, path in paths if path.exists()]


def _ceiling_rows(recorded: Sequence[tuple[str, dict]]) -> tuple[list[dict], list[dict], list[dict]]:
    """(the hop-level oracle's comparisons, the questions needed per comparison, the rankers' held-out
    Hit@1 per validation) over the profiles' notebook 03 metrics (:func:`_notebook_03_metrics`)."""
    ceiling, power, ranker_val = [], [], []
    for profile, m in recorded:
        seed = {"profile": profile, "seed": m.get("seed")}
        ceiling += [{**seed, **{k: c.get(k) for k in ("a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions")},
                     "verdict": verdict_label(c)} for c in m.get("ceiling") or []]
        power += [{**seed, **{k: r.get(k) for k in ("a", "b", "diff", "n_questions", "questions_needed")}}
                  for r in m.get("power") or []]
        ranker_val += [{**seed, **current_step_record(r)} for r in m.get("ranker_validation") or []]
    return ceiling, power, ranker_val
