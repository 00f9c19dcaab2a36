"""The paper's tables, built only from evaluation records (so they can be rebuilt from disk).

``summary_table`` (Table 2 layout: F1 per family and the single-hop / multi-hop / overall macro
averages), ``oracle_gap_table`` (Table 1) and its paired bootstrap intervals
``oracle_gap_intervals``, ``comparison_table`` (paired bootstrap of method pairs, ``eval.intervals``),
``turn_distribution`` (Table 7), ``format_fail_breakdown``; ``save_records`` / ``load_records``
write and read the records.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cosearch_lib.atomic_io import write_table
from cosearch_lib.data.qa_formats import QAExample, gold_chain
from cosearch_lib.eval.benchmark_families import hop_group, order_key
from cosearch_lib.eval.harness import missing_as_none
from cosearch_lib.eval.intervals import LEVEL, N_RESAMPLES, compare_methods, method_interval, questions_for_power
from cosearch_lib.run_schema import under_current_names

#: What the tables built from evaluation records show.
TABLE_GLOSSARY: dict[str, str] = {
    "avg F1 per family": "summary_table: mean answer F1 of a method's records per data_source, plus the single-hop, "
                         "multi-hop and overall macro averages (Table 2 layout)",
    "relative gain %": "oracle_gap_table (Table 1): (oracle F1 / standard F1 - 1) x 100; undefined when the standard F1 is 0",
    "search turns %": "turn_distribution (Table 7): share of a method's trajectories with 0, 1, 2, ... searches",
    "answered, f1 = 0 %": "format_fail_breakdown: share of rows that answered in the protocol but scored F1 0",
    "f1 | answered": "format_fail_breakdown: mean F1 of the rows that answered",
    "a, b": "comparison_table: the two methods compared, as a - b, on the questions both were evaluated on",
    "mean_a, mean_b": "comparison_table: each method's statistic over those questions (default: macro avg over "
                      "families, the paper's avg; a question's samples averaged first)",
    "diff": "comparison_table, oracle_gap_intervals: a - b (oracle - standard) of that statistic",
    "ci_low, ci_high": "comparison_table, oracle_gap_intervals: percentile interval (default 95%) of diff over "
                       "2000 paired bootstrap resamples of the questions, stratified by family (eval.intervals); "
                       "empty when a family has fewer than 2 questions (see note)",
    "p_le_0": "comparison_table, oracle_gap_intervals: share of resamples where diff <= 0 (one-sided)",
    "n_questions": "comparison_table, oracle_gap_intervals: questions in the comparison (each counted once)",
    "n_families": "comparison_table, oracle_gap_intervals: families (data_source) those questions come from",
    "note": "comparison_table, oracle_gap_intervals: why there is no interval; empty when there is one",
    "standard, oracle": "oracle_gap_intervals: each setting's F1 in the hop group (the oracle_gap_table value)",
    "standard_ci_low, standard_ci_high": "oracle_gap_intervals: bootstrap interval of the standard F1 alone "
                                         "(same resamples as diff)",
    "oracle_ci_low, oracle_ci_high": "oracle_gap_intervals: bootstrap interval of the oracle F1 alone",
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


#: Columns of :func:`comparison_table`.
COMPARISON_COLUMNS = ("a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_le_0", "n_questions", "n_families",
                      "note")


def _paired_columns(records: pd.DataFrame, a: str, b: str, metric: str, settings: dict[str, Any]) -> dict[str, Any]:
    pair = compare_methods(records, a, b, metric=metric, when_too_few="note", **settings)
    return {"mean_a": pair.estimate_a, "mean_b": pair.estimate_b, "diff": pair.diff, "ci_low": pair.ci_low,
            "ci_high": pair.ci_high, "p_le_0": pair.p_le_0, "n_questions": pair.n_questions,
            "n_families": pair.n_families, "note": pair.note}


def comparison_table(records: pd.DataFrame, pairs: Sequence[tuple[str, str]], metric: str = "f1", *,
                     statistic: str = "macro", level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0,
                     skip_missing: bool = False) -> pd.DataFrame:
    """One row per (a, b) pair: paired bootstrap of a - b over the questions (``eval.intervals``),
    columns :data:`COMPARISON_COLUMNS`. Every pair draws the same resamples when their questions
    are the same (one seed). A pair whose methods cover different questions raises ValueError; a
    family with fewer than 2 questions leaves the interval empty and says so in ``note``.

    A method without records raises ValueError, or with ``skip_missing`` leaves its pair out and
    lists it in ``attrs["skipped"]``. ``attrs`` also hold metric, statistic, level, n_resamples and
    seed (what :func:`eval.intervals.verdicts` reads)."""
    settings = {"statistic": statistic, "level": level, "n_resamples": n_resamples, "seed": seed}
    have = set(records["method"])
    rows, skipped = [], []
    for a, b in pairs:
        missing = [m for m in (a, b) if m not in have]
        if missing and not skip_missing:
            raise ValueError(f"no records for method(s) {missing}; have {sorted(have)}")
        if missing:
            skipped.append(f"{a} vs {b} (no records for {', '.join(missing)})")
            continue
        rows.append({"a": a, "b": b, **_paired_columns(records, a, b, metric, settings)})
    table = pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))
    table.attrs = {"metric": metric, **settings, "skipped": skipped}
    return table


def power_table(records: pd.DataFrame, pairs: Sequence[tuple[str, str]], metric: str = "f1", *, power: float = 0.8,
                level: float = LEVEL) -> pd.DataFrame:
    """One row per (a, b) pair present in ``records``: the macro difference measured and the test
    questions a paired comparison needs to show a difference that large with probability ``power``
    (``eval.intervals.questions_for_power``): ``a``, ``b``, ``diff``, ``n_questions`` (measured on),
    ``per_family``, ``questions_needed``. A pair whose families hold fewer than 2 questions is left out."""
    have, rows = set(records["method"]), []
    for a, b in pairs:
        if a not in have or b not in have:
            continue
        try:
            need = questions_for_power(records, a, b, metric=metric, power=power, level=level)
        except ValueError:  # too few questions per family to estimate the variance
            continue
        rows.append({"a": a, "b": b, "diff": need["diff"], "n_questions": need["n_questions"],
                     "per_family": need["per_family"], "questions_needed": need["questions"]})
    table = pd.DataFrame(rows, columns=["a", "b", "diff", "n_questions", "per_family", "questions_needed"])
    table.attrs = {"metric": metric, "power": power, "level": level}
    return table


def oracle_gap_intervals(records: pd.DataFrame, standard: str = "agent_retrieval", oracle: str = "agent_oracle",
                         metric: str = "f1", *, level: float = LEVEL, n_resamples: int = N_RESAMPLES,
                         seed: int = 0) -> pd.DataFrame:
    """Intervals for :func:`oracle_gap_table`: per row (single-hop avg, multi-hop avg, avg), the
    paired bootstrap of oracle - standard over that group's questions (``diff``, ``ci_low``,
    ``ci_high``, ``p_le_0``, ...) and each setting's own interval (``standard_ci_low``, ...), all
    from the same family-stratified resamples. A group without questions is a NaN row with a note."""
    missing = [m for m in (standard, oracle) if m not in set(records["method"])]
    if missing:
        raise ValueError(f"no records for method(s) {missing}; have {sorted(set(records['method']))}")
    settings = {"statistic": "macro", "level": level, "n_resamples": n_resamples, "seed": seed}
    rows = {}
    groups = records["dataset"].map(hop_group)
    for column, group in zip(AVG_COLUMNS, ("single", "multi", None)):
        part = records if group is None else records[groups == group]
        if not part["method"].isin([standard, oracle]).any():
            rows[column] = {"n_questions": 0, "n_families": 0, "note": f"no {group}-hop questions"}
            continue
        row = _paired_columns(part, oracle, standard, metric, settings)
        row["oracle"], row["standard"] = row.pop("mean_a"), row.pop("mean_b")
        for setting, name in (("standard", standard), ("oracle", oracle)):
            alone = method_interval(part, name, metric=metric, when_too_few="note", **settings)
            row[f"{setting}_ci_low"], row[f"{setting}_ci_high"] = alone.ci_low, alone.ci_high
        rows[column] = row
    columns = ["standard", "standard_ci_low", "standard_ci_high", "oracle", "oracle_ci_low", "oracle_ci_high",
               *COMPARISON_COLUMNS[4:]]
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(index=list(AVG_COLUMNS), columns=columns)
    table.attrs = {"a": oracle, "b": standard, "metric": metric, **settings}
    return table


#: The column of :func:`turn_distribution` for rows that never gave an answer.
NO_ANSWER = "no answer"


def turn_distribution(records: pd.DataFrame, max_turns: int | None = None,
                      methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's Table 7: % of each method's rows answered after 0, 1, ..., T searches, then
    ``"no answer"`` (% of rows that ended without a valid answer: broken protocol, search cap, token
    budget; they are not "answered after n searches"), and the mean number of searches of all rows.

    T is ``max_turns`` (rows with more searches count in column T) or else the largest count seen.
    Rows are (question, sample) pairs: with one sample, % of questions. The columns sum to 100.
    """
    if "finish" not in records:
        raise ValueError("turn_distribution needs the records' 'finish' column (eval.harness records have it)")
    turns = records["n_searches"].astype(int)
    top = max_turns if max_turns is not None else (int(turns.max()) if len(turns) else 0)
    answered = records["finish"] == "answer"
    column = turns.clip(upper=top).astype(object).where(answered, NO_ANSWER)
    table = pd.crosstab(records["method"], column, normalize="index") * 100
    table = table.reindex(columns=[*range(top + 1), NO_ANSWER], fill_value=0.0).reindex(_method_order(records, methods))
    table.columns.name = None
    table["mean"] = records.groupby("method")["n_searches"].mean()
    return table


