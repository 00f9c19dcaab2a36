"""Generated tokens/s of the batched TransformersBackend vs one prompt at a time.

Why: rollouts generate G = 8 samples for many questions per step; this measures what batching
(left padding, shared KV-cache forwards, finished rows dropped) buys over a per-prompt loop on the
same model. Both runs use the same seed and row keys, so they sample the same tokens (up to
floating-point effects) and the token counts match.

    python benchmarks/generation.py                       # SmolLM2-135M, 16 prompts, 32 new tokens
    python benchmarks/generation.py --prompts 32 --batch-size 32 --max-new-tokens 64

Prints a table and writes ``papermill_runs/bench/generation.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.backends import TransformersBackend
from cosearch_lib.models.registry import load_causal_lm
from cosearch_lib.paths import runs_dir

QUESTIONS = ["Who founded the town of Velmora?", "Which river flows through Castel Amaro?",
             "When was the Orrin Bridge built?", "What is the capital of the Duchy of Kest?",
             "Who wrote the Ballad of Tamsin Vale?", "Where was the painter Ilse Marrow born?",
             "Which company makes the Zephyr lamp?", "What language is spoken in Upper Dunmere?"]


def run(backend: TransformersBackend, prompts: list[list[int]], sampling: SamplingConfig) -> tuple[float, int]:
    keys = list(range(len(prompts)))
    start = time.perf_counter()
    gens = backend.generate(prompts, sampling, row_keys=keys)
    return time.perf_counter() - start, sum(len(g.token_ids) for g in gens)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=runs_dir() / "bench" / "generation.json")
    args = ap.parse_args(argv)

    model, tok = load_causal_lm(args.model)
    prompts = []
    for i in range(args.prompts):
        chat = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + f" (variant {i})"}]
        p = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        prompts.append(list(p["input_ids"]) if isinstance(p, dict) else list(p))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    run(TransformersBackend(model, tok, batch_size=args.batch_size), prompts[:2], sampling)  # warm-up

    batched_s, batched_n = run(TransformersBackend(model, tok, batch_size=args.batch_size), prompts, sampling)
    single_s, single_n = run(TransformersBackend(model, tok, batch_size=1), prompts, sampling)
    result = {
        "model": args.model, "device": str(next(model.parameters()).device), "dtype": str(model.dtype),
        "threads": torch.get_num_threads(), "machine": platform.machine(), "prompts": len(prompts),
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "batched_tokens": batched_n, "batched_s": batched_s, "batched_tok_per_s": batched_n / batched_s,
        "single_tokens": single_n, "single_s": single_s, "single_tok_per_s": single_n / single_s,
    }
    result["speedup"] = result["batched_tok_per_s"] / result["single_tok_per_s"]
    print(f"generation benchmark: {args.model} on {result['device']} ({result['threads']} threads), "
          f"{len(prompts)} prompts, up to {args.max_new_tokens} new tokens, temperature 1")
    print(f"  batched (batch_size={args.batch_size}): {batched_n:5d} tokens in {batched_s:6.1f} s = "
          f"{result['batched_tok_per_s']:7.1f} tok/s")
    print(f"  one prompt at a time:     {single_n:5d} tokens in {single_s:6.1f} s = "
          f"{result['single_tok_per_s']:7.1f} tok/s")
    print(f"  speedup: {result['speedup']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    return result


if __name__ == "__main__":
    main()
