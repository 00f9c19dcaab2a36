"""cosearch_lib: the helper library behind the CoSearch research workbook.

Notebooks under ``notebooks/`` tell the story; this package does the work. Heavy
dependencies (torch, transformers, faiss, vLLM, Unsloth) are imported lazily inside the
functions that need them, so ``import cosearch_lib`` stays fast.
"""

__version__ = "0.1.0"
