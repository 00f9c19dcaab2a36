"""Ranker-quality comparisons on held-out sub-queries: the pairs compared and how the verdicts count."""

from __future__ import annotations

import pandas as pd

from cosearch_lib.eval.intervals import verdicts
from cosearch_lib.records.ranker_quality import RELEVANCE_TRAINED, RETRIEVER_ORDER, WARM_START, quality_comparisons


def test_quality_comparisons_pair_every_ranker_with_the_retriever_and_count_sub_queries():
    items = [(f"q{i}", family) for i, family in enumerate(["syn_nq", "syn_nq", "syn_hotpotqa", "syn_hotpotqa"])]
    hits = {RETRIEVER_ORDER: [1, 0, 1, 0], WARM_START: [1, 0, 0, 0], RELEVANCE_TRAINED: [1, 1, 1, 0]}
    records = pd.DataFrame([{"method": m, "question_id": q, "dataset": d, "hit@1": float(h)}
                            for m, row in hits.items() for (q, d), h in zip(items, row)])
    table = quality_comparisons(records, seed=0)
    assert list(zip(table["a"], table["b"])) == [(WARM_START, RETRIEVER_ORDER), (RELEVANCE_TRAINED, RETRIEVER_ORDER),
                                                 (RELEVANCE_TRAINED, WARM_START)]
    assert table["diff"].round(3).tolist() == [-0.25, 0.25, 0.5]
    lines = verdicts(table)  # "... = +0.250 mean hit@1 (95% CI +0.000 to +0.500, 4 sub-queries): ..."
    assert len(lines) == 3 and all(", 4 sub-queries):" in line and "questions" not in line for line in lines)
