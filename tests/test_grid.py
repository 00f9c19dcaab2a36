"""Grids of runs (records.grid_cells, runs.grid): the grid file, cells as profiles, running with skip and resume, and
the SLURM array + dependent aggregation job, all without executing a notebook (a fake runner and a
fake sbatch stand in; the real SLURM run is `make test-slurm`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from cosearch_lib.config import ConfigError, load_profile
from cosearch_lib.planning.job_plan import plan_job
from cosearch_lib.records import grid_cells
from cosearch_lib.records.grid_cells import Grid, GridCell, cell_config, load_grid, write_cell_profile
from cosearch_lib.runs import grid as grids
from cosearch_lib.runs import papermill_runner
from cosearch_lib.runs.grid import cell_plan, run_grid, slurm_scripts, submit_slurm

GRID = {"grid": "table3", "notebooks": ["03"], "aggregate": ["02"], "parameters": {"methods": "cosearch"},
        "cells": {"full": None,
                  "no-r-main": {"training": {"ranker_reward": {"use_main": False}}},
                  "k1": {"search": {"topk": 1}, "parameters": {"methods": "search_r1,cosearch"}}}}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


def grid_file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data.get('grid', 'g')}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_grid_file_reads_into_cells_with_their_sections_and_parameters(tmp_path):
    grid = load_grid(grid_file(tmp_path, GRID))
    assert grid.name == "table3" and grid.notebooks == ("03",) and grid.aggregate == ("02",)
    assert [c.name for c in grid.cells] == ["full", "no-r-main", "k1"]
    assert grid.cell("k1").overrides == {"search": {"topk": 1}} and grid.cell("k1").parameters == {"methods": "search_r1,cosearch"}
    assert grid.cell(1).name == "no-r-main" and grid.cell("2").name == "k1"  # an array task id
    with pytest.raises(IndexError, match="0..2"):
        grid.cell(3)
    with pytest.raises(KeyError, match="no cell 'nope'"):
        grid.cell("nope")


@pytest.mark.parametrize("change, message", [
    ({"cels": {}}, "unknown key"),
    ({"cells": {}}, "non-empty mapping"),
    ({"cells": {"Bad Name": {}}}, "cell name 'Bad Name'"),
    ({"cells": {"a": [1, 2]}}, "cell 'a': expected a mapping"),
    ({"cells": {"a": {"profile": "x"}}}, "may not set 'profile'"),
    ({"cells": {"a": {"parameters": [1]}}}, "parameters: expected a mapping"),
    ({"parameters": "methods=cosearch"}, "parameters: expected a mapping"),
    ({"notebooks": {"03": 1}}, "notebooks: expected a list"),
])
def test_bad_grid_files_are_refused_with_what_is_wrong(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_grid(grid_file(tmp_path, {**GRID, **change}))
    with pytest.raises(ConfigError, match="no grid file"):
        load_grid(tmp_path / "missing.yaml")


def test_each_cell_is_a_profile_extending_the_base_with_its_own_run_folder(tmp_path, runs):
    grid = load_grid(grid_file(tmp_path, GRID))
    path = write_cell_profile("ci", grid, grid.cell("k1"))
    assert path == runs / "ci" / "table3" / "k1" / "profile.yaml"
    cfg = load_profile(path)
    base = load_profile("ci")
    assert cfg.profile == "ci/table3/k1" and cfg.search.topk == 1 and base.search.topk == 3
    assert cfg.world == base.world and cfg.training.steps == base.training.steps  # everything else from the base
    assert not load_profile(write_cell_profile("ci", grid, grid.cell("no-r-main"))).training.ranker_reward.use_main
    bad = Grid("g", ("03",), (GridCell("typo", {"training": {"stepz": 3}}),))
    with pytest.raises(ConfigError, match="grid 'g', cell 'typo'.*stepz"):
        write_cell_profile("ci", bad, bad.cells[0])


def record(folder: Path, status: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "03_joint_grpo_training.run.json").write_text(json.dumps({"status": status}))


def test_run_grid_runs_cells_in_order_skips_finished_ones_resumes_started_ones_and_survives_a_failure(tmp_path, runs):
    grid = load_grid(grid_file(tmp_path, GRID))
    record(runs / "ci" / "table3" / "full", "ok")  # finished
    (runs / "ci" / "table3" / "no-r-main" / "training").mkdir(parents=True)  # a killed task: partial
    calls = []

    def runner(profile, notebooks, *, parameters, progress):
        calls.append((Path(profile).parent.name, notebooks, parameters))
        cfg = load_profile(profile)
        if cfg.profile.endswith("k1"):
            raise RuntimeError("out of memory")
        record(runs / cfg.profile, "ok")

    table = run_grid("ci", grid, runner=runner, progress=False)
    assert [c[0] for c in calls] == ["no-r-main", "k1"]  # "full" was done
    assert calls[0][1] == ["03"] and calls[0][2] == {"methods": "cosearch", "resume": True}
    assert calls[1][2] == {"methods": "search_r1,cosearch"}  # the cell's parameters win; a new cell starts over
    assert table[["cell", "before", "after"]].values.tolist() == [["full", "done", "done"], ["no-r-main", "partial", "done"],
                                                                  ["k1", "todo", "todo"]]
    assert table.loc[2, "error"] == "RuntimeError: out of memory" and table["error"].notna().sum() == 1
    saved = json.loads((runs / "ci" / "table3" / "grid.run.json").read_text())
    assert [c["cell"] for c in saved["cells"]] == ["full", "no-r-main", "k1"]
    status = grid_cells.grid_status("ci", grid)
    assert status["status"].tolist() == ["done", "done", "todo"]
    record(runs / "ci" / "table3" / "k1", "failed")
    assert grid_cells.grid_status("ci", grid)["status"].tolist()[-1] == "failed"
    calls.clear()
    run_grid("ci", grid, ["k1"], runner=runner, progress=False)
    assert [c[0] for c in calls] == ["k1"] and calls[0][2]["resume"] is True


def test_slurm_scripts_carry_the_profile_resources_and_one_cell_per_array_task(tmp_path, runs):
    grid = load_grid(grid_file(tmp_path, GRID))
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"extends": "ci", "slurm": {"partition": "gpu", "account": "lab", "gres": "gpu:a100:1",
                                                             "mem": "64G", "time": "12:00:00", "extra": ["--constraint=a100"]}}))
    scripts = slurm_scripts(base, grid)
    array, aggregate = scripts["array"].splitlines(), scripts["aggregate"].splitlines()
    assert array[0] == "#!/usr/bin/env bash"
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --gres=gpu:a100:1", "#SBATCH --mem=64G",
                 "#SBATCH --time=12:00:00", "#SBATCH --cpus-per-task=2", "#SBATCH --constraint=a100"):
        assert line in array
    assert any(line.startswith("#SBATCH --output=") and line.endswith("slurm/cell-%a-%A.log") for line in array)
    command = array[-1]
    assert command.startswith('run_stoppable "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" cosearch grid')
    assert '--cell "$SLURM_ARRAY_TASK_ID"' in command and any(line.startswith("source papermill_runs/slurm/stoppable.sh")
                                                               for line in array)
    lead = round(cell_plan(base, grid).signal_lead_s)  # slurm.signal_lead_s unset: the plan's uncut part of a step
    assert "#SBATCH --requeue" in array and f"#SBATCH --signal=B:USR1@{lead}" in array and lead > 60
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(yaml.safe_dump({"extends": str(base), "slurm": {"signal_lead_s": 900}}))
    assert "#SBATCH --signal=B:USR1@900" in slurm_scripts(fixed, grid)["array"].splitlines()
    assert "#SBATCH --time=00:30:00" in aggregate and aggregate[-1].endswith("--notebooks 02 --quiet")
    assert f"cosearch grid --profile {base} {grid.source} --cell" in command  # the file it came from, by path
    with pytest.raises(ConfigError, match="not read from a file"):
        slurm_scripts("ci", Grid("g", ("03",), (GridCell("a"),)))
    header = [n for n, line in enumerate(array) if line.startswith("#SBATCH")]
    assert header == list(range(1, len(header) + 1))  # resource lines at the top, where a user edits them
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"extends": "ci", "slurm": {"extra": ["constraint=a100"]}}))
    with pytest.raises(ValueError, match=r"bad\.yaml: slurm\.extra must be one sbatch option starting with '--' per entry, "
                                         r"got 'constraint=a100'$"):
        load_profile(bad)


ROOT = Path(__file__).resolve().parents[1]
CHILD = """import signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append("USR1"))
signal.signal(signal.SIGTERM, lambda *a: got.append("TERM"))
print("started", flush=True)
t0 = time.time()
while not got and time.time() - t0 < 30:
    time.sleep(0.02)
