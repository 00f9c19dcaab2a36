"""Launching a grid's cells (``records.grid_cells``: the grid file and its cells' status): one after
another in this process (:func:`run_grid`, skipping finished cells and resuming a killed one), or as
a SLURM array job, one task per cell, and a dependent aggregation job (:func:`submit_slurm`); and a
profile's notebooks run as a workbook (:func:`run_workbook`).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.atomic_io import atomic_path, write_json
from cosearch_lib.config import ConfigError, ProfileConfig, load_profile
from cosearch_lib.experiment.preflight import check_inputs
from cosearch_lib.paths import project_relative, project_root, run_dir, select_notebooks
from cosearch_lib.planning.job_plan import JobPlan, enforce, gpus_in_gres, plan_job
from cosearch_lib.records.grid_cells import Grid, GridCell, cell_status, load_grid, write_cell_profile
from cosearch_lib.runs.papermill_runner import check_parameter_names, notebook_parameters, run_profile
from cosearch_lib.runs.slurm_jobs import (
    SBATCH_PRELUDE,
    STOPPABLE_SH,
    run_sbatch,
    sbatch_header,
    sbatch_job_id,
)
from cosearch_lib.stop_signals import EXIT_STOPPED, pending_stop


def run_grid(base_profile: str | Path, grid: Grid, cells: Sequence[str | int] | None = None, *,
             runner: Callable[..., Any] = run_profile, progress: bool = True) -> pd.DataFrame:
    """Run the chosen cells (default: all) one after another. A ``done`` cell is skipped; a
    ``partial`` or ``failed`` one runs again with ``resume=True`` when its notebooks take that
    parameter (notebook 03 continues each method from its newest checkpoint). Returns one row per
    chosen cell: status before and after, wall seconds. A failing cell does not stop the others;
    its error is in the row and in its run record."""
    base = load_profile(base_profile)
    chosen = [grid.cell(c) for c in cells] if cells else list(grid.cells)
    rows = []
    for cell in chosen:
        if pending_stop() is not None:  # a stop signal ended the last cell: leave the rest for the resumed run
            break
        before = cell_status(base, grid, cell)
        row = {"cell": cell.name, "before": before, "after": before, "wall_s": 0.0, "error": None}
        if before == "done":
            rows.append(row)
            if progress:
                print(f"[cosearch grid] {grid.name}/{cell.name}: done, skipped", flush=True)
            continue
        profile_file = write_cell_profile(base_profile, grid, cell)
        params = cell_parameters(base, grid, cell)
        if before in ("partial", "failed"):
            params.setdefault("resume", True)
        params = _declared(params, grid.notebooks)
        if progress:
            print(f"[cosearch grid] {grid.name}/{cell.name} ({before}) -> {project_relative(profile_file.parent)}", flush=True)
        t0 = time.perf_counter()
        try:
            runner(str(profile_file), list(grid.notebooks), parameters=params, progress=progress)
        except Exception as err:  # noqa: BLE001 - one failed cell must not stop the grid
            row["error"] = f"{type(err).__name__}: {err}"[:500]
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        row["after"] = cell_status(base, grid, cell)
        rows.append(row)
    table = pd.DataFrame(rows, columns=["cell", "before", "after", "wall_s", "error"])
    write_json({"grid": grid.name, "profile": base.profile, "cells": table.to_dict(orient="records")},
               run_dir(f"{base.profile}/{grid.name}") / "grid.run.json")
    return table


def cell_parameters(base: ProfileConfig, grid: Grid, cell: GridCell) -> dict[str, Any]:
    """The notebook parameters a cell runs with: the grid file's, then the profile's cell budget
    (``grids.parameters``), then the cell's own; each later one wins."""
    return {**grid.parameters, **base.grids.parameters, **cell.parameters}


