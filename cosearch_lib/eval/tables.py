"""The paper's tables, built only from evaluation records (so they can be rebuilt from disk).

``summary_table`` (Table 2 layout: F1 per family and the single-hop / multi-hop / overall macro
averages), ``oracle_gap_table`` (Table 1), ``turn_distribution`` (Table 7),
``format_fail_breakdown``; ``save_records`` / ``load_records`` write and read the records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cosearch_lib.atomic_io import write_table
from cosearch_lib.eval.benchmark_families import hop_group, order_key
from cosearch_lib.eval.harness import RECORD_COLUMNS, _with_none

#: What the tables built from evaluation records show.
TABLE_GLOSSARY: dict[str, str] = {
    "avg F1 per family": "summary_table: mean answer F1 of a method's records per data_source, plus the single-hop, "
                         "multi-hop and overall macro averages (Table 2 layout)",
    "relative gain %": "oracle_gap_table (Table 1): (oracle F1 / standard F1 - 1) x 100; undefined when the standard F1 is 0",
    "search turns %": "turn_distribution (Table 7): share of a method's trajectories with 0, 1, 2, ... searches",
    "answered, f1 = 0 %": "format_fail_breakdown: share of rows that answered in the protocol but scored F1 0",
    "f1 | answered": "format_fail_breakdown: mean F1 of the rows that answered",
}

#: How a row ended, in the order the breakdown table shows them.
FINISH_ORDER = ("answer", "invalid", "max_searches", "max_tokens")
AVG_COLUMNS = ("single-hop avg", "multi-hop avg", "avg")


# --------------------------------------------------------------------------- tables


def _method_order(records: pd.DataFrame, methods: Sequence[str] | None) -> list[str]:
    return list(methods) if methods is not None else list(dict.fromkeys(records["method"]))


def question_counts(records: pd.DataFrame, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Distinct questions per method (rows) and dataset (columns, paper order)."""
    counts = records.groupby(["method", "dataset"])["question_id"].nunique().unstack("dataset")
    datasets = sorted(counts.columns, key=order_key)
    counts = counts.reindex(index=_method_order(records, methods), columns=datasets).fillna(0).astype(int)
    counts.columns.name = None
    return counts


def summary_table(records: pd.DataFrame, metric: str = "f1", methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean ``metric`` per method (rows, in the given or first-seen order) and dataset (columns, paper
    order), then the paper's macro averages over datasets: single-hop avg, multi-hop avg, avg.

    A question with several samples counts once (its samples are averaged first). Methods without
    records get a NaN row. ``attrs["n"]`` holds the question counts ({method: {dataset: n}}).
    """
    per_question = records.groupby(["method", "dataset", "question_id"])[metric].mean()
    table = per_question.groupby(["method", "dataset"]).mean().unstack("dataset")
    datasets = sorted(table.columns, key=order_key)
    table = table.reindex(index=_method_order(records, methods), columns=datasets).astype(float)
    for column, group in zip(AVG_COLUMNS, ("single", "multi", None)):
        chosen = [d for d in datasets if group is None or hop_group(d) == group]
        table[column] = table[chosen].mean(axis=1) if chosen else float("nan")
    table.columns.name = None
    table.attrs = {"metric": metric, "n": question_counts(records, table.index).to_dict(orient="index")}
    return table


def oracle_gap_table(records: pd.DataFrame, standard: str = "agent_retrieval", oracle: str = "agent_oracle",
                     metric: str = "f1") -> pd.DataFrame:
    """The paper's Table 1: rows standard / oracle / relative gain % ((oracle / standard - 1) * 100,
    NaN where standard is 0), columns single-hop avg, multi-hop avg, avg."""
    missing = [m for m in (standard, oracle) if m not in set(records["method"])]
    if missing:
        raise ValueError(f"no records for method(s) {missing}; have {sorted(set(records['method']))}")
    table = summary_table(records, metric, methods=[standard, oracle])[list(AVG_COLUMNS)]
    base, best = table.loc[standard], table.loc[oracle]
    gain = (best / base.where(base != 0) - 1) * 100
    out = pd.DataFrame([base, best, gain], index=["standard", "oracle", "relative gain %"])
    out.attrs = {"standard": standard, "oracle": oracle, "metric": metric}
    return out


def turn_distribution(records: pd.DataFrame, max_turns: int | None = None,
                      methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's Table 7: % of each method's rows with 0, 1, ..., T searches, and the mean.

    T is ``max_turns`` (rows with more searches count in column T) or else the largest count seen.
    Rows are (question, sample) pairs: with one sample, % of questions. Mean is of the raw counts.
    """
    turns = records["n_searches"].astype(int)
    top = max_turns if max_turns is not None else (int(turns.max()) if len(turns) else 0)
    table = pd.crosstab(records["method"], turns.clip(upper=top), normalize="index") * 100
    table = table.reindex(columns=range(top + 1), fill_value=0.0).reindex(_method_order(records, methods))
    table.columns.name = None
    table["mean"] = records.groupby("method")["n_searches"].mean()
    return table


def format_fail_breakdown(records: pd.DataFrame, by: str = "finish",
                          methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Why rows score what they score: % of each method's rows per finish reason (``by="error"``: per
    parser error code, "(none)" when no turn was malformed), then "answered, f1 = 0 %" (answered
    but wrong) and "f1 | answered" (mean F1 of the rows that gave a valid answer)."""
    table = pd.crosstab(records["method"], records[by].fillna("(none)"), normalize="index") * 100
    if by == "finish":
        table = table.reindex(columns=[*FINISH_ORDER, *sorted(set(table.columns) - set(FINISH_ORDER))], fill_value=0.0)
    table.columns.name = None
    answered = records["finish"] == "answer"
    table["answered, f1 = 0 %"] = (answered & (records["f1"] == 0)).groupby(records["method"]).mean() * 100
    table["f1 | answered"] = records[answered].groupby("method")["f1"].mean()
    return table.reindex(_method_order(records, methods))


# --------------------------------------------------------------------------- saving


def _json_cell(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value


def save_records(records: pd.DataFrame, out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.parquet`` and ``.csv`` atomically (list cells as JSON strings in the CSV)."""
    out = Path(out_dir)
    parquet = write_table(records, out / f"{name}.parquet")
    csv = write_table(records.apply(lambda col: col.map(_json_cell)) if len(records) else records, out / f"{name}.csv")
    return parquet, csv


def load_records(path: str | Path) -> pd.DataFrame:
    """Read records written by :func:`save_records` (parquet or CSV); ``golds`` come back as lists."""
    path = Path(path)
    if path.suffix == ".parquet":
        records = pd.read_parquet(path)
        records["golds"] = records["golds"].map(list)
    elif path.suffix == ".csv":
        # only empty cells are missing: an answer such as "NA" or "None" stays a string
        records = pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in RECORD_COLUMNS})
        records["golds"] = records["golds"].map(json.loads)
    else:
        raise ValueError(f"records path must end in .parquet or .csv, got {path}")
    return _with_none(records)
