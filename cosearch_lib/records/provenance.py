"""Provenance of a run: git SHA, library versions and device, recorded next to every result.

The commit is the one this process's code came from: read when this module is first imported, not
when a record is written, so that a run that lasts across commits (a long training while work goes
on in the same tree) records what it started on, and whether tracked files differed from it then.
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
            ["git", "rev-parse", "HEAD"], cwd=root or project_root(), capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_dirty(root: Path | None = None) -> bool | None:
    """Whether tracked files differ from HEAD (``git status --porcelain --untracked-files=no``); None outside git."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root or project_root(),
                             capture_output=True, text=True, timeout=10)
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
        "git_sha": process_commit()[0],
        "git_dirty": process_commit()[1],
        "packages": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


process_commit()  # at import: the commit of the code this process loads
