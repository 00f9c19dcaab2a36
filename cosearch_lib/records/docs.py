"""The generated pages of ``docs/``: METRICS.md from the code's glossaries, RESULTS.md from run records.

Neither page is edited by hand. ``cosearch docs`` rewrites both; ``cosearch docs --check`` (and a
test) fails when a committed page differs from what the code and the committed records give.

* ``docs/METRICS.md``: one table per glossary dict, each kept next to the code that logs the
  metric (evaluation records, training step records, grouping statistics, ranker rewards, recall
  tables, warm-start summaries), so a new metric cannot ship undocumented.
* ``docs/RESULTS.md``: the numbers of the runs whose records are committed under
  ``docs/results/<profile>/`` (each notebook's ``*.metrics.json`` and ``*.run.json``, copied from
  ``papermill_runs/<profile>/`` by ``cosearch docs --results-from papermill_runs/<profile>``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.eval.benchmark_families import order_key
from cosearch_lib.eval.harness import RECORD_GLOSSARY
from cosearch_lib.eval.paper_reference import paper_table
from cosearch_lib.eval.retriever_recall import RECALL_GLOSSARY
from cosearch_lib.eval.tables import AVG_COLUMNS, TABLE_GLOSSARY
from cosearch_lib.paths import project_relative, project_root
from cosearch_lib.rl.rewards import REWARD_GLOSSARY
from cosearch_lib.rl.semantic_grouping import GROUPING_GLOSSARY
from cosearch_lib.rl.warm_start import WARMSTART_GLOSSARY
from cosearch_lib.run_schema import RELEVANCE_STEP_GLOSSARY, STEP_GLOSSARY, VALIDATION_GLOSSARY

#: (title, where the metric is written, glossary, the dict's home in the code)
GLOSSARIES: tuple[tuple[str, str, Mapping[str, str], str], ...] = (
    ("Retrieval: answer recall", "notebook 01: `figures/<profile>/recall_at_k.csv`, `hop_recall_at_k.csv`",
     RECALL_GLOSSARY, "cosearch_lib.eval.retriever_recall.RECALL_GLOSSARY"),
    ("Evaluation records", "notebooks 02 and 03: `papermill_runs/<profile>/0N_eval_records.parquet`, one row per question x method x sample",
     RECORD_GLOSSARY, "cosearch_lib.eval.harness.RECORD_GLOSSARY"),
    ("Evaluation tables", "notebook 02: the summary, oracle-gap and turn tables built from the records",
     TABLE_GLOSSARY, "cosearch_lib.eval.tables.TABLE_GLOSSARY"),
    ("Training step records", "notebook 03: `papermill_runs/<profile>/training/<method>/steps.csv`, one row per GRPO step "
     "(`<role>`: agent or ranker; `<adapter>`: agent, ranker or shared)", STEP_GLOSSARY, "cosearch_lib.run_schema.STEP_GLOSSARY"),
    ("Validation records", "notebook 03: `training/<method>/validation.csv`, one row per validation item (question or "
     "held-out sub-query) and validation", VALIDATION_GLOSSARY, "cosearch_lib.run_schema.VALIDATION_GLOSSARY"),
    ("Relevance training records", "the Fixed Ranker's ranker-only GRPO: `data/cache/relevance/<key>/run/steps.csv`, "
     "one row per step (its `validation.csv` has the validation columns, method `relevance`)", RELEVANCE_STEP_GLOSSARY,
     "cosearch_lib.run_schema.RELEVANCE_STEP_GLOSSARY"),
    ("Semantic grouping statistics", "the `grouping_<stat>` columns of the step records", GROUPING_GLOSSARY,
     "cosearch_lib.rl.semantic_grouping.GROUPING_GLOSSARY"),
    ("Ranker reward records", "notebook 03: `training/<method>/ranker_calls.parquet`, one row per ranker call", REWARD_GLOSSARY,
     "cosearch_lib.rl.rewards.REWARD_GLOSSARY"),
    ("Warm-start summaries", "`data/cache/warmstart/<key>/<role>/warmstart.json` and the warm-start table of notebook 03",
     WARMSTART_GLOSSARY, "cosearch_lib.rl.warm_start.WARMSTART_GLOSSARY"),
)


def docs_dir() -> Path:
    return project_root() / "docs"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        text = "" if value != value else f"{value:.3f}"
    elif value is None:
        text = ""
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _column_key(col: str) -> tuple:
    """Row labels first, then R@k by k, families in the paper's order, averages last (JSON sorts keys)."""
    if col in ("metric", "meaning", "step", "status", "wall_s", "device", "git"):
        return (0,)
    if col.startswith("R@") and col[2:].isdigit():
        return (1, int(col[2:]))
    if col in AVG_COLUMNS:
        return (4, AVG_COLUMNS.index(col))
    if col.isdigit():
        return (2, int(col), "")
    return (3, *order_key(col))


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *, index: str | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (floats to 3 decimals, NaN and None empty)."""
    if not rows:
        return "_(no rows)_\n"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    if columns is None:
        head = [c for c in (index, "data_source") if c in cols]
        cols = head + sorted((c for c in cols if c not in head), key=_column_key)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_metrics_page() -> str:
    out = ["# Metrics", "",
           "Generated by `cosearch docs` from the glossaries in the code; do not edit by hand. Every column a run",
           "writes has an entry next to the code that computes it (a test checks each glossary covers its columns).", ""]
    for title, where, glossary, home in GLOSSARIES:
        out += [f"## {title}", "", f"Written to {where}. Source: `{home}`.", ""]
        out.append(markdown_table([{"metric": f"`{k}`", "meaning": v} for k, v in glossary.items()]))
    return "\n".join(out)


# --------------------------------------------------------------------------- results


def _by_index(table: Mapping[str, Mapping[str, Any]], index_name: str) -> str:
    return markdown_table([{index_name: key, **dict(row)} for key, row in table.items()], index=index_name)


def _section_01(m: dict) -> list[str]:
    out = [f"Corpus of {m['passages']:,} passages, N = {m['N']}, K = {m['K']}. Answer recall@k, question as the query:", ""]
    out.append(markdown_table(m["recall"]))
    if m.get("hop_recall"):
        out += ["", "Per hop, gold sub-queries as the queries (what the ranker sees inside the agent loop):", "",
                markdown_table(m["hop_recall"])]
    return out


def describe_f1_metric(value: str | None) -> str:
    """How a record names its answer F1 (config.EvaluationConfig.f1); records written before the setting
    existed used the yes/no rule."""
    if value is None:
        return "`yes_no` (HotpotQA's yes/no rule; recorded before `evaluation.f1` existed, whose default is the paper's `plain` F1)"
    return f"`{value}`" + (" (the paper's metric)" if value == "plain" else "")


def _section_02(m: dict) -> list[str]:
    ev = m.get("eval_config", {})
    budget = ev.get("search", {})
    rules = (ev.get("rules") or {}).get("name", "paper")
    out = [f"{m['n_records']} records; split `{ev.get('split')}`, {ev.get('n_per_dataset')} question(s) per family, "
           f"temperature {ev.get('temperature')}, N = {budget.get('topn')}, K = {budget.get('topk')}, "
           f"at most {budget.get('max_searches')} searches; rule set `{rules}`; answer F1 {describe_f1_metric(ev.get('f1'))}. "
           "Answer F1 per family (Table 2 layout):", ""]
    out.append(_by_index(m["f1"], "method"))
    out += ["", "Oracle gap (Table 1 layout):", "", _by_index(m["oracle_gap"], "run"),
            "", "Search turns per trajectory, % (Table 7 layout):", "", _by_index(m["turns"], "method")]
    return out + _searches(m) + _comparisons(m)


def _searches(m: dict) -> list[str]:
    """Mean searches per family beside the gold chains' lengths (runs recorded before it have none)."""
    if not m.get("searches_by_family"):
        return []
    return ["", "Mean searches per trajectory by family, first row the gold chains' length (the searches a question needs):",
            "", _by_index(m["searches_by_family"], "method")]


