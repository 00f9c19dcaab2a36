"""Reading training runs back: step records, warm-start summaries, and the evaluation of trained
policies with the harness of notebook 02 (what notebook 03 shows).

Everything here reads what :class:`cosearch_lib.rl.trainer.JointTrainer` and :func:`cosearch_lib.experiment.warm_start` wrote to
disk, so the tables and figures can be rebuilt without the live trainer.

Layout of a profile's training runs (``papermill_runs/<profile>/training/``)::

    <method>/steps.csv                      one row per step (run_schema.STEP_GLOSSARY)
    <method>/ranker_calls.parquet           one row per ranker call (sub-query, reward, group, advantage)
    <method>/validation.csv                 one row per validation item and validation (run_schema.VALIDATION_GLOSSARY)
    <method>/checkpoints/step_N/adapters/   the policies after step N, peft format
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from cosearch_lib.config.methods import TRAINING_METHODS, method_spec
from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.eval.intervals import LEVEL, N_RESAMPLES, bootstrap_interval, interval_excludes_zero, verdicts
from cosearch_lib.eval.tables import comparison_table
from cosearch_lib.models.scoring_rankers import is_scoring_ranker_folder
from cosearch_lib.paths import run_dir
from cosearch_lib.rl.warm_start import warmstart_summary
from cosearch_lib.run_schema import (
    RANKER_CALLS_FILE,
    STEPS_FILE,
    VALIDATION_COLUMNS,
    VALIDATION_FILE,
    latest_checkpoint,
    renamed_slots,
    step_table_under_current_names,
    under_current_names,
)

#: Step-record columns that say why a trained ranker did or did not learn: its groups before and after
#: the filters, the composite reward's parts over all calls and over the grouped ones, and Hit@K.
RANKER_DIAGNOSTICS = ("method", "step", "ranker/n_calls", "ranker/grouping_n_clusters_pre", "ranker/grouping_n_groups_post",
                      "ranker/grouping_n_dropped_small", "ranker/grouping_n_dropped_zero_var", "ranker/r_rel_pre",
                      "ranker/r_rel_post", "ranker/main_pre", "ranker/main_post", "ranker/reward_pre", "ranker/reward_post",
                      "ranker/hit@K")


def training_root(profile: str) -> Path:
    """``papermill_runs/<profile>/training``: one folder per trained method."""

    return run_dir(profile) / "training"


def read_steps(root: str | Path, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The step records of every method under ``root`` (or the named ones), concatenated in
    :data:`cosearch_lib.config.methods.TRAINING_METHODS` order. Raises FileNotFoundError naming what is missing."""
    root = Path(root)
    wanted = list(methods) if methods is not None else [m for m in TRAINING_METHODS if (root / m / STEPS_FILE).exists()]
    missing = [m for m in wanted if not (root / m / STEPS_FILE).exists()]
    if missing or not wanted:
        raise FileNotFoundError(f"no step records for {missing or 'any method'} under {root} (run the training first)")
    frames = [step_table_under_current_names(pd.read_csv(root / m / STEPS_FILE)) for m in wanted]
    return pd.concat(frames, ignore_index=True)


