"""Ranker quality on held-out sub-queries: the retriever's order, the warm-started ranker, the
relevance-trained Fixed Ranker and a jointly trained ranker, on the same items, with intervals.

Items are the relevance training's held-out sub-queries (``rl.relevance_training``: the gold-chain
hops of ``relevance.val_per_dataset`` dev questions per family); each ranker contributes one row per
item (``question_id`` = item id, ``dataset``, ``hit@1/3/5``, ``valid``), the rows
``RankerValidationSet.score_items`` returns. The relevance run's ``validation.csv`` already holds the
warm start (its step -1) and the trained ranker (its last validation); the retriever's order and any
other ranker are scored by ``experiment.held_out_ranker_rows``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib import experiment
from cosearch_lib.config import SCORING_RANKER_KINDS
from cosearch_lib.eval.intervals import LEVEL, N_RESAMPLES, bootstrap_interval
from cosearch_lib.eval.tables import comparison_table
from cosearch_lib.records.training_runs import validation_curves
from cosearch_lib.run_schema import (
    STEPS_FILE,
    VALIDATION_COLUMNS,
    VALIDATION_FILE,
    hit_columns_in,
    step_table_under_current_names,
    under_current_names,
)

#: The row labels of the ranker-quality table, in its order.
RETRIEVER_ORDER = "retriever order"
WARM_START = "warm start"
RELEVANCE_TRAINED = "relevance-trained (Fixed Ranker)"


def read_relevance_run(folder: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, validation) of a relevance-training run folder (``experiment.relevance_dir(cfg) / "run"``);
    FileNotFoundError naming the folder when it holds no records."""
    folder = Path(folder)
    if not (folder / STEPS_FILE).exists():
        raise FileNotFoundError(f"no relevance-training records in {folder} (train it first: experiment.relevance_ranker)")
    validation = pd.read_csv(folder / VALIDATION_FILE, dtype={"question_id": str, "dataset": str}) \
        if (folder / VALIDATION_FILE).exists() else pd.DataFrame(columns=list(VALIDATION_COLUMNS))  # never validated
    return step_table_under_current_names(pd.read_csv(folder / STEPS_FILE)), under_current_names(validation)


