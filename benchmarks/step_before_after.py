"""Seconds of one or more CoSearch training steps with whichever ``cosearch_lib`` is importable.

Why: to compare two versions of the code at the same settings and seed, run this file against
each one (it uses only ``experiment.build_retriever / warm_start / build_trainer`` and the step
record, which both sides have), with the same profile file and the same cached world and warm start:

    git worktree add /tmp/before <old commit> && cp papermill_runs/params/demo.yaml /tmp/before/papermill_runs/params/
    (here=$PWD; cd /tmp/before && COSEARCH_DATA=$here/data PYTHONPATH=/tmp/before \\
        $here/.venv/bin/python $here/benchmarks/step_before_after.py demo 2)   # old code
    python benchmarks/step_before_after.py demo 2                               # this code

Prints one JSON line per step: rollout_s, update_s, step_s and a few outcome columns (the outcomes
show whether both sides sampled the same thing).

An option of one code version, off and on, side by side (``--set SECTION.FIELD=VALUE``, YAML values,
applied after the warm start so that it is shared):

    python benchmarks/step_before_after.py demo 2 --set training.shared_prefix_update=false
    python benchmarks/step_before_after.py demo 2 --set training.shared_prefix_update=true
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from cosearch_lib.config import load_profile
from cosearch_lib.experiment import build_retriever, build_trainer, warm_start
from cosearch_lib.run_schema import current_step_record

COLUMNS = ("step", "time/rollout_s", "time/update_s", "time/step_s", "rollout/agent_reward", "rollout/agent_f1",
           "ranker/hit@K", "rollout/searches_per_traj", "ranker/n_calls")


def apply_setting(cfg, assignment: str) -> None:
    """``SECTION.FIELD=VALUE`` on a loaded profile (the field must exist)."""
    path, _, value = assignment.partition("=")
    *parents, name = path.split(".")
    target = cfg
    for part in parents:
        target = getattr(target, part)
    if not _ or not hasattr(target, name):
        raise SystemExit(f"--set {assignment!r}: no field {path!r} in this code's profile")
    setattr(target, name, yaml.safe_load(value))


def main(argv: list[str]) -> None:
    settings = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
    positional = [a for i, a in enumerate(argv) if a != "--set" and (i == 0 or argv[i - 1] != "--set")]
    if len(positional) != 2:
        raise SystemExit("usage: step_before_after.py PROFILE STEPS [--set SECTION.FIELD=VALUE ...]")
    profile, steps = positional[0], int(positional[1])
    cfg = load_profile(profile)
    retriever = build_retriever(cfg, progress=False)
    warm = warm_start(cfg, retriever)
    for assignment in settings:
        apply_setting(cfg, assignment)
    trainer = build_trainer(cfg, retriever, warm=warm, method="cosearch", out_dir=Path(tempfile.mkdtemp()), steps=steps,
                            progress=False)
    for _ in range(steps):
        record = trainer.train_step()
        record = current_step_record(record)  # a commit before the namespaces wrote flat names
        print(json.dumps({k: record.get(k) for k in COLUMNS}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
