"""The arguments of the ``cosearch`` command's cluster commands: ``cosearch plan`` (before the queue)
and the SLURM subcommands ``cosearch slurm train`` and ``cosearch slurm notebooks``
(``cosearch_lib.cli`` registers them with its handlers through :func:`add_slurm_commands`; the
handlers import ``planning`` and ``runs.slurm_training`` when they run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_slurm_commands(sub: argparse._SubParsersAction, *, train: Callable[[argparse.Namespace], int],
                       notebooks: Callable[[argparse.Namespace], int], plan: Callable[[argparse.Namespace], int]) -> None:
    """Add ``plan``, ``slurm train`` and ``slurm notebooks`` to the ``cosearch`` command's subparsers
    ``sub``, run by the handlers ``plan``, ``train`` and ``notebooks``."""
    p = sub.add_parser("plan", help="before the queue: memory per rank and node, disk, seconds per step by stage, "
                                    "GPU-hours, and what cannot fit or finish (exit 1), from measured throughputs (docs/PLAN.md)")
    p.add_argument("--profile", default="paper")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=1, help="one rank per GPU; 0: one CPU rank per node (this machine's rates)")
    p.add_argument("--gpu", default="h100", help="h100 (measured), h200, a100-80gb, a100-40gb (their memory, the H100's rates)")
    p.add_argument("--methods", help="comma-separated training methods (default: all four)")
    p.add_argument("--searches", type=float, help="search calls per trajectory (default: paper Table 7 per method)")
    p.set_defaults(fn=plan)
    p = sub.add_parser("slurm", help="write (and submit) SLURM jobs: `slurm train` = a retrieval server, data-parallel "
                                     "training on N nodes x G GPUs after it, then notebook 03's evaluation")
    slurm = p.add_subparsers(dest="slurm_command", required=True)
    p = slurm.add_parser("train", help="retriever.sbatch, train.sbatch (srun, one rank per GPU), evaluate.sbatch")
    p.add_argument("--profile", default="paper")
    p.add_argument("--methods", default="cosearch", help="comma-separated training methods")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=1, help="one rank per GPU; 0: CPU ranks (gloo)")
    p.add_argument("--tasks-per-node", type=int, help="ranks per node when --gpus-per-node is 0 (default 1)")
    p.add_argument("--steps", type=int, help="GRPO steps per method (default: the profile's)")
    p.add_argument("--no-evaluate", action="store_true", help="no notebook-03 job after training")
    p.add_argument("--dry-run", action="store_true", help="write the scripts and print the sbatch commands; submit nothing")
    p.add_argument("--force", action="store_true", help="submit even when the plan (cosearch plan) says the job cannot fit or finish")
    p.set_defaults(fn=train)
    p = slurm.add_parser("notebooks", help="plan, then sbatch run_notebooks.sbatch with the profile's resources and the plan's warning")
    p.add_argument("--profile", default="paper")
    p.add_argument("--notebooks", nargs="*", help="which notebooks (default: all)")
    p.add_argument("-p", "--param", action="append", metavar="NAME=VALUE", help="notebook parameter, as cosearch run -p")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch command; submit nothing")
    p.add_argument("--force", action="store_true", help="submit even when the plan says the job cannot fit or finish")
    p.set_defaults(fn=notebooks)
