"""Dense first-stage retrieval: encoder, FAISS index, corpus store, in-process and HTTP retrievers.

Everything here satisfies one contract, ``search(queries, topn) -> list[list[Passage]]``.
Submodules are imported on use; this package's import pulls in nothing heavy.
"""
