"""Ranking modes: Eq. 7 (oracle) on hand-built candidate lists, retrieval-only, the cross-encoder's
ordering, and mode selection. The LLM ranker is tested with the rollout engine (scripted backend)."""

from __future__ import annotations

import pytest

from cosearch_lib.agent.rankers import (
    CrossEncoderRanker,
    OracleRanker,
    RankRequest,
    RetrievalOnlyRanker,
    make_ranker,
    oracle_order,
    top_k_order,
)
from cosearch_lib.data.passage import Passage


def _cands(pattern: str) -> list[Passage]:
    """'nrnr' -> four passages; 'r' ones contain the answer 'Kessmere'."""
    return [Passage(str(i), f'"P{i}"\n{"born in Kessmere" if c == "r" else "born in Drask"}') for i, c in enumerate(pattern)]


@pytest.mark.parametrize("pattern,k,expected", [
    ("nrnrnn", 3, [1, 3, 0]),  # D+ = {1, 3} first (retriever order), then the best non-relevant (0)
    ("rnnnnn", 3, [0, 1, 2]),  # D+ already on top: unchanged
    ("nnnnnr", 5, [5, 0, 1, 2, 3]),  # a relevant passage at rank N jumps to the top
    ("rrrrrr", 2, [0, 1]),  # |D+| > K: the first K relevant ones
    ("nnnnnn", 3, [0, 1, 2]),  # D+ empty: retriever top-K unchanged
    ("nr", 5, [1, 0]),  # fewer candidates than K
])
def test_oracle_is_paper_eq7(pattern, k, expected):
    assert oracle_order(_cands(pattern), ["Kessmere"], k) == expected


def test_oracle_ignores_trivial_answers_and_matches_tokens_not_substrings():
    cands = [Passage("0", '"A"\nno, he was not'), Passage("1", '"B"\nKessmereville is a town'), Passage("2", '"C"\nyes')]
    assert oracle_order(cands, ["no"], 2) == [0, 1]  # yes/no are never 'contained'
    assert oracle_order(cands, ["Kessmere"], 2) == [0, 1]  # 'Kessmereville' does not contain the token 'Kessmere'


def test_batched_modes_return_one_ranking_per_request():
    reqs = [RankRequest("q0", "sq", _cands("nnr"), k=2, golds=["Kessmere"]), RankRequest("q0", "sq2", _cands("rn"), k=2, golds=["Kessmere"])]
    assert [r.order for r in RetrievalOnlyRanker().rank(reqs)] == [[0, 1], [0, 1]]
    oracle = OracleRanker().rank(reqs)
    assert [r.order for r in oracle] == [[2, 0], [0, 1]] and all(r.valid for r in oracle)
    assert [p.id for p in oracle[0].shown(reqs[0].candidates)] == ["2", "0"]
    assert top_k_order(3, 5) == [0, 1, 2]


class _KeywordModel:
    """A stand-in sequence classifier: logit = number of query words found in the passage."""

    def __init__(self, tokenizer):
        import torch

        self.tokenizer, self.torch = tokenizer, torch
        self._p = torch.nn.Parameter(torch.zeros(1))

    def eval(self):
        return self

    def parameters(self):
        return iter([self._p])

    def __call__(self, input_ids, **kw):
        from types import SimpleNamespace

        texts = self.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
        scores = [sum(w in t.split(" [SEP] ")[-1].split() for w in ("harbour", "city")) for t in texts]
        return SimpleNamespace(logits=self.torch.tensor(scores, dtype=self.torch.float32)[:, None])


class _SepTokenizer:
    """Pairs joined with a visible separator, so the stand-in model can tell query from passage."""

    def __call__(self, queries, passages, **kw):
        import torch

        texts = [f"{q} [SEP] {p}" for q, p in zip(queries, passages)]
        self._texts = texts
        ids = torch.arange(len(texts))[:, None]
        return _Batch(input_ids=ids)

    def batch_decode(self, ids, skip_special_tokens=True):
        return [self._texts[int(i)] for i in ids[:, 0]]


class _Batch(dict):
    def to(self, device):
        return self


def test_cross_encoder_orders_by_pair_score():
    tok = _SepTokenizer()
    ranker = CrossEncoderRanker(_KeywordModel(tok), tok, batch_size=2)
    cands = [Passage("0", "nothing here"), Passage("1", "a harbour city"), Passage("2", "a city"), Passage("3", "harbour")]
    (ranking,) = ranker.rank([RankRequest("q0", "harbour city", cands, k=3)])
    assert ranking.order == [1, 2, 3]  # ties broken by retriever order


def test_make_ranker_modes():
    assert make_ranker("retrieval").mode == "retrieval" and make_ranker("oracle").mode == "oracle"
    with pytest.raises(ValueError, match="ranking mode"):
        make_ranker("listwise-magic")
