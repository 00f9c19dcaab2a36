"""`cosearch plan` (planning.job_plan): the memory, time and refusals of a job shape, and the refusal
of `cosearch slurm train` / `cosearch grid --slurm` before anything is written or submitted."""

from __future__ import annotations

import math

import pytest
import yaml

from cosearch_lib.cli import main
from cosearch_lib.config import ConfigError, load_profile
from cosearch_lib.planning.job_plan import GIB, PlanRefused, gpus_in_gres, plan_job, slurm_gib, slurm_seconds
from cosearch_lib.planning.model_shapes import KNOWN_SHAPES, model_shape, shape_from_config
from cosearch_lib.planning.plan_report import format_plan
from cosearch_lib.planning.throughputs import cpu_rates, gpu_rates


def _profile(tmp_path, name: str, data: dict):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"profile": name, **data}))
    return path


# ----------------------------------------------------------------------------- shapes and memory model


def test_shapes_count_the_published_parameters():
    """Qwen2.5's model cards: 7.61B and 3.09B parameters; SmolLM2-135M: 134.5M; e5-base: 109M."""
    assert KNOWN_SHAPES["qwen/qwen2.5-7b-instruct"].parameters == pytest.approx(7.61e9, rel=0.005)
    assert KNOWN_SHAPES["qwen/qwen2.5-3b-instruct"].parameters == pytest.approx(3.09e9, rel=0.005)
    assert KNOWN_SHAPES["smollm2-135m-instruct"].parameters == pytest.approx(134.5e6, rel=0.005)
    assert KNOWN_SHAPES["intfloat/e5-base-v2"].parameters == pytest.approx(109e6, rel=0.01)
    # Qwen2.5-7B: 28 layers x 4 KV heads x 128 x 2 (K and V) x 2 bytes = 56 KiB per token
    assert KNOWN_SHAPES["qwen/qwen2.5-7b"].kv_bytes_per_token() == 56 * 1024
    with pytest.raises(ConfigError, match="no shape known.*config.json"):
        model_shape("org/unknown-model")


def test_a_local_model_folder_gives_its_own_shape(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, '
        '"num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": true}')
    assert model_shape(str(folder)).parameters == KNOWN_SHAPES["smollm2-135m-instruct"].parameters
    with pytest.raises(ConfigError, match="lacks a field"):
        shape_from_config({"hidden_size": 8}, "broken")


def test_the_activation_model_against_the_measured_h100_updates():
    """docs/GPU_COSTS.md: grpo_update with the 49,152-token SmolLM2 vocabulary, bf16, micro-batch
    4 x 1,500 tokens: the 135M shape took 7.6 GiB (fused attention: no scores kept) and the 3B shape
    44 GiB (attention scores kept, no checkpointing). The model (weights + activations) must land
    within 10% of both."""
    def peak(key: str, attention: str) -> float:
        shape = KNOWN_SHAPES[key]
        shape = type(shape)(**{**shape.__dict__, "vocab": 49152})
        return (shape.parameters * 2 + shape.activation_bytes(6000, 1500, checkpointing=False, attention=attention)) / GIB
    assert peak("smollm2-135m-instruct", "flash") == pytest.approx(7.6, rel=0.10)
    assert peak("qwen/qwen2.5-3b-instruct", "eager") == pytest.approx(44, rel=0.10)
    seven = KNOWN_SHAPES["qwen/qwen2.5-7b"]
    with_ckpt = seven.activation_bytes(6000, 1500, checkpointing=True, attention="eager")
    without = seven.activation_bytes(6000, 1500, checkpointing=False, attention="eager")
    assert with_ckpt < without / 3  # checkpointing keeps a layer's input, not its intermediates


# ----------------------------------------------------------------------------- the paper's plans


