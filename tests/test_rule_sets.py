"""The two rule sets (config.RuleSet): the paper's and the authors' released code's, at every boundary
where they part (docs/METHOD.md, "Rule sets"). Each case is written from the rules, with the
expected value worked out by hand, and checked under both sets."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from cosearch_lib.agent.parsers import DEFAULT_END_MARKERS, parse_agent_turn, parse_ranking, released_answer
from cosearch_lib.agent.rankers import LLMRanker, RankRequest, RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine
from cosearch_lib.config import (
    RULE_OPTIONS,
    RULE_SETS,
    AgentRewardConfig,
    ConfigError,
    EvaluationConfig,
    GroupingConfig,
    ProtocolConfig,
    RankerRewardConfig,
    RolloutConfig,
    RuleSet,
    SamplingConfig,
    SearchBudget,
    load_profile,
)
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.experiment import harness_config
from cosearch_lib.metrics import answer_f1, has_answer, query_token_f1, relevance_labels, token_f1
from cosearch_lib.rl.grpo_loss import group_advantages
from cosearch_lib.rl.rewards import RankerReward, agent_rewards, main_reward
from cosearch_lib.rl.semantic_grouping import dedupe_key, group_ranker_calls, is_flat

from tests.doubles import FixedRetriever, ScriptedBackend

PAPER, RELEASED = RULE_SETS["paper"], RULE_SETS["released"]


# ------------------------------------------------------------------------------ the switch


def test_the_two_sets_differ_in_every_option_and_a_bad_value_is_refused():
    assert all(getattr(PAPER, o) == v[0] and getattr(RELEASED, o) == v[1] for o, v in RULE_OPTIONS.items())
    assert PAPER == RuleSet() and not PAPER.released and RELEASED.released
    with pytest.raises(ValueError, match="rules.zero_variance must be one of"):
        RuleSet(zero_variance="approx")


def test_one_profile_switch_reaches_every_stage_and_explicit_settings_still_win():
    paper, released = load_profile("paper"), load_profile("paper", rules="released")  # no reward or grouping overrides
    assert paper.rules == "paper" and released.rules == "released"
    for cfg, rules in ((paper, PAPER), (released, RELEASED)):
        t = cfg.training
        assert cfg.rollout.rules is rules and t.agent_reward.rules is rules and t.ranker_reward.rules is rules
        assert t.grouping.rules is rules and harness_config(cfg).rules is rules
    t = released.training
    assert t.ranker_reward.form == "released" and t.ranker_reward.invalid_penalized
    assert t.ranker_reward.format_fail_policy == "penalize" and not t.agent_reward.uses_yes_no_rule
    assert t.grouping.min_size == 4 and t.grouping.dedupe
    t = paper.training
    assert t.ranker_reward.form == "paper" and t.grouping.min_size == 3 and not t.grouping.dedupe
    assert load_profile("demo", rules="released").training.grouping.min_size == 2  # demo.yaml sets k_min: 2 itself
    ci = load_profile("ci").training  # ci.yaml sets its plumbing rules itself: they hold under the paper set
    assert ci.ranker_reward.invalid_penalized and ci.ranker_reward.format_fail_policy == "penalize" and ci.grouping.min_size == 2
    with pytest.raises(ConfigError, match="rules must be one of"):
        load_profile("ci", rules="verl")
    # configs built by hand (no profile) follow the paper set unless told otherwise
    assert RankerRewardConfig().form == "paper" and RankerRewardConfig(variant="released").form == "released"


# ------------------------------------------------------------------------------ 1. token F1 arithmetic


def test_f1_at_exactly_0_8_under_both_arithmetics():
    # 6 shared tokens of 7 + 8: exactly 12/15 = 0.8; the release's P = 6/7, R = 6/8, 2PR/(P+R) rounds below
    pred, gold = "p q r s t u v", "p q r s t u w x"
    assert token_f1(pred, gold) == 0.8
    assert token_f1(pred, gold, arithmetic="precision_recall") == 0.7999999999999999
    # 4 of 5 + 5: P = R = 0.8, and the release's 2PR/(P+R) lands one ulp above: both sides of >= 0.8 agree
    assert token_f1("p q r s t", "p q r s u") == 0.8
    assert token_f1("p q r s t", "p q r s u", arithmetic="precision_recall") == 0.8000000000000002
    # the two sub-queries group at delta 0.8 on paper and stay apart in the release
    assert query_token_f1(pred, gold) >= 0.8 > query_token_f1(pred, gold, arithmetic="precision_recall")
    calls = [SimpleNamespace(question_id="q", i_ans=1, sub_query=q, prompt_ids=[i], order=[0], valid=True, output_text="")
             for i, q in enumerate([pred, gold, pred, gold])]
    rewards = [RankerReward(reward=r, r_rel=0, r_main=0, i_ans=1, kept=True, reason="") for r in (0.0, 1.0, 0.5, 0.2)]
    on_paper = group_ranker_calls(calls, rewards, GroupingConfig(k_min=1, drop_zero_variance=False))
    released = group_ranker_calls(calls, rewards, GroupingConfig(k_min=1, drop_zero_variance=False, rules=RELEASED))
    assert on_paper.groups == [[0, 1, 2, 3]] and released.groups == [[0, 2], [1, 3]]


def test_an_answer_at_f1_0_8_binarises_differently_under_the_two_arithmetics():
    traj = SimpleNamespace(format_ok=True, answer="p q r s t u v", golds=["p q r s t u w x"], ranker_calls=[])
    variant = {"variant": "released"}
    assert main_reward(traj, RankerRewardConfig(**variant), AgentRewardConfig(yes_no_rule=False)) == 1.0
    assert main_reward(traj, RankerRewardConfig(**variant, rules=RELEASED), AgentRewardConfig(rules=RELEASED)) == 0.0


def test_the_overlap_arithmetic_is_the_correctly_rounded_f1_and_the_release_is_within_two_ulps():
    import random

    rng = random.Random(0)
    for _ in range(3000):
        a = " ".join(rng.choice("bcdefghk") for _ in range(rng.randint(1, 12)))
        b = " ".join(rng.choice("bcdefghk") for _ in range(rng.randint(1, 12)))
        exact, released = token_f1(a, b, yes_no_rule=False), token_f1(a, b, yes_no_rule=False, arithmetic="precision_recall")
        ta, tb = a.split(), b.split()
        overlap = sum(min(ta.count(t), tb.count(t)) for t in set(ta))
        assert exact == float(Fraction(2 * overlap, len(ta) + len(tb)))
        assert abs(exact - released) <= 2 * 2 ** -53 * 2


# ------------------------------------------------------------------------------ 2. trivial answers


@pytest.mark.parametrize("golds, passage, paper, released", [
    (["yes", "Paris"], "yes", False, True),  # mixed golds: the release looks for every one, "yes" included
    (["yes", "Paris"], "Paris is big", True, True),
    (["Yes."], "Yes.", False, True),  # "Yes." is trivial after normalisation, not after lower+strip
    (["yes", "No"], "yes and no", False, False),  # all trivial: nothing counts under either
    ([" TRUE "], "true", False, False),  # lower+strip makes it trivial for the release too
    (["Paris"], "Parisian", False, False),
])
def test_trivial_golds_under_both_rules(golds, passage, paper, released):
    assert has_answer(passage, golds) is paper
    assert has_answer(passage, golds, trivial="drop_if_all") is released
    assert relevance_labels([passage, "nothing"], golds, trivial="drop_if_all") == [int(released), 0]


def test_the_rollout_labels_candidates_with_the_rule_sets_trivial_rule(tok, chat):
    from tests.doubles import answer_turn, search_turn

    corpus = [Passage("0", '"Doc 0"\nyes, it was.'), Passage("1", '"Doc 1"\nA quiet harbour.')]
    question = QAExample(id="q", question="Was it?", golden_answers=["yes", "Kessmere"], data_source="syn_nq")
    turns = {0: search_turn("was it"), 1: answer_turn("yes")}
    labels = {}
    for rules in (PAPER, RELEASED):
        backend = ScriptedBackend(tok, lambda prompt, key: turns[key[-1]])
        engine = RolloutEngine(backend, chat, FixedRetriever(corpus), RetrievalOnlyRanker(),
                               RolloutConfig(search=SearchBudget(topn=2, topk=1), rules=rules), ProtocolConfig(search=SearchBudget(topk=1)))
        (traj,) = engine.run([question], n_samples=1, seed=0)
        labels[rules.name] = (traj.ranker_calls[0].relevant, traj.ranker_calls[0].i_ans)
    assert labels == {"paper": ([0, 0], 0), "released": ([1, 0], 1)}


# ------------------------------------------------------------------------------ 3. ranker output validity


@pytest.mark.parametrize("text, strict, released", [
    ("<reason>r</reason><rerank>[2] > [1]</rerank>", "ok", "ok"),
    ("<reason></reason><rerank>[2] > [1]</rerank>", "empty_reason", "ok"),  # empty reason
    ("Let me rank. <reason>r</reason><rerank>[2] > [1]</rerank>", "extra_text", "ok"),  # text before the reason
    ("<rerank>[3] > [4]</rerank><reason>r</reason><rerank>[2] > [1]</rerank>", "wrong_order", "ok"),  # a rerank block first
    ("<reason>x<reason>y</reason>z</reason><rerank>[2] > [1]</rerank>", "nested_tags", "ok"),  # nested reasons
    ("<reason>r</reason><rerank>[ 2 ] > [ 1 ]</rerank>", "ok", "bad_syntax"),  # spaces inside the brackets
    ("<reason>r</reason><rerank>[2]>[1]</rerank>", "ok", "ok"),
    ("<reason>r</reason><rerank>[2] > [1]</rerank> done", "extra_text", "bad_tail"),
    ("<rerank>[2] > [1]</rerank><reason>r</reason>", "wrong_order", "bad_tail"),
    ("<reason>a</reason><reason>b</reason><rerank>[2] > [1]</rerank>", "multiple_reasons", "multiple_reasons"),
    ("<reason>r</reason><rerank>[2] > [2]</rerank>", "duplicate_index", "duplicate_index"),
    ("<reason>r</reason><rerank>[2] > [9]</rerank>", "out_of_range", "out_of_range"),
    ("<reason>r</reason><rerank>[2]</rerank>", "too_few", "bad_syntax"),
    ("<reason>r</reason><rerank>[2], [1]</rerank>", "bad_syntax", "bad_syntax"),
])
def test_ranker_validity_in_both_modes(text, strict, released):
    for mode, want in (("strict", strict), ("released", released)):
        out = parse_ranking(text, n_candidates=5, k=2, protocol=mode)
        assert (out.error or "ok") == want, (mode, text, out)
        assert out.valid == (want == "ok") and (out.order == [1, 0]) == (want == "ok")


@pytest.mark.parametrize("marker", DEFAULT_END_MARKERS)
@pytest.mark.parametrize("space", ["", "\n"])
def test_a_trailing_end_marker_is_stripped_on_paper_and_judged_as_given_by_the_release(marker, space):
    text = f"<reason>r</reason><rerank>[2] > [1]</rerank>{space}{marker}{space}"
    strict = parse_ranking(text, n_candidates=5, k=2, protocol="strict")
    released = parse_ranking(text, n_candidates=5, k=2, protocol="released")
    assert strict.valid and strict.order == [1, 0]
    assert not released.valid and released.error == "bad_tail" and released.order == []
    # the release strips nothing even when the caller names the marker; whitespace alone is fine
    assert parse_ranking(text, 5, 2, strip_suffixes=(marker,), protocol="released").error == "bad_tail"
    assert parse_ranking(f"{space}<reason>r</reason><rerank>[2] > [1]</rerank>{space}", 5, 2, protocol="released").valid


@pytest.mark.parametrize("marker", DEFAULT_END_MARKERS)
@pytest.mark.parametrize("turn, kind", [
    ('<reason>r</reason><tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', "search"),
    ("<reason>r</reason><answer>Paris</answer>", "answer"),
])
def test_a_trailing_end_marker_leaves_both_agent_verdicts_valid(marker, turn, kind):
    # paper: the marker is stripped before the strict check; released: the text is read as given,
    # and the release's verdict counts tags, which the marker does not touch
    for mode in ("strict", "released"):
        action = parse_agent_turn(turn + marker, protocol=mode)
        assert (action.kind, action.format_ok, action.error) == (kind, True, None), (mode, action)
    # only the strict parser strips: a second marker is extra text on paper, nothing to the release
    assert parse_agent_turn(turn + marker + marker, protocol="strict").error == "extra_text"
    assert parse_agent_turn(turn + marker + marker, protocol="released").format_ok


def test_the_llm_ranker_judges_a_literal_end_marker_by_its_rule_set(tok, chat):
    backend = ScriptedBackend(tok, lambda prompt, key: "<reason>r</reason><rerank>[2] > [1]</rerank></s>")
    request = RankRequest("q0?", "q", [Passage(str(i), f"passage {i}") for i in range(3)], k=2, row_key=(0, 0, 0, 0))
    verdicts = {}
    for rules in (PAPER, RELEASED):
        ranker = LLMRanker(backend, chat, ProtocolConfig(search=SearchBudget(topk=2)), SamplingConfig(max_new_tokens=64),
                           output_protocol=rules.ranker_output)
        (ranking,) = ranker.rank([request])
        assert ranking.output_text.endswith("</rerank></s>")  # the model wrote it; the backend kept it
        verdicts[rules.name] = (ranking.valid, ranking.order, ranking.error)
    assert verdicts == {"paper": (True, [1, 0], None), "released": (False, [0, 1], "bad_tail")}


# ------------------------------------------------------------------------------ 4. agent format verdict


@pytest.mark.parametrize("text, strict, released", [
    ("<reason>r</reason> x <answer>Paris</answer>", ("invalid", "extra_text"), ("answer", None)),
    ("<reason>r</reason><answer>Paris</answer>", ("answer", None), ("answer", None)),
    ("<reason>r</reason><answer> </answer>", ("invalid", "empty_answer"), ("answer", "empty_answer")),
    ("<answer>Paris</answer>", ("invalid", "missing_reason"), ("answer", "tag_count")),
    ("<answer>Paris</answer><reason>r</reason>", ("invalid", "wrong_order"), ("answer", "tag_order")),
    ('<reason>r</reason>\n<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', ("search", None), ("search", None)),
    ('<reason>r</reason> so <tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', ("invalid", "extra_text"), ("search", None)),
    ('<reason>r</reason><tool_call>{"name": "lookup", "arguments": {"query": "q"}}</tool_call>', ("invalid", "wrong_tool"), ("invalid", "no_action")),
    ("<reason>r</reason><tool_call>{not json}</tool_call>", ("invalid", "bad_json"), ("invalid", "no_action")),
    ('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>', ("invalid", "missing_reason"), ("search", "tag_count")),
])
def test_agent_turn_verdicts_in_both_modes(text, strict, released):
    for mode, (kind, error) in (("strict", strict), ("released", released)):
        action = parse_agent_turn(text, protocol=mode)
        assert (action.kind, action.error) == (kind, error), (mode, text, action)
        assert action.format_ok == (error is None and kind != "invalid")


def test_under_the_released_set_extra_text_earns_the_answer_and_the_answer_is_the_last_block(tok, chat):
    from tests.doubles import search_turn

    question = QAExample(id="q", question="Capital?", golden_answers=["Paris"], data_source="syn_nq")
    sloppy = "<reason>r</reason> x <answer>Paris</answer>"
    rewards = {}
    for rules in (PAPER, RELEASED):
        backend = ScriptedBackend(tok, lambda prompt, key: sloppy)
        engine = RolloutEngine(backend, chat, FixedRetriever([Passage("0", "Paris.")]), RetrievalOnlyRanker(),
                               RolloutConfig(search=SearchBudget(topn=1, topk=1), rules=rules), ProtocolConfig(search=SearchBudget(topk=1)))
        (traj,) = engine.run([question], n_samples=1, seed=0)
        rewards[rules.name] = agent_rewards([traj], AgentRewardConfig(rules=rules))[0]
    assert rewards == {"paper": -0.2, "released": 1.0}
    # an answer written beside a search call counts in the release when the last turn has none
    assert released_answer([search_turn("q") + "<answer>Lyon</answer>", "<reason>r</reason> no answer"]) == "Lyon"
    assert released_answer(["<reason>r</reason>"]) is None


# ------------------------------------------------------------------------------ 5. grouping details


def _call(prompt, text, order, valid=True, query="q"):
    return SimpleNamespace(question_id="q", i_ans=1, sub_query=query, prompt_ids=list(prompt), order=list(order),
                           valid=valid, output_text=text)


def test_dedupe_keys_parsed_ranking_versus_raw_rerank_text():
    tight, spaced = _call([1], "<reason>a</reason><rerank>[1]>[2]</rerank>", [0, 1]), \
        _call([1], "<reason>b</reason><rerank>[1] > [2]</rerank>", [0, 1])
    assert dedupe_key(tight) == dedupe_key(spaced)  # same prompt, same ranking
    assert dedupe_key(tight, "rerank_text") != dedupe_key(spaced, "rerank_text")  # different text
    bad1, bad2 = _call([1], "<reason>a</reason>nothing", [0, 1], False), _call([1], "<rerank>[7] > [7]</rerank>", [0, 1], False)
    assert dedupe_key(bad1) == dedupe_key(bad2) == ((1,), "invalid")  # all invalid outputs alike on paper
    assert dedupe_key(bad1, "rerank_text") == ((1,), "") != dedupe_key(bad2, "rerank_text") == ((1,), "[7] > [7]")
    padded = _call([1], "<rerank> [1] > [2] </rerank><rerank>x</rerank>", [0, 1])
    assert dedupe_key(padded, "rerank_text") == ((1,), "[1] > [2]")  # the first block, stripped
    assert dedupe_key(_call([2], "<reason>a</reason><rerank>[1]>[2]</rerank>", [0, 1])) != dedupe_key(tight)  # prompt matters


def test_dedupe_averages_with_numpy_under_the_released_set():
    calls = [_call([1], "<rerank>[1] > [2]</rerank>", [0, 1]) for _ in range(3)] + [_call([1], "<rerank>[2] > [1]</rerank>", [1, 0])]
    rewards = [RankerReward(reward=r, r_rel=0, r_main=0, i_ans=1, kept=True, reason="") for r in (-0.2, -0.2, -0.2, 1.0)]
    released = group_ranker_calls(calls, rewards, GroupingConfig(k_min=1, rules=RELEASED))
    assert released.rewards[:3] == [-0.20000000000000004] * 3  # np.mean of three -0.2: pairwise float sum, then / 3
    assert released.stats["n_duplicate_calls"] == 2
    assert group_ranker_calls(calls, rewards, GroupingConfig(k_min=1)).stats["n_duplicate_calls"] == 0  # paper: no dedupe


def test_zero_variance_ties_such_as_0_1_plus_0_2_against_0_3():
    tie = [0.1 + 0.2, 0.3, 0.3]
    assert is_flat(tie, "tolerance") and not is_flat(tie, "exact")
    calls = [_call([i], f"<rerank>[{i}]</rerank>", [0]) for i in range(3)]
    rewards = [RankerReward(reward=r, r_rel=0, r_main=0, i_ans=1, kept=True, reason="") for r in tie]
    assert group_ranker_calls(calls, rewards, GroupingConfig(k_min=3)).groups == []  # flat: dropped on paper
    kept = group_ranker_calls(calls, rewards, GroupingConfig(k_min=3, dedupe_identical=False, rules=RELEASED))
    assert kept.groups == [[0, 1, 2]] and kept.stats["n_dropped_zero_var"] == 0  # two distinct floats: kept
    ids = torch.zeros(3, dtype=torch.long)
    assert group_advantages(torch.tensor(tie, dtype=torch.float64), ids).abs().max() > 0  # float64: a residue of ~5e-11
    assert group_advantages(torch.tensor(tie, dtype=torch.float32), ids).abs().max() == 0  # float32 storage: equal again


def test_exact_grouping_of_empty_sub_queries():
    calls = [_call([i], "", [0], query=q) for i, q in enumerate(["", "the", "?!", "x y", "x_y"])]
    rewards = [RankerReward(reward=float(i), r_rel=0, r_main=0, i_ans=1, kept=True, reason="") for i in range(5)]
    on_paper = group_ranker_calls(calls, rewards, GroupingConfig(mode="exact", k_min=1, drop_zero_variance=False))
    released = group_ranker_calls(calls, rewards, GroupingConfig(mode="exact", k_min=1, drop_zero_variance=False,
                                                                  dedupe_identical=False, rules=RELEASED))
    assert on_paper.groups == [[0], [1], [2], [3], [4]]
    assert released.groups == [[0, 1, 2], [3, 4]]  # empties together; keys with spaces made "_" collide


# ------------------------------------------------------------------------------ 6. evaluation F1


def test_the_evaluation_metric_defaults_to_the_papers_plain_f1():
    assert answer_f1("yes it is", ["yes"]) == 0.5 and answer_f1("yes it is", ["yes"], "yes_no") == 0.0
    assert answer_f1("p q r s t u v", ["p q r s t u w x"]) == 0.7999999999999999  # the paper code's arithmetic
    assert EvaluationConfig().f1 == "plain" and harness_config(load_profile("ci")).f1 == "plain"
    with pytest.raises(ValueError, match="evaluation.f1"):
        EvaluationConfig(f1="hotpot")
    with pytest.raises(ValueError, match="metric must be one of"):
        answer_f1("a", ["a"], "exact")


# ------------------------------------------------------------------------------ a training step under each set


def test_a_joint_training_step_under_the_released_set_uses_its_rules(tok, tmp_path):
    """The scripted trainer for one step under each set. Its ranker shows two of three answer passages
    to some calls (r_rel = 2/3): Eq. 6 adds r_main above gamma = 0.5, the release only from 0.8 on."""
    from tests.doubles import tiny_model, trainer

    calls, records = {}, {}
    for rules in (PAPER, RELEASED):
        t = trainer(tok, tiny_model(tok), tmp_path / rules.name, steps=1, rules=rules)
        assert t.ranker.output_protocol == rules.ranker_output and t.engine.cfg.rules is rules
        records[rules.name] = t.train_step()
        calls[rules.name] = t.calls_frame()
        assert records[rules.name]["ranker/n_calls"] == len(calls[rules.name]) > 0
    paper, released = (calls[n].set_index(["traj_id", "turn"]) for n in ("paper", "released"))
    two_thirds = paper["r_rel"].sub(2 / 3).abs() < 1e-12
    assert two_thirds.any() and (paper.loc[two_thirds, "r_main"] == 1).all()
    assert paper.loc[two_thirds, "reward"].tolist() == pytest.approx([5 / 3] * int(two_thirds.sum()))
    assert released.loc[two_thirds, "reward"].tolist() == pytest.approx([2 / 3] * int(two_thirds.sum()))
    assert (released["reason"][two_thirds] == "easy, r_rel below threshold: r_rel").all()
    assert released["reward"].apply(lambda r: any(abs(r - v) < 1e-12 for v in (-0.2, 0, 1 / 3, 2 / 3, 1, 2))).all()  # the release: r_rel or 1 + {0, 1}
