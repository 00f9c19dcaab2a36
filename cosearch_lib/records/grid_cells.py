"""Grids of runs, as data: a grid file read and checked (:func:`load_grid`), each cell's profile and run
folder, and whether a cell has run (:func:`cell_status`). Launching the cells is ``runs.grid``.

A grid runs the same notebooks once per cell, each cell a profile derived from a base one.

A grid is data, a YAML file under ``papermill_runs/params/grids/<name>.yaml``::

    grid: table3                   # its name: runs land in papermill_runs/<profile>/table3/<cell>/
    description: ...               # optional, one line
    notebooks: ["03"]              # what every cell runs (notebook prefixes)
    aggregate: ["04", "05"]        # what runs once every cell has finished (SLURM: a dependent job)
    parameters: {methods: cosearch}   # notebook parameters of every cell
    cells:
      full: {}                     # the base profile as it is
      no_r_main:                   # profile sections this cell changes (merged like ``extends``) ...
        training: {ranker_reward: {use_main: false}}
      k1:
        search: {topk: 1}
        parameters: {methods: "search_r1,cosearch"}   # ... notebook parameters of its own
        paper: "w/o r_main"        # ... and the paper's row it reproduces (Table 3 names)

Each cell becomes a profile file of its own, ``papermill_runs/<profile>/<grid>/<cell>/profile.yaml``
(``extends`` the base profile, ``profile: <profile>/<grid>/<cell>``), so its executed notebooks,
records and figures land in that folder, and everything it shares with the base (world, index,
warm start) is reused from the caches. ``runs.grid.run_grid`` runs the cells one after another, skips the
finished ones and resumes a killed one; ``runs.grid.submit_slurm`` writes a SLURM array job (one task per
cell) and a dependent aggregation job, and submits both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from cosearch_lib.atomic_io import atomic_path
from cosearch_lib.config import ConfigError, ProfileConfig, extended_profile, load_profile, profile_path, read_yaml_mapping
from cosearch_lib.paths import params_dir, project_relative, run_dir, select_notebooks

GRID_KEYS = ("grid", "description", "notebooks", "aggregate", "parameters", "cells")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
#: What a cell's folder holds when it is finished / has started: see :func:`cell_status`.
CELL_STATUSES = ("todo", "partial", "failed", "done")


@dataclass(frozen=True)
class GridCell:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)  # profile sections this cell changes
    parameters: dict[str, Any] = field(default_factory=dict)  # notebook parameters of this cell
    paper: str | None = None  # the paper's row this cell reproduces (records.ablations puts it beside ours)


@dataclass(frozen=True)
class Grid:
    name: str
    notebooks: tuple[str, ...]
    cells: tuple[GridCell, ...]
    aggregate: tuple[str, ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str | None = None  # the grid file it was read from (what the SLURM jobs read again)

    def cell(self, key: str | int) -> GridCell:
        """A cell by name or by 0-based index (a SLURM array task id)."""
        if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
            index = int(key)
            if not 0 <= index < len(self.cells):
                raise IndexError(f"grid {self.name!r} has cells 0..{len(self.cells) - 1}, not {index}")
            return self.cells[index]
        found = [c for c in self.cells if c.name == key]
        if not found:
            raise KeyError(f"grid {self.name!r} has no cell {key!r}; cells: {[c.name for c in self.cells]}")
        return found[0]


def grids_dir() -> Path:
    """``papermill_runs/params/grids/``: one YAML file per grid."""
    return params_dir() / "grids"


def available_grids() -> list[str]:
    return sorted(p.stem for p in grids_dir().glob("*.yaml"))


def grid_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    return path if path.suffix in (".yaml", ".yml") else grids_dir() / f"{name_or_path}.yaml"


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise ConfigError(f"{what}: expected a list of notebook prefixes such as ['03'], got {value!r}")
    return tuple(str(v).zfill(2) if isinstance(v, int) else v for v in value)


def load_grid(name_or_path: str | Path) -> Grid:
    """Read and check a grid file (unknown keys, cell names, mappings); ConfigError says what is wrong."""
    path = grid_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"no grid file {path}; available grids: {available_grids()}")
    data = read_yaml_mapping(path, f"a grid is a mapping with keys {list(GRID_KEYS)}")
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; a grid has {list(GRID_KEYS)}")
    name = data.get("grid", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{path}: grid name {name!r} must be lower-case letters, digits, '-' or '_'")
    parameters = data.get("parameters") or {}
    cells_data = data.get("cells")
    if not isinstance(parameters, dict):
        raise ConfigError(f"{path}: parameters: expected a mapping of notebook parameter -> value, got {parameters!r}")
    if not isinstance(cells_data, dict) or not cells_data:
        raise ConfigError(f"{path}: cells: expected a non-empty mapping of cell name -> settings, got {cells_data!r}")
    cells = []
    for cell_name, settings in cells_data.items():
        settings = {} if settings is None else settings
        if not isinstance(cell_name, str) or not _NAME.match(cell_name):
            raise ConfigError(f"{path}: cell name {cell_name!r} must be lower-case letters, digits, '-' or '_'")
        if not isinstance(settings, dict):
            raise ConfigError(f"{path}: cell {cell_name!r}: expected a mapping of profile sections, got {settings!r}")
        settings = dict(settings)
        cell_params = settings.pop("parameters", None) or {}
        paper = settings.pop("paper", None)
        if paper is not None and not isinstance(paper, str):
            raise ConfigError(f"{path}: cell {cell_name!r}: paper: expected the paper's row name, got {paper!r}")
        if not isinstance(cell_params, dict):
            raise ConfigError(f"{path}: cell {cell_name!r}: parameters: expected a mapping, got {cell_params!r}")
        for forbidden in ("profile", "extends"):
            if forbidden in settings:
                raise ConfigError(f"{path}: cell {cell_name!r} may not set {forbidden!r}: the grid sets it")
        cells.append(GridCell(cell_name, settings, cell_params, paper))
    return Grid(name=name, notebooks=_strings(data.get("notebooks", ["03"]), f"{path}: notebooks"),
                cells=tuple(cells), aggregate=_strings(data.get("aggregate", []), f"{path}: aggregate"),
                parameters=parameters, description=str(data.get("description", "")), source=str(path.resolve()))


# --------------------------------------------------------------------------- cells as profiles


def cell_profile_name(base: ProfileConfig, grid: Grid, cell: GridCell) -> str:
    """``<profile>/<grid>/<cell>``: the cell's run folder under ``papermill_runs/`` and ``figures/``."""
    return f"{base.profile}/{grid.name}/{cell.name}"