def test_the_paper_on_two_nodes_of_eight_fits_and_finishes():
    plan = plan_job(load_profile("paper"), nodes=2, gpus_per_node=8)
    assert plan.ranks == 16 and not plan.refusals, [str(r) for r in plan.refusals]
    assert plan.rank_memory["weights"] == pytest.approx(7.6e9 * 2 / GIB, rel=0.01)  # bf16, one base for both roles
    assert plan.rank_memory["activations (checkpointing)"] < plan.rank_memory["activations (no checkpointing)"]
    assert plan.rank_capacity["engine"] == pytest.approx(0.5 * 79.6)  # models.vllm.gpu_memory_utilization
    assert plan.retriever_memory["flat index"] == pytest.approx(21_015_324 * 768 * 4 / GIB)  # wiki-18's e5 index: ~60 GiB
    for m, stages in plan.stages.items():
        assert set(stages) == {"rollout", "ranker calls", "retrieval", "update", "validation"}
        assert plan.step_s[m] == pytest.approx(sum(stages.values()))
        assert plan.steps_per_job[m] >= 1 and math.isfinite(plan.gpu_hours[m])
    assert plan.stages["search_r1"]["ranker calls"] == 0 < plan.stages["cosearch"]["ranker calls"]
    # the stop warning is derived (paper.yaml sets no slurm.signal_lead_s) and covers the longest step
    assert plan.lead_derived and plan.signal_lead_s > max(plan.uncuttable_s.values())
    # 16 GPUs take a step ~16 x less wall time than one (plus what crosses ranks)
    one = plan_job(load_profile("paper"), nodes=1, gpus_per_node=1, methods=("cosearch",))
    assert one.step_s["cosearch"] / plan.step_s["cosearch"] == pytest.approx(16, rel=0.2)
    text = format_plan(plan)
    for heading in ("GPU memory per rank (GiB)", "host memory per node (GiB)", "disk (GiB)",
                    "seconds per step by stage", "one table3 grid cell", "one table4 grid cell", "GPU_COSTS.md", "fits and finishes"):
        assert heading in text


def test_the_paper_on_one_gpu_names_what_cannot_finish(capsys):
    plan = plan_job(load_profile("paper"), nodes=1, gpus_per_node=1)
    why = [str(r) for r in plan.refusals]
    assert any(r.startswith("cosearch cannot finish within its job's requeues") and "slurm.max_requeues" in r for r in why), why
    assert main(["plan", "--profile", "paper", "--nodes", "1", "--gpus-per-node", "1"]) == 1  # exit 1: refused
    assert "CANNOT FIT OR FINISH" in capsys.readouterr().out


def test_slurm_train_refuses_before_sbatch_and_writes_nothing(tmp_path, monkeypatch):
    from cosearch_lib.runs.slurm_training import submit_training

    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    never = lambda *a, **k: pytest.fail("sbatch was called")  # noqa: E731
    with pytest.raises(PlanRefused, match="(?s)cosearch cannot finish within its job.s requeues.*--force submits anyway"):
        submit_training("paper", ["cosearch"], nodes=1, gpus_per_node=1, run=never)
    assert not (tmp_path / "runs").exists()  # nothing written
    assert main(["slurm", "train", "--profile", "paper", "--methods", "cosearch", "--nodes", "1", "--gpus-per-node", "1"]) == 2
    assert not (tmp_path / "runs").exists()


def test_force_submits_what_the_plan_refuses(tmp_path, monkeypatch):
    from cosearch_lib.runs.slurm_training import submit_training

    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    short = _profile(tmp_path, "ci_short", {"extends": "ci", "slurm": {"time": "00:00:30"}})
    with pytest.raises(PlanRefused, match=r"the time limit is under a minute.*slurm\.time"):
        submit_training(short, ["cosearch"], nodes=1, gpus_per_node=0, run=lambda *a, **k: pytest.fail("submitted"))
    jobs = iter(["11", "12"])

    def sbatch(cmd, **kwargs):
        import subprocess
        return subprocess.CompletedProcess(cmd, 0, stdout=next(jobs) + "\n", stderr="")
    out = submit_training(short, ["cosearch"], nodes=1, gpus_per_node=0, evaluate=False, force=True, run=sbatch)
    assert out["train_job"] == "12" and any("under a minute" in r for r in out["plan"]["refused_but_forced"])


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("data, shape, setting", [
    ({"extends": "paper"}, {"gpus_per_node": 0}, "--gpus-per-node"),  # Unsloth without a GPU
    ({"extends": "ci", "training": {"micro_batch": 8}}, {"gpus_per_node": 0}, "training.micro_batch"),
    ({"extends": "ci", "slurm": {"time": "00:00:45"}}, {"gpus_per_node": 0}, "slurm.time"),
    ({"extends": "paper"}, {"nodes": 3, "gpus_per_node": 8}, "training.questions_per_step"),  # 4,096 rollouts over 24 ranks
])
def test_impossible_requests_are_refused_naming_the_setting(tmp_path, monkeypatch, data, shape, setting):
    from cosearch_lib.runs.slurm_training import submit_training

    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    path = _profile(tmp_path, "bad", data)
    plan = plan_job(load_profile(path), **shape, methods=("cosearch",))
    assert any(setting in r.setting for r in plan.refusals), [str(r) for r in plan.refusals]
    with pytest.raises(PlanRefused, match=setting.replace(".", r"\.")):
        submit_training(path, ["cosearch"], nodes=shape.get("nodes", 1), gpus_per_node=shape["gpus_per_node"],
                        run=lambda *a, **k: pytest.fail("submitted"))
    assert not (tmp_path / "runs").exists()


