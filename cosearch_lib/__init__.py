"""cosearch_lib: the helper library behind the CoSearch research workbook.

Notebooks under ``notebooks/`` tell the story; this package does the work. Its subpackages
follow the method's data flow, lowest layer first (docs/ARCHITECTURE.md; import-linter checks the
order in CI): ``config`` (every setting; imports no torch), ``world`` and ``data``, ``models``,
``retrieval``, ``agent``, ``eval``, ``rl``, ``experiment`` (the wiring), ``records`` and ``viz``,
``runs`` (the launchers), ``report``, ``cli``. Optional GPU packages (vLLM, Unsloth, CUDA FAISS) and optional loggers are imported inside
the functions that need them, behind an error that names the extra to install.
"""

__version__ = "0.1.0"
