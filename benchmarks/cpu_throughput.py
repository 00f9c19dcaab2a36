"""This machine's CPU throughputs for the job planner (``cosearch plan --gpus-per-node 0``).

What the planner multiplies a CPU profile's workload by (``cosearch_lib/planning/throughputs.py``),
measured with the library's own code on the bundled SmolLM2-135M with an r=16 LoRA adapter, float32:

* decode: ``TransformersBackend.generate`` with the adapter, rows 1, 4, 8, 16 and 32 on prompts of 300
  tokens, rows 1 and 8 on prompts of 1,200; a decode step's seconds are (time of 33 new tokens - time
  of 1) / 32, fitted as ``step_s + rows x (row_s + context x row_context_s)`` (least squares; each row
  reads its cache, so a step costs more the longer the rows' contexts);
* prefill: one forward pass (no gradient) per 512-token sequence, tokens/s;
* train: the library's ``grpo_update`` on 4 random sequences of 768 tokens (the last 30% scored), a
  micro-batch of 1 (the CPU profiles'), no KL term: forward, backward and optimizer step, tokens/s;
* judge: ``LLMJudgeScorer.scores`` over 10 candidates' short prompts (~60 tokens), batched, without and
  with the backward of the margins (the scoring ranker's calls and its GRPO update), tokens/s;
* encoder: the bundled MiniLM over 32-token queries, batch 16, tokens/s;
* search: a FAISS flat inner-product index of 200,000 x 384 vectors, 64 queries per call: index
  vectors x queries per second, scaled to 768 dimensions (x 384 / 768).

Each at ``--threads`` torch threads (default: 1 and 2; the planner takes the rank's ``cpus_per_task``).
Writes ``benchmarks/records/cpu_throughput.json`` (commit it: the planner reads it and
``tests/test_job_plan.py`` checks the planner against the committed run records with it):

    python benchmarks/cpu_throughput.py                  # ~4 min on 2 cores; run alone
    python benchmarks/cpu_throughput.py --threads 2 --bf16   # the bf16 autocast factors (avx512_bf16 or AMX)

``--bf16`` measures the policy's rates in float32 and under ``models.autocast.cpu_bf16`` side by side and
keeps their ratio per kind of work (``planning.throughputs.BF16_FACTORS``) in the record's thread entry:
the planner applies them to the float32 figures for a profile with ``training.autocast``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.atomic_io import write_json  # noqa: E402
from cosearch_lib.config import EncoderConfig, GRPOConfig, LoraSettings, SamplingConfig, UpdateSettings  # noqa: E402
from cosearch_lib.models.autocast import cpu_bf16, cpu_bf16_instructions  # noqa: E402
from cosearch_lib.models.generation.teacher_forced import reference_logprobs  # noqa: E402
from cosearch_lib.models.generation.transformers_backend import TransformersBackend  # noqa: E402
from cosearch_lib.models.llm_judge import LLMJudgeScorer  # noqa: E402
from cosearch_lib.models.lora_policies import (
    PolicySet,  # noqa: E402
    lora_model,  # noqa: E402
)
from cosearch_lib.models.registry import load_causal_lm  # noqa: E402
from cosearch_lib.paths import project_root  # noqa: E402
from cosearch_lib.records.provenance import cpu_model, environment_snapshot  # noqa: E402
from cosearch_lib.retrieval.encoder import TextEncoder  # noqa: E402
from cosearch_lib.rl.policy_sequences import PolicySequence  # noqa: E402
from cosearch_lib.rl.policy_update import UpdateJob, grpo_update  # noqa: E402

ROWS = (1, 4, 8, 16, 32)
#: The timed GRPO update: sequences and their length (the CPU profiles' trajectories are ~700 tokens).
UPDATE_SEQS, UPDATE_LEN = 4, 768
#: Candidates the timed judge call scores at once (the CPU profiles' N).
JUDGE_ROWS = 10
#: Prompt lengths of the decode measurements: rows ROWS at SHORT tokens, LONG_ROWS at LONG (the cost of context).
SHORT, LONG, LONG_ROWS = 300, 1200, (1, 8)
TEXT = ("The river Velm rises in the northern hills and flows past the old mill towns before it reaches the sea. "
        "Its bridges were built by the guilds of Castel Amaro in the years after the great flood. ")


def _prompts(tok, n: int, length: int) -> list[list[int]]:
    block = tok.encode(TEXT * 40)[:length - 12]
    return [block + tok.encode(f" Question {i}: who built bridge {i}?") for i in range(n)]


def _time(fn, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _judge_rates(model, tok) -> dict:
    """The LLM judge's scoring (``models.llm_judge.LLMJudgeScorer.scores``): one batched forward of a search's
    JUDGE_ROWS candidates' short prompts, without and with the backward of their margins; tokens/s."""
    judge = LLMJudgeScorer(model, tok, source="smollm2-135m-instruct")
    contents = [f"Guild {i}\n" + (TEXT * 2)[i:i + 200] for i in range(JUDGE_ROWS)]
    query = "who founded the bridge builders guild of castel amaro"
    tokens = sum(map(len, judge.prompt_ids(query, contents)))

    def forward() -> None:
        with torch.no_grad():
            judge.scores(query, contents)

    def train() -> None:
        judge.scores(query, contents).sum().backward()
        model.zero_grad(set_to_none=True)
    forward()
    train()
    return {"judge_prompt_tokens": tokens / JUDGE_ROWS, "judge_tps": tokens / _time(forward, repeats=3),
            "judge_train_tps": tokens / _time(train, repeats=3)}


