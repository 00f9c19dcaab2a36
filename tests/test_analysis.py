"""Answer recall@k analysis on a scripted retriever whose answer positions are known."""

from __future__ import annotations

import numpy as np
import pytest

from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.benchmark_families import hop_group, mirrored_benchmark
from cosearch_lib.eval.retriever_recall import (
    first_relevant_ranks,
    gold_hop_ranks,
    headroom_sentence,
    ranker_headroom,
    recall_curve,
    recall_table,
)


class ScriptedRetriever:
    """Puts the gold answer at a chosen rank for each question (or nowhere)."""

    def __init__(self, answer_rank: dict[str, int | None]):
        self.answer_rank = answer_rank
        self.calls = 0

    def search(self, queries, topn):
        self.calls += 1
        out = []
        for q in queries:
            rank = self.answer_rank[q]
            out.append([Passage(str(i), f'"T{i}"\n{"Zorvath" if rank == i + 1 else "filler text"} here', 1.0 - i / 100)
                        for i in range(topn)])
        return out


def _ex(q, source, answers=("Zorvath",)):
    return QAExample(id=q, question=q, golden_answers=list(answers), data_source=source)


def test_ranks_curve_and_group_averages():
    plan = {"a": 1, "b": 3, "c": None, "d": 2, "e": 6}
    exs = [_ex("a", "syn_nq"), _ex("b", "syn_nq"), _ex("c", "syn_hotpotqa"), _ex("d", "syn_hotpotqa"),
           _ex("e", "syn_musique"), _ex("yn", "syn_2wiki", answers=("yes",))]
    retriever = ScriptedRetriever(plan)
    ranks = first_relevant_ranks(retriever, exs, topn=5, batch_size=2, progress=False)
    assert ranks.set_index("id")["first_hit_rank"].to_dict() == pytest.approx({"a": 1.0, "b": 3.0, "c": np.nan, "d": 2.0, "e": np.nan}, nan_ok=True)
    assert ranks.attrs["excluded_yes_no"] == {"syn_2wiki": 1}  # yes/no never counts as contained
    assert retriever.calls == 3  # 5 questions in batches of 2
    curve = recall_curve(ranks, [1, 3, 5]).set_index(["data_source", "k"])["recall"]
    assert curve[("syn_nq", 1)] == 0.5 and curve[("syn_nq", 3)] == 1.0
    assert curve[("syn_hotpotqa", 1)] == 0.0 and curve[("syn_hotpotqa", 3)] == 0.5
    assert curve[("syn_musique", 5)] == 0.0
    # group rows are macro averages over families, not over questions
    assert curve[("multi-hop avg", 3)] == pytest.approx((0.5 + 0.0) / 2)
    assert curve[("avg", 3)] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    table = recall_table(recall_curve(ranks, [1, 3, 5]), [1, 5])
    assert list(table.columns) == ["R@1", "R@5"]
    assert list(table.index) == ["syn_nq", "syn_hotpotqa", "syn_musique", "single-hop avg", "multi-hop avg", "avg"]
    # the headroom of a perfect ranking of the top 5 when the agent reads K: R@5 - R@K of the macro average
    head = ranker_headroom(recall_curve(ranks, [1, 3, 5]), 5, [1, 3])
    assert head.loc[1, "headroom"] == pytest.approx((1.0 + 0.5 + 0.0) / 3 - (0.5 + 0.0 + 0.0) / 3)
    assert head.loc[3, "headroom"] == pytest.approx(0.0)
    sentence = headroom_sentence(head, 1, 5)
    assert "K=1" in sentence and f"+{head.loc[1, 'headroom']:.2f}" in sentence and "K=3: +0.00" in sentence
    with pytest.raises(ValueError, match="no k = N"):
        ranker_headroom(recall_curve(ranks, [1, 3]), 5, [1])


def test_hop_groups_cover_paper_and_world_names():
    assert [hop_group(s) for s in ("nq", "syn_triviaqa", "popqa")] == ["single"] * 3
    assert [hop_group(s) for s in ("hotpotqa", "syn_2wiki", "2wikimultihopqa", "syn_musique", "bamboogle")] == ["multi"] * 5
    assert hop_group("my_custom_set") == "other" and mirrored_benchmark("syn_2wiki") == "2wikimultihopqa"


def test_gold_hop_ranks_use_each_hop_sub_query_and_answer():
    chain = [{"sub_query": "hop0", "answer": "Zorvath", "passage_ids": ["1"]},
             {"sub_query": "hop1", "answer": "Zorvath", "passage_ids": ["2"]},
             {"sub_query": "hop2", "answer": "no", "passage_ids": ["3"]}]  # yes/no hop: skipped
    ex = QAExample(id="q", question="unused", golden_answers=["x"], data_source="syn_musique",
                   extra={"extra_info": {"gold_chain": chain}})
    plain = _ex("plain", "nq")  # no chain: contributes nothing
    retriever = ScriptedRetriever({"hop0": 2, "hop1": None})
    hops = gold_hop_ranks(retriever, [ex, plain], topn=4, progress=False)
    assert list(hops["id"]) == ["q#0", "q#1"] and list(hops["hop"]) == [0, 1]
    assert hops["first_hit_rank"].iloc[0] == 2.0 and np.isnan(hops["first_hit_rank"].iloc[1])
    assert (hops["group"] == "multi").all()
