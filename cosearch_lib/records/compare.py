"""Compare the tables two runs wrote: are the records of the same seed and profile identical?

A run writes tidy tables (CSV and parquet) under its run folder (``papermill_runs/<profile>/``) and
its figures folder (``figures/<profile>/``): evaluation records, training step records, ranker
calls, recall tables. :func:`compare_tables` pairs the tables of two such folders by relative path
and compares them cell by cell, exactly (NaN equals NaN), ignoring the columns that measure time,
which no two runs share. It is how a refactor shows it changed no behaviour
(``cosearch compare-runs BEFORE AFTER``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cosearch_lib.run_schema import STEPS_FILE, step_table_under_current_names, under_current_names

#: Columns that hold wall-clock measurements (``rollout_s``, ``wall_s``, ...): never reproducible.
TIMING_COLUMNS = r"(^|_)s$|^wall_s$|_seconds$"
TABLE_SUFFIXES = (".csv", ".parquet")


def read_any_table(path: str | Path) -> pd.DataFrame:
    """A CSV or parquet table under today's names (``run_schema.under_current_names``; a ``steps.csv``:
    ``step_table_under_current_names``, its metric keys namespaced), so that two
    runs of the same code before and after a rename compare equal."""
    path = Path(path)
    if path.suffix == ".parquet":
        table = pd.read_parquet(path)
    elif path.suffix == ".csv":
        table = pd.read_csv(path)
    else:
        raise ValueError(f"{path}: not a table (expected one of {TABLE_SUFFIXES})")
    return step_table_under_current_names(table) if path.name.endswith(STEPS_FILE) else under_current_names(table)


def find_tables(root: str | Path) -> list[str]:
    """Relative paths of every CSV / parquet file under ``root``, sorted."""
    root = Path(root)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in TABLE_SUFFIXES and p.is_file())


def _cell_equal(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:  # NaN == NaN
        return True
    if hasattr(a, "tolist") and hasattr(b, "tolist"):  # arrays in parquet cells
        return a.tolist() == b.tolist()
    try:
        return bool(a == b) or (pd.isna(a) and pd.isna(b))
    except (TypeError, ValueError):
        return repr(a) == repr(b)


def diff_table(a: pd.DataFrame, b: pd.DataFrame, *, ignore: str = TIMING_COLUMNS) -> str | None:
    """None when the tables agree outside the ignored columns, else one line saying where they differ.
    Their columns are compared as sets (a renamed column read back may sit elsewhere), their values
    column by column."""
    skip = re.compile(ignore)
    cols_a = [c for c in a.columns if not skip.search(str(c))]
    cols_b = [c for c in b.columns if not skip.search(str(c))]
    if set(cols_a) != set(cols_b):
        return f"columns differ: only in first {sorted(set(cols_a) - set(cols_b))}, only in second {sorted(set(cols_b) - set(cols_a))}"
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    bad = []
    for col in cols_a:
        rows = [i for i, (x, y) in enumerate(zip(a[col].tolist(), b[col].tolist())) if not _cell_equal(x, y)]
        if rows:
            bad.append(f"{col} (rows {rows[:5]}{'...' if len(rows) > 5 else ''}: {a[col].iloc[rows[0]]!r} vs {b[col].iloc[rows[0]]!r})")
    return "; ".join(bad) if bad else None


def compare_tables(first: str | Path, second: str | Path, *, ignore: str = TIMING_COLUMNS,
                   only: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per table found under either folder: ``table``, ``rows``, ``status`` (identical,
    differs, missing in first / second) and ``detail``. ``only``: regexes a relative path must match."""
    first, second = Path(first), Path(second)
    for folder in (first, second):
        if not folder.is_dir():
            raise FileNotFoundError(f"no run folder {folder}")
    names = sorted(set(find_tables(first)) | set(find_tables(second)))
    if only:
        names = [n for n in names if any(re.search(pat, n) for pat in only)]
    rows = []
    for name in names:
        a, b = first / name, second / name
        if not a.exists() or not b.exists():
            rows.append({"table": name, "rows": None, "status": f"missing in {'first' if not a.exists() else 'second'}", "detail": ""})
            continue
        ta, tb = read_any_table(a), read_any_table(b)
        detail = diff_table(ta, tb, ignore=ignore)
        rows.append({"table": name, "rows": len(ta), "status": "identical" if detail is None else "differs", "detail": detail or ""})
    return pd.DataFrame(rows, columns=["table", "rows", "status", "detail"])
