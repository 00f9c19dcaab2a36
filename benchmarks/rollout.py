"""Trajectories/s and generated tokens/s of the batched rollout engine vs one trajectory at a time.

Why: a GRPO step rolls out G samples for many questions; the engine batches every agent turn of
every active trajectory into one generation call and every search of a turn into one retriever
call. This measures what that buys over the naive loop (the same engine, one question per call,
``batch_size=1``) with the same model, questions, seed and ranker. Row keys are (step, question,
sample, turn) in both runs, so both sample the same tokens up to floating-point effects of padding;
the record says how many trajectories came out token-identical.

    python benchmarks/rollout.py                                  # demo world, 8 questions, ~1 min on 2 idle cores
    python benchmarks/rollout.py --questions 4 --max-new-tokens 32 --max-searches 1   # quick check
    python benchmarks/rollout.py --samples 4 --batch-size 16 --ranker oracle
    python benchmarks/rollout.py --keep-going --questions 4     # multi-turn even for an untrained agent

An untrained SmolLM2-135M breaks the tag protocol on its first turn almost always, so with the
engine's default (retire a trajectory at its first violation) every trajectory is one agent turn
and no search happens. ``--keep-going`` sets ``stop_on_invalid=False`` (a corrective note, then
another turn), bounded by ``--max-context-tokens`` (default 1024 then), which exercises the
multi-turn path: growing contexts, trajectories finishing at different turns, any valid searches.

Prints both modes and the ratio; writes ``papermill_runs/<profile>/bench/rollout.{json,csv}``
(``rollout_keep_going.*`` with ``--keep-going``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import OracleRanker, RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine, trajectories_frame
from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SearchBudget, load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.experiment import build_retriever
from cosearch_lib.models.backends import TransformersBackend
from cosearch_lib.models.registry import load_causal_lm
from cosearch_lib.paths import run_dir
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.retrieval.artifacts import corpus_paths

RANKERS = {"retrieval": RetrievalOnlyRanker, "oracle": OracleRanker}


class TimedBackend:
    """Wraps a generation backend; accumulates seconds and calls of ``generate``."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def generate(self, prompts, sampling, adapter=None, row_keys=None):
        t0 = time.perf_counter()
        try:
            return self.inner.generate(prompts, sampling, adapter=adapter, row_keys=row_keys)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