def run_workbook(profile: str | Path, notebooks: Sequence[str] | None = None, *, parameters: Mapping[str, Any] | None = None,
                 progress: bool = True, runner: Callable[..., Any] = run_profile, cell_timeout: float | None = None) -> list[Path]:
    """``cosearch run``: the selected notebooks (default: all) in order, and, right before the first
    of them that aggregates a grid the profile names in ``grids.run`` (notebook 04), the cells it
    names (finished ones skipped, :func:`run_grid`). A failed cell does not stop the notebooks: the
    aggregate notebooks list it as missing, with the command that runs it. ``cell_timeout``: seconds a
    notebook cell may run (``papermill_runner.run_notebook``); None: no limit."""
    limit = {"cell_timeout": cell_timeout} if cell_timeout else {}
    cfg = load_profile(profile)
    books = select_notebooks(list(notebooks) if notebooks else None)
    check_parameter_names(parameters or {}, {b: notebook_parameters(b) for b in books})
    check_inputs(cfg)  # before a grid cell or the warm start loads any model
    grids = [load_grid(name) for name in cfg.grids.run]
    for grid in grids:
        for name in cfg.grids.run[grid.name]:
            grid.cell(name)  # an unknown cell name fails before anything runs
    aggregating = {book for grid in grids for book in select_notebooks(list(grid.aggregate))} if grids else set()
    at = next((i for i, b in enumerate(books) if b in aggregating), None)
    if at is None:
        return runner(profile, [b.name[:2] for b in books], parameters=dict(parameters or {}), progress=progress, **limit)
    executed = runner(profile, [b.name[:2] for b in books[:at]], parameters=_known(parameters, books[:at]),
                      progress=progress, **limit) if at else []
    for grid in grids:
        if progress:
            print(f"[cosearch run] grid {grid.name!r}, cells {cfg.grids.run[grid.name]} (profile grids.run) ...", flush=True)
        run_grid(profile, grid, cfg.grids.run[grid.name], runner=runner, progress=progress)
    return executed + runner(profile, [b.name[:2] for b in books[at:]], parameters=_known(parameters, books[at:]),
                             progress=progress, **limit)


def _known(params: Mapping[str, Any] | None, books: Sequence[Path]) -> dict[str, Any]:
    """``params`` a part of the notebooks declares (``-p`` names are checked against all of them first)."""
    declared = _parameter_names(books)
    return {k: v for k, v in (params or {}).items() if k in declared}


def _declared(params: Mapping[str, Any], notebooks: Sequence[str]) -> dict[str, Any]:
    """``params`` without ``resume`` when no notebook of the grid declares it (run_profile refuses unknown names)."""
    declared = _parameter_names(select_notebooks(list(notebooks)))
    return {k: v for k, v in params.items() if k != "resume" or k in declared}


def _parameter_names(books: Sequence[Path]) -> set[str]:
    """The parameters any of ``books`` declares in its parameters cell."""
    return set().union(*(notebook_parameters(b) for b in books))


# --------------------------------------------------------------------------- SLURM


def cell_plan(base_profile: str | Path, grid: Grid) -> JobPlan:
    """The plan (``planning.job_plan``) of one grid cell as an array task runs it: the base profile's
    training of the grid's methods (notebook parameter ``methods``, default cosearch) for the cell
    budget's steps (``grids.parameters`` or the grid's ``steps``), on one node with ``slurm.gres``'s GPUs
    (none: one CPU rank). The cells' own settings (ablations) are planned as the base's."""
    cfg = load_profile(base_profile)
    params = {**grid.parameters, **cfg.grids.parameters}
    methods = tuple(m.strip() for m in str(params.get("methods", "cosearch")).split(",") if m.strip())
    return plan_job(cfg, nodes=1, gpus_per_node=gpus_in_gres(cfg.slurm.gres), methods=methods, steps=params.get("steps"))


