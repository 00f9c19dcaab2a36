"""The paper profile's path, end to end, as a cluster user runs it (issue 47; ``make test-paper``).

The miniature ``paper_mini`` extends ``paper`` (tests/test_paper_path.py lists what it overrides).
Every step is the command docs/USAGE.md gives a cluster user, with only the profile name changed:

1. the paper's artefacts (here: the world exported in their formats) on a stand-in for the hub;
2. ``cosearch download all --profile paper_mini``: the real ``huggingface_hub`` client fetches them;
   ``cosearch prepare-relevance --profile paper_mini``: the Fixed Ranker's relevance set;
3. ``cosearch check --profile paper_mini --ranks 2``: the inputs, before any engine starts;
4. ``cosearch serve-retriever``: one retrieval server for the job;
5. ``torchrun --nproc-per-node 2 cosearch train --profile paper_mini --retriever-url URL``: gloo,
   one vLLM CPU engine per rank;
6. ``torchrun --nproc-per-node 2 cosearch evaluate --profile paper_mini --methods cosearch --retriever-url URL``:
   the evaluations of notebooks 03 and 02 in one job, sharded over the ranks into parts, after the
   Fixed Ranker's relevance training on the prepared set (in one process apart, before the ranks start);
7. ``cosearch run --profile paper_mini --notebooks 02 03`` with ``COSEARCH_RETRIEVER_URL``:
   papermill: notebooks 02 and 03 reading the parts, and the figures.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cosearch_lib.config import load_profile
from cosearch_lib.eval.tables import load_records
from cosearch_lib.experiment import harness_config
from cosearch_lib.experiment.cached_starts import relevance_dir, warmstart_dir
from cosearch_lib.models.adapter_weights import adapter_change
from cosearch_lib.paths import project_root

from tests.hub_standin import HubStandin

# The limits hold the miniature on a slow machine of CI's kind: 2 AVX2 cores without AVX-512 took 40 min
# to reach the evaluation's oracle-gap parts (docs/LOG.md, eleventh session); one with AVX-512, 10-14 min.
pytestmark = [pytest.mark.paper, pytest.mark.timeout(4200)]

PROFILE = "paper_mini"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> float:
    """Run one documented command; its output goes to ``log``; returns its wall seconds."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, env=env, cwd=project_root(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{log.read_text()[-4000:]}")
    return time.perf_counter() - t0


