"""laptop_n20's test comparisons from its evaluation parts (notebook 03 had not finished its evaluation cell), and
each method at N = 20 against laptop's own run at N = 10 on the same 175 test questions (laptop, seed 0,
docs/log_records/2026-11-27-laptop-seed0-175/). Paired bootstrap, stratified by family, seed 0, as RESULTS.md.

    .venv/bin/python docs/log_records/2026-12-02-nineteenth-session/compare_n20.py   # from the repository root
"""
from pathlib import Path

import pandas as pd

from cosearch_lib.eval.tables import comparison_table

HERE = Path(__file__).parent
n20 = pd.read_csv(HERE / "laptop_n20" / "03_eval_records.csv")
n10 = pd.read_csv(HERE.parent / "2026-11-27-laptop-seed0-175" / "03_eval_records.csv")
have = set(n20["method"])
pairs = [(a, b) for a, b in [("fixed_ranker: after GRPO", "search_r1: after GRPO"),
                             ("cosearch: after GRPO", "fixed_ranker: after GRPO"),
                             ("cosearch: after GRPO", "search_r1: after GRPO")] if {a, b} <= have]
tables = [comparison_table(n20, pairs, seed=0).assign(records="laptop_n20")]
for m in sorted(have):
    a, b = n20[n20.method == m].assign(method=f"{m} @ N=20"), n10[n10.method == m].assign(method=f"{m} @ N=10")
    both = pd.concat([a, b[a.columns.intersection(b.columns)]], ignore_index=True)
    tables.append(comparison_table(both, [(f"{m} @ N=20", f"{m} @ N=10")], seed=0).assign(records="laptop_n20, laptop"))
table = pd.concat(tables, ignore_index=True)
table.to_csv(HERE / "laptop_n20" / "comparisons.csv", index=False)
print(table.round(4).to_string())
