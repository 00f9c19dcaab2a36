"""Tables and verdicts as a reader sees them in a notebook: nothing cut off, counts as counts.

pandas cuts a cell's text at ``display.max_colwidth`` (50 characters), so a comparison's "note"
column ended in "...(s...". :func:`show_table` shows every cell's text whole (the table wraps it),
moves a notes column under the table, one whole line per row that has a note, shows count columns
as integers (a missing count is 0, not NaN), and says why a table is empty instead of drawing a
header with no rows. :func:`print_wrapped` breaks long
verdict lines between words, not inside them. :func:`show_comparison` reads a comparison table out
(one verdict per row), then shows it without repeating what the verdicts said.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from cosearch_lib.eval.intervals import verdicts

#: Width of a wrapped line: what a JupyterLab output area shows without breaking a word.
LINE_WIDTH = 110


def table_and_notes(table: pd.DataFrame, *, notes: str = "note", counts: Sequence[str] = (), decimals: int | None = None,
                    column_decimals: Mapping[str, int] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """``table`` without its ``notes`` column and with ``counts`` as integers (missing = 0), and the
    notes as lines ("<row>: <note>") for the rows that have one. With ``decimals``, every float column
    is written with that many decimals (``column_decimals`` overrides it per column), so that 0 reads
    "0.000" beside "0.286" and not "0.0"; a missing value stays "NaN"."""
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
    fixed = dict(column_decimals or {})
    for column in shown.columns:
        places = fixed.get(column, decimals)
        if places is not None and pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v, n=places: "NaN" if pd.isna(v) else f"{v:.{n}f}")
    return shown, lines


def print_wrapped(lines: Iterable[str], *, width: int = LINE_WIDTH) -> None:
    """Each line wrapped between words at ``width`` (continuations indented)."""
    for line in lines:
        print(textwrap.fill(str(line), width=width, subsequent_indent="    ", break_long_words=False,
                            break_on_hyphens=False))


def row_numbers_only(table: pd.DataFrame) -> bool:
    """Whether ``table``'s index says nothing but row positions (unnamed integers: 0, 1, ... or what
    a sort left of them), which :func:`show_table` then leaves out."""
    index = table.index
    return not isinstance(index, pd.MultiIndex) and index.name is None and pd.api.types.is_integer_dtype(index)


class _RowsWithoutNumbers:
    """A table shown without its index, as HTML in JupyterLab and as text elsewhere."""

    def __init__(self, table: pd.DataFrame):
        self.table = table

    def _repr_html_(self) -> str:
        return self.table.to_html(index=False, classes="dataframe")

    def __repr__(self) -> str:
        return self.table.to_string(index=False)


def show_table(table: pd.DataFrame | None, *, notes: str = "note", counts: Sequence[str] = (), why_empty: str = "",
               decimals: int | None = None, column_decimals: Mapping[str, int] | None = None) -> None:
    """Display ``table`` (:func:`table_and_notes`) with its notes printed whole under it; an empty or
    missing table prints "no rows: <why_empty>" instead."""
    from IPython.display import display

    if table is None or len(table) == 0:
        print(f"no rows: {why_empty or 'nothing to show'}")
        return
    shown, lines = table_and_notes(table, notes=notes, counts=counts, decimals=decimals, column_decimals=column_decimals)
    with pd.option_context("display.max_colwidth", None):  # the HTML is built here: long text wraps, whole
        display(_RowsWithoutNumbers(shown) if row_numbers_only(shown) else shown)
    if lines:
        print_wrapped([f"note, {line}" for line in lines])


def show_comparison(table: pd.DataFrame | None, *, heading: str = "", counts: Sequence[str] = ("n_questions", "n_families"),
                    why_empty: str = "", decimals: int = 3) -> None:
    """A comparison table (``eval.tables.comparison_table`` and the like) as a reader wants it: first
    one verdict per row and per pair left out (:func:`eval.intervals.verdicts`, wrapped), then the
    table. A row without an interval already says why in its verdict, so its note is not printed a
    second time under the table; a note on a row with an interval still is."""
    if table is None:
        print(f"no rows: {why_empty or 'nothing to show'}")
        return
    lines = verdicts(table)
    if lines:
        print_wrapped([f"{heading}:", *lines] if heading else lines)
    if len(table) == 0:
        print(f"no rows: {why_empty or 'no pair could be compared (above)'}")
        return
    shown = table.copy()
    if "note" in shown and {"ci_low", "ci_high"} <= set(shown.columns):
        said = shown["ci_low"].isna() | shown["ci_high"].isna()
        shown["note"] = shown["note"].where(~said, None)
    show_table(shown, counts=counts, decimals=decimals)
