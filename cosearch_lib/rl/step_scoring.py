"""The rewards and grouping stages of a training step: rollouts -> rewards -> groups -> advantages.

* :func:`reward_rollouts` (stage "reward"): Eq. 4 per trajectory, and per search call the ranker's
  composite reward (Eq. 6, or the released variant), after the LLM judge's labels when the
  relevance reward is the judge's.
* :func:`group_rollouts` (stage "group"): the agent's G trajectories of a question form one
  group; the ranker's calls are grouped semantically (Alg. 2, ``rl.semantic_grouping``), reusing
  the agent's rollouts. Advantages are group-relative (``rl.grpo_loss.group_advantages``); a call
  outside every surviving group gets 0 and is not trained on.

Neither touches a model's weights: these are plain functions of the step's records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cosearch_lib.agent.rollout import RankerCall, Trajectory
from cosearch_lib.config import RuleSet, TrainConfig
from cosearch_lib.rl.grpo_loss import group_advantages
from cosearch_lib.rl.rewards import RankerReward, agent_rewards, ranker_rewards
from cosearch_lib.rl.semantic_grouping import Grouping, group_ids, group_ranker_calls


@dataclass
class StepRewards:
    """The rewards of one step's rollouts."""

    trajectories: list[Trajectory]
    agent: list[float]  # Eq. 4, one per trajectory
    calls: list[RankerCall]  # every search call, trajectory by trajectory, in turn order
    ranker: list[RankerReward]  # one per call, aligned with ``calls``


@dataclass
class StepGroups:
    """The GRPO groups and advantages of one step."""

    agent_advantages: list[float]  # one per trajectory (its question's group)
    grouping: Grouping  # the ranker's groups, with what the filters dropped
    call_groups: list[int]  # one per call: its group's index, -1 outside every surviving group
    ranker_advantages: list[float]  # one per call; 0 outside every surviving group


def reward_rollouts(trajs: Sequence[Trajectory], cfg: TrainConfig, *,
                    judge: Callable[[list[RankerCall]], Any] | None = None) -> StepRewards:
    """Rewards of ``trajs`` under ``cfg.agent_reward`` and ``cfg.ranker_reward``. ``judge`` labels the
    shown passages of the calls first (``rl.judge.judge_calls``); it must be given when the
    relevance reward is ``"judge"``."""
    calls = [c for t in trajs for c in t.ranker_calls]
    if cfg.ranker_reward.relevance == "judge":
        if judge is None:
            raise ValueError("ranker_reward.relevance 'judge' needs a judge to label the shown passages")
        judge(calls)
    return StepRewards(list(trajs), agent_rewards(trajs, cfg.agent_reward), calls,
                       ranker_rewards(trajs, cfg.ranker_reward, agent_cfg=cfg.agent_reward))


def reward_dtype(rules: RuleSet) -> torch.dtype:
    """The dtype rewards enter the advantages in (the released code stores scores as float32)."""
    return torch.float32 if rules.reward_dtype == "float32" else torch.float64


def group_rollouts(rewards: StepRewards, cfg: TrainConfig, rules: RuleSet) -> StepGroups:
    """Agent groups by question and semantic ranker groups, and the advantages of both roles."""
    dtype, grpo = reward_dtype(rules), cfg.grpo
    trajs = rewards.trajectories
    question = {q: i for i, q in enumerate(dict.fromkeys(t.question_id for t in trajs))}
    agent_adv = group_advantages(torch.tensor(rewards.agent, dtype=dtype), torch.tensor([question[t.question_id] for t in trajs]),
                                 scale_std=grpo.scale_std, eps=grpo.std_eps).tolist()
    grouping = group_ranker_calls(rewards.calls, rewards.ranker, cfg.grouping)
    gids = group_ids(grouping, len(rewards.calls))
    ranker_adv = [0.0] * len(rewards.calls)
    grouped = [i for i, g in enumerate(gids) if g >= 0]
    if grouped:
        adv = group_advantages(torch.tensor([grouping.rewards[i] for i in grouped], dtype=dtype),
                               torch.tensor([gids[i] for i in grouped]), scale_std=grpo.scale_std, eps=grpo.std_eps)
        for i, a in zip(grouped, adv.tolist()):
            ranker_adv[i] = a
    return StepGroups(agent_adv, grouping, gids, ranker_adv)