#: Relevance-training step columns RESULTS.md shows (run_schema.RELEVANCE_STEP_GLOSSARY).
RELEVANCE_SHOWN = ("step", "reward", "hit@1", "valid_rate", "groups_with_signal", "val_ranker_hit@1", "val_ranker_hit@5",
                   "step_s")
#: Ranker-quality columns RESULTS.md shows (records.ranker_quality.quality_table).
QUALITY_SHOWN = ("ranker", "n_items", "hit@1", "hit@1_low", "hit@1_high", "hit@3", "hit@5", "valid_rate")


def _ranker_quality(m: dict) -> list[str]:
    """The Fixed Ranker's relevance training and the ranker-quality table, when the run recorded them."""
    out = []
    rel = m.get("relevance")
    if rel:
        out += ["", f"The Fixed Ranker's relevance training (ranker-only GRPO, r_rel; CoSearch's ranker starts from "
                f"`{rel.get('cosearch_start')}`), one row per step, held-out Hit@k where validated:", "",
                markdown_table(rel["steps"], [c for c in RELEVANCE_SHOWN if any(c in r for r in rel["steps"])])]
    if m.get("ranker_quality"):
        out += ["", "Ranker quality on held-out sub-queries (Hit@k of the K passages shown; 95% bootstrap interval of Hit@1):",
                "", markdown_table(m["ranker_quality"], QUALITY_SHOWN)]
    if m.get("ranker_quality_comparisons"):
        out += ["", "Paired over the same held-out sub-queries, a - b of Hit@1:", "",
                markdown_table(m["ranker_quality_comparisons"], COMPARISON_SHOWN)]
    if m.get("ranker_diagnostics"):
        out += ["", "The trained ranker's steps: semantic groups before and after the filters, the composite reward's "
                "parts over all calls (pre) and the grouped ones (post), Hit@5 of what the agent read:", "",
                markdown_table(m["ranker_diagnostics"], list(m["ranker_diagnostics"][0]))]
    return out


