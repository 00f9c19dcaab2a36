"""Does a profile's GRPO get a gradient? Per trainer seed: which roles had non-zero advantages.

Why: a profile whose rewards never differ inside a group trains nothing, and every test built on
it then compares records of a model that never moved (the `ci` profile once did exactly that).
This runs the profile's warm start (cached) and then its ``training.steps`` GRPO steps once per
seed, changing only the trainer's seed (so the sampled rollouts differ, the warm start does not),
and prints per step the sequences each role forwarded (non-zero advantage), the share of
trajectories that kept the protocol, the searches per trajectory and the step's seconds.

    python benchmarks/training_signal.py --profile ci --seeds 0 1 2 3

The last line counts the seeds in which both roles got a gradient in at least one step. Nothing is
written but the training folders under ``papermill_runs/<profile>/bench/training_signal/``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from cosearch_lib import experiment
from cosearch_lib.config import load_profile
from cosearch_lib.paths import run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="ci")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    args = ap.parse_args()
    cfg = load_profile(args.profile)
    retriever = experiment.build_retriever(cfg, progress=False)
    warm = experiment.warm_start(cfg, retriever, progress=False)
    both = 0
    for seed in args.seeds:
        t0 = time.perf_counter()
        out = run_dir(cfg.profile) / "bench" / "training_signal" / f"seed{seed}"
        trainer = experiment.build_trainer(replace(cfg, seed=seed), retriever, warm=warm, out_dir=out,
                                           progress=False, eval_every=0)
        steps = [trainer.train_step() for _ in range(cfg.training.steps)]
        roles = {r: any(s.get(f"loss/{r}_n_forwarded", 0) > 0 for s in steps) for r in ("agent", "ranker")}
        both += all(roles.values())
        print(f"seed {seed} ({time.perf_counter() - t0:.0f} s):")
        for s in steps:
            print(f"  step {s['step']}: forwarded agent {s.get('loss/agent_n_forwarded', 0)}, "
                  f"ranker {s.get('loss/ranker_n_forwarded', 0)}; format ok {s['rollout/agent_format_ok']:.2f}, "
                  f"searches/trajectory {s['rollout/searches_per_traj']:.2f}, {s['time/step_s']:.0f} s")
    print(f"both roles got a gradient in {both} of {len(args.seeds)} seeds")


if __name__ == "__main__":
    main()