def test_the_paper_profile_runs_through_the_documented_commands(tmp_path: Path) -> None:
    cosearch = shutil.which("cosearch") or str(Path(sys.executable).parent / "cosearch")
    cfg = load_profile(PROFILE)
    data_root = project_root() / cfg.data.root
    shutil.rmtree(data_root, ignore_errors=True)  # the download must write everything the profile reads
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "COSEARCH_RUNS": str(runs), "COSEARCH_FIGURES": str(tmp_path / "figures"),
           "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1", "TQDM_DISABLE": "1"}
    times: dict[str, float] = {}
    times["export"] = _run([cosearch, "export-world", "--profile", PROFILE, "--hub", str(tmp_path / "hub"), "--quiet"],
                           env, logs / "export.log", 600)
    with HubStandin(tmp_path / "hub") as hub:
        times["download"] = _run([cosearch, "download", "all", "--profile", PROFILE],
                                 {**env, "HF_ENDPOINT": hub.url}, logs / "download.log", 600)
    assert (data_root / "wiki18" / "e5_Flat.index").is_file()
    times["prepare-relevance"] = _run([cosearch, "prepare-relevance", "--profile", PROFILE, "--quiet"], env,
                                      logs / "relevance.log", 600)
    times["check"] = _run([cosearch, "check", "--profile", PROFILE, "--ranks", "2"], env, logs / "check.log", 300)
    assert "ok    context budget" in (logs / "check.log").read_text()

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server_log = open(logs / "server.log", "w")
    server = subprocess.Popen([cosearch, "serve-retriever", "--profile", PROFILE, "--port", str(port)], env=env,
                              cwd=project_root(), stdout=server_log, stderr=subprocess.STDOUT)
    try:
        _wait_for(url, server, logs / "server.log")
        times["train (2 ranks)"] = _run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", cosearch,
             "train", "--profile", PROFILE, "--methods", "cosearch", "--retriever-url", url, "--quiet"],
            env, logs / "train.log", 2400)
        times["evaluate 03 02 (2 ranks)"] = _run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", cosearch,
             "evaluate", "--profile", PROFILE, "--methods", "cosearch", "--retriever-url", url, "--quiet"],
            env, logs / "evaluate.log", 2400)
        parts_written = {p: p.stat().st_mtime_ns for p in (runs / PROFILE / "evaluation").glob("*/part-*.parquet")}
        times["notebooks 02 03"] = _run(
            [cosearch, "run", "--profile", PROFILE, "--notebooks", "02", "03", "--quiet"],
            {**env, "COSEARCH_RETRIEVER_URL": url}, logs / "run.log", 1200)
    finally:
        server.terminate()
        server.wait(timeout=30)
        server_log.close()
    print(json.dumps({k: round(v, 1) for k, v in times.items()}))

    out = runs / PROFILE
    train = json.loads((out / "train.run.json").read_text())
    assert train["world_size"] == 2 and train["retriever"] == url
    for method in ("cosearch",):
        steps = pd.read_csv(out / "training" / method / "steps.csv")
        assert steps["rollout/n_trajectories"].tolist() == [cfg.training.questions_per_step * 8]  # G = 8, the paper's
        # each rank's vLLM engine: the adapters registered again after the update, the old log-probs
        # recomputed by the trainer (a ratio of exactly 1 before the update), the agent's weights moved
        assert steps["time/sync_s"].notna().all() and (steps["loss/agent_n_forwarded"] > 0).all()
        assert (steps["loss/agent_ratio_outside_clip"] == 0).all()
        last = sorted((out / "training" / method / "checkpoints").iterdir())[-1] / "adapters"
        assert adapter_change(warmstart_dir(cfg) / "agent", last / "agent")["changed"] > 0
    assert steps["ranker/n_calls"].iloc[0] > 0  # CoSearch's ranker was called on the N candidates and scored
    # the validation after the last step (paper's eval_every), shared by the 2 ranks and gathered: one
    # test question per benchmark (training.val_per_dataset), the paper's val_split
    validation = pd.read_csv(out / "training" / "cosearch" / "validation.csv")
    assert steps["val/f1"].notna().all() and set(validation["step"]) == {0}  # the step record it joins
    assert (validation["kind"] == "agent").sum() == 7 and validation.loc[validation["kind"] == "agent", "question_id"].is_unique
    # the Fixed Ranker was relevance-trained on the prepared set (world questions of the NQ family), by
    # `cosearch evaluate` before its ranks started, whose notebook-02 method agent_fixed_ranker reads it
    relevance = json.loads((relevance_dir(cfg) / "relevance.json").read_text())
    assert relevance["steps"] == cfg.relevance.steps and relevance["pool"]["answerable"] > 0
    assert "nq" in (logs / "relevance.log").read_text()
    evaluated = json.loads((out / "evaluate.run.json").read_text())
    assert evaluated["world_size"] == 2 and evaluated["questions"] == 7  # one per benchmark (evaluation.n_per_dataset)
    assert {p.name.split("-")[1] for p in parts_written} == {"r0", "r1"}  # both ranks evaluated a share
    oracle_gap = json.loads((out / "evaluate_02.run.json").read_text())
    assert oracle_gap["world_size"] == 2 and oracle_gap["questions"] == 7 and len(oracle_gap["records"]) == 6
    assert {p.name.split("-")[1] for p in (out / "evaluation").glob("oracle-gap-study-*/part-*.parquet")} == {"r0", "r1"}
    # notebooks 02 and 03 read the job's parts: they wrote none and rewrote none
    assert {p: p.stat().st_mtime_ns for p in (out / "evaluation").glob("*/part-*.parquet")} == parts_written
    evaluated = load_records(out / "03_eval_records.parquet")  # the parts, read by notebook 03
    assert list(evaluated.columns) == [*harness_config(cfg).record_columns(), "eval_method"]  # as on the transformers backend; K = 5: ranker_hit@1, @3, @K
    assert {"cosearch: warm start", "cosearch: after GRPO"} <= set(evaluated["method"])
    assert evaluated.groupby("method").size().eq(evaluated["question_id"].nunique()).all()
    oracle_records = load_records(out / "02_eval_records.parquet")
    assert oracle_records.groupby("method", sort=False).size().to_dict() == oracle_gap["records"]
    for name in ("02_oracle_gap_study.ipynb", "03_joint_grpo_training.ipynb"):
        assert (out / name).is_file()
    assert any((tmp_path / "figures" / PROFILE).glob("*.png"))


def _wait_for(url: str, server: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the retrieval server exited {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"the retrieval server did not answer within {timeout} s")
