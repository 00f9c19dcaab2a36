"""Agent reward (Eq. 4) and ranker composite reward (Eq. 6, released-code variant, ablations).

Records are built by hand, so every expected value below is worked out in a comment."""

from __future__ import annotations

import math

import pytest

from cosearch_lib.agent.rollout import RankerCall, Trajectory, Turn
from cosearch_lib.config import AgentRewardConfig, RankerRewardConfig
from cosearch_lib.rl.rewards import (
    REASON_ABLATION_MAIN,
    REASON_ABLATION_REL,
    REASON_EASY_REL_ONLY,
    REASON_EASY_REL_PLUS_MAIN,
    REASON_FILTERED,
    REASON_HARD_MAIN,
    REASON_INVALID,
    REWARD_GLOSSARY,
    RankerReward,
    agent_reward,
    agent_rewards,
    main_reward,
    ranker_rewards,
    relevance_reward,
)

GOLD = "red green blue pink black"
ANSWER_F1_08 = "red green blue pink gray"  # 4 shared of 5 + 5 tokens: F1 = 2*4/10 = 0.8
FALLBACK = [0, 1, 2, 3, 4]  # retriever top-K, what an invalid ranker output shows


def call(relevant, order=None, *, valid=True, traj_id="q1/0", turn=0, sub_query="who directed film y",
         question_id="q1", i_ans=None, prompt_ids=None) -> RankerCall:
    """A ranker call with hand-chosen labels; i_ans defaults to 'any candidate relevant'."""
    order = list(range(min(5, len(relevant)))) if order is None else order
    return RankerCall(
        traj_id=traj_id, question_id=question_id, sample=int(traj_id.split("/")[-1]), turn=turn, q0="q0?",
        sub_query=sub_query, candidate_ids=[str(i) for i in range(len(relevant))], relevant=list(relevant),
        order=list(order), valid=valid, error=None if valid else "bad rerank", prompt_ids=prompt_ids or [1, 2, 3],
        output_ids=[4, 5], output_logprobs=[-0.1, -0.2], output_text="<rerank>[1]</rerank>",
        i_ans=int(any(relevant)) if i_ans is None else i_ans)


def traj(answer, calls=(), *, format_ok=True, golds=(GOLD,), traj_id="q1/0") -> Trajectory:
    """A finished trajectory; format_ok=False gives one invalid turn and finish 'invalid'."""
    turns = [Turn("<reason>..</reason><tool_call>..</tool_call>", "search", True, None, query="q")]
    if format_ok:
        turns.append(Turn("<answer>..</answer>", "answer", True, None, answer=answer))
        finish = "answer"
    else:
        turns.append(Turn("garbage", "invalid", False, "no tags"))
        finish = "invalid"
    return Trajectory(traj_id=traj_id, question_id=traj_id.split("/")[0], sample=int(traj_id.split("/")[-1]),
                      data_source="syn_nq", question="q0?", golds=list(golds), prompt_len=3, turns=turns,
                      ranker_calls=list(calls), answer=answer if format_ok else None, finish=finish)


def one(t: Trajectory, **cfg) -> RankerReward:
    (r,) = ranker_rewards([t], RankerRewardConfig(**cfg))
    return r


# relevance labels by shown rank (K = 5 of N = 6 candidates); Hit@{1,3,5} means:
REL_RANK1 = [1, 0, 0, 0, 0, 0]  # hits 1,1,1 -> r_rel = 1
REL_RANK2 = [0, 1, 0, 0, 0, 0]  # hits 0,1,1 -> 2/3
REL_RANK4 = [0, 0, 0, 1, 0, 0]  # hits 0,0,1 -> 1/3
REL_UNSHOWN = [0, 0, 0, 0, 0, 1]  # relevant candidate exists (I_ans = 1) but is not shown -> 0
REL_NONE = [0, 0, 0, 0, 0, 0]  # hard call: I_ans = 0


# --------------------------------------------------------------------------- agent reward (Eq. 4)


def test_agent_reward_format_ok_is_max_f1():
    assert agent_reward(traj(ANSWER_F1_08)) == 0.8
    assert agent_reward(traj("Red, Green, Blue, Pink & Black!")) == 1.0  # normalisation: case and punctuation
    assert agent_reward(traj("nothing", golds=("x", "nothing at all"))) == pytest.approx(2 * 1 / 4)  # best gold


def test_agent_reward_format_fail_is_minus_alpha():
    assert agent_reward(traj(GOLD, format_ok=False)) == -0.2
    assert agent_reward(traj(GOLD, format_ok=False), alpha=0.5) == -0.5
    # a correct answer after an invalid turn (stop_on_invalid=False) still fails the format
    t = traj(GOLD)
    t.turns.insert(1, Turn("garbage", "invalid", False, "no tags"))
    assert agent_reward(t) == -0.2