def test_malformed_shapes_and_settings_are_clear_errors(tmp_path):
    cfg = load_profile("ci")
    with pytest.raises(ConfigError, match="--nodes 0"):
        plan_job(cfg, nodes=0)
    with pytest.raises(ConfigError, match="--gpus-per-node -1"):
        plan_job(cfg, gpus_per_node=-1)
    with pytest.raises(ConfigError, match="--gpu 'tpu'"):
        gpu_rates("tpu")
    with pytest.raises(ConfigError, match="not a SLURM time"):
        slurm_seconds("a day")
    with pytest.raises(ConfigError, match="not a SLURM memory size"):
        slurm_gib("lots")
    with pytest.raises(ConfigError, match="gpu:<count>"):
        gpus_in_gres("gpu:h100")
    broken = tmp_path / "rates.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        cpu_rates(path=broken)
    broken.write_text('{"by_threads": {"2": {"policies": {}}}}')
    with pytest.raises(ConfigError, match="lacks"):
        cpu_rates(path=broken)


def test_slurm_times_and_sizes():
    assert slurm_seconds("90") == 5400 and slurm_seconds("30:00") == 1800 and slurm_seconds("24:00:00") == 86400
    assert slurm_seconds("2-00:00:00") == 172800 and slurm_seconds("1-12") == 129600
    assert slurm_gib("128G") == 128 and slurm_gib("4096M") == 4 and slurm_gib("1T") == 1024 and slurm_gib("2048") == 2
    assert gpus_in_gres("gpu:8") == 8 and gpus_in_gres("gpu:h100:4") == 4 and gpus_in_gres(None) == 0


def test_the_cpu_profiles_plan_on_this_machines_rates():
    """ci, demo and laptop plan as one CPU rank (the committed CPU benchmark's rates) without refusal
    at their own slurm settings; their ranks fit slurm.mem."""
    for name in ("ci", "demo", "laptop"):
        plan = plan_job(load_profile(name), gpus_per_node=0, methods=("search_r1", "cosearch"))
        assert not plan.refusals, (name, [str(r) for r in plan.refusals])
        assert plan.device.startswith("CPU") and plan.step_s["cosearch"] > plan.step_s["search_r1"] > 0


