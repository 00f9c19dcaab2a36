"""Run records, atomic writes, the house style of the committed notebooks, and notebook parameters."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from cosearch_lib.atomic_io import atomic_dir, atomic_path, build_lock, current_umask, write_json, write_table
from cosearch_lib.config import ConfigError, load_profile
from cosearch_lib.paths import describe_saved, project_root
from cosearch_lib.records.docs import copy_run_records
from cosearch_lib.records.provenance import environment_snapshot
from cosearch_lib.runs.papermill_runner import (
    check_parameters,
    check_profile_notebooks,
    list_notebooks,
    notebook_parameters,
    parse_parameter,
    profile_notebook_parameters,
    select_notebooks,
)


def test_atomic_path_leaves_nothing_on_failure_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "result.json"
    write_json({"v": 1}, target)
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half-writ")
            raise RuntimeError("crash mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_write_table_round_trips_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    for suffix in ("csv", "parquet"):
        path = write_table(df, tmp_path / f"t.{suffix}")
        back = pd.read_csv(path) if suffix == "csv" else pd.read_parquet(path)
        pd.testing.assert_frame_equal(back, df)
    with pytest.raises(ValueError, match=".csv or .parquet"):
        write_table(df, tmp_path / "t.txt")


@pytest.fixture
def umask():
    """Set the process umask for one test (``umask(0o077)``), restored afterwards."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)])
def test_atomic_writes_honour_the_umask_as_open_and_mkdir_do(tmp_path, umask, mask, file_mode, dir_mode):
    umask(mask)
    assert current_umask() == mask and current_umask() == mask  # reading it leaves it as it was
    df = pd.DataFrame({"a": [1]})
    written = [write_json({"v": 1}, tmp_path / "r.json"), write_table(df, tmp_path / "t.csv"),
               write_table(df, tmp_path / "t.parquet")]
    with atomic_dir(tmp_path / "folder") as tmp:
        (tmp / "inside.txt").write_text("x")
    with open(tmp_path / "plain.txt", "w") as plain:  # what the notebooks' own writes get
        plain.write("x")
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(file_mode) for p in written}
    assert oct((tmp_path / "plain.txt").stat().st_mode & 0o777) == oct(file_mode)
    assert oct((tmp_path / "folder").stat().st_mode & 0o777) == oct(dir_mode)
    assert oct((tmp_path / "folder" / "inside.txt").stat().st_mode & 0o777) == oct(file_mode)


def test_environment_snapshot_names_versions_and_device():
    snap = environment_snapshot()
    assert snap["device"] == "cpu" or snap["device"].startswith("cuda")
    assert {"torch", "transformers", "numpy"} <= set(snap["packages"])
    assert snap["git_sha"] is None or len(snap["git_sha"]) == 40


