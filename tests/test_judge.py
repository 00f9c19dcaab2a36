"""LLM-as-judge relevance (rl.judge): the verdict rule, labels of the shown passages from one greedy
batch of the base model, r_rel from them, and a training step that uses them."""

from __future__ import annotations

import types

import pytest

from cosearch_lib.config import RankerRewardConfig
from cosearch_lib.rl.judge import judge_calls, judge_messages, parse_verdict
from cosearch_lib.rl.rewards import relevance_reward

from tests.doubles import ScriptedBackend, tiny_model, trainer


@pytest.mark.parametrize("text, label", [("yes", 1), ("Yes.", 1), ("  YES, it does", 1), ("yes-ish", 1),
                                         ("no", 0), ("Yesterday", 0), ("I think yes", 0), ("", 0), ("[yes]", 1)])
def test_only_a_first_word_yes_counts(text, label):
    assert parse_verdict(text) == label


def call(order, texts, relevant=(0, 0, 0, 0), judged=None):
    return types.SimpleNamespace(traj_id="t0", turn=0, q0="Where was Tellis born?", sub_query="Tellis birthplace",
                                 order=list(order), shown_texts=list(texts), relevant=list(relevant), judged=judged)


def test_judge_labels_the_shown_passages_greedily_with_the_base_model(tok, chat):
    backend = ScriptedBackend(tok, lambda prompt, key: "yes" if "Kessmere" in tok.decode(prompt) else "no")
    a = call([2, 0], ["Tellis was born in Kessmere.", "Drask is a river town."])
    b = call([1], ["Kessmere lies north."])
    done = call([0], ["x"], judged=[1])
    empty = call([], [])
    assert judge_calls([a, b, done, empty], backend, chat) == 3  # one batch, the judged call left alone
    assert a.judged == [1, 0] and b.judged == [1] and done.judged == [1] and empty.judged == []
    (prompts, sampling, adapter, keys), = backend.calls
    assert sampling.temperature == 0.0 and adapter is None and len(prompts) == 3
    assert keys == [("judge", "t0", 0, 0), ("judge", "t0", 0, 1), ("judge", "t0", 0, 0)]
    assert "Search query: Tellis birthplace" in judge_messages("q", "Tellis birthplace", "p")[1]["content"]
    with pytest.raises(ValueError, match="shown texts"):
        judge_calls([call([0, 1], ["only one"])], backend, chat)


def test_r_rel_under_the_judge_is_mean_hit_of_its_labels_not_of_the_answer_strings():
    c = call([0, 1, 2], ["a", "b", "c"], relevant=(1, 1, 1, 0), judged=[0, 1, 0])
    cfg = RankerRewardConfig(relevance="judge")
    assert relevance_reward(c, cfg) == pytest.approx((0 + 1 + 1) / 3)  # Hit@1 0, Hit@3 1, Hit@5 1
    assert relevance_reward(c, RankerRewardConfig()) == 1.0  # the answer-string labels
    with pytest.raises(ValueError, match="judge"):
        relevance_reward(call([0], ["a"], relevant=(1,)), cfg)


def test_a_training_step_with_the_judge_rewards_the_ranker_from_its_labels(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", steps=1,
                ranker_reward=RankerRewardConfig(relevance="judge"))
    t.run()
    judge_batches = [c for c in t.backend.calls if c[3] and c[3][0][0] == "judge"]
    assert len(judge_batches) == 1 and judge_batches[0][2] is None  # the base model, no adapter
    calls = t.calls_frame()
    assert len(calls) and (calls["r_rel"] == 1.0).all()  # the judge's labels [1, 0, 0]: Hit@1 = Hit@3 = Hit@5 = 1
