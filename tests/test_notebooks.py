"""Notebooks execute end to end under papermill on the `ci` profile (the same path as `make demo`)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import nbformat
import pytest

from cosearch_lib.report import REPORT_ITEMS
from cosearch_lib.runs.papermill_runner import list_notebooks, run_notebook

#: A cell slower than this fails its notebook's test by name (CellTimeout: notebook, cell, seconds),
#: before pytest's own guard below. ~7x the slowest ci cell alone (notebook 03's training, ~2 min); a
#: busy machine (a laptop run beside the suite) took 02's and 03's past 480 s. The world, index and
#: warm start are built before the notebooks run (conftest's ``ci_index`` and ``ci_starts``), outside any cell.
CELL_TIMEOUT_S = 900
pytestmark = pytest.mark.timeout(1800)  # the last guard: a whole notebook on a busy machine


@pytest.fixture
def isolated_outputs(tmp_path, monkeypatch):
    """Figures and run records go to a temp folder; the world/index cache stays shared (data/)."""
    monkeypatch.setenv("COSEARCH_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    return tmp_path


def test_01_retriever_setup_runs_on_ci_profile(ci_index, isolated_outputs):
    nb_path = next(p for p in list_notebooks() if p.name.startswith("01_"))
    executed = run_notebook(nb_path, "ci", cell_timeout=CELL_TIMEOUT_S, progress=False)
    nb = nbformat.read(executed, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert executed == isolated_outputs / "runs" / "ci" / nb_path.name
    record = json.loads((isolated_outputs / "runs" / "ci" / "01_retriever_setup.run.json").read_text())
    assert record["status"] == "ok" and record["parameters"]["profile"] == "ci"
    figs = isolated_outputs / "figures" / "ci"
    assert (figs / "recall_at_k.png").stat().st_size > 10_000 and (figs / "recall_at_k.csv").exists()
    assert (figs / "hop_recall_at_k.png").exists() and (figs / "hop_recall_at_k.csv").exists()
    metrics = json.loads((isolated_outputs / "runs" / "ci" / "01_retriever_setup.metrics.json").read_text())
    rows = {r["data_source"]: r for r in metrics["recall"]}
    n, k = metrics["N"], metrics["K"]
    assert rows["avg"][f"R@{n}"] >= rows["avg"][f"R@{k}"] > 0.0
    hop_rows = {r["data_source"]: r for r in metrics["hop_recall"]}
    assert set(hop_rows) >= {"syn_nq", "syn_musique", "avg"}  # every family's chain was measured


@pytest.mark.slow
def test_02_oracle_gap_study_runs_on_ci_profile(ci_agent_start, isolated_outputs):
    from cosearch_lib.eval.tables import load_records

    nb_path = next(p for p in list_notebooks() if p.name.startswith("02_"))
    methods = ["direct", "rag", "agent_retrieval", "agent_oracle"]  # the fixed-ranker path is unit-tested
    executed = run_notebook(nb_path, "ci", cell_timeout=CELL_TIMEOUT_S, parameters={"methods": ",".join(methods)}, progress=False)
    nb = nbformat.read(executed, as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    runs, figs = isolated_outputs / "runs" / "ci", isolated_outputs / "figures" / "ci"
    records = load_records(runs / "02_eval_records.parquet")
    assert list(dict.fromkeys(records["method"])) == methods
    assert records.groupby("method").size().tolist() == [7] * len(methods)  # one question per family on ci
    assert (records.loc[records["method"] == "rag", "n_searches"] == 1).all()
    for name in ("oracle_gap", "search_turns"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.csv").exists()
    metrics = json.loads((runs / "02_oracle_gap_study.metrics.json").read_text())
    assert set(metrics["oracle_gap"]) == {"standard", "oracle", "relative gain %"}
    assert metrics["n_records"] == len(records)
    adapters = [v for k, v in metrics["eval_config"].items() if k.endswith("_adapter") and v]
    assert adapters and not any(Path(a).is_absolute() for a in adapters)  # records read the same on every machine
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "showing" in text and "question:" in text  # the trajectory browser's printed fallback
    assert re.search(r"=== agent_\w+: test_", text)  # each printed trajectory names its method


def _cosearch_run_03(tmp_path: Path, name: str, *params: str, threads: int | None = None) -> tuple:
    """`cosearch run --profile ci --notebooks 03` in a subprocess, as a cluster job runs it, with its
    records under ``tmp_path/name``; output to a file (no run blocks on a full pipe while another is
    awaited). Returns the process and its log file."""
    import os
    import subprocess
    import sys

    from cosearch_lib.paths import project_root

    env = {**os.environ, "COSEARCH_RUNS": str(tmp_path / name), "COSEARCH_FIGURES": str(tmp_path / f"figures-{name}")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    args = [sys.executable, "-m", "cosearch_lib.cli", "run", "--profile", "ci", "--notebooks", "03", "--quiet",
            *[x for p in params for x in ("-p", p)]]
    log = tmp_path / f"run-{name}-{len(list(tmp_path.glob('run-*.log')))}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=project_root(), env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_03_runs_on_ci_through_cosearch_run(ci_starts, tmp_path):
    """Notebook 03 end to end on `ci` through the path a cluster takes (`cosearch run` in a
    subprocess): 1 GRPO step of CoSearch trained in the kernel on the transformers backend (the CPU
    profiles' path; both roles had non-zero advantages in ci's first step, so both adapters move;
    ci's second step cost 50 s more and covers nothing the first does not: the steps after a first
    one are the resume tests' below and tests/test_training_faults.py's), the validation after it, the
    Fixed Ranker's quality, the training figures (`make test-slow`, CI). Without the evaluation
    before and after GRPO and the hop oracle (~21 trajectories of HF generation): CI runs those
    cells in the paper miniature (`make test-paper`, the same functions through `cosearch evaluate`'s
    parts), and the reference test below runs them here. The same run stopped by SIGUSR1 and resumed bit for bit is
    :func:`test_03_on_ci_stopped_by_sigusr1_resumes_to_the_records_of_the_uninterrupted_run`
    (`make test-reference`, by hand); CI checks the stop's parts apart: the trainer's stop and
    resume in `make test-slow` (tests/test_training_faults.py), the command passing the signal
    on to the kernel (tests/test_stop_signals.py), the launched ranks' stop (tests/test_evaluation_shards.py)."""
    proc, log = _cosearch_run_03(tmp_path, "full", "evaluate_policies=false", "steps=1")
    assert proc.wait(timeout=1500) == 0, log.read_text()[-3000:]
    _check_notebook_03_on_ci(tmp_path / "full" / "ci", tmp_path / "figures-full" / "ci", evaluated=False, n_steps=1)


