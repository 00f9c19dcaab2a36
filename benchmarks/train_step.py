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

    python benchmarks/train_step.py --updates --threads 1    # the update options side by side (CPU: ~2 min)
    python benchmarks/train_step.py --updates --update-seqs 32 --update-lengths 256,2048 --update-micro-batch 8   # GPU

``--updates`` times one GRPO update of the profile's policy model (a fresh LoRA adapter) on a
seeded batch of random-token sequences of mixed lengths, under three settings: micro-batches cut
in the given order, micro-batches of similar length (``training.length_grouped_micro_batches``),
and the latter with gradient checkpointing (``training.gradient_checkpointing``). Per setting: the
median seconds of ``--repeats`` updates (after an untimed warm-up update on two short sequences),
the padding share of the positions forwarded (``agent_pad_frac``), the rollout-vs-update log-prob
drift over the first minibatch (``agent_logp_drift_mean``; old log-probs teacher-forced by the
same model, so ~0 in float32), the gradient norm (the same in every setting) and on CUDA the peak
allocation; then the ratios grouped / in order and checkpointed / not. Writes
``papermill_runs/<profile>/bench/train_update_options.{json,csv}``.

    python benchmarks/train_step.py --nproc 2 --methods cosearch   # 1 rank vs 2 data-parallel ranks (gloo on CPU)

``--nproc N`` runs each method in one process and as N ranks of a torchrun job (``rl.data_parallel``:
the step's questions split over the ranks, gradients summed), side by side on the same questions
and seed, and prints each one's step time, the speed-up, and whether the step records agree (they
must: the ranks train the one-process model). On a CPU machine the ranks share its cores: one rank
uses torch's default threads, each of N ranks one thread (torchrun's default). Writes
``papermill_runs/<profile>/bench/train_step_dp.{json,csv}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.config import UpdateSettings, load_profile
from cosearch_lib.experiment import build_retriever, build_trainer, warm_start
from cosearch_lib.models.generation.teacher_forced import reference_logprobs
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.models.policy_loading import load_policy_model
from cosearch_lib.paths import run_dir
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.rl.data_parallel import DataParallel
from cosearch_lib.rl.policy_sequences import PolicySequence
from cosearch_lib.rl.policy_update import UpdateJob, grpo_update
from cosearch_lib.seeding import rng

PHASES = ["time/rollout_s", "time/reward_s", "time/update_s", "time/step_s"]
COUNTS = ["rollout/n_trajectories", "ranker/n_calls", "loss/agent_n_forwarded", "loss/agent_n_tokens",
          "loss/ranker_n_forwarded", "loss/ranker_n_tokens", "rollout/agent_reward", "ranker/hit@K"]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(profile: str, method: str, steps: int, seed: int, micro_batch: int | None = None,
            dp: DataParallel | None = None) -> dict:
    """Warm start (cached), then ``steps`` steps of ``method``; the step records and peak memory.
    ``dp``: this rank of a data-parallel job (the warm start must be cached: ``--nproc`` builds it first)."""
    dp = dp or DataParallel()
    cfg = load_profile(profile, seed=seed)
    retriever = build_retriever(cfg, progress=False)
    warm = warm_start(cfg, retriever, progress=False)
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    extra = {"micro_batch": micro_batch} if micro_batch else {}
    trainer = build_trainer(cfg, retriever, warm=warm, method=method, steps=steps, eval_every=0, **extra,
                            out_dir=run_dir(cfg.profile) / "bench" / f"train_step_{method}_ranks{dp.world_size}",
                            progress=False, dp=dp)
    load_s = time.perf_counter() - t0
    records = [trainer.train_step() for _ in range(steps)]
    cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"method": method, "ranks": dp.world_size, "load_s": load_s, "records": records, "peak_rss_mb": peak_rss_mb(),
            "peak_rss_before_trainer_mb": rss_before, "cuda_peak_mb": cuda}


#: (setting, length-grouped micro-batches, gradient checkpointing) of the ``--updates`` comparison
UPDATE_SETTINGS = [("in order", False, False), ("length-grouped", True, False),
                   ("length-grouped + checkpointing", True, True)]


def mixed_length_batch(model, vocab: int, n: int, min_len: int, max_len: int, seed: int) -> list[PolicySequence]:
    """``n`` random-token sequences with seeded lengths in [min_len, max_len]; the last 30% of each
    is scored, with old log-probs teacher-forced by ``model`` (so the GRPO ratio starts at 1)."""
    r = rng("bench-update-batch", seed)
    lengths = r.integers(min_len, max_len + 1, size=n).tolist()
    ids = [r.integers(0, vocab, size=length).tolist() for length in lengths]
    starts = [max(1, int(length * 0.7)) for length in lengths]
    old = reference_logprobs(model, ids, starts, batch_size=1)
    return [PolicySequence(seq, [0] * s + [1] * (len(seq) - s), [0.0] * s + lp) for seq, s, lp in zip(ids, starts, old)]


