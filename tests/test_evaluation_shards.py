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


def test_notebook_02s_evaluation_in_parts_gives_the_records_of_one_pass_and_a_rerun_only_reads_them(tok, chat, tmp_path):
    """Notebook 02 keeps its evaluation in parts (experiment.evaluate_policies): several methods, the
    questions in chunks, the records in method order as one run_evaluation gives them; the
    trajectories of what was evaluated here come back for the browser; a second run with the same
    settings evaluates nothing (what the notebook does after `cosearch evaluate`)."""
    from cosearch_lib.eval.harness import run_evaluation
    from cosearch_lib.experiment import evaluate_policies
    from cosearch_lib.experiment.evaluation_shards import context_key

    from tests.doubles import answer_turn, search_turn
    from tests.test_evaluation import Q1, Q2, make_ctx, small_cfg

    q3 = Q1.__class__(id="q3", question="Who wrote atlases?", golden_answers=["Tellis"], data_source="syn_nq")

    def respond(prompt, key):
        if key[0] in ("direct", "cot", "rag"):
            return "<answer>Kessmere</answer>"
        return search_turn(f"about {key[2]}", reason="I look it up.") if key[-1] == 0 else answer_turn("Kessmere")

    methods = ("direct", "agent_retrieval", "agent_oracle")
    cfg = small_cfg(methods=methods)
    ctx, backend = make_ctx(tok, chat, respond)
    whole = run_evaluation(None, [Q1, Q2, q3], ctx, cfg, progress=False)
    kept: dict = {}
    ctx, backend = make_ctx(tok, chat, respond)
    parts = tmp_path / "evaluation"  # two chunks: q1, q2 then q3
    records = evaluate_policies([Q1, Q2, q3], ctx, cfg, parts=parts, progress=False, trajectories=kept, chunk=2)
    folder = evaluation_folder(parts, "oracle gap study", cfg, context_key(ctx))
    assert len(list(folder.glob("part-*.parquet"))) == 2
    assert list(dict.fromkeys(records["method"])) == list(methods)  # method by method, as in one pass
    pd.testing.assert_frame_equal(records.drop(columns="wall_s"), whole.drop(columns="wall_s"), check_dtype=False)  # parquet: string dtypes
    assert {m: [t.question_id for t in ts] for m, ts in kept.items()} == {m: ["q1", "q2", "q3"] for m in methods[1:]}
    calls = len(backend.calls)
    again: dict = {}
    rerun = evaluate_policies([Q1, Q2, q3], ctx, cfg, parts=parts, progress=False, trajectories=again)
    assert len(backend.calls) == calls and again == {}  # read, not evaluated
    pd.testing.assert_frame_equal(rerun, records)


def test_cosearch_evaluate_for_notebook_02_takes_the_notebooks_settings_and_refuses_its_own(tmp_path, capsys):
    """`cosearch evaluate` evaluates notebook 02 with its's parameters as `cosearch run` gives
    them (the notebook's defaults under the profile's notebooks entry), so that the notebook finds the
    parts; a --methods of its own would write parts the notebook never reads, and is refused."""
    import yaml

    from cosearch_lib.cli import main
    from cosearch_lib.runs.launched_evaluation import oracle_gap_settings

    assert oracle_gap_settings(load_profile("paper"))["methods"].split(",") == [
        "direct", "cot", "rag", "agent_retrieval", "agent_fixed_ranker", "agent_oracle"]
    profile = tmp_path / "two_methods.yaml"
    profile.write_text(yaml.safe_dump({"extends": "ci", "notebooks": {"02": {"methods": "direct,agent_oracle",
                                                                               "policies": "base"}}}))
    settings = oracle_gap_settings(load_profile(profile))
    assert (settings["methods"], settings["policies"]) == ("direct,agent_oracle", "base")
    assert main(["evaluate", "--profile", "ci", "--notebooks", "02", "--methods", "rag"]) == 2
    assert "notebook 02 takes its methods from its parameters" in capsys.readouterr().err
