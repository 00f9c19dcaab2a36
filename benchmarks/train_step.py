"""Wall time of one joint GRPO step, split into rollout / rewards+grouping / update, and peak memory.

Why: a CoSearch step does everything a Search-R1-style step does (agent rollouts and an agent
update) plus ranker generations inside every search and a second adapter's update. This measures
what the joint training costs on top of the agent-only baseline, with the same profile, warm
start, questions and seed, each method in its own process so peak memory is its own.

    python benchmarks/train_step.py                          # demo: search_r1 vs cosearch, 2 steps each
    python benchmarks/train_step.py --profile ci --steps 1   # quick check
    python benchmarks/train_step.py --methods cosearch --steps 3
    python benchmarks/train_step.py --methods cosearch --micro-batch 4   # padded micro-batches: peak memory

Per method and step it prints the phase times (the trainer's own step record: ``rollout_s``,
``reward_s``, ``update_s``, ``step_s``), the sequences and tokens each update scored, and the
process's peak resident memory (``ru_maxrss``; plus CUDA peak allocation on a GPU). Then the
mean per-step ratio cosearch / search_r1. Writes ``papermill_runs/<profile>/bench/train_step.{json,csv}``.
The warm start is trained on first use (cached, as in notebook 03) and not timed here.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.paths import run_dir
from cosearch_lib.records.provenance import environment_snapshot

PHASES = ["rollout_s", "reward_s", "update_s", "step_s"]
COUNTS = ["n_trajectories", "n_ranker_calls", "agent_n_forwarded", "agent_n_tokens", "ranker_n_forwarded",
          "ranker_n_tokens", "agent_reward", "hit@5"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(profile: str, method: str, steps: int, seed: int, micro_batch: int | None = None) -> dict:
    """Warm start (cached), then ``steps`` steps of ``method``; the step records and peak memory."""
    import torch

    from cosearch_lib.config import load_profile
    from cosearch_lib.experiment import build_retriever, build_trainer, warm_start

    cfg = load_profile(profile, seed=seed)
    retriever = build_retriever(cfg, progress=False)
    warm = warm_start(cfg, retriever, progress=False)
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    extra = {"micro_batch": micro_batch} if micro_batch else {}
    trainer = build_trainer(cfg, retriever, warm=warm, method=method, steps=steps, eval_every=0, **extra,
                            out_dir=run_dir(cfg.profile) / "bench" / f"train_step_{method}", progress=False)
    load_s = time.perf_counter() - t0
    records = [trainer.train_step() for _ in range(steps)]
    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"method": method, "load_s": load_s, "records": records, "peak_rss_mb": peak_rss_mb(),
            "peak_rss_before_trainer_mb": rss_before, "cuda_peak_mb": cuda}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--methods", default="search_r1,cosearch", help="comma-separated; the first is the baseline")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch", type=int, default=0, help="override training.micro_batch (0: the profile's)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one method, print JSON
    args = ap.parse_args()
    if args.one:
        result = run_one(args.profile, args.one, args.steps, args.seed, args.micro_batch or None)
        print("RESULT " + json.dumps(result, default=str))
        return

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    results = []
    for method in methods:  # one process each: peak memory is the method's own
        cmd = [sys.executable, __file__, "--profile", args.profile, "--steps", str(args.steps), "--seed", str(args.seed),
               "--micro-batch", str(args.micro_batch), "--one", method]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            sys.exit(f"{method} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results.append(json.loads(line[len("RESULT "):]))

    rows = [{"method": r["method"], **{k: rec.get(k) for k in ["step", *PHASES, *COUNTS]},
             "peak_rss_mb": r["peak_rss_mb"], "cuda_peak_mb": r["cuda_peak_mb"]}
            for r in results for rec in r["records"]]
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(f"profile={args.profile} steps={args.steps} seed={args.seed} micro_batch={args.micro_batch or 'profile'}")
    print(table.round(2).to_string(index=False))
    means = table.groupby("method", sort=False)[PHASES].mean()
    print("\nmean seconds per step:")
    print(means.round(2).to_string())
    summary = {"profile": args.profile, "steps": args.steps, "micro_batch": args.micro_batch or None, "mean_s": means.round(3).to_dict(orient="index"),
               "peak_rss_mb": {r["method"]: round(r["peak_rss_mb"]) for r in results}}
    if len(methods) > 1:
        base = means.loc[methods[0]]
        ratios = (means.drop(index=methods[0]) / base).round(2)
        print(f"\nratio to {methods[0]} (same questions, seed and warm start):")
        print(ratios.to_string())
        summary["ratio_to_" + methods[0]] = ratios.to_dict(orient="index")
    print("\npeak resident memory (MB):", summary["peak_rss_mb"])
    out = run_dir(args.profile) / "bench"
    stem = f"train_step_mb{args.micro_batch}" if args.micro_batch else "train_step"
    write_table(table, out / f"{stem}.csv")
    write_json({**summary, "environment": environment_snapshot()}, out / f"{stem}.json")
    print(f"\nwrote {out / stem}.csv and .json")


if __name__ == "__main__":
    main()