#: The row of :func:`searches_by_family` that holds the gold chains' lengths.
GOLD_CHAIN_ROW = "gold chain (hops)"


def searches_by_family(records: pd.DataFrame, examples: Sequence[QAExample] = (),
                       methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean searches per trajectory of each method in each family, then the hop groups' and overall
    macro averages (the layout of Table 2, the counts of Table 7). With ``examples`` (questions with
    gold chains: the embedded world), a first row holds each family's mean chain length: the
    searches a question needs."""
    table = summary_table(records.assign(n_searches=records["n_searches"].astype(float)), "n_searches", methods)
    chains = [(ex.data_source, len(chain)) for ex in examples if (chain := gold_chain(ex))]
    if chains:
        hops = pd.DataFrame(chains, columns=["dataset", "n_searches"]).assign(
            method=GOLD_CHAIN_ROW, question_id=range(len(chains)))
        gold = summary_table(hops, "n_searches").reindex(columns=table.columns)
        table = pd.concat([gold, table])
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
    """Read records written by :func:`save_records` (parquet or CSV); ``golds`` come back as lists, and
    methods renamed since they were written under today's names (``run_schema.under_current_names``)."""
    path = Path(path)
    if path.suffix == ".parquet":
        records = pd.read_parquet(path)
        records["golds"] = records["golds"].map(list)
    elif path.suffix == ".csv":
        # only empty cells are missing: an answer such as "NA" or "None" stays a string
        records = pd.read_csv(path, keep_default_na=False, na_values=[""])
        records["golds"] = records["golds"].map(json.loads)
    else:
        raise ValueError(f"records path must end in .parquet or .csv, got {path}")
    return missing_as_none(under_current_names(records))
