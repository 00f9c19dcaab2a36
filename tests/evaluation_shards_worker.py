"""One rank of a sharded evaluation (experiment.evaluation_shards) in a gloo job, started by torchrun
from tests/test_evaluation_shards.py::

    python -m torch.distributed.run --nproc-per-node N tests/evaluation_shards_worker.py OUT [--stop-after K]

The evaluation is a scripted one: a record per question whose answer is derived from the question
id (what the harness's per-row seeds guarantee of a real one: the records do not depend on the
split). Each rank appends the ids it evaluated to OUT/evaluated-r<rank>.txt. ``--stop-after K``:
rank 1 raises after its K-th chunk (a job cut mid-evaluation); the other rank then fails at the
closing barrier, as a real job would. Rank 0 writes the whole evaluation to OUT/records.parquet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.harness import HarnessConfig
from cosearch_lib.experiment.evaluation_shards import evaluate_in_shards
from cosearch_lib.rl.data_parallel import DataParallel

QUESTIONS = [QAExample(id=f"q{i:02d}", question=f"question {i}?", golden_answers=[f"a{i}"],
                       data_source=("nq", "hotpotqa")[i % 2]) for i in range(23)]


def scripted_records(batch: list[QAExample]) -> pd.DataFrame:
    return pd.DataFrame([{"method": "agent_trained_ranker", "dataset": ex.data_source, "group": "single",
                          "question_id": ex.id, "sample": 0, "question": ex.question, "golds": ex.golden_answers,
                          "prediction": f"a{int(ex.id[1:]) * 7 % 5}", "f1": float(int(ex.id[1:]) % 3 == 0)}
                         for ex in batch])


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--stop-after", type=int)
    args = p.parse_args(argv)
    dp = DataParallel.from_environment(backend="gloo", timeout_s=60)
    chunks = 0

    def evaluate(batch):
        nonlocal chunks
        if args.stop_after is not None and dp.rank == 1 and chunks == args.stop_after:
            raise RuntimeError("rank 1 cut by its time limit")
        chunks += 1
        with open(args.out / f"evaluated-r{dp.rank}.txt", "a") as fh:
            fh.write("".join(f"{ex.id}\n" for ex in batch))
        return scripted_records(batch)

    records = evaluate_in_shards("cosearch: after GRPO", QUESTIONS, HarnessConfig(), evaluate, args.out / "parts",
                                 dp=dp, chunk=3, progress=False)
    if dp.is_main:
        records.to_parquet(args.out / "records.parquet")
    dp.close()


if __name__ == "__main__":
    main(sys.argv[1:])
