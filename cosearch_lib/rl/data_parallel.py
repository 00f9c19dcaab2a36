"""Data parallel training over a step's rollouts, on torch.distributed (torchrun on a node, srun across nodes).

What is split: the rows of a step, a row being one of the G rollouts of one of its questions. GRPO's
groups live inside a question: the agent's group is a question's G rollouts, and the ranker's
semantic groups are formed among the search calls of those rollouts (``rl.semantic_grouping``).
Every rank therefore computes the rewards, groups and advantages of the whole step after the
rollouts are exchanged; only generation and the update are split. The rows are dealt in contiguous
blocks (:meth:`DataParallel.block`), so a question's rollouts stay on one rank (sharing its prompt in
the engine's prefix cache and in the update's shared prefix) except where a block boundary cuts
one; and a step with fewer questions than ranks, or a number that does not divide evenly, still
gives every rank the same number of rows within one, so no rank idles while another rolls out and
updates a whole question more.

A step under :class:`DataParallel` (``rl.trainer.JointTrainer.train_step``):

1. each rank rolls out its block of the step's rows (questions in step order, G rows each).
   Sampling is keyed by (seed, step, question, sample, turn)
   (``models.generation.contract.row_seeds``), so a trajectory's tokens do not depend on which rank,
   or which batch, generated it;
2. the ranks exchange their rollouts (:meth:`DataParallel.gather_blocks`, objects), in the step's
   row order, so every rank computes the rewards, groups and advantages of the whole step, exactly
   as one process does, and every rank holds the same step record;
3. each rank runs the policy update on the sequences of its own rows only (its trajectories, and
   the ranker calls made in them). The token-mean
   denominators are summed over ranks first (:meth:`DataParallel.sum`), so each rank's loss is its
   share of the global batch's loss. The LoRA gradients are then summed (:meth:`DataParallel.sum_grads`)
   before clipping and the optimizer step. Every rank thus steps with the single-process gradient,
   and the adapters stay identical on every rank (only floating-point summation order differs);
4. rank 0 writes records and checkpoints (atomically, ``rl.run_checkpoints``); the others wait at a
   barrier. On resume every rank reads the same checkpoint.

Validation and evaluation split their questions instead (:meth:`DataParallel.shard`): one greedy
rollout each, with no group to keep. :meth:`DataParallel.map_items` is that shard, run, gather in
one call: each rank runs a function on its share, and every rank gets the results in the items'
order.

Only the rollouts, the loss denominators, the LoRA gradients and the update's statistics cross
ranks. Collectives run on the process group's backend: gloo on CPU (how this is tested), nccl on
GPUs. A rank that dies makes the launcher (torchrun's agent, or srun with ``--kill-on-bad-exit``)
stop the others and report that rank; the run then resumes from the newest whole checkpoint.
"""

from __future__ import annotations

import datetime
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
R = TypeVar("R")

#: Collective timeout (seconds) when none is given: a rank that waits longer for the others fails
#: with a message instead of hanging the job. A paper-scale step (22 min of update alone on one
#: H100, ``docs/USAGE.md``) fits well inside it.
DEFAULT_TIMEOUT_S = 3600


@dataclass(frozen=True)
class LaunchEnvironment:
    """Where this process sits in a launched job, read from the launcher's environment variables."""

    rank: int  # global rank
    world_size: int  # processes in the job
    local_rank: int  # rank on this node (which GPU to use)
    master_addr: str  # rendezvous host (env:// initialisation)
    master_port: int
    launcher: str  # "torchrun" | "srun" | "single"

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
        """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; srun sets SLURM_PROCID,
        SLURM_NTASKS and SLURM_LOCALID, and the rendezvous host is the job's first node (from
        MASTER_ADDR when the batch script exports it, else ``scontrol show hostnames``). Neither:
        one process (rank 0 of 1)."""
        env = dict(os.environ if environ is None else environ)
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK", "0"),
                       env.get("MASTER_ADDR", "127.0.0.1"), _int(env, "MASTER_PORT", "29500"), "torchrun")
        # a task of an srun step (the batch script's own shell has SLURM_NTASKS but no step of its own)
        if "SLURM_PROCID" in env and int(env.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
            addr = env.get("MASTER_ADDR") or _first_slurm_host(env)
            # one port per job: two jobs on one node do not collide
            port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)
            return cls(_int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS"), _int(env, "SLURM_LOCALID", "0"),
                       addr, int(port), "srun")
        return cls(0, 1, 0, "127.0.0.1", 29500, "single")


def _int(env: Mapping[str, str], key: str, default: str | None = None) -> int:
    value = env.get(key, default)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"launcher variable {key}={value!r} is not an integer") from None