def run_update_options(profile: str, seed: int, n: int, lengths: tuple[int, int], micro_batch: int,
                       repeats: int) -> dict:
    """One GRPO update per repeat under each of UPDATE_SETTINGS, on one batch; seconds, padding, memory."""
    cfg = load_profile(profile, seed=seed)
    model, tokenizer, _ = load_policy_model(cfg.models.agent, {"agent": None}, cfg.lora)
    policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})  # lr 0: every update sees the same weights
    if cfg.training.grpo.start_reference:  # the profile's KL term reads a start copy (a fresh adapter: the base model)
        policies.freeze_start_references()
    seqs = mixed_length_batch(model, model.get_input_embeddings().num_embeddings, n, *lengths, seed)
    advantages = rng("bench-update-adv", seed).choice([-1.0, 1.0], size=n).tolist()
    jobs = [UpdateJob("agent", seqs, advantages, 1.0)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cuda = torch.cuda.is_available()

    def update(grouped: bool, checkpointing: bool) -> dict:
        settings = replace(cfg.training.update_settings(recompute_old=False), micro_batch=micro_batch, minibatches=1,
                           length_grouped=grouped, gradient_checkpointing=checkpointing)
        return grpo_update(policies, "agent", jobs, settings, pad_id=pad_id)

    shortest = sorted(range(n), key=lambda i: len(seqs[i].ids))[:2]  # warm-up: first-call allocations, not timed
    grpo_update(policies, "agent", [UpdateJob("agent", [seqs[i] for i in shortest], [1.0, -1.0], 1.0)],
                UpdateSettings(cfg.training.grpo, micro_batch=2), pad_id=pad_id)
    rows = []
    for setting, grouped, checkpointing in UPDATE_SETTINGS:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            stats = update(grouped, checkpointing)
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        rows.append({"setting": setting, "length_grouped": grouped, "gradient_checkpointing": checkpointing,
                     "update_s": float(np.median(seconds)), "update_s_all": [round(x, 3) for x in seconds],
                     "pad_frac": stats["agent_pad_frac"], "logp_drift_mean": stats["agent_logp_drift_mean"],
                     "grad_norm": stats["grad_norm"],
                     "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None})
    return {"model": cfg.models.agent, "device": str(next(model.parameters()).device),
            "dtype": str(next(model.parameters()).dtype), "n_sequences": n,
            "lengths": [len(s.ids) for s in seqs], "micro_batch": micro_batch, "repeats": repeats, "rows": rows}


def report_update_options(args) -> None:
    lengths = tuple(int(x) for x in args.update_lengths.split(","))
    if len(lengths) != 2 or not 2 <= lengths[0] <= lengths[1]:
        sys.exit(f"--update-lengths must be MIN,MAX with 2 <= MIN <= MAX, got {args.update_lengths!r}")
    result = run_update_options(args.profile, args.seed, args.update_seqs, lengths, args.update_micro_batch,
                                args.repeats)
    table = pd.DataFrame(result["rows"]).set_index("setting")
    pd.set_option("display.width", 200)
    print(f"profile={args.profile} model={result['model']} device={result['device']} dtype={result['dtype']} "
          f"sequences={result['n_sequences']} (lengths {min(result['lengths'])}-{max(result['lengths'])}, "
          f"{sum(result['lengths'])} tokens) micro_batch={result['micro_batch']} repeats={result['repeats']} "
          f"cpu_threads={torch.get_num_threads()}")
    shown = ["update_s", "update_s_all", "pad_frac", "logp_drift_mean", "grad_norm", "cuda_peak_mb"]
    print(table[shown].to_string(float_format=lambda x: f"{x:.4g}"))
    in_order, grouped, checkpointed = (table.loc[name] for name, _, _ in UPDATE_SETTINGS)
    ratios = {"grouped / in order (seconds)": grouped["update_s"] / in_order["update_s"],
              "grouped / in order (pad_frac)": grouped["pad_frac"] / in_order["pad_frac"] if in_order["pad_frac"] else None,
              "checkpointing / none (seconds)": checkpointed["update_s"] / grouped["update_s"]}
    if result["rows"][0]["cuda_peak_mb"] is not None:
        ratios["checkpointing / none (CUDA peak)"] = checkpointed["cuda_peak_mb"] / grouped["cuda_peak_mb"]
    print("\nratios:")
    for name, value in ratios.items():
        print(f"  {name}: {'n/a' if value is None else f'{value:.2f}'}")
    out = run_dir(args.profile) / "bench"
    write_table(table.reset_index().drop(columns=["update_s_all"]), out / "train_update_options.csv")
    write_json({**result, "ratios": ratios, "environment": environment_snapshot()}, out / "train_update_options.json")
    print(f"\nwrote {out / 'train_update_options'}.csv and .json")


def _launch_one(args, method: str, nproc: int) -> dict:
    """``--one method`` in a fresh process (``nproc`` 1) or as ``nproc`` torchrun ranks; rank 0's JSON."""
    one = [__file__, "--profile", args.profile, "--steps", str(args.steps), "--seed", str(args.seed),
           "--micro-batch", str(args.micro_batch), "--one", method]
    cmd = [sys.executable, *one] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *one, "--dp"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        sys.exit(f"{method} on {nproc} rank(s) failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def report_data_parallel(args) -> None:
    """Each method on 1 rank and on ``args.nproc`` ranks, side by side: step times, speed-up, equal records."""
    cfg = load_profile(args.profile, seed=args.seed)
    warm_start(cfg, build_retriever(cfg, progress=False), progress=False)  # cached before the ranks read it
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    rows, summary = [], {"profile": args.profile, "steps": args.steps, "nproc": args.nproc, "methods": {}}
    for method in methods:
        runs = {n: _launch_one(args, method, n) for n in (1, args.nproc)}
        for n, r in runs.items():
            rows += [{"method": method, "ranks": n, **{k: rec.get(k) for k in ["step", *PHASES, *COUNTS]},
                      "peak_rss_mb_rank0": r["peak_rss_mb"]} for rec in r["records"]]
        same = all(a.get(k) == b.get(k) for a, b in zip(runs[1]["records"], runs[args.nproc]["records"]) for k in COUNTS)
        step = {n: float(np.mean([rec["time/step_s"] for rec in r["records"]])) for n, r in runs.items()}
        summary["methods"][method] = {"step_s": step, "speedup": round(step[1] / step[args.nproc], 2),
                                      "same_counts_and_rewards": same}
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    print(f"profile={args.profile} steps={args.steps} seed={args.seed}: 1 rank vs {args.nproc} ranks (torch threads: "
          f"default on 1 rank, 1 per rank on {args.nproc}; {torch.get_num_threads()} cores seen here)")
    print(table.round(2).to_string(index=False))
    for method, m in summary["methods"].items():
        print(f"{method}: mean step {m['step_s'][1]:.1f} s on 1 rank, {m['step_s'][args.nproc]:.1f} s on {args.nproc} "
              f"ranks: {m['speedup']}x; counts and rewards equal: {m['same_counts_and_rewards']}")
    out = run_dir(args.profile) / "bench"
    write_table(table, out / "train_step_dp.csv")
    write_json({**summary, "environment": environment_snapshot()}, out / "train_step_dp.json")
    print(f"\nwrote {out / 'train_step_dp'}.csv and .json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--methods", default="search_r1,cosearch", help="comma-separated; the first is the baseline")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--micro-batch", type=int, default=0, help="override training.micro_batch (0: the profile's)")
    ap.add_argument("--updates", action="store_true",
                    help="time the update options side by side (micro-batch grouping, gradient checkpointing)")
    ap.add_argument("--update-seqs", type=int, default=8, help="--updates: sequences in the batch")
    ap.add_argument("--update-lengths", default="32,256", help="--updates: MIN,MAX sequence length in tokens")
    ap.add_argument("--update-micro-batch", type=int, default=4, help="--updates: sequences per micro-batch")
    ap.add_argument("--repeats", type=int, default=2, help="--updates: timed updates per setting (median)")
    ap.add_argument("--threads", type=int, default=0,
                    help="--updates: torch CPU threads (0: torch's default; 1 when other jobs share the cores, "
                         "whose contention makes multi-threaded CPU kernels stall)")
    ap.add_argument("--nproc", type=int, default=0, help="also run each method as this many data-parallel ranks (torchrun)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one method, print JSON
    ap.add_argument("--dp", action="store_true", help=argparse.SUPPRESS)  # internal: --one as a torchrun rank
    args = ap.parse_args()
    if args.updates:
        if args.threads:
            torch.set_num_threads(args.threads)
        report_update_options(args)
        return
    if args.one:
        dp = DataParallel.from_environment() if args.dp else None
        result = run_one(args.profile, args.one, args.steps, args.seed, args.micro_batch or None, dp=dp)
        if dp is None or dp.is_main:
            print("RESULT " + json.dumps(result, default=str))
        if dp is not None:
            dp.close()
        return
    if args.nproc > 1:
        report_data_parallel(args)
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
