"""``cosearch train``: GRPO training of a profile's methods as a launched job, one process or many.

The same entry point runs in one process (``cosearch train ...``), as every rank of a torchrun job
on one node (``torchrun --nproc-per-node 8 $(which cosearch) train ...``) and as every task of an
srun step across nodes (``srun cosearch train ...``): :class:`~cosearch_lib.rl.data_parallel.DataParallel`
reads the launcher's variables. Training writes the run folders notebook 03 reads
(``papermill_runs/<profile>/training/<method>/``); notebook 03 run afterwards with ``resume=True``
finds them finished and goes on to its evaluation and figures. Rank 0 writes ``train.run.json``
(methods, steps, ranks, launcher, wall time, environment) beside the notebooks' records.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import ProfileConfig
from cosearch_lib.experiment import train_methods
from cosearch_lib.experiment.preflight import check_inputs
from cosearch_lib.models.generation.vllm_backend import close_engines
from cosearch_lib.paths import project_relative, run_dir
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.retrieval.http_client import HttpRetriever
from cosearch_lib.rl.data_parallel import DataParallel, LaunchEnvironment
from cosearch_lib.seeding import seed_everything
from cosearch_lib.stop_signals import StopRequested

#: The record ``cosearch train`` leaves in the profile's run folder.
TRAIN_RECORD = "train.run.json"


#: Launcher variables a child process must not see, or it would think itself a rank of the job.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def build_starts_apart(profile_arg: str, seed: int, methods: Sequence[str], retriever_url: str | None,
                       progress: bool) -> None:
    """Build the methods' starts (warm start, Fixed Ranker) in a child process outside the job.

    Under torchrun or srun, rank 0 used to train the warm start itself while the other ranks waited.
    TRL's trainer then saw the job's launcher variables, wrapped the model in DDP and waited for the
    other ranks inside its constructor, while they waited at the job's barrier: both hung (seen on
    ``paper_mini``). One process with none of the job's variables trains it alone, as SLURM's
    ``srun --ntasks=1 cosearch warm-start`` step does; the ranks then read the cache."""
    cmd = [sys.executable, "-m", "cosearch_lib.cli", "build-starts", "--profile", profile_arg, "--seed", str(seed),
           "--methods", ",".join(methods)]
    cmd += ["--retriever-url", retriever_url] if retriever_url else []
    cmd += [] if progress else ["--quiet"]
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith("TORCHELASTIC_")}
    env["SLURM_STEP_NUM_TASKS"] = "1"  # under srun: one task, not a rank
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("OMP_NUM_THREADS") == "1":
        env.pop("OMP_NUM_THREADS")  # torchrun's default of one thread per rank; the other ranks wait meanwhile
    done = subprocess.run(cmd, env=env, stdout=sys.stderr if progress else subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"building the starts of {list(methods)} failed (exit {done.returncode}): {' '.join(cmd)}")


def run_training(cfg: ProfileConfig, methods: Sequence[str], *, steps: int | None = None, resume: bool = False,
                 retriever_url: str | None = None, progress: bool = True, out_dir: str | Path | None = None,
                 dp: DataParallel | None = None, profile_arg: str | None = None) -> dict[str, Any] | None:
    """Train ``methods`` of ``cfg`` under whatever launched this process. Rank 0 writes the run record
    to ``out_dir/train.run.json`` (default the profile's run folder) and returns it; other ranks return None.

    ``retriever_url``: every rank searches through one retrieval server (``cosearch serve-retriever``,
    or Search-R1's) instead of loading the index itself. ``profile_arg`` (the ``--profile`` given):
    under several ranks, rank 0 first builds the starts in a child process (:func:`build_starts_apart`). A rank that fails prints which rank it was
    before the error ends it; the launcher then stops the others (torchrun does; srun with
    ``--kill-on-bad-exit=1``), and the job resumes (``resume=True``) from the newest whole checkpoint."""
    launch = LaunchEnvironment.detect()
    dp = dp or DataParallel.from_environment()
    # every rank, before the index loads or an engine starts: the same inputs fail the same way everywhere
    check_inputs(cfg, world_size=dp.world_size, index=retriever_url is None)
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    try:
        if dp.distributed and profile_arg is not None:
            if dp.is_main:
                build_starts_apart(profile_arg, cfg.seed, methods, retriever_url, progress)
            dp.barrier()
        retriever = HttpRetriever(retriever_url) if retriever_url else None
        overrides = {"steps": steps} if steps else {}
        folders = train_methods(cfg, methods, retriever=retriever, dp=dp, resume=resume, progress=progress, **overrides)
    except BaseException as err:
        name_failed_rank("train", dp, err)
        raise
    record = {"step": "train", "profile": cfg.profile, "seed": cfg.seed, "methods": list(methods),
              "steps": steps or cfg.training.steps, "resume": resume, "world_size": dp.world_size,
              "launcher": launch.launcher, "retriever": retriever_url or "in process",
              "runs": {m: project_relative(f) for m, f in folders.items()}, "wall_s": round(time.perf_counter() - t0, 2),
              "environment": environment_snapshot()}
    written = finish_job({TRAIN_RECORD: record}, Path(out_dir) if out_dir else run_dir(cfg.profile), dp)
    return written[TRAIN_RECORD] if written is not None else None


def name_failed_rank(command: str, dp: DataParallel, err: BaseException) -> None:
    """Under several ranks, say which rank failed before its error ends it (the launcher then stops the
    others); a stop request is no failure: every rank stopped at the same point, with what resumes."""
    if dp.distributed and not isinstance(err, StopRequested):
        print(f"[cosearch {command}] rank {dp.rank} of {dp.world_size} failed: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)


def finish_job(records: dict[str, dict[str, Any]], out: Path, dp: DataParallel) -> dict[str, dict[str, Any]] | None:
    """The end of a launched job on every rank: rank 0 writes each record to ``out/<its file name>``
    (``records``: {file name: record}); all wait, shut their engines down before the job's groups go
    (an engine per rank joined them) and leave the job. Returns ``records`` on rank 0, None elsewhere."""
    main = dp.is_main
    if main:
        out.mkdir(parents=True, exist_ok=True)
        for name, record in records.items():
            write_json(record, out / name)
    dp.barrier()
    close_engines()
    dp.close()
    return records if main else None
