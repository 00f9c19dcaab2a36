"""Evaluation at paper size (issue 47, break 5): sharded over a job's ranks, written in parts,
resumed after a cut with the questions no part holds, and the same records as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cosearch_lib.config import load_profile
from cosearch_lib.eval.harness import HarnessConfig
from cosearch_lib.experiment.evaluation_shards import evaluate_in_shards, evaluation_folder

from tests.evaluation_shards_worker import QUESTIONS, scripted_records

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "evaluation_shards_worker.py"


def _launch(out: Path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(WORKER), str(out), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _evaluated(out: Path) -> dict[int, list[str]]:
    return {r: (out / f"evaluated-r{r}.txt").read_text().split() for r in (0, 1) if (out / f"evaluated-r{r}.txt").exists()}


def test_one_process_evaluates_in_parts_and_a_stopped_run_resumes_with_the_rest(tmp_path):
    seen: list[str] = []

    def evaluate(batch):
        if len(seen) >= 9:
            raise KeyboardInterrupt  # stopped after three parts of three
        seen.extend(ex.id for ex in batch)
        return scripted_records(batch)

    with pytest.raises(KeyboardInterrupt):
        evaluate_in_shards("m: after GRPO", QUESTIONS, HarnessConfig(), evaluate, tmp_path, chunk=3, progress=False)
    assert len(list(evaluation_folder(tmp_path, "m: after GRPO", HarnessConfig()).glob("part-*.parquet"))) == 3
    first = list(seen)
    seen.clear()
    records = evaluate_in_shards("m: after GRPO", QUESTIONS, HarnessConfig(), lambda b: seen.extend(x.id for x in b)
                                 or scripted_records(b), tmp_path, chunk=3, progress=False)
    assert first == [q.id for q in QUESTIONS[:9]] and seen == [q.id for q in QUESTIONS[9:]]  # nothing twice
    pd.testing.assert_frame_equal(records, scripted_records(QUESTIONS))
    # other settings are another evaluation: nothing reused
    seen.clear()
    evaluate_in_shards("m: after GRPO", QUESTIONS[:4], HarnessConfig(temperature=0.7),
                       lambda b: seen.extend(x.id for x in b) or scripted_records(b), tmp_path, chunk=3, progress=False)
    assert seen == [q.id for q in QUESTIONS[:4]]


@pytest.mark.slow
def test_two_ranks_share_the_questions_and_a_cut_job_resumes_to_the_records_of_one_process(tmp_path):
    whole = _launch(tmp_path / "whole", 2)
    assert whole.returncode == 0, whole.stderr[-3000:]
    done = _evaluated(tmp_path / "whole")
    assert sorted(done[0] + done[1]) == [q.id for q in QUESTIONS] and abs(len(done[0]) - len(done[1])) <= 1
    expected = scripted_records(QUESTIONS)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "whole" / "records.parquet"), expected)

    cut = _launch(tmp_path / "cut", 2, "--stop-after", "1")  # rank 1 stops after its first part
    assert cut.returncode != 0 and "cut by its time limit" in cut.stderr + cut.stdout
    before = _evaluated(tmp_path / "cut")
    (tmp_path / "cut" / "evaluated-r0.txt").unlink()
    (tmp_path / "cut" / "evaluated-r1.txt").unlink()
    resumed = _launch(tmp_path / "cut", 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _evaluated(tmp_path / "cut")
    assert not set(before[0] + before[1]) & set(after[0] + after[1])  # no question evaluated twice
    assert sorted(before[0] + before[1] + after[0] + after[1]) == [q.id for q in QUESTIONS]
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "cut" / "records.parquet"), expected)


def test_the_paper_evaluates_every_question_of_the_test_splits():
    """The evaluation size is a profile setting (evaluation.n_per_dataset); the paper's: all of them."""
    assert load_profile("paper").evaluation.n_per_dataset is None
    assert load_profile("paper_mini").evaluation.n_per_dataset == 1