def test_training_autocast_plans_a_cpu_ranks_rollouts_and_updates_at_the_measured_bf16_factors():
    """laptop_curve_wide trains under bf16 autocast: its rollouts and updates plan at the CPU record's bf16
    factors (benchmarks/cpu_throughput.py --bf16), its validation and evaluation in float32; without factors
    in the record, or on a GPU (bf16 already), the plan is float32's and says why."""
    from dataclasses import replace

    from cosearch_lib.config import AutocastConfig

    cfg = load_profile("laptop_curve_wide")
    assert cfg.training.autocast == AutocastConfig(rollout=True, update=True)
    rates = cpu_rates(2)
    f = {k: m.value for k, m in rates.bf16.items()}
    assert set(f) == {"decode", "prefill", "train", "judge", "judge_train"} and f["train"] > 1.5  # measured on avx512_bf16
    bf16 = plan_job(cfg, gpus_per_node=0, methods=("search_r1", "cosearch"), rates=rates)
    f32 = plan_job(replace(cfg, training=replace(cfg.training, autocast=None)), gpus_per_node=0,
                   methods=("search_r1", "cosearch"), rates=rates)
    for m in ("search_r1", "cosearch"):
        assert bf16.validation_s[m] == f32.validation_s[m]  # validation runs in float32
        # faster, though under autocast the update also recomputes the old log-probs (one more forward pass)
        assert f32.stages[m]["update"] / max(f.values()) < bf16.stages[m]["update"] < f32.stages[m]["update"]
    assert bf16.stages["search_r1"]["update"] < f32.stages["search_r1"]["update"] / 1.5
    assert bf16.evaluation_s == f32.evaluation_s
    assert any("updates bf16" in n for n in bf16.notes) and not any("autocast" in n for n in f32.notes)
    # the rollout's agent: the prefill sped up, the decode at its own factor (about parity on this CPU)
    agent = bf16.stages["search_r1"]["rollout"] / f32.stages["search_r1"]["rollout"]
    assert min(1 / f["prefill"], 1 / f["decode"]) < agent < 1

    def plan(**changes):
        training = replace(cfg.training, **{k: v for k, v in changes.items() if k != "models"})
        return plan_job(replace(cfg, training=training, models=changes.get("models", cfg.models)), gpus_per_node=0,
                        methods=("search_r1", "cosearch"), rates=rates)
    rollout_only = plan(autocast=AutocastConfig(rollout=True, update=False))
    update_only = plan(autocast=AutocastConfig(rollout=False, update=True))
    no_recompute = plan(grpo=replace(cfg.training.grpo, old_logprobs="backend"))
    vllm = plan(models=replace(cfg.models, backend="vllm"))
    for m in ("search_r1", "cosearch"):
        assert rollout_only.stages[m]["rollout"] == bf16.stages[m]["rollout"] and update_only.stages[m]["rollout"] == f32.stages[m]["rollout"]
        assert update_only.stages[m]["update"] == bf16.stages[m]["update"]
        # a bf16 rollout alone still makes the float32 update recompute the old log-probs: one more forward pass
        assert rollout_only.stages[m]["update"] > f32.stages[m]["update"]
        assert no_recompute.stages[m]["update"] < bf16.stages[m]["update"]  # old_logprobs: backend skips that pass
        assert vllm.stages[m]["rollout"] == plan(models=replace(cfg.models, backend="vllm"), autocast=None).stages[m]["rollout"]
    # a record without the factors: float32, said so
    bare = plan_job(cfg, gpus_per_node=0, methods=("cosearch",), rates=replace(rates, bf16={}))
    assert bare.step_s["cosearch"] == f32.step_s["cosearch"] and any("planned in float32" in n for n in bare.notes)
    assert not any("autocast" in n for n in plan_job(cfg, gpus_per_node=1, methods=("cosearch",)).notes)


def test_readme_shows_the_plan_of_the_papers_setting():
    """README.md's table is what the planner says of the paper on 1 and 2 nodes of 8 H100s
    (docs/PLAN.md, generated, holds the full outputs)."""
    from cosearch_lib.paths import project_root
    from cosearch_lib.records.plan_page import paper_summary

    table = paper_summary(((1, 8), (2, 8)))
    assert table in (project_root() / "README.md").read_text() and "fits and finishes" in table
    assert main(["plan", "--profile", "paper", "--nodes", "2", "--gpus-per-node", "8"]) == 0


def test_the_notebook_job_helper_plans_then_submits_with_the_plans_warning(tmp_path):
    """`cosearch slurm notebooks`: run_notebooks.sbatch's submit helper. The paper on its default one
    GPU cannot finish CoSearch: refused before sbatch. demo fits: sbatch gets the profile's resources
    and the plan's warning on its command line, the notebooks and parameters in the environment."""
    import subprocess

    from cosearch_lib.runs.slurm_training import submit_notebooks

    with pytest.raises(PlanRefused, match="cosearch cannot finish"):
        submit_notebooks("paper", ["03"], run=lambda *a, **k: pytest.fail("submitted"))
    sent = {}

    def sbatch(cmd, **kwargs):
        sent.update(cmd=cmd, env=kwargs.get("env", {}))
        return subprocess.CompletedProcess(cmd, 0, stdout="77\n", stderr="")
    out = submit_notebooks("demo", ["03"], params=["steps=2", "methods=search_r1,cosearch"], run=sbatch)
    lead = round(plan_job(load_profile("demo"), gpus_per_node=1, methods=("search_r1", "cosearch")).signal_lead_s)
    assert out["job"] == "77" and f"--signal=B:USR1@{lead}" in sent["cmd"] and "--export=ALL" in sent["cmd"]
    assert "--time=24:00:00" in sent["cmd"] and sent["cmd"][-1].endswith("papermill_runs/slurm/run_notebooks.sbatch")
    assert sent["env"]["PROFILE"] == "demo" and sent["env"]["NOTEBOOKS"] == "03"
    assert sent["env"]["PARAMS"] == "-p steps=2 -p methods=search_r1,cosearch"  # commas intact


# ----------------------------------------------------------------------------- the planner against measured steps


def _stage_record():
    import pandas as pd

    from cosearch_lib.paths import project_root
    from cosearch_lib.planning.stage_check import STAGE_RECORD

    return pd.read_csv(project_root() / STAGE_RECORD)


