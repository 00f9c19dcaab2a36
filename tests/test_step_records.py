"""The step record's view of what GRPO has to work with: best-of-G against mean-of-G F1, the groups
without reward variance, and the sampled-token entropy of each role."""

from __future__ import annotations

import math

import pytest

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.config import TrainConfig
from cosearch_lib.config.rules import PAPER_RULES
from cosearch_lib.rl.step_records import step_record
from cosearch_lib.rl.step_scoring import group_rollouts, reward_rollouts


def _trajectory(qid: str, sample: int, answer: str, logprobs: list[float]) -> Trajectory:
    t = Trajectory(traj_id=f"{qid}/{sample}", question_id=qid, sample=sample, data_source="syn_nq", question="?",
                   golds=["Kessmere"], prompt_len=2)
    t.append([1, 2], 0)  # the prompt: not sampled, left out of the entropy
    t.append(list(range(len(logprobs))), 1, logprobs)
    t.answer, t.finish = answer, "answer"
    return t


def test_step_record_says_how_much_better_a_groups_best_is_and_which_groups_carry_no_signal():
    trajs = [_trajectory("q1", 0, "Kessmere", [-1.0, -3.0]), _trajectory("q1", 1, "Drask", [-2.0]),
             _trajectory("q2", 0, "Drask", [-0.5]), _trajectory("q2", 1, "Orvane", [-0.5, -0.5])]
    cfg = TrainConfig(method="search_r1", group_size=2, questions_per_step=2)
    rewards = reward_rollouts(trajs, cfg)
    record = step_record(0, "search_r1", rewards, group_rollouts(rewards, cfg, PAPER_RULES), {})
    assert record["rollout/agent_f1"] == pytest.approx(0.25)  # one right answer among four
    assert record["rollout/agent_best_of_g_f1"] == pytest.approx(0.5)  # q1's best is right, q2 has none
    assert record["rollout/agent_groups_without_signal"] == pytest.approx(0.5)  # q2's two rewards are equal
    assert record["rollout/agent_entropy"] == pytest.approx((1 + 3 + 2 + 0.5 + 0.5 + 0.5) / 6)  # sampled tokens only
    assert math.isnan(record["ranker/entropy"])  # no search call, nothing the ranker sampled
