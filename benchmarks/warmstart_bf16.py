"""The warm start in float32 and under bf16 autocast (``warmstart.autocast``), side by side: what it buys
and what it changes (issue 48, item 5; ``make demo``'s largest stage).

It builds the profile's gold sequences (the first ``--agent`` agent trajectories and ``--ranker``
rankings, as the warm start builds them), then trains each role's LoRA adapter twice from the same
model and seed with the profile's settings (one epoch over those sequences): float32, then the
Trainer's bf16 mixed precision (torch.autocast around each forward; LoRA weights and AdamW in float32).
It prints per role and precision the seconds per sequence and per 1,000 tokens, the ratio, and the
SFT losses of both (first, last, mean over the logged steps; the largest per-step difference). Rows go
to ``benchmarks/records/warmstart_bf16.csv`` with the CPU and the commit. Run it alone:

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

from cosearch_lib import experiment  # noqa: E402
from cosearch_lib.agent.chat_tokens import ChatTokens  # noqa: E402
from cosearch_lib.atomic_io import write_table  # noqa: E402
from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.data.qa_formats import load_qa  # noqa: E402
from cosearch_lib.models.autocast import cpu_bf16_instructions  # noqa: E402
from cosearch_lib.models.registry import load_causal_lm, load_tokenizer  # noqa: E402
from cosearch_lib.records.provenance import environment_snapshot  # noqa: E402
from cosearch_lib.retrieval.artifacts import corpus_paths  # noqa: E402
from cosearch_lib.rl.warm_start import build_gold_data, train_sft  # noqa: E402

RECORD = Path("benchmarks/records/warmstart_bf16.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--agent", type=int, default=8, help="gold agent trajectories per precision")
    ap.add_argument("--ranker", type=int, default=8, help="gold rankings per precision")
    ap.add_argument("--record", default=str(RECORD))
    args = ap.parse_args()
    cfg = load_profile(args.profile).for_starts()
    ws = cfg.warmstart
    retriever = experiment.build_retriever(cfg, progress=False)
    names = {"agent": cfg.models.agent, "ranker": cfg.models.ranker}
    chats = {role: ChatTokens(load_tokenizer(name)) for role, name in names.items()}
    data, _ = build_gold_data(load_qa(corpus_paths(cfg).qa[ws.split]), retriever, chats["agent"], cfg.protocol,
                              topn=cfg.search.topn, n_agent=args.agent, n_ranker=args.ranker, seed=cfg.seed,
                              balance_hops=ws.balance_hops, reasoning=ws.reasoning, ranker_chat=chats["ranker"],
                              ranker_candidates=ws.ranker_candidates)
    env = environment_snapshot()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for role in ("agent", "ranker"):
            if not data[role]:
                continue
            for precision, autocast in (("float32", None), ("bf16", True)):
                model, tokenizer = load_causal_lm(names[role])
                # one epoch over these sequences, the profile's batch and accumulation, no warm-up to refuse
                run = replace(ws, epochs=1.0, warmup_ratio=0.0, logging_steps=1, autocast=autocast)
                summary = train_sft(model, tokenizer, data[role], run, cfg.lora, Path(tmp) / f"{role}_{precision}",
                                    seed=cfg.seed, progress=False)
                losses = [h["loss"] for h in summary["losses"]]
                rows.append({"profile": cfg.profile, "role": role, "precision": precision, "bf16_ran": summary["bf16"],
                             "sequences": summary["n_sequences"], "tokens": summary["tokens"], "wall_s": summary["wall_s"],
                             "s_per_sequence": summary["wall_s"] / summary["n_sequences"],
                             "s_per_1k_tokens": 1000 * summary["wall_s"] / summary["tokens"],
                             "first_loss": losses[0], "last_loss": losses[-1], "mean_loss": sum(losses) / len(losses),
                             "losses": losses, "cpu_bf16": cpu_bf16_instructions() or "none",
                             "threads": env.get("torch_threads"), "git_sha": (env.get("git_sha") or "")[:7]})
    table = pd.DataFrame(rows)
    for role, part in table.groupby("role", sort=False):
        f32, b16 = part.set_index("precision").loc["float32"], part.set_index("precision").loc["bf16"]
        gap = max(abs(a - b) for a, b in zip(f32["losses"], b16["losses"]))
        print(f"{role}: {f32['sequences']} sequences, {f32['tokens']} tokens; float32 {f32['s_per_1k_tokens']:.2f} s "
              f"per 1k tokens, bf16 {b16['s_per_1k_tokens']:.2f} (ran in bf16: {b16['bf16_ran']}): "
              f"{f32['wall_s'] / b16['wall_s']:.2f}x; loss first/last/mean float32 {f32['first_loss']:.3f}/"
              f"{f32['last_loss']:.3f}/{f32['mean_loss']:.3f}, bf16 {b16['first_loss']:.3f}/{b16['last_loss']:.3f}/"
              f"{b16['mean_loss']:.3f}; largest per-step |loss difference| {gap:.3f}")
    record = Path(args.record)
    record.parent.mkdir(parents=True, exist_ok=True)
    out = table.drop(columns=["losses"])
    if record.exists():
        out = pd.concat([pd.read_csv(record), out], ignore_index=True)
    write_table(out, record)
    print(f"rows appended to {record}")


if __name__ == "__main__":
    main()
