"""How often does a warm-started agent search? Searches per trajectory and F1 per family, on dev.

Why: an agent that answers a 2-3 hop question after one search cannot find its answer, and the
multi-hop half of every table then measures nothing. This trains (or loads) the profile's warm-started
agent only, runs it greedily with the retriever's top-K (``agent_retrieval``) on ``--n-per-dataset``
dev questions per family (never the test split: the warm-start recipe is chosen here), and prints
the searches per family beside the gold chains' lengths (``eval.tables.searches_by_family``), the
format-valid share, how trajectories ended, and F1 per family.

    python benchmarks/search_behaviour.py --profile laptop --n-per-dataset 6

Nothing is written but the warm-start cache.
"""

from __future__ import annotations

import argparse
import time

from cosearch_lib import experiment
from cosearch_lib.config import load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.harness import evaluate, select_examples
from cosearch_lib.eval.tables import searches_by_family, summary_table
from cosearch_lib.retrieval.artifacts import corpus_paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo", help="profile name or YAML path")
    ap.add_argument("--n-per-dataset", type=int, default=6)
    args = ap.parse_args()
    cfg = load_profile(args.profile)
    retriever = experiment.build_retriever(cfg, progress=False)
    t0 = time.perf_counter()
    warm = experiment.warm_start(cfg, retriever, roles=("agent",), progress=True)
    print(f"warm start of the agent ({cfg.warmstart.n_agent} trajectories, {cfg.warmstart.epochs:g} epoch(s), "
          f"reasoning {cfg.warmstart.reasoning!r}): {time.perf_counter() - t0:.0f} s -> {warm.get('agent')}", flush=True)
    hc = experiment.harness_config(cfg, split="dev", n_per_dataset=args.n_per_dataset, methods=("agent_retrieval",),
                                   agent_adapter=str(warm["agent"]) if warm.get("agent") else None)
    examples = select_examples(load_qa(corpus_paths(cfg).qa["dev"]), args.n_per_dataset)
    records = evaluate("agent_retrieval", examples, experiment.harness_context(cfg, retriever), hc, progress=True)
    print("\nsearches per trajectory by family (first row: the gold chains' length):")
    print(searches_by_family(records, examples).round(2).to_string())
    print("\nanswer F1 by family:")
    print(summary_table(records, "f1").round(3).to_string())
    print(f"\nformat-valid share {records['format_ok'].mean():.2f}; how trajectories ended: "
          f"{records['finish'].value_counts().to_dict()}; searches: {records['n_searches'].value_counts().sort_index().to_dict()}")


if __name__ == "__main__":
    main()
