"""Live step logging: exact TensorBoard / W&B calls through fake modules, optional packages, config checks."""

from __future__ import annotations

import math
import sys
import types
import warnings

import numpy as np
import pytest

from cosearch_lib.config import ConfigError, ProfileConfig, TrainConfig, check_kinds, from_dict
from cosearch_lib.rl.tracking import make_tracker, scalars
from cosearch_lib.rl.trainer import JointTrainer, TrainerInputs

from tests.doubles import tiny_model, trainer

RECORD = {"step": 3, "method": "cosearch", "agent_reward": 0.25, "n_trajectories": 8, "hit@K": np.float64(0.5),
          "ranker_reward_post": float("nan"), "flag": True, "note": None, "n_calls": np.int64(4)}
LOGGED = {"agent_reward": 0.25, "n_trajectories": 8.0, "hit@K": 0.5, "n_calls": 4.0}


def fake_tensorboard(monkeypatch) -> list:
    calls: list = []

    class SummaryWriter:
        def __init__(self, log_dir=None, **kw):
            calls.append(("init", log_dir))

        def add_scalar(self, tag, value, global_step=None):
            calls.append(("add_scalar", tag, value, global_step))

        def flush(self):
            calls.append(("flush",))

        def close(self):
            calls.append(("close",))

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    return calls


def fake_wandb(monkeypatch) -> list:
    calls: list = []
    module = types.ModuleType("wandb")
    module.init = lambda **kw: calls.append(("init", kw)) or "run"
    module.log = lambda data, step=None: calls.append(("log", data, step))
    module.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_scalars_keep_numbers_and_skip_nan_strings_bools_and_step():
    step, values = scalars(RECORD)
    assert step == 4 and values == LOGGED  # steps completed: 0-based step 3 is the 4th and all(type(v) is float for v in values.values())
    with pytest.raises(KeyError, match="step"):
        scalars({"agent_reward": 1.0})


def test_tensorboard_gets_one_scalar_per_numeric_field_at_the_record_step(monkeypatch, tmp_path):
    calls = fake_tensorboard(monkeypatch)
    tracker = make_tracker(("tensorboard",), tmp_path / "tb", "run", {})
    tracker.log(RECORD)
    tracker.close()
    tracker.close()  # closing twice is harmless
    assert calls == [("init", str(tmp_path / "tb")),
                     *[("add_scalar", k, v, 4) for k, v in LOGGED.items()], ("flush",), ("close",)]


def test_wandb_run_gets_config_logs_and_finishes(monkeypatch, tmp_path):
    calls = fake_wandb(monkeypatch)
    tracker = make_tracker("wandb", tmp_path / "logs", "cosearch-seed0", {"lr": 1e-5}, project="proj")
    tracker.log(RECORD)
    tracker.log({"step": 4, "agent_reward": float("nan")})  # nothing numeric: an empty log at that step
    tracker.close()
    assert calls == [("init", {"project": "proj", "name": "cosearch-seed0", "config": {"lr": 1e-5},
                               "dir": str(tmp_path / "logs")}),
                     ("log", LOGGED, 4), ("log", {}, 5), ("finish",)]
    assert (tmp_path / "logs").is_dir()


def test_the_validation_before_the_first_update_is_logged_at_zero_and_steps_keep_rising(monkeypatch, tmp_path):
    calls = fake_wandb(monkeypatch)  # W&B drops a negative or decreasing step
    tracker = make_tracker("wandb", tmp_path, "r", {})
    for record in ({"step": -1, "val_f1": 0.2}, {"step": 0, "agent_reward": 0.1}, {"step": 1, "val_f1": 0.3}):
        tracker.log(record)
    tracker.close()
    assert [c[2] for c in calls if c[0] == "log"] == [0, 1, 2]


def test_both_kinds_at_once(monkeypatch, tmp_path):
    tb, wb = fake_tensorboard(monkeypatch), fake_wandb(monkeypatch)
    tracker = make_tracker(("tensorboard", "wandb", "tensorboard"), tmp_path, "r", {})  # duplicates collapse
    tracker.log({"step": 0, "x": 1})
    tracker.close()
    assert [c[0] for c in tb] == ["init", "add_scalar", "flush", "close"]
    assert [c[0] for c in wb] == ["init", "log", "finish"]


