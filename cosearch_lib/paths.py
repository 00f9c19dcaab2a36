"""Where things live on disk.

The project root is ``$COSEARCH_ROOT`` when set, else the checkout this package was installed
from (editable install), else the current directory. Generated artefacts never go next to the
code: worlds, indexes and model caches under ``data/``, executed notebooks and run records under
``papermill_runs/``, figures under ``figures/`` (all git-ignored).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def project_root() -> Path:
    env = os.environ.get("COSEARCH_ROOT")
    if env:
        return Path(env).expanduser().resolve()
    here = Path(__file__).resolve().parents[1]
    if (here / "pyproject.toml").exists() and (here / "notebooks").is_dir():
        return here
    return Path.cwd().resolve()


def data_dir() -> Path:
    return Path(os.environ.get("COSEARCH_DATA", project_root() / "data")).expanduser()


def cache_dir() -> Path:
    """Converted model weights and other caches (``$COSEARCH_CACHE`` or ``data/cache``)."""
    return Path(os.environ.get("COSEARCH_CACHE", data_dir() / "cache")).expanduser()


def runs_dir() -> Path:
    """Executed notebooks and run records (``$COSEARCH_RUNS`` or ``papermill_runs/``)."""
    return Path(os.environ.get("COSEARCH_RUNS", project_root() / "papermill_runs")).expanduser()


def params_dir() -> Path:
    """Profile files always live in the checkout, wherever runs are written."""
    return project_root() / "papermill_runs" / "params"


def figures_dir() -> Path:
    return Path(os.environ.get("COSEARCH_FIGURES", project_root() / "figures")).expanduser()


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


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


def profile_data_path(root: str, path: str) -> Path:
    """A path of a profile's ``data`` section: absolute as given, relative against ``root``
    (``data.root``), which is itself relative to the project root, never to the cwd."""
    base = Path(root).expanduser()
    base = base if base.is_absolute() else project_root() / base
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def path_text(path: object) -> str | None:
    """``str(path)``, or None for None (config fields that hold an optional folder)."""
    return None if path is None else str(path)


def project_relative(path: object) -> str:
    """``path`` relative to the project root when it lies inside it (what records and messages show,
    so they read the same on every machine), else ``str(path)``."""
    try:
        return str(Path(str(path)).resolve().relative_to(project_root().resolve()))
    except ValueError:
        return str(path)


def describe_saved(paths: Iterable[object]) -> str:
    """One line for the files a step wrote, project-relative, the formats of one file folded
    together: ``saved figures/demo/oracle_gap.{png,pdf}, figures/demo/oracle_gap.csv`` (what a
    notebook prints instead of absolute paths or ``PosixPath(...)`` reprs)."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        shown = Path(project_relative(path))
        groups.setdefault(str(shown.with_suffix("")), []).append(shown.suffix.lstrip("."))
    parts = [stem + ((f".{exts[0]}" if exts[0] else "") if len(exts) == 1 else f".{{{','.join(exts)}}}")
             for stem, exts in groups.items()]
    return "saved " + (", ".join(parts) if parts else "nothing")


def run_dir(profile: str) -> Path:
    d = runs_dir() / profile
    d.mkdir(parents=True, exist_ok=True)
    return d
