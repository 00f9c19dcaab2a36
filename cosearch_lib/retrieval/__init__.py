"""Dense first-stage retrieval: encoder, FAISS index, corpus store, in-process and HTTP retrievers.

Everything here satisfies one contract, ``search(queries, topk) -> list[list[Passage]]``.
Submodules are imported on use; this package's import pulls in nothing heavy.
"""

from .base import Passage, SearchBackend, make_contents, split_contents

__all__ = ["Passage", "SearchBackend", "make_contents", "split_contents"]
