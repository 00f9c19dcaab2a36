"""Can listwise SFT teach the ranker to read? Held-out Hit@k of a ranker trained on gold rankings alone.

Why: the Fixed Ranker must rank above the retriever's own order (issue 23), and the 135M ranker's
relevance training has so far only copied that order. This trains (or loads from the warm-start
cache) the profile's ranker warm start, whose recipe the profile's settings decide:
``warmstart.n_ranker`` gold rankings, ``warmstart.epochs``, ``warmstart.ranker_candidates``
(the retriever's order, or shuffled so that position says nothing) and ``search.topn`` (N, the
prompt's length). It then ranks the held-out sub-queries greedily (``relevance.val_per_dataset`` dev
questions per family; never the test split) beside the retriever's order, and writes one record:
the settings, the SFT's losses and time, Hit@1/3/5 with intervals, and the paired Hit@1 difference.
``cosearch docs`` renders the records under ``docs/results/_ranker_sft/`` into docs/RESULTS.md.

    python benchmarks/ranker_sft.py --profile ranker_sft_n5 --out docs/results/_ranker_sft

``--records`` and ``--adapter`` make the record from a scoring already done (the per-item rows of
``records.ranker_quality.quality_records``, as CSV) and the adapter folder it scored, instead of
training and scoring again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

from cosearch_lib import experiment
from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import load_profile
from cosearch_lib.records.ranker_quality import RETRIEVER_ORDER, quality_comparisons, quality_records, quality_table
from cosearch_lib.rl.warm_start import warmstart_summary
from cosearch_lib.viz.ranker_probes import plot_ranker_sft_probes

SFT_LABEL = "listwise SFT"


def settings(cfg) -> dict:
    ws = cfg.warmstart
    return {"N": cfg.search.topn, "K": cfg.search.topk, "gold_rankings": ws.n_ranker, "epochs": ws.epochs,
            "learning_rate": ws.learning_rate, "batch": ws.batch_size * ws.grad_accum,
            "candidates": ws.ranker_candidates, "lora_r": cfg.lora.r, "model": cfg.models.ranker}


def draw(folder: Path, figure: Path) -> None:
    """Redraw ``figure`` from every record in ``folder``: the probes' SFT losses and Hit@1 differences."""
    records = sorted((json.loads(p.read_text()) for p in folder.glob("*.json")), key=lambda r: r["sft"]["wall_s"] or 0)
    losses = pd.DataFrame([{"probe": r["profile"], **x} for r in records for x in r["sft"].get("losses") or []],
                          columns=["probe", "step", "loss"])
    hits = pd.DataFrame([{"probe": r["profile"], **{k: c[k] for k in ("diff", "ci_low", "ci_high")}} for r in records
                         for c in r["comparisons"] if c["b"] == RETRIEVER_ORDER], columns=["probe", "diff", "ci_low", "ci_high"])
    figure.parent.mkdir(parents=True, exist_ok=True)
    plot_ranker_sft_probes(losses, hits).savefig(figure, dpi=130, bbox_inches="tight")
    print(f"figure: {figure}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="profile name or YAML path (required but with --figure-only)")
    ap.add_argument("--out", type=Path, default=Path("docs/results/_ranker_sft"), help="folder of the record")
    ap.add_argument("--records", type=Path, help="per-item rows already scored (CSV): skip training and scoring")
    ap.add_argument("--adapter", type=Path, help="with --records: the ranker adapter those rows scored")
    ap.add_argument("--label", help="with --records: that ranker's label in the CSV's method column")
    ap.add_argument("--figure", type=Path, default=Path("figures/ranker_sft_probes.png"),
                    help="redraw this figure from every record in --out")
    ap.add_argument("--figure-only", action="store_true", help="only redraw the figure from the records in --out")
    args = ap.parse_args()
    if args.figure_only:
        draw(args.out, args.figure)
        return
    if not args.profile:
        ap.error("--profile is required")
    cfg = load_profile(args.profile)
    if args.records:
        if not (args.adapter and args.label):
            ap.error("--records needs --adapter (the folder whose warmstart.json holds the SFT's losses) and --label")
        rec = pd.read_csv(args.records)
        rec = rec[rec["method"].isin([RETRIEVER_ORDER, args.label])].replace({"method": {args.label: SFT_LABEL}})
        if set(rec["method"]) != {RETRIEVER_ORDER, SFT_LABEL}:
            raise SystemExit(f"{args.records} holds no rows of {RETRIEVER_ORDER!r} and {args.label!r} both")
        adapter, score_s = args.adapter, None
    else:
        retriever = experiment.build_retriever(cfg, progress=False)
        adapter = experiment.warm_start(cfg, retriever, roles=("ranker",), progress=True)["ranker"]
        t0 = time.perf_counter()
        rec = quality_records(experiment.held_out_ranker_rows(cfg, retriever, {RETRIEVER_ORDER: None, SFT_LABEL: adapter}))
        score_s = time.perf_counter() - t0
    sft = warmstart_summary(adapter)
    table = quality_table(rec)
    comparisons = quality_comparisons(rec)
    record = {"profile": cfg.profile, "seed": cfg.seed, "settings": settings(cfg),
              "sft": {k: sft.get(k) for k in ("n_sequences", "tokens", "wall_s", "train_loss", "losses")},
              "score_s": score_s, "quality": table.to_dict("records"), "comparisons": comparisons.to_dict("records"),
              "command": f"python benchmarks/ranker_sft.py --profile {args.profile}",  # what reproduces it
              "scored_in_this_run": not args.records}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(record, args.out / f"{cfg.profile}.json")
    draw(args.out, args.figure)
    pd.set_option("display.width", 200)
    print(table.round(3).to_string(index=False))
    print(comparisons.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
