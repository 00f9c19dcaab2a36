"""The papermill runner: a profile's notebooks, headless, with their parameters checked first.

Every executed notebook lands in ``papermill_runs/<profile>/`` next to a ``<notebook>.run.json``
record (profile, parameters, git SHA, library versions, device, wall time, status).

A notebook's parameters come from three places, later ones winning: the profile's top-level
scalars (``profile``, ``seed``), the profile's ``notebooks: {<notebook>: {name: value}}`` section,
and ``cosearch run -p name=value``. Every name is checked against the notebook's ``parameters``
cell before anything runs: an unknown name is an error that lists the valid ones (papermill itself
would only warn and run the defaults). So is every model name of the profile
and every input of the profile (:func:`cosearch_lib.experiment.preflight.check_inputs`: data files, their
columns, the index's dimension, the context budget): a typo is reported at once, not after the warm
start has loaded the encoder.

Before the notebooks that use the warm-started policies (02 and later), the runner trains or loads
the profile's warm start as its own step, so its cost is reported on its own line and in
``warmstart.run.json``, not hidden inside a notebook.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import papermill as pm
import yaml

from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import SCORING_RANKER_KINDS, ConfigError, ProfileConfig, load_profile, papermill_parameters
from cosearch_lib.experiment import fixed_ranker, fixed_ranker_cached, search_backend, warm_roles, warm_start, warmstart_dir
from cosearch_lib.experiment.preflight import check_inputs
from cosearch_lib.paths import list_notebooks, project_relative, project_root, run_dir, select_notebooks
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.stop_signals import StopRequested, pending_stop


def notebook_parameters(notebook: str | os.PathLike) -> dict[str, Any]:
    """The notebook's ``parameters`` cell as {name: default value} (papermill reads the cell)."""
    found = pm.inspect_notebook(str(notebook))
    out = {}
    for name, info in found.items():
        try:
            out[name] = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError):
            out[name] = info["default"]  # an expression: keep its source text
    return out


def parse_parameter(text: str) -> tuple[str, Any]:
    """``"name=value"`` -> (name, value); the value is read as YAML (``3`` -> 3, ``true`` -> True)."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise ConfigError(f"-p expects name=value with a Python name, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return name.strip(), value


def _type_ok(value: Any, default: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and (isinstance(default, float) or isinstance(value, int))
    return isinstance(value, type(default))


def check_parameters(notebook: str | os.PathLike, params: dict[str, Any], where: str) -> None:
    """Every name must be in the notebook's parameters cell, with a value of the default's type."""
    known = notebook_parameters(notebook)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ConfigError(f"{where}: {Path(notebook).stem} has no parameter(s) {unknown}; its parameters: {sorted(known)}")
    for name, value in params.items():
        if not _type_ok(value, known[name]):
            raise ConfigError(f"{where}: {Path(notebook).stem}.{name} expects {type(known[name]).__name__} "
                              f"(default {known[name]!r}), got {value!r}")


def check_parameter_names(parameters: Mapping[str, Any], declared: Mapping[Path, Mapping[str, Any]]) -> None:
    """``-p`` names: each must be declared by one of the selected notebooks (``declared``: notebook ->
    its parameters cell), else a ConfigError that lists the parameters they do declare."""
    stray = sorted(n for n in parameters if not any(n in d for d in declared.values()))
    if stray:
        valid = sorted(set().union(*declared.values()))
        raise ConfigError(f"-p {stray}: no selected notebook ({', '.join(b.stem for b in declared)}) has such a "
                          f"parameter; valid: {valid}")


def _matches(key: str, notebook: Path) -> bool:
    return notebook.stem == key or notebook.name.startswith(f"{key}_") or notebook.name == key


def profile_notebook_parameters(cfg: ProfileConfig, notebook: Path) -> dict[str, Any]:
    """The profile's ``notebooks:`` entries for ``notebook`` (keys: ``02`` or ``02_oracle_gap_study``)."""
    out: dict[str, Any] = {}
    for key, params in cfg.notebooks.items():
        if _matches(str(key), notebook):
            out.update(params)
    return out


def check_profile_notebooks(cfg: ProfileConfig, where: str = "notebooks") -> None:
    """Each key of the profile's ``notebooks:`` section names one notebook, with valid parameters."""
    books = list_notebooks()
    for key, params in cfg.notebooks.items():
        hits = [b for b in books if _matches(str(key), b)]
        if len(hits) != 1:
            raise ConfigError(f"{where}.{key}: matches {len(hits)} notebooks; expected one of {[b.stem for b in books]}")
        check_parameters(hits[0], params, f"{where}.{key}")