def read_runs(profiles: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The step and per-item validation records (:func:`read_steps`, :func:`read_validation`) of
    every method trained under the run folders of ``profiles``, joined: one figure of methods trained
    with different recipes (profiles), e.g. ``laptop_curve``'s Retrieval Only beside
    ``laptop_curve_wide``'s CoSearch. A method trained under two of them is refused (ValueError)."""
    steps, validation, home = [], [], {}
    for profile in profiles:
        root = training_root(profile)
        methods = [m for m in TRAINING_METHODS if (root / m / STEPS_FILE).exists()]
        for m in methods:
            if m in home:
                raise ValueError(f"{m} was trained under both {home[m]!r} and {profile!r}: name one of them")
            home[m] = profile
        if methods:
            steps.append(read_steps(root, methods))
            validation.append(read_validation(root, methods))
    if not steps:
        raise FileNotFoundError(f"no step records under the run folders of {list(profiles)} (run the training first)")
    return pd.concat(steps, ignore_index=True), pd.concat(validation, ignore_index=True)


def questions_trained(steps: pd.DataFrame) -> dict[tuple[str, int], float]:
    """{(method, step): training questions rolled out up to and including ``step``}, from the step
    records' ``rollout/n_questions`` (step -1, the validation before the first update: 0). The axis
    on which runs of different questions per step line up."""
    out: dict[tuple[str, int], float] = {}
    trained = steps[steps["step"] >= 0].sort_values("step")
    for method, part in trained.groupby("method", sort=False):
        for step, done in zip(part["step"], part["rollout/n_questions"].fillna(0).cumsum()):
            out[(method, int(step))] = float(done)
        out[(method, -1)] = 0.0
    return out


def read_ranker_calls(root: str | Path, method: str) -> pd.DataFrame:
    """The per-call records of a method (empty when it made no ranker calls)."""
    path = Path(root) / method / RANKER_CALLS_FILE
    return under_current_names(pd.read_parquet(path)) if path.exists() else pd.DataFrame()


def read_validation(root: str | Path, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The per-item validation records (``validation.csv``) of the named methods (default: every
    method under ``root`` that has them), concatenated; columns :func:`run_schema.validation_columns`
    (records written before a rename, under today's names).
    A method trained without validation (``eval_every: 0``) contributes no rows."""
    root = Path(root)
    wanted = list(methods) if methods is not None else list(TRAINING_METHODS)
    frames = [under_current_names(pd.read_csv(root / m / VALIDATION_FILE, dtype={"question_id": str, "dataset": str}))
              for m in wanted if (root / m / VALIDATION_FILE).exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(VALIDATION_COLUMNS))


#: What the validation curves show, per kind of validation row: (metric, statistic). The agent's
#: ``val_f1`` is the macro average over families (the paper's avg); the ranker's Hit@k is a plain mean
#: over held-out sub-queries, as the step-record columns are.
VALIDATION_METRICS = {"agent": ("f1", "macro"), "ranker": ("hit@1", "mean")}


def _validation_rows(validation: pd.DataFrame, kind: str, metric: str) -> pd.DataFrame:
    rows = validation[validation["kind"] == kind]
    if metric not in rows or rows[metric].isna().all():
        raise ValueError(f"no {kind!r} validation rows with {metric!r}")
    return rows


def validation_curves(validation: pd.DataFrame, *, kind: str = "agent", metric: str | None = None,
                      level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0,
                      steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (method, validation step): ``estimate`` (what the step record's ``val_*`` column
    holds) with its family-stratified bootstrap interval ``ci_low``..``ci_high`` over the validation
    items, ``n`` items and a ``note`` when no interval could be drawn (a family with one item).
    ``x`` is the number of steps completed (0: before the first update); with the run's ``steps``
    records also ``questions``, the training questions rolled out by then (:func:`questions_trained`)."""
    metric = metric or VALIDATION_METRICS[kind][0]
    statistic = VALIDATION_METRICS[kind][1]
    rows = []
    for (method, step), part in _validation_rows(validation, kind, metric).groupby(["method", "step"], sort=False):
        per_item = part.groupby(["dataset", "question_id"])[metric].mean()
        ci = bootstrap_interval(per_item.to_numpy(), per_item.index.get_level_values("dataset"), statistic=statistic,
                                level=level, n_resamples=n_resamples, seed=seed, when_too_few="note")
        rows.append({"method": method, "step": int(step), "x": int(step) + 1, "estimate": ci.estimate,
                     "ci_low": ci.ci_low, "ci_high": ci.ci_high, "n": ci.n_questions, "note": ci.note})
    table = pd.DataFrame(rows, columns=["method", "step", "x", "estimate", "ci_low", "ci_high", "n", "note"])
    if steps is not None:
        done = questions_trained(steps)
        table["questions"] = [done.get((m, int(s)), float("nan")) for m, s in zip(table["method"], table["step"])]
    table.attrs = {"kind": kind, "metric": metric, "statistic": statistic, "level": level}
    return table


def validation_comparisons(validation: pd.DataFrame, methods: Sequence[str], *, kind: str = "agent",
                           metric: str | None = None, reference: str = "cosearch", level: float = LEVEL,
                           n_resamples: int = N_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """Paired bootstrap intervals on the validation items (same items, greedy, so every pair is
    paired), as ``eval.tables.comparison_table`` rows labelled ``"<method> @ <x>"`` (``x``: steps
    completed):

    * each method at its last validation against itself before the first update (when validated there);
    * ``reference`` against every other method, at the last validation step they share.

    Pairs that cannot be formed are listed in ``attrs["skipped"]``."""
    metric = metric or VALIDATION_METRICS[kind][0]
    statistic = VALIDATION_METRICS[kind][1]
    rows = _validation_rows(validation, kind, metric)
    rows = rows[rows["method"].isin(methods)]
    labelled = rows.assign(method=rows["method"] + " @ " + (rows["step"] + 1).astype(str))
    steps = {m: sorted(set(rows.loc[rows["method"] == m, "step"])) for m in methods}
    pairs, skipped = [], []
    for m in methods:
        have = steps[m]
        if len(have) >= 2 and have[0] == -1:
            pairs.append((f"{m} @ {have[-1] + 1}", f"{m} @ 0"))
        else:
            skipped.append(f"{m}: last vs before training ({'no validation' if not have else 'not validated at start'})")
    if reference in methods:
        for m in methods:
            if m == reference:
                continue
            shared = sorted(set(steps[reference]) & set(steps[m]))
            if shared:
                pairs.append((f"{reference} @ {shared[-1] + 1}", f"{m} @ {shared[-1] + 1}"))
            else:
                skipped.append(f"{reference} vs {m} (no shared validation step)")
    table = comparison_table(labelled, pairs, metric, statistic=statistic, level=level, n_resamples=n_resamples,
                             seed=seed) if pairs else comparison_table(labelled.iloc[:0], [], metric)
    table.attrs["skipped"] = table.attrs.get("skipped", []) + skipped
    table.attrs.update(statistic=statistic, metric=metric, level=level,
                       unit="questions" if kind == "agent" else "sub-queries")
    return table


#: The rows of a learning-curve table per method: every validation question, then those of the
#: multi-hop families alone (``eval.benchmark_families.hop_group``).
CURVE_FAMILY_GROUPS = ("all", "multi")
LEARNING_CURVE_COLUMNS = ("method", "families", "start_step", "end_step", "start", "end", "diff", "ci_low", "ci_high",
                          "n_questions", "n_families", "note")


def learning_curve_table(validation: pd.DataFrame, methods: Sequence[str], *, kind: str = "agent",
                         level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """What training did to each method's held-out score: the last validation minus the one before
    the first update, paired over the same items (:func:`validation_comparisons`' first pair), on
    every family and on the multi-hop families alone (:data:`CURVE_FAMILY_GROUPS`; for the ranker,
    the sub-queries of those families' questions). Columns :data:`LEARNING_CURVE_COLUMNS`; steps are
    steps completed (0: the warm start). A method without a validation at start and after it has no
    row, and is named in ``attrs["skipped"]``."""
    rows, skipped = [], []
    for group in CURVE_FAMILY_GROUPS:
        part = validation if group == "all" else validation[validation["dataset"].astype(str).map(hop_group) == group]
        if not len(part[part["kind"] == kind]):
            skipped.append(f"{group}: no {kind} validation rows")
            continue
        table = validation_comparisons(part, methods, kind=kind, reference="", level=level, n_resamples=n_resamples,
                                       seed=seed)
        skipped += [f"{group}: {why}" for why in table.attrs["skipped"]]
        for r in table.to_dict(orient="records"):
            method, end = r["a"].rsplit(" @ ", 1)
            rows.append({"method": method, "families": group, "start_step": 0, "end_step": int(end), "start": r["mean_b"],
                         "end": r["mean_a"], **{k: r[k] for k in ("diff", "ci_low", "ci_high", "n_questions",
                                                                  "n_families", "note")}})
    order = {m: i for i, m in enumerate(methods)}
    table = pd.DataFrame(rows, columns=list(LEARNING_CURVE_COLUMNS))
    table = table.sort_values("method", key=lambda m: m.map(order), kind="stable").reset_index(drop=True)
    table.attrs = {"kind": kind, "metric": VALIDATION_METRICS[kind][0], "statistic": VALIDATION_METRICS[kind][1],
                   "level": level, "skipped": skipped}
    return table


#: What GRPO had to work with, per method, over its first and its last steps (:func:`grpo_signal_table`).
GRPO_SIGNAL_COLUMNS = ("rollout/agent_f1", "rollout/agent_best_of_g_f1", "rollout/agent_groups_without_signal",
                       "rollout/searches_per_traj", "ranker/grouping_n_groups_post")


def grpo_signal_table(steps: pd.DataFrame, methods: Sequence[str], *, span: int = 2) -> pd.DataFrame:
    """Each method's step records averaged over its first ``span`` steps and its last ``span``: the
    training questions' mean-of-G and best-of-G F1 (pass@1 and pass@G in F1), the share of questions
    without signal, searches per trajectory and, for a method that trains its ranker, the ranker groups
    trained per step; each also averaged over every step (part ``all``). One row per (method, part), columns
    ``method``, ``part``, ``steps`` (which steps, 0-based), then :data:`GRPO_SIGNAL_COLUMNS`; a column a
    method's records lack is NaN, and so are the ranker groups of a method that trains no ranker."""
    rows = []
    trained = steps[steps["step"] >= 0] if "step" in steps else steps.iloc[0:0]
    for method in methods:
        mine = trained[trained["method"] == method].sort_values("step")
        if not len(mine):
            continue
        parts = {"first": mine.head(span), "last": mine.tail(span), "all": mine}
        for part, frame in parts.items():
            values = {c: float(frame[c].mean()) if c in frame else float("nan") for c in GRPO_SIGNAL_COLUMNS}
            if not method_spec(method).trains_ranker:  # its records group the calls for the diagnostics; none is trained
                values["ranker/grouping_n_groups_post"] = float("nan")
            rows.append({"method": method, "part": part, "steps": f"{int(frame['step'].min())}-{int(frame['step'].max())}",
                         **values})
    return pd.DataFrame(rows, columns=["method", "part", "steps", *GRPO_SIGNAL_COLUMNS])


def training_summary(steps: pd.DataFrame, comparisons: pd.DataFrame | None = None,
                     validation: Mapping[str, pd.DataFrame] | None = None) -> list[str]:
    """What a training run shows, as sentences generated from its records (notebook 03's last cell):

    * per method, its steps, seconds per step, and the mean agent reward and searches per
      trajectory over the first and the last third of its steps (sampled rollouts: a training
      signal, not an evaluation);
    * the verdict of every paired comparison on the validation items (``validation``:
      :func:`validation_comparisons` per kind) and on the test questions (``comparisons``:
      ``eval.tables.comparison_table``);
    * which of them show a difference (their interval excludes 0), or that none does.
    """
    lines = []
    trained = steps[steps["step"] >= 0]
    for method, part in trained.groupby("method", sort=False):
        third = max(1, len(part) // 3)
        head, tail = part.head(third), part.tail(third)
        seconds = f", {part['time/step_s'].mean():.0f} s per step" if "time/step_s" in part else ""
        reward, searches = "rollout/agent_reward", "rollout/searches_per_traj"
        lines.append(f"{method}: {len(part)} GRPO steps{seconds}; agent reward {head[reward].mean():.3f} "
                     f"(first {third}) -> {tail[reward].mean():.3f} (last {third}), searches per trajectory "
                     f"{head[searches].mean():.2f} -> {tail[searches].mean():.2f}")
    tables = [(f"validation ({kind})", table) for kind, table in (validation or {}).items()]
    if comparisons is not None:
        tables.append(("test questions", comparisons))
    shown = []
    for where, table in tables:
        for line, (_, row) in zip(verdicts(table), table.iterrows()):
            lines.append(f"{where}: {line}")
            if interval_excludes_zero(row["ci_low"], row["ci_high"]):
                shown.append(f"{row['a']} vs {row['b']} ({where})")
        lines += [f"{where}: {line}" for line in verdicts(table)[len(table):]]  # pairs left out, and why
    if tables:
        lines.append("A difference is shown by: " + "; ".join(shown) if shown else
                     "No comparison shows a difference at these sample sizes: every interval includes 0. That is "
                     "not evidence of no effect; more steps and questions (a larger profile) are what can tell.")
    return lines


def checkpoint_adapters(root: str | Path, method: str) -> dict[str, Path]:
    """{adapter name: folder} of the newest checkpoint of ``method`` (agent, ranker or shared)."""
    ckpt = latest_checkpoint(Path(root) / method)
    if ckpt is None:
        raise FileNotFoundError(f"no checkpoint of {method!r} under {Path(root) / method}")
    # LoRA adapters (peft folders) and, for a scoring ranker, its saved folder (models.scoring_rankers),
    # under today's slot names (an older checkpoint's scoring ranker: run_schema.RENAMED_SLOTS)
    return renamed_slots({p.name: p for p in sorted((ckpt / "adapters").iterdir())
                          if (p / "adapter_config.json").exists() or is_scoring_ranker_folder(p)})


def warmstart_table(folders: dict[str, str | Path]) -> pd.DataFrame:
    """One row per warm-started role: sequences, tokens, optimizer steps, first/last logged loss, wall time, and
    whether it trained in bf16 (empty for a summary written before ``warmstart.autocast``: float32 on a CPU)."""
    rows = []
    if not folders:  # no warm start (warmstart.enabled: false)
        return pd.DataFrame(columns=["sequences", "tokens", "trained_tokens", "steps", "first_loss", "last_loss",
                                     "train_loss", "wall_s", "bf16"], index=pd.Index([], name="role"))
    for role, folder in folders.items():
        s = warmstart_summary(folder)
        losses = [x["loss"] for x in s["losses"]]
        rows.append({"role": role, "sequences": s["n_sequences"], "tokens": s["tokens"],
                     "trained_tokens": s["trained_tokens"], "steps": s["steps"],
                     "first_loss": losses[0] if losses else float("nan"),
                     "last_loss": losses[-1] if losses else float("nan"), "train_loss": s["train_loss"],
                     "wall_s": s["wall_s"], "bf16": s.get("bf16")})
    return pd.DataFrame(rows).set_index("role")


def warmstart_losses(folders: dict[str, str | Path]) -> pd.DataFrame:
    """Tidy (role, step, loss) rows of the warm start's logged losses, for plotting."""
    rows = [{"role": role, "step": x["step"], "loss": x["loss"]}
            for role, folder in folders.items() for x in warmstart_summary(folder)["losses"]]
    return pd.DataFrame(rows, columns=["role", "step", "loss"])
