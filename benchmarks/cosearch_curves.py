"""CoSearch's held-out curves across the recipes issue 48 tried, by training questions rolled out: the agent's
avg F1 on the 70 dev questions and the LLM judge's Hit@1 on their gold sub-queries (greedy, float32
validation, 95% family-stratified bootstrap intervals), end minus start paired over the same items, and a
two-panel figure.

Each recipe is a (validation.csv, steps.csv) pair: a run folder's or a committed copy. By default:

* ``laptop_curve``: 12 questions x G = 8 per step, 4 optimizer steps each, float32 (eighth session, to 12 steps);
* ``laptop_curve_wide, float32``: 24 questions x G = 8 per step, 8 optimizer steps each (thirteenth session, 4 steps);
* ``laptop_curve_wide, bf16``: the same under ``training.autocast`` (this run folder, or ``--wide-bf16 DIR``).

    python benchmarks/cosearch_curves.py
    python benchmarks/cosearch_curves.py --wide-bf16 docs/log_records/2026-12-01-fifteenth-session/cosearch_wide_bf16
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.paths import project_root, run_dir  # noqa: E402
from cosearch_lib.records.training_runs import learning_curve_table, validation_curves  # noqa: E402
from cosearch_lib.run_schema import STEPS_FILE, VALIDATION_FILE, step_table_under_current_names  # noqa: E402
from cosearch_lib.viz.plots import plot_validation_curves  # noqa: E402

RECORDS = Path("docs/log_records")
RECIPES = {
    "laptop_curve (12 q/step, float32)": (RECORDS / "2026-11-29-issue48-fourth-session" / "cosearch_validation_to_12.csv",
                                          RECORDS / "2026-11-29-issue48-fourth-session" / "cosearch_steps_to_12.csv"),
    "wide (24 q/step, float32)": (RECORDS / "2026-11-29-thirteenth-session" / "cosearch_wide_validation.csv",
                                  RECORDS / "2026-11-29-thirteenth-session" / "cosearch_wide_steps.csv"),
}
WIDE_BF16 = "wide (24 q/step, bf16)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wide-bf16", default=None, help="folder with the bf16 wide run's validation.csv and steps.csv "
                                                      "(default: laptop_curve_wide's run folder)")
    ap.add_argument("--figure", default="figures/laptop_curve_wide/cosearch_curves.png")
    args = ap.parse_args()
    root = project_root()
    wide = Path(args.wide_bf16) if args.wide_bf16 else run_dir("laptop_curve_wide") / "training" / "cosearch"
    recipes = {**{k: (root / v, root / s) for k, (v, s) in RECIPES.items()},
               WIDE_BF16: (wide / VALIDATION_FILE, wide / STEPS_FILE)}
    validation, steps = [], []
    for label, (val_file, steps_file) in recipes.items():
        validation.append(pd.read_csv(val_file).query("method == 'cosearch'").assign(method=label))
        steps.append(step_table_under_current_names(pd.read_csv(steps_file)).query("method == 'cosearch'").assign(method=label))
    validation, steps = pd.concat(validation, ignore_index=True), pd.concat(steps, ignore_index=True)
    panels = {}
    for kind, title in (("agent", "CoSearch agent: held-out avg F1"), ("ranker", "LLM judge: held-out Hit@1")):
        curves = validation_curves(validation, kind=kind, steps=steps)
        panels[title] = curves
        print(f"{title} (the validation items; 95% bootstrap interval), x = steps completed, with the training questions rolled out:")
        print(curves[["method", "x", "questions", "estimate", "ci_low", "ci_high", "n"]].to_string(index=False, float_format="%.3f"))
        table = learning_curve_table(validation, list(recipes), kind=kind)
        print("end minus start, paired over the same items:")
        print(table[["method", "families", "end_step", "start", "end", "diff", "ci_low", "ci_high", "n_questions"]]
              .to_string(index=False, float_format="%.3f"), end="\n\n")
    fig = plot_validation_curves(panels, title="CoSearch's held-out curves by recipe (95% intervals)")
    out = root / args.figure
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    print(f"wrote {os.path.relpath(out, root)}")


if __name__ == "__main__":
    main()