def test_the_planner_predicts_the_committed_cpu_steps_within_30_percent():
    """Every stage of every committed step of ci, demo and laptop (benchmarks/stage_times.py, measured
    alone on this machine), predicted by the planner from its profile, the step's observed behaviour
    and the committed CPU throughputs, falls within +-30% of the measured seconds."""
    from cosearch_lib.planning.stage_check import TOLERANCE, stage_errors

    record = _stage_record()
    errors = stage_errors(record)
    measured = {(p, s) for p, s in zip(errors["profile"], errors["stage"])}
    for profile in ("ci", "demo", "laptop"):  # rollout and update of each; validation where the profile validates
        assert {(profile, "time/rollout_s"), (profile, "time/update_s")} <= measured, profile
    assert {("ci", "time/validate_s"), ("laptop", "time/validate_s")} <= measured
    assert set(record["method"]) >= {"search_r1", "cosearch"}
    outside = errors[errors["error"].abs() > TOLERANCE]
    assert outside.empty, "\n" + outside.round(2).to_string()


def test_the_stage_check_fails_when_a_throughput_is_off():
    """The check is sensitive: the same records against CPU rates whose training throughput is halved
    put the update outside the tolerance."""
    from dataclasses import replace

    from cosearch_lib.planning.stage_check import TOLERANCE, stage_errors
    from cosearch_lib.planning.throughputs import Measured

    rates = cpu_rates(2)
    slow = replace(rates, policies={n: replace(r, train_tps=Measured(r.train_tps.value / 2, "halved"))
                                    for n, r in rates.policies.items()})
    errors = stage_errors(_stage_record(), slow)
    update = errors[errors["stage"] == "time/update_s"]
    assert (update["error"] > TOLERANCE).mean() > 0.5


def test_stage_times_reads_a_finished_run_into_the_stage_record(tmp_path, monkeypatch):
    """benchmarks/stage_times.py --no-train: each step of the profile's last run becomes a record row with
    its stage times, its rounds (the longest trajectory's searches + 1, from ranker_calls.parquet) and
    the validation's items; rows of other profiles already in the record are kept."""
    import subprocess
    import sys

    import pandas as pd

    from cosearch_lib.paths import project_root

    runs = tmp_path / "runs"
    folder = runs / "ci" / "training" / "search_r1"
    folder.mkdir(parents=True)
    pd.DataFrame([{"step": -1, "method": "search_r1", "val/f1": 0.1},
                  {"step": 0, "method": "search_r1", "rollout/n_trajectories": 4, "rollout/searches_per_traj": 1.5,
                   "time/rollout_s": 50.0, "time/update_s": 30.0},
                  {"step": 1, "method": "search_r1", "rollout/n_trajectories": 4, "rollout/searches_per_traj": 1.0,
                   "time/rollout_s": 40.0, "time/update_s": 20.0, "time/validate_s": 55.0}]).to_csv(folder / "steps.csv", index=False)
    pd.DataFrame([{"step": 0, "traj_id": t, "turn": n} for t, n in (("a", 0), ("a", 1), ("a", 2), ("b", 0))]
                 + [{"step": 1, "traj_id": "a", "turn": 0}]).to_parquet(folder / "ranker_calls.parquet")
    pd.DataFrame([{"step": 1, "kind": "agent"}] * 7 + [{"step": 1, "kind": "ranker"}] * 12).to_csv(folder / "validation.csv", index=False)
    out = tmp_path / "stage_times.csv"
    pd.DataFrame([{"profile": "demo", "method": "cosearch", "step": 0, "time/rollout_s": 1.0}]).to_csv(out, index=False)
    done = subprocess.run([sys.executable, str(project_root() / "benchmarks" / "stage_times.py"), "--profile", "ci",
                           "--methods", "search_r1", "--no-train", "--out", str(out)],
                          env={**__import__("os").environ, "COSEARCH_RUNS": str(runs)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    record = pd.read_csv(out)
    ci = record[record["profile"] == "ci"].set_index("step")
    assert list(ci.index) == [0, 1] and set(record["profile"]) == {"ci", "demo"}
    assert ci.loc[0, "rollout_rounds"] == 4 and ci.loc[1, "rollout_rounds"] == 2  # 3 searches + the answer; 1 + 1
    assert ci.loc[1, "val_agent_questions"] == 7 and ci.loc[1, "val_ranker_items"] == 12
    assert ci.loc[1, "time/validate_s"] == 55.0 and ci.loc[0, "time/update_s"] == 30.0