def _section_03(m: dict) -> list[str]:
    out = [f"{m['steps']} GRPO step(s); rule set `{m.get('rules', 'paper')}`; answer F1 {describe_f1_metric(m.get('f1_metric'))}. "
           "Warm start:", "", _by_index(m["warmstart"], "role"),
           "", "First and last step records (columns: docs/METRICS.md):", "",
           markdown_table([{"method": method, **{c: rec.get(c) for c in STEP_COLUMNS}}
                           for which in ("first", "last") for method, rec in m[which].items()], ["method", *STEP_COLUMNS]),
           "", "Warm start against the trained policies, answer F1 on test questions:", "",
           _by_index(m["eval_f1"], "policies")]
    return out + _searches(m) + _comparisons(m) + _validation_comparisons(m) + _ranker_quality(m)


#: Columns of Tables 3 and 4 RESULTS.md shows (records.ablations.ablation_table, topk_table).
TABLE3_SHOWN = ("cell", "paper row", "single-hop avg", "multi-hop avg", "avg", "diff", "ci_low", "ci_high", "n_questions",
                "paper avg", "paper diff")
TABLE4_SHOWN = ("K", "method", "avg", "ci_low", "ci_high", "n_questions", "paper avg", "vs fixed ranker",
                "vs fixed ci_low", "vs fixed ci_high")


def _section_04(m: dict) -> list[str]:
    missing = {grid: cells for grid, cells in (m.get("missing") or {}).items() if cells}
    out = [f"Answer F1 {describe_f1_metric(m.get('f1_metric'))}.", "",
           "Table 3, the trained CoSearch policy of each finished ablation cell; `diff` is avg F1 minus the "
           "full cell's, paired over the same test questions (95% bootstrap interval):", "",
           markdown_table(m["table3"], TABLE3_SHOWN) if m.get("table3") else "No finished Table 3 cell.",
           "", "Table 4, each trained method at each finished K (one cell per K):", "",
           markdown_table(m["table4"], TABLE4_SHOWN) if m.get("table4") else "No finished Table 4 cell."]
    if missing:
        out += ["", "Cells not run on this profile: " + "; ".join(f"{g}: {', '.join(c)}" for g, c in missing.items())
                + " (`cosearch grid <grid> --profile <profile>`)."]
    return out


#: Columns of the paired comparisons RESULTS.md shows (eval.tables.comparison_table).
COMPARISON_SHOWN = ("a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_le_0", "n_questions", "note")


def _comparisons(m: dict) -> list[str]:
    """The run's paired bootstrap comparisons, when its records have them (runs before them do not)."""
    if not m.get("comparisons"):
        return []
    return ["", "Paired comparisons, a - b of avg F1 with its 95% bootstrap interval over the same questions, "
            "stratified by family (docs/METRICS.md):", "", markdown_table(m["comparisons"], COMPARISON_SHOWN)]


