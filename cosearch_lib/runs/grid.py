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
from cosearch_lib.records.grid_cells import Grid, GridCell, cell_dir, cell_status, load_grid, write_cell_profile
from cosearch_lib.runs.papermill_runner import check_parameter_names, notebook_parameters, run_profile
from cosearch_lib.runs.slurm_jobs import (
    RANK_ENVIRONMENT,
    RETRIEVER_WAIT_S,
    SBATCH_PRELUDE,
    STOPPABLE_SH,
    WAIT_FOR_SERVER,
    retriever_script,
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
        if rows and pending_stop() is not None:  # a stop signal ended the last cell: leave the rest for the resumed run
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


#: Nodes of ``slurm.gpus_per_node`` GPUs a grid cell may grow to (:func:`cell_plan`).
CELL_NODE_COUNTS = (1, 2, 4, 8)


def _cell_work(cfg: ProfileConfig, grid: Grid) -> tuple[tuple[str, ...], int | None, dict[str, Any]]:
    """A cell's methods, steps and notebook parameters: the grid's, under the profile's ``grids.parameters``."""
    params = {**grid.parameters, **cfg.grids.parameters}
    methods = tuple(m.strip() for m in str(params.get("methods", "cosearch")).split(",") if m.strip())
    return methods, params.get("steps"), params


def cell_plan(base_profile: str | Path, grid: Grid) -> JobPlan:
    """The plan (``planning.job_plan``) of one grid cell as an array task runs it: the base profile's
    training of the grid's methods (notebook parameter ``methods``, default cosearch) for the cell
    budget's steps (``grids.parameters`` or the grid's ``steps``), then their evaluation. First as one
    task with ``slurm.gres``'s GPUs (none: one CPU rank); when that cannot fit or finish and the
    profile names its cluster's ``slurm.gpus_per_node``, as a data-parallel job of 1, 2, 4 or 8 such
    nodes: the fewest the plan accepts, else the largest, with its refusals. The cells' own settings
    (ablations) are planned as the base's."""
    cfg = load_profile(base_profile)
    methods, steps, _ = _cell_work(cfg, grid)
    plan = plan_job(cfg, nodes=1, gpus_per_node=gpus_in_gres(cfg.slurm.gres), methods=methods, steps=steps)
    if not plan.refusals or not cfg.slurm.gpus_per_node:
        return plan
    for nodes in CELL_NODE_COUNTS:
        plan = plan_job(cfg, nodes=nodes, gpus_per_node=cfg.slurm.gpus_per_node, methods=methods, steps=steps)
        if not plan.refusals:
            break
    return plan


def slurm_scripts(base_profile: str | Path, grid: Grid, plan: JobPlan | None = None) -> dict[str, str]:
    """The job scripts: ``array`` (task i runs cell i, its own log) and ``aggregate`` (the grid's
    aggregate notebooks on the base profile); for cells of several ranks also ``retriever``, the
    retrieval server every cell's ranks search through. The resource lines come from the profile's
    ``slurm`` section and the cell's plan (:func:`cell_plan`: its shape and stop warning) and stand at
    the top, where a user edits them.

    A one-rank cell runs ``cosearch grid --cell i`` (notebook 03 in papermill). A cell of several
    ranks is the data-parallel job ``cosearch slurm train`` writes: the starts built in one task, then
    ``srun cosearch train`` and ``srun cosearch evaluate`` (notebook 03's evaluation, sharded) on the
    cell's own profile through the server, then ``cosearch grid --cell i``, whose notebook finds the
    training and the evaluation done and only reads them."""
    cfg = load_profile(base_profile)
    plan = plan or cell_plan(base_profile, grid)
    folder = run_dir(f"{cfg.profile}/{grid.name}")
    logs = folder / "slurm"
    root = shlex.quote(str(project_root()))
    profile_arg = shlex.quote(str(base_profile))
    if grid.source is None:
        raise ConfigError(f"grid {grid.name!r} was not read from a file (load_grid): the SLURM jobs need one to read")
    grid_arg = shlex.quote(grid.source)
    several = plan.ranks > 1
    gres = (f"gpu:{plan.gpus_per_node}" if plan.gpus_per_node else None) if several else cfg.slurm.gres
    array = sbatch_header(f"cosearch-{grid.name}", cfg, time_limit=cfg.slurm.time, gres=gres,
                          log=str(logs / "cell-%a-%A.log"))
    if several:
        array += [f"#SBATCH --nodes={plan.nodes}", f"#SBATCH --ntasks-per-node={plan.ranks // plan.nodes}"]
    array += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if cfg.slurm.requeue else []  # a requeued task's log keeps its first run
    lead = round(plan.signal_lead_s)
    array += [f"#SBATCH --signal=B:USR1@{lead}"] if lead else []
    task = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
    array += ["", SBATCH_PRELUDE.format(root=root),
              f"source {STOPPABLE_SH}  # run_stoppable: SIGUSR1/SIGTERM -> checkpoint, exit {EXIT_STOPPED}, requeue"]
    cell_cmd = f"cosearch grid --profile {profile_arg} {grid_arg} --cell \"$SLURM_ARRAY_TASK_ID\" --quiet"
    scripts = {}
    if several:
        methods, steps, params = _cell_work(cfg, grid)
        profiles = " ".join(shlex.quote(str(cell_dir(cfg, grid, c) / "profile.yaml")) for c in grid.cells)
        train = ["srun", "--kill-on-bad-exit=1", "cosearch", "train", "--profile", '"$CELL_PROFILE"', "--methods",
                 ",".join(methods), "--retriever-url", '"$RETRIEVER_URL"', "--resume", "--quiet"]
        train += ["--steps", str(steps)] if steps else []
        evaluate = ["srun", "--kill-on-bad-exit=1", "cosearch", "evaluate", "--profile", '"$CELL_PROFILE"', "--notebooks", "03",
                    "--methods", ",".join(methods), "--retriever-url", '"$RETRIEVER_URL"', "--quiet"]
        evaluate += ["--no-ceiling"] if params.get("evaluate_ceiling") is False else []
        array += [": \"${COSEARCH_RETRIEVER_JOB:?submit with cosearch grid --slurm, or export COSEARCH_RETRIEVER_JOB}\"",
                  f"CELL_PROFILES=({profiles})", 'CELL_PROFILE="${CELL_PROFILES[$SLURM_ARRAY_TASK_ID]}"',
                  "# what every rank reads from the cache, built once, in one task (world, index, warm start, Fixed Ranker)",
                  'srun --nodes=1 --ntasks=1 cosearch warm-start --profile "$CELL_PROFILE" --quiet',
                  *RANK_ENVIRONMENT,
                  WAIT_FOR_SERVER.format(url_dir=shlex.quote(str(logs)), wait_s=RETRIEVER_WAIT_S),
                  f"run_stoppable {task} {' '.join(train)}",
                  "# notebook 03's evaluation of the cell, sharded over the same ranks, in parts that resume",
                  f"run_stoppable {task} {' '.join(evaluate)}",
                  "# notebook 03 on one process: it finds the training and the evaluation done and reads them",
                  f'COSEARCH_RETRIEVER_URL="$RETRIEVER_URL" run_stoppable {task} {cell_cmd}']
        scripts["retriever"] = "\n".join(retriever_script(cfg, profile_arg, logs, root)) + "\n"
    else:
        array += [f"run_stoppable {task} {cell_cmd}"]
    aggregate = sbatch_header(f"cosearch-{grid.name}-aggregate", cfg, time_limit=cfg.slurm.aggregate_time,
                              gres=cfg.slurm.gres, log=str(logs / "aggregate-%j.log"))
    aggregate += ["", SBATCH_PRELUDE.format(root=root), f"cosearch grid --profile {profile_arg} {grid_arg} --status",
                  f"cosearch run --profile {profile_arg} --notebooks {' '.join(grid.aggregate)} --quiet"
                  if grid.aggregate else "echo 'this grid names no aggregate notebooks'"]
    return {"array": "\n".join(array) + "\n", "aggregate": "\n".join(aggregate) + "\n", **scripts}


def submit_slurm(base_profile: str | Path, grid: Grid, *, sbatch: str = "sbatch", submit: bool = True, force: bool = False,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict[str, Any]:
    """Write ``array.sbatch`` and ``aggregate.sbatch`` under ``papermill_runs/<profile>/<grid>/slurm/``
    and (``submit``) submit the array, ``--array=0-<n-1>`` (``%<max_parallel>`` when set), then the
    aggregation job with ``--dependency=afterok:<array job>``: it starts only when every task ended
    well. Cells of several ranks (:func:`slurm_scripts`) first get ``retriever.sbatch``, the one
    retrieval server of their ranks (the array starts after it, ``after:``), and a last job that stops
    it once the array has ended (``afterany``). Every cell's profile file is written first, so a bad
    cell fails here, not on the cluster.
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
    out: dict[str, Any] = {"scripts": {k: project_relative(v) for k, v in paths.items()}, "array_cmd": array_cmd,
                           "cell": {"nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node, "ranks": plan.ranks,
                                    "signal_lead_s": round(plan.signal_lead_s),
                                    "refused_but_forced": [str(r) for r in plan.refusals]}}
    server = "retriever" in paths
    if not submit:
        if server:
            out["array_cmd"] = [sbatch, "--parsable", "--dependency=after:<retriever job>",
                                "--export=ALL,COSEARCH_RETRIEVER_JOB=<retriever job>", *array_cmd[2:]]
            out["retriever_cmd"] = [sbatch, "--parsable", str(paths["retriever"])]
        out["aggregate_cmd"] = [sbatch, "--parsable", "--dependency=afterok:<array job>", str(paths["aggregate"])]
        return out
    if server:  # one retrieval server for every cell's ranks; it stops once the array has ended, however it ended
        out["retriever_job"] = sbatch_job_id(run_sbatch(run, [sbatch, "--parsable", str(paths["retriever"])]))
        array_cmd[2:2] = [f"--dependency=after:{out['retriever_job']}", f"--export=ALL,COSEARCH_RETRIEVER_JOB={out['retriever_job']}"]
        out["array_cmd"] = array_cmd
    array_job = sbatch_job_id(run_sbatch(run, array_cmd))
    aggregate_cmd = [sbatch, "--parsable", f"--dependency=afterok:{array_job}", str(paths["aggregate"])]
    out.update(array_job=array_job, aggregate_cmd=aggregate_cmd, aggregate_job=sbatch_job_id(run_sbatch(run, aggregate_cmd)))
    if server:
        stop = [sbatch, "--parsable", f"--dependency=afterany:{array_job}", "--time=00:05:00",
                f"--job-name=cosearch-{grid.name}-stop-retriever", f"--wrap=scancel {out['retriever_job']}"]
        out["stop_retriever_job"] = sbatch_job_id(run_sbatch(run, stop))
    write_json(out, folder / "submitted.json")
    return out
