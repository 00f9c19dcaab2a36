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
(ValueError naming them): a different seed, other test questions, or other settings every policy's
evaluation and start read (:data:`EVALUATION_SETTINGS`: the agent model, K, the search cap, the answer F1,
the warm start). The settings of the ranking (:data:`RANKING_SETTINGS`: N, the ranker model, kind and
start) shape only the methods that rank the retriever's N candidates: Retrieval Only reads the retriever's top
K whatever N is (its warm start may still depend on N: ``warmstart.topn`` pins it). A finding
whose two policies were ranked under different ranking settings is left out, and says why; so a run at
N = 20 can pair its Fixed Ranker with the Retrieval Only of a run at N = 10.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cosearch_lib.config import ProfileConfig, load_profile
from cosearch_lib.config.methods import PAPER_FINDINGS, TRAINING_METHODS, RankedBy, method_spec
from cosearch_lib.eval.tables import comparison_table, load_records
from cosearch_lib.experiment.cached_starts import RANKER_STARTS, warmstart_dir
from cosearch_lib.paths import run_dir
from cosearch_lib.records.ablations import AFTER, EVAL_RECORDS
from cosearch_lib.records.training_runs import STEPS_FILE, read_steps, training_root

#: The settings every policy's evaluation and start read: two runs must share them for their trained policies
#: to differ by their training alone. The warm start is compared by its cache folder, a hash of all that shapes
#: both roles' adapters (so also the ranker's settings: stricter than a method without a ranker needs).
EVALUATION_SETTINGS = {"models.agent": lambda c: c.models.agent, "search.topk": lambda c: c.search.topk,
                       "search.max_searches": lambda c: c.search.max_searches, "evaluation.f1": lambda c: c.evaluation.f1,
                       "the warm start": lambda c: warmstart_dir(c).name}
#: The settings of the ranking, {name: (read it, whether it shapes a method's policies)}: N for every method
#: that picks from the retriever's N candidates (not Retrieval Only, which reads its top K); the ranker model,
#: kind and start (the Fixed Ranker's cache folder) for the methods a ranker policy ranks for.
RANKING_SETTINGS = {
    "search.topn": (lambda c: c.search.topn, lambda spec: spec.ranked_by is not RankedBy.RETRIEVAL),
    "models.ranker": (lambda c: c.models.ranker, lambda spec: spec.has_ranker_policy),
    "training.ranker_kind": (lambda c: c.training.ranker_kind, lambda spec: spec.has_ranker_policy),
    "the ranker's start": (lambda c: RANKER_STARTS[c.training.ranker_kind].folder(c).name, lambda spec: spec.has_ranker_policy),
}
#: Columns of :func:`runs_eval_records`'s budget table, one row per trained policy.
BUDGET_COLUMNS = ("label", "profile", "method", "steps", "questions", "trajectories", "ranking")


def policy_label(method: str, profile: str) -> str:
    return f"{method} @ {profile}"


def ranking_settings(cfg: ProfileConfig, method: str) -> dict:
    """The :data:`RANKING_SETTINGS` that shape ``method``'s policies under ``cfg`` ({} for Retrieval Only)."""
    spec = method_spec(method)
    return {name: read(cfg) for name, (read, shapes) in RANKING_SETTINGS.items() if shapes(spec)}


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
                            **_training_budget(cfg, method), "ranking": ranking_settings(cfg, method)})
    if not frames:
        raise FileNotFoundError(f"no {EVAL_RECORDS} under the run folders of {list(profiles)}: "
                                f"run notebook 03 with evaluate_policies=true")
    if len(set(seeds.values())) > 1:
        raise ValueError(f"the runs have different seeds {seeds}: their test records cannot be paired")
    first, *rest = questions
    for other in rest:
        differ = {k: (v, settings[other][k]) for k, v in settings[first].items() if settings[other][k] != v}
        if differ:
            raise ValueError(f"runs {first!r} and {other!r} evaluate or start with other settings {differ}: "
                             "their policies would not differ by their training alone")
        if questions[other] != questions[first]:
            raise ValueError(f"runs {first!r} and {other!r} evaluated different test questions "
                             f"({len(questions[first])} and {len(questions[other])}, or other texts): they cannot be paired")
    return pd.concat(frames, ignore_index=True), pd.DataFrame(budgets, columns=list(BUDGET_COLUMNS))


def _ranking_differs(a: dict, b: dict) -> dict:
    """The :data:`RANKING_SETTINGS` both policies were ranked under with different values, {name: (a's, b's)}."""
    return {k: (a[k], b[k]) for k in a.keys() & b.keys() if a[k] != b[k]}


def findings_across_runs(profiles: Sequence[str], *, seed: int = 0) -> pd.DataFrame:
    """:data:`PAPER_FINDINGS` among the policies of :func:`runs_eval_records`: for each finding, the pair of
    trained policies whose trainings rolled out the most trajectories (a's first, then b's; the first named on
    a tie; a run without its step records last) among the pairs ranked under the same :data:`RANKING_SETTINGS`
    (so one method may come from different runs in two findings). ``comparison_table``'s columns, then
    ``trained_a`` and ``trained_b`` ("<steps> steps, <trajectories> trajectories (<profile>)", or "no step
    records (<profile>)").
    A finding whose methods no run evaluated, or whose two policies were ranked under different
    :data:`RANKING_SETTINGS` (those that shape both), is left out and named in ``attrs["skipped"]``
    (what it measures, and why when the settings differ)."""
    records, budgets = runs_eval_records(profiles)
    budgets = budgets.assign(order=range(len(budgets)), longest=budgets["trajectories"].fillna(-1))
    chosen, pairs, skipped = {}, [], []
    for a, b, what in PAPER_FINDINGS:
        runs_a, runs_b = budgets[budgets["method"] == a], budgets[budgets["method"] == b]
        if runs_a.empty or runs_b.empty:
            skipped.append(what)
            continue
        # the longest-trained pair (a's training first, then b's; the first named on a tie) ranked under the same settings
        ranked = sorted(((ra, rb) for _, ra in runs_a.iterrows() for _, rb in runs_b.iterrows()),
                        key=lambda p: (-p[0]["longest"], -p[1]["longest"], p[0]["order"], p[1]["order"]))
        same = [(ra, rb) for ra, rb in ranked if not _ranking_differs(ra["ranking"], rb["ranking"])]
        if not same:
            ra, rb = ranked[0]
            skipped.append(f"{what} ({ra['label']} and {rb['label']} were ranked under other settings: "
                           + ", ".join(f"{k} {va} and {vb}" for k, (va, vb) in sorted(_ranking_differs(ra["ranking"], rb["ranking"]).items()))
                           + ")")
            continue
        ra, rb = same[0]
        chosen[ra["label"]], chosen[rb["label"]] = ra, rb
        pairs.append((ra["label"], rb["label"]))
    table = comparison_table(records, pairs, seed=seed)
    trained = {row["label"]: (f"no step records ({row['profile']})" if pd.isna(row["trajectories"]) else
                              f"{int(row['steps'])} steps, {int(row['trajectories'])} trajectories ({row['profile']})")
               for row in chosen.values()}
    table["trained_a"], table["trained_b"] = table["a"].map(trained), table["b"].map(trained)
    table.attrs = {**table.attrs, "skipped": skipped}
    return table
