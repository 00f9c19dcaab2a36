"""What bfloat16 autocast would buy on this CPU, and what it would change: SmolLM2-135M in float32
(every profile's CPU dtype, ``models.registry.load_causal_lm``) against ``torch.autocast("cpu",
bfloat16)``, side by side in one process.

Why (issue 37): every stage of ``make demo`` is compute-bound on 2 cores (the warm start runs near
the float32 matmul peak), so no scheduling change brings it from ~22 to 15 minutes. CPUs with
AMX (``lscpu``: ``amx_bf16``) multiply bfloat16 matrices several times faster than float32 ones.
This measures the real model, not a lone matmul:

* a prefill of 8 prompts x 600 tokens (the shape of an evaluation batch), no gradient;
* one forward + backward of a 790-token sequence (a demo warm-start sequence; every weight
  trainable, an upper bound on the LoRA update's cost);
* the rollout's own loop (``TransformersBackend.generate``, sampling at temperature 1): 16 prompts of
  600-750 tokens sharing a 450-token prefix (the agent's instructions), first one new token (the
  prefill), then 64 (the decode's milliseconds per token are the difference over the extra tokens);
* the numerics: the largest |log p| difference on float32's argmax tokens, and how often the
  argmax agrees, over the prefill's positions (random token ids: a harsh case); and the cosine
  between the two modes' gradients of the 790-token loss (every weight), with their norm ratio.

    python benchmarks/bf16_autocast.py              # 2 threads, ~2 min
    python benchmarks/bf16_autocast.py --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.registry import load_causal_lm


def timed(fn, repeats: int = 2) -> float:
    fn()  # warm-up: first-call allocations and oneDNN kernel selection
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(args.model, device="cpu")
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 20000, (8, 600), generator=gen)
    sequence = torch.randint(100, 20000, (1, 790), generator=gen)

    def prefill():
        with torch.no_grad():
            return model(prompts).logits

    def train_step():
        model.train()
        model(sequence, labels=sequence).loss.backward()
        model.zero_grad(set_to_none=True)
        model.eval()

    modes = {"float32": contextlib.nullcontext, "bf16 autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
    rows = []
    for name, fn in (("prefill 8 x 600 tokens", prefill), ("forward + backward, 790 tokens", train_step)):
        secs = {}
        for mode, ctx in modes.items():
            with ctx():
                secs[mode] = timed(fn)
        rows.append((name, secs["float32"], secs["bf16 autocast"]))
    shared = torch.randint(100, 20000, (450,), generator=gen).tolist()
    rollout_prompts = [shared + torch.randint(100, 20000, (150 + 10 * i,), generator=gen).tolist() for i in range(16)]
    backend = TransformersBackend(model, tokenizer, batch_size=16)

    def generate(new_tokens: int) -> tuple[float, int]:
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, seed=1)
        t0 = time.perf_counter()
        out = backend.generate(rollout_prompts, sampling)
        return time.perf_counter() - t0, sum(len(g.token_ids) for g in out)

    loop = {}
    for mode, ctx in modes.items():
        with ctx():
            generate(2)  # warm-up
            prefill_s, _ = generate(1)
            total_s, n_tokens = generate(64)
        loop[mode] = (prefill_s, (total_s - prefill_s) / max(n_tokens - len(rollout_prompts), 1) * 1000)
    print(f"{args.model}, {args.threads} thread(s)")
    print(f"{'':32s} {'float32':>9s} {'bf16':>9s} {'ratio':>7s}")
    for name, a, b in rows:
        print(f"{name:32s} {a:8.2f}s {b:8.2f}s {a / b:6.2f}x")
    (p32, d32), (p16, d16) = loop["float32"], loop["bf16 autocast"]
    print(f"{'rollout loop: prefill, 16 rows':32s} {p32:8.2f}s {p16:8.2f}s {p32 / p16:6.2f}x")
    print(f"{'rollout loop: decode per token':32s} {d32:7.1f}ms {d16:7.1f}ms {d32 / d16:6.2f}x")
    with torch.no_grad():
        exact = torch.log_softmax(model(prompts).logits.float(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = torch.log_softmax(model(prompts).logits.float(), -1)
    grads = {}
    for mode, ctx in modes.items():  # the update's numerics: the same loss's gradient in both modes
        model.zero_grad(set_to_none=True)
        with ctx():
            model(sequence, labels=sequence).loss.backward()
        grads[mode] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    g32, g16 = grads["float32"], grads["bf16 autocast"]
    cosine = torch.nn.functional.cosine_similarity(g32, g16, dim=0).item()
    print(f"gradient of the 790-token loss, bf16 against float32: cosine {cosine:.4f}, "
          f"norm ratio {(g16.norm() / g32.norm()).item():.4f}")
    top = exact.argmax(-1, keepdim=True)
    drift = (exact.gather(-1, top) - low.gather(-1, top)).abs()
    agree = (low.argmax(-1, keepdim=True) == top).float().mean()
    print(f"max |log p float32 - log p bf16| on float32's argmax tokens: {drift.max().item():.3f} "
          f"(mean {drift.mean().item():.4f}); argmax agreement {agree.item():.3f}")


if __name__ == "__main__":
    main()
