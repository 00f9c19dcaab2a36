"""Records: what runs leave on disk and what reads it back.

The papermill runner (``papermill_runner``), provenance of every run (``provenance``), readers of
training runs (``training_runs``), the comparison of two runs' tables (``compare``) and the
generated pages of ``docs/`` (``docs``). Top layer with ``viz``: it may import every layer below.
"""
