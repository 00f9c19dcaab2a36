"""Tables and verdicts as a reader sees them in a notebook: nothing cut off, counts as counts.

pandas cuts a cell's text at ``display.max_colwidth`` (50 characters), so a comparison's "note"
column ended in "...(s...". :func:`show_table` moves such a column under the table, one whole line
per row that has a note, shows count columns as integers (a missing count is 0, not NaN), and says
why a table is empty instead of drawing a header with no rows. :func:`print_wrapped` breaks long
verdict lines between words, not inside them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence

import pandas as pd

#: Width of a wrapped line: what a JupyterLab output area shows without breaking a word.
LINE_WIDTH = 110


def table_and_notes(table: pd.DataFrame, *, notes: str = "note", counts: Sequence[str] = ()) -> tuple[pd.DataFrame, list[str]]:
    """``table`` without its ``notes`` column and with ``counts`` as integers (missing = 0), and the
    notes as lines ("<row>: <note>") for the rows that have one."""
    shown = table.copy()
    lines: list[str] = []
    if notes in shown:
        paired = {"a", "b"} <= set(shown.columns)  # a comparison table: name the row by its pair
        for label, row in shown.iterrows():
            note = row[notes]
            if isinstance(note, str) and note:
                name = f"{row['a']} vs {row['b']}" if paired else \
                    " / ".join(map(str, label)) if isinstance(label, tuple) else str(label)
                lines.append(f"{name}: {note}")
        shown = shown.drop(columns=notes)
    for column in counts:
        if column in shown:
            shown[column] = pd.to_numeric(shown[column], errors="coerce").fillna(0).astype(int)
    return shown, lines


def print_wrapped(lines: Iterable[str], *, width: int = LINE_WIDTH) -> None:
    """Each line wrapped between words at ``width`` (continuations indented)."""
    for line in lines:
        print(textwrap.fill(str(line), width=width, subsequent_indent="    ", break_long_words=False,
                            break_on_hyphens=False))


def show_table(table: pd.DataFrame | None, *, notes: str = "note", counts: Sequence[str] = (), why_empty: str = "") -> None:
    """Display ``table`` (:func:`table_and_notes`) with its notes printed whole under it; an empty or
    missing table prints "no rows: <why_empty>" instead."""
    from IPython.display import display

    if table is None or len(table) == 0:
        print(f"no rows: {why_empty or 'nothing to show'}")
        return
    shown, lines = table_and_notes(table, notes=notes, counts=counts)
    display(shown)
    if lines:
        print_wrapped([f"note, {line}" for line in lines])