def relevance_endpoints(validation: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The relevance run's per-item rows before its first update (the warm start) and at its last
    validation (the Fixed Ranker), labelled as the quality table's rows."""
    rows = validation[validation["kind"] == "ranker"]
    if rows.empty:
        raise ValueError("the relevance run has no ranker validation rows (relevance.val_per_dataset: 0?)")
    steps = sorted(rows["step"].unique())
    if steps[0] != -1 or len(steps) < 2:
        raise ValueError(f"the relevance run was validated at steps {steps}; the table needs -1 and a later one")
    return {WARM_START: rows[rows["step"] == -1], RELEVANCE_TRAINED: rows[rows["step"] == steps[-1]]}


def quality_records(rows: Mapping[str, pd.DataFrame | Sequence[dict[str, Any]]]) -> pd.DataFrame:
    """One frame of per-item rows, ``method`` = the ranker's label; every ranker must cover the same items
    and have the same Hit columns (``hit@<k>``, ``hit@K``: the same K)."""
    frames = []
    for label, part in rows.items():
        part = under_current_names(pd.DataFrame(part))
        frames.append(part[["question_id", "dataset", *hit_columns_in(part.columns), "valid"]].assign(method=label))
    hits = [hit_columns_in(f.columns) for f in frames]
    if any(h != hits[0] for h in hits):
        raise ValueError(f"the rankers' rows have different Hit columns {hits}: score them at the same K and cutoffs")
    items = [frozenset(f["question_id"]) for f in frames]
    if any(i != items[0] for i in items):
        raise ValueError("the rankers were scored on different held-out items; score them on the same ones")
    return pd.concat(frames, ignore_index=True)


def quality_table(records: pd.DataFrame, *, level: float = LEVEL, n_resamples: int = N_RESAMPLES,
                  seed: int = 0) -> pd.DataFrame:
    """Per ranker: each Hit column (``hit@<k>``, ``hit@K``; mean over items) with its family-stratified
    bootstrap interval, the valid rate and the item count."""
    out = []
    for label, part in records.groupby("method", sort=False):
        row: dict[str, Any] = {"ranker": label, "n_items": len(part)}
        for col in hit_columns_in(records.columns):
            ci = bootstrap_interval(part[col].to_numpy(float), part["dataset"].to_numpy(), statistic="mean", level=level,
                                    n_resamples=n_resamples, seed=seed, when_too_few="note")
            row.update({col: ci.estimate, f"{col}_low": ci.ci_low, f"{col}_high": ci.ci_high})
        row["valid_rate"] = float(part["valid"].mean())
        out.append(row)
    return pd.DataFrame(out).set_index("ranker")


def quality_comparisons(records: pd.DataFrame, *, metric: str = "hit@1", baseline: str = RETRIEVER_ORDER,
                        seed: int = 0) -> pd.DataFrame:
    """Every other ranker minus ``baseline`` on ``metric``, paired over the same items (the
    comparison columns of ``eval.tables.comparison_table``); then the relevance-trained ranker
    against the warm start and each later ranker against the relevance-trained one, when present."""
    labels = list(dict.fromkeys(records["method"]))
    pairs = [(m, baseline) for m in labels if m != baseline]
    if RELEVANCE_TRAINED in labels and WARM_START in labels:
        pairs.append((RELEVANCE_TRAINED, WARM_START))
    if RELEVANCE_TRAINED in labels:
        pairs += [(m, RELEVANCE_TRAINED) for m in labels[labels.index(RELEVANCE_TRAINED) + 1:]]
    table = comparison_table(records, pairs, metric, statistic="mean", seed=seed)
    table.attrs["unit"] = "sub-queries"  # what the verdicts count: items are held-out sub-queries, not questions
    return table


def ranker_quality_records(cfg: Any, retriever: Any, trained: Mapping[str, str | Path] | None = None) -> pd.DataFrame:
    """The quality table's per-item records for a profile: the retriever's order, the warm-started
    ranker and the relevance-trained one (from the relevance run's records when ``relevance.enabled``;
    the warm start scored afresh otherwise; a scoring ``training.ranker_kind``: its listwise-trained
    start, scored afresh), then each ``trained`` ranker adapter ({label: folder},
    e.g. CoSearch's after GRPO), all on :func:`cosearch_lib.experiment.relevance_held_out`."""
    rankers: dict[str, str | Path | None] = {RETRIEVER_ORDER: None}
    saved: dict[str, pd.DataFrame] = {}
    if cfg.training.ranker_kind in SCORING_RANKER_KINDS:  # a scoring Fixed Ranker: its listwise-trained start, scored here
        rankers[RELEVANCE_TRAINED] = experiment.fixed_ranker(cfg, retriever)
    elif cfg.relevance.enabled:
        saved = relevance_endpoints(read_relevance_run(experiment.relevance_dir(cfg) / "run")[1])
    else:
        warm = experiment.warm_start(cfg, retriever, roles=("ranker",)).get("ranker")
        if warm is None:
            raise ValueError(f"profile {cfg.profile!r} has neither a relevance-trained nor a warm-started ranker to score")
        rankers[WARM_START] = warm
    rankers.update(trained or {})
    scored = experiment.held_out_ranker_rows(cfg, retriever, rankers)
    order = [RETRIEVER_ORDER, WARM_START, RELEVANCE_TRAINED, *(trained or {})]
    merged = {**scored, **saved}
    return quality_records({label: merged[label] for label in order if label in merged})


def listwise_curve(folder: str | Path) -> pd.DataFrame:
    """The held-out Hit@1 curve a saved scoring ranker's listwise training recorded (its marker file's
    ``listwise.curve``: examples, hit@1, train_s, loss), labelled ``recipe`` by its marker's name;
    empty when it was not trained listwise. The argument of ``viz.ranker_probes.plot_ranker_recipes``."""
    folder = Path(folder)
    for marker in sorted(folder.glob("*.json")):
        notes = json.loads(marker.read_text())
        if isinstance(notes, dict) and "listwise" in notes:
            curve = pd.DataFrame(notes["listwise"].get("curve") or [])
            return curve.assign(recipe=marker.stem.replace("_", " "))
    return pd.DataFrame(columns=["recipe", "examples", "hit@1", "train_s", "loss"])


def relevance_curves(validation: pd.DataFrame, retriever_rows: Sequence[dict[str, Any]], *,
                     hits: Sequence[str] | None = None, seed: int = 0) -> tuple[dict[str, pd.DataFrame], dict[str, dict[str, float]]]:
    """The relevance run's held-out Hit curves (``training_runs.validation_curves``, one panel per Hit
    column of ``hits``; None: every one the records hold, e.g. ``hit@1`` and ``hit@K``) and, per panel,
    the retriever's order on the same items as a reference level: the arguments of
    ``viz.plots.plot_validation_curves``. A run validated on no held-out item (``relevance.val_per_dataset: 0``)
    has no curve: ValueError saying so."""
    if "kind" not in validation.columns or not (validation["kind"] == "ranker").any():
        raise ValueError("the relevance run has no ranker validation rows, so no held-out curve "
                         "(relevance.val_per_dataset: 0?)")
    retriever = under_current_names(pd.DataFrame(list(retriever_rows)))
    panels, refs = {}, {}
    for hit in hits or hit_columns_in(validation.columns):
        title = f"held-out {hit.replace('hit', 'Hit')}"
        panels[title] = validation_curves(validation, kind="ranker", metric=hit, seed=seed)
        if len(retriever):
            refs[title] = {RETRIEVER_ORDER: float(retriever[hit].mean())}
    return panels, refs
