"""The run protocol both trainers share: records, validation at the start and when due,
checkpoints, resume, and the run loop.

A trainer that steps (the joint GRPO trainer, ``rl.trainer``; the ranker's relevance training,
``rl.relevance_training``) subclasses :class:`TrainingRun`, writes its own ``train_step`` and
``validate``, and answers a few questions about itself (the hooks below). Everything else is one
copy here:

* **records**: ``records`` (one per step, and the ``step = -1`` validation row), ``call_records``
  (one per ranker call, joint training only) and ``val_records`` (one per validation item), as
  frames and as the run folder's ``steps.csv``, ``ranker_calls.parquet`` and ``validation.csv``;
* **validation**: before the first update when :meth:`TrainingRun._validates_at_start` says so,
  and after each step when :meth:`TrainingRun._validation_due` says so, timed as ``validate_s``;
* **checkpoints**: ``out_dir/checkpoints/step_N/`` written whole or not at all
  (``rl.run_checkpoints``), by rank 0 of a data-parallel job, the newest ``keep_checkpoints`` kept;
* **resume**: :meth:`TrainingRun.load_checkpoint` restores the newest whole checkpoint (none: the
  run stays at step 0) after checking that it is this run's: the same method and the same seed;
  records of older checkpoints come back under today's column names (``run_schema.current_step_columns``);
* **the stage boundary**: a step's scored rollouts are written before its update
  (:meth:`TrainingRun.save_stage`, ``checkpoints/rollouts_step_N.pt``), and a stop signal received
  during the rollout stops the run there (:meth:`TrainingRun.stop_at_boundary`); the resumed run
  takes them back (:meth:`TrainingRun.take_stage`) and goes straight into the update, to the records
  and weights of a run that never stopped. So the part of a step a stop cannot cut is its longest
  stage, not the whole step (``planning.job_plan``);
* **the loop**: :func:`rl.step_loop.run_steps` (stop signals, checkpoints every
  ``checkpoint_every`` steps and after the last).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from cosearch_lib.atomic_io import atomic_path, write_table
from cosearch_lib.paths import project_relative
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.run_checkpoints import load_state, restore_rng_states, rng_states, save_state, write_checkpoint
from cosearch_lib.rl.step_loop import run_steps
from cosearch_lib.run_schema import (
    CHECKPOINTS_DIR,
    RANKER_CALLS_FILE,
    STEPS_FILE,
    VALIDATION_FILE,
    checkpoint_name,
    current_step_columns,
    current_step_record,
    latest_checkpoint,
    namespaced_record,
    rollout_stage_name,
    validation_columns,
)
from cosearch_lib.stage_clock import StageClock
from cosearch_lib.stop_signals import StopRequested, pending_stop


class TrainingRun:
    """The base of a trainer that steps, validates, checkpoints and resumes (see the module doc).

    A subclass calls :meth:`_start_run` in its ``__init__`` and sets ``cfg`` (with ``steps`` and
    ``checkpoint_every``), ``seed``, ``progress``, ``policies`` and ``served``; it implements
    ``train_step() -> dict`` (appends the step's record to ``records``, advances ``step``) and
    ``validate(step) -> dict`` (the ``val_*`` columns; per-item rows into ``val_records``)."""

    #: Columns of its records renamed since some checkpoints were written: {old name: new name}
    #: (the joint trainer's ``run_schema.RENAMED_STEP_COLUMNS``); applied on resume.
    cfg: Any
    seed: int
    progress: bool
    policies: Any  # models.lora_policies.PolicySet
    served: Any  # models.served_adapters.ServedAdapters

    def _start_run(self, out_dir: str | Path, *, name: str, keep_checkpoints: int,
                   dp: DataParallel = SINGLE_PROCESS) -> None:
        """``name``: what a checkpoint must have been trained as to resume here (the method; the
        relevance training's own name)."""
        self.out_dir, self.run_name, self.keep_checkpoints, self.dp = Path(out_dir), name, keep_checkpoints, dp
        self.step = 0  # steps completed
        self._resumed_at = 0  # the step this process started from (a loaded checkpoint's): the one stage it may take back
        self.records: list[dict] = []
        self.call_records: list[dict] = []
        self.val_records: list[dict] = []  # one row per validation item and validation (validation.csv)

    # -- what a subclass writes

    def train_step(self) -> dict:
        """One step: its record appended to ``records`` and returned, ``step`` advanced."""
        raise NotImplementedError

    def validate(self, step: int) -> dict[str, float]:
        """The ``val_*`` columns of a validation now; its per-item rows into ``val_records`` under ``step``."""
        raise NotImplementedError

    # -- what a subclass says about itself

    def _validates_at_start(self) -> bool:
        """Whether the run validates before its first update (a ``step = -1`` record)."""
        return True

    def _validation_due(self) -> bool:
        """Whether the step just completed (``self.step`` steps done) is followed by a validation."""
        raise NotImplementedError

    def _record_keys(self) -> dict[str, Any]:
        """Columns every record of the run starts with besides ``step`` (the joint trainer's ``method``)."""
        return {}

    def _progress_figures(self, record: dict) -> dict[str, str]:
        """The progress bar's figures from a step's record."""
        return {}

    def _log(self, record: dict) -> None:
        """A finished record to the live tracker, if the run has one."""

    def _close(self) -> None:
        """After :meth:`run`, whether it finished or stopped (the live tracker)."""

    def _extra_state(self) -> dict[str, Any]:
        """What else a checkpoint's ``state.pt`` holds (the joint trainer's scoring ranker)."""
        return {}

    def _load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        """Restore :meth:`_extra_state` from a checkpoint's ``state``."""

    def _save_weights(self, folder: Path) -> None:
        """The adapters in peft's format (and any scorer) into a checkpoint's ``folder``."""
        self.policies.save_adapters(folder / "adapters")

    # -- records

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.records)

    def calls_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.call_records)

    def validation_frame(self) -> pd.DataFrame:
        present = dict.fromkeys(name for record in self.val_records for name in record)
        return pd.DataFrame(self.val_records, columns=validation_columns(list(present)))

    # -- validation around the steps

    def _validate_at_start(self) -> None:
        """The start of the curves (``step = -1``): the validation before the first update, once."""
        if self.step == 0 and self._validates_at_start() and not any(r.get("step") == -1 for r in self.records):
            record = namespaced_record({"step": -1, **self._record_keys(), **self.validate(step=-1)})
            self.records.append(record)
            self._log(record)

    def _after_step(self, record: dict) -> None:
        """After each step of :meth:`run`: the validation when due (timed as ``validate_s``) into the
        step's record, then the record to the tracker."""
        if self._validation_due():
            clock = StageClock()
            with clock("validate"):
                validation = self.validate(step=record["step"])
            record.update(namespaced_record({**clock.columns(), **validation}))
        self._log(record)

    # -- running

    def run(self, steps: int | None = None) -> pd.DataFrame:
        """Train until ``steps`` (default ``cfg.steps``) steps are done, checkpointing every
        ``cfg.checkpoint_every`` steps and after the last. SIGUSR1 or SIGTERM (a cluster's
        time-limit warning or preemption, ``cosearch_lib.stop_signals``) does not kill the run: the
        step under way finishes, a checkpoint is written and ``StopRequested`` is raised; the run
        resumes from that checkpoint. Under data parallelism the ranks stop together, after the step
        in which any of them received the signal. Returns :meth:`frame`."""
        until = self.cfg.steps if steps is None else steps
        try:
            run_steps(self, until, checkpoint_every=self.cfg.checkpoint_every, desc=f"train {self.run_name}",
                      progress=self.progress, before_steps=self._validate_at_start, after_step=self._after_step,
                      postfix=self._progress_figures,
                      stopping=lambda received: self.dp.sum(float(received is not None)) > 0)
        finally:
            self._close()
        return self.frame()

    # -- checkpoints

    def checkpoint_dir(self, step: int | None = None) -> Path:
        return self.out_dir / CHECKPOINTS_DIR / checkpoint_name(self.step if step is None else step)

    def save_checkpoint(self) -> Path:
        """``out_dir/checkpoints/step_N/``: ``state.pt`` (adapters, optimizers, random states, step,
        records) and the adapters in peft's format, written whole or not at all; then the records as
        ``steps.csv``, ``ranker_calls.parquet`` and ``validation.csv`` (``run_schema``). Under data
        parallelism rank 0 writes (every rank holds the same state) and the others wait."""
        final = self.checkpoint_dir()
        if self.dp.is_main:
            final = write_checkpoint(self.out_dir, self.step, self._write_checkpoint, keep=self.keep_checkpoints)
            write_table(self.frame(), self.out_dir / STEPS_FILE)
            if self.call_records:
                write_table(self.calls_frame(), self.out_dir / RANKER_CALLS_FILE)
            if self.val_records:
                write_table(self.validation_frame(), self.out_dir / VALIDATION_FILE)
            self._drop_stages()
        self.dp.barrier()
        return final

    # -- the stage boundary inside a step

    def stage_path(self, step: int) -> Path:
        return self.out_dir / CHECKPOINTS_DIR / rollout_stage_name(step)

    def save_stage(self, step: int, payload: dict[str, Any]) -> Path | None:
        """The scored rollouts of ``step`` (``payload``), written whole or not at all before the update,
        with this run's identity and random states; rank 0 writes (every rank holds the whole step) and
        the others wait. A resumed run takes them back with :meth:`take_stage`. A full disk costs only
        this shortcut: a warning, and a stop before the step's checkpoint rolls the step out again."""
        path = self.stage_path(step)
        if self.dp.is_main:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(path) as tmp, tmp.open("wb") as f:
                    torch.save({"run": {"name": self.run_name, "seed": self.seed}, "step": step, "rng": rng_states(),
                                **payload}, f)
            except OSError as err:
                warnings.warn(f"could not save the rollouts of step {step + 1} ({err}): a stop before its checkpoint "
                              "rolls the step out again", RuntimeWarning, stacklevel=2)
                path = None
        self.dp.barrier()
        return path

    def take_stage(self, step: int) -> dict[str, Any] | None:
        """The scored rollouts :meth:`save_stage` wrote for ``step`` by this run (same method, seed and
        step), with the random states restored to where they were after them; None if there are none,
        or if this process did not start at ``step`` (they belong to the weights of the checkpoint of
        ``step``, not to a replay of the steps before it)."""
        path = self.stage_path(step)
        if step != self._resumed_at or not path.exists():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError, ValueError) as err:
            warnings.warn(f"{project_relative(path)} unreadable ({err}): step {step + 1} rolls out again", RuntimeWarning,
                          stacklevel=2)
            return None
        if saved.get("run") != {"name": self.run_name, "seed": self.seed} or saved.get("step") != step:
            return None
        restore_rng_states(saved["rng"])
        return saved

    def stop_at_boundary(self, step: int) -> None:
        """At the stage boundary of ``step`` (its rollouts saved): if a stop signal has arrived (on any
        rank), stop here, resumable into the update (``StopRequested``)."""
        received = pending_stop()
        if self.dp.sum(float(received is not None)) > 0:
            newest = latest_checkpoint(self.out_dir) if step or self.records else None
            if (step or self.records) and (newest is None or newest.name != checkpoint_name(step)):
                # the weights the saved rollouts were sampled with (checkpoint_every skipped them), and the
                # records so far (before the first update: the validation at the start)
                self.save_checkpoint()
            path = self.stage_path(step)
            print(f"[train {self.run_name}] {received or 'a signal to another rank'}: stopped after the rollout of step "
                  f"{step + 1}, its rollouts in {project_relative(path)}", flush=True)
            raise StopRequested(received or "a signal to another rank", step, project_relative(path), after_rollout=True)

    def _drop_stages(self) -> None:
        """The saved rollouts of the steps done (the checkpoint of ``step`` holds what they led to)."""
        for path in (self.out_dir / CHECKPOINTS_DIR).glob("rollouts_step_*.pt"):
            if path.name < rollout_stage_name(self.step):
                path.unlink(missing_ok=True)

    def _write_checkpoint(self, tmp: Path) -> None:
        """Everything a resumed run needs, into the empty folder ``tmp``."""
        config = asdict(self.cfg)
        save_state({"step": self.step, "run": {"name": self.run_name, "seed": self.seed},
                    "policies": self.policies.state_dict(), "records": self.records, "call_records": self.call_records,
                    "val_records": self.val_records, "config": config, "seed": self.seed, "rng": rng_states(),
                    **self._extra_state()}, tmp)
        self._save_weights(tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))

    def load_checkpoint(self, path: str | Path | None = None) -> int:
        """Continue from checkpoint ``path`` (None: the newest whole one under ``out_dir``; with none
        the run stays where it is, step 0 for a new run); returns the steps done. A checkpoint of
        another method or seed is refused (ValueError)."""
        path = latest_checkpoint(self.out_dir) if path is None else Path(path)
        if path is None:
            return self.step
        state = load_state(path)
        # checkpoints written before the run identity: the joint trainer's config names its method;
        # the relevance training's names none
        identity = state.get("run") or {"name": state["config"].get("method", self.run_name), "seed": state["seed"]}
        if identity["name"] != self.run_name:
            raise ValueError(f"checkpoint {project_relative(path)} is of method {identity['name']!r}, "
                             f"not {self.run_name!r}")
        if identity["seed"] != self.seed:
            raise ValueError(f"checkpoint {project_relative(path)} was trained with seed {identity['seed']}, "
                             f"not {self.seed}")
        self.policies.load_state_dict(state["policies"])
        self._load_extra_state(state, path)
        self.step = self._resumed_at = state["step"]
        # records of older checkpoints under today's column names (run_schema.current_step_columns)
        self.records = [current_step_record(r) for r in state["records"]]
        self.call_records = [current_step_columns(r) for r in state.get("call_records", [])]
        self.val_records = [current_step_columns(r) for r in state.get("val_records", [])]  # older checkpoints: none
        restore_rng_states(state["rng"])
        self.served.forget()  # the generation engine serves the restored weights from its next use
        return self.step
