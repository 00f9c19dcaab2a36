"""Which recipe makes the 135M ranker read? Held-out Hit@1 learning curves of scoring rankers.

Why (issue 35): every listwise-SFT and GRPO recipe of the generative ranker ended at the retriever's
own order. This trains scoring rankers (``rl.listwise_training``) on the gold hops of the training
split, with the held-out Hit@1 of the greedy first pick measured every ``eval_every`` lists on the
dev sub-queries (``relevance.val_per_dataset`` dev questions per family; never the test split),
beside the retriever's order on the same items. Each recipe writes one record (settings, the
curve, the final per-item paired difference with its family-stratified 95% interval) to
``--out``; the figure (Hit@1 against lists trained and against CPU minutes) is redrawn from every
record there.

    python benchmarks/ranker_recipes.py --profile laptop --val-per-dataset 15 --recipes judge_lora
    python benchmarks/ranker_recipes.py --figure-only

Recipes (``RECIPES``): ``judge_lora`` (the pointwise judge of ``models.llm_judge`` on the ranker
LLM, LoRA, one relevant + 3 sampled negatives per list), ``first_lora`` (the listwise identifier-logit ranker of
``models.listwise_logits``, shuffled lists) and ``cross_encoder_minilm`` (the 22M cross-encoder
of Table 3's ablation: a small reader for scale).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch

from cosearch_lib import experiment
from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.intervals import paired_bootstrap
from cosearch_lib.models.cross_encoder import CrossEncoderScorer
from cosearch_lib.models.listwise_logits import ListwiseLogitScorer
from cosearch_lib.models.llm_judge import LLMJudgeScorer
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.rl.listwise_training import ListwiseRecipe, sub_query_lists, train_listwise
from cosearch_lib.rl.ranker_validation import gold_sub_queries
from cosearch_lib.viz.ranker_probes import plot_ranker_recipes

#: name -> (scorer kind, recipe); the scorer is built from the profile's ranker model and LoRA settings.
RECIPES: dict[str, tuple[str, ListwiseRecipe]] = {
    "judge_lora": ("judge", ListwiseRecipe(examples=600, negatives=3, lr=5e-4)),
    "first_lora": ("listwise_logits", ListwiseRecipe(examples=600, negatives=0, shuffle=True, lr=5e-4)),
    "cross_encoder_minilm": ("cross_encoder", ListwiseRecipe(examples=1200, negatives=0, batch=1, lr=2e-5, head_lr=1e-3)),
}


def build_scorer(kind: str, cfg):
    if kind == "judge":
        return LLMJudgeScorer.from_model(cfg.models.ranker, cfg.lora)
    if kind == "listwise_logits":
        return ListwiseLogitScorer.from_model(cfg.models.ranker, cfg.lora)
    if kind == "cross_encoder":
        return CrossEncoderScorer.from_encoder(cfg.training.cross_encoder.model, max_length=cfg.training.cross_encoder.max_length)
    raise ValueError(f"unknown scorer kind {kind!r}")


def draw(folder: Path, figure: Path) -> None:
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    curves = pd.DataFrame([{"recipe": r["recipe"], **row} for r in records for row in r["curve"]],
                          columns=["recipe", "examples", "hit@1", "train_s", "loss"])
    retriever = records[0]["retriever_hit@1"] if records else float("nan")
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot_ranker_recipes(curves, retriever, n_items=records[0]["held_out_items"] if records else 0).savefig(
        figure, dpi=130, bbox_inches="tight")
    print(f"figure: {figure}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="laptop", help="profile name or YAML path (world, retriever, N, ranker model, LoRA)")
    ap.add_argument("--val-per-dataset", type=int, default=15, help="dev questions per family whose gold hops are held out")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--examples", type=int, help="override every recipe's number of training lists")
    ap.add_argument("--out", type=Path, default=Path("docs/results/_ranker_recipes"))
    ap.add_argument("--figure", type=Path, default=Path("figures/ranker_recipes.png"))
    ap.add_argument("--figure-only", action="store_true", help="only redraw the figure from the records in --out")
    args = ap.parse_args()
    if args.figure_only:
        draw(args.out, args.figure)
        return
    cfg = load_profile(args.profile)
    cfg = replace(cfg, relevance=replace(cfg.relevance, val_per_dataset=args.val_per_dataset))
    retriever = experiment.build_retriever(cfg, progress=False)
    held_queries = experiment.relevance_held_out(cfg)
    held = sub_query_lists(held_queries, retriever, cfg.search.topn)
    families = [q.dataset for q in held_queries]
    retriever_hits = [float(x.relevant[0]) for x in held]
    train = sub_query_lists(gold_sub_queries(load_qa(corpus_paths(cfg).qa[cfg.relevance.split])), retriever,
                            cfg.search.topn)
    print(f"{len(held)} held-out sub-queries (retriever Hit@1 {sum(retriever_hits) / len(held):.3f}); "
          f"{len(train)} training hops", flush=True)
    for name in args.recipes:
        kind, recipe = RECIPES[name]
        if args.examples:
            recipe = replace(recipe, examples=args.examples)
        torch.manual_seed(cfg.seed)
        scorer = build_scorer(kind, cfg)
        record = {"recipe": name, "scorer": kind, "recipe_settings": asdict(recipe), "profile": cfg.profile, "seed": cfg.seed,
                  "N": cfg.search.topn, "lora_r": cfg.lora.r, "model": cfg.models.ranker, "held_out_items": len(held),
                  "retriever_hit@1": sum(retriever_hits) / len(held), "curve": [], "complete": False,
                  "command": f"python benchmarks/ranker_recipes.py --profile {args.profile} --val-per-dataset "
                             f"{args.val_per_dataset} --recipes {name}" + (f" --examples {args.examples}" if args.examples else "")}
        args.out.mkdir(parents=True, exist_ok=True)

        def on_point(row, record=record, name=name):  # the record grows with the curve: an interrupted run keeps its points
            record["curve"].append(row)
            write_json(record, args.out / f"{name}.json")
            print(json.dumps({"recipe": name, **row}), flush=True)

        t0 = time.perf_counter()
        result = train_listwise(scorer, train, held, recipe, seed=cfg.seed, progress=False, on_point=on_point)
        wall = time.perf_counter() - t0
        diff = paired_bootstrap(result["held_out_hits"], retriever_hits, families, statistic="mean", when_too_few="note")
        record.update(trained_lists=result["trained_lists"], stopped_early=result["stopped_early"], complete=True,
                      train_s=result["train_s"], wall_s=wall,
                      final={"hit@1": diff.estimate_a, "diff": diff.diff, "ci_low": diff.ci_low, "ci_high": diff.ci_high})
        write_json(record, args.out / f"{name}.json")
        print(json.dumps({"recipe": name, **record["final"], "wall_s": wall}), flush=True)
        draw(args.out, args.figure)
        del scorer


if __name__ == "__main__":
    main()
