"""Stage times of real training steps, what ``cosearch plan`` is checked against on CPU.

Runs ``cosearch train --profile P --methods M --steps S`` (the library's own training, its warm start
and ranker from the cache or built first, outside the timed steps), then copies each step's stage
times and the behaviour the planner cannot know in advance (searches per trajectory, tokens generated
and read per trajectory, groups without signal, ranker calls) from the run's ``steps.csv`` into
``benchmarks/records/stage_times.csv``, one row per (profile, method, step), with the machine's CPU
and the commit. ``tests/test_job_plan.py`` predicts each committed row's stages with the planner
(``planning.stage_check``) and fails outside +-30%.

Run it alone (a second busy process doubles the times):

    python benchmarks/stage_times.py --profile ci --methods search_r1,cosearch
    python benchmarks/stage_times.py --profile demo --methods search_r1,cosearch --steps 2
    python benchmarks/stage_times.py --profile laptop --methods search_r1,cosearch --steps 2

Rows of the same profile and method are replaced; the others are kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.atomic_io import write_table  # noqa: E402
from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.paths import project_root, run_dir  # noqa: E402
from cosearch_lib.planning.stage_check import RECORD_COLUMNS, STAGE_RECORD  # noqa: E402
from cosearch_lib.records.provenance import cpu_model, environment_snapshot  # noqa: E402
from cosearch_lib.run_schema import RANKER_CALLS_FILE, STEPS_FILE, VALIDATION_FILE, step_table_under_current_names  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--methods", default="search_r1,cosearch")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the profile's)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the run (OMP_NUM_THREADS)")
    ap.add_argument("--out", default=None, help=f"record to update (default: {STAGE_RECORD})")
    ap.add_argument("--no-train", action="store_true", help="only read the profile's last training run into the record")
    args = ap.parse_args()
    cfg = load_profile(args.profile)
    root = project_root()
    cmd = [sys.executable, "-m", "cosearch_lib.cli", "train", "--profile", args.profile, "--methods", args.methods, "--quiet"]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print("$", " ".join(cmd), f"(OMP_NUM_THREADS={args.threads})", flush=True)
    if not args.no_train:
        start = time.perf_counter()
        subprocess.run(cmd, cwd=root, env=env, check=True)
        print(f"trained in {time.perf_counter() - start:.0f} s", flush=True)
    sha = environment_snapshot().get("git_sha", "?")
    rows = []
    for method in args.methods.split(","):
        steps = step_table_under_current_names(pd.read_csv(run_dir(cfg.profile) / "training" / method / STEPS_FILE))
        steps = steps[steps["step"] >= 0].tail(args.steps or cfg.training.steps)
        val_file = run_dir(cfg.profile) / "training" / method / VALIDATION_FILE
        calls = pd.read_parquet(run_dir(cfg.profile) / "training" / method / RANKER_CALLS_FILE)
        # the rollout's batched rounds: the turns of the step's longest trajectory (its searches + the answer)
        rounds = (calls.groupby(["step", "traj_id"]).size().groupby("step").max() + 1).to_dict() if len(calls) else {}
        # the candidate lists the ranker's update scored: a scoring ranker scores a repeated list once
        trained = calls[calls["advantage"] != 0] if "advantage" in calls else calls.iloc[:0]
        lists = trained.groupby("step")["sub_query"].nunique().to_dict() if len(trained) else {}
        val = pd.read_csv(val_file) if val_file.exists() else pd.DataFrame(columns=["step", "kind"])
        for _, row in steps.iterrows():
            at = val[val["step"] == row["step"]]
            counts = {"rollout_rounds": rounds.get(row["step"], 1), "ranker_lists_trained": lists.get(row["step"], 0),
                      "val_agent_questions": int((at["kind"] == "agent").sum()) or float("nan"),
                      "val_ranker_items": int((at["kind"] == "ranker").sum()) or float("nan")}
            rows.append({"profile": args.profile, "method": method, "threads": args.threads, "cpu": cpu_model(),
                         "git_sha": str(sha)[:7],
                         **{c: row.get(c, float("nan")) for c in RECORD_COLUMNS}, **counts})
    new = pd.DataFrame(rows)
    out = Path(args.out) if args.out else root / STAGE_RECORD
    if out.exists():
        old = pd.read_csv(out)
        keep = ~(old["profile"].eq(args.profile) & old["method"].isin(args.methods.split(",")))
        new = pd.concat([old[keep], new], ignore_index=True)
    write_table(new, out)
    print(new[new["profile"] == args.profile][["profile", "method", "step", *[c for c in RECORD_COLUMNS if c.startswith("time/")]]]
          .to_string(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
