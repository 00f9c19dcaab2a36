"""The run loop both trainers share: steps until a target, checkpoints, and stop signals.

``run_steps`` calls ``trainer.train_step()`` until ``trainer.step`` reaches the target, with a
progress bar, hands each step's record to the run (its validation when due, the live tracker); it checkpoints (``trainer.save_checkpoint()``) every ``checkpoint_every`` steps and
after the last. SIGUSR1 or SIGTERM (a cluster's time-limit warning or preemption,
``cosearch_lib.stop_signals``) does not kill the run: the step under way finishes, a checkpoint is
written whatever ``checkpoint_every`` says, and ``StopRequested`` is raised; the trainer's
``load_checkpoint`` then resumes from it. Called by ``rl.run_protocol.TrainingRun.run``, the run
protocol of the joint GRPO trainer (``rl.trainer``) and the ranker's relevance training
(``rl.relevance_training``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from cosearch_lib.paths import project_relative
from cosearch_lib.progress import tqdm
from cosearch_lib.stop_signals import StopRequest, StopRequested


class SteppedRun(Protocol):
    """What :func:`run_steps` drives (``rl.run_protocol.TrainingRun`` is one)."""

    step: int  # steps completed

    def train_step(self) -> dict: ...  # one step; advances ``step``, returns its record

    def save_checkpoint(self) -> Path: ...  # the checkpoint of ``step``


def run_steps(trainer: SteppedRun, until: int, *, checkpoint_every: int, desc: str, progress: bool = True,
              before_steps: Callable[[], None] = lambda: None,
              after_step: Callable[[dict], None] = lambda record: None,
              postfix: Callable[[dict], dict[str, str]] = lambda record: {},
              stopping: Callable[[str | None], bool] = lambda received: received is not None) -> None:
    """Train ``trainer`` (``step``, ``train_step()``, ``save_checkpoint()``) until ``until`` steps are
    done (see the module doc). ``before_steps``: what runs before the first step when there is one to
    run (the validation at the start), under the same stop-signal guard as a step. ``after_step``:
    what the run does with a step's record before it is checkpointed (the validation when due, the
    live tracker). ``postfix``: the progress bar's figures
    from a step's record.
    ``stopping``: whether to stop after this step, given the signal this process received (None if
    none); a data-parallel trainer asks every rank, so that they stop together."""
    bar = tqdm(total=until, initial=trainer.step, desc=desc, unit="step", disable=not progress)
    try:
        with StopRequest() as stop:
            if trainer.step < until:
                before_steps()
            while trainer.step < until:
                record = trainer.train_step()
                after_step(record)
                bar.update(1)
                bar.set_postfix(**postfix(record))
                halt = stopping(stop.received)
                saved = None
                if (checkpoint_every and trainer.step % checkpoint_every == 0) or trainer.step == until or halt:
                    saved = trainer.save_checkpoint()
                if halt and trainer.step < until:
                    signal = stop.received or "a signal to another rank"
                    print(f"[{desc}] {signal}: stopped after step {trainer.step}, checkpoint {project_relative(saved)}",
                          flush=True)
                    raise StopRequested(signal, trainer.step, project_relative(saved))
    finally:
        bar.close()
