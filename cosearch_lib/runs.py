"""Run records and the papermill runner.

Every executed notebook lands in ``papermill_runs/<profile>/`` next to a ``<notebook>.run.json``
record (profile, parameters, seed, git SHA, library versions, device, wall time, status). Tables
and figures are written atomically (temp file, then rename) so an interrupted run never leaves a
half-written file where a finished one is expected.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from .paths import notebooks_dir, project_root, runs_dir

#: Libraries whose versions every run record notes.
TRACKED_PACKAGES = (
    "torch", "transformers", "trl", "peft", "datasets", "faiss-cpu", "faiss-gpu-cu12", "vllm",
    "unsloth", "numpy", "pandas", "papermill", "cosearch-lib",
)


def run_dir(profile: str) -> Path:
    d = runs_dir() / profile
    d.mkdir(parents=True, exist_ok=True)
    return d


def git_sha(root: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root or project_root(), capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment_snapshot() -> dict[str, Any]:
    """What produced a result: interpreter, platform, library versions, git SHA, device."""
    versions = {}
    for pkg in TRACKED_PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{torch.cuda.get_device_name(0)}"
        threads = torch.get_num_threads()
    except ImportError:  # pragma: no cover
        threads = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "device": device,
        "git_sha": git_sha(),
        "packages": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it over ``path``, on error delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    return Path(path)


def write_table(df, path: str | os.PathLike) -> Path:
    """Write a DataFrame as CSV or parquet (by suffix), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        elif path.suffix == ".csv":
            df.to_csv(tmp, index=False)
        else:
            raise ValueError(f"table path must end in .csv or .parquet, got {path}")
    return path


def save_figure(fig, name: str, out_dir: str | os.PathLike, formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Save a matplotlib figure as ``<out_dir>/<name>.<fmt>`` for each format, atomically."""
    paths = []
    for fmt in formats:
        target = Path(out_dir) / f"{name}.{fmt}"
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, bbox_inches="tight")
        paths.append(target)
    return paths


def list_notebooks() -> list[Path]:
    """The numbered notebooks, in order (``NN_name.ipynb``)."""
    return sorted(p for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


def select_notebooks(selectors: list[str] | None) -> list[Path]:
    """All notebooks, or those whose file name starts with one of ``selectors`` (e.g. ``["01"]``)."""
    books = list_notebooks()
    if not selectors:
        return books
    chosen = [b for b in books if any(b.name.startswith(s) or b.stem == s for s in selectors)]
    missing = [s for s in selectors if not any(b.name.startswith(s) or b.stem == s for b in books)]
    if missing:
        raise FileNotFoundError(f"no notebook matches {missing}; have {[b.name for b in books]}")
    return chosen


def run_notebook(
    notebook: str | os.PathLike,
    profile: str,
    *,
    parameters: dict[str, Any] | None = None,
    out_dir: str | os.PathLike | None = None,
    kernel_name: str = "python3",
    progress: bool = True,
) -> Path:
    """Execute one notebook with papermill on a profile; return the executed copy's path.

    Parameters: the profile file's top-level scalars, then ``parameters`` on top. The notebook runs
    with the project root as working directory. A failed run still writes its partial notebook (for
    debugging) and a record with ``status: failed``, then re-raises.
    """
    import papermill as pm

    from .config import papermill_parameters

    notebook = Path(notebook)
    params = {**papermill_parameters(profile), "profile": profile, **(parameters or {})}
    out = Path(out_dir) if out_dir else run_dir(profile)
    out.mkdir(parents=True, exist_ok=True)
    executed = out / notebook.name
    record = {"notebook": notebook.name, "profile": profile, "parameters": params, "environment": environment_snapshot()}
    start = time.perf_counter()
    # the kernel inherits this: widgets.show_trajectories prints text instead of building widgets
    previous = os.environ.get("PAPERMILL_EXECUTION")
    os.environ["PAPERMILL_EXECUTION"] = "1"
    try:
        pm.execute_notebook(
            str(notebook), str(executed), parameters=params, kernel_name=kernel_name,
            cwd=str(project_root()), progress_bar=progress, log_output=False,
        )
    except BaseException as err:
        record.update(status="failed", error=f"{type(err).__name__}: {str(err)[:2000]}", wall_s=time.perf_counter() - start)
        write_json(record, out / f"{notebook.stem}.run.json")
        raise
    finally:
        if previous is None:
            os.environ.pop("PAPERMILL_EXECUTION", None)
        else:
            os.environ["PAPERMILL_EXECUTION"] = previous
    record.update(status="ok", wall_s=round(time.perf_counter() - start, 2))
    write_json(record, out / f"{notebook.stem}.run.json")
    return executed


def run_profile(profile: str, notebooks: list[str] | None = None, **kwargs: Any) -> list[Path]:
    """Run the selected (default: all) notebooks in order; stop at the first failure."""
    executed = []
    for nb in select_notebooks(notebooks):
        t0 = time.perf_counter()
        print(f"[cosearch run] {nb.name} on profile {profile!r} ...", flush=True)
        executed.append(run_notebook(nb, profile, **kwargs))
        print(f"[cosearch run] {nb.name} done in {time.perf_counter() - t0:.1f} s -> {executed[-1]}", flush=True)
    return executed