#: What each kind of validation comparison measures (records.training_runs.VALIDATION_METRICS).
VALIDATION_WHAT = {"agent": "avg F1 of the greedy agent loop on the validation questions",
                   "ranker": "mean Hit@1 of the method's ranking on the held-out sub-queries"}


def _validation_comparisons(m: dict) -> list[str]:
    """Notebook 03's paired intervals on the validation items (runs validated during training)."""
    out = []
    for kind, rows in (m.get("validation_comparisons") or {}).items():
        if rows:
            out += ["", f"Validation ({kind}): a - b of the {VALIDATION_WHAT.get(kind, kind)}, 95% bootstrap interval "
                    "over the same items (`<method> @ <steps completed>`):", "", markdown_table(rows, COMPARISON_SHOWN)]
    return out


#: Step-record columns RESULTS.md shows (all of them are in docs/METRICS.md).
STEP_COLUMNS = ("step", "agent_reward", "agent_f1", "agent_format_ok", "searches_per_traj", "n_ranker_calls", "hit@5",
                "ranker_valid_rate", "grouping_n_groups_post", "val_f1", "rollout_s", "update_s", "step_s")

RESULT_SECTIONS = {"01_retriever_setup": ("Retriever (notebook 01)", _section_01),
            "02_oracle_gap_study": ("Oracle-gap study (notebook 02)", _section_02),
            "03_joint_grpo_training": ("Joint GRPO training (notebook 03)", _section_03),
            "04_ablations": ("Ablations and the K sweep (notebook 04, grid cells)", _section_04)}


