"""One rank of the scripted joint trainer (tests.doubles) in a gloo job, started by torchrun from
tests/test_data_parallel.py::

    python -m torch.distributed.run --nproc-per-node N tests/data_parallel_worker.py OUT \
        [--method cosearch] [--steps 3] [--minibatches 1] [--questions-per-step 2] [--kill-rank R] [--resume]
        [--stop-after-rollout S]

The trainer checkpoints after every step into OUT/run. ``--kill-rank R``: rank R SIGKILLs itself in
step 2, right after its agent update (the other ranks are then inside the ranker's update: a node
lost mid-step). ``--stop-after-rollout S``: rank 0 alone gets SIGUSR1 once the rollout of step S
(0-based) is done, as SLURM's warning arrives; the ranks stop together at the stage boundary and the
worker exits 75. ``--resume``: continue from the newest checkpoint. Rank 0 saves the adapters the run
started from, the adapters at the end, the step records and the trajectories each rank rolled out in
each step to OUT/result.pt.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch

import cosearch_lib.rl.trainer as trainer_mod
from cosearch_lib.models.lora_policies import adapter_parameters
from cosearch_lib.models.registry import load_tokenizer
from cosearch_lib.rl.data_parallel import DataParallel
from cosearch_lib.stop_signals import EXIT_STOPPED, StopRequested

from tests.doubles import tiny_model, trainer


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--method", default="cosearch")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--minibatches", type=int, default=1)
    p.add_argument("--questions-per-step", type=int, default=2)
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stop-after-rollout", type=int)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dp = DataParallel.from_environment()
    tok = load_tokenizer("smollm2-135m-instruct")
    t = trainer(tok, tiny_model(tok), args.out / "run", method=args.method, steps=args.steps,
                minibatches=args.minibatches, questions_per_step=args.questions_per_step, checkpoint_every=1, dp=dp)
    adapters = sorted(t.policies.params)

    def weights() -> dict[str, torch.Tensor]:
        return {f"{a}/{n}": p.detach().clone() for a in adapters for n, p in adapter_parameters(t.policies.model, a).items()}

    start = weights()
    rolled: list[int] = []  # trajectories this rank rolled out, per step
    run = t.engine.run

    def counted_run(*a, **kw):
        out = run(*a, **kw)
        rolled.append(len(out))
        return out

    t.engine.run = counted_run
    if args.resume:
        t.load_checkpoint()
    if args.kill_rank == dp.rank:
        update = trainer_mod.grpo_update

        def update_then_die(policies, adapter, *a, **kw):
            out = update(policies, adapter, *a, **kw)
            if t.step == 1 and adapter == "agent":
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        trainer_mod.grpo_update = update_then_die
    if args.stop_after_rollout is not None and dp.is_main:
        scored = t.scored_rollouts

        def scored_then_warned(step, clock=None):
            out = scored(step, clock)
            if step == args.stop_after_rollout:
                os.kill(os.getpid(), signal.SIGUSR1)
            return out
        t.scored_rollouts = scored_then_warned
    try:
        t.run()
    except StopRequested:
        dp.close()
        sys.exit(EXIT_STOPPED)
    rolled_per_rank = dp.gather(rolled)
    if dp.is_main:
        torch.save({"start": start, "end": weights(), "records": t.records, "world_size": dp.world_size,
                    "rolled_per_rank": rolled_per_rank}, args.out / "result.pt")
    dp.close()


if __name__ == "__main__":
    main(sys.argv[1:])
