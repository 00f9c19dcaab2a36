"""vLLM's CPU LoRA ops against cosearch_lib's grouped ones, side by side on the same inputs.

Why: on CPU, vLLM applies LoRA with ops that copy the adapter's weights once per token and
contract them with an einsum; ``cosearch_lib.models.generation.cpu_lora_ops`` multiplies the
tokens of each adapter slot by its matrix once. This times one prefill's worth of each op for
SmolLM2-135M's shapes (hidden 576, MLP 1,536, LoRA rank 16) at a ranker prompt's length, and
prints seconds per call and the ratio.

    python benchmarks/cpu_lora_ops.py                  # 7,000 tokens, bf16, ~1 min on 2 cores
    python benchmarks/cpu_lora_ops.py --tokens 2048 --dtype float32

Writes ``papermill_runs/bench/cpu_lora_ops.csv``. Needs vLLM (make install-vllm). Run it on an
idle machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.models.generation import cpu_lora_ops  # noqa: E402
from cosearch_lib.paths import project_root  # noqa: E402


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=7000, help="tokens in the prefill (a ranker prompt of N = 50 is ~7,000)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from vllm.lora.ops.torch_ops import lora_ops as upstream  # before any install: vLLM's own functions

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    t, r = args.tokens, args.rank
    idx = torch.ones(t, dtype=torch.long)  # every token on one adapter (slot 1 of 3), as in a rollout batch
    rows = []
    for name, d_in, d_out in (("expand_slice 16->1536 (gate/up)", r, 1536), ("expand_slice 16->576 (q/o)", r, 576),
                              ("shrink 576->16", 576, r), ("shrink 1536->16 (down)", 1536, r)):
        x = torch.randn(t, d_in, generator=gen).to(dtype)
        w = torch.randn(3, 1, d_out, d_in, generator=gen).to(dtype)
        if name.startswith("expand"):
            out = torch.zeros(t, 2 * d_out, dtype=dtype)
            calls = {"vllm": partial(upstream.bgmv_expand_slice, x, w, out, idx, d_out, d_out, True),
                     "grouped": partial(cpu_lora_ops.bgmv_expand_slice, x, w, out, idx, d_out, d_out, True)}
        else:
            out = torch.zeros(t, d_out, dtype=dtype)
            calls = {"vllm": partial(upstream.bgmv_shrink, x, w, out, idx, 1.0),
                     "grouped": partial(cpu_lora_ops.bgmv_shrink, x, w, out, idx, 1.0)}
        secs = {k: _time(fn, args.repeats) for k, fn in calls.items()}
        rows.append({"op": name, "tokens": t, "dtype": args.dtype, "vllm_s": round(secs["vllm"], 4),
                     "grouped_s": round(secs["grouped"], 4), "speedup": round(secs["vllm"] / secs["grouped"], 2)})
        print(f"{name:<34} vLLM {secs['vllm']:.3f} s   grouped {secs['grouped']:.3f} s   x{rows[-1]['speedup']}", flush=True)
    out_dir = project_root() / "papermill_runs" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out_dir / "cpu_lora_ops.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