#: The paper's findings among trained methods (experiment.before_after_pairs), as (a, b, what it measures).
FINDINGS = (("oracle", "search_r1", "the oracle gap"), ("fixed_ranker", "search_r1", "Fixed Ranker - Retrieval Only"),
            ("cosearch", "fixed_ranker", "CoSearch - Fixed Ranker"), ("cosearch", "search_r1", "CoSearch - Retrieval Only"))
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
        ">": "a relevance-trained ranker between retriever and agent helps the agent",
        "<": "the relevance-trained ranker hurts the agent: it ranks worse than the retriever's order",
        "=": "no effect of the relevance-trained ranker shown: with a ranker that copies the retriever's order, none is expected",
        "never": "whether a better ranker would help; see the ranker-quality table for how well it ranks"},
    "CoSearch - Fixed Ranker": {
        ">": "training the ranker jointly on the agent's reward beats a frozen relevance-trained ranker: the paper's finding",
        "<": "joint training did worse than the frozen ranker at this budget",
        "=": "joint training and the frozen ranker are not told apart at this budget",
        "never": "what more steps, a larger G or a 7B ranker would give (the paper: 100+ steps of 512 x 8)"},
    "CoSearch - Retrieval Only": {
        ">": "CoSearch's agent with its ranker beats the same agent trained without one",
        "<": "the trained ranker costs the agent F1 against no ranker",
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


def _verdict(row: Mapping[str, Any]) -> str:
    low, high = row.get("ci_low"), row.get("ci_high")
    if low is None or high is None or low != low or high != high:
        return "no interval"
    if low > 0:
        return "a > b (interval excludes 0)"
    if high < 0:
        return "a < b (interval excludes 0)"
    return "no difference shown (interval includes 0)"


def _findings(root: Path, profiles: Sequence[str]) -> list[str]:
    """The trained methods' paired comparisons and their F1 beside the paper's, over every profile
    (one per seed) whose notebook 03 recorded them: the page's summary."""
    rows, table2, readings = [], [], []
    for profile in profiles:
        path = root / profile / "03_joint_grpo_training.metrics.json"
        if not path.exists():
            continue
        m = json.loads(path.read_text())
        by_pair = {(c["a"], c["b"]): c for c in m.get("comparisons") or []}
        for a, b, what in FINDINGS:
            c = by_pair.get((f"{a}: after GRPO", f"{b}: after GRPO"))
            if c:
                rows.append({"profile": profile, "seed": m.get("seed"), "comparison": what, "mean_a": c["mean_a"],
                             "mean_b": c["mean_b"], "diff": c["diff"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                             "n_questions": c["n_questions"], "verdict": _verdict(c)})
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
    paper = paper[paper["agent"] == "7B"].set_index("method")
    for row in table2:
        row["paper avg (7B)"] = float(paper.loc[PAPER_ROWS[row["method"]], "avg"])
    return ["## The findings, per seed", "",
            "Each trained method after the same GRPO budget, evaluated greedily on the same test questions; a - b of "
            "avg F1 with its paired 95% bootstrap interval, stratified by family (generated from each profile's "
            "notebook 03 records below):", "", markdown_table(rows, list(rows[0])), "",
            "What each row shows, and what it cannot show whichever way it came out:", "", *readings, "",
            "Table 2 analogue: answer F1 of the trained methods, the paper's 7B avg beside:", "",
            markdown_table(table2, list(table2[0])) if table2 else "No trained method was evaluated.", ""]


#: Where ``benchmarks/ranker_sft.py`` writes its records, under the results folder (not a profile).
RANKER_SFT_FOLDER = "_ranker_sft"


def _ranker_sft_probes(root: Path) -> list[str]:
    """The listwise-SFT probes of the ranker (``benchmarks/ranker_sft.py``), one row per record: what
    was tried to get the 135M ranker above the retriever's order, and what it gave."""
    records = [json.loads(p.read_text()) for p in sorted((root / RANKER_SFT_FOLDER).glob("*.json"))]
    if not records:
        return []
    rows = []
    for r in sorted(records, key=lambda r: r["sft"]["wall_s"] or 0):
        st, sft = r["settings"], r["sft"]
        c = next(c for c in r["comparisons"] if c["b"] == "retriever order")
        tail = [x["loss"] for x in (sft.get("losses") or [])[-10:]]
        rows.append({"probe": r["profile"], "N": st["N"], "candidates": st["candidates"], "gold rankings": st["gold_rankings"],
                     "epochs": f"{st['epochs']:g}", "SFT min": f"{sft['wall_s'] / 60:.0f}" if sft.get("wall_s") else None,
                     "loss (last 10 steps)": sum(tail) / len(tail) if tail else None, "held-out items": c["n_questions"],
                     "Hit@1 retriever": c["mean_b"], "Hit@1 SFT": c["mean_a"], "diff": c["diff"], "ci_low": c["ci_low"],
                     "ci_high": c["ci_high"], "verdict": _verdict(c)})
    return ["## Teaching the 135M ranker to read: listwise SFT probes", "",
            "The relevance-trained Fixed Ranker has copied the retriever's order (the ranker-quality tables below). "
            "Each probe trains the ranker's warm start alone on gold rankings of the training split, with the settings "
            "shown, and ranks held-out dev sub-queries greedily beside the retriever's order (Hit@1 of the passage "
            "put first; paired 95% interval of the difference). Generated from `docs/results/_ranker_sft/`; each "
            "record names the command that reproduces it (`benchmarks/ranker_sft.py`, profiles under "
            "`papermill_runs/params/probes/`), which also draws the SFT losses and these differences in "
            "`figures/ranker_sft_probes.png`.", "", markdown_table(rows, list(rows[0])), ""]


#: Where ``benchmarks/ranker_recipes.py`` writes its records (issue 35), under the results folder.
RANKER_RECIPES_FOLDER = "_ranker_recipes"


def _ranker_recipes(root: Path) -> list[str]:
    """The scoring rankers' learning curves (``benchmarks/ranker_recipes.py``): one row per recipe, its
    held-out Hit@1 at the start, at its best point and at its end against the retriever's order."""
    records = [json.loads(p.read_text()) for p in sorted((root / RANKER_RECIPES_FOLDER).glob("*.json"))]
    if not records:
        return []
    rows = []
    for r in records:
        curve, st, final = r["curve"], r["recipe_settings"], r.get("final") or {}
        best = max(curve, key=lambda x: x["hit@1"]) if curve else {}
        rows.append({"recipe": r["recipe"], "scorer": r["scorer"], "lr": f"{st['lr']:g}",
                     "negatives": st["negatives"] or "all", "lists trained": curve[-1]["examples"] if curve else 0,
                     "train min": f"{curve[-1]['train_s'] / 60:.0f}" if curve else None,
                     "Hit@1 start": curve[0]["hit@1"] if curve else None,
                     "Hit@1 best (lists)": f"{best['hit@1']:.3f} ({best['examples']})" if best else None,
                     "Hit@1 retriever": r["retriever_hit@1"], "Hit@1 end": final.get("hit@1"), "diff": final.get("diff"),
                     "ci_low": final.get("ci_low"), "ci_high": final.get("ci_high"),
                     "status": "stopped: flat" if r.get("stopped_early") else ("done" if r.get("complete") else "interrupted")})
    return ["## Teaching the 135M ranker to read: scoring recipes and their learning curves", "",
            "Each recipe trains a scoring ranker on the training split's gold hops (listwise loss on its candidates' "
            "scores) and measures the held-out Hit@1 of its first pick on dev sub-queries every few hundred lists, "
            "beside the retriever's order on the same items; `diff` is the end point minus the retriever, with its "
            "paired 95% interval (family-stratified). A recipe not above its start after 400 lists is stopped. "
            f"Generated from `docs/results/{RANKER_RECIPES_FOLDER}/`; each record names its command "
            "(`benchmarks/ranker_recipes.py`), which also draws the curves in `figures/ranker_recipes.png`.", "",
            markdown_table(rows, list(rows[0])), ""]


def render_results_page(results_root: Path | None = None) -> str:
    root = results_root or docs_dir() / "results"
    out = ["# Results", "",
           "Generated by `cosearch docs` from the run records committed under `docs/results/<profile>/`; do not",
           "edit by hand. Refresh after a run with `cosearch docs --results-from papermill_runs/<profile>`.", ""]
    profiles = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")) if root.is_dir() else []
    if not profiles:
        out.append("No run records committed yet.\n")
    out += _findings(root, profiles)
    out += _ranker_sft_probes(root)
    out += _ranker_recipes(root)
    for profile in profiles:
        folder = root / profile
        out += [f"## Profile `{profile}`", ""]
        runs = []
        for run in sorted(folder.glob("*.run.json")):
            rec = json.loads(run.read_text())
            env = rec.get("environment", {})
            runs.append({"step": rec.get("notebook", rec.get("step", run.stem)), "status": rec.get("status", "ok"),
                         "wall_s": rec.get("wall_s"), "device": env.get("device"), "git": (env.get("git_sha") or "")[:10]})
        if runs:
            out += ["Cost of each step (`*.run.json`):", "", markdown_table(runs), ""]
        for stem, (title, render) in RESULT_SECTIONS.items():
            path = folder / f"{stem}.metrics.json"
            if path.exists():
                out += [f"### {title}", ""] + render(json.loads(path.read_text())) + [""]
    return "\n".join(out).rstrip() + "\n"


def copy_run_records(run_folder: str | Path, results_root: Path | None = None) -> Path:
    """Copy a run folder's ``*.metrics.json`` and ``*.run.json`` into ``docs/results/<profile>/``, with
    every path inside the project written relative to its root (committed records name no machine)."""
    run_folder = Path(run_folder)
    files = sorted([*run_folder.glob("*.metrics.json"), *run_folder.glob("*.run.json")])
    if not files:
        raise FileNotFoundError(f"no *.metrics.json or *.run.json in {run_folder}")
    dest = (results_root or docs_dir() / "results") / run_folder.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in files:
        (dest / f.name).write_text(json.dumps(_machine_free(json.loads(f.read_text())), indent=2) + "\n")
    return dest


def _machine_free(value: Any) -> Any:
    """``value`` (parsed JSON) with strings that are absolute paths inside the project made relative."""
    if isinstance(value, dict):
        return {k: _machine_free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_machine_free(v) for v in value]
    if isinstance(value, str) and value.startswith(str(project_root().resolve()) + "/"):
        return project_relative(value)
    return value


def generated_pages() -> dict[Path, str]:
    return {docs_dir() / "METRICS.md": render_metrics_page(), docs_dir() / "RESULTS.md": render_results_page()}


def write_generated_docs(*, check: bool = False) -> list[Path]:
    """Rewrite the generated pages (or, with ``check``, only list those that are out of date)."""
    stale = []
    for path, text in generated_pages().items():
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale
