"""The planner's bf16 model checked against steps trained under bf16 autocast, on the machine that measured
the factors (issue 48): each stage row's predicted seconds (``planning.stage_check.stage_errors``) at this
machine's float32 rates with the bf16 factors, and without them.

The committed CPU record's float32 figures may come from another machine (``benchmarks/records/
cpu_throughput.json``; its committed stage rows were measured there, and ``tests/test_job_plan.py`` checks
those). ``cpu_throughput.py --bf16`` also keeps the float32 rates it measured beside the factors: this script
plans with those, so that a bf16 run of this machine is predicted from this machine's figures.

    python benchmarks/stage_times.py --profile laptop_curve_bf16 --methods search_r1 --no-train --out rows.csv
    python benchmarks/bf16_stage_check.py rows.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosearch_lib.paths import project_root  # noqa: E402
from cosearch_lib.planning.stage_check import stage_errors  # noqa: E402
from cosearch_lib.planning.throughputs import CPU_RECORD, cpu_rates_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="stage rows (benchmarks/stage_times.py --out) of steps trained under bf16")
    ap.add_argument("--threads", default="2")
    args = ap.parse_args()
    record = json.loads((project_root() / CPU_RECORD).read_text())
    entry = record["by_threads"][args.threads]
    if "bf16" not in entry:
        raise SystemExit(f"{CPU_RECORD} has no bf16 factors at {args.threads} thread(s): run cpu_throughput.py --bf16 first")
    entry["policies"]["SmolLM2-135M"] = entry["bf16"]["float32"]  # the float32 rates measured beside the factors
    rates = cpu_rates_of(record, int(args.threads))
    rows = pd.read_csv(args.rows)
    for name, r in (("this machine's float32 x bf16 factors", rates), ("this machine's float32, no factors", replace(rates, bf16={}))):
        errors = stage_errors(rows, r)
        print(name)
        print(errors.groupby("stage")["error"].describe()[["count", "mean", "min", "max"]].round(2))


if __name__ == "__main__":
    main()
