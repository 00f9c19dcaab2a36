"""Checkpoints of a training run, written whole or not at all, and the random states they carry.

Used by both trainers that step and resume: the joint GRPO trainer (``rl.trainer``) and the
ranker's relevance training (``rl.relevance_training``). A checkpoint is a folder
``out_dir/checkpoints/step_N/`` (``run_schema``): the caller fills a temporary folder, the manifest
(sizes and hashes) is written last, and the folder is renamed into place; older ones beyond
``keep`` are removed. A kill or a full disk at any point leaves the newest whole checkpoint to
resume from (``run_schema.latest_checkpoint``).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosearch_lib.atomic_io import replace_dir
from cosearch_lib.paths import project_relative
from cosearch_lib.run_schema import (
    CHECKPOINTS_DIR,
    checkpoint_folders,
    checkpoint_name,
    latest_checkpoint,
    write_checkpoint_manifest,
)


def rng_states() -> dict[str, Any]:
    """Python's, NumPy's and torch's global random states (a resumed run continues the same streams)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo :func:`rng_states`."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_state(state: dict[str, Any], folder: Path) -> None:
    """``folder/state.pt``, through a Python file: a full disk raises OSError (ENOSPC), not a RuntimeError."""
    with (folder / "state.pt").open("wb") as f:
        torch.save(state, f)


def load_state(folder: str | Path) -> dict[str, Any]:
    return torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False)


def write_checkpoint(out_dir: str | Path, step: int, fill: Callable[[Path], None], *, keep: int) -> Path:
    """The checkpoint of ``step`` under ``out_dir``: ``fill(tmp)`` writes the files into an empty
    temporary folder, the manifest follows, then the folder replaces any earlier copy of the same
    step; the newest ``keep`` checkpoints stay (0 keeps all). An OSError (full disk, quota) removes
    the partial folder and says which whole checkpoint the run would resume from."""
    out_dir = Path(out_dir)
    final = out_dir / CHECKPOINTS_DIR / checkpoint_name(step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        fill(tmp)
        write_checkpoint_manifest(tmp)  # last: sizes and hashes of everything above
    except BaseException as err:  # a full disk, a quota, a kill: the checkpoints already there stay as they are
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(err, OSError):
            raise
        before = latest_checkpoint(out_dir)
        raise OSError(err.errno, f"could not write checkpoint {project_relative(final)} ({err.strerror or err}); "
                                 f"the newest whole checkpoint is {project_relative(before) if before else 'none'}, "
                                 "and the run resumes from it") from err
    replace_dir(tmp, final)  # the same step written again (a resumed run): the old copy goes only once the new one is in
    if keep:
        done = checkpoint_folders(out_dir)
        for old in done[: max(0, len(done) - keep)]:
            shutil.rmtree(old, ignore_errors=True)
    return final