time.sleep(0.5)  # the step under way finishes, the checkpoint is written
print("child got", got, flush=True)
sys.exit(75 if got else 0)
"""


@pytest.mark.parametrize("sig, left, requeued", [("USR1", "1:00:00", True), ("TERM", "2:00:00", False), ("TERM", "00:40", True)])
def test_the_array_task_passes_a_stop_signal_on_and_requeues_on_the_warning_and_at_the_time_limit(tmp_path, sig, left,
                                                                                                  requeued):
    """The job script's own logic, in bash: the stop signal reaches the command running in the
    background, the script waits for its real exit status (75) and, after SIGUSR1 (--signal before
    the time limit), requeues its own array task; after SIGTERM it requeues the task only at its time
    limit (TIMEOUT: 40 s left, squeue's %L), not with hours left (preemption, which SLURM requeues
    itself, or scancel)."""
    import signal
    import subprocess
    import sys
    import time

    from cosearch_lib.runs.slurm_jobs import STOPPABLE_SH

    (tmp_path / "child.py").write_text(CHILD)
    job = tmp_path / "job.sh"
    job.write_text("set -euo pipefail\n"
                   'scontrol() { echo "scontrol $*"; }\n'  # what the task would ask SLURM
                   f'squeue() {{ echo "{left}"; }}\n'  # the task's time left
                   f"source {ROOT / STOPPABLE_SH}\n"
                   f'run_stoppable 41_2 {sys.executable} {tmp_path / "child.py"}\n'
                   'echo "not reached: set -e ends the job with the command\'s status"\n')
    proc = subprocess.Popen(["bash", str(job)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.2)
    proc.send_signal(getattr(signal, f"SIG{sig}"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75
    assert f"child got ['{sig}']" in out
    assert ("scontrol requeue 41_2" in out) is requeued and "not reached" not in out


def test_submit_slurm_submits_the_array_then_the_aggregation_after_it(tmp_path, runs):
    grid = load_grid(grid_file(tmp_path, GRID))
    sent = []

    def sbatch(cmd, **kw):
        sent.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="4242\n" if len(sent) == 1 else "4243;cluster\n", stderr="")

    out = submit_slurm("ci", grid, run=sbatch)
    folder = runs / "ci" / "table3" / "slurm"
    assert sent[0] == ["sbatch", "--parsable", "--array=0-2", str(folder / "array.sbatch")]
    assert sent[1] == ["sbatch", "--parsable", "--dependency=afterok:4242", str(folder / "aggregate.sbatch")]
    assert out["array_job"] == "4242" and out["aggregate_job"] == "4243"
    assert all((runs / "ci" / "table3" / c / "profile.yaml").exists() for c in ("full", "no-r-main", "k1"))
    assert json.loads((folder / "submitted.json").read_text())["aggregate_job"] == "4243"
    dry = submit_slurm("ci", grid, submit=False, run=lambda *a, **k: pytest.fail("a dry run submitted"))
    assert dry["array_cmd"][2] == "--array=0-2" and "aggregate_job" not in dry

    def refuse(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="sbatch: error: invalid partition")

    with pytest.raises(RuntimeError, match="invalid partition"):
        submit_slurm("ci", grid, run=refuse)

    def missing(cmd, **kw):
        raise FileNotFoundError(cmd[0])

    with pytest.raises(RuntimeError, match="--dry-run"):
        submit_slurm("ci", grid, run=missing)
    no_aggregate = Grid("g", ("03",), (GridCell("a"),), aggregate=("99",))
    with pytest.raises(FileNotFoundError, match="99"):
        submit_slurm("ci", no_aggregate, run=sbatch)


def test_a_notebook_run_on_a_profile_file_lands_in_the_folder_that_profile_names(tmp_path, runs, monkeypatch):
    from cosearch_lib.runs import papermill_runner

    grid = load_grid(grid_file(tmp_path, GRID))
    path = write_cell_profile("ci", grid, grid.cell("full"))
    seen = {}

    def execute(notebook, executed, parameters, **kw):
        seen.update(parameters)
        Path(executed).write_text("{}")

    monkeypatch.setattr(papermill_runner.pm, "execute_notebook", execute)
    executed = papermill_runner.run_notebook(papermill_runner.list_notebooks()[0], str(path), progress=False)
    assert executed.parent == runs / "ci" / "table3" / "full" and seen["profile"] == str(path)


@pytest.mark.parametrize("name", grid_cells.available_grids())
def test_committed_grids_give_valid_profiles_on_the_committed_profiles(name, runs):
    grid = load_grid(name)
    assert grid.name == name and grid.cells
    for profile in ("ci", "demo"):
        for cell in grid.cells:
            in_memory = cell_config(profile, grid, cell)  # read before its file exists: the same settings
            cfg = load_profile(write_cell_profile(profile, grid, cell))
            assert cfg.profile == f"{profile}/{name}/{cell.name}" and cfg.search.topk <= cfg.search.topn
            assert in_memory == cfg


@pytest.mark.parametrize("profile", ["ci", "demo", "laptop", "paper"])
def test_the_committed_profiles_reduced_grids_name_real_cells_and_declared_parameters(profile):
    from cosearch_lib.runs import papermill_runner

    cfg = load_profile(profile)
    for name, cells in cfg.grids.run.items():
        grid = load_grid(name)
        assert all(grid.cell(c).name == c for c in cells)
        params = grids.cell_parameters(cfg, grid, grid.cell(cells[0]))
        declared = set().union(*(papermill_runner.notebook_parameters(b)
                                 for b in papermill_runner.select_notebooks(list(grid.notebooks))))
        assert set(params) <= declared, f"{profile}: grid {name} passes parameters its notebooks do not declare"


def test_the_committed_grids_are_the_paper_tables():
    assert set(grid_cells.available_grids()) >= {"table3", "table4"}
    assert {c.name for c in load_grid("table4").cells} == {"k1", "k3", "k5", "k10"}


def test_a_profile_names_its_reduced_grid_and_the_budget_of_every_cell(tmp_path, runs):
    profile = tmp_path / "small.yaml"
    profile.write_text(yaml.safe_dump({"extends": "ci", "profile": "small",
                                       "grids": {"run": {"table3": ["full", "no-r-main"]},
                                                 "parameters": {"steps": 1, "methods": "fixed_ranker"}}}))
    cfg = load_profile(profile)
    assert cfg.grids.run == {"table3": ["full", "no-r-main"]}
    grid = load_grid(grid_file(tmp_path, GRID))
    # grid file < profile budget < the cell's own parameters
    assert grids.cell_parameters(cfg, grid, grid.cell("full")) == {"methods": "fixed_ranker", "steps": 1}
    assert grids.cell_parameters(cfg, grid, grid.cell("k1")) == {"methods": "search_r1,cosearch", "steps": 1}
    for bad, message in [({"run": {"table3": []}}, "non-empty list"), ({"run": {"table3": "full"}}, "non-empty list"),
                         ({"parameters": [1]}, r"grids\.parameters must be a mapping of notebook parameter -> value, got \[1\]$"),
                         ({"cells": {}}, "unknown key")]:
        profile.write_text(yaml.safe_dump({"extends": "ci", "profile": "small", "grids": bad}))
        with pytest.raises(ConfigError, match=message):
            load_profile(profile)


def test_cosearch_run_runs_the_profiles_reduced_grid_right_before_the_notebooks_that_aggregate_it(tmp_path, runs):
    profile = tmp_path / "small.yaml"
    profile.write_text(yaml.safe_dump({"extends": "ci", "profile": "small",
                                       "grids": {"run": {"table3": ["no-r-main", "full"]}, "parameters": {"steps": 1}}}))
    calls = []

    def runner(profile, notebooks, *, parameters, progress):
        calls.append((load_profile(profile).profile, list(notebooks), parameters))
        if "/table3/" in load_profile(profile).profile:
            record(runs / load_profile(profile).profile, "ok")
        return []

    grids.run_workbook(str(profile), parameters={"n_per_dataset": 3}, runner=runner, progress=False)
    assert calls[0] == ("small", ["01", "02", "03"], {"n_per_dataset": 3})  # the -p value, where declared
    assert [c[0] for c in calls[1:3]] == ["small/table3/no-r-main", "small/table3/full"]  # the profile's order
    assert calls[1][1] == ["03"] and calls[1][2] == {"methods": "cosearch", "evaluate_ceiling": False, "steps": 1}
    assert calls[3] == ("small", ["04", "05"], {})  # 04 and 05 declare no n_per_dataset
    calls.clear()
    grids.run_workbook(str(profile), ["04"], runner=runner, progress=False)  # finished cells are skipped
    assert calls == [("small", ["04"], {})]
    calls.clear()
    grids.run_workbook(str(profile), ["01"], runner=runner, progress=False)  # nothing aggregates: no grid
    assert calls == [("small", ["01"], {})]
    with pytest.raises(ConfigError, match="no selected notebook") as err:
        grids.run_workbook(str(profile), ["01"], parameters={"n_per_dataset": 3}, runner=runner, progress=False)
    valid = sorted(papermill_runner.notebook_parameters(papermill_runner.select_notebooks(["01"])[0]))
    assert "n_per_dataset" not in valid and f"01_retriever_setup) has such a parameter; valid: {valid}" in str(err.value)
    with pytest.raises(ConfigError, match=r"-p \['metods'\]: .*valid: \[.*'methods'"):
        grids.run_workbook(str(profile), ["03", "04"], parameters={"metods": "cosearch"}, runner=runner, progress=False)
    assert calls == [("small", ["01"], {})]  # refused before anything ran
    profile.write_text(yaml.safe_dump({"extends": "ci", "profile": "small", "grids": {"run": {"table3": ["nope"]}}}))
    calls.clear()
    with pytest.raises(KeyError, match="no cell 'nope'"):
        grids.run_workbook(str(profile), runner=runner, progress=False)
    assert calls == []  # refused before anything ran


def test_a_profile_that_extends_a_grid_can_drop_it_and_its_figures_notebook_then_runs_alone(tmp_path, runs):
    """``grids.run: null`` over a parent's reduced grid: `cosearch run --notebooks 05` runs notebook 05 and
    trains no cell (the curve profiles extend laptop, which inherits demo's grid: a cell there would train
    CoSearch at the curve's recipe before the figures)."""
    parent, child = tmp_path / "parent.yaml", tmp_path / "child.yaml"
    parent.write_text(yaml.safe_dump({"extends": "ci", "profile": "parent", "grids": {"run": {"table3": ["full"]}}}))
    child.write_text(yaml.safe_dump({"extends": str(parent), "profile": "child", "grids": {"run": None}}))
    assert load_profile(parent).grids.run == {"table3": ["full"]} and load_profile(child).grids.run == {}
    calls = []

    def runner(profile, notebooks, *, parameters, progress):
        calls.append((load_profile(profile).profile, list(notebooks)))
        return []

    grids.run_workbook(str(child), ["05"], runner=runner, progress=False)
    assert calls == [("child", ["05"])]
    for name in ("laptop_curve", "laptop_curve_wide", "laptop_curve_bf16", "laptop_curve_multi", "laptop_curve_wide_seed1"):
        assert load_profile(name).grids.run == {}, name
    assert load_profile("laptop").grids.run == load_profile("demo").grids.run  # laptop keeps demo's reduced grid


def test_paper_grid_cells_become_data_parallel_jobs_of_the_gpus_their_plan_asks_for(tmp_path, runs):
    """The paper's cells cannot finish on one GPU; with slurm.gpus_per_node: 8 a Table 3 cell (CoSearch)
    becomes a job of one node of 8, a Table 4 cell (four methods, then their evaluation) of two. Each
    task trains and evaluates its cell on its ranks through one retrieval server, then runs notebook
    03, which reads them; the server starts first and is stopped once the array has ended."""
    table3, table4 = cell_plan("paper", load_grid("table3")), cell_plan("paper", load_grid("table4"))
    assert (table3.nodes, table3.gpus_per_node, table3.refusals) == (1, 8, [])
    assert (table4.nodes, table4.gpus_per_node, table4.refusals) == (2, 8, [])
    one_gpu = plan_job(load_profile("paper"), nodes=1, gpus_per_node=1, methods=("cosearch",), steps=None)
    assert one_gpu.refusals  # why the cell grew
    on_one_node = plan_job(load_profile("paper"), nodes=1, gpus_per_node=8, methods=("search_r1", "fixed_ranker", "cosearch", "oracle"))
    assert any(r.what.startswith("the run (its methods in turn") for r in on_one_node.refusals)  # why Table 4's needs two
    grid = load_grid("table4")
    scripts = slurm_scripts("paper", grid, table4)
    array = scripts["array"].splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gres=gpu:8",
                 f"#SBATCH --signal=B:USR1@{round(table4.signal_lead_s)}"):
        assert line in array
    text = scripts["array"]
    assert 'CELL_PROFILE="${CELL_PROFILES[$SLURM_ARRAY_TASK_ID]}"' in text and text.count("/profile.yaml") == len(grid.cells)
    train = next(line for line in array if "cosearch train" in line)
    assert "srun --kill-on-bad-exit=1" in train and "--methods search_r1,fixed_ranker,cosearch,oracle" in train
    assert '--retriever-url "$RETRIEVER_URL" --resume' in train
    evaluate = next(line for line in array if "cosearch evaluate" in line)
    assert '--profile "$CELL_PROFILE" --notebooks 03' in evaluate and array.index(evaluate) > array.index(train)
    assert array[-1].startswith('COSEARCH_RETRIEVER_URL="$RETRIEVER_URL" run_stoppable') and "--cell" in array[-1]
    assert "exec cosearch serve-retriever --profile paper" in scripts["retriever"]
    assert "--no-ceiling" in slurm_scripts("paper", load_grid("table3"), table3)["array"]  # table3: evaluate_ceiling false
    sent = []

    def sbatch(cmd, **kw):
        import subprocess
        sent.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{100 + len(sent)}\n", stderr="")
    out = submit_slurm("paper", grid, run=sbatch)
    assert [Path(c[-1]).name if not c[-1].startswith("--wrap") else c[-1] for c in sent] == [
        "retriever.sbatch", "array.sbatch", "aggregate.sbatch", "--wrap=scancel 101"]
    assert "--dependency=after:101" in sent[1] and "--export=ALL,COSEARCH_RETRIEVER_JOB=101" in sent[1]
    assert "--dependency=afterok:102" in sent[2] and "--dependency=afterany:102" in sent[3]
    assert out["cell"]["ranks"] == 16 and out["stop_retriever_job"] == "104"
    single = slurm_scripts("ci", load_grid(str(ROOT / "tests" / "slurm" / "ci_grid.yaml")))
    assert "retriever" not in single and "srun" not in single["array"]  # a one-rank cell: notebook 03 in the task


