"""Tables and verdicts in a notebook: notes whole under the table, counts as integers, empty tables
say why, long lines break between words."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cosearch_lib.viz.notebook_display import print_wrapped, row_numbers_only, show_table, table_and_notes

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


def test_a_long_cell_is_shown_whole_not_cut_at_pandas_fifty_characters(capsys):
    methods = "direct, cot, rag, agent_retrieval, agent_fixed_ranker, agent_oracle"  # 69 characters
    table = pd.DataFrame({"value": [methods, "ci, 0"]}, index=pd.Index(["methods", "profile, seed"], name="setting"))
    show_table(table)
    out = capsys.readouterr().out
    assert methods in out and "..." not in out
    assert pd.get_option("display.max_colwidth") == 50  # the notebook's own setting is left as it was


def test_a_comparison_reads_out_its_rows_then_shows_them_without_saying_a_note_twice(capsys):
    from cosearch_lib.viz.notebook_display import show_comparison

    table = pd.DataFrame({"a": ["oracle", "cosearch"], "b": ["retrieval", "fixed"], "diff": [0.05, 0.0],
                          "ci_low": [0.01, np.nan], "ci_high": [0.09, np.nan], "p_le_0": [0.01, np.nan],
                          "n_questions": [140, 7], "n_families": [7, 7],
                          "note": ["two families of one question", "no spread to resample"]})
    table.attrs.update(metric="f1", statistic="macro", skipped=["search_r1 vs fixed: not trained"])
    show_comparison(table)
    out = " ".join(capsys.readouterr().out.split())  # the verdicts are wrapped between words
    assert "oracle - retrieval = +0.050" in out and "the interval excludes 0, oracle scores higher" in out
    assert out.count("no spread to resample") == 1  # in the verdict (no interval), not again under the table
    assert out.count("two families of one question") == 1  # a row with an interval: its note under the table
    assert "not compared: search_r1 vs fixed: not trained" in out
    show_comparison(table.iloc[:0], why_empty="no validation")
    assert capsys.readouterr().out.strip().endswith("no rows: no validation")


def test_float_columns_read_with_the_same_decimals_and_nan_stays_missing():
    table = pd.DataFrame({"syn_nq": [0.0, 0.5], "avg": [0.2857, np.nan], "f1 | answered": [0.28571, 0.0],
                          "rows": [13.0, np.nan], "method": ["rag", "agent_oracle"]})
    shown, _ = table_and_notes(table, counts=("rows",), decimals=1, column_decimals={"f1 | answered": 3, "avg": 3})
    assert shown["syn_nq"].tolist() == ["0.0", "0.5"] and shown["avg"].tolist() == ["0.286", "NaN"]
    assert shown["f1 | answered"].tolist() == ["0.286", "0.000"]
    assert shown["rows"].tolist() == [13, 0] and shown["method"].tolist() == ["rag", "agent_oracle"]  # counts and text untouched
    assert table_and_notes(table)[0]["syn_nq"].tolist() == [0.0, 0.5]  # without decimals: as given


def test_row_positions_are_not_shown_as_a_column_but_a_named_index_is(capsys):
    calls = pd.DataFrame({"sub_query": ["when was X founded", "who founded X"], "group": [-1, 0]}, index=[19, 20])
    assert row_numbers_only(calls) and row_numbers_only(calls.reset_index(drop=True))
    by_method = pd.DataFrame({"f1": [0.5]}, index=pd.Index(["rag"], name="method"))
    assert not row_numbers_only(by_method) and not row_numbers_only(calls.set_index("group"))
    show_table(calls)
    out = capsys.readouterr().out
    assert "when was X founded" in out and "19" not in out and "20" not in out
