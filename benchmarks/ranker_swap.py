"""Does the Fixed Ranker's ranking help an agent, or did its agent train differently? An agent x ranking swap.

Why (issue 35): on seed 0 of the laptop comparison the Fixed Ranker scored below Retrieval Only
(-0.064 avg F1), although its ranker reads (held-out Hit@1 0.806 against the retriever's 0.500).
The four-way comparison changes two things at once: the ranking the agent reads, and the agent,
which GRPO trained against that ranking. This evaluates the two cross cells from notebook 03's
checkpoints, each exactly as notebook 03 evaluates its method (``experiment.trained_eval_settings``):

* Retrieval Only's trained agent reading the Fixed Ranker's ranking;
* the Fixed Ranker's trained agent reading the retriever's order;

and pairs them with notebook 03's own records of the two methods (``03_eval_records.parquet``, the
same test questions), so that the ranking's effect is measured with the agent held fixed, and the
agent's with the ranking held fixed (paired bootstrap over questions, family-stratified).

    python benchmarks/ranker_swap.py --profile laptop          # after `cosearch run --profile laptop --notebooks 03`
    python benchmarks/ranker_swap.py --profile laptop_seed1

Writes ``ranker_swap_records.csv`` (one row per question and cell) and ``ranker_swap.csv`` (the
comparisons) into the profile's run folder, and prints both tables.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd

from cosearch_lib import experiment
from cosearch_lib.config import load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.harness import run_evaluation, select_examples
from cosearch_lib.eval.tables import comparison_table, load_records, save_records
from cosearch_lib.paths import run_dir
from cosearch_lib.records.training_runs import checkpoint_adapters, training_root
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.seeding import seed_everything

#: notebook 03's label of a method's trained policies with its own ranking
OWN = "{method}: after GRPO"
#: this script's label of one method's trained agent reading another method's ranking
CROSS = "{agent} agent, {ranking} ranking"
AGENTS = ("search_r1", "fixed_ranker")  # Retrieval Only, Fixed Ranker


def cross_records(cfg, retriever, ctx, examples, agent: str, ranking: str) -> pd.DataFrame:
    """``agent``'s trained agent evaluated the way notebook 03 evaluates ``ranking`` (its ranker, its harness method)."""
    root = training_root(cfg.profile)
    adapters = {**checkpoint_adapters(root, ranking), "agent": checkpoint_adapters(root, agent)["agent"]}
    fields = experiment.trained_eval_settings(ranking, adapters, experiment.method_starts(cfg, retriever, ranking))
    label = CROSS.format(agent=agent, ranking=ranking)
    records = run_evaluation(None, examples, ctx, replace(experiment.harness_config(cfg), **fields), label=label)
    return records.assign(eval_method=records["method"], method=label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="laptop", help="the profile whose notebook-03 run to read (name or YAML path)")
    args = ap.parse_args()

    cfg = load_profile(args.profile)
    seed_everything(cfg.seed)
    out = run_dir(cfg.profile)
    own = load_records(out / "03_eval_records.parquet")
    missing = [m for m in AGENTS if OWN.format(method=m) not in set(own["method"])]
    if missing:
        raise SystemExit(f"{out / '03_eval_records.parquet'} has no records of {missing}: run notebook 03 with them first")
    retriever = experiment.build_retriever(cfg)
    ecfg = experiment.harness_config(cfg)
    examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
    own = own[own["method"].isin([OWN.format(method=m) for m in AGENTS])]
    if set(own["question_id"]) != {e.id for e in examples}:
        raise SystemExit("notebook 03's records cover other test questions than the profile's evaluation: rerun notebook 03")

    ctx = experiment.harness_context(cfg, retriever)
    crossed = [cross_records(cfg, retriever, ctx, examples, "search_r1", "fixed_ranker"),
               cross_records(cfg, retriever, ctx, examples, "fixed_ranker", "search_r1")]
    records = pd.concat([own, *crossed], ignore_index=True)
    save_records(records, out, "ranker_swap_records")

    r1, fixed = OWN.format(method="search_r1"), OWN.format(method="fixed_ranker")
    r1_judged, fixed_plain = CROSS.format(agent="search_r1", ranking="fixed_ranker"), CROSS.format(agent="fixed_ranker", ranking="search_r1")
    pairs = [(r1_judged, r1),        # the ranking's effect on Retrieval Only's agent
             (fixed, fixed_plain),   # the ranking's effect on the Fixed Ranker's agent
             (fixed_plain, r1),      # the agent's effect under the retriever's order
             (fixed, r1_judged)]     # the agent's effect under the Fixed Ranker's ranking
    table = comparison_table(records, pairs, seed=cfg.seed)
    path = out / "ranker_swap.csv"
    table.to_csv(path, index=False)
    cells = records.groupby("method", sort=False)[["f1", "n_searches", "ranker_hit@1", "format_ok"]].mean()
    print(cells.round(3).to_string())
    print(table[["a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions"]].round(3).to_string(index=False))
    print(f"records: {Path(out) / 'ranker_swap_records.csv'}; comparisons: {path}")


if __name__ == "__main__":
    main()