def test_a_warning_before_the_command_starts_is_kept_and_passed_on(tmp_path):
    """A SIGUSR1 that comes while the job script is still preparing (the warm start, the wait for the
    retrieval server; a time limit close to its warning) does not kill the batch shell: run_stoppable
    starts the command with COSEARCH_STOP_REQUESTED set (it stops at its first boundary, exit 75), and
    the job requeues itself, keeping that progress."""
    import subprocess
    import sys

    from cosearch_lib.runs.slurm_jobs import STOPPABLE_SH

    (tmp_path / "child.py").write_text("import os, sys\nprint('child saw', os.environ.get('COSEARCH_STOP_REQUESTED'), flush=True)\n"
                                       "sys.exit(75 if os.environ.get('COSEARCH_STOP_REQUESTED') else 0)\n")
    job = tmp_path / "job.sh"
    job.write_text("set -euo pipefail\n"
                   'scontrol() { echo "scontrol $*"; }\n'
                   'squeue() { echo "20:00"; }\n'
                   f"source {ROOT / STOPPABLE_SH}\n"
                   "kill -USR1 $$\n"  # the warning, during the preparation
                   'echo "still here"\n'
                   f'run_stoppable 41_2 {sys.executable} {tmp_path / "child.py"}\n'
                   'echo "not reached"\n')
    done = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stderr
    assert "still here" in done.stdout and "child saw SIGUSR1" in done.stdout
    assert "scontrol requeue 41_2" in done.stdout and "not reached" not in done.stdout


