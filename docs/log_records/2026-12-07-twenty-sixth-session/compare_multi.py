"""Issue 48's multi-hop-only probe (`laptop_curve_wide_multi`: laptop_curve_wide's Retrieval Only recipe trained on
the multi-hop families' questions alone) beside the committed `laptop_curve_wide` run (every family), over the steps
the probe completed: searches per trajectory, reward and signal per step, and the held-out F1 on the same 70 dev
questions of every family at each validation (greedy), with paired bootstrap intervals stratified by family (seed 0):
the probe minus the committed run at each validation, each run's end minus its start, overall and on the multi-hop
families; then, from the ranker calls, searches per trajectory and the second search's payoff by hop group.

    .venv/bin/python docs/log_records/2026-12-07-twenty-sixth-session/compare_multi.py   # from the repository root

Differences beside the training questions: the probe ran on a CPU without bf16 instructions, so its rollouts and
updates ran in float32 where the committed run's were under bf16 autocast (docs/LOG.md).
"""
from pathlib import Path

import pandas as pd

from cosearch_lib.config import load_profile
from cosearch_lib.data.qa_formats import question_sources
from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.eval.tables import comparison_table
from cosearch_lib.records.hop_signal import concat_hop_tables, run_hop_tables
from cosearch_lib.retrieval.artifacts import corpus_paths

HERE = Path(__file__).parent
BASELINE, PROBE = "every family", "multi-hop only"
RUNS = {PROBE: HERE / "search_r1_multi",
        BASELINE: HERE.parent / "2026-12-02-seventeenth-session" / "search_r1_wide_bf16_to_12"}
SHOWN = ["rollout/searches_per_traj", "rollout/agent_reward", "rollout/agent_best_of_g_f1",
         "rollout/agent_groups_without_signal", "rollout/agent_format_ok", "time/step_s"]

steps = {name: pd.read_csv(folder / "steps.csv") for name, folder in RUNS.items()}
last = int(steps[PROBE]["step"].max())
per_step = pd.concat({name: s[(s["step"] >= 0) & (s["step"] <= last)].set_index("step").reindex(columns=SHOWN)
                      for name, s in steps.items()}, axis=1).swaplevel(axis=1).sort_index(axis=1)
print(per_step.round(3).to_string())
per_step.to_csv(HERE / "multi_per_step.csv")
val = {name: pd.read_csv(folder / "validation.csv") for name, folder in RUNS.items()}
val = {name: v[(v["kind"] == "agent") & (v["step"] <= last)] for name, v in val.items()}
at = sorted(set.intersection(*(set(v["step"]) for v in val.values())))
records = pd.concat([v.assign(method=name + " @ " + v["step"].astype(str)) for name, v in val.items()], ignore_index=True)
pairs = [(f"{PROBE} @ {s}", f"{BASELINE} @ {s}") for s in at if s >= 0]
ends = [(f"{name} @ {at[-1]}", f"{name} @ {at[0]}") for name in val]
table = comparison_table(records, pairs + ends, seed=0)
multi = records[records["dataset"].map(hop_group) == "multi"]
table_multi = comparison_table(multi, pairs + ends, seed=0).assign(a=lambda t: t["a"] + " (multi-hop)")
out = pd.concat([table, table_multi], ignore_index=True)
out.to_csv(HERE / "multi_comparisons.csv", index=False)
print(out[["a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions"]].round(3).to_string())

cfg = load_profile("laptop_curve_wide")
data_source = question_sources(corpus_paths(cfg).qa[cfg.training.split])
tables = concat_hop_tables(run_hop_tables(pd.read_parquet(folder / "ranker_calls.parquet"), steps[name], data_source,
                                          method=name, seed=0, up_to_step=last) for name, folder in RUNS.items())
signal, second = tables["hop_signal"], tables["second_search"]
print(signal.round(3).to_string())
print(second.round(3).to_string())
signal.to_csv(HERE / "multi_hop_signal.csv", index=False)
second.to_csv(HERE / "multi_second_search.csv", index=False)
