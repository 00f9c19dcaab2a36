"""Semantic grouping of ranker calls (paper Alg. 2) and its ablations, on hand-built sub-query pools.

Token F1 between normalised sub-queries is 2 * overlap / (len1 + len2); each cluster assignment
below shows that arithmetic against the cluster *representative* (its first member)."""

from __future__ import annotations

import math

import pytest

from cosearch_lib.agent.rollout import RankerCall
from cosearch_lib.config import GroupingConfig
from cosearch_lib.metrics import query_token_f1
from cosearch_lib.rl.rewards import RankerReward
from cosearch_lib.rl.semantic_grouping import GROUPING_GLOSSARY, Grouping, group_ids, group_ranker_calls

Q1 = "Who directed the film that won the Golden Reel in 2003?"
Q2 = "Who directed Film Yarrow?"


def rc(question_id: str, sub_query: str, i_ans: int, *, prompt_ids=(7, 8, 9), order=(0, 1, 2),
       valid=True) -> RankerCall:
    return RankerCall(
        traj_id=f"{question_id}/0", question_id=question_id, sample=0, turn=0, q0=Q1 if question_id == "q1" else Q2,
        sub_query=sub_query, candidate_ids=["a", "b", "c"], relevant=[i_ans, 0, 0], order=list(order), valid=valid,
        error=None, prompt_ids=list(prompt_ids), output_ids=[1], output_logprobs=[-0.5], output_text="",
        i_ans=i_ans)


def rr(reward: float, i_ans: int = 1, kept: bool = True) -> RankerReward:
    return RankerReward(reward=reward if kept else math.nan, r_rel=0.0, r_main=0.0, i_ans=i_ans, kept=kept,
                        reason="test")


# The main pool. Normalised forms (lower-case, articles dropped, punctuation -> space):
#   A  "director of film yarrow"           (4 tokens)
#   B  "film yarrow director"              (3)
#   C  "who directed film yarrow"          (4)
#   E  "golden reel 2003 winner"           (4)
#   F  "golden reel winner 2003 film"      (5)
#   Q  "golden reel winner 2003 film list page" (7)
POOL = [
    # idx  question  sub-query                                  I_ans  reward  -> cluster (easy/hard split first)
    (rc("q1", "director of Film Yarrow", 1), rr(1.0)),  # 0: first easy call -> new cluster E1, rep A
    (rc("q1", "Film Yarrow director", 1), rr(0.5)),  # 1: vs A: overlap 3 -> 2*3/(3+4) = 0.857 >= 0.8 -> E1
    (rc("q1", "who directed Film Yarrow", 1), rr(0.2)),  # 2: vs A: overlap 2 -> 4/8 = 0.5 -> new E2, rep C
    (rc("q1", "Golden Reel 2003 winner", 1), rr(0.0)),  # 3: vs A 0, vs C 0 -> new E3, rep E
    (rc("q1", "The director of Film Yarrow?", 1), rr(0.0)),  # 4: normalises to A: F1 1.0 -> E1
    (rc("q1", "director of Film Yarrow", 0), rr(0.8, 0)),  # 5: same text as 0 but hard -> new H1 (own split)
    (rc("q1", "Golden Reel winner 2003 film", 1), rr(0.0)),  # 6: vs A 0; C "film" 2/9; E 4 -> 8/9 = 0.889 -> E3
    (rc("q1", "Golden Reel winner 2003 film list page", 1), rr(0.4)),  # 7: vs E: 4 -> 8/11 = 0.727 -> new E4
    #                         (it matches member 6 - 5 shared -> 10/12 = 0.833 - but only representatives count)
    (rc("q1", "who directed Film Yarrow?", 1), rr(0.7)),  # 8: vs A: 0.5; vs C: 1.0 -> E2
    (rc("q1", "Yarrow film director", 0), rr(0.8, 0)),  # 9: hard; vs A (rep 5): 3 -> 6/7 = 0.857 -> H1
    (rc("q1", "director of Film Yarrow", 0), rr(0.8, 0)),  # 10: hard, identical to rep 5 -> H1
    (rc("q1", "who directed film yarrow", 1), rr(1.0, kept=False)),  # 11: agent format failed: not kept
    (rc("q2", "director of Film Yarrow", 1), rr(0.3)),  # 12: other question -> its own pool -> Q2a
    (rc("q2", "Film Yarrow director", 1), rr(0.9)),  # 13: 6/7 vs 12 -> Q2a
    (rc("q2", "director of the Film Yarrow", 1), rr(0.3)),  # 14: article dropped -> identical to 12 -> Q2a
]
CALLS = [c for c, _ in POOL]
REWARDS = [r for _, r in POOL]
# clusters, ordered by first member: E1, E2, E3, H1, E4, Q2a
CLUSTERS = [[0, 1, 4], [2, 8], [3, 6], [5, 9, 10], [7], [12, 13, 14]]


