"""Reading training runs back: step records, warm-start summaries, and the evaluation of trained
policies with the harness of notebook 02 (what notebook 03 shows).

Everything here reads what :class:`training.JointTrainer` and :func:`warmstart.warm_start` wrote to
disk, so the tables and figures can be rebuilt without the live trainer.

Layout of a profile's training runs (``papermill_runs/<profile>/training/``)::

    <method>/steps.csv                      one row per step (training.STEP_GLOSSARY)
    <method>/ranker_calls.parquet           one row per ranker call (sub-query, reward, group, advantage)
    <method>/checkpoints/step_N/adapters/   the policies after step N, peft format
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .paths import path_text
from .training import EVAL_METHOD, METHODS, latest_checkpoint
from .warmstart import warmstart_summary


def training_root(profile: str) -> Path:
    """``papermill_runs/<profile>/training``: one folder per trained method."""
    from .runs import run_dir

    return run_dir(profile) / "training"


def read_steps(root: str | Path, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The step records of every method under ``root`` (or the named ones), concatenated in
    :data:`training.METHODS` order. Raises FileNotFoundError naming what is missing."""
    root = Path(root)
    wanted = list(methods) if methods is not None else [m for m in METHODS if (root / m / "steps.csv").exists()]
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


def trained_eval_settings(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path]) -> dict[str, Any]:
    """EvalConfig fields that evaluate a training method's policies: the evaluation method
    (:data:`training.EVAL_METHOD`), its agent adapter and, per method, its ranker adapter. A shared
    backbone plays both roles; the fixed ranker is the warm-started one, as in training."""
    if method not in EVAL_METHOD:
        raise ValueError(f"unknown training method {method!r}; expected one of {METHODS}")
    agent = adapters.get("agent", adapters.get("shared"))
    if agent is None and adapters:
        raise ValueError(f"no agent adapter among {sorted(adapters)}")
    fields: dict[str, Any] = {"methods": (EVAL_METHOD[method],), "agent_adapter": path_text(agent)}
    if method == "cosearch":
        # no adapters at all (before GRPO, without a warm start): the base model ranks, prompted
        fields["trained_ranker_adapter"] = path_text(adapters.get("ranker", adapters.get("shared")))
        if fields["trained_ranker_adapter"] is None:
            fields["methods"] = ("agent_fixed_ranker",)
    if method == "fixed_ranker":
        fields["fixed_ranker_adapter"] = path_text(adapters.get("ranker") or warm.get("ranker"))
    return fields



def evaluate_before_after(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path],
                          examples: Sequence[Any], ctx: Any, base_cfg: Any, *, progress: bool = True,
                          labels: tuple[str, str] = ("warm start", "after GRPO")) -> pd.DataFrame:
    """The method's evaluation (``base_cfg``: an EvalConfig) with the warm-started policies and with
    the trained ones, on the same questions. The ``method`` column reads ``"<method>: <label>"``; the
    harness's own method name stays in ``eval_method``."""
    from dataclasses import replace

    from .evaluation import run_evaluation

    frames = []
    warm_adapters = {role: warm[role] for role in ("agent", "ranker") if role in warm}
    for label, chosen in zip(labels, (warm_adapters, adapters)):
        fields = trained_eval_settings(method, chosen, warm)
        ecfg = replace(base_cfg, **fields)
        records = run_evaluation(None, examples, ctx, ecfg, progress=progress)
        frames.append(records.assign(eval_method=records["method"], method=f"{method}: {label}"))
    return pd.concat(frames, ignore_index=True)