@pytest.mark.parametrize("kind, module, package", [("tensorboard", "torch.utils.tensorboard", "tensorboard"),
                                                    ("wandb", "wandb", "wandb")])
def test_a_missing_package_warns_once_and_is_skipped(monkeypatch, tmp_path, kind, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError
    with pytest.warns(UserWarning, match=f"pip install {package}") as caught:
        tracker = make_tracker((kind,), tmp_path, "r", {})
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no further warnings while logging
        tracker.log(RECORD)
        tracker.close()
    assert tracker.trackers == []


def test_a_tracker_that_fails_to_start_is_skipped_with_a_warning(monkeypatch, tmp_path):
    calls = fake_wandb(monkeypatch)

    def refuse(**kw):
        raise RuntimeError("api_key not configured (no-tty)")

    sys.modules["wandb"].init = refuse
    with pytest.warns(UserWarning, match="wandb logging is off: it failed to start.*api_key"):
        tracker = make_tracker(("wandb",), tmp_path, "r", {})
    tracker.log(RECORD)
    tracker.close()
    assert calls == []


def test_unknown_kinds_are_config_errors():
    with pytest.raises(ConfigError, match=r"unknown tracker kind\(s\) \['mlflow'\]"):
        make_tracker(("mlflow",), "unused", "r", {})
    with pytest.raises(ConfigError, match=r"^training\.log_to: unknown tracker kind\(s\) \['mlflow'\]; "
                                          r"expected any of \('tensorboard', 'wandb'\)$"):
        TrainConfig(log_to=("tensorboard", "mlflow"))
    with pytest.raises(ConfigError, match="^training\\.wandb_project must be a non-empty string, got ''$"):
        TrainConfig(wandb_project="")
    assert check_kinds("wandb") == ("wandb",) and TrainConfig(log_to="tensorboard").log_to == ("tensorboard",)
    cfg = from_dict(ProfileConfig, {"training": {"log_to": ["tensorboard", "wandb"], "wandb_project": "p"}})
    assert cfg.training.log_to == ("tensorboard", "wandb") and cfg.training.wandb_project == "p"
    with pytest.raises(ConfigError, match="log_to"):
        from_dict(ProfileConfig, {"training": {"log_to": ["tensorbord"]}})


def test_trainer_logs_each_step_record_and_closes_at_the_end_of_run(tok, tmp_path, monkeypatch):
    calls = fake_tensorboard(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=2, log_to=("tensorboard",))
    frame = t.run()
    assert calls[0] == ("init", str(tmp_path / "tb")) and calls[-1] == ("close",)
    assert [c for c in calls if c[0] == "init"] == [calls[0]] and [c for c in calls if c[0] == "close"] == [calls[-1]]
    for record in t.records:
        logged = {c[1]: c[2] for c in calls if c[0] == "add_scalar" and c[3] == record["step"] + 1}
        expected = {k: float(v) for k, v in record.items()
                    if k not in ("step", "method") and not (isinstance(v, float) and math.isnan(v))}
        assert logged == expected and "rollout/agent_reward" in logged
    assert len(frame) == 2 and t.tracker is None


def test_trainer_without_log_to_makes_no_tracker_and_a_given_tracker_is_used(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path / "none", steps=1)
    t.run()
    assert t.tracker is None and not (tmp_path / "none" / "tb").exists()

    class Recorder:
        def __init__(self):
            self.steps, self.closed = [], 0

        def log(self, record):
            self.steps.append(record["step"])

        def close(self):
            self.closed += 1

    rec = Recorder()
    base = trainer(tok, tiny_model(tok), tmp_path / "given", steps=1)
    inputs = TrainerInputs(base.policies, tok, base.retriever, base.questions, base.rollout_cfg, base.protocol,
                           backend=base.backend)
    t = JointTrainer(base.cfg, inputs, out_dir=tmp_path / "given", progress=False, tracker=rec)
    t.run()
    assert rec.steps == [0] and rec.closed == 1 and t.tracker is None