def test_hand_computed_f1_values_in_comments():
    assert query_token_f1("director of Film Yarrow", "Film Yarrow director") == pytest.approx(6 / 7)
    assert query_token_f1("director of Film Yarrow", "who directed Film Yarrow") == 0.5
    assert query_token_f1("Golden Reel 2003 winner", "Golden Reel winner 2003 film") == pytest.approx(8 / 9)
    assert query_token_f1("Golden Reel 2003 winner", "Golden Reel winner 2003 film list page") == pytest.approx(8 / 11)
    f1 = query_token_f1("Golden Reel winner 2003 film", "Golden Reel winner 2003 film list page")
    assert f1 == pytest.approx(10 / 12)


def test_semantic_clusters_match_hand_assignment():
    g = group_ranker_calls(CALLS, REWARDS)
    assert g.clusters == CLUSTERS
    # k_min = 3 drops E2, E3, E4; H1 (all 0.8) has zero variance; E1 and Q2a survive
    assert g.groups == [[0, 1, 4], [12, 13, 14]]


def test_representative_semantics_opens_new_cluster():
    # call 7 would join call 6 (0.833) but is compared with E3's representative, call 3 (0.727)
    g = group_ranker_calls(CALLS, REWARDS)
    assert [7] in g.clusters and [3, 6] in g.clusters


def test_easy_hard_split_keeps_identical_queries_apart():
    g = group_ranker_calls(CALLS, REWARDS)
    (home0,) = [c for c in g.clusters if 0 in c]
    (home5,) = [c for c in g.clusters if 5 in c]
    assert home0 != home5 and CALLS[0].sub_query == CALLS[5].sub_query
    assert all(CALLS[i].i_ans == 0 for i in home5)


def test_questions_never_share_a_group():
    for mode in ("semantic", "exact", "none"):
        g = group_ranker_calls(CALLS, REWARDS, mode=mode, k_min=1, drop_zero_variance=False)
        for c in g.clusters:
            assert len({CALLS[i].question_id for i in c}) == 1, (mode, c)


def test_filtered_calls_are_excluded():
    g = group_ranker_calls(CALLS, REWARDS, k_min=1, drop_zero_variance=False)
    assert 11 not in {i for c in g.clusters for i in c}
    assert g.rewards[11] is None and g.rewards[0] == 1.0
    assert group_ids(g, len(CALLS))[11] == -1


def test_k_min_discard():
    # k_min = 2: E2 (0.2, 0.7) survives; E3 (0.0, 0.0) is flat; E4 is a singleton
    g = group_ranker_calls(CALLS, REWARDS, k_min=2)
    assert g.groups == [[0, 1, 4], [2, 8], [12, 13, 14]]
    assert (g.stats["n_dropped_small"], g.stats["n_dropped_zero_var"]) == (1, 2)
    # the release drops size <= 3, i.e. k_min = 4: nothing survives here
    g = group_ranker_calls(CALLS, REWARDS, GroupingConfig(k_min=4))
    assert g.groups == [] and g.stats["n_dropped_small"] == 6 and g.stats["n_dropped_zero_var"] == 0
    assert math.isnan(g.stats["mean_group_size_post"]) and g.stats["calls_in_groups"] == 0.0


def test_zero_variance_drop_is_optional():
    g = group_ranker_calls(CALLS, REWARDS, drop_zero_variance=False)
    assert g.groups == [[0, 1, 4], [5, 9, 10], [12, 13, 14]]
    assert g.stats["n_dropped_zero_var"] == 0 and g.stats["n_hard_calls_in_groups"] == 3


def test_stats_hand_checked():
    s = group_ranker_calls(CALLS, REWARDS).stats
    assert s == {
        "n_calls": 15,
        "n_kept_calls": 14,  # call 11 filtered
        "n_pools": 2,  # q1, q2
        "n_easy_calls": 11,  # 0-4, 6-8, 12-14
        "n_hard_calls": 3,  # 5, 9, 10
        "n_clusters_pre": 6,
        "n_groups_post": 2,
        "mean_group_size_pre": pytest.approx(14 / 6),  # 3 + 2 + 2 + 3 + 1 + 3 = 14 calls in 6 clusters
        "mean_group_size_post": 3.0,
        "n_dropped_small": 3,  # E2, E3, E4
        "n_dropped_zero_var": 1,  # H1
        "n_duplicate_calls": 0,
        "calls_in_groups": pytest.approx(6 / 14),
        "n_easy_calls_in_groups": 6,
        "n_hard_calls_in_groups": 0,
    }
    assert set(s) == set(GROUPING_GLOSSARY)