class TimedRetriever:
    """Wraps a retriever; accumulates seconds and calls of ``search``."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def search(self, queries, topk):
        t0 = time.perf_counter()
        try:
            return self.inner.search(queries, topk)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def spread_over_families(examples, n: int):
    """``n`` questions taken round-robin over data_source (each family in file order)."""
    by_source = defaultdict(list)
    for ex in examples:
        by_source[ex.data_source].append(ex)
    queues = [by_source[s] for s in sorted(by_source)]
    out, i = [], 0
    while len(out) < n and any(i < len(q) for q in queues):
        out.extend(q[i] for q in queues if i < len(q))
        i += 1
    return out[:n]


def measure(name, model, tok, chat, retriever, ranker, rollout_cfg, protocol_cfg, groups, *, batch_size, samples, seed):
    """Roll out every group of questions with one engine call per group; time it."""
    backend, timed_retriever = TimedBackend(TransformersBackend(model, tok, batch_size=batch_size)), TimedRetriever(retriever)
    engine = RolloutEngine(backend, chat, timed_retriever, ranker, rollout_cfg, protocol_cfg)
    t0 = time.perf_counter()
    trajs = [t for group in groups for t in engine.run(group, n_samples=samples, seed=seed)]
    wall = time.perf_counter() - t0
    frame = trajectories_frame(trajs)
    generated = int(frame["n_generated"].sum())
    row = {
        "mode": name, "batch_size": batch_size, "engine_calls": len(groups), "trajectories": len(trajs),
        "wall_s": round(wall, 3), "traj_per_s": len(trajs) / wall, "generated_tokens": generated,
        "gen_tok_per_s": generated / wall, "agent_generate_s": round(backend.seconds, 3),
        "agent_generate_calls": backend.calls, "search_s": round(timed_retriever.seconds, 3),
        "search_calls": timed_retriever.calls, "mean_turns": float(frame["n_turns"].mean()),
        "mean_searches": float(frame["n_searches"].mean()), "format_ok_rate": float(frame["format_ok"].mean()),
        "mean_f1": float(frame["f1"].mean()), "mean_context_tokens": float(frame["n_tokens"].mean()),
    }
    return trajs, row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo", help="profile: world/corpus and retriever (build_retriever)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="agent model")
    ap.add_argument("--split", default="test", help="QA split the questions come from")
    ap.add_argument("--questions", type=int, default=8, help="questions, spread round-robin over data_source")
    ap.add_argument("--samples", type=int, default=1, help="G: rollouts per question")
    ap.add_argument("--max-searches", type=int, default=2, help="search calls allowed per trajectory")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="generated tokens per agent turn")
    ap.add_argument("--batch-size", type=int, default=8, help="TransformersBackend batch size of the batched run")
    ap.add_argument("--temperature", type=float, default=1.0, help="agent sampling temperature (0 = greedy)")
    ap.add_argument("--ranker", choices=sorted(RANKERS), default="retrieval", help="rule-based ranker (no LLM)")
    ap.add_argument("--keep-going", action="store_true", help="stop_on_invalid=False: a corrective note, then another turn")
    ap.add_argument("--max-context-tokens", type=int, default=None,
                    help="cut trajectories at this many tokens (default: 1024 with --keep-going, else RolloutConfig's)")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the two modes this many times; keep each one's fastest")
    ap.add_argument("--seed", type=int, default=0, help="rollout seed, shared by both runs")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: papermill_runs/<profile>/bench/")
    args = ap.parse_args(argv)
    for flag in ("questions", "samples", "max_searches", "max_new_tokens", "batch_size", "max_context_tokens", "repeats"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = load_profile(args.profile)
    retriever = build_retriever(cfg, progress=False)
    qa_path = corpus_paths(cfg).qa.get(args.split)
    if qa_path is None:
        raise SystemExit(f"profile {args.profile!r} has no {args.split!r} QA split; have {sorted(corpus_paths(cfg).qa)}")
    questions = spread_over_families(load_qa(qa_path), args.questions)
    model, tok = load_causal_lm(args.model)
    chat = ChatTokens(tok)
    ranker = RANKERS[args.ranker]()
    topn, topk = cfg.search.topn, cfg.search.topk
    if args.max_context_tokens is None:
        args.max_context_tokens = 1024 if args.keep_going else RolloutConfig.max_context_tokens
    rollout_cfg = RolloutConfig(search=SearchBudget(max_searches=args.max_searches, topn=topn, topk=topk),
                                agent_max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                max_context_tokens=args.max_context_tokens, stop_on_invalid=not args.keep_going)
    protocol_cfg = ProtocolConfig(search=SearchBudget(topk=topk, max_searches=args.max_searches))
    common = dict(model=model, tok=tok, chat=chat, retriever=retriever, ranker=ranker, protocol_cfg=protocol_cfg,
                  samples=args.samples, seed=args.seed)

    # warm-up (kernels, encoder, allocator) on one question with a short budget; not timed
    warm_cfg = RolloutConfig(search=SearchBudget(max_searches=1, topn=topn, topk=topk), agent_max_new_tokens=8, temperature=args.temperature)
    measure("warmup", rollout_cfg=warm_cfg, groups=[questions[:1]], batch_size=args.batch_size,
            **{**common, "samples": 1})

    # Alternate the two modes and keep each one's fastest repeat: on a shared machine other jobs only
    # ever slow a run down, so the minimum is the least noisy estimate; every wall time is recorded.
    load_before = os.getloadavg()[0]  # 1-minute load average: how busy the (shared) machine was
    runs = {"batched": [], "one_at_a_time": []}
    for _ in range(args.repeats):
        runs["batched"].append(measure("batched", rollout_cfg=rollout_cfg, groups=[questions],
                                       batch_size=args.batch_size, **common))
        runs["one_at_a_time"].append(measure("one_at_a_time", rollout_cfg=rollout_cfg, groups=[[q] for q in questions],
                                             batch_size=1, **common))
    (batched, b), (naive, n) = (min(runs[m], key=lambda r: r[1]["wall_s"]) for m in ("batched", "one_at_a_time"))
    for mode, row in (("batched", b), ("one_at_a_time", n)):
        row["repeats"], row["all_wall_s"] = args.repeats, [r[1]["wall_s"] for r in runs[mode]]
    identical = sum(x.token_ids == y.token_ids for x, y in zip(batched, naive))
    ratio = {"traj_per_s": b["traj_per_s"] / n["traj_per_s"], "gen_tok_per_s": b["gen_tok_per_s"] / n["gen_tok_per_s"]}

    env = {**environment_snapshot(), "load_avg_1min_before": load_before, "load_avg_1min_after": os.getloadavg()[0]}
    print(f"rollout benchmark: {args.model} on {env['device']} ({torch.get_num_threads()} threads), profile "
          f"{args.profile!r}, {len(questions)} questions x {args.samples} samples, ranker {args.ranker}, "
          f"N={topn} K={topk}, <= {args.max_searches} searches, <= {args.max_new_tokens} tokens/turn, T={args.temperature}, "
          f"{'keep going after invalid turns' if args.keep_going else 'retire at the first invalid turn'}, "
          f"<= {args.max_context_tokens} context tokens; 1-min load average {load_before:.1f} -> "
          f"{env['load_avg_1min_after']:.1f} on {os.cpu_count()} cores (best of {args.repeats} per mode)")
    for r in (b, n):
        print(f"  {r['mode']:<14} (batch_size={r['batch_size']:2d}): {r['trajectories']:3d} traj, "
              f"{r['generated_tokens']:5d} gen tokens in {r['wall_s']:7.1f} s = {r['traj_per_s']:6.3f} traj/s, "
              f"{r['gen_tok_per_s']:6.1f} tok/s  (generate {r['agent_generate_s']:.1f} s in {r['agent_generate_calls']} "
              f"calls, search {r['search_s']:.1f} s in {r['search_calls']} calls, {r['mean_turns']:.2f} turns/traj)")
    print(f"  batched / one-at-a-time: {ratio['traj_per_s']:.2f}x traj/s, {ratio['gen_tok_per_s']:.2f}x tok/s; "
          f"{identical}/{len(batched)} trajectories token-identical across the two runs")

    out_dir = args.out_dir or run_dir(args.profile) / "bench"
    record = {"benchmark": "rollout", "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "question_ids": [q.id for q in questions], "results": [b, n], "ratio": ratio,
              "identical_trajectories": identical, "environment": env}
    stem = "rollout_keep_going" if args.keep_going else "rollout"
    write_json(record, out_dir / f"{stem}.json")
    write_table(pd.DataFrame([{**r, "ratio_traj_per_s": ratio["traj_per_s"], "ratio_gen_tok_per_s": ratio["gen_tok_per_s"],
                               "profile": args.profile, "model": args.model, "questions": len(questions),
                               "samples": args.samples, "ranker": args.ranker, "max_new_tokens": args.max_new_tokens,
                               "max_searches": args.max_searches, "temperature": args.temperature, "seed": args.seed,
                               "keep_going": args.keep_going, "max_context_tokens": args.max_context_tokens}
                              for r in (b, n)]), out_dir / f"{stem}.csv")
    print(f"  wrote {out_dir / stem}.json and .csv")
    return record


if __name__ == "__main__":
    main()
