"""How much can batching buy on this device? The bare model's decode and prefill throughput by batch size.

Why: the rollout engine's speed-up over a one-trajectory-at-a-time loop is bounded by how much
faster the model itself runs per row when rows share a forward pass. On a GPU a decode step costs
almost the same at batch 1 and batch 64 (the weights are read once, the arithmetic is idle); on a
few CPU cores the arithmetic is already the bottleneck at small batches, so the bound is low. This
measures that bound with nothing of the library in the way: plain ``model(...)`` calls with a
``DynamicCache``, greedy, no sampling, no stop strings.

For each batch size b: one prefill of ``--prompt-tokens`` tokens per row (timed), then
``--decode-steps`` single-token steps on top of that cache (timed). It prints, per b, the
per-row tokens/s and its ratio to b = 1: a batched engine cannot beat the one-at-a-time loop by
more than the decode ratio while generating, nor by more than the prefill ratio while reading.

    python benchmarks/batch_ceiling.py                      # bundled SmolLM2-135M, CPU, ~2 min on 2 cores
    python benchmarks/batch_ceiling.py --batch-sizes 1,8,64 --device cuda --dtype bfloat16

Writes ``papermill_runs/bench/batch_ceiling.{json,csv}``. Run on an idle machine: two torch
processes on the same cores distort every figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.models.registry import load_causal_lm
from cosearch_lib.paths import runs_dir
from cosearch_lib.records.provenance import environment_snapshot


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def measure(model, batch: int, prompt_tokens: int, decode_steps: int, device: torch.device, repeats: int) -> dict:
    """Best-of-``repeats`` seconds of one prefill and of ``decode_steps`` decode steps at ``batch`` rows."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(100, vocab - 1, (batch, prompt_tokens), generator=gen).to(device)
    best_prefill = best_decode = float("inf")
    for _ in range(repeats):
        cache = DynamicCache()
        _sync(device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        _sync(device)
        t1 = time.perf_counter()
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(decode_steps):
            out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(device)
        t2 = time.perf_counter()
        best_prefill, best_decode = min(best_prefill, t1 - t0), min(best_decode, t2 - t1)
    return {"batch": batch, "prefill_s": best_prefill, "decode_s": best_decode,
            "prefill_tok_s": batch * prompt_tokens / best_prefill, "decode_tok_s": batch * decode_steps / best_decode}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a registry model (default: the bundled SmolLM2-135M)")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=640, help="a ranker prompt of the demo is ~660 tokens")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, _ = load_causal_lm(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    rows = []
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        row = measure(model, b, args.prompt_tokens, args.decode_steps, device, args.repeats)
        rows.append(row)
        print(f"batch {b:4d}: prefill {row['prefill_tok_s']:9.0f} tok/s  decode {row['decode_tok_s']:8.1f} tok/s", flush=True)
    table = pd.DataFrame(rows)
    base = table.iloc[0]
    table["prefill_vs_first"] = table["prefill_tok_s"] / base["prefill_tok_s"]
    table["decode_vs_first"] = table["decode_tok_s"] / base["decode_tok_s"]
    print(table.round(3).to_string(index=False))
    print(f"=> at batch {int(table.iloc[-1]['batch'])}, batching can make decoding at most "
          f"{table.iloc[-1]['decode_vs_first']:.2f}x and reading prompts at most {table.iloc[-1]['prefill_vs_first']:.2f}x "
          f"faster per row than batch {int(base['batch'])} on this device")
    out = runs_dir() / "bench"
    write_table(table, out / "batch_ceiling.csv")
    write_json({"args": vars(args), "environment": environment_snapshot(), "rows": table.to_dict(orient="records")},
               out / "batch_ceiling.json")
    return table


if __name__ == "__main__":
    main()
