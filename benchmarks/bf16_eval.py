"""The test evaluation in float32 and with bf16 copies of the weights (``evaluation.bf16_weights``), side by side:
what it buys and what it changes (issue 48, item 5; ``make demo``'s evaluations in notebooks 02 and 03 and its
grid cells).

It evaluates ``--methods`` (notebook 02's harness methods) with the profile's warm-started policies on the
first ``--n-per-dataset`` test questions of each family, greedy, in ABBA order (float32, bf16, bf16,
float32, ...) so that a drift of the machine falls on both, each from the same harness context (models
loaded once, one untimed question in each precision first). The retriever encodes its queries in float32
either way (``retrieval.encoder``). It prints per precision the evaluation's seconds (``run_evaluation``'s wall
time, the bf16 copies' making included), the ratio, and what bf16 changes: the share of questions whose prediction
is the same, the mean F1 of each, and the searches per question. Rows go to ``benchmarks/records/bf16_eval.csv``
with the CPU, the load average at the start, the commit and whether the tree had uncommitted changes (the rows
of ``bf16_mechanism`` "autocast" measured the setting's first mechanism, CPU bf16 autocast). Run it alone:

    python benchmarks/bf16_eval.py --profile demo --methods agent_retrieval,agent_fixed_ranker
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_record import append_rows, run_conditions  # noqa: E402
from cosearch_lib import experiment  # noqa: E402
from cosearch_lib.config import load_profile  # noqa: E402
from cosearch_lib.data.qa_formats import load_qa  # noqa: E402
from cosearch_lib.eval.harness import run_evaluation, select_examples  # noqa: E402
from cosearch_lib.models.autocast import cpu_bf16_instructions  # noqa: E402
from cosearch_lib.retrieval.artifacts import corpus_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "bf16_eval.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--methods", default="agent_retrieval,agent_fixed_ranker", help="comma-separated harness methods")
    ap.add_argument("--n-per-dataset", type=int, default=0, help="test questions per family (0: the profile's)")
    ap.add_argument("--repeats", type=int, default=1, help="ABBA pairs of evaluations")
    ap.add_argument("--record", default=str(RECORD))
    args = ap.parse_args()
    if cpu_bf16_instructions() is None:
        raise SystemExit("this CPU has no avx512_bf16 or AMX instructions: bf16 matmuls would be emulated (6-18x slower)")
    cfg = load_profile(args.profile)
    retriever = experiment.build_retriever(cfg, progress=False)
    ecfg = experiment.oracle_gap_config(cfg, args.methods, args.n_per_dataset)
    ecfg = experiment.with_policies(cfg, retriever, ecfg, "warmstart", progress=False)
    examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
    ctx = experiment.harness_context(cfg, retriever)
    env, load, dirty = run_conditions()
    order = [p for _ in range(args.repeats) for p in ("float32", "bf16", "bf16", "float32")]
    for bf16 in (False, True):  # untimed: adapter registration and each precision's first kernels
        run_evaluation(None, examples[:1], ctx, replace(ecfg, bf16=bf16), progress=False)
    runs, records = [], {}
    for run_i, precision in enumerate(order):
        start = time.perf_counter()
        got = run_evaluation(None, examples, ctx, replace(ecfg, bf16=precision == "bf16"), progress=False)
        runs.append({"precision": precision, "run": run_i, "wall_s": time.perf_counter() - start})
        records.setdefault(precision, got)  # greedy: every run of a precision gives the same records
    times = pd.DataFrame(runs).groupby("precision")["wall_s"].mean()
    f32, b16 = records["float32"], records["bf16"]
    tokens = {p: int(rec["n_generated_tokens"].sum()) for p, rec in records.items()}
    ms_token = {p: 1000 * times[p] / max(tokens[p], 1) for p in records}
    same = (f32["prediction"].fillna("").values == b16["prediction"].fillna("").values).mean()
    rows = []
    for precision, rec in records.items():
        rows.append({"profile": cfg.profile, "methods": args.methods, "precision": precision, "bf16_mechanism": "weights", "rows": len(rec),
                     "runs": int((pd.DataFrame(runs)["precision"] == precision).sum()), "wall_s": float(times[precision]),
                     "speedup": float(times["float32"] / times[precision]),
                     "generated_tokens": tokens[precision], "ms_per_token": float(ms_token[precision]),
                     "speedup_per_token": float(ms_token["float32"] / ms_token[precision]), "f1": float(rec["f1"].mean()),
                     "searches": float(rec["n_searches"].mean()), "same_prediction": float(same),
                     "cpu_bf16": cpu_bf16_instructions(), "threads": env.get("torch_threads"),
                     "loadavg_1min": round(load, 2), "git_sha": (env.get("git_sha") or "")[:7], "dirty": dirty})
    print(f"{cfg.profile}, {args.methods}: {len(f32)} rows each, {len(order) // 2} runs each; evaluation float32 "
          f"{times['float32']:.1f} s, bf16 {times['bf16']:.1f} s: {times['float32'] / times['bf16']:.2f}x; per generated token "
          f"{ms_token['float32']:.1f} and {ms_token['bf16']:.1f} ms: {ms_token['float32'] / ms_token['bf16']:.2f}x; "
          f"the same prediction in {same:.3f} of the rows; mean F1 float32 {f32['f1'].mean():.3f}, bf16 "
          f"{b16['f1'].mean():.3f}; searches per row {f32['n_searches'].mean():.2f} and {b16['n_searches'].mean():.2f}")
    print(f"load average at the start {load:.2f}; commit {(env.get('git_sha') or '')[:7]}"
          f"{' with uncommitted changes' if dirty else ''}")
    print(f"rows appended to {append_rows(pd.DataFrame(rows), args.record)}")


if __name__ == "__main__":
    main()
