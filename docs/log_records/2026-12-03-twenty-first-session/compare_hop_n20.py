"""The hop-level oracle at N = 20 (laptop_n20, seed 0) beside laptop's at N = 10, on the same 175 test questions:
Retrieval Only's trained agent reading, at each search, the passages of the retriever's top N that hold the current
hop's answer first (``agent_hop_oracle``), against the same agent reading the retriever's top K = 2. Paired
bootstrap, stratified by family, seed 0, as RESULTS.md. laptop's records: docs/log_records/2026-11-27-laptop-seed0-175/.

    .venv/bin/python docs/log_records/2026-12-03-twenty-first-session/compare_hop_n20.py   # from the repository root
"""
from pathlib import Path

import pandas as pd

from cosearch_lib.eval.tables import comparison_table

HERE = Path(__file__).parent
N10 = HERE.parent / "2026-11-27-laptop-seed0-175"
HOP, AFTER = "hop oracle: search_r1 agent", "search_r1: after GRPO"


def at(frame: pd.DataFrame, n: int) -> pd.DataFrame:
    return frame.assign(method=frame["method"] + f" @ N={n}")


n20 = pd.concat([pd.read_csv(HERE / "laptop_n20" / name) for name in ("03_eval_records.csv", "03_hop_oracle_records.csv")])
n10 = pd.concat([pd.read_csv(N10 / name) for name in ("03_eval_records.csv", "03_hop_oracle_records.csv")])
n10 = n10[n10["method"].isin([HOP, AFTER])]
columns = n20.columns.intersection(n10.columns)
both = pd.concat([at(n20[columns], 20), at(n10[columns], 10)], ignore_index=True)
pairs = [(f"{HOP} @ N=20", f"{AFTER} @ N=20"), (f"{HOP} @ N=10", f"{AFTER} @ N=10"),
         (f"{HOP} @ N=20", f"{HOP} @ N=10"), (f"{AFTER} @ N=20", f"{AFTER} @ N=10")]
table = comparison_table(both, pairs, seed=0)
table.to_csv(HERE / "laptop_n20" / "hop_oracle_comparisons.csv", index=False)
print(table.round(4).to_string())
searched = both[both["n_searches"] > 0]
hits = searched.groupby("method")[["ranker_hit@1", "n_searches"]].mean()
print(hits.round(3).to_string())
