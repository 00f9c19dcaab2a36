"""The cross-encoder ranker of Table 3's ablation: Plackett-Luce rankings, their GRPO update, the
listwise warm start, and the trainer running CoSearch with it in place of the generative ranker."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from cosearch_lib.agent.rankers import RankRequest, ScorerPolicyRanker, make_ranker
from cosearch_lib.config import ConfigError, GRPOConfig, TrainConfig, load_profile
from cosearch_lib.data.passage import Passage
from cosearch_lib.experiment import trained_eval_settings
from cosearch_lib.models.cross_encoder import CrossEncoderScorer, plackett_luce_logprobs, sample_ranking
from cosearch_lib.models.registry import resolve_model
from cosearch_lib.rl.grpo_loss import policy_loss
from cosearch_lib.rl.scorer_policy import (
    RelevanceList,
    listwise_loss,
    scorer_update,
    warm_start_cross_encoder,
)
from cosearch_lib.run_schema import describe_step_metric, latest_checkpoint

from tests import doubles


@pytest.fixture(scope="module")
def bert_tok():
    return AutoTokenizer.from_pretrained(resolve_model("all-minilm-l6-v2").path)


def tiny_scorer(tok, seed: int = 0) -> CrossEncoderScorer:
    torch.manual_seed(seed)
    encoder = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=128))
    scorer = CrossEncoderScorer(encoder, tok, max_length=64, source="tiny")
    torch.nn.init.normal_(scorer.head.weight, std=0.5)  # not at zero: the rankings below must differ
    return scorer.eval()


def test_plackett_luce_log_probs_are_a_distribution_over_rankings_and_match_the_formula():
    scores = torch.tensor([0.3, -1.0, 2.0, 0.5])
    for temperature in (1.0, 0.5):
        total = sum(math.exp(float(plackett_luce_logprobs(scores, list(order), temperature).sum()))
                    for order in itertools.permutations(range(4), 2))
        assert total == pytest.approx(1.0, abs=1e-6)
    lp = plackett_luce_logprobs(scores, [2, 0], 1.0)
    e = scores.exp()
    assert float(lp[0]) == pytest.approx(math.log(e[2] / e.sum()), abs=1e-6)
    assert float(lp[1]) == pytest.approx(math.log(e[0] / (e.sum() - e[2])), abs=1e-6)
    with pytest.raises(ValueError, match="temperature > 0"):
        plackett_luce_logprobs(scores, [0], 0.0)


def test_gumbel_top_k_samples_follow_the_plackett_luce_probabilities_and_greedy_takes_the_best():
    scores = torch.tensor([1.0, 0.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    draws = [tuple(sample_ranking(scores, 2, 1.0, gen)) for _ in range(6000)]
    for order in itertools.permutations(range(3), 2):
        expected = math.exp(float(plackett_luce_logprobs(scores, list(order), 1.0).sum()))
        assert draws.count(order) / len(draws) == pytest.approx(expected, abs=0.025)
    assert sample_ranking(torch.tensor([0.0, 2.0, 2.0, 1.0]), 3, 0.0, None) == [1, 2, 3]  # ties by index
    assert sample_ranking(scores, 5, 0.0, None) == [0, 1, 2]  # K capped at N


def request(key: tuple, k: int = 2) -> RankRequest:
    cands = [Passage(str(i), f"passage {i} about {'harbours' if i % 2 else 'mills'} and towns") for i in range(6)]
    return RankRequest("q0", "which town has a harbour", cands, k=k, row_key=key)


def test_the_scorer_policy_samples_by_row_key_and_records_what_its_update_needs(bert_tok):
    scorer = tiny_scorer(bert_tok)
    ranker = make_ranker("scorer_policy", scorer=scorer, temperature=1.0, seed=3)
    keys = [(0, "q1", s, 0) for s in range(8)]
    first = ranker.rank([request(k) for k in keys])
    again = ranker.rank([request(k) for k in reversed(keys)])[::-1]
    assert [r.order for r in first] == [r.order for r in again]  # depends on the key, not the batch
    assert len({tuple(r.order) for r in first}) > 1  # different keys, different samples
    r = first[0]
    with torch.no_grad():
        scores = scorer.scores("which town has a harbour", r.candidate_texts)
    assert r.valid and r.output_ids == r.order and len(r.candidate_texts) == 6
    assert r.output_logprobs == pytest.approx(plackett_luce_logprobs(scores, r.order, 1.0).tolist(), abs=1e-5)
    greedy = ScorerPolicyRanker(scorer, temperature=0.0).rank([request(keys[0], k=3)])[0]
    assert greedy.order == sorted(range(6), key=lambda i: (-float(scores[i]), i))[:3]


def test_a_saved_scorer_loads_with_the_same_scores_and_a_folder_without_one_is_refused(bert_tok, tmp_path):
    scorer = tiny_scorer(bert_tok)
    texts = ["a harbour town", "a mill"]
    scorer.save(tmp_path / "ce", notes={"warm_start": {"trained": False}})
    assert json.loads((tmp_path / "ce" / "cross_encoder.json").read_text())["warm_start"] == {"trained": False}
    loaded = CrossEncoderScorer.load(tmp_path / "ce").eval()
    with torch.no_grad():
        assert torch.allclose(scorer.scores("harbour", texts), loaded.scores("harbour", texts), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="not a saved cross-encoder"):
        CrossEncoderScorer.load(tmp_path)


class _Call:
    def __init__(self, ranking, sub_query="which town has a harbour"):
        self.sub_query, self.order, self.candidate_texts = sub_query, ranking.order, ranking.candidate_texts
        self.output_logprobs = ranking.output_logprobs


def test_the_grpo_update_makes_a_rewarded_ranking_likelier_and_a_punished_one_rarer(bert_tok):
    scorer = tiny_scorer(bert_tok)
    ranker = ScorerPolicyRanker(scorer, temperature=1.0)
    good, bad = (_Call(r) for r in ranker.rank([request((0, "q", 0, 0)), request((0, "q", 5, 0))]))
    assert good.order != bad.order

    def logp(call):
        with torch.no_grad():
            return float(plackett_luce_logprobs(scorer.scores(call.sub_query, call.candidate_texts), call.order, 1.0).sum())

    before = logp(good), logp(bad)
    optimizer = torch.optim.SGD(scorer.parameters(), lr=0.5)
    stats = scorer_update(scorer, optimizer, [good, bad], [1.0, -1.0], GRPOConfig(), temperature=1.0, max_grad_norm=1.0)
    assert stats["ranker_logp_drift_mean"] < 1e-5  # the recorded log-probs are the policy's own
    assert stats["ranker_n_forwarded"] == 2 and stats["ranker_n_tokens"] == 4 and stats["grad_norm"] > 0
    assert logp(good) > before[0] and logp(bad) < before[1]
    with pytest.raises(ValueError, match="no candidate_texts"):
        scorer_update(scorer, optimizer, [replace_texts(good)], [1.0], GRPOConfig(), temperature=1.0, max_grad_norm=1.0)


def test_calls_that_ranked_the_same_list_are_scored_once_with_the_gradient_of_one_call_at_a_time(bert_tok, monkeypatch):
    """The judge's update scores a list once for every call that ranked it (the G rollouts often
    issue the same first sub-query): fewer forwards, the same gradient as scoring each call apart."""
    import copy

    scorer = tiny_scorer(bert_tok)
    ranker = ScorerPolicyRanker(scorer, temperature=1.0)
    a1, a2, a3 = (_Call(r) for r in ranker.rank([request((0, "q", g, 0)) for g in range(3)]))
    (b1,) = (_Call(r, sub_query="which river crosses the town") for r in ranker.rank([request((0, "q2", 0, 0))]))
    calls, advantages = [a1, a2, a3, b1], [1.0, -0.5, 0.0, 0.7]  # a3: no advantage, not trained

    def gradient(update_calls):
        model = copy.deepcopy(scorer)
        seen = []
        real = model.scores
        monkeypatch.setattr(model, "scores", lambda q, texts: seen.append(q) or real(q, texts))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradient is kept, the weights not moved
        monkeypatch.setattr(optimizer, "zero_grad", lambda set_to_none=True: None)
        stats = update_calls(model, optimizer)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return seen, grads, stats

    seen, shared, stats = gradient(lambda m, o: scorer_update(m, o, calls, advantages, GRPOConfig(), temperature=1.0,
                                                                     max_grad_norm=0.0))
    assert seen == [a1.sub_query, b1.sub_query] and stats["ranker_n_forwarded"] == 3

    def apart(m, o):  # one call at a time, weighted as in one update over all four
        denom = float(sum(len(c.order) for c in calls))
        for c, adv in zip(calls, advantages):
            if adv:
                lp = plackett_luce_logprobs(m.scores(c.sub_query, c.candidate_texts), c.order, 1.0).unsqueeze(0)
                loss, _ = policy_loss(lp, torch.tensor([c.output_logprobs]), torch.tensor([adv]), torch.ones_like(lp),
                                      GRPOConfig())
                (loss * (len(c.order) / denom)).backward()
        return {}

    seen_apart, separate, _ = gradient(apart)
    assert len(seen_apart) == 3 and shared.keys() == separate.keys() and shared
    for name in shared:
        torch.testing.assert_close(shared[name], separate[name], rtol=1e-4, atol=1e-7)


def replace_texts(call):
    call.candidate_texts = []
    return call


def test_the_listwise_warm_start_teaches_the_scorer_which_passages_hold_answers(bert_tok):
    scorer = tiny_scorer(bert_tok, seed=1)
    lists = [RelevanceList(f"where is place {i}", [f"place {i} lies in kessmere", "an unrelated mill", "bells ring",
                                                   f"town {i} by the sea"], [1, 0, 0, 0]) for i in range(6)]
    lists.append(RelevanceList("nothing relevant", ["a", "b"], [0, 0]))  # teaches nothing: skipped

    def loss():
        with torch.no_grad():
            return sum(float(listwise_loss(scorer.scores(x.query, x.texts), x.relevant)) for x in lists[:6]) / 6

    start = loss()
    stats = warm_start_cross_encoder(scorer, lists, lr=3e-3, head_lr=3e-3, epochs=4, seed=0, progress=False)
    assert stats["lists"] == 7 and stats["trained_lists"] == 6 and len(stats["losses"]) == 4
    assert loss() < 0.5 * start


def test_the_ranker_kind_setting_replaces_the_ranker_adapter_and_is_checked():
    cfg = TrainConfig(method="cosearch", ranker_kind="cross_encoder")
    assert cfg.roles() == {"agent": "agent", "ranker": None} and cfg.trainable() == {"agent"} and cfg.uses_scoring_ranker
    assert not TrainConfig(method="search_r1", ranker_kind="cross_encoder").uses_scoring_ranker
    with pytest.raises(ValueError, match="ranker_kind must be one of"):
        TrainConfig(ranker_kind="bm25")
    with pytest.raises(ValueError, match="shared backbone"):
        TrainConfig(ranker_kind="cross_encoder", shared_backbone=True)
    with pytest.raises(ConfigError, match="warm_start_epochs"):
        load_profile("ci", training={"cross_encoder": {"warm_start_epochs": -1}})
    fields = trained_eval_settings("cosearch", {"agent": "a", "scorer": "c"}, {})
    assert fields["methods"] == ("agent_scorer",) and fields["scorer_model"] == "c"


def test_cosearch_trains_the_cross_encoder_with_grpo_and_resumes_it_from_a_checkpoint(tok, bert_tok, tmp_path):
    with pytest.raises(ValueError, match="needs a scoring ranker"):
        doubles.trainer(tok, doubles.tiny_model(tok), tmp_path / "none", ranker_kind="cross_encoder")

    def built(out):
        return doubles.trainer(tok, doubles.tiny_model(tok), out, steps=2, ranker_kind="cross_encoder",
                               scorer=tiny_scorer(bert_tok))

    full = built(tmp_path / "full")
    start = [p.detach().clone() for p in full.scorer.parameters()]
    full.run()
    moved = [not torch.equal(a, p) for a, p in zip(start, full.scorer.parameters())]
    assert any(moved), "GRPO left the cross-encoder where it started: the resume check below would prove nothing"
    assert full.step == 2 and "loss/scorer_grad_norm" in full.frame()
    assert full.frame()["loss/ranker_n_forwarded"].sum() > 0  # the cross-encoder got gradient
    assert all(describe_step_metric(c) for c in full.frame().columns)  # every column documented
    ckpt = latest_checkpoint(tmp_path / "full")
    assert (ckpt / "adapters" / "scorer" / "cross_encoder.json").exists()
    assert not (ckpt / "adapters" / "ranker").exists()  # no LLM ranker adapter in this run
    half = built(tmp_path / "half")
    half.run(1)
    resumed = built(tmp_path / "half")
    resumed.load_checkpoint()
    resumed.run()
    cols = ["rollout/agent_reward", "ranker/hit@K", "ranker/reward_pre", "loss/ranker_loss"]
    assert resumed.frame()[cols].equals(full.frame()[cols])
    for a, b in zip(resumed.scorer.parameters(), full.scorer.parameters()):
        assert torch.equal(a, b)


def test_replace_keeps_train_config_valid():  # dataclasses.replace re-runs the checks
    with pytest.raises(ValueError, match="shared backbone"):
        replace(TrainConfig(ranker_kind="cross_encoder"), shared_backbone=True)


def test_a_saved_scoring_ranker_given_as_the_fixed_ranker_ranks_greedily_in_agent_fixed_ranker(bert_tok, tmp_path):
    """Notebook 02's agent_fixed_ranker is the Fixed Ranker notebook 03 trains against: with a scoring
    ranker kind (the LLM judge) policy_adapters gives that ranker's folder, and the harness loads it
    as a greedy scoring policy rather than prompting the generative ranker."""
    from cosearch_lib.eval.harness import HarnessConfig, _agent_ranker_factory

    tiny_scorer(bert_tok).save(tmp_path / "judge", notes={"warm_start": {"trained": False}})
    ranker = _agent_ranker_factory("agent_fixed_ranker")(None, HarnessConfig(fixed_ranker_adapter=str(tmp_path / "judge")), [])
    assert isinstance(ranker, ScorerPolicyRanker) and ranker.temperature == 0.0
    with torch.no_grad():
        expected = torch.argsort(tiny_scorer(bert_tok).scores("harbour", ["a mill", "a harbour town", "a field"]), descending=True)
        got = torch.argsort(ranker.scorer.scores("harbour", ["a mill", "a harbour town", "a field"]), descending=True)
    assert got.tolist() == expected.tolist()
