"""Does bf16 autocast change what GRPO learns? Retrieval Only's held-out curve trained under
``training.autocast`` (profile ``laptop_curve_bf16``) beside the same recipe's float32 run
(``laptop_curve``), both validated in float32 on the same 70 dev questions, greedy (issue 48, item 5).

It prints each run's curve with its 95% bootstrap interval, each run's end minus start (paired), and
bf16 minus float32 at every validation both runs made (paired over the same questions), and draws
the two curves into one figure. The float32 run's records default to the committed ones of its
16 steps (docs/LOG.md, 2026-11-29 eighth session):

    python benchmarks/bf16_curve.py
    python benchmarks/bf16_curve.py --float32 papermill_runs/laptop_curve/training/search_r1/validation.csv
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.eval.tables import comparison_table  # noqa: E402
from cosearch_lib.paths import project_root, run_dir  # noqa: E402
from cosearch_lib.records.training_runs import learning_curve_table, validation_curves  # noqa: E402
from cosearch_lib.run_schema import VALIDATION_FILE  # noqa: E402
from cosearch_lib.viz.plots import plot_validation_curves  # noqa: E402

FLOAT32_RECORD = Path("docs/log_records/2026-11-29-issue48-fourth-session/search_r1_validation.csv")
LABELS = {"float32": "Retrieval Only, float32", "bf16": "Retrieval Only, bf16 autocast"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--float32", default=str(FLOAT32_RECORD), help="the float32 run's validation.csv")
    ap.add_argument("--bf16", default=None, help="the bf16 run's validation.csv (default: laptop_curve_bf16's run folder)")
    ap.add_argument("--figure", default="figures/laptop_curve_bf16/bf16_vs_float32.png")
    args = ap.parse_args()
    root = project_root()
    bf16 = Path(args.bf16) if args.bf16 else run_dir("laptop_curve_bf16") / "training" / "search_r1" / VALIDATION_FILE
    frames = {tag: pd.read_csv(root / path if not Path(path).is_absolute() else path)
              for tag, path in (("float32", args.float32), ("bf16", bf16))}
    validation = pd.concat([f[f["method"] == "search_r1"].assign(method=LABELS[tag]) for tag, f in frames.items()],
                           ignore_index=True)
    agent = validation[validation["kind"] == "agent"]
    curves = validation_curves(agent)
    print("held-out avg F1 (70 dev questions, greedy, float32 validation), 95% bootstrap interval:")
    print(curves[["method", "x", "estimate", "ci_low", "ci_high", "n"]].to_string(index=False, float_format="%.3f"))
    print("\nend minus start, paired:")
    table = learning_curve_table(agent, list(LABELS.values()))
    print(table[["method", "families", "end_step", "start", "end", "diff", "ci_low", "ci_high", "n_questions"]]
          .to_string(index=False, float_format="%.3f"))
    shared = sorted(set.intersection(*(set(agent.loc[agent["method"] == m, "step"]) for m in LABELS.values())))
    labelled = agent.assign(method=agent["method"] + " @ " + (agent["step"] + 1).astype(str))
    pairs = [(f"{LABELS['bf16']} @ {s + 1}", f"{LABELS['float32']} @ {s + 1}") for s in shared]
    diffs = comparison_table(labelled, pairs, "f1")
    print("\nbf16 minus float32 at each shared validation, paired over the same questions:")
    print(diffs[["a", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "n_questions"]].to_string(index=False, float_format="%.3f"))
    fig = plot_validation_curves({"Retrieval Only: held-out avg F1": curves},
                                 title="bf16 autocast vs float32 (95% intervals)")
    out = root / args.figure
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"\nwrote {os.path.relpath(out, root)}")


if __name__ == "__main__":
    main()
