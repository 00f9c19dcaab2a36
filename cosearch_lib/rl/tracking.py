"""Optional live logging of the trainer's step records to TensorBoard and/or Weights & Biases.

The tidy records (``steps.csv``, ``ranker_calls.parquet``) are always written by the trainer; this
is a view on the same numbers while a run is going. Each numeric field of a step record becomes
one scalar under its column name (see ``run_schema.STEP_GLOSSARY``) at the number of steps
completed, ``record["step"] + 1``: the x axis of notebook 03's curves, and what lets the validation
before the first update (``step = -1``) land at 0, since W&B refuses a negative step. NaN (a metric
with no value this step) and non-numeric fields (``method``) are skipped.

Both packages are optional: a requested kind whose package is missing (or whose start fails, e.g.
W&B without a login) is skipped with one warning naming the package to install.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cosearch_lib.config import TRACKER_KINDS, check_kinds


class StepTracker(Protocol):
    """Receives the step records of a run, then is closed once."""

    def log(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars(record: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """``(steps completed, {name: value})``: ``record["step"] + 1`` and the record's numeric fields as
    floats; NaN, booleans, non-numbers (strings, None) and ``step`` itself are left out."""
    if "step" not in record:
        raise KeyError("a step record needs a 'step' field")
    step = int(record["step"]) + 1
    values = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if not math.isnan(value):
            values[str(key)] = value
    return step, values


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter``: one ``add_scalar`` per field (needs ``tensorboard``)."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, record: Mapping[str, Any]) -> None:
        step, values = scalars(record)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # a step takes minutes: show it now

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A Weights & Biases run: ``wandb.init`` once, ``wandb.log`` per step, ``wandb.finish`` at the end."""

    def __init__(self, log_dir: str | Path, run_name: str, config: Mapping[str, Any], *, project: str) -> None:
        import wandb

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=project, name=run_name, config=dict(config), dir=str(log_dir))

    def log(self, record: Mapping[str, Any]) -> None:
        step, values = scalars(record)
        self.wandb.log(values, step=step)

    def close(self) -> None:
        self.wandb.finish()


class CompositeTracker:
    """Forwards every record to each tracker; closing twice is harmless."""

    def __init__(self, trackers: Sequence[StepTracker]) -> None:
        self.trackers = list(trackers)
        self.closed = False

    def log(self, record: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for tracker in self.trackers:
                tracker.close()


def make_tracker(kinds: Sequence[str] | str, log_dir: str | Path, run_name: str, config: Mapping[str, Any], *,
                 project: str = "cosearch") -> CompositeTracker:
    """A tracker logging to each of ``kinds`` ("tensorboard": event files in ``log_dir``; "wandb": a run
    ``run_name`` in W&B ``project``, with ``config``, local files under ``log_dir``). A kind whose
    package is missing or that fails to start is skipped with a warning; none requested: a no-op."""
    trackers: list[StepTracker] = []
    for kind in check_kinds(kinds):
        try:
            if kind == "tensorboard":
                trackers.append(TensorBoardTracker(log_dir))
            else:
                trackers.append(WandbTracker(log_dir, run_name, config, project=project))
        except ImportError as err:
            warnings.warn(f"{kind} logging is off: the {TRACKER_KINDS[kind]!r} package is not installed "
                          f"(pip install {TRACKER_KINDS[kind]}); step records are still written as files "
                          f"[{err}]", stacklevel=2)
        except Exception as err:  # noqa: BLE001 - logging is optional; a failed start must not stop training
            warnings.warn(f"{kind} logging is off: it failed to start ({type(err).__name__}: {err})", stacklevel=2)
    return CompositeTracker(trackers)