def _first_slurm_host(env: Mapping[str, str]) -> str:
    """The first host of the job's node list (``scontrol show hostnames`` expands ranges like node[01-04])."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodes:
        raise ValueError("srun task without SLURM_JOB_NODELIST or MASTER_ADDR: cannot find the rendezvous host")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True, timeout=30)
        return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        if "[" in nodes or "," in nodes:
            raise ValueError(f"cannot expand SLURM node list {nodes!r} without scontrol; export MASTER_ADDR") from None
        return nodes


class DataParallel:
    """This process's rank in a data-parallel job, and the few collectives the trainer needs.

    ``DataParallel()`` (one process) makes every collective the identity, so the trainer has one
    code path. :meth:`from_environment` joins the launcher's process group."""

    def __init__(self, rank: int = 0, world_size: int = 1, *, group: Any = None, device: Any = "cpu") -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a job of {world_size} process(es)")
        self.rank, self.world_size, self.group = rank, world_size, group
        self.device = torch.device(device)  # where collective tensors live: the GPU under nccl, which moves CUDA tensors only

    @classmethod
    def from_environment(cls, *, backend: str | None = None, timeout_s: float | None = None,
                         environ: Mapping[str, str] | None = None) -> DataParallel:
        """Join the job the launcher started (``LaunchEnvironment.detect``): env:// rendezvous,
        ``backend`` nccl when CUDA is there, else gloo. One process: no process group at all."""
        launch = LaunchEnvironment.detect(environ)
        if launch.world_size == 1:
            return cls()
        if not dist.is_available():
            raise RuntimeError("this torch build has no torch.distributed")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        device = "cpu"
        if backend == "nccl":  # one GPU per rank; a task that sees only its own GPU has just device 0
            device = f"cuda:{launch.local_rank % torch.cuda.device_count()}"
            torch.cuda.set_device(torch.device(device))
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", launch.master_addr)
            os.environ.setdefault("MASTER_PORT", str(launch.master_port))
            timeout = datetime.timedelta(seconds=timeout_s or float(os.environ.get("COSEARCH_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
            dist.init_process_group(backend, init_method="env://", rank=launch.rank, world_size=launch.world_size,
                                    timeout=timeout)
        # Libraries that join a running job read torchrun's variables (vLLM's external launcher reads
        # RANK and LOCAL_RANK, LOCAL_RANK naming the GPU among those this process sees); srun sets
        # only SLURM's, so they are filled in from them.
        os.environ.setdefault("RANK", str(launch.rank))
        os.environ.setdefault("WORLD_SIZE", str(launch.world_size))
        os.environ.setdefault("LOCAL_RANK", str(torch.device(device).index or 0) if backend == "nccl" else str(launch.local_rank))
        return cls(dist.get_rank(), dist.get_world_size(), device=device)

    # -- who does what

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes records and checkpoints and shows progress bars."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every ``world_size``-th from position ``rank`` (ranks get at
        most one item more than each other)."""
        return list(items[self.rank::self.world_size])

    def owned(self, n: int) -> list[int]:
        """The positions of :meth:`shard` among ``n`` items."""
        return list(range(self.rank, n, self.world_size))

    def block(self, n: int) -> range:
        """This rank's contiguous share of ``n`` items: the first ``n % world_size`` ranks hold one
        more than the others."""
        size, extra = divmod(n, self.world_size)
        start = self.rank * size + min(self.rank, extra)
        return range(start, start + size + (self.rank < extra))

    def unshard(self, shards: Sequence[Sequence[T]]) -> list[T]:
        """The items in their original order again, from every rank's :meth:`shard` (rank order)."""
        n = sum(len(s) for s in shards)
        out: list[Any] = [None] * n
        for rank, items in enumerate(shards):
            for pos, item in zip(range(rank, n, self.world_size), items):
                out[pos] = item
        return out

    # -- collectives (identity in one process)

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_shards(self, local: Sequence[T]) -> list[T]:
        """:meth:`unshard` of every rank's ``local`` shard: the whole list, in order, on every rank."""
        return list(local) if not self.distributed else self.unshard(self.gather(list(local)))

    def map_items(self, items: Sequence[T], fn: Callable[[list[T]], Sequence[R]]) -> list[R]:
        """``fn`` over this rank's :meth:`shard` of ``items`` (not called on an empty shard), then every
        rank's results gathered in the items' order, on every rank: one result per item, what one
        process calling ``fn(list(items))`` would get. A collective: every rank calls it, in the same order."""
        mine = self.shard(items)
        out = list(fn(mine)) if mine else []
        if len(out) != len(mine):
            raise ValueError(f"map_items: {len(out)} results for {len(mine)} items on rank {self.rank}")
        return self.gather_shards(out)

    def map_block(self, n: int, fn: Callable[[range], Sequence[R]]) -> tuple[list[R], range]:
        """``fn`` over this rank's :meth:`block` of ``n`` items (positions; not called on an empty
        block), then every rank's results joined in rank order, on every rank: (one result per item,
        what one process calling ``fn(range(n))`` would get; this rank's block). The rollout's
        counterpart of :meth:`map_items`: a rank keeps a contiguous block of a step's rows, the ones
        it updates. A collective: every rank calls it, in the same order."""
        rows = self.block(n)
        out = list(fn(rows)) if len(rows) else []
        if len(out) != len(rows):
            raise ValueError(f"map_block: {len(out)} results for {len(rows)} items on rank {self.rank}")
        return self.gather_blocks(out), rows

    def gather_blocks(self, local: Sequence[T]) -> list[T]:
        """Every rank's :meth:`block` of a list, joined in rank order: the whole list, on every rank."""
        return list(local) if not self.distributed else [x for part in self.gather(list(local)) for x in part]

    def sum(self, value: float) -> float:
        """``value`` summed over ranks (float64, so counts stay exact)."""
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return float(t.item())

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Sum the gradients of ``params`` over ranks in place (a rank without one contributes zeros);
        True when any rank had a gradient (then every parameter has one), False when none did."""
        params = list(params)
        has = any(p.grad is not None for p in params)
        if not self.distributed:
            return has
        if not self.sum(float(has)):
            return False
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self.device, torch.float32)
                          for p in params])  # one message, not one per LoRA matrix
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.device, p.dtype)
            offset += n
        return True

    def broadcast_params(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Rank 0's values of ``params`` on every rank (the adapters start identical everywhere)."""
        if not self.distributed:
            return
        with torch.no_grad():
            for p in params:
                data = p.data.to(self.device)
                dist.broadcast(data, src=0, group=self.group)
                p.data.copy_(data)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Leave the process group (the end of a launched job)."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, world_size={self.world_size})"


#: The one-process job: what a trainer runs under unless a launcher started it.
SINGLE_PROCESS = DataParallel()
