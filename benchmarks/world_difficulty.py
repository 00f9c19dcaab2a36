"""How hard is the embedded world for the first-stage retriever? Answer recall@k per family.

Why: CoSearch's ranker picks K of the retriever's N candidates, so it can only learn if the
retriever is good but imperfect at K (recall@K well below recall@N). Two views, per family plus
the single-hop / multi-hop / overall macro averages:

* per-hop recall with the gold sub-queries (``gold_hop_ranks``): what the ranker faces inside
  the agent loop, one well-formed search per reasoning hop, the hop's answer as the target;
* question-as-query recall (``first_relevant_ranks``): one search with the whole question, as a
  plain RAG baseline would do (multi-hop questions should stay below 1.0 even at N).

Reference (real wiki-18, e5, NQ): R@1 ~0.45, R@5 ~0.70, R@20 ~0.82, R@50 ~0.88.

    python benchmarks/world_difficulty.py                      # the demo profile (default world)
    python benchmarks/world_difficulty.py --profile /tmp/x.yaml --ks 1 5 50

Prints the tables and the world's passage counts by kind; writes
``papermill_runs/<profile>/bench/world_difficulty.csv`` (tidy: view, data_source, group, k,
recall, n).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.config import load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.retriever_recall import first_relevant_ranks, gold_hop_ranks, recall_curve, recall_table
from cosearch_lib.experiment import build_retriever
from cosearch_lib.paths import runs_dir
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.world.io import read_manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="demo", help="profile name or path to a profile .yaml (embedded world)")
    p.add_argument("--topn", type=int, default=50, help="N: candidates retrieved per query")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5, 10, 20, 50], help="cut-offs of the recall tables")
    p.add_argument("--split", default="test", choices=["train", "dev", "test"], help="which questions to search")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: papermill_runs/<profile>/bench)")
    args = p.parse_args(argv)
    if args.topn < 1 or min(args.ks) < 1:
        p.error("--topn and --ks must be >= 1")
    if max(args.ks) > args.topn:
        p.error(f"--ks go up to {max(args.ks)} but --topn is {args.topn}; raise --topn")
    return args


def passage_counts(manifest: dict | None) -> pd.Series:
    """Passages by kind (main, paraphrase, ablated, distractor, mention) from the world manifest."""
    counts = pd.Series((manifest or {}).get("counts", {}).get("passages", {}), dtype="int64", name="passages")
    return pd.concat([counts, pd.Series({"total": int(counts.sum())}, name="passages")])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_profile(args.profile)
    if not cfg.uses_embedded_world:
        print(f"profile {cfg.profile!r} uses a real corpus; this benchmark needs the embedded world's gold chains")
        return 2
    t0 = time.perf_counter()
    retriever = build_retriever(cfg)
    paths = corpus_paths(cfg)
    print(f"retriever ready in {time.perf_counter() - t0:.1f} s ({paths.root})")
    print("\npassages by kind:")
    print(passage_counts(read_manifest(paths.root)).to_string())

    qa = load_qa(paths.qa[args.split])
    hops = gold_hop_ranks(retriever, qa, topn=args.topn)
    whole = first_relevant_ranks(retriever, qa, topn=args.topn)
    curves = {"gold_sub_query": recall_curve(hops, args.ks), "question": recall_curve(whole, args.ks)}
    print(f"\nper-hop answer recall@k, gold sub-queries ({args.split}, {len(hops)} hops):")
    print(recall_table(curves["gold_sub_query"], args.ks).to_string())
    skipped = sum(whole.attrs.get("excluded_yes_no", {}).values())
    print(f"\nanswer recall@k, the question as the query ({args.split}, {len(whole)} questions, "
          f"{skipped} yes/no left out):")
    print(recall_table(curves["question"], args.ks).to_string())

    out_dir = args.out or runs_dir() / cfg.profile / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    tidy = pd.concat([c.assign(view=v) for v, c in curves.items()], ignore_index=True)
    tidy = tidy[["view", "data_source", "group", "k", "recall", "n"]]
    fd, tmp = tempfile.mkstemp(prefix=".world_difficulty-", suffix=".csv", dir=out_dir)
    os.close(fd)
    tidy.to_csv(tmp, index=False)
    os.replace(tmp, out_dir / "world_difficulty.csv")  # atomic: never a half-written CSV
    print(f"\nwrote {out_dir / 'world_difficulty.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
