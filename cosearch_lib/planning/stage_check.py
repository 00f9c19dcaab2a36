"""The planner checked against measured steps: each committed stage record (``benchmarks/stage_times.py``)
predicted by the planner's CPU model from the record's profile and its observed behaviour.

A record row holds a real step's stage times and what the planner cannot know before the run: searches
per trajectory, tokens the agent generated and read per trajectory, the share of agent groups without
reward variance, the sequences each update forwarded. :func:`predicted_stages` gives the planner's
seconds for the same step; :func:`stage_errors` the relative error per stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from cosearch_lib.config import AutocastConfig, ProfileConfig, load_profile
from cosearch_lib.planning.job_plan import plan_job
from cosearch_lib.planning.step_work import Behaviour
from cosearch_lib.planning.throughputs import DeviceRates, cpu_rates

STAGE_RECORD = "benchmarks/records/stage_times.csv"

#: The columns of a step record that the stage record keeps (run_schema.STEP_GLOSSARY names).
RECORD_COLUMNS = ("step", "rollout/bf16", "loss/bf16", "rollout/n_questions", "rollout/n_trajectories", "rollout/searches_per_traj",
                  "rollout/agent_generated_tokens", "rollout/agent_context_tokens", "rollout/agent_prompt_tokens",
                  "rollout/agent_groups_without_signal", "ranker/n_calls", "ranker/grouping_calls_in_groups",
                  "loss/agent_n_forwarded", "loss/agent_n_tokens", "loss/ranker_n_forwarded", "loss/ranker_n_tokens",
                  "time/rollout_s", "time/update_s", "time/agent_update_s", "time/ranker_update_s",
                  "time/scorer_update_s", "time/validate_s")
#: Stage-record columns counted from the run's files: the rollout's rounds (the longest trajectory's turns)
#: and the distinct candidate lists the ranker's update scored (from ranker_calls.parquet), and the items
#: of the validation after each step (validation.csv).
COUNTED_COLUMNS = ("rollout_rounds", "ranker_lists_trained", "val_agent_questions", "val_ranker_items")
#: The planner's stages each measured stage sums, and the tolerance the check allows.
MEASURED_STAGES = {"time/rollout_s": ("rollout", "ranker calls", "retrieval"), "time/update_s": ("update",),
                   "time/validate_s": ("validation",)}
TOLERANCE = 0.30
#: A stage measured under this many seconds did no work worth timing (an update with no group to train).
MIN_MEASURED_S = 1.0


def _value(row: Mapping[str, Any], name: str) -> float | None:
    v = row.get(name)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def behaviour_of(row: Mapping[str, Any]) -> Behaviour:
    """What the run did at this step, as the planner's :class:`Behaviour`: searches per trajectory,
    tokens generated and held per trajectory, the share of trajectories and ranker calls the update
    forwarded, the ranker's reply length, gold sub-queries per validation question."""
    trajectories = _value(row, "rollout/n_trajectories") or 1.0
    calls = _value(row, "ranker/n_calls")
    agent_fwd, ranker_fwd = _value(row, "loss/agent_n_forwarded"), _value(row, "loss/ranker_n_forwarded")
    ranker_tokens = _value(row, "loss/ranker_n_tokens")
    questions, items = _value(row, "val_agent_questions"), _value(row, "val_ranker_items")
    prompt = _value(row, "rollout/agent_prompt_tokens") or Behaviour.prompt_tokens
    generated, context = _value(row, "rollout/agent_generated_tokens"), _value(row, "rollout/agent_context_tokens")
    trained = None
    scored = _value(row, "loss/agent_n_tokens")
    if agent_fwd and scored and generated and context:
        # the update trains the groups with signal (every group with a KL term), not the average trajectory: their generated tokens are
        # recorded (agent_n_tokens); their observations taken in proportion (more turns read more passages)
        own = scored / agent_fwd
        trained = prompt + max(context - prompt - generated, 0.0) * own / generated + own
    return Behaviour(
        searches=_value(row, "rollout/searches_per_traj"),
        agent_generated_tokens=_value(row, "rollout/agent_generated_tokens"),
        agent_context_tokens=_value(row, "rollout/agent_context_tokens"),
        prompt_tokens=prompt, trained_context_tokens=trained,
        signal_share=(agent_fwd or 0.0) / trajectories,
        ranker_calls_trained=(ranker_fwd or 0.0) / calls if calls else 0.0,
        ranker_reply_tokens=ranker_tokens / ranker_fwd if ranker_fwd and ranker_tokens else None,
        hops=items / questions if questions and items else Behaviour.hops,
        rounds=_value(row, "rollout_rounds"),
        scored_lists_share=(_value(row, "ranker_lists_trained") or 0.0) / ranker_fwd if ranker_fwd else 1.0)


def predicted_stages(row: Mapping[str, Any], cfg: ProfileConfig | None = None, rates: DeviceRates | None = None) -> dict[str, float]:
    """The planner's seconds for the step of ``row`` (a stage-record row: profile, method, threads and
    the behaviour columns), by measured stage (:data:`MEASURED_STAGES`; the validation unamortized):
    one CPU rank at the row's threads, the profile as committed."""
    cfg = cfg or load_profile(str(row["profile"]))
    rates = rates or cpu_rates(int(row.get("threads", 2)))
    # the precision the step computed in (its rollout/bf16 and loss/bf16 columns; none: float32), whatever the
    # profile asks for: a CPU without bf16 instructions trains a profile with training.autocast in float32
    roll, update = bool(_value(row, "rollout/bf16")), bool(_value(row, "loss/bf16"))
    cfg = replace(cfg, training=replace(cfg.training, autocast=AutocastConfig(rollout=roll, update=update) if roll or update else None))
    method = str(row["method"])
    plan = plan_job(cfg, nodes=1, gpus_per_node=0, methods=(method,), behaviour=behaviour_of(row), rates=rates)
    stages = {**plan.stages[method], "validation": plan.validation_s[method]}
    return {measured: sum(stages[s] for s in parts) for measured, parts in MEASURED_STAGES.items()}


def stage_errors(record: pd.DataFrame, rates: DeviceRates | None = None) -> pd.DataFrame:
    """One row per (record row, measured stage): measured and predicted seconds and the relative error
    (predicted / measured - 1); stages the row did not measure (no validation at that step) or that did
    no work (under :data:`MIN_MEASURED_S`) left out."""
    rows, profiles = [], {}
    for _, r in record.iterrows():
        cfg = profiles.setdefault(r["profile"], load_profile(str(r["profile"])))
        predicted = predicted_stages(r.to_dict(), cfg, rates)
        for stage, seconds in predicted.items():
            measured = _value(r, stage)
            if measured is None or measured < MIN_MEASURED_S:
                continue
            rows.append({"profile": r["profile"], "method": r["method"], "step": r["step"], "stage": stage,
                         "measured_s": measured, "predicted_s": seconds, "error": seconds / measured - 1})
    return pd.DataFrame(rows)
