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


def run_training(cfg: ProfileConfig, methods: Sequence[str], *, steps: int | None = None, resume: bool = False,
                 retriever_url: str | None = None, progress: bool = True, out_dir: str | Path | None = None,
                 dp: DataParallel | None = None) -> dict[str, Any] | None:
    """Train ``methods`` of ``cfg`` under whatever launched this process. Rank 0 writes the run record
    to ``out_dir/train.run.json`` (default the profile's run folder) and returns it; other ranks return None.

    ``retriever_url``: every rank searches through one retrieval server (``cosearch serve-retriever``,
    or Search-R1's) instead of loading the index itself. A rank that fails prints which rank it was
    before the error ends it; the launcher then stops the others (torchrun does; srun with
    ``--kill-on-bad-exit=1``), and the job resumes (``resume=True``) from the newest whole checkpoint."""
    launch = LaunchEnvironment.detect()
    dp = dp or DataParallel.from_environment()
    # every rank, before the index loads or an engine starts: the same inputs fail the same way everywhere
    check_inputs(cfg, world_size=dp.world_size, index=retriever_url is None)
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    try:
        retriever = HttpRetriever(retriever_url) if retriever_url else None
        overrides = {"steps": steps} if steps else {}
        folders = train_methods(cfg, methods, retriever=retriever, dp=dp, resume=resume, progress=progress, **overrides)
    except StopRequested:
        raise  # not a failure: every rank stopped after the same step, and the checkpoint is written
    except BaseException as err:
        if dp.distributed:
            print(f"[cosearch train] rank {dp.rank} of {dp.world_size} failed: {type(err).__name__}: {err}",
                  file=sys.stderr, flush=True)
        raise
    record = {"step": "train", "profile": cfg.profile, "seed": cfg.seed, "methods": list(methods),
              "steps": steps or cfg.training.steps, "resume": resume, "world_size": dp.world_size,
              "launcher": launch.launcher, "retriever": retriever_url or "in process",
              "runs": {m: project_relative(f) for m, f in folders.items()}, "wall_s": round(time.perf_counter() - t0, 2),
              "environment": environment_snapshot()}
    main = dp.is_main
    if main:
        out = Path(out_dir) if out_dir else run_dir(cfg.profile)
        out.mkdir(parents=True, exist_ok=True)
        write_json(record, out / TRAIN_RECORD)
    dp.barrier()
    close_engines()  # before the job's groups go: an engine per rank joined them
    dp.close()
    return record if main else None
