"""Atomic writes: a file is written to a temporary name and renamed into place, so an
interrupted run never leaves a half-written table, record or figure where a finished one is expected.
A cache that several processes may build at once (data-parallel ranks or test workers on a fresh
clone) is built under :func:`build_lock`: the first builds it, the others wait and then find it.

``tempfile`` creates its files 0600 and its folders 0700, private to the writer whatever the
umask; records written that way could not be read by the rest of a cluster group. So a temporary
file or folder gets the mode a plain ``open`` or ``mkdir`` would have given it
(:func:`apply_umask`: 0644 and 0755 under the usual umask 022) before it is renamed into place.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


def _umask_at_import() -> int:
    # os.umask can only be read by setting it; done once here, while importing is single-threaded
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status), so that it is safe
    while other threads create files; elsewhere the umask the process had when this module loaded."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK_AT_IMPORT


def apply_umask(path: str | os.PathLike) -> None:
    """Give ``path`` the mode ``open``/``mkdir`` would have: 0o666 (a file) or 0o777 (a folder) less
    the umask (``tempfile`` makes them 0600/0700 instead)."""
    full = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, full & ~current_umask())


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing ancestors; return the ones this call created, deepest first."""
    created, missing = [], folder
    while not missing.exists():
        created.append(missing)
        missing = missing.parent
    folder.mkdir(parents=True, exist_ok=True)
    return created


def _remove_empty(created: list[Path]) -> None:
    """Undo :func:`_make_parents` after a failure: remove the folders it made, while they are empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:  # something else now lives there (or it went already): keep the rest
            return


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it over ``path``, on error delete it
    (and any parent folders this call created)."""
    path = Path(path)
    created = _make_parents(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        apply_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        _remove_empty(created)
        raise


@contextmanager
def build_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock named for ``path`` (the file ``.<name>.lock`` beside it) while building
    what goes there. A second process asking for the same lock waits until the first is done, so it
    can then find the finished build instead of building it again or removing it under a reader. An
    advisory ``flock``: the kernel releases it when its holder exits, even on a kill."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temp folder beside ``path``; on success it replaces ``path`` (an older folder
    there is removed only then), on error it is deleted, with any parent folders this call created,
    and ``path`` is left as it was: a failed build leaves nothing behind."""
    path = Path(path)
    created = _make_parents(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    apply_umask(tmp)
    try:
        yield tmp
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(created)
        raise


def replace_dir(finished: str | os.PathLike, path: str | os.PathLike) -> None:
    """Move the complete folder ``finished`` to ``path``. An older folder at ``path`` is first renamed
    aside (``.<name>.old``, a hidden name no glob of finished folders matches) and removed only once
    the new one is in place, so a kill at any point leaves one whole folder to find."""
    finished, path = Path(finished), Path(path)
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        finished.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        finished.rename(path)


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
