"""Records: what runs leave on disk and what reads it back.

Provenance of every run (``provenance``), readers of training runs (``training_runs``) and of a
grid's cells (``grid_cells``), the comparison of two runs' tables (``compare``) and the generated
pages of ``docs/`` (``docs``). With ``viz``, below the launchers (``runs``): it may import every
layer below, never ``runs``.
"""
