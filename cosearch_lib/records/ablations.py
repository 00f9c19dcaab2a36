"""The paper's Tables 3 and 4 from the runs of a grid (``records.grid_cells``), with paired intervals.

Every cell of a grid ran notebook 03 on the same test questions with the same seed, so cells can be
compared question by question: its evaluation records (``03_eval_records.parquet`` in the cell's
folder, one row per policy x question) are stacked with a ``cell`` column and labelled
``"<cell>: <policy>"``, and ``eval.tables.comparison_table`` pairs any two labels.

* :func:`ablation_table` (Table 3): per cell, the trained CoSearch policy's avg F1 (single-hop,
  multi-hop, all), its difference to the reference cell (full CoSearch) with the paired 95% interval,
  and the paper's row and difference beside it;
* :func:`topk_table` (Table 4): per K (one cell each) and training method, the trained policy's avg F1
  with its interval, the paper's number beside it, and the paired CoSearch - Fixed Ranker difference.

A cell that has not finished contributes nothing; :func:`missing_cells` says which and how to run them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from cosearch_lib.config import load_profile
from cosearch_lib.config.methods import TRAINING_METHODS, method_spec
from cosearch_lib.eval.intervals import method_interval
from cosearch_lib.eval.paper_reference import paper_table
from cosearch_lib.eval.tables import AVG_COLUMNS, comparison_table, load_records, summary_table
from cosearch_lib.records.grid_cells import Grid, cell_config, cell_dir, cell_status

#: The evaluation records notebook 03 writes into a run folder.
EVAL_RECORDS = "03_eval_records.parquet"
#: The policy label of a trained method in notebook 03's records (experiment.BEFORE_AFTER_LABELS).
AFTER = "after GRPO"


def grid_records(base_profile: str | Path, grid: Grid) -> pd.DataFrame:
    """The evaluation records of every finished cell, ``method`` relabelled ``"<cell>: <policy>"``
    and the cell in a ``cell`` column (empty when no cell has finished)."""
    base = load_profile(base_profile)
    frames = []
    for cell in grid.cells:
        path = cell_dir(base, grid, cell) / EVAL_RECORDS
        if cell_status(base, grid, cell) == "done" and path.exists():
            records = load_records(path)
            frames.append(records.assign(cell=cell.name, policy=records["method"],
                                         method=cell.name + ": " + records["method"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["cell", "policy", "method"])


def missing_cells(base_profile: str | Path, grid: Grid) -> pd.DataFrame:
    """The cells without finished records: status and the command that runs them."""
    base = load_profile(base_profile)
    rows = []
    for cell in grid.cells:
        status = cell_status(base, grid, cell)
        if status != "done" or not (cell_dir(base, grid, cell) / EVAL_RECORDS).exists():
            rows.append({"cell": cell.name, "status": status,
                         "command": f"cosearch grid {grid.name} --profile {base_profile} --cells {cell.name}"})
    return pd.DataFrame(rows, columns=["cell", "status", "command"])


def _paper_rows(table: pd.DataFrame, key: str) -> dict[str, pd.Series]:
    return {str(row[key]): row for _, row in table.iterrows()}


def ablation_table(records: pd.DataFrame, grid: Grid, *, reference: str = "full", method: str = "cosearch",
                   seed: int = 0) -> pd.DataFrame:
    """Table 3: one row per finished cell (grid order). Columns: our ``single-hop avg``,
    ``multi-hop avg``, ``avg`` of the trained ``method``; ``diff``, ``ci_low``, ``ci_high``, ``p_le_0``
    of avg against the ``reference`` cell (paired, same questions); ``n_questions``; the paper's row
    (``paper row``, ``paper avg``, ``paper diff``: its avg minus its full model's) where the cell names one."""
    policy = f"{method}: {AFTER}"
    if records.empty:
        return pd.DataFrame()
    chosen = records[records["policy"] == policy]
    have = [c.name for c in grid.cells if c.name in set(chosen["cell"])]
    if not have:
        return pd.DataFrame()
    labels = [f"{c}: {policy}" for c in have]
    ours = summary_table(chosen, "f1", methods=labels)[list(AVG_COLUMNS)]
    ours.index = have
    ref_label = f"{reference}: {policy}"
    pairs = [(label, ref_label) for label in labels if label != ref_label] if reference in have else []
    paired = comparison_table(chosen, pairs, seed=seed).set_index("a") if pairs else pd.DataFrame()
    paper = _paper_rows(paper_table("table3"), "variant")
    paper_full = paper.get("full")
    rows = []
    for cell_name, label in zip(have, labels):
        row = {"cell": cell_name, **ours.loc[cell_name].to_dict()}
        if label in paired.index:
            row.update({k: paired.loc[label, k] for k in ("diff", "ci_low", "ci_high", "p_le_0", "n_questions")})
        paper_row = grid.cell(cell_name).paper
        if paper_row is not None and paper_row in paper:
            row.update({"paper row": paper_row, "paper avg": float(paper[paper_row]["avg"]),
                        "paper diff": float(paper[paper_row]["avg"] - paper_full["avg"]) if paper_full is not None else None})
        rows.append(row)
    table = pd.DataFrame(rows).set_index("cell")
    table.attrs = {"reference": reference, "method": method, "skipped": [] if reference in have else
                   [f"reference cell {reference!r} has not finished: no differences"]}
    return table


def topk_table(records: pd.DataFrame, ks: Mapping[str, int], methods: Sequence[str] = TRAINING_METHODS, *,
               seed: int = 0) -> pd.DataFrame:
    """Table 4: one row per (K, training method) with records: our trained policy's ``avg`` F1 with
    its family-stratified interval, the paper's avg at that K, and for CoSearch the paired
    ``CoSearch - Fixed Ranker`` difference with its interval (same cell, same questions).
    ``ks``: cell name -> K."""
    if records.empty:
        return pd.DataFrame()
    paper = paper_table("table4").set_index("k")
    rows = []
    for cell_name, k in sorted(ks.items(), key=lambda kv: kv[1]):
        part = records[records["cell"] == cell_name]
        for method in methods:
            label = f"{cell_name}: {method}: {AFTER}"
            if label not in set(part["method"]):
                continue
            ci = method_interval(part, label, seed=seed, when_too_few="note")
            row = {"K": k, "method": method, "avg": ci.estimate, "ci_low": ci.ci_low, "ci_high": ci.ci_high,
                   "n_questions": ci.n_questions,
                   "paper avg": float(paper.loc[k, method_spec(method).paper_name]) if k in paper.index else None}
            fixed = f"{cell_name}: fixed_ranker: {AFTER}"
            if method == "cosearch" and fixed in set(part["method"]):
                pair = comparison_table(part, [(label, fixed)], seed=seed).iloc[0]
                row.update({"vs fixed ranker": pair["diff"], "vs fixed ci_low": pair["ci_low"],
                            "vs fixed ci_high": pair["ci_high"]})
            rows.append(row)
    return pd.DataFrame(rows)


def cell_topk(base_profile: str | Path, grid: Grid) -> dict[str, int]:
    """Each cell's K (``search.topk`` of its settings, read without writing its profile file)."""
    return {cell.name: cell_config(base_profile, grid, cell).search.topk for cell in grid.cells}


def describe_missing(missing: pd.DataFrame) -> list[str]:
    """One sentence per missing cell, with the command that produces it."""
    return [f"cell {row.cell} ({row.status}): run `{row.command}`" for row in missing.itertuples()]
