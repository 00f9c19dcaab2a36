"""Markdown tables of the generated docs pages: one cell (``markdown_cell``) and a whole table
(``markdown_table``) from records, columns in the paper's order."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cosearch_lib.eval.benchmark_families import order_key
from cosearch_lib.eval.tables import AVG_COLUMNS


def markdown_cell(value: Any) -> str:
    if isinstance(value, float):
        text = "" if value != value else f"{value:.3f}"
    elif value is None:
        text = ""
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _column_key(col: str) -> tuple:
    """Row labels first, then R@k by k, families in the paper's order, averages last (JSON sorts keys)."""
    if col in ("metric", "meaning", "step", "status", "wall_s", "device", "git"):
        return (0,)
    if col.startswith("R@") and col[2:].isdigit():
        return (1, int(col[2:]))
    if col in AVG_COLUMNS:
        return (4, AVG_COLUMNS.index(col))
    if col.isdigit():
        return (2, int(col), "")
    return (3, *order_key(col))


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, *, index: str | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows`` (floats to 3 decimals, NaN and None empty)."""
    if not rows:
        return "_(no rows)_\n"
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    if columns is None:
        head = [c for c in (index, "data_source") if c in cols]
        cols = head + sorted((c for c in cols if c not in head), key=_column_key)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(markdown_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def regenerate_block(page: Path, begin: str, end: str, render: Callable[[str], str]) -> str:
    """``page``'s text with the part between its ``begin`` and ``end`` markers replaced by
    ``render(text outside the markers)``: the generated block of a page otherwise written by hand
    (``cosearch docs`` writes the result, ``--check`` compares it). ValueError when a marker is missing."""
    text = page.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"{page} lacks the markers of its generated block ({begin!r} ... {end!r})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n\n{render(head + tail)}\n{end}{tail}"
