"""What the benchmarks that append to a CSV under ``benchmarks/records/`` share: the conditions of the run
(the environment snapshot, the load average at the start, whether the tree had uncommitted changes) and the
append itself (rows after the record's earlier ones, written atomically)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.atomic_io import write_table
from cosearch_lib.records.provenance import environment_snapshot


def run_conditions() -> tuple[dict[str, Any], float, bool]:
    """(environment snapshot, 1-minute load average now, whether tracked files have uncommitted changes)."""
    env = environment_snapshot()
    return env, os.getloadavg()[0], bool(env["git_dirty"])


def append_rows(rows: pd.DataFrame, record: str | Path) -> Path:
    """``rows`` after the rows already in the CSV ``record`` (created with its folder if missing)."""
    record = Path(record)
    record.parent.mkdir(parents=True, exist_ok=True)
    if record.exists():
        rows = pd.concat([pd.read_csv(record), rows], ignore_index=True)
    write_table(rows, record)
    return record
