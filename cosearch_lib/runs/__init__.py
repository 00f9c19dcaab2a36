"""Runs: launching the workbook's jobs. The papermill runner and `cosearch run` (``papermill_runner``),
`cosearch train` and `cosearch evaluate` in this process or under torchrun (``launched_training``,
``launched_evaluation``), their SLURM jobs (``slurm_training``) and the grids of cells (``grid``).
Above ``records`` (what runs leave on disk, read back, and the generated docs), which it may import;
nothing below imports it.
"""
