"""The log stage of a training step: one step record (``run_schema.STEP_GLOSSARY`` columns) and one
row per ranker call (``ranker_calls.parquet``), from the step's rewards, groups and update stats."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from cosearch_lib.rl.step_scoring import StepGroups, StepRewards
from cosearch_lib.run_schema import namespaced_record


def mean_or_nan(values: Sequence[float | None]) -> float:
    """The mean of the values that are numbers (None and NaN left out); NaN when none is."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(values)) if values else float("nan")


def sampled_entropy(logprob_rows: Sequence[Sequence[float]]) -> float:
    """Mean -log p over every sampled token of ``logprob_rows``; NaN without any."""
    flat = [lp for row in logprob_rows for lp in row]
    return float(-np.mean(flat)) if flat else float("nan")


def question_groups(trajs: Sequence, values: Sequence[float]) -> list[list[float]]:
    """``values`` (one per trajectory) by question: the agent's GRPO groups."""
    groups: dict[str, list[float]] = {}
    for t, v in zip(trajs, values):
        groups.setdefault(t.question_id, []).append(float(v))
    return list(groups.values())


def step_record(step: int, method: str, rewards: StepRewards, groups: StepGroups,
                update_stats: Mapping[str, Mapping[str, float]]) -> dict:
    """The record of step ``step`` (0-based) without its timings: rewards, Hit@K, ranker rewards
    before and after the grouping filters, grouping statistics and each adapter's update stats,
    under the namespaced names it is written with (``run_schema.step_metric_name``)."""
    trajs, calls, ranked = rewards.trajectories, rewards.calls, rewards.ranker
    grouping = groups.grouping
    kept = [r for r in ranked if r.kept]
    in_groups = sorted({i for g in grouping.groups for i in g})
    f1_groups, reward_groups = question_groups(trajs, [t.f1 for t in trajs]), question_groups(trajs, rewards.agent)
    rec = {
        "step": step, "method": method, "n_questions": len({t.question_id for t in trajs}),
        "n_trajectories": len(trajs),
        "agent_reward": float(np.mean(rewards.agent)), "agent_f1": float(np.mean([t.f1 for t in trajs])),
        "agent_best_of_g_f1": float(np.mean([max(g) for g in f1_groups])),
        "agent_groups_without_signal": float(np.mean([max(g) == min(g) for g in reward_groups])),
        "agent_entropy": sampled_entropy([[lp for lp, m in zip(t.old_logprobs, t.loss_mask) if m] for t in trajs]),
        "agent_format_ok": float(np.mean([t.format_ok for t in trajs])),
        "searches_per_traj": float(np.mean([t.n_searches for t in trajs])),
        "agent_generated_tokens": float(np.mean([sum(t.loss_mask) for t in trajs])),
        "agent_context_tokens": float(np.mean([len(t.token_ids) for t in trajs])),
        "agent_prompt_tokens": float(np.mean([t.prompt_len for t in trajs])),
        "n_ranker_calls": len(calls),
        "ranker_valid_rate": mean_or_nan([float(c.valid) for c in calls]),
        "ranker_entropy": sampled_entropy([c.output_logprobs for c in calls]),
        "hit@K": mean_or_nan([c.shown_hit for c in calls]),
        "i_ans_rate": mean_or_nan([float(c.i_ans) for c in calls]),
        "r_rel_pre": mean_or_nan([r.r_rel for r in ranked]),
        "r_rel_post": mean_or_nan([ranked[i].r_rel for i in in_groups]),
        "ranker_reward_pre": mean_or_nan([r.reward for r in kept]),
        "ranker_reward_post": mean_or_nan([grouping.rewards[i] for i in in_groups]),
        "ranker_main_pre": mean_or_nan([r.r_main for r in kept]),
        "ranker_main_post": mean_or_nan([ranked[i].r_main for i in in_groups]),
    }
    rec.update({f"grouping_{k}": v for k, v in grouping.stats.items()})
    for adapter, stats in update_stats.items():
        rec.update({(f"{adapter}_{k}" if k == "grad_norm" else k): v for k, v in stats.items()})
    return namespaced_record(rec)


def call_rows(step: int, rewards: StepRewards, groups: StepGroups) -> list[dict]:
    """One row per ranker call of the step: its sub-query, reward terms, group and advantage."""
    return [{"step": step, "question_id": c.question_id, "traj_id": c.traj_id, "turn": c.turn, "sub_query": c.sub_query,
             "i_ans": c.i_ans, "valid": c.valid, "r_rel": r.r_rel, "r_main": r.r_main, "reward": r.reward,
             "kept": r.kept, "reason": r.reason, "group": g, "advantage": a, "hit@K": c.shown_hit}
            for c, r, g, a in zip(rewards.calls, rewards.ranker, groups.call_groups, groups.ranker_advantages)]
