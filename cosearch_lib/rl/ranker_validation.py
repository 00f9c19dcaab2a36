"""Ranker validation: Hit@k of a method's ranking on a fixed set of held-out sub-queries.

The agent's validation (``val_f1``) scores the whole search loop; this scores the ranking alone,
on the same sub-queries at every validation, so that its curve over training steps compares like
with like across methods (notebook 03: CoSearch against the Fixed Ranker and Retrieval-Only at the
same budget). Each held-out sub-query gets the retriever's top-N, the method's ranking picks the K
passages the agent would read, and Hit@1/3/5 of that list is measured against ``has_answer``
labels, as the rollout labels a search call (``agent.rollout``).

Sub-queries (:func:`gold_sub_queries`) come from the validation questions (dev split); the
ranker's relevance training (``rl.relevance_training``) builds its prompts the same way from the
training split:

* a question of the embedded world carries its reasoning chain (``extra_info.gold_chain``, the
  source the warm start builds its gold searches from, :func:`data.qa_formats.gold_chain`): every
  hop gives one sub-query, the hop's gold sub-query, and a candidate is relevant when it contains
  the *hop's* answer (what that sub-query asks for; the last hop's answer is the question's);
* a question without a chain (real benchmarks) gives one sub-query, the question text itself,
  relevant when a candidate contains one of the question's gold answers.

Hops and questions whose answers are all trivial (yes / no / true / false) are left out: such words
occur in almost any passage, so they label nothing (``metrics.is_trivial_answer``), as in the
retriever's hop-recall table (``eval.retriever_recall.gold_hop_ranks``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosearch_lib.agent.rankers import Ranker, RankRequest
from cosearch_lib.data.qa_formats import QAExample, gold_chain
from cosearch_lib.metrics import has_answer, is_trivial_answer, shown_hits
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.run_schema import hit_names


def ranker_validation_columns(hits: Sequence[str]) -> list[str]:
    """The step-record columns :meth:`RankerValidationSet.score` fills for the Hit columns ``hits``
    (``run_schema.hit_names``), documented in run_schema.STEP_GLOSSARY."""
    return [*(f"val_ranker_{h}" for h in hits), "val_ranker_valid_rate"]


@dataclass(frozen=True)
class GoldSubQuery:
    """One sub-query the ranker ranks for: validated on (dev split) or relevance-trained on (train split)."""

    question_id: str
    hop: int  # 0-based hop of the question's gold chain; -1 when the question text stands in
    question: str  # the original question (the ranker prompt shows it)
    sub_query: str  # what the retriever and the ranker see as the search query
    answers: tuple[str, ...]  # a candidate is relevant when it contains one of these (has_answer)
    dataset: str = ""  # the question's family (data_source): paired intervals resample within it

    @property
    def item_id(self) -> str:
        """``<question_id>/hop<h>`` (``/question`` when the question text stands in): one row of the
        per-item validation records, the same at every validation."""
        return f"{self.question_id}/{'question' if self.hop < 0 else f'hop{self.hop}'}"


def gold_sub_queries(questions: Sequence[QAExample]) -> list[GoldSubQuery]:
    """The sub-queries of ``questions``, in question then hop order (see the module doc)."""
    out = []
    for ex in questions:
        chain = gold_chain(ex)
        if chain:
            out.extend(GoldSubQuery(ex.id, h, ex.question, hop["sub_query"], (hop["answer"],), ex.data_source)
                       for h, hop in enumerate(chain) if not is_trivial_answer(hop["answer"]))
        elif not all(is_trivial_answer(a) for a in ex.golden_answers):
            out.append(GoldSubQuery(ex.id, -1, ex.question, ex.question, tuple(ex.golden_answers), ex.data_source))
    return out


class RankerValidationSet:
    """A trainer's held-out sub-queries and their retriever top-N, fetched once (at the first
    :meth:`score`): the corpus does not change during training, so every validation ranks the
    same candidates and only the ranking can move the numbers."""

    def __init__(self, sub_queries: Sequence[GoldSubQuery], retriever: SearchBackend, *, topn: int,
                 topk: int, hit_ks: Sequence[int] = (1, 3, 5)) -> None:
        self.sub_queries, self.retriever, self.topn, self.topk = list(sub_queries), retriever, topn, topk
        self.hit_ks = tuple(hit_ks)  # the reward's cutoffs (training.ranker_reward.hit_ks); those >= K give hit@K
        self.hits = hit_names(self.hit_ks, topk)  # the Hit columns: ["hit@1", "hit@K"] at K = 2
        self._candidates: list[list[Any]] | None = None

    def candidates(self) -> list[list[Any]]:
        """The retriever's top-N per sub-query, best first (one batched search, then cached)."""
        if self._candidates is None:
            found = self.retriever.search([s.sub_query for s in self.sub_queries], self.topn) if self.sub_queries else []
            self._candidates = [list(c) for c in found]
        return self._candidates

    def score_items(self, ranker: Ranker, positions: Sequence[int] | None = None) -> list[dict[str, Any]]:
        """One row per held-out sub-query: ``question_id`` (:attr:`GoldSubQuery.item_id`),
        ``dataset``, the :attr:`hits` columns (Hit@k of the passages ``ranker`` shows), and ``valid`` (the ranking followed
        the protocol; rule rankers: always). Pass a greedy ranker: a sampled one would make the curve
        noisy. These rows are what paired intervals between methods and steps resample.
        ``positions``: only those sub-queries, in that order (a data-parallel rank's share); None: all."""
        chosen = range(len(self.sub_queries)) if positions is None else positions
        if not chosen:
            return []
        everything = self.candidates()
        subs = [self.sub_queries[i] for i in chosen]
        requests = [RankRequest(q0=s.question, sub_query=s.sub_query, candidates=everything[i], k=self.topk,
                                golds=list(s.answers), row_key=("validation", s.question_id, 0, s.hop))
                    for i, s in zip(chosen, subs)]
        rankings = ranker.rank(requests)
        rows = []
        for s, request, ranking in zip(subs, requests, rankings):
            labels = [int(has_answer(p.contents, list(s.answers))) for p in request.candidates]
            shown = [labels[i] for i in ranking.order]
            rows.append({"question_id": s.item_id, "dataset": s.dataset,
                         **shown_hits(shown or [0], self.hit_ks, self.topk),  # nothing shown: no hit
                         "valid": float(ranking.valid)})
        return rows

    def score(self, ranker: Ranker) -> dict[str, float]:
        """``val_ranker_hit@<k>`` and ``val_ranker_hit@K`` (mean over the sub-queries of Hit@k of the
        passages ``ranker`` shows) and ``val_ranker_valid_rate`` (share of rankings that followed the protocol; rule
        rankings: 1). All NaN when there is no held-out sub-query."""
        return summarize_items(self.score_items(ranker), self.hits)


def summarize_items(rows: Sequence[dict[str, Any]], hits: Sequence[str]) -> dict[str, float]:
    """The ``val_ranker_*`` step-record columns from :meth:`RankerValidationSet.score_items` rows, for
    the Hit columns ``hits`` (:attr:`RankerValidationSet.hits`)."""
    if not rows:
        return dict.fromkeys(ranker_validation_columns(hits), math.nan)
    out = {f"val_ranker_{h}": float(np.mean([r[h] for r in rows])) for h in hits}
    out["val_ranker_valid_rate"] = float(np.mean([r["valid"] for r in rows]))
    return out
