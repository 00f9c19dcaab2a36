"""The paper's findings among methods trained in different runs, on the same test questions (issue 48).

A run trains what its budget allows: ``laptop_curve_wide`` trains Retrieval Only and CoSearch on 192
questions x G = 8; ``laptop`` trains all four methods on 16 questions x G = 4. When their notebook-03
evaluations read the same test questions (the same world, split and seed), the trained policies can be
paired question by question:

* :func:`runs_eval_records` stacks the runs' ``03_eval_records.parquet``, each trained policy labelled
  ``"<method> @ <profile>"``, with what each one's training rolled out (from its step records);
* :func:`findings_across_runs` takes each method from the run whose training rolled out the most
  trajectories and gives :data:`~cosearch_lib.config.methods.PAPER_FINDINGS` with paired 95% intervals
  (``eval.tables.comparison_table``), each side's training beside it.

Runs whose records cannot be paired, or whose differences would not be the training's, are refused
(ValueError naming them): a different seed, other test questions, or other evaluation settings
(:data:`EVALUATION_SETTINGS`: the models, N, K, the search cap, the answer F1).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cosearch_lib.config import ProfileConfig, load_profile
from cosearch_lib.config.methods import PAPER_FINDINGS, TRAINING_METHODS
from cosearch_lib.eval.tables import comparison_table, load_records
from cosearch_lib.paths import run_dir
from cosearch_lib.records.ablations import AFTER, EVAL_RECORDS
from cosearch_lib.records.training_runs import STEPS_FILE, read_steps, training_root

#: The settings two runs must share for their trained policies to differ by their training alone.
EVALUATION_SETTINGS = {"models.agent": lambda c: c.models.agent, "models.ranker": lambda c: c.models.ranker,
                       "search.topn": lambda c: c.search.topn, "search.topk": lambda c: c.search.topk,
                       "search.max_searches": lambda c: c.search.max_searches, "evaluation.f1": lambda c: c.evaluation.f1}
#: Columns of :func:`runs_eval_records`'s budget table, one row per trained policy.
BUDGET_COLUMNS = ("label", "profile", "method", "steps", "questions", "trajectories")


def policy_label(method: str, profile: str) -> str:
    return f"{method} @ {profile}"


def _training_budget(cfg: ProfileConfig, method: str) -> dict:
    """Steps, questions and trajectories ``method``'s training under ``cfg``'s run folder rolled out (its step records)."""
    root = training_root(cfg.profile)
    if not (root / method / STEPS_FILE).exists():  # evaluated, but its training records are elsewhere: unknown
        return {"steps": float("nan"), "questions": float("nan"), "trajectories": float("nan")}
    steps = read_steps(root, [method])
    trained = steps[steps["step"] >= 0]
    questions = float(trained["rollout/n_questions"].sum())
    trajectories = (float(trained["rollout/n_trajectories"].sum()) if "rollout/n_trajectories" in trained
                    else questions * cfg.training.group_size)  # records older than the column
    return {"steps": len(trained), "questions": questions, "trajectories": trajectories}


def runs_eval_records(profiles: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trained policies' test records of every profile whose run folder holds notebook 03's records,
    ``method`` relabelled :func:`policy_label` (``policy``: the method, ``profile``: the run), and one row
    per policy of :data:`BUDGET_COLUMNS`. Raises ValueError when the runs differ in seed or test questions,
    FileNotFoundError when fewer than one run has records."""
    frames, budgets, seeds, questions, settings = [], [], {}, {}, {}
    for profile in profiles:
        cfg = load_profile(profile)
        path = run_dir(cfg.profile) / EVAL_RECORDS
        if not path.exists():
            continue
        records = load_records(path)
        records = records[records["method"].str.endswith(f": {AFTER}")]
        if records.empty:  # notebook 03 evaluated no trained policy there (evaluate_policies=false)
            continue
        policy = records["method"].str.removesuffix(f": {AFTER}")
        frames.append(records.assign(policy=policy, profile=cfg.profile, method=[policy_label(m, cfg.profile) for m in policy]))
        seeds[cfg.profile] = cfg.seed
        settings[cfg.profile] = {name: read(cfg) for name, read in EVALUATION_SETTINGS.items()}
        questions[cfg.profile] = dict(zip(zip(records["dataset"].astype(str), records["question_id"].astype(str)),
                                          records["question"]))
        for method in [m for m in TRAINING_METHODS if m in set(policy)]:
            budgets.append({"label": policy_label(method, cfg.profile), "profile": cfg.profile, "method": method,
                            **_training_budget(cfg, method)})
    if not frames:
        raise FileNotFoundError(f"no {EVAL_RECORDS} under the run folders of {list(profiles)}: "
                                f"run notebook 03 with evaluate_policies=true")
    if len(set(seeds.values())) > 1:
        raise ValueError(f"the runs have different seeds {seeds}: their test records cannot be paired")
    first, *rest = questions
    for other in rest:
        differ = {k: (v, settings[other][k]) for k, v in settings[first].items() if settings[other][k] != v}
        if differ:
            raise ValueError(f"runs {first!r} and {other!r} evaluate with other settings {differ}: "
                             "their policies would not differ by their training alone")
        if questions[other] != questions[first]:
            raise ValueError(f"runs {first!r} and {other!r} evaluated different test questions "
                             f"({len(questions[first])} and {len(questions[other])}, or other texts): they cannot be paired")
    return pd.concat(frames, ignore_index=True), pd.DataFrame(budgets, columns=list(BUDGET_COLUMNS))


def findings_across_runs(profiles: Sequence[str], *, seed: int = 0) -> pd.DataFrame:
    """:data:`PAPER_FINDINGS` among the policies of :func:`runs_eval_records`, each method taken from the
    run whose training rolled out the most trajectories (the first named on a tie; a run without its step
    records last): ``comparison_table``'s columns, then ``trained_a`` and ``trained_b`` ("<steps> steps,
    <trajectories> trajectories (<profile>)", or "no step records (<profile>)").
    A finding whose methods no run evaluated is left out and named in ``attrs["skipped"]`` (what it measures)."""
    records, budgets = runs_eval_records(profiles)
    chosen = {}
    for method, rows in budgets.groupby("method", sort=False):
        chosen[method] = rows.loc[rows["trajectories"].fillna(-1).idxmax()]
    pairs = [(chosen[a]["label"], chosen[b]["label"]) for a, b, _ in PAPER_FINDINGS if a in chosen and b in chosen]
    skipped = [what for a, b, what in PAPER_FINDINGS if a not in chosen or b not in chosen]
    table = comparison_table(records, pairs, seed=seed)
    trained = {row["label"]: (f"no step records ({row['profile']})" if pd.isna(row["trajectories"]) else
                              f"{int(row['steps'])} steps, {int(row['trajectories'])} trajectories ({row['profile']})")
               for row in chosen.values()}
    table["trained_a"], table["trained_b"] = table["a"].map(trained), table["b"].map(trained)
    table.attrs = {**table.attrs, "skipped": skipped}
    return table
