"""Trajectories/s and generated tokens/s of the rollout engine: cached and batched vs one at a time.

Why: a GRPO step rolls out G samples for many questions; the engine batches every agent turn of
every active trajectory into one generation call and every search of a turn into one retriever
call, and the generation backend computes every prompt prefix once (the shared instructions once
per call, a trajectory's earlier turns once per rollout). Three modes, side by side in one run,
with the same model, questions, seed and ranker:

* ``one_at_a_time``: one question per engine call, ``batch_size=1``, no prefix cache: the naive
  loop, where every turn re-reads its whole context;
* ``batched``: every question in one call, ``--batch-size`` rows per forward, no prefix cache;
* ``batched_cached``: the same with the prefix cache (the library's default).

Row keys are (step, question, sample, turn) in every run, so all modes sample the same tokens up
to floating-point effects of padding and caching; the record says how many trajectories came out
token-identical to the naive loop.

    python benchmarks/rollout.py --warmstart --samples 4 --ranker llm   # the demo's CoSearch rollout (warm-started policies)
    python benchmarks/rollout.py                                  # base model, demo world, 8 questions
    python benchmarks/rollout.py --questions 4 --max-new-tokens 32 --max-searches 1   # quick check
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
from peft import PeftModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import LLMRanker, OracleRanker, RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine, trajectories_frame
from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SearchBudget, load_profile
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.experiment import build_retriever, warm_start
from cosearch_lib.models.generation.contract import prefix_scope
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.registry import load_causal_lm
from cosearch_lib.paths import run_dir
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.retrieval.artifacts import corpus_paths

RANKERS = ("retrieval", "oracle", "llm")
MODES = ("batched_cached", "batched", "one_at_a_time")


class TimedBackend:
    """Wraps a generation backend; accumulates seconds and calls of ``generate``."""

    def __init__(self, inner):
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def prefix_scope(self, keep_rows_for=()):
        return prefix_scope(self.inner, keep_rows_for)

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


def make_ranker(kind, backend, chat, protocol_cfg, rollout_cfg, seed, adapter):
    if kind == "retrieval":
        return RetrievalOnlyRanker()
    if kind == "oracle":
        return OracleRanker()
    return LLMRanker(backend, chat, protocol_cfg, rollout_cfg.ranker_sampling(seed), adapter=adapter)


def measure(name, model, tok, chat, retriever, ranker, rollout_cfg, protocol_cfg, groups, *, batch_size, samples, seed,
            cached=True, agent_adapter=None, ranker_adapter=None):
    """Roll out every group of questions with one engine call per group; time it."""
    backend = TimedBackend(TransformersBackend(model, tok, batch_size=batch_size, share_prefixes=cached))
    timed_retriever = TimedRetriever(retriever)
    engine = RolloutEngine(backend, chat, timed_retriever,
                           make_ranker(ranker, backend, chat, protocol_cfg, rollout_cfg, seed, ranker_adapter),
                           rollout_cfg, protocol_cfg, agent_adapter=agent_adapter)
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
    ap.add_argument("--ranker", choices=RANKERS, default="retrieval",
                    help="retrieval / oracle: rule-based; llm: the generative ranker (the warm-started one with --warmstart)")
    ap.add_argument("--warmstart", action="store_true",
                    help="agent (and llm ranker) = the profile's cached warm-start adapters (cosearch warm-start --profile P)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {MODES}")
    ap.add_argument("--keep-going", action="store_true", help="stop_on_invalid=False: a corrective note, then another turn")
    ap.add_argument("--max-context-tokens", type=int, default=None,
                    help="cut trajectories at this many tokens (default: 1024 with --keep-going, else RolloutConfig's)")
    ap.add_argument("--repeats", type=int, default=1, help="alternate the modes this many times; keep each one's fastest")
    ap.add_argument("--seed", type=int, default=0, help="rollout seed, shared by both runs")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out-dir", type=Path, default=None, help="default: papermill_runs/<profile>/bench/")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes must name some of {MODES}, got {args.modes!r}")
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
    adapters = {"agent_adapter": None, "ranker_adapter": None}
    if args.warmstart:
        warm = warm_start(cfg, None)  # cached adapters only: train them first with `cosearch warm-start`
        model = PeftModel.from_pretrained(model, str(warm["agent"]), adapter_name="agent")
        model.load_adapter(str(warm["ranker"]), adapter_name="ranker")
        adapters = {"agent_adapter": "agent", "ranker_adapter": "ranker"}
    chat = ChatTokens(tok)
    topn, topk = cfg.search.topn, cfg.search.topk
    if args.max_context_tokens is None:
        args.max_context_tokens = 1024 if args.keep_going else RolloutConfig.max_context_tokens
    rollout_cfg = RolloutConfig(search=SearchBudget(max_searches=args.max_searches, topn=topn, topk=topk),
                                agent_max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                max_context_tokens=args.max_context_tokens, stop_on_invalid=not args.keep_going,
                                ranker_max_new_tokens=cfg.rollout.ranker_max_new_tokens)
    protocol_cfg = ProtocolConfig(search=SearchBudget(topk=topk, max_searches=args.max_searches))
    common = dict(model=model, tok=tok, chat=chat, retriever=retriever, ranker=args.ranker, protocol_cfg=protocol_cfg,
                  samples=args.samples, seed=args.seed, **adapters)

    # warm-up (kernels, encoder, allocator) on one question with a short budget; not timed
    warm_cfg = RolloutConfig(search=SearchBudget(max_searches=1, topn=topn, topk=topk), agent_max_new_tokens=8, temperature=args.temperature)
    measure("warmup", rollout_cfg=warm_cfg, groups=[questions[:1]], batch_size=args.batch_size,
            **{**common, "samples": 1})

    # Alternate the modes and keep each one's fastest repeat: on a shared machine other jobs only
    # ever slow a run down, so the minimum is the least noisy estimate; every wall time is recorded.
    load_before = os.getloadavg()[0]  # 1-minute load average: how busy the (shared) machine was
    settings = {"batched_cached": dict(groups=[questions], batch_size=args.batch_size, cached=True),
                "batched": dict(groups=[questions], batch_size=args.batch_size, cached=False),
                "one_at_a_time": dict(groups=[[q] for q in questions], batch_size=1, cached=False)}
    runs = {m: [] for m in modes}
    for _ in range(args.repeats):
        for m in modes:
            runs[m].append(measure(m, rollout_cfg=rollout_cfg, **settings[m], **common))
    best = {m: min(runs[m], key=lambda r: r[1]["wall_s"]) for m in modes}
    for m in modes:
        best[m][1]["repeats"], best[m][1]["all_wall_s"] = args.repeats, [r[1]["wall_s"] for r in runs[m]]
    base_mode = modes[-1]  # ratios against the last mode named (default: the naive loop)
    base_trajs, base = best[base_mode]
    for m in modes:
        trajs, row = best[m]
        row["ratio_traj_per_s"] = row["traj_per_s"] / base["traj_per_s"]
        row["ratio_gen_tok_per_s"] = row["gen_tok_per_s"] / base["gen_tok_per_s"]
        row["identical_to_" + base_mode] = sum(x.token_ids == y.token_ids for x, y in zip(trajs, base_trajs))

    env = {**environment_snapshot(), "load_avg_1min_before": load_before, "load_avg_1min_after": os.getloadavg()[0]}
    print(f"rollout benchmark: {args.model}{' + warm start' if args.warmstart else ''} on {env['device']} "
          f"({torch.get_num_threads()} threads), profile {args.profile!r}, {len(questions)} questions x {args.samples} "
          f"samples, ranker {args.ranker}, N={topn} K={topk}, <= {args.max_searches} searches, <= {args.max_new_tokens} "
          f"tokens/turn, T={args.temperature}, "
          f"{'keep going after invalid turns' if args.keep_going else 'retire at the first invalid turn'}, "
          f"<= {args.max_context_tokens} context tokens; 1-min load average {load_before:.1f} -> "
          f"{env['load_avg_1min_after']:.1f} on {os.cpu_count()} cores (best of {args.repeats} per mode)")
    for m in modes:
        r = best[m][1]
        print(f"  {m:<15} (batch_size={r['batch_size']:2d}): {r['trajectories']:3d} traj, "
              f"{r['generated_tokens']:5d} gen tokens in {r['wall_s']:7.1f} s = {r['traj_per_s']:6.3f} traj/s, "
              f"{r['gen_tok_per_s']:6.1f} tok/s, {r['ratio_traj_per_s']:5.2f}x {base_mode}  (generate "
              f"{r['agent_generate_s']:.1f} s in {r['agent_generate_calls']} calls, search {r['search_s']:.1f} s, "
              f"{r['mean_turns']:.2f} turns/traj, {r['mean_searches']:.2f} searches/traj, "
              f"{r['identical_to_' + base_mode]}/{r['trajectories']} token-identical to {base_mode})")

    out_dir = args.out_dir or run_dir(args.profile) / "bench"
    rows = [best[m][1] for m in modes]
    record = {"benchmark": "rollout", "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "question_ids": [q.id for q in questions], "results": rows, "baseline": base_mode, "environment": env}
    stem = "rollout_keep_going" if args.keep_going else "rollout"
    write_json(record, out_dir / f"{stem}.json")
    write_table(pd.DataFrame([{**r, "profile": args.profile, "model": args.model, "warmstart": args.warmstart,
                               "questions": len(questions), "samples": args.samples, "ranker": args.ranker,
                               "max_new_tokens": args.max_new_tokens, "max_searches": args.max_searches,
                               "temperature": args.temperature, "seed": args.seed, "keep_going": args.keep_going,
                               "max_context_tokens": args.max_context_tokens} for r in rows]), out_dir / f"{stem}.csv")
    print(f"  wrote {out_dir / stem}.json and .csv")
    return record


if __name__ == "__main__":
    main()