def _check_notebook_03_on_ci(runs: Path, figs: Path, evaluated: bool = True, n_steps: int = 2) -> Path:
    """What an uninterrupted `cosearch run --profile ci --notebooks 03` leaves: the executed notebook
    without errors, ``n_steps`` GRPO steps of CoSearch (ci's 2, or ``-p steps=``) that moved both adapters off the warm start, the
    validation after the last step, the figures, and (``evaluated``) the evaluation before and
    after. Returns the last checkpoint's folder."""
    import pandas as pd

    from cosearch_lib.config import load_profile
    from cosearch_lib.eval.tables import load_records
    from cosearch_lib.experiment import warmstart_dir
    from cosearch_lib.models.adapter_weights import adapter_change, lora_b_max_abs
    from cosearch_lib.run_schema import STEP_GLOSSARY, describe_step_metric

    nb = nbformat.read(runs / "03_joint_grpo_training.ipynb", as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    steps = pd.read_csv(runs / "training" / "cosearch" / "steps.csv")
    assert steps["step"].tolist() == list(range(n_steps)) and (steps["rollout/n_trajectories"] == 4).all()  # 1 question x G=4
    assert steps["rollout/agent_reward"].between(-0.2, 1).all()  # Eq. 4: -alpha for a broken protocol, else F1
    searched = steps["ranker/n_calls"] > 0  # hit@K exists exactly when the agent searched
    assert steps.loc[searched, "ranker/hit@K"].between(0, 1).all() and steps.loc[~searched, "ranker/hit@K"].isna().all()
    assert steps["val/f1"].isna().tolist() == [True] * (n_steps - 1) + [False]  # ci's eval_every=2: after the last step only
    assert all(describe_step_metric(c) for c in steps.columns) and STEP_GLOSSARY
    ckpts = sorted((runs / "training" / "cosearch" / "checkpoints").iterdir())
    assert [c.name for c in ckpts] == [f"step_{n_steps:06d}"]  # keep_checkpoints=1
    assert {p.name for p in (ckpts[0] / "adapters").iterdir()} == {"agent", "ranker"}
    # ci trains for real: the warm start moved both adapters off the base model (lora_B != 0), both
    # roles had non-zero advantages in some step, and GRPO moved both adapters off the warm start
    assert (steps["loss/agent_n_forwarded"] > 0).any() and (steps["loss/ranker_n_forwarded"] > 0).any(), steps.to_string()
    warm = warmstart_dir(load_profile("ci"))
    for adapter in ("agent", "ranker"):
        assert lora_b_max_abs(warm / adapter) > 0, adapter
        assert adapter_change(warm / adapter, ckpts[0] / "adapters" / adapter)["changed"] > 0, adapter
    for name in ("warmstart_loss", "training_curves", "grpo_signal", "ranker_dynamics_cosearch", "validation_curves"):
        assert (figs / f"{name}.png").stat().st_size > 10_000
    metrics = json.loads((runs / "03_joint_grpo_training.metrics.json").read_text())
    assert metrics["steps"] == {"cosearch": n_steps} and set(metrics["warmstart"]) == {"agent", "ranker"}
    if evaluated:
        records = load_records(runs / "03_eval_records.parquet")
        assert records.groupby("method", sort=False).size().to_dict() == {"cosearch: warm start": 7, "cosearch: after GRPO": 7}
        assert set(records["eval_method"]) == {"agent_trained_ranker"}
        assert set(metrics["eval_f1"]) == {"cosearch: warm start", "cosearch: after GRPO"}
    else:
        assert not (runs / "03_eval_records.parquet").exists()
    validation = pd.read_csv(runs / "training" / "cosearch" / "validation.csv")
    assert set(validation["step"]) == {n_steps - 1} and set(validation["kind"]) == {"agent", "ranker"}
    assert (validation["kind"] == "agent").sum() == 7  # val_per_dataset=1: one dev question per family
    # one validation, no start: nothing to pair, and the results say so rather than inventing an interval
    assert metrics["validation_comparisons"] == {"agent": [], "ranker": []}
    return ckpts[0]


@pytest.mark.slow
@pytest.mark.reference
@pytest.mark.timeout(2400)  # two runs side by side at one thread each, then the resumed one
def test_03_on_ci_stopped_by_sigusr1_resumes_to_the_records_of_the_uninterrupted_run(ci_starts, tmp_path):
    """Beside an uninterrupted `cosearch run --profile ci --notebooks 03`, the same command sent
    SIGUSR1 while its first step runs (once the kernel's trainer has armed its stop handler) passes
    the signal to papermill's kernel, whose trainer finishes the step, checkpoints and stops; the
    command exits 75; the same command with resume=true continues to the uninterrupted run's training
    records and weights, bit for bit. Two runs side by side at one thread each, then the resumed one:
    ~11 min of 2 cores, so `make test-reference` (by hand) runs it, not CI (which runs the
    uninterrupted run alone, :func:`test_03_runs_on_ci_through_cosearch_run`)."""
    import time

    import pandas as pd

    from cosearch_lib.models.adapter_weights import adapter_change
    from cosearch_lib.records.compare import compare_tables
    from cosearch_lib.stop_signals import EXIT_STOPPED

    # one thread per run: the uninterrupted run goes beside the stopped one, and its numbers must not depend on that
    full, full_log = _cosearch_run_03(tmp_path, "full", threads=1)
    stopped, stopped_log = _cosearch_run_03(tmp_path, "stopped", "evaluate_policies=false", threads=1)
    first = tmp_path / "stopped" / "ci" / "training" / "cosearch" / "checkpoints" / "step_000001"
    deadline = time.monotonic() + 900
    while not _stop_handler_armed(stopped) and stopped.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the trainer catches stop signals from its first step on: the loading and the starts before it take ~1 min
    assert _stop_handler_armed(stopped), stopped_log.read_text()[-3000:]
    assert not first.parent.exists()  # no step has finished yet
    stopped.send_signal(signal.SIGUSR1)  # to the command, not to the kernel: it must pass it on
    assert stopped.wait(timeout=900) == EXIT_STOPPED
    out = stopped_log.read_text()
    assert "stopped on SIGUSR1" in out and "resume=true" in out
    assert [p.name for p in first.parent.iterdir()] == ["step_000001"]  # the step under way finished
    assert len(pd.read_csv(first.parent.parent / "steps.csv")) == 1  # and training stopped there
    resumed, resumed_log = _cosearch_run_03(tmp_path, "stopped", "evaluate_policies=false", "resume=true", threads=1)
    assert resumed.wait(timeout=1500) == 0, resumed_log.read_text()[-3000:]
    assert full.wait(timeout=1500) == 0, full_log.read_text()[-3000:]

    runs, figs = tmp_path / "full" / "ci", tmp_path / "figures-full" / "ci"
    table = compare_tables(runs, tmp_path / "stopped" / "ci", only=[r"^training/"])
    assert len(table) >= 3 and (table["status"] == "identical").all(), table.to_string()
    last = _check_notebook_03_on_ci(runs, figs)
    resumed_last = tmp_path / "stopped" / "ci" / "training" / "cosearch" / "checkpoints" / last.name / "adapters"
    for adapter in ("agent", "ranker"):  # the resumed run ends on the uninterrupted run's weights
        assert adapter_change(last / "adapters" / adapter, resumed_last / adapter)["changed"] == 0, adapter


def _stop_handler_armed(proc) -> bool:
    """Whether a process under ``proc`` (papermill's kernel) catches SIGUSR1: the trainer's stop
    handler (stop_signals.StopRequest) is armed from its first step on, and nothing else in the
    kernel catches it. Linux: the SigCgt mask of /proc/<pid>/status."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return False
    for child in children:
        try:
            caught = next(line for line in Path(f"/proc/{child.pid}/status").read_text().splitlines() if line.startswith("SigCgt"))
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
        if int(caught.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1:
            return True
    return False


def test_04_ablations_builds_tables_from_finished_cells_and_names_the_missing_ones(isolated_outputs):
    import pandas as pd

    runs, figs = isolated_outputs / "runs" / "ci", isolated_outputs / "figures" / "ci"
    families = ["syn_nq", "syn_popqa", "syn_hotpotqa", "syn_musique"]

    def finish(folder, policies):  # what notebook 03 leaves in a finished cell: an ok record, eval records
        folder.mkdir(parents=True)
        (folder / "03_joint_grpo_training.run.json").write_text(json.dumps({"status": "ok"}))
        pd.DataFrame([{"method": p, "dataset": fam, "question_id": f"{fam}-{i}", "sample": 0, "f1": f1, "golds": ["x"],
                       "prediction": None, "error": None}
                      for p, f1 in policies.items() for fam in families for i in range(2)]).to_parquet(
            folder / "03_eval_records.parquet")

    finish(runs / "table3" / "full", {"cosearch: after GRPO": 1.0})
    finish(runs / "table3" / "no-r-main", {"cosearch: after GRPO": 0.5})
    finish(runs / "table4" / "k3", {"fixed_ranker: after GRPO": 0.25, "cosearch: after GRPO": 0.75})
    nb_path = next(p for p in list_notebooks() if p.name.startswith("04_"))
    nb = nbformat.read(run_notebook(nb_path, "ci", cell_timeout=CELL_TIMEOUT_S, progress=False), as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    metrics = json.loads((runs / "04_ablations.metrics.json").read_text())
    rows = {r["cell"]: r for r in metrics["table3"]}
    assert rows["no-r-main"]["diff"] == -0.5 and rows["no-r-main"]["paper row"] == "w/o r_main"
    assert [(r["K"], r["method"], r["avg"]) for r in metrics["table4"]] == [(3, "fixed_ranker", 0.25), (3, "cosearch", 0.75)]
    assert "ndcg" in metrics["missing"]["table3"] and "k3" not in metrics["missing"]["table4"]
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream")
    assert "run `cosearch grid table3 --profile ci --cells ndcg`" in text
    for name in ("table3_ablations", "table4_topk"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.csv").exists()


def test_05_figures_runs_without_records_and_says_what_to_run(isolated_outputs):
    nb_path = next(p for p in list_notebooks() if p.name.startswith("05_"))
    nb = nbformat.read(run_notebook(nb_path, "ci", cell_timeout=CELL_TIMEOUT_S, progress=False), as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    report = (isolated_outputs / "figures" / "ci" / "REPORT.md").read_text()
    assert report.count("*Missing:*") == len(REPORT_ITEMS) and "cosearch run --profile ci --notebooks 02" in report