def test_a_cells_settings_share_no_mapping_with_its_overrides_nor_with_the_base(monkeypatch):
    """The merged profile data holds copies: a reader that edits what it got leaves the grid cell's overrides, and
    the base profile's data, as they were."""
    import copy

    from cosearch_lib.config import profile as profile_module
    from cosearch_lib.config.profile import _merged

    overrides = {"training": {"grouping": {"k_min": 2}}, "notebooks": {"03": {"methods": "cosearch"}}, "tags": ["a"]}
    kept = copy.deepcopy(overrides)
    base = {"training": {"steps": 3}, "search": {"topn": 10}, "tags": ["b"]}
    merged = _merged(base, overrides)
    merged["training"]["grouping"]["k_min"] = 9
    merged["notebooks"]["03"]["methods"] = "oracle"
    merged["tags"].append("c")
    merged["training"]["steps"] = 7
    merged["search"]["topn"] = 50
    assert overrides == kept and base == {"training": {"steps": 3}, "search": {"topn": 10}, "tags": ["b"]}

    def scribble(data):  # every nested mapping the reader gets, edited
        for value in data.values():
            if isinstance(value, dict):
                scribble(value)
                value["scribbled"] = True

    real = profile_module.from_dict

    def reader(cls, data, *args, **kwargs):
        built = real(cls, copy.deepcopy(data), *args, **kwargs)
        scribble(data)
        return built

    monkeypatch.setattr(profile_module, "from_dict", reader)
    grid = load_grid("table3")
    cell = GridCell("bf16", overrides={"training": {"autocast": {"rollout": True, "update": False}}})  # ci sets no autocast
    before = copy.deepcopy(cell.overrides)
    assert cell_config("ci", grid, cell).training.autocast.update is False
    assert cell.overrides == before