def _policy_model(threads: int):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base, tok = load_causal_lm("smollm2-135m-instruct", device="cpu")
    model = lora_model(base, {"agent": None}, LoraSettings(r=16, alpha=32))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape) * 0.01)
    model.eval()
    return model, tok


def policy_rates(model, tok) -> dict:
    """The policy's decode fit, prefill, update and judge rates (the module's docstring), in the caller's
    precision (float32, or under ``models.autocast.cpu_bf16``)."""
    model.eval()
    step_times, points = [], []
    for rows, length in [(r, SHORT) for r in ROWS] + [(r, LONG) for r in LONG_ROWS]:
        prompts = _prompts(tok, rows, length)
        backend = TransformersBackend(model, tok, batch_size=rows)
        backend.eos_ids = frozenset({-1})  # every row to the full budget

        def gen(n: int, backend=backend, prompts=prompts) -> None:
            backend.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=n, seed=0), adapter="agent",
                             row_keys=list(range(len(prompts))))
        gen(2)  # warm-up
        step_times.append((_time(lambda: gen(33)) - _time(lambda: gen(1))) / 32)
        points.append((rows, length + 17))  # the mean context over the 33 new tokens
    # a decode step of b rows at mean context c: step_s + b x (row_s + c x row_context_s), least squares
    design = np.array([[1.0, b, b * c] for b, c in points])
    (intercept, slope, per_context), *_ = np.linalg.lstsq(design, np.array(step_times), rcond=None)
    seqs = [torch.tensor([p]) for p in _prompts(tok, 3, 512)]
    model.set_adapter("agent")

    def forward() -> None:
        with torch.no_grad():
            for s in seqs:
                model(input_ids=s)
    prefill_tps = 3 * 512 / _time(forward)

    # the update: the library's grpo_update (its loss, masks, optimizer step) on UPDATE_SEQS sequences of
    # UPDATE_LEN tokens, the last 30% scored, micro-batch 1, no KL term (a reference pass is a prefill)
    policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})  # lr 0: the same weights each time
    r = np.random.default_rng(0)
    vocab = model.get_input_embeddings().num_embeddings
    ids = [r.integers(0, vocab, size=UPDATE_LEN).tolist() for _ in range(UPDATE_SEQS)]
    start = int(UPDATE_LEN * 0.7)
    old = reference_logprobs(model, ids, [start] * UPDATE_SEQS, batch_size=1)
    batch = [PolicySequence(x, [0] * start + [1] * (UPDATE_LEN - start), [0.0] * start + lp) for x, lp in zip(ids, old)]
    job = [UpdateJob("agent", batch, [1.0, -1.0] * (UPDATE_SEQS // 2), 1.0)]
    settings = replace(UpdateSettings(replace(GRPOConfig(), kl_coef=0.0), micro_batch=1), shared_prefix=False)

    def train() -> None:
        grpo_update(policies, "agent", job, settings, pad_id=0)
    train()  # warm-up
    train_tps = UPDATE_SEQS * UPDATE_LEN / _time(train)
    model.eval()
    return {"decode_step_s": float(intercept), "decode_row_s": float(slope), "decode_row_context_s": float(per_context),
            "decode_rows": list(ROWS), "decode_points": [list(p) for p in points],
            "decode_step_s_measured": [round(t, 5) for t in step_times],
            "prefill_tps": prefill_tps, "train_tps": train_tps, **_judge_rates(model, tok)}


def bf16_factors(threads: int) -> dict:
    """The policy's speed-up under CPU bf16 autocast per kind of work (``planning.throughputs.BF16_FACTORS``):
    :func:`policy_rates` in float32, then under ``cpu_bf16``, side by side in one process."""
    model, tok = _policy_model(threads)
    f32 = policy_rates(model, tok)
    with cpu_bf16(True):
        b16 = policy_rates(model, tok)
    decode = sum(f32["decode_step_s_measured"]) / sum(b16["decode_step_s_measured"])  # the same points
    factors = {"decode": decode, **{k: b16[f"{k}_tps"] / f32[f"{k}_tps"] for k in ("prefill", "train", "judge", "judge_train")}}
    return {"factors": factors, "instructions": cpu_bf16_instructions(), "float32": f32, "bf16": b16}


def measure(threads: int) -> dict:
    model, tok = _policy_model(threads)
    rates = policy_rates(model, tok)
    enc = TextEncoder(EncoderConfig(model="all-minilm-l6-v2", batch_size=16))
    queries = [f"who built the bridge over river number {i} in castel amaro" for i in range(256)]
    n_tokens = sum(len(enc.tokenizer.encode(q)) for q in queries)
    encoder_tps = n_tokens / _time(lambda: enc.encode_queries(queries))
    import faiss
    faiss.omp_set_num_threads(threads)
    rng = np.random.default_rng(0)
    index = faiss.IndexFlatIP(384)
    index.add(rng.standard_normal((200_000, 384), dtype=np.float32))
    q = rng.standard_normal((64, 384), dtype=np.float32)
    search_s = _time(lambda: index.search(q, 10), repeats=3)
    return {"policies": {"SmolLM2-135M": rates},
            "encoder_tps": encoder_tps, "search_vectors_per_s": 200_000 * 64 / search_s * 384 / 768}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default=str(project_root() / "benchmarks" / "records" / "cpu_throughput.json"))
    ap.add_argument("--keep", action="store_true", help="keep the record's other thread counts")
    ap.add_argument("--bf16", action="store_true",
                    help="measure only the bf16 autocast factors (float32 and bf16 side by side) into the record's thread "
                         "counts, keeping its other figures; needs a CPU with avx512_bf16 or AMX")
    args = ap.parse_args(argv)
    if args.bf16:
        return _write_bf16(args)
    env = environment_snapshot()
    record = {"cpu": cpu_model(), "git_sha": env.get("git_sha", ""), "time": env.get("time", ""), "by_threads": {}}
    earlier = json.loads(Path(args.out).read_text()).get("by_threads", {}) if Path(args.out).exists() else {}
    if args.keep:  # thread counts not measured now keep their figures
        record["by_threads"] = earlier
    for threads in args.threads:
        record["by_threads"][str(threads)] = measure(threads)
        if "bf16" in earlier.get(str(threads), {}):  # the bf16 factors (ratios, with their own provenance) stay
            record["by_threads"][str(threads)]["bf16"] = earlier[str(threads)]["bf16"]
        r = record["by_threads"][str(threads)]
        p = r["policies"]["SmolLM2-135M"]
        print(f"{threads} thread(s): decode step {p['decode_step_s'] * 1e3:.1f} ms + {p['decode_row_s'] * 1e3:.2f} ms/row "
              f"+ {p['decode_row_context_s'] * 1e6:.2f} us/row/context token "
              f"(measured {p['decode_step_s_measured']}), prefill {p['prefill_tps']:,.0f} tok/s, train {p['train_tps']:,.0f} tok/s, "
              f"encoder {r['encoder_tps']:,.0f} tok/s, search {r['search_vectors_per_s']:.3g} vectors/s", flush=True)
    write_json(record, args.out)
    print(f"wrote {args.out}")


def _write_bf16(args: argparse.Namespace) -> None:
    if cpu_bf16_instructions() is None:
        raise SystemExit("this CPU has no avx512_bf16 or AMX instructions: bf16 autocast runs in software here "
                         "(6-18x slower, docs/LOG.md), so there is no factor worth planning with")
    out = Path(args.out)
    if not out.exists():
        raise SystemExit(f"no record at {out}: run python benchmarks/cpu_throughput.py first (the float32 figures)")
    record = json.loads(out.read_text())
    env = environment_snapshot()
    missing = [t for t in args.threads if str(t) not in record.get("by_threads", {})]
    if missing:
        raise SystemExit(f"the record has no float32 figures at {missing} thread(s): measure them first")
    for threads in args.threads:
        measured = bf16_factors(threads)
        f = measured["factors"]
        record["by_threads"][str(threads)]["bf16"] = {
            "factors": f, "instructions": measured["instructions"], "cpu": cpu_model(), "git_sha": env.get("git_sha", ""),
            "time": env.get("time", ""), "float32": measured["float32"], "bf16": measured["bf16"]}
        print(f"{threads} thread(s), bf16 autocast / float32 ({measured['instructions']}): "
              + ", ".join(f"{k} {v:.2f}x" for k, v in f.items()), flush=True)
    write_json(record, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
