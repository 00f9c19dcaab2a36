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


def test_relevance_curves_per_k_beside_the_retriever_and_none_without_held_out_rows():
    """Notebook 03's relevance-training figure: one Hit@k panel per k from the run's ranker
    validation rows, the retriever's order on the same items as the reference level; a run validated
    on no item (relevance.val_per_dataset: 0) has no curve, and says why instead of a KeyError."""
    import pytest

    from cosearch_lib.records.ranker_quality import relevance_curves

    rows = [{"method": "relevance", "kind": "ranker", "step": step, "dataset": "nq", "question_id": f"q{i}/hop0",
             "hit@1": float(step == 0 or i == 0), "hit@K": 1.0} for step in (-1, 0) for i in range(2)]
    retriever = [{"hit@1": 0.0, "hit@5": 1.0}, {"hit@1": 1.0, "hit@5": 1.0}]  # written before hit@5 was named hit@K
    panels, refs = relevance_curves(pd.DataFrame(rows), retriever)
    assert list(panels) == ["held-out Hit@1", "held-out Hit@K"]
    assert panels["held-out Hit@1"]["estimate"].tolist() == [0.5, 1.0]  # before the first update, after it
    assert refs == {"held-out Hit@1": {RETRIEVER_ORDER: 0.5}, "held-out Hit@K": {RETRIEVER_ORDER: 1.0}}
    for empty in (pd.DataFrame(), pd.DataFrame(rows).assign(kind="agent")):
        with pytest.raises(ValueError, match="val_per_dataset: 0"):
            relevance_curves(empty, retriever)
