"""Reading training runs back: step records, warm-start summaries, and the evaluation of trained
policies with the harness of notebook 02 (what notebook 03 shows).

Everything here reads what :class:`cosearch_lib.rl.trainer.JointTrainer` and :func:`cosearch_lib.experiment.warm_start` wrote to
disk, so the tables and figures can be rebuilt without the live trainer.

Layout of a profile's training runs (``papermill_runs/<profile>/training/``)::

    <method>/steps.csv                      one row per step (rl.trainer.STEP_GLOSSARY)
    <method>/ranker_calls.parquet           one row per ranker call (sub-query, reward, group, advantage)
    <method>/checkpoints/step_N/adapters/   the policies after step N, peft format
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cosearch_lib.config import TRAINING_METHODS
from cosearch_lib.paths import run_dir
from cosearch_lib.rl.trainer import latest_checkpoint
from cosearch_lib.rl.warm_start import warmstart_summary


def training_root(profile: str) -> Path:
    """``papermill_runs/<profile>/training``: one folder per trained method."""

    return run_dir(profile) / "training"


def read_steps(root: str | Path, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The step records of every method under ``root`` (or the named ones), concatenated in
    :data:`cosearch_lib.config.TRAINING_METHODS` order. Raises FileNotFoundError naming what is missing."""
    root = Path(root)
    wanted = list(methods) if methods is not None else [m for m in TRAINING_METHODS if (root / m / "steps.csv").exists()]
    missing = [m for m in wanted if not (root / m / "steps.csv").exists()]
    if missing or not wanted:
        raise FileNotFoundError(f"no step records for {missing or 'any method'} under {root} (run the training first)")
    return pd.concat([pd.read_csv(root / m / "steps.csv") for m in wanted], ignore_index=True)


def read_ranker_calls(root: str | Path, method: str) -> pd.DataFrame:
    """The per-call records of a method (empty when it made no ranker calls)."""
    path = Path(root) / method / "ranker_calls.parquet"
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def checkpoint_adapters(root: str | Path, method: str) -> dict[str, Path]:
    """{adapter name: folder} of the newest checkpoint of ``method`` (agent, ranker or shared)."""
    ckpt = latest_checkpoint(Path(root) / method)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint of {method!r} under {Path(root) / method}")
    return {p.name: p for p in sorted((ckpt / "adapters").iterdir()) if (p / "adapter_config.json").exists()}


def warmstart_table(folders: dict[str, str | Path]) -> pd.DataFrame:
    """One row per warm-started role: sequences, tokens, optimizer steps, first/last logged loss, wall time."""
    rows = []
    if not folders:  # no warm start (warmstart.enabled: false)
        return pd.DataFrame(columns=["sequences", "tokens", "trained_tokens", "steps", "first_loss", "last_loss",
                                     "train_loss", "wall_s"], index=pd.Index([], name="role"))
    for role, folder in folders.items():
        s = warmstart_summary(folder)
        losses = [x["loss"] for x in s["losses"]]
        rows.append({"role": role, "sequences": s["n_sequences"], "tokens": s["tokens"],
                     "trained_tokens": s["trained_tokens"], "steps": s["steps"],
                     "first_loss": losses[0] if losses else float("nan"),
                     "last_loss": losses[-1] if losses else float("nan"), "train_loss": s["train_loss"],
                     "wall_s": s["wall_s"]})
    return pd.DataFrame(rows).set_index("role")


def warmstart_losses(folders: dict[str, str | Path]) -> pd.DataFrame:
    """Tidy (role, step, loss) rows of the warm start's logged losses, for plotting."""
    rows = [{"role": role, "step": x["step"], "loss": x["loss"]}
            for role, folder in folders.items() for x in warmstart_summary(folder)["losses"]]
    return pd.DataFrame(rows, columns=["role", "step", "loss"])