def _scratch_repo(root: Path):
    """A git repository at ``root`` with one commit of a.txt; returns git(*args) -> stdout there."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # not a hook's repository

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                              cwd=root, env=env, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (root / "a.txt").write_text("one")
    git("add", "a.txt")
    git("commit", "-qm", "one")
    return git


def test_the_snapshot_records_the_commit_the_process_started_on_not_a_later_one(tmp_path, monkeypatch):
    from cosearch_lib.records import provenance

    git = _scratch_repo(tmp_path)
    monkeypatch.setattr(provenance, "project_root", lambda: tmp_path)
    provenance.process_commit.cache_clear()
    try:
        started = git("rev-parse", "HEAD")
        assert environment_snapshot()["git_sha"] == started and environment_snapshot()["git_dirty"] is False
        (tmp_path / "a.txt").write_text("two")
        git("commit", "-qam", "two")  # work goes on in the tree while the run runs
        now = git("rev-parse", "HEAD")
        assert now != started and environment_snapshot()["git_sha"] == started  # what the run's code came from
        assert environment_snapshot(commit_now=True)["git_sha"] == now  # what a kernel started now imports
        (tmp_path / "a.txt").write_text("three")
        (tmp_path / "untracked.txt").write_text("not the code")
        assert environment_snapshot(commit_now=True)["git_dirty"] is True  # a tracked file changed
        (tmp_path / "a.txt").write_text("two")
        assert environment_snapshot(commit_now=True)["git_dirty"] is False  # untracked files do not count
    finally:
        provenance.process_commit.cache_clear()


def test_a_process_reads_its_commit_when_it_imports_provenance(tmp_path):
    """Read at import: a record written at the end of a long step (the warm start's, the trainer's) names the
    commit of the code the process loaded, though HEAD moved on before the record was written."""
    import subprocess
    import sys

    git = _scratch_repo(tmp_path)
    started = git("rev-parse", "HEAD")
    script = ("import subprocess, sys; from cosearch_lib.records import provenance; "
              "subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'commit.gpgsign=false', "
              "'commit', '-q', '--allow-empty', '-m', 'later'], cwd=sys.argv[1], check=True); "
              "print(provenance.process_commit()[0])")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, "COSEARCH_ROOT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                          check=True)
    assert git("rev-parse", "HEAD") != started and done.stdout.strip() == started


def test_notebook_selection():
    books = list_notebooks()
    assert books and books[0].name.startswith("01_")
    assert select_notebooks(["01"]) == [books[0]]
    with pytest.raises(FileNotFoundError, match="99"):
        select_notebooks(["99"])


@pytest.mark.parametrize("path", list_notebooks(), ids=lambda p: p.name)
def test_notebooks_follow_house_style(path):
    nb = nbformat.read(path, as_version=4)
    raw_ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]  # as committed, before nbformat fills gaps
    assert all(raw_ids) and len(set(raw_ids)) == len(raw_ids), "every cell needs its own id (nbformat 4.5)"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit notebooks without outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    tree = ast.parse(params[0].source)
    for node in tree.body:  # flat literals only: papermill overrides them by name
        assert isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        ast.literal_eval(node.value)
    names = {n.targets[0].id for n in tree.body}
    assert {"profile", "seed"} <= names
    # papermill reads the cell with its own line parser (a quote in a comment can defeat it)
    import papermill

    assert set(papermill.inspect_notebook(str(path))) == names, "papermill must see every parameter"
    lines = sorted(len(c.source.splitlines()) for c in code)
    assert lines[len(lines) // 2] <= 8, "cells stay short (median <= 8 lines): logic belongs in cosearch_lib"


# ------------------------------------------------------------------------------ notebook parameters


def test_notebook_parameters_are_read_from_the_parameters_cell():
    params = notebook_parameters(select_notebooks(["03"])[0])
    assert params["methods"] == "cosearch" and params["profile"] == "demo" and isinstance(params["steps"], int)


@pytest.mark.parametrize("text, expected", [("steps=3", ("steps", 3)), ("resume=false", ("resume", False)),
                                            ("methods=cosearch,search_r1", ("methods", "cosearch,search_r1")),
                                            ("agent_adapter=", ("agent_adapter", ""))])
def test_parse_parameter_reads_values_as_yaml(text, expected):
    assert parse_parameter(text) == expected


@pytest.mark.parametrize("text", ["steps", "=3", "two words=1"])
def test_parse_parameter_refuses_what_is_not_name_equals_value(text):
    with pytest.raises(ConfigError, match="name=value"):
        parse_parameter(text)


def test_unknown_or_mistyped_parameters_are_errors_that_list_the_valid_ones():
    nb = select_notebooks(["03"])[0]
    with pytest.raises(ConfigError, match=r"no parameter\(s\) \['metods'\]; its parameters: .*'methods'"):
        check_parameters(nb, {"metods": "cosearch"}, "-p")
    with pytest.raises(ConfigError, match="steps expects int"):
        check_parameters(nb, {"steps": "three"}, "-p")
    check_parameters(nb, {"methods": "search_r1,cosearch", "steps": 4}, "-p")  # fine


def _fake_runs(monkeypatch):
    import cosearch_lib.runs.papermill_runner as runner

    calls = []
    monkeypatch.setattr(runner, "run_notebook", lambda nb, profile, **kw: calls.append((nb.name[:2], kw["parameters"])) or nb)
    monkeypatch.setattr(runner, "run_warm_start", lambda cfg, **kw: calls.append(("warm start", cfg.profile)) or
                        {"cached": True, "wall_s": 0.0})
    return runner, calls


def test_run_profile_checks_parameters_before_running_anything(monkeypatch):
    runner, calls = _fake_runs(monkeypatch)
    with pytest.raises(ConfigError, match=r"-p \['stepz'\]: no selected notebook \(01_\w+, 03_\w+\) has such a parameter; "
                                          r"valid: .*'steps'"):
        runner.run_profile("ci", ["01", "03"], parameters={"stepz": 2})
    assert calls == []  # nothing ran


def test_a_bad_model_name_is_refused_before_the_warm_start_and_the_notebooks(monkeypatch, tmp_path):
    import time

    import cosearch_lib.runs.papermill_runner as real
    from cosearch_lib.models import registry

    loaded = []
    for loader in ("load_causal_lm", "load_encoder", "load_tokenizer"):  # nothing may be loaded to find out
        if hasattr(registry, loader):
            monkeypatch.setattr(registry, loader, lambda *a, _n=loader, **k: loaded.append(_n))
    warm_start = real.run_warm_start
    runner, calls = _fake_runs(monkeypatch)
    profile = tmp_path / "typo.yaml"
    profile.write_text("extends: ci\nprofile: typo\nmodels: {agent: no-such-model}\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        runner.run_profile(str(profile), ["01", "03"])
    assert time.perf_counter() - t0 < 2.0 and calls == [] and loaded == []  # before anything ran or loaded
    assert str(err.value).startswith("models.agent: 'no-such-model' is not a bundled model")
    assert "all-minilm-l6-v2, smollm2-135m-instruct" in str(err.value)
    with pytest.raises(ConfigError, match="models.agent: 'no-such-model'"):  # `cosearch warm-start` checks too
        warm_start(load_profile(str(profile)), out_dir=tmp_path)
    assert not (tmp_path / "warmstart.run.json").exists()
    profile.write_text("extends: ci\nprofile: typo\ntraining: {ranker_kind: cross_encoder}\n"
                       "retrieval: {encoder: {model: ./no/such/folder}}\n")
    with pytest.raises(ConfigError, match=r"retrieval.encoder.model: './no/such/folder' is no folder on this machine"):
        runner.run_profile(str(profile), ["01"])
    assert calls == [] and loaded == []


@pytest.mark.parametrize("name", ["ci", "demo", "paper"])
def test_committed_profiles_name_models_that_resolve_or_are_hub_ids(name, monkeypatch):
    from cosearch_lib.experiment.preflight import model_names as profile_model_names
    from cosearch_lib.models.registry import check_model_name

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    cfg = load_profile(name)
    assert set(profile_model_names(cfg)) >= {"models.agent", "models.ranker", "retrieval.encoder.model"}
    for key, model in profile_model_names(cfg).items():
        check_model_name(key, model)


def test_run_profile_sends_each_notebook_its_parameters_and_warm_starts_first(monkeypatch):
    runner, calls = _fake_runs(monkeypatch)
    runner.run_profile("ci", ["01", "03"], parameters={"steps": 1, "methods": "search_r1"})
    assert calls == [("01", {}), ("warm start", "ci"), ("03", {"steps": 1, "methods": "search_r1"})]
    calls.clear()
    runner.run_profile("ci", ["01"])  # notebook 01 needs no warm start
    assert calls == [("01", {})]
    calls.clear()
    runner.run_profile("ci", ["04"])  # notebook 04 reads the grids' records: no warm start either
    assert calls == [("04", {})]


def test_profile_notebook_sections_are_validated(tmp_path, monkeypatch):
    from cosearch_lib.config import ProfileConfig, from_dict

    runner, calls = _fake_runs(monkeypatch)
    cfg = from_dict(ProfileConfig, {"notebooks": {"03": {"steps": 5}, "02_oracle_gap_study": {"n_show": 1}}})
    check_profile_notebooks(cfg)
    assert profile_notebook_parameters(cfg, select_notebooks(["03"])[0]) == {"steps": 5}
    for bad, match in (({"03": {"stepz": 5}}, r"notebooks.03: 03_joint_grpo_training has no parameter"),
                       ({"99": {"steps": 5}}, r"notebooks.99: matches 0 notebooks")):
        with pytest.raises(ConfigError, match=match):
            check_profile_notebooks(from_dict(ProfileConfig, {"notebooks": bad}))
    with pytest.raises(ConfigError, match=r"^notebooks must be a mapping of notebook -> \{parameter: value\}, "
                                          r"got \{'03': 'steps=5'\}$"):
        from_dict(ProfileConfig, {"notebooks": {"03": "steps=5"}})


@pytest.mark.parametrize("name", ["ci", "demo", "paper"])
def test_committed_profiles_name_only_real_notebook_parameters(name):
    check_profile_notebooks(load_profile(name))


def test_copied_run_records_name_no_machine(tmp_path):
    run = tmp_path / "demo"
    run.mkdir()
    inside = str(project_root().resolve() / "data" / "cache" / "warmstart" / "v1-x" / "agent")
    record = {"adapters": {"agent": inside, "other": "/opt/elsewhere/agent"},
              "list": [inside, 3, None], "text": "not a path", "prefix_only": str(project_root().resolve()) + "-copy"}
    (run / "warmstart.run.json").write_text(json.dumps(record))
    dest = copy_run_records(run, tmp_path / "results")
    copied = json.loads((dest / "warmstart.run.json").read_text())
    assert copied["adapters"] == {"agent": "data/cache/warmstart/v1-x/agent", "other": "/opt/elsewhere/agent"}
    assert copied["list"] == ["data/cache/warmstart/v1-x/agent", 3, None]
    assert copied["text"] == "not a path" and copied["prefix_only"] == record["prefix_only"]


def test_saved_files_are_described_in_one_project_relative_line():
    root = project_root().resolve()
    figs = [root / "figures" / "demo" / "oracle_gap.png", root / "figures" / "demo" / "oracle_gap.pdf",
            root / "figures" / "demo" / "oracle_gap.csv", Path("/opt/elsewhere/records.parquet"),
            root / "papermill_runs" / "demo" / "LOG"]
    assert describe_saved(figs) == ("saved figures/demo/oracle_gap.{png,pdf,csv}, /opt/elsewhere/records.parquet, "
                                    "papermill_runs/demo/LOG")
    assert describe_saved([]) == "saved nothing" and "PosixPath" not in describe_saved(figs)


def test_the_kernel_of_a_headless_run_gets_text_progress_and_the_environment_is_restored(tmp_path, monkeypatch):
    from cosearch_lib.runs import papermill_runner

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's own setting comes back afterwards
    monkeypatch.delenv("PAPERMILL_EXECUTION", raising=False)
    seen = {}

    def execute(notebook, executed, **kw):
        seen.update({name: os.environ.get(name) for name in papermill_runner.HEADLESS_KERNEL_ENV})
        Path(executed).write_text("{}")

    monkeypatch.setattr(papermill_runner.pm, "execute_notebook", execute)
    papermill_runner.run_notebook(list_notebooks()[0], "ci", out_dir=tmp_path, progress=False)
    assert seen == {"PAPERMILL_EXECUTION": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0" and "PAPERMILL_EXECUTION" not in os.environ


def test_build_lock_makes_a_second_process_wait_until_the_first_has_built(tmp_path):
    """Two processes building the same cache (test workers, data-parallel ranks on a fresh clone):
    the second takes the lock only after the first released it, and then finds the build."""
    import subprocess
    import sys
    import time

    target = tmp_path / "cache" / "model"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from cosearch_lib.atomic_io import build_lock\n"
        f"target = Path({str(target)!r})\n"
        "with build_lock(target):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(1.5)\n"
        "    target.mkdir()\n"
        "    (target / 'done').write_text('built')\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with build_lock(target):
        waited = time.monotonic() - started
        assert (target / "done").read_text() == "built"  # the first build is complete when we get the lock
    assert holder.wait(timeout=30) == 0 and waited > 0.5
    with build_lock(target):  # released on exit: taken again at once
        pass


def test_atomic_dir_replaces_a_folder_only_when_the_new_one_is_complete(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "weights.bin").write_text("v1")
    assert (target / "weights.bin").read_text() == "v1"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "weights.bin").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (target / "weights.bin").read_text() == "v1"  # the old folder, untouched
    with atomic_dir(target) as tmp:
        (tmp / "other.bin").write_text("v2")
    assert sorted(p.name for p in target.iterdir()) == ["other.bin"]  # replaced whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or old folders left
