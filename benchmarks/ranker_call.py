"""What one generative-ranker call costs on this machine's engine, by N and engine dtype.

Why: the ranker reads N candidate passages per search; its prompt grows with N, and on a CPU the
prefill is the cost of a call. This renders real ranker prompts (the profile's protocol and chat
template, N passages drawn from the profile's corpus) and times ``VLLMBackend.generate`` on them,
greedy, 64 new tokens, two prompts per N. It prints N, the prompt's tokens and the seconds.

    python benchmarks/ranker_call.py --profile paper_mini --dtype float32      # ~2 min on 2 cores
    python benchmarks/ranker_call.py --profile paper_mini --dtype bfloat16 --n 50 10

Needs vLLM (make install-vllm) and the profile's data (paper_mini: `make test-paper` downloads it).
Writes ``papermill_runs/bench/ranker_call.csv``. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.agent.chat_tokens import ChatTokens  # noqa: E402
from cosearch_lib.agent.prompts import ranker_messages  # noqa: E402
from cosearch_lib.config import SamplingConfig, load_profile  # noqa: E402
from cosearch_lib.experiment.building import vllm_options  # noqa: E402
from cosearch_lib.experiment.preflight import corpus_sample  # noqa: E402
from cosearch_lib.models.generation.vllm_backend import VLLMBackend  # noqa: E402
from cosearch_lib.paths import project_root  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="paper_mini")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--n", type=int, nargs="+", default=[50, 20, 10], help="candidates per prompt")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = load_profile(args.profile)
    cfg.models.vllm.dtype = args.dtype
    engine = VLLMBackend.shared(cfg.models.ranker, **vllm_options(cfg))
    chat = ChatTokens(engine.tokenizer)
    sample, rng, rows = corpus_sample(cfg), random.Random(0), []
    for n in args.n:
        for _ in range(args.repeats):
            msgs = ranker_messages("who founded the town?", "town founder", rng.sample(sample, n), cfg.search.topk, cfg.protocol)
            ids = chat.prompt_ids(msgs)
            t0 = time.perf_counter()
            engine.generate([ids], SamplingConfig(temperature=0.0, max_new_tokens=64, seed=0))
            rows.append({"n": n, "prompt_tokens": len(ids), "dtype": args.dtype, "seconds": round(time.perf_counter() - t0, 2)})
            print(f"N={n:<3} {len(ids):>6} tokens  {rows[-1]['seconds']:>6.2f} s  ({args.dtype})", flush=True)
    out = project_root() / "papermill_runs" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "ranker_call.csv", index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