def test_mode_none_one_group_per_question_without_split():
    g = group_ranker_calls(CALLS, REWARDS, mode="none")
    # easy and hard calls of q1 together (11 kept calls, rewards vary); q2's three calls
    assert g.clusters == [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [12, 13, 14]]
    assert g.groups == g.clusters
    assert g.stats["n_hard_calls_in_groups"] == 3


def test_mode_exact_groups_identical_normalised_queries():
    g = group_ranker_calls(CALLS, REWARDS, mode="exact", k_min=1, drop_zero_variance=False)
    # "The director of Film Yarrow?" (4) and "director of the Film Yarrow" (14) normalise to A exactly;
    # reworded queries (1, 9, 13) stay alone; hard 10 joins hard 5, not easy 0
    assert g.clusters == [[0, 4], [1], [2, 8], [3], [5, 10], [6], [7], [9], [12, 14], [13]]


def test_empty_normalised_queries_never_cluster():
    calls = [rc("q1", "???", 1), rc("q1", "the", 1), rc("q1", "", 1)]
    rewards = [rr(0.0), rr(1.0), rr(0.5)]
    for mode in ("semantic", "exact"):
        g = group_ranker_calls(calls, rewards, mode=mode, k_min=1, drop_zero_variance=False)
        assert g.clusters == [[0], [1], [2]]


def test_delta_controls_merging():
    # with delta = 0.5, call 2 ("who directed film yarrow", F1 0.5 with A) joins E1
    g = group_ranker_calls(CALLS, REWARDS, delta=0.5, k_min=1, drop_zero_variance=False)
    assert [0, 1, 2, 4, 8] in g.clusters


def test_dedupe_identical_averages_before_variance_filter():
    p, other = (1, 2, 3), (1, 2, 4)
    calls = [rc("q1", "director of Film Yarrow", 1, prompt_ids=p, order=(2, 0)),
             rc("q1", "director of Film Yarrow", 1, prompt_ids=p, order=(2, 0)),  # twin of 0
             rc("q1", "director of Film Yarrow", 1, prompt_ids=p, order=(0, 2)),  # same prompt, other ranking
             rc("q1", "director of Film Yarrow", 1, prompt_ids=other, order=(2, 0))]  # other prompt
    rewards = [rr(1.0), rr(0.0), rr(0.5), rr(0.5)]
    plain = group_ranker_calls(calls, rewards)
    assert plain.groups == [[0, 1, 2, 3]] and plain.rewards == [1.0, 0.0, 0.5, 0.5]
    deduped = group_ranker_calls(calls, rewards, dedupe_identical=True)
    assert deduped.rewards == [0.5, 0.5, 0.5, 0.5]  # 0 and 1 averaged -> the group is now flat
    assert deduped.groups == [] and deduped.stats["n_dropped_zero_var"] == 1 and deduped.stats["n_duplicate_calls"] == 1


def test_dedupe_invalid_outputs_share_one_key():
    p = (5, 6)
    calls = [rc("q1", "x y", 1, prompt_ids=p, order=(0, 1), valid=False),
             rc("q1", "x y", 1, prompt_ids=p, order=(0, 1), valid=False),
             rc("q1", "x y", 1, prompt_ids=p, order=(0, 1), valid=True)]  # chose the fallback list itself
    g = group_ranker_calls(calls, [rr(-0.2), rr(0.4), rr(1.0)], dedupe_identical=True)
    assert g.rewards == pytest.approx([0.1, 0.1, 1.0]) and g.stats["n_duplicate_calls"] == 1


def test_group_ids_mapping():
    g = group_ranker_calls(CALLS, REWARDS)
    assert group_ids(g, 15) == [0, 0, -1, -1, 0, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1]
    assert group_ids(g, 16)[-1] == -1
    with pytest.raises(ValueError, match="too small"):
        group_ids(g, 14)
    assert group_ids(Grouping(groups=[], clusters=[], rewards=[]), 3) == [-1, -1, -1]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="aligned"):
        group_ranker_calls(CALLS, REWARDS[:-1])
    with pytest.raises(ValueError, match="finite"):
        group_ranker_calls(CALLS[:1], [RankerReward(math.nan, 0.0, 0.0, 1, True, "x")])
    for bad in ({"mode": "cosine"}, {"delta": 0.0}, {"delta": 1.5}, {"k_min": 0}, {"k_min": 2.5},
                {"drop_zero_variance": "yes"}, {"dedupe_identical": 1}):
        with pytest.raises(ValueError):
            GroupingConfig(**bad)
    with pytest.raises(TypeError):
        group_ranker_calls(CALLS, REWARDS, k_max=3)


def test_empty_step():
    g = group_ranker_calls([], [])
    assert g.groups == [] and g.stats["n_kept_calls"] == 0 and math.isnan(g.stats["calls_in_groups"])