def slurm_scripts(base_profile: str | Path, grid: Grid, plan: JobPlan | None = None) -> dict[str, str]:
    """The two job scripts: ``array`` (task i runs cell i with ``cosearch grid --cell i``, its own
    log) and ``aggregate`` (the grid's aggregate notebooks on the base profile). The resource lines
    come from the profile's ``slurm`` section and stand at the top, where a user edits them; the stop
    warning from the cell's plan (:func:`cell_plan`)."""
    cfg = load_profile(base_profile)
    plan = plan or cell_plan(base_profile, grid)
    folder = run_dir(f"{cfg.profile}/{grid.name}")
    logs = folder / "slurm"
    root = shlex.quote(str(project_root()))
    profile_arg = shlex.quote(str(base_profile))
    if grid.source is None:
        raise ConfigError(f"grid {grid.name!r} was not read from a file (load_grid): the SLURM jobs need one to read")
    grid_arg = shlex.quote(grid.source)
    array = sbatch_header(f"cosearch-{grid.name}", cfg, time_limit=cfg.slurm.time, gres=cfg.slurm.gres,
                           log=str(logs / "cell-%a-%A.log"))
    array += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if cfg.slurm.requeue else []  # a requeued task's log keeps its first run
    lead = round(plan.signal_lead_s)
    array += [f"#SBATCH --signal=B:USR1@{lead}"] if lead else []
    array += ["", SBATCH_PRELUDE.format(root=root),
              f"source {STOPPABLE_SH}  # run_stoppable: SIGUSR1/SIGTERM -> checkpoint, exit {EXIT_STOPPED}, requeue",
              'run_stoppable "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" '
              f"cosearch grid --profile {profile_arg} {grid_arg} --cell \"$SLURM_ARRAY_TASK_ID\" --quiet"]
    aggregate = sbatch_header(f"cosearch-{grid.name}-aggregate", cfg, time_limit=cfg.slurm.aggregate_time,
                               gres=cfg.slurm.gres, log=str(logs / "aggregate-%j.log"))
    aggregate += ["", SBATCH_PRELUDE.format(root=root), f"cosearch grid --profile {profile_arg} {grid_arg} --status",
                  f"cosearch run --profile {profile_arg} --notebooks {' '.join(grid.aggregate)} --quiet"
                  if grid.aggregate else "echo 'this grid names no aggregate notebooks'"]
    return {"array": "\n".join(array) + "\n", "aggregate": "\n".join(aggregate) + "\n"}


def submit_slurm(base_profile: str | Path, grid: Grid, *, sbatch: str = "sbatch", submit: bool = True, force: bool = False,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict[str, Any]:
    """Write ``array.sbatch`` and ``aggregate.sbatch`` under ``papermill_runs/<profile>/<grid>/slurm/``
    and (``submit``) submit the array, ``--array=0-<n-1>`` (``%<max_parallel>`` when set), then the
    aggregation job with ``--dependency=afterok:<array job>``: it starts only when every task ended
    well. Every cell's profile file is written first, so a bad cell fails here, not on the cluster.
    Returns the script paths, the sbatch commands and the job ids. First the cell's plan
    (:func:`cell_plan`): what cannot fit or finish is refused before anything is written
    (``planning.job_plan.PlanRefused``), unless ``force``."""
    cfg = load_profile(base_profile)
    plan = enforce(cell_plan(base_profile, grid), "cosearch grid --slurm", force=force)
    for cell in grid.cells:
        write_cell_profile(base_profile, grid, cell)
    if grid.aggregate:
        select_notebooks(list(grid.aggregate))  # a missing aggregate notebook fails before submitting
    folder = run_dir(f"{cfg.profile}/{grid.name}") / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, text in slurm_scripts(base_profile, grid, plan).items():
        paths[kind] = folder / f"{kind}.sbatch"
        with atomic_path(paths[kind]) as tmp:
            tmp.write_text(text)
        paths[kind].chmod(0o755)
    throttle = f"%{cfg.slurm.max_parallel}" if cfg.slurm.max_parallel else ""
    array_cmd = [sbatch, "--parsable", f"--array=0-{len(grid.cells) - 1}{throttle}", str(paths["array"])]
    out: dict[str, Any] = {"scripts": {k: project_relative(v) for k, v in paths.items()}, "array_cmd": array_cmd}
    if not submit:
        out["aggregate_cmd"] = [sbatch, "--parsable", "--dependency=afterok:<array job>", str(paths["aggregate"])]
        return out
    array_job = sbatch_job_id(run_sbatch(run, array_cmd))
    aggregate_cmd = [sbatch, "--parsable", f"--dependency=afterok:{array_job}", str(paths["aggregate"])]
    out.update(array_job=array_job, aggregate_cmd=aggregate_cmd, aggregate_job=sbatch_job_id(run_sbatch(run, aggregate_cmd)))
    write_json(out, folder / "submitted.json")
    return out
