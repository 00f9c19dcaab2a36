"""What GRPO had to work with per hop group: the training rollouts' agent rewards by searches made.

Why (issue 48, item 2): the held-out curves rise on the single-hop families and not on the multi-hop
ones. Whether GRPO can teach a second search depends on what the training rollouts pay for it. The
step records average over every question, so this module reads a run's ranker calls, one row per
search with the trajectory's agent reward (``r_main``), and splits the training questions into the
single-hop and multi-hop families (``eval.benchmark_families.hop_group``).

* :func:`trajectory_table`: one row per trajectory that searched, with its hop group, the searches it
  made and its agent reward;
* :func:`hop_signal_table`: per method, hop group and part of the run (its first steps, its last and all), the
  mean-of-G and best-of-G agent reward, the share of questions whose searched trajectories differ in
  reward (GRPO's signal), and searches per trajectory;
* :func:`second_search_table`: within the questions whose G trajectories include both one search and
  more (GRPO's advantage compares a question's own samples), the mean reward of more than one search
  minus that of one, paired over the questions: whether a second search pays.
* :func:`run_hop_tables`: the three tables of one run (its ranker calls and step records), the one place
  notebook 05 (``report``) and the probe scripts under ``docs/log_records/`` build them;
  :func:`concat_hop_tables` joins several runs' tables.

What the calls cannot say: a trajectory that never searched has no call, so its reward is unknown.
Within a question that has calls it is counted (``searches`` 0, reward NaN) from the group size, and
the reward columns read over the trajectories that searched. A question none of whose G trajectories
searched leaves no call at all, and with it no hop group: the tables hold the question-steps with a
call, and :func:`coverage` counts them against the questions the step records say were rolled out.
``r_main`` is the agent reward as the ranker's composite reads it: Eq. 4 under the paper's rule set
(answer F1, or the format penalty), binarised under the released one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pandas as pd

from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.eval.intervals import paired_bootstrap

#: Columns of :func:`trajectory_table`.
TRAJECTORY_COLUMNS = ("method", "step", "question_id", "traj_id", "hop", "searches", "agent_reward")


def trajectory_table(calls: pd.DataFrame, data_source: Mapping[str, str], *, method: str) -> pd.DataFrame:
    """One row per trajectory of ``calls`` (a run's ranker calls, ``records.training_runs.read_ranker_calls``):
    its step, question, hop group (``single``, ``multi`` or ``other``, from ``data_source``: question id ->
    data set), the searches it made (its calls) and its agent reward (``r_main``, the same on each of its
    calls). A question missing from ``data_source`` raises ValueError naming it."""
    if calls.empty:
        return pd.DataFrame(columns=list(TRAJECTORY_COLUMNS))
    missing = sorted(set(calls["question_id"]) - set(data_source))
    if missing:
        raise ValueError(f"{len(missing)} question(s) of {method}'s ranker calls are not in the training split, "
                         f"e.g. {missing[:3]}: the calls belong to another world or split")
    per = calls.groupby(["step", "question_id", "traj_id"], sort=True)
    out = per.agg(searches=("r_main", "size"), agent_reward=("r_main", "first")).reset_index()
    out["hop"] = out["question_id"].map(lambda q: hop_group(data_source[q]))
    out["method"] = method
    return out[list(TRAJECTORY_COLUMNS)]


def run_group_size(steps: pd.DataFrame) -> int:
    """G of a run, from its step records (``rollout/n_trajectories`` over ``rollout/n_questions``): the run's own,
    whatever its profile says now. ValueError when the records do not say it or say it unevenly."""
    trained = steps[steps["step"] >= 0] if "step" in steps else steps.iloc[0:0]
    if not {"rollout/n_trajectories", "rollout/n_questions"} <= set(trained) or trained.empty:
        raise ValueError("the step records carry no rollout/n_trajectories and rollout/n_questions to read G from")
    ratios = set((trained["rollout/n_trajectories"] / trained["rollout/n_questions"]).round(6))
    if len(ratios) != 1 or not float(next(iter(ratios))).is_integer():
        raise ValueError(f"the step records give no single group size: trajectories per question {sorted(ratios)}")
    return int(next(iter(ratios)))


def coverage(trajectories: pd.DataFrame, steps: pd.DataFrame) -> dict[str, int]:
    """The question-steps the step records say were rolled out (``rollout/n_questions`` summed over the trained
    steps) and those the ranker calls hold (``with_a_search``): the difference never searched in any of its G
    trajectories, so the hop-group tables cannot place it."""
    trained = steps[steps["step"] >= 0] if "step" in steps else steps.iloc[0:0]
    rolled = int(trained["rollout/n_questions"].sum()) if "rollout/n_questions" in trained else 0
    found = int(trajectories.groupby(["step", "question_id"]).ngroups) if len(trajectories) else 0
    return {"rolled_out": rolled, "with_a_search": found}


def _parts(steps: list[int], span: int) -> dict[str, list[int]]:
    """A method's first ``span`` steps, its last ``span`` and every step (as ``records.training_runs.grpo_signal_table``);
    only every step when it has fewer than ``2 * span``: first and last would share steps."""
    if len(steps) < 2 * span:
        return {"all": steps}
    return {"first": steps[:span], "last": steps[-span:], "all": steps}


def _slices(frame: pd.DataFrame, span: int) -> Iterator[tuple[dict[str, Any], list[int], pd.DataFrame]]:
    """Each (method, part, hop group) of ``frame`` (rows with ``method``, ``step``, ``hop``): the row labels
    every table starts with, the part's steps, and the part's rows of that hop group."""
    for method, mine in frame.groupby("method", sort=False):
        for part, steps in _parts(sorted(set(mine["step"])), span).items():
            chosen = mine[mine["step"].isin(steps)]
            for hop, rows in chosen.groupby("hop", sort=True):
                yield {"method": method, "hop": hop, "part": part, "steps": f"{min(steps)}-{max(steps)}"}, steps, rows


def _per_question(trajectories: pd.DataFrame, group_size: int) -> pd.DataFrame:
    per = trajectories.groupby(["method", "step", "hop", "question_id"], sort=False)
    out = per.agg(searched=("agent_reward", "size"), mean_of_g=("agent_reward", "mean"), best_of_g=("agent_reward", "max"),
                  spread=("agent_reward", "std"), searches=("searches", "sum")).reset_index()
    over = out[out["searched"] > group_size]
    if len(over):
        raise ValueError(f"{over['question_id'].iloc[0]} has {int(over['searched'].iloc[0])} trajectories at step "
                         f"{int(over['step'].iloc[0])}, more than G = {group_size}: read G from the run (run_group_size)")
    out["with_signal"] = out["spread"].fillna(0.0) > 0
    out["never_searched"] = group_size - out["searched"]
    return out


def hop_signal_table(trajectories: pd.DataFrame, *, group_size: int, span: int = 2) -> pd.DataFrame:
    """Per method, hop group and part (its first ``span`` steps, its last ``span`` and all): ``questions``
    (question-steps), ``mean_of_g`` and ``best_of_g`` (a question's mean and best agent reward over its
    trajectories that searched, averaged over the questions), ``with_signal`` (the share of questions whose
    trajectories that searched differ in reward), ``searches_per_traj`` (over all ``group_size`` trajectories
    of each of these questions) and ``never_searched`` (the share of their trajectories without a search).
    Question-steps without any call are not in it (:func:`coverage`)."""
    rows = []
    if trajectories.empty:
        return pd.DataFrame(rows)
    for labels, _, q in _slices(_per_question(trajectories, group_size), span):
        n_traj = len(q) * group_size
        rows.append({**labels, "questions": len(q), "mean_of_g": float(q["mean_of_g"].mean()),
                     "best_of_g": float(q["best_of_g"].mean()), "with_signal": float(q["with_signal"].mean()),
                     "searches_per_traj": float(q["searches"].sum() / n_traj),
                     "never_searched": float(q["never_searched"].sum() / n_traj)})
    return pd.DataFrame(rows)


def second_search_table(trajectories: pd.DataFrame, *, span: int = 2, seed: int = 0) -> pd.DataFrame:
    """Per method, hop group and part (as :func:`hop_signal_table`): over the question-steps whose
    trajectories include one that searched once and one that searched more (``questions``), the mean
    agent reward of the ones that searched more (``more``) and of the ones that searched once (``once``),
    averaged per question, and ``more`` - ``once`` with its paired 95% bootstrap interval over those
    questions (``ci_low``, ``ci_high``; NaN with fewer than 2), each question-step one item. A hint of the
    direction GRPO's group advantage takes, not a reading of it: the advantage is over all G samples,
    including any that never searched. A negative difference favours stopping at one search."""
    rows = []
    if trajectories.empty:
        return pd.DataFrame(rows)
    for labels, _, h in _slices(trajectories.assign(more=trajectories["searches"] > 1), span):
        by = h.groupby(["step", "question_id", "more"])["agent_reward"].mean().unstack("more")
        both = by.dropna() if {True, False} <= set(by.columns) else by.iloc[0:0]
        row = {**labels, "questions": len(both), "more": float("nan"), "once": float("nan"), "diff": float("nan"),
               "ci_low": float("nan"), "ci_high": float("nan")}
        if len(both):
            paired = paired_bootstrap(both[True].to_numpy(), both[False].to_numpy(), [labels["hop"]] * len(both),
                                      statistic="mean", seed=seed, when_too_few="note")
            row |= {"more": paired.estimate_a, "once": paired.estimate_b, "diff": paired.diff,
                    "ci_low": paired.ci_low, "ci_high": paired.ci_high}
        rows.append(row)
    return pd.DataFrame(rows)


#: The tables :func:`run_hop_tables` returns, in order.
HOP_TABLES = ("hop_signal", "second_search", "coverage")


def run_hop_tables(calls: pd.DataFrame, steps: pd.DataFrame, data_source: Mapping[str, str], *, method: str,
                   seed: int = 0, up_to_step: int | None = None) -> dict[str, pd.DataFrame]:
    """One run's hop-group tables, keyed as :data:`HOP_TABLES`: :func:`hop_signal_table` and
    :func:`second_search_table` of its trajectories (:func:`trajectory_table` of ``calls``, under ``method``),
    with G read from its own step records (:func:`run_group_size`), and ``coverage``, one row (``method``,
    ``group_size`` and :func:`coverage`). ``up_to_step`` keeps the calls and steps up to that step, to compare
    runs over the steps they share. ValueError as :func:`run_group_size`, :func:`trajectory_table` and
    :func:`hop_signal_table` (more trajectories of a question than G) raise it."""
    if up_to_step is not None:
        calls, steps = calls[calls["step"] <= up_to_step], steps[steps["step"] <= up_to_step]
    g = run_group_size(steps)
    trajectories = trajectory_table(calls, data_source, method=method)
    return {"hop_signal": hop_signal_table(trajectories, group_size=g),
            "second_search": second_search_table(trajectories, seed=seed),
            "coverage": pd.DataFrame([{"method": method, "group_size": g, **coverage(trajectories, steps)}])}


def concat_hop_tables(runs: Iterable[Mapping[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Several runs' :func:`run_hop_tables`, each table stacked in the runs' order; no runs, no tables."""
    runs = list(runs)
    return {key: pd.concat([run[key] for run in runs], ignore_index=True) for key in HOP_TABLES} if runs else {}
