"""Provenance of a run: git SHA, library versions and device, recorded next to every result.

The commit is the one this process's code came from: read when this module is first imported, not
when a record is written, so that a run that lasts across commits (a long training while work goes
on in the same tree) records what it started on, and whether tracked files differed from it then.
A record of work that a process started now will do (a papermill kernel, which imports the tree as
it is when it starts) reads the commit now: ``environment_snapshot(commit_now=True)``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from cosearch_lib.paths import project_root

#: Libraries whose versions every run record notes.
TRACKED_PACKAGES = (
    "torch", "transformers", "trl", "peft", "datasets", "faiss-cpu", "faiss-gpu-cu12", "vllm",
    "unsloth", "numpy", "pandas", "papermill", "cosearch-lib",
)


def git_sha(root: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", "rev-parse", "HEAD"], cwd=root or project_root(), capture_output=True,
            text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(root: Path | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (``git status --porcelain --untracked-files=no``); None outside git.
    ``--no-optional-locks``: it never takes the index lock a ``git commit`` beside it may need."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                             cwd=root or project_root(), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


@lru_cache(maxsize=1)
def process_commit() -> tuple[str | None, bool | None]:
    """(:func:`git_sha`, :func:`git_dirty`) of the project as this process first saw it (read once, at import)."""
    return git_sha(), git_dirty()


def cpu_model() -> str:
    """This machine's CPU model ("AMD EPYC ..."), from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "CPU"


def environment_snapshot(*, commit_now: bool = False) -> dict[str, Any]:
    """What produced a result: interpreter, platform, library versions, git SHA (and ``git_dirty``), device.
    The commit is :func:`process_commit`'s, or with ``commit_now`` the tree's at this call (for work a process
    started now will do)."""
    sha, dirty = (git_sha(), git_dirty()) if commit_now else process_commit()
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
        "git_sha": sha,
        "git_dirty": dirty,
        "packages": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


process_commit()  # at import: the commit of the code this process loads
