"""Real GRPO steps in float32, under bf16 autocast, and under autocast with the rollouts decoded on bf16 copies of
the weights, side by side: what ``training.autocast`` (and its ``bf16_weights``) buys and what it changes (issue 48,
item 5).

For each precision of ``--precisions`` it writes a profile that extends ``--profile`` (``training.autocast`` unset;
``{rollout, update}`` on; or also ``bf16_weights``; no validation), trains ``--steps`` steps of each method with
``cosearch train`` from the same cached starts (the warm start and the judge are trained in float32
either way), and prints per method and step the rollout and update seconds; their ratio per unit of
work (the two precisions sample different trajectories: milliseconds per generated agent token, and
per scored token the update trained, steps without an update left out); and what the
step records say of the numerics: the rollout's drift from the trainer (``loss/<role>_logp_drift_mean``
and ``_p99``, against ``training.autocast.max_drift``), the agent's reward and loss. The rows go to
``benchmarks/records/bf16_steps.csv`` with the CPU and the commit. Run it alone:

    python benchmarks/bf16_steps.py --profile laptop --methods search_r1,cosearch --steps 1

Rows written before ``bf16_weights`` existed have precisions float32 and bf16 only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.atomic_io import write_table  # noqa: E402
from cosearch_lib.config import AutocastConfig  # noqa: E402
from cosearch_lib.models.autocast import cpu_bf16_instructions  # noqa: E402
from cosearch_lib.paths import project_root, run_dir  # noqa: E402
from cosearch_lib.records.provenance import environment_snapshot  # noqa: E402
from cosearch_lib.run_schema import STEPS_FILE, step_table_under_current_names  # noqa: E402

RECORD = Path("benchmarks/records/bf16_steps.csv")
PRECISIONS = {"float32": None, "bf16": {"rollout": True, "update": True},
              "bf16_weights": {"rollout": True, "update": True, "bf16_weights": True}}
SHOWN = ["time/rollout_s", "time/update_s", "rollout/n_trajectories", "rollout/agent_generated_tokens",
         "loss/agent_n_tokens", "loss/ranker_n_tokens", "ranker/n_calls", "rollout/agent_reward", "loss/agent_loss", "loss/agent_logp_drift_mean",
         "loss/agent_logp_drift_p99", "loss/ranker_logp_drift_mean", "loss/ranker_logp_drift_p99",
         "rollout/searches_per_traj", "rollout/bf16", "loss/bf16"]


def _probe(base: str, tag: str, autocast: dict | None, folder: Path) -> tuple[str, Path]:
    """A profile extending ``base`` at one precision, without validation; (its name, its file)."""
    name = f"{Path(base).stem}_{tag}_probe"
    training = {"eval_every": 0, "validate_at_start": False, "autocast": autocast}  # None: float32, whatever base sets
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": base, "profile": name, "training": training}))
    return name, path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="laptop")
    ap.add_argument("--methods", default="search_r1,cosearch")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, float32 first: " + ", ".join(PRECISIONS))
    args = ap.parse_args()
    chosen = args.precisions.split(",")
    if chosen[0] != "float32" or not set(chosen) <= set(PRECISIONS):
        raise SystemExit(f"--precisions: float32 first, then some of {list(PRECISIONS)[1:]}; got {args.precisions!r}")
    root = project_root()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(f"CPU bf16 instructions: {cpu_bf16_instructions()}; bound on the drift: {AutocastConfig().max_drift}", flush=True)
    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for tag, autocast in ((t, PRECISIONS[t]) for t in chosen):
            name, path = _probe(args.profile, tag, autocast, Path(tmp))
            for method in args.methods.split(","):
                out = run_dir(name) / "training" / method
                shutil.rmtree(out, ignore_errors=True)  # a fresh run each time: the same steps, from the same starts
                cmd = [sys.executable, "-m", "cosearch_lib.cli", "train", "--profile", str(path), "--methods", method,
                       "--steps", str(args.steps), "--quiet"]
                start = time.perf_counter()
                subprocess.run(cmd, cwd=root, env=env, check=True)
                print(f"{tag} {method}: {time.perf_counter() - start:.0f} s with the model loads", flush=True)
                steps = step_table_under_current_names(pd.read_csv(out / STEPS_FILE))
                steps = steps[steps["step"] >= 0].assign(precision=tag, method=method)
                frames.append(steps[["precision", "method", "step", *[c for c in SHOWN if c in steps]]])
    table = pd.concat(frames, ignore_index=True)
    sha = str(environment_snapshot().get("git_sha", "?"))[:7]
    table = table.assign(profile=args.profile, threads=args.threads, cpu_bf16=cpu_bf16_instructions() or "none", git_sha=sha)
    print(table.drop(columns=["profile", "git_sha"]).T.to_string(header=False))
    # The two precisions sample different trajectories (and different groups with signal), so the
    # seconds are compared per unit of work: per generated agent token, and per scored token updated.
    table["rollout_ms_per_generated_token"] = 1e3 * table["time/rollout_s"] / (
        table["rollout/n_trajectories"] * table["rollout/agent_generated_tokens"])
    updated = table.filter(like="_n_tokens").fillna(0).sum(axis=1)
    table["update_ms_per_scored_token"] = (1e3 * table["time/update_s"] / updated).where(updated > 0)
    for method in args.methods.split(","):
        rates = table[table["method"] == method].groupby("precision")[
            ["rollout_ms_per_generated_token", "update_ms_per_scored_token"]].mean()
        for tag in chosen[1:]:
            ratio = rates.loc["float32"] / rates.loc[tag]
            print(f"{method}: float32 / {tag}, per token: rollout {ratio['rollout_ms_per_generated_token']:.2f}x "
                  f"(ms {rates.loc['float32', 'rollout_ms_per_generated_token']:.1f} -> {rates.loc[tag, 'rollout_ms_per_generated_token']:.1f}), "
                  f"update {ratio['update_ms_per_scored_token']:.2f}x (ms {rates.loc['float32', 'update_ms_per_scored_token']:.1f} -> "
                  f"{rates.loc[tag, 'update_ms_per_scored_token']:.1f}; steps without an update left out)")
    out = root / RECORD
    if out.exists():
        old = pd.read_csv(out)
        table = pd.concat([old[~(old["profile"].eq(args.profile) & old["method"].isin(args.methods.split(",")))], table],
                          ignore_index=True)
    write_table(table, out)
    print(f"wrote {os.path.relpath(out, root)}")


if __name__ == "__main__":
    main()
