"""The in-process retriever: encoder + FAISS index + corpus store, behind ``search(queries, topn)``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from cosearch_lib.data.passage import Passage


@runtime_checkable
class SearchBackend(Protocol):
    """Anything with ``search(queries, topn) -> one ranked list of Passages per query``: the top-N
    candidates of the method (N, not the K passages a ranker then shows)."""

    def search(self, queries: list[str], topn: int) -> list[list[Passage]]: ...


class Retriever:
    """Dense first-stage retriever. Row i of the index is row i of the corpus (Search-R1's layout)."""

    def __init__(self, encoder, index, corpus):
        if index.ntotal != len(corpus):
            raise ValueError(
                f"index holds {index.ntotal} vectors but the corpus has {len(corpus)} rows: "
                "they must be built from the same corpus file"
            )
        self.encoder, self.index, self.corpus = encoder, index, corpus

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, queries: list[str], topn: int) -> list[list[Passage]]:
        """Top-``topn`` passages per query, best first, with inner-product scores."""
        if isinstance(queries, str):
            raise TypeError("search() takes a list of query strings, not one string")
        if not isinstance(topn, int) or isinstance(topn, bool) or topn < 1:
            raise ValueError(f"topn must be a positive int, got {topn!r}")
        if not queries:
            return []
        k = min(topn, len(self.corpus))
        scores, rows = self.index.search(self.encoder.encode_queries(list(queries)), k)  # (Q, k) each
        return [self._passages(r, s) for r, s in zip(rows, scores)]

    def _passages(self, rows: np.ndarray, scores: np.ndarray) -> list[Passage]:
        keep = rows >= 0  # FAISS pads with -1 when fewer than k results exist (HNSW)
        return self.corpus.rows(rows[keep].tolist(), scores=scores[keep].tolist())
