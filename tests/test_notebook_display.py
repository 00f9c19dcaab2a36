"""Tables and verdicts in a notebook: notes whole under the table, counts as integers, empty tables
say why, long lines break between words."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cosearch_lib.viz.notebook_display import print_wrapped, show_table, table_and_notes

LONG = "the interval is too wide to read: 7 questions (stratified by family, one per family)"


def test_notes_move_under_the_table_whole_and_counts_are_integers():
    table = pd.DataFrame({"a": ["oracle", "cosearch"], "b": ["search_r1", "fixed_ranker"], "diff": [0.1, np.nan],
                          "n_questions": [7.0, np.nan], "note": [None, LONG]})
    shown, notes = table_and_notes(table, counts=("n_questions",))
    assert "note" not in shown and shown["n_questions"].tolist() == [7, 0] and shown["n_questions"].dtype.kind == "i"
    assert notes == [f"cosearch vs fixed_ranker: {LONG}"]  # whole, named by its pair
    by_label = pd.DataFrame({"x": [1, 2], "note": ["first note", ""]}, index=["avg", "multi-hop avg"])
    assert table_and_notes(by_label)[1] == ["avg: first note"]


def test_an_empty_table_says_why_and_long_lines_break_between_words(capsys):
    show_table(pd.DataFrame(columns=["a", "b"]), why_empty="no validation during training")
    show_table(None)
    assert capsys.readouterr().out.splitlines() == ["no rows: no validation during training", "no rows: nothing to show"]
    print_wrapped(["word " * 40 + "antidisestablishmentarianism"], width=50)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and all(len(line) <= 50 for line in lines[:-1])
    assert lines[-1].strip().endswith("antidisestablishmentarianism")  # not cut inside the word
    assert all(not line.endswith("-") for line in lines)
