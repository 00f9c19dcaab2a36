"""The paper's reported numbers (``data/paper_reference/*.csv``) in the shapes our tables have, so a
notebook can put a measured table beside the published one with a single call.

Method names differ: the evaluation harness says ``agent_retrieval``, the paper "Retrieval Only".
:data:`PAPER_METHOD` maps one to the other; tables here always use our ids as row labels.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cosearch_lib.eval.tables import AVG_COLUMNS
from cosearch_lib.paths import project_root

#: Our method id -> the paper's row name (Tables 2, 4, 7).
PAPER_METHOD = {
    "direct": "Direct",
    "cot": "CoT",
    "rag": "RAG",
    "agent_retrieval": "Retrieval Only",
    "agent_fixed_ranker": "Fixed Ranker",
    "agent_trained_ranker": "CoSearch",
    "agent_oracle": "Oracle",
}
TABLES = {
    "table1": "table1_oracle_gap.csv",
    "table2": "table2_main.csv",
    "table3": "table3_ablations.csv",
    "table4": "table4_topk.csv",
    "table7": "table7_search_turns.csv",
}
_AVG_CSV = {"single-hop avg": "single_hop_avg", "multi-hop avg": "multi_hop_avg", "avg": "avg"}


def reference_dir() -> Path:
    return project_root() / "data" / "paper_reference"


def paper_table(name: str) -> pd.DataFrame:
    """One transcribed table as stored (``"table1"``, ..., or a file name under data/paper_reference)."""
    path = reference_dir() / TABLES.get(name, name)
    if not path.exists():
        raise FileNotFoundError(f"no paper table {path}; known: {sorted(TABLES)}")
    return pd.read_csv(path)


def paper_oracle_gap(agent: str) -> pd.DataFrame:
    """Table 1 for the ``"7B"`` or ``"3B"`` agent, shaped like :func:`eval.tables.oracle_gap_table`:
    rows standard / oracle / relative gain %, columns single-hop avg, multi-hop avg, avg."""
    t1 = paper_table("table1")
    part = t1[t1["agent"] == agent].set_index("setting")
    if part.empty:
        raise ValueError(f"Table 1 has agents {sorted(t1['agent'].unique())}, not {agent!r}")
    table = part[list(_AVG_CSV.values())].rename(columns={v: k for k, v in _AVG_CSV.items()})
    table = table.loc[["standard", "oracle"]].astype(float)
    gain = (table.loc["oracle"] / table.loc["standard"] - 1) * 100
    table.loc["relative gain %"] = gain
    table.index.name = None
    return table


def oracle_gap_beside_paper(ours: pd.DataFrame, label: str, agents: tuple[str, ...] = ("3B", "7B")) -> pd.DataFrame:
    """Our Table 1 (from :func:`eval.tables.oracle_gap_table`) stacked above the paper's, with a
    ``source`` index level: ``label`` for ours, ``paper <agent>`` for each of ``agents``."""
    parts = {label: ours[list(AVG_COLUMNS)]}
    parts.update({f"paper {a}": paper_oracle_gap(a) for a in agents})
    return pd.concat(parts, names=["source", "row"])


def paper_turn_distribution() -> pd.DataFrame:
    """Table 7 (agent size not stated in our notes) with our method ids as rows (those we have), columns 0..6 and mean, like
    :func:`eval.tables.turn_distribution`."""
    t7 = paper_table("table7")
    back = {v: k for k, v in PAPER_METHOD.items()}
    table = t7.set_index(t7["method"].map(back)).drop(columns="method")
    table.columns = [int(c[1:]) if c.startswith("t") else c for c in table.columns]
    table.index.name = None
    return table


def turns_beside_paper(ours: pd.DataFrame, label: str) -> pd.DataFrame:
    """Our search-turn distribution above the paper's Table 7 (methods both have), ``source`` level first.
    Our columns are padded or folded to the paper's 0..6 so the two line up; our ``"no answer"``
    column stays (the paper reports none: its cells are NaN)."""
    paper = paper_turn_distribution()
    counts = [c for c in paper.columns if isinstance(c, int)]
    ours = ours.copy()
    top = max(counts)
    over = [c for c in ours.columns if isinstance(c, int) and c > top]
    if over:
        ours[top] = ours.get(top, 0.0) + ours[over].sum(axis=1)
        ours = ours.drop(columns=over)
    extra = [c for c in ours.columns if not isinstance(c, int) and c != "mean"]  # e.g. "no answer"
    ours = ours.reindex(columns=[*counts, *extra, "mean"], fill_value=0.0)
    shared = [m for m in ours.index if m in paper.index]
    return pd.concat({label: ours, "paper": paper.loc[shared]}, names=["source", "method"])