def cell_dir(base: ProfileConfig, grid: Grid, cell: GridCell) -> Path:
    return run_dir(cell_profile_name(base, grid, cell))


def cell_config(base_profile: str | Path, grid: Grid, cell: GridCell) -> ProfileConfig:
    """The cell's settings as :func:`write_cell_profile`'s file loads them, built in memory (nothing written);
    ConfigError names the cell."""
    base = load_profile(base_profile)
    try:
        return extended_profile(base_profile, {"profile": cell_profile_name(base, grid, cell), **cell.overrides})
    except (ConfigError, ValueError) as err:
        raise ConfigError(f"grid {grid.name!r}, cell {cell.name!r}: {err}") from err


def write_cell_profile(base_profile: str | Path, grid: Grid, cell: GridCell) -> Path:
    """The cell's profile file (``extends`` the base profile; the cell's sections on top), written
    atomically into the cell's folder and loaded once to check it; ConfigError names the cell."""
    base = load_profile(base_profile)
    extends = str(profile_path(base_profile).resolve()) if Path(str(base_profile)).suffix in (".yaml", ".yml") \
        else str(base_profile)
    data = {"extends": extends, "profile": cell_profile_name(base, grid, cell), **cell.overrides}
    path = cell_dir(base, grid, cell) / "profile.yaml"
    with atomic_path(path) as tmp:
        tmp.write_text(f"# grid {grid.name!r}, cell {cell.name!r}: written by `cosearch grid`; edit the grid file instead\n"
                       + yaml.safe_dump(data, sort_keys=False))
    try:
        load_profile(path)
    except (ConfigError, ValueError) as err:
        raise ConfigError(f"grid {grid.name!r}, cell {cell.name!r}: {err}") from err
    return path


def cell_status(base: ProfileConfig, grid: Grid, cell: GridCell) -> str:
    """``done`` (every notebook of the grid has an ``ok`` run record in the cell's folder), ``failed``
    (one has a failed record), ``partial`` (a run started: a training folder or some records exist,
    e.g. a killed task) or ``todo``."""
    folder = cell_dir(base, grid, cell)
    records = []
    for book in select_notebooks(list(grid.notebooks)):
        path = folder / f"{book.stem}.run.json"
        records.append(json.loads(path.read_text()) if path.exists() else None)
    if records and all(r is not None and r.get("status") == "ok" for r in records):
        return "done"
    if any(r is not None and r.get("status") == "failed" for r in records):
        return "failed"
    if any(r is not None for r in records) or (folder / "training").exists():
        return "partial"
    return "todo"


def grid_status(base_profile: str | Path, grid: Grid) -> pd.DataFrame:
    """One row per cell: index, name, status, folder (project-relative)."""
    base = load_profile(base_profile)
    return pd.DataFrame([{"index": i, "cell": c.name, "status": cell_status(base, grid, c),
                          "folder": project_relative(cell_dir(base, grid, c))} for i, c in enumerate(grid.cells)])
