"""The temperature probe (`laptop_curve_wide_t1`: Retrieval Only sampled at 1.0) beside the committed
`laptop_curve_wide` Retrieval Only run (sampled at 0.8), over the probe's steps: searches per trajectory, reward and
format per step, and the held-out F1 on the same 70 dev questions at each validation (greedy), with paired
bootstrap intervals stratified by family (seed 0, as RESULTS.md): the probe minus the committed run at each step,
and each run's end minus its start, overall and on the multi-hop families.

    .venv/bin/python docs/log_records/2026-12-04-twenty-third-session/compare_t1.py   # from the repository root
"""
from pathlib import Path

import pandas as pd

from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.eval.tables import comparison_table

HERE = Path(__file__).parent
RUNS = {"t=1.0": HERE / "search_r1_t1", "t=0.8": HERE.parent / "2026-12-02-seventeenth-session" / "search_r1_wide_bf16_to_12"}
SHOWN = ["rollout/searches_per_traj", "rollout/agent_reward", "rollout/agent_format_ok", "rollout/agent_f1",
         "rollout/agent_best_of_g_f1", "rollout/agent_groups_without_signal", "time/step_s"]

steps = {name: pd.read_csv(folder / "steps.csv") for name, folder in RUNS.items()}
last = int(steps["t=1.0"]["step"].max())
per_step = pd.concat({name: s[(s["step"] >= 0) & (s["step"] <= last)].set_index("step")[SHOWN] for name, s in steps.items()},
                     axis=1).swaplevel(axis=1).sort_index(axis=1)
print(per_step.round(3).to_string())
val = {name: pd.read_csv(folder / "validation.csv") for name, folder in RUNS.items()}
val = {name: v[(v["kind"] == "agent") & (v["step"] <= last)] for name, v in val.items()}
at = sorted(set(val["t=1.0"]["step"]) & set(val["t=0.8"]["step"]))
records = pd.concat([v.assign(method=name + " @ " + v["step"].astype(str)) for name, v in val.items()], ignore_index=True)
pairs = [(f"t=1.0 @ {s}", f"t=0.8 @ {s}") for s in at if s >= 0]
ends = [(f"{name} @ {at[-1]}", f"{name} @ {at[0]}") for name in RUNS]
table = comparison_table(records, pairs + ends, seed=0)
multi = records[records["dataset"].map(hop_group) == "multi"]
table_multi = comparison_table(multi, ends, seed=0).assign(a=lambda t: t["a"] + " (multi-hop)")
out = pd.concat([table, table_multi], ignore_index=True)
out.to_csv(HERE / "t1_comparisons.csv", index=False)
print(out[["a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions"]].round(3).to_string())
