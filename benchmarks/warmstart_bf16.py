"""The warm start in float32 and under bf16 autocast (``warmstart.autocast``), side by side: what it buys
and what it changes (issue 48, item 5; ``make demo``'s largest stage).

It builds the profile's gold sequences (the first ``--agent`` agent trajectories and ``--ranker``
rankings, as the warm start builds them), then trains each role's LoRA adapter from the same model and
seed with the profile's settings (one epoch over those sequences), in float32 and in the Trainer's bf16
mixed precision (accelerate's torch.autocast around each forward; LoRA weights and AdamW in float32),
``--repeats`` times each in ABBA order (float32, bf16, bf16, float32, ...) so that a drift of the machine
falls on both. It prints per role and precision the training loop's seconds per sequence and per 1,000
tokens (the Trainer's ``train_runtime``: no model loading, LoRA wrapping or dataset building), their
ratio, and the SFT losses of both (first, last, mean over the logged steps; the largest per-step
difference between the two). Rows go to ``benchmarks/records/warmstart_bf16.csv`` with the CPU, the load
average at the start, the commit and whether the tree had uncommitted changes. Run it alone:

    python benchmarks/warmstart_bf16.py --profile demo --agent 8 --ranker 8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_record import append_rows, run_conditions  # noqa: E402
from cosearch_lib import experiment  # noqa: E402
from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.experiment.cached_starts import gold_data, policy_model_names  # noqa: E402
from cosearch_lib.models.autocast import cpu_bf16_instructions  # noqa: E402
from cosearch_lib.models.registry import load_causal_lm  # noqa: E402
from cosearch_lib.rl.warm_start import train_sft  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "warmstart_bf16.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--agent", type=int, default=8, help="gold agent trajectories per precision")
    ap.add_argument("--ranker", type=int, default=8, help="gold rankings per precision")
    ap.add_argument("--repeats", type=int, default=1, help="ABBA pairs of runs per role")
    ap.add_argument("--record", default=str(RECORD))
    args = ap.parse_args()
    cfg = load_profile(args.profile).for_starts()
    ws = cfg.warmstart
    retriever = experiment.build_retriever(cfg, progress=False)
    names = policy_model_names(cfg)
    data, _ = gold_data(cfg, retriever, n_agent=args.agent, n_ranker=args.ranker)
    env, load, dirty = run_conditions()
    order = [p for _ in range(args.repeats) for p in ("float32", "bf16", "bf16", "float32")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for role in ("agent", "ranker"):
            if not data[role]:
                continue
            for run_i, precision in enumerate(order):
                model, tokenizer = load_causal_lm(names[role])
                # one epoch over these sequences, the profile's batch and accumulation, no warm-up to refuse
                run = replace(ws, epochs=1.0, warmup_ratio=0.0, logging_steps=1, autocast=precision == "bf16")
                summary = train_sft(model, tokenizer, data[role], run, cfg.lora, Path(tmp) / f"{role}_{run_i}",
                                    seed=cfg.seed, progress=False)
                rows.append({"profile": cfg.profile, "role": role, "precision": precision, "run": run_i,
                             "bf16_ran": summary["bf16"], "sequences": summary["n_sequences"], "tokens": summary["tokens"],
                             "train_s": summary["train_s"], "wall_s": summary["wall_s"],
                             "losses": [h["loss"] for h in summary["losses"]]})
    table = pd.DataFrame(rows)
    out = []
    for role, part in table.groupby("role", sort=False):
        by = {p: part[part["precision"] == p] for p in ("float32", "bf16")}
        losses = {p: pd.DataFrame(by[p]["losses"].tolist()).mean() for p in by}  # per logged step, over repeats
        gap = float((losses["float32"] - losses["bf16"]).abs().max())
        stats = {}
        for p, rows_p in by.items():
            train_s = rows_p["train_s"].mean()
            n, tokens = int(rows_p["sequences"].iloc[0]), int(rows_p["tokens"].iloc[0])
            stats[p] = {"s_per_sequence": train_s / n, "s_per_1k_tokens": 1000 * train_s / tokens,
                        "first_loss": losses[p].iloc[0], "last_loss": losses[p].iloc[-1], "mean_loss": losses[p].mean()}
            out.append({"profile": cfg.profile, "role": role, "precision": p, "bf16_ran": bool(rows_p["bf16_ran"].all()),
                        "runs": len(rows_p), "sequences": n, "tokens": tokens, "train_s": train_s,
                        "wall_s": rows_p["wall_s"].mean(), **stats[p], "max_step_loss_gap": gap,
                        "cpu_bf16": cpu_bf16_instructions() or "none", "threads": env.get("torch_threads"),
                        "loadavg_1min": round(load, 2), "git_sha": (env.get("git_sha") or "")[:7], "dirty": dirty})
        f32, b16 = stats["float32"], stats["bf16"]
        print(f"{role}: {n} sequences, {tokens} tokens, {len(by['bf16'])} runs each; training loop float32 "
              f"{f32['s_per_sequence']:.2f} s per sequence ({f32['s_per_1k_tokens']:.2f} per 1k tokens), bf16 "
              f"{b16['s_per_sequence']:.2f} ({b16['s_per_1k_tokens']:.2f}): {f32['s_per_sequence'] / b16['s_per_sequence']:.2f}x; "
              f"loss first/last/mean float32 {f32['first_loss']:.3f}/{f32['last_loss']:.3f}/{f32['mean_loss']:.3f}, "
              f"bf16 {b16['first_loss']:.3f}/{b16['last_loss']:.3f}/{b16['mean_loss']:.3f}; largest per-step "
              f"|loss difference| {gap:.3f}")
    print(f"load average at the start {load:.2f}; commit {(env.get('git_sha') or '')[:7]}"
          f"{' with uncommitted changes' if dirty else ''}")
    print(f"rows appended to {append_rows(pd.DataFrame(out), args.record)}")


if __name__ == "__main__":
    main()
