"""Issue 48's recipe probes beside the committed `laptop_curve_wide` Retrieval Only run (sampled at 0.8, no KL
term), over the probes' steps: searches per trajectory, reward, KL and format per step, and the held-out F1 on the
same 70 dev questions at each validation (greedy), with paired bootstrap intervals stratified by family (seed 0,
as RESULTS.md): each probe minus the committed run at each validation, and each run's end minus its start,
overall and on the multi-hop families.

    .venv/bin/python docs/log_records/2026-12-04-twenty-fourth-session/compare_probes.py   # from the repository root

Probes: `kl=0.04` and `kl=0.5` (laptop_curve_wide_kl and laptop_curve_wide_kl05: a k3 KL term toward the warm
start, training.grpo.kl_reference: start, weights 0.04 and 0.5; the twenty-fourth session, kl=0.5 rerun in the
twenty-fifth), `lr=3e-4` (laptop_curve_wide_lr3e4: the agent's learning rate 3e-4 instead of 1e-4) and `seq-mean`
(laptop_curve_wide_seqmean: the loss aggregation seq-mean-token-mean instead of token-mean; both the twenty-fifth
session) and `t=1.0` (laptop_curve_wide_t1; the twenty-third session). A probe whose records are not here yet is
left out.
"""
from pathlib import Path

import pandas as pd

from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.eval.tables import comparison_table

HERE = Path(__file__).parent
LOGS = HERE.parent
BASELINE = "t=0.8"
RUNS = {"kl=0.04": HERE / "search_r1_kl", "kl=0.5": HERE / "search_r1_kl05", "lr=3e-4": HERE / "search_r1_lr3e4",
        "seq-mean": HERE / "search_r1_seqmean",
        "t=1.0": LOGS / "2026-12-04-twenty-third-session" / "search_r1_t1",
        BASELINE: LOGS / "2026-12-02-seventeenth-session" / "search_r1_wide_bf16_to_12"}
SHOWN = ["rollout/searches_per_traj", "rollout/agent_reward", "rollout/agent_f1", "rollout/agent_best_of_g_f1",
         "rollout/agent_groups_without_signal", "loss/agent_kl", "time/step_s"]

steps = {name: pd.read_csv(folder / "steps.csv") for name, folder in RUNS.items() if (folder / "steps.csv").exists()}
probes = [name for name in steps if name != BASELINE]
last = int(min(steps[name]["step"].max() for name in probes))
per_step = pd.concat({name: s[(s["step"] >= 0) & (s["step"] <= last)].set_index("step").reindex(columns=SHOWN)
                      for name, s in steps.items()}, axis=1).swaplevel(axis=1).sort_index(axis=1)
print(per_step.round(3).to_string())
val = {name: pd.read_csv(RUNS[name] / "validation.csv") for name in steps}
val = {name: v[(v["kind"] == "agent") & (v["step"] <= last)] for name, v in val.items()}
at = sorted(set.intersection(*(set(v["step"]) for v in val.values())))
records = pd.concat([v.assign(method=name + " @ " + v["step"].astype(str)) for name, v in val.items()], ignore_index=True)
pairs = [(f"{probe} @ {s}", f"{BASELINE} @ {s}") for probe in probes for s in at if s >= 0]
ends = [(f"{name} @ {at[-1]}", f"{name} @ {at[0]}") for name in val]
table = comparison_table(records, pairs + ends, seed=0)
multi = records[records["dataset"].map(hop_group) == "multi"]
table_multi = comparison_table(multi, ends, seed=0).assign(a=lambda t: t["a"] + " (multi-hop)")
out = pd.concat([table, table_multi], ignore_index=True)
out.to_csv(HERE / "probe_comparisons.csv", index=False)
print(out[["a", "b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions"]].round(3).to_string())

# By hop group, from the runs' ranker calls (records.hop_signal, as notebook 05): searches per trajectory and what a
# second search paid within a question's G rollouts, over each run's first 2 and last 2 steps of the probes' span.
from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.data.qa_formats import question_sources  # noqa: E402
from cosearch_lib.records.hop_signal import concat_hop_tables, run_hop_tables  # noqa: E402
from cosearch_lib.retrieval.artifacts import corpus_paths  # noqa: E402

cfg = load_profile("laptop_curve_wide")
data_source = question_sources(corpus_paths(cfg).qa[cfg.training.split])
tables = concat_hop_tables(run_hop_tables(pd.read_parquet(RUNS[name] / "ranker_calls.parquet"), steps[name], data_source,
                                          method=name, seed=0, up_to_step=last)
                           for name in steps if (RUNS[name] / "ranker_calls.parquet").exists())
signal, second = tables["hop_signal"], tables["second_search"]
print(signal.round(3).to_string())
print(second.round(3).to_string())
signal.to_csv(HERE / "probe_hop_signal.csv", index=False)
second.to_csv(HERE / "probe_second_search.csv", index=False)