def test_agent_rewards_list_and_config():
    ts = [traj(GOLD), traj(ANSWER_F1_08), traj(GOLD, format_ok=False)]
    assert agent_rewards(ts) == [1.0, 0.8, -0.2]
    assert agent_rewards(ts, alpha=0.3) == [1.0, 0.8, -0.3]
    # yes/no rule: "yes it is" vs "yes" is 0 with the HotpotQA rule, plain F1 2*1/(3+1) = 0.5 without
    yes = traj("yes it is", golds=("yes",))
    assert agent_rewards([yes]) == [0.0]
    assert agent_rewards([yes], yes_no_rule=False) == [0.5]


def test_agent_config_rejects_bad_values():
    with pytest.raises(ValueError, match="alpha"):
        AgentRewardConfig(alpha=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        agent_rewards([], alpha=float("nan"))
    with pytest.raises(TypeError):
        agent_rewards([], beta=1.0)


# --------------------------------------------------------------------------- paper Eq. 6


def test_paper_format_fail_is_filtered():
    r = one(traj(GOLD, [call(REL_RANK1)], format_ok=False))
    assert not r.kept and math.isnan(r.reward) and r.reason == REASON_FILTERED
    assert r.r_rel == 1.0 and r.r_main == -0.2 and r.i_ans == 1  # still logged


def test_paper_easy_low_relevance_gets_r_rel_only():
    r = one(traj(ANSWER_F1_08, [call(REL_RANK4)]))  # r_rel = 1/3 <= 0.5
    assert r.kept and r.reward == pytest.approx(1 / 3) and r.reason == REASON_EASY_REL_ONLY
    r = one(traj(ANSWER_F1_08, [call(REL_UNSHOWN)]))  # easy but nothing relevant shown: r_rel = 0
    assert r.i_ans == 1 and r.reward == 0.0 and r.reason == REASON_EASY_REL_ONLY


def test_paper_r_rel_equal_to_gamma_is_not_above():
    # Hit@{1,2,3,4} with the relevant passage at rank 3: hits 0,0,1,1 -> r_rel = 2/4 = 0.5 = gamma
    r = one(traj(GOLD, [call([0, 0, 1, 0, 0])]), hit_ks=(1, 2, 3, 4))
    assert r.r_rel == 0.5 and r.reward == 0.5 and r.reason == REASON_EASY_REL_ONLY


def test_paper_easy_high_relevance_adds_r_main():
    r = one(traj(ANSWER_F1_08, [call(REL_RANK2)]))  # 2/3 > 0.5 -> 2/3 + 0.8
    assert r.reward == pytest.approx(2 / 3 + 0.8) and r.r_main == 0.8 and r.reason == REASON_EASY_REL_PLUS_MAIN
    r = one(traj(ANSWER_F1_08, [call(REL_RANK1)]), gamma=0.99)  # gamma configurable: 1 > 0.99
    assert r.reward == pytest.approx(1.8)


def test_paper_hard_call_gets_r_main():
    r = one(traj(ANSWER_F1_08, [call(REL_NONE)]))
    assert r.i_ans == 0 and r.reward == 0.8 and r.reason == REASON_HARD_MAIN


def test_paper_invalid_ranker_scores_fallback_list_unless_penalised():
    t = traj(GOLD, [call(REL_RANK1, FALLBACK, valid=False)])
    r = one(t)  # the agent saw the retriever top-K: rank 1 relevant -> r_rel = 1 > 0.5 -> 1 + 1
    assert r.kept and r.reward == 2.0 and r.reason == REASON_EASY_REL_PLUS_MAIN
    r = one(t, penalize_invalid_ranker=True)
    assert r.kept and r.reward == -0.2 and r.reason == REASON_INVALID


def test_paper_penalize_policy_puts_minus_alpha_into_composite():
    t = traj(GOLD, [call(REL_RANK1), call(REL_NONE, turn=1), call(REL_RANK4, turn=2)], format_ok=False)
    easy_hi, hard, easy_lo = ranker_rewards([t], RankerRewardConfig(agent_format_fail="penalize"))
    assert all(r.kept for r in (easy_hi, hard, easy_lo))
    assert easy_hi.reward == pytest.approx(1.0 - 0.2)  # r_rel + r_main with r_main = -alpha
    assert hard.reward == -0.2
    assert easy_lo.reward == pytest.approx(1 / 3)  # low-relevance branch ignores r_main
    (r,) = ranker_rewards([traj(GOLD, [call(REL_NONE)], format_ok=False)],
                          RankerRewardConfig(agent_format_fail="penalize"), agent_cfg=AgentRewardConfig(alpha=0.5))
    assert r.reward == -0.5


# --------------------------------------------------------------------------- released-code variant


def test_released_binarises_r_main_at_0_8():
    assert main_reward(traj(ANSWER_F1_08), RankerRewardConfig(variant="released")) == 1.0  # 0.8 >= 0.8
    # just below: 5 shared of 5 (gold) + 8 (answer) tokens: F1 = 10/13 = 0.769 < 0.8 -> 0
    below = traj("red green blue pink black w1 w2 w3", [call(REL_NONE)])
    assert agent_reward(below) == pytest.approx(10 / 13)
    assert main_reward(below, RankerRewardConfig(variant="released")) == 0.0
    assert main_reward(below, RankerRewardConfig(variant="released", released_f1_threshold=0.75)) == 1.0
    r = one(traj(ANSWER_F1_08, [call(REL_NONE)]), variant="released")  # hard call: binarised r_main
    assert r.reward == 1.0 and r.r_main == 1.0 and r.reason == REASON_HARD_MAIN
    assert one(below, variant="released").reward == 0.0


def test_released_bonus_at_exactly_0_8_uses_ge():
    ks = (1, 2, 3, 4, 5)
    # relevant at rank 2: Hit@1..5 = 0,1,1,1,1 -> r_rel = 4/5 = 0.8 -> bonus (>=): 0.8 + 1
    r = one(traj(GOLD, [call(REL_RANK2)]), variant="released", hit_ks=ks)
    assert r.r_rel == 0.8 and r.reward == pytest.approx(1.8) and r.reason == REASON_EASY_REL_PLUS_MAIN
    # relevant at rank 3: 0,0,1,1,1 -> 0.6: released gives r_rel only, the paper (0.6 > gamma) adds r_main
    t = traj(GOLD, [call([0, 0, 1, 0, 0, 0])])
    assert one(t, variant="released", hit_ks=ks).reward == pytest.approx(0.6)
    assert one(t, variant="paper", hit_ks=ks).reward == pytest.approx(1.6)


def test_released_invalid_ranker_gets_penalty():
    t = traj(GOLD, [call(REL_RANK1, FALLBACK, valid=False), call(REL_NONE, FALLBACK, valid=False, turn=1)])
    for r in ranker_rewards([t], RankerRewardConfig(variant="released")):
        assert r.kept and r.reward == -0.2 and r.reason == REASON_INVALID
    (r, _) = ranker_rewards([t], RankerRewardConfig(variant="released", invalid_ranker_penalty=-1.0))
    assert r.reward == -1.0
    (r, _) = ranker_rewards([t], RankerRewardConfig(variant="released", penalize_invalid_ranker=False))
    assert r.reward == 2.0  # fallback list scored: r_rel 1 >= 0.8 -> 1 + 1


def test_released_format_fail_is_kept_with_zero_r_main():
    t = traj(GOLD, [call(REL_RANK1), call(REL_NONE, turn=1)], format_ok=False)
    easy, hard = ranker_rewards([t], RankerRewardConfig(variant="released"))
    assert easy.kept and easy.r_main == 0.0 and easy.reward == 1.0  # -0.2 binarised -> 0; 1 + 0
    assert hard.kept and hard.reward == 0.0
    easy, _ = ranker_rewards([t], RankerRewardConfig(variant="released", agent_format_fail="filter"))
    assert not easy.kept and easy.reason == REASON_FILTERED


# --------------------------------------------------------------------------- ablations, nDCG, alignment


def test_ablation_without_r_main_is_r_rel():
    t = traj(GOLD, [call(REL_RANK2), call(REL_NONE, turn=1)])
    easy, hard = ranker_rewards([t], RankerRewardConfig(use_main=False))
    assert easy.reward == pytest.approx(2 / 3) and hard.reward == 0.0 and easy.reason == REASON_ABLATION_REL
    (r,) = ranker_rewards([traj(GOLD, [call(REL_RANK1)], format_ok=False)], RankerRewardConfig(use_main=False))
    assert not r.kept  # the paper's format filter still applies


def test_ablation_without_r_rel_is_r_main():
    t = traj(ANSWER_F1_08, [call(REL_RANK1), call(REL_RANK4, turn=1), call(REL_NONE, turn=2)])
    assert [r.reward for r in ranker_rewards([t], RankerRewardConfig(use_rel=False))] == [0.8, 0.8, 0.8]
    assert {r.reason for r in ranker_rewards([t], RankerRewardConfig(use_rel=False))} == {REASON_ABLATION_MAIN}
    assert [r.reward for r in ranker_rewards([t], RankerRewardConfig(use_rel=False, variant="released"))] == [1.0] * 3


def test_ndcg_relevance_hand_computed():
    # N = 8 candidates, relevant: 1 and 6; shown (K = 5): 0,1,2,3,4 -> labels 0,1,0,0,0
    c = call([0, 1, 0, 0, 0, 0, 1, 0], [0, 1, 2, 3, 4])
    dcg = 1 / math.log2(3)  # one hit at rank 2: 0.63093
    pool_idcg = 1 + 1 / math.log2(3)  # best list from the pool: two hits at ranks 1, 2: 1.63093
    assert relevance_reward(c, RankerRewardConfig(relevance="ndcg")) == pytest.approx(dcg / pool_idcg)  # 0.38685
    assert relevance_reward(c, RankerRewardConfig(relevance="ndcg", ndcg_ideal="shown")) == pytest.approx(dcg)
    # K follows len(order): a list of 3 with the hit at rank 3 -> (1/log2 4) / (1 + 1/log2 3) = 0.5 / 1.63093
    c3 = call([0, 1, 0, 0, 0, 0, 1, 0], [0, 2, 6])
    assert relevance_reward(c3, RankerRewardConfig(relevance="ndcg")) == pytest.approx(0.5 / pool_idcg)
    # nDCG 0.38685 <= gamma: r_rel only; the perfect list [6, 1] scores 1 > gamma: 1 + r_main
    assert one(traj(GOLD, [c]), relevance="ndcg").reward == pytest.approx(dcg / pool_idcg)
    assert one(traj(GOLD, [call([0, 1, 0, 0, 0, 0, 1, 0], [6, 1])]), relevance="ndcg").reward == pytest.approx(2.0)


def test_relevance_reward_default_hit_and_bad_order():
    assert relevance_reward(call(REL_RANK2)) == pytest.approx(2 / 3)
    assert relevance_reward(call(REL_RANK2, [])) == 0.0
    with pytest.raises(ValueError, match="outside"):
        relevance_reward(call(REL_RANK2, [0, 9]))


def test_ranker_rewards_aligned_with_flattened_calls():
    t0 = traj(GOLD, [call(REL_RANK1, traj_id="q1/0", turn=0), call(REL_NONE, traj_id="q1/0", turn=1)], traj_id="q1/0")
    t1 = traj(GOLD, [], traj_id="q1/1")  # answered without searching: no calls
    t2 = traj(ANSWER_F1_08, [call(REL_RANK4, traj_id="q2/0", turn=0)], traj_id="q2/0")
    t3 = traj(GOLD, [call(REL_RANK1, traj_id="q2/1")], format_ok=False, traj_id="q2/1")
    trajs = [t0, t1, t2, t3]
    rs = ranker_rewards(trajs)
    flat = [c for t in trajs for c in t.ranker_calls]
    assert len(rs) == len(flat) == 4
    assert [(r.traj_id, r.turn) for r in rs] == [(c.traj_id, c.turn) for c in flat]
    assert [r.reward for r in rs[:3]] == pytest.approx([2.0, 1.0, 1 / 3])
    assert [r.kept for r in rs] == [True, True, True, False]


@pytest.mark.parametrize("bad", [
    {"variant": "authors"}, {"relevance": "mrr"}, {"ndcg_ideal": "all"}, {"agent_format_fail": "drop"},
    {"hit_ks": ()}, {"hit_ks": (0, 3)}, {"hit_ks": "135"}, {"hit_ks": (1.5,)}, {"gamma": float("nan")},
    {"released_f1_threshold": "0.8"}, {"invalid_ranker_penalty": float("inf")},
    {"use_main": False, "use_rel": False}, {"use_rel": 1}, {"penalize_invalid_ranker": "yes"},
])
def test_bad_ranker_config_raises(bad):
    with pytest.raises(ValueError):
        RankerRewardConfig(**bad)


def test_config_resolution_and_glossary():
    assert RankerRewardConfig(hit_ks=[1, 3]).hit_ks == (1, 3)  # a YAML list becomes a tuple
    paper, released = RankerRewardConfig(), RankerRewardConfig(variant="released")
    assert (paper.format_fail_policy, paper.invalid_penalized) == ("filter", False)
    assert (released.format_fail_policy, released.invalid_penalized) == ("penalize", True)
    fields = set(RankerReward.__dataclass_fields__)
    assert fields | {"agent_reward"} == set(REWARD_GLOSSARY)


def test_every_relevance_reward_the_config_accepts_has_its_code():
    from cosearch_lib.config.grpo import RANKER_RELEVANCE_KINDS
    from cosearch_lib.rl.rewards import RELEVANCE_SCORES

    assert set(RELEVANCE_SCORES) == set(RANKER_RELEVANCE_KINDS)