#: What the kernel of a headless run inherits: text instead of widgets for the trajectory browser
#: and the library's progress bars (``cosearch_lib.progress``), and no progress bars from the Hugging
#: Face libraries (weight loading, dataset maps), which would otherwise be saved as widget state that
#: shows frozen at 0% when the executed notebook is opened.
HEADLESS_KERNEL_ENV = {"PAPERMILL_EXECUTION": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                       "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


class CellTimeout(TimeoutError):
    """A notebook cell ran past ``run_notebook``'s ``cell_timeout``."""


def _slow_cell(executed: Path) -> str:
    """Which code cell of a partially executed notebook was running when it stopped (the one papermill
    marked with an error, an exception or as running, else the one that started last): its number
    among the notebook's own code cells, the parameters cell counted, and its first line."""
    try:
        nb = json.loads(executed.read_text())
    except (OSError, ValueError):
        return "a cell"
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"
            and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    def named(i: int) -> str:
        first = "".join(code[i - 1].get("source", "")).strip().splitlines()
        return f"code cell {i} of {len(code)} ({first[0][:80] if first else 'empty'!r})"

    started = []
    for i, cell in enumerate(code, 1):
        meta = cell.get("metadata", {}).get("papermill", {})
        errors = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
        if errors or meta.get("status") == "running" or meta.get("exception"):
            return named(i)
        if meta.get("start_time"):
            started.append(i)
    return named(started[-1]) if started else "a cell"  # else the cell that started last


def run_notebook(
    notebook: str | os.PathLike,
    profile: str,
    *,
    parameters: dict[str, Any] | None = None,
    out_dir: str | os.PathLike | None = None,
    kernel_name: str = "python3",
    progress: bool = True,
    cell_timeout: float | None = None,
) -> Path:
    """Execute one notebook with papermill on a profile; return the executed copy's path.

    Parameters: the profile file's top-level scalars, then ``parameters`` on top. The notebook runs
    with the project root as working directory. A failed run still writes its partial notebook (for
    debugging) and a record with ``status: failed``, then re-raises. ``cell_timeout`` (seconds; None:
    no limit) stops a cell that runs longer: the kernel is shut down and :class:`CellTimeout` names
    the notebook, the cell and the time it ran.
    """

    notebook = Path(notebook)
    params = {**papermill_parameters(profile), "profile": profile, **(parameters or {})}
    out = Path(out_dir) if out_dir else run_dir(load_profile(profile).profile)  # a profile file names its run folder
    out.mkdir(parents=True, exist_ok=True)
    executed = out / notebook.name
    # the kernel imports the tree as it is now, not as this process found it when it started
    record = {"notebook": notebook.name, "profile": profile, "parameters": params,
              "environment": environment_snapshot(commit_now=True)}
    start = time.perf_counter()
    previous = {name: os.environ.get(name) for name in HEADLESS_KERNEL_ENV}
    os.environ.update(HEADLESS_KERNEL_ENV)  # the kernel inherits them
    try:
        pm.execute_notebook(
            str(notebook), str(executed), parameters=params, kernel_name=kernel_name,
            cwd=str(project_root()), progress_bar=progress, log_output=False, execution_timeout=cell_timeout,
        )
    except BaseException as err:
        wall = time.perf_counter() - start
        timed_out = cell_timeout is not None and isinstance(err, TimeoutError)  # nbclient's CellTimeoutError is one
        if timed_out:
            err = CellTimeout(f"{notebook.name} on profile {profile!r}: {_slow_cell(executed)} ran past the "
                              f"{cell_timeout:g} s cell timeout ({wall:.0f} s into the notebook); its kernel was shut down")
        record.update(status="timeout" if timed_out else "failed", error=f"{type(err).__name__}: {str(err)[:2000]}", wall_s=wall)
        write_json(record, out / f"{notebook.stem}.run.json")
        if timed_out:
            raise err from None
        raise
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    record.update(status="ok", wall_s=round(time.perf_counter() - start, 2))
    write_json(record, out / f"{notebook.stem}.run.json")
    return executed


def run_warm_start(cfg: ProfileConfig, *, out_dir: str | os.PathLike | None = None, progress: bool = True) -> dict[str, Any]:
    """Train (or load from the cache) the profile's warm-start adapters; write ``warmstart.run.json``."""
    check_inputs(cfg)
    t0 = time.perf_counter()
    cached = all((warmstart_dir(cfg) / role / "adapter_config.json").exists() for role in warm_roles(cfg))
    retriever = None if cached else search_backend(cfg, progress=progress)  # only training reads the retriever
    folders = warm_start(cfg, retriever, progress=progress) if cfg.warmstart.enabled else {}
    gc.collect()  # the models trained here are not needed by the notebooks' kernels
    record = {"step": "warm start", "profile": cfg.profile, "enabled": cfg.warmstart.enabled, "cached": cached,
              "adapters": {role: project_relative(path) for role, path in folders.items()}, "wall_s": round(time.perf_counter() - t0, 2),
              "environment": environment_snapshot()}
    out = Path(out_dir) if out_dir else run_dir(cfg.profile)
    out.mkdir(parents=True, exist_ok=True)
    write_json(record, out / "warmstart.run.json")
    if cfg.relevance.enabled or cfg.training.ranker_kind in SCORING_RANKER_KINDS:
        record["relevance"] = run_relevance_training(cfg, out_dir=out, progress=progress)
    return record


def run_relevance_training(cfg: ProfileConfig, *, out_dir: str | os.PathLike | None = None,
                           progress: bool = True) -> dict[str, Any]:
    """Train (or load from the cache) the profile's relevance-trained Fixed Ranker
    (``experiment.fixed_ranker``: the generative ranker's relevance GRPO, or the listwise training of
    a scoring ranker kind); write ``relevance.run.json``."""
    t0 = time.perf_counter()
    cached = fixed_ranker_cached(cfg)
    retriever = None if cached else search_backend(cfg, progress=progress)
    folder = fixed_ranker(cfg, retriever, progress=progress)
    gc.collect()
    record = {"step": "relevance training", "profile": cfg.profile, "ranker_kind": cfg.training.ranker_kind, "cached": cached,
              "adapter": project_relative(folder), "steps": cfg.relevance.steps, "wall_s": round(time.perf_counter() - t0, 2),
              "environment": environment_snapshot()}
    out = Path(out_dir) if out_dir else run_dir(cfg.profile)
    out.mkdir(parents=True, exist_ok=True)
    write_json(record, out / "relevance.run.json")
    return record


#: The notebooks that use the warm-started policies: the warm start step runs before the first of them
#: (04 and 05 only read records).
POLICY_NOTEBOOKS = ("02", "03")


def run_profile(profile: str, notebooks: list[str] | None = None, *, parameters: dict[str, Any] | None = None,
                warm_start_step: bool = True, **kwargs: Any) -> list[Path]:
    """Run the selected (default: all) notebooks in order; stop at the first failure.

    ``parameters`` (e.g. from ``-p``) go to every selected notebook that declares them; a name no
    selected notebook declares is an error, raised before anything runs, as is a bad ``notebooks:``
    section in the profile, or a model name that cannot resolve."""
    cfg = load_profile(profile)
    books = select_notebooks(notebooks)
    check_profile_notebooks(cfg, f"{profile}: notebooks")
    check_inputs(cfg)
    parameters = dict(parameters or {})
    declared = {b: notebook_parameters(b) for b in books}
    check_parameter_names(parameters, declared)
    per_book = {b: {**profile_notebook_parameters(cfg, b), **{k: v for k, v in parameters.items() if k in declared[b]}}
                for b in books}
    for b, params in per_book.items():
        check_parameters(b, params, "-p")
    label = repr(project_relative(profile) if str(profile).endswith((".yaml", ".yml")) else profile)
    warm_before = next((b for b in books if b.name[:2] in POLICY_NOTEBOOKS), None) \
        if warm_start_step and cfg.warmstart.enabled else None
    executed = []
    for nb in books:
        if executed and pending_stop() is not None:  # a stop during the last notebook: leave the rest (the first always runs)
            raise StopRequested(pending_stop())
        if nb == warm_before:  # after the retriever notebook, before the first one that uses the policies
            print(f"[cosearch run] warm start on profile {label} ...", flush=True)
            rec = run_warm_start(cfg, out_dir=kwargs.get("out_dir"), progress=kwargs.get("progress", True))
            print(f"[cosearch run] warm start {'loaded from cache' if rec['cached'] else 'trained'} in {rec['wall_s']:.1f} s "
                  f"-> {project_relative(warmstart_dir(cfg))}", flush=True)
            if "relevance" in rec:
                rel = rec["relevance"]
                print(f"[cosearch run] relevance-trained Fixed Ranker ({rel['ranker_kind']}) "
                      f"{'loaded from cache' if rel['cached'] else 'trained'} in {rel['wall_s']:.1f} s -> "
                      f"{project_relative(rel['adapter'])}", flush=True)
        t0 = time.perf_counter()
        extra = f" with {per_book[nb]}" if per_book[nb] else ""
        print(f"[cosearch run] {nb.name} on profile {label}{extra} ...", flush=True)
        executed.append(run_notebook(nb, profile, parameters=per_book[nb], **kwargs))
        print(f"[cosearch run] {nb.name} done in {time.perf_counter() - t0:.1f} s -> {project_relative(executed[-1])}", flush=True)
    return executed
