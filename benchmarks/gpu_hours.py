"""GPU-hours per grid cell at paper scale, estimated from GPU throughputs measured on one H100.

No GPU is needed to run this: it multiplies a workload (the ``paper`` profile's settings and the
paper's measured behaviour, each an argument) by throughputs measured on one H100 80 GB in bf16 with
random weights of Qwen2.5-7B's architecture (cost does not depend on the weights; issue 10's
measurements, listed in ``MEASURED`` with what each one was):

* decode: plain transformers ``model.generate`` with the static (compiled) cache, batch 256, 128 new
  tokens: 2,646 tokens/s. vLLM is faster still, so generation time is an upper bound.
* training: the library's ``grpo_update`` on 32 sequences of 1,500 tokens with gradient
  checkpointing: 10.5 s, i.e. 4,571 sequence tokens/s through forward + backward + recompute.
* forward only (prompt reading, the KL reference pass): taken as 4x the training rate (a backward
  costs ~2 forwards, checkpointing recomputes one), 18,286 tokens/s: derived, not measured.

One step of one training method: ``questions_per_step x group_size`` trajectories; each makes
``searches`` search calls (paper Table 7: CoSearch 1.67 on average) and ``searches + 1`` agent turns.
A trajectory's cache carries across its turns, so its prompt tokens are read once (its final
context); every search call's ranker reads a prompt of N passages and writes a reply. The update
trains every agent sequence and every ranker call (an upper bound: semantic grouping drops some).

    python benchmarks/gpu_hours.py                 # paper profile, Table 3 and Table 4 cells
    python benchmarks/gpu_hours.py --searches 2.6  # the Fixed Ranker's search rate (Table 7)
    python benchmarks/gpu_hours.py --ranks 1,8,16,64   # projected wall time per step on R data-parallel GPUs

``--ranks``: a **projection**, not a measurement (no multi-GPU machine was available). Data parallel
over questions (``rl.data_parallel``) splits a step's compute evenly over R GPUs, and adds what
crosses ranks each step: one all-reduce of the LoRA gradients per adapter (ring: 2(R-1)/R of their
float32 bytes per GPU) and the exchange of the step's rollouts (every rank receives all of them:
token ids and log-probs). Bandwidths are arguments (defaults: NVLink within a node, 100 Gb/s
InfiniBand across nodes of 8 GPUs). Uneven trajectory lengths make ranks wait for the slowest one;
``--straggler`` multiplies the compute by that factor (default 1: the ideal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.config.methods import TRAINING_METHODS, method_spec  # noqa: E402

#: Throughputs on one H100 80 GB, bf16, Qwen2.5-7B architecture with random weights (tokens/s).
MEASURED = {
    "decode": (2646.0, "model.generate, static cache, batch 256, 128 new tokens (measured)"),
    "train": (32 * 1500 / 10.5, "grpo_update, 32 x 1,500 tokens, gradient checkpointing, 10.5 s (measured)"),
}
FORWARD_PER_TRAIN = 4.0  # forward-only tokens/s relative to the training rate (derived, see above)
#: Training methods one cell trains, per grid (papermill_runs/params/grids/<grid>.yaml).
METHODS_PER_CELL = {"table3": ("cosearch",), "table4": ("search_r1", "fixed_ranker", "cosearch", "oracle")}


def step_seconds(args: argparse.Namespace, cfg, method: str = "cosearch") -> dict[str, float]:
    """Seconds of one GRPO step of one training method, by part: the ranker LLM runs only for the
    methods that rank with it (``config.methods.MethodSpec.has_ranker_policy``) and is trained only by those that train it."""
    spec = method_spec(method)
    ranker_trained = spec.trains_ranker
    t = cfg.training
    trajectories = t.questions_per_step * t.group_size
    turns = args.searches + 1
    calls = trajectories * args.searches if spec.has_ranker_policy else 0.0
    observation = cfg.search.topk * args.passage_tokens
    agent_context = args.prompt_tokens + args.searches * (args.agent_turn_tokens + observation) + args.agent_turn_tokens
    ranker_prompt = args.ranker_overhead_tokens + cfg.search.topn * args.passage_tokens
    decode_rate, train_rate = MEASURED["decode"][0], MEASURED["train"][0]
    forward_rate = FORWARD_PER_TRAIN * train_rate
    generated = trajectories * turns * args.agent_turn_tokens + calls * args.ranker_reply_tokens
    read = trajectories * agent_context + calls * ranker_prompt
    trained = trajectories * agent_context + (calls * (ranker_prompt + args.ranker_reply_tokens) if ranker_trained else 0.0)
    kl = trained if cfg.training.grpo.kl_coef > 0 else 0.0
    return {"decode": generated / decode_rate, "prefill": read / forward_rate,
            "update": trained / train_rate, "kl reference": kl / forward_rate}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="paper", help="workload: questions_per_step, group_size, steps, N, K")
    ap.add_argument("--searches", type=float, default=1.67, help="search calls per trajectory (paper Table 7, CoSearch)")
    ap.add_argument("--passage-tokens", type=int, default=130, help="tokens per wiki-18 passage (100 words)")
    ap.add_argument("--prompt-tokens", type=int, default=400, help="agent system prompt + question")
    ap.add_argument("--agent-turn-tokens", type=int, default=150, help="tokens of one agent turn (reason + call or answer)")
    ap.add_argument("--ranker-overhead-tokens", type=int, default=300, help="ranker prompt without its N passages")
    ap.add_argument("--ranker-reply-tokens", type=int, default=150, help="tokens of one ranker reply (reason + rerank)")
    ap.add_argument("--ranks", default="", help="comma-separated GPU counts: projected wall time per step (data parallel)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="--ranks: GPUs per node (beyond it, the slower link)")
    ap.add_argument("--intra-node-gbs", type=float, default=150.0, help="--ranks: GB/s per GPU within a node (NVLink, assumed)")
    ap.add_argument("--inter-node-gbs", type=float, default=12.5, help="--ranks: GB/s per GPU across nodes (100 Gb/s IB, assumed)")
    ap.add_argument("--straggler", type=float, default=1.0, help="--ranks: slowest rank's compute / the mean (1: ideal)")
    args = ap.parse_args(argv)
    cfg = load_profile(args.profile)
    parts = step_seconds(args, cfg)
    step = sum(parts.values())
    per_method = {m: sum(step_seconds(args, cfg, m).values()) for m in TRAINING_METHODS}
    steps = cfg.training.steps
    print(f"profile {cfg.profile!r}: {cfg.models.agent}, {cfg.training.questions_per_step} questions x G={cfg.training.group_size} "
          f"per step, {steps} steps, N={cfg.search.topn}, K={cfg.search.topk}, {args.searches} searches per trajectory")
    for name, (rate, what) in MEASURED.items():
        print(f"  {name:<7} {rate:8,.0f} tokens/s  {what}")
    print(f"  forward {FORWARD_PER_TRAIN * MEASURED['train'][0]:8,.0f} tokens/s  {FORWARD_PER_TRAIN:g} x the training rate (derived)")
    print("one CoSearch step on one H100: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in parts.items())
          + f"; total {step / 3600:.2f} GPU-hours")
    print("one step per method: " + ", ".join(f"{m} {s / 3600:.2f} h" for m, s in per_method.items()))
    for grid, methods in METHODS_PER_CELL.items():
        hours = steps * sum(per_method[m] for m in methods) / 3600
        print(f"one {grid} cell ({', '.join(methods)}; {steps} steps each): ~{hours:,.0f} GPU-hours on H100s")
    if args.ranks:
        project_ranks(args, cfg, step)


#: Qwen2.5-7B's shape (the paper's policies): layers, hidden size, MLP size, key/value width.
QWEN7B = {"layers": 28, "hidden": 3584, "mlp": 18944, "kv": 4 * 128}


def lora_parameters(cfg) -> int:
    """LoRA parameters of one adapter on Qwen2.5-7B: r x (in + out) per targeted matrix per layer."""
    h, f, kv = QWEN7B["hidden"], QWEN7B["mlp"], QWEN7B["kv"]
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return QWEN7B["layers"] * sum(cfg.lora.r * sum(shapes[m]) for m in cfg.lora.target_modules if m in shapes)


def project_ranks(args: argparse.Namespace, cfg, step_s: float) -> None:
    """The projected wall time of one CoSearch step on R GPUs (printed, marked as a projection)."""
    t = cfg.training
    trajectories = t.questions_per_step * t.group_size
    grad_bytes = 2 * lora_parameters(cfg) * 4  # two adapters (agent, ranker), float32 gradients
    ranker_prompt = args.ranker_overhead_tokens + cfg.search.topn * args.passage_tokens
    agent_context = args.prompt_tokens + args.searches * (args.agent_turn_tokens + cfg.search.topk * args.passage_tokens)
    rollout_bytes = trajectories * (agent_context + args.searches * (ranker_prompt + args.ranker_reply_tokens)) * 12  # id + log-prob, pickled
    print(f"\nPROJECTION (not measured): one CoSearch step on R data-parallel H100s; LoRA gradients "
          f"{grad_bytes / 2**20:,.0f} MiB per step (2 adapters), rollouts exchanged ~{rollout_bytes / 2**20:,.0f} MiB")
    print(f"{'GPUs':>6} {'compute min':>12} {'all-reduce s':>13} {'exchange s':>11} {'step min':>9} {'100 steps h':>12} {'speed-up':>9}")
    for r in [int(x) for x in args.ranks.split(",") if x.strip()]:
        gbs = (args.intra_node_gbs if r <= args.gpus_per_node else args.inter_node_gbs) * 1e9
        compute = step_s * args.straggler / r
        allreduce = 2 * (r - 1) / r * grad_bytes / gbs if r > 1 else 0.0
        exchange = (r - 1) / r * rollout_bytes / gbs if r > 1 else 0.0
        wall = compute + allreduce + exchange
        print(f"{r:>6} {compute / 60:>12.1f} {allreduce:>13.2f} {exchange:>11.2f} {wall / 60:>9.1f} "
              f"{wall * t.steps / 3600:>12.1f} {step_s / wall:>9.1f}")


if __name__ == "__main__":
    main()
