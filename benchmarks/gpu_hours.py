"""GPU-hours per method and grid cell at paper scale: the job planner's figures (``cosearch plan``).

This script is a view of ``cosearch_lib.planning.job_plan.plan_job``, not a second estimate: the
workload (the profile's settings, paper Table 7's searches per trajectory) multiplied by the
throughputs measured on one H100 80 GB (``docs/GPU_COSTS.md``, listed by the planner with their
sources). No GPU is needed to run it. ``--ranks`` prints the same plan on R data-parallel GPUs
(nodes of ``--gpus-per-node``): wall time per step, steps per job, GPU-hours per run; what crosses
ranks (the LoRA gradients' all-reduce, the rollouts' exchange) at assumed bandwidths. A
projection: no multi-GPU machine was measured.

    python benchmarks/gpu_hours.py                     # paper profile on one H100
    python benchmarks/gpu_hours.py --searches 2.6      # one search rate for every method
    python benchmarks/gpu_hours.py --ranks 1,8,16,64   # step wall time and GPU-hours on R GPUs
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.planning.job_plan import plan_job  # noqa: E402
from cosearch_lib.planning.step_work import Behaviour  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--searches", type=float, help="search calls per trajectory (default: paper Table 7 per method)")
    ap.add_argument("--ranks", default="1", help="comma-separated GPU counts")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (more ranks: more nodes)")
    args = ap.parse_args(argv)
    cfg = load_profile(args.profile)
    behaviour = Behaviour(searches=args.searches)
    t = cfg.training
    print(f"profile {cfg.profile!r}: {cfg.models.agent}, {t.questions_per_step} questions x G={t.group_size} per step, "
          f"{t.steps} steps, N={cfg.search.topn}, K={cfg.search.topk}")
    first = True
    for r in [int(x) for x in args.ranks.split(",") if x.strip()]:
        per_node = min(r, args.gpus_per_node)
        plan = plan_job(cfg, nodes=math.ceil(r / per_node), gpus_per_node=per_node, behaviour=behaviour)
        if first:
            print("throughputs:\n" + "\n".join(f"  {src}" for src in plan.inputs))
            print(f"{'GPUs':>5} {'method':<13} {'step min':>9} {'steps/job':>10} {'GPU-h (run)':>12}")
            first = False
        for m in plan.step_s:
            print(f"{plan.ranks:>5} {m:<13} {plan.step_s[m] / 60:>9.1f} {plan.steps_per_job[m]:>10} {plan.gpu_hours[m]:>12,.0f}")
        for grid, hours in plan.cell_gpu_hours.items():
            print(f"{plan.ranks:>5} one {grid} cell: {hours:,.0f} GPU-hours")
        for refusal in plan.refusals:
            print(f"{plan.ranks:>5} cannot fit or finish: {refusal}")


if __name__ == "__main__":
    main()
