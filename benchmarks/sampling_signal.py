"""Does GRPO have anything to work with? Best-of-G against mean-of-G F1, and groups without signal,
per sampling setting, from one policy, without an update.

Why (issue 48): a GRPO group whose G rewards are all equal gets zero advantage, so a policy that
samples the same trajectory G times learns nothing, however many steps it runs. This rolls out the
same training questions under each setting of G and temperature from one starting policy (the
profile's warm start, or a training checkpoint), scores them as the trainer does (the agent's
Eq. 4 reward, the ranker's composite reward, the semantic grouping), and prints per setting:

* ``mean_f1`` (pass@1 in F1) and ``best_of_g_f1`` (the best of each question's G samples): the
  room a group-relative update has, on the training questions;
* ``no_signal``: the share of agent groups whose G rewards are all equal (no gradient);
* ``format_ok``, ``searches``, ``entropy`` (mean -log p of the sampled agent tokens);
* for a method with a ranker policy, ``ranker_groups`` (semantic groups kept per step) and
  ``calls``;
* ``rollout_s``: seconds per step's rollout on this machine;
* ``by_hops``: ``mean_f1``, ``best_of_g_f1`` and ``questions`` on the single-hop and on the
  multi-hop families apart (``eval.benchmark_families.hop_group``): whether a multi-hop question
  ever gets a rewarded sample to reinforce.

    python benchmarks/sampling_signal.py --profile laptop --method search_r1 --group-sizes 4 8 \\
        --temperatures 0.8 1.0 --steps 2
    python benchmarks/sampling_signal.py --profile laptop_curve --method search_r1 \\
        --checkpoint papermill_runs/laptop_curve/training/search_r1/checkpoints/step-00100

One JSON line per setting (means over the steps' questions). Nothing is written but throw-away
training folders under ``papermill_runs/<profile>/bench/sampling_signal/``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np

from cosearch_lib import experiment
from cosearch_lib.config import load_profile
from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.paths import run_dir
from cosearch_lib.rl.step_records import question_groups, step_record
from cosearch_lib.stage_clock import StageClock

#: step-record columns (run_schema.STEP_GLOSSARY) -> the names this benchmark prints them under
NAMES = {"rollout/agent_f1": "mean_f1", "rollout/agent_best_of_g_f1": "best_of_g_f1",
         "rollout/agent_groups_without_signal": "no_signal", "rollout/agent_format_ok": "format_ok",
         "rollout/searches_per_traj": "searches", "rollout/agent_entropy": "entropy", "ranker/n_calls": "calls",
         "ranker/grouping_n_groups_post": "ranker_groups"}
SHOWN = tuple(NAMES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="laptop")
    ap.add_argument("--method", default="search_r1")
    ap.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.8, 1.0])
    ap.add_argument("--questions-per-step", type=int, default=None, help="default: the profile's")
    ap.add_argument("--steps", type=int, default=2, help="training steps' questions rolled out per setting")
    ap.add_argument("--checkpoint", default=None, help="a checkpoint of the method to start from (default: the warm start)")
    args = ap.parse_args()
    cfg = load_profile(args.profile)
    retriever = experiment.build_retriever(cfg, progress=False)
    starts = experiment.method_starts(cfg, retriever, args.method, progress=False)
    qps = args.questions_per_step or cfg.training.questions_per_step
    print(json.dumps({"profile": cfg.profile, "method": args.method, "start": args.checkpoint or "warm start",
                      "questions_per_step": qps, "steps": args.steps}), flush=True)
    for g in args.group_sizes:
        for temperature in args.temperatures:
            run = replace(cfg, rollout=replace(cfg.rollout, temperature=temperature))
            out = run_dir(cfg.profile) / "bench" / "sampling_signal" / f"{args.method}-g{g}-t{temperature}"
            trainer = experiment.build_trainer(run, retriever, warm=starts, method=args.method, out_dir=out,
                                               progress=False, group_size=g, questions_per_step=qps, eval_every=0,
                                               validate_at_start=False)
            if args.checkpoint:
                trainer.load_checkpoint(args.checkpoint)
            records, seconds, trajs = [], [], []
            for step in range(args.steps):
                clock = StageClock()
                _, rewards, groups = trainer.scored_rollouts(step, clock)
                seconds.append(clock.columns()["rollout_s"])
                trajs += rewards.trajectories
                records.append(step_record(step, args.method, rewards, groups, {}))
            line = {"G": g, "temperature": temperature}
            line.update({NAMES[k]: round(float(np.nanmean([r[k] for r in records])), 3) for k in SHOWN})
            line["rollout_s"] = round(float(np.mean(seconds)), 1)
            line["by_hops"] = {}
            for hops in sorted({hop_group(t.data_source) for t in trajs}):
                part = [t for t in trajs if hop_group(t.data_source) == hops]
                per_question = question_groups(part, [t.f1 for t in part])
                line["by_hops"][hops] = {"questions": len(per_question),
                                         "mean_f1": round(float(np.mean([np.mean(v) for v in per_question])), 3),
                                         "best_of_g_f1": round(float(np.mean([max(v) for v in per_question])), 3)}
            print(json.dumps(line), flush=True)
            del trainer


if __name__ == "__main__":
    main()
