"""Training under faults: a process killed during a rollout, an update or a checkpoint write, a full
disk, and a stop signal all end in records identical to a run that was never interrupted.

Each kill happens in a real child process that SIGKILLs itself (``tests/fault_injection.py``), so
nothing in memory survives; the run is then resumed in this process from what is on disk. The
corrupted- and truncated-checkpoint cases are in ``test_training.py``.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import cosearch_lib.rl.run_checkpoints as checkpoints_mod
from cosearch_lib.run_schema import checkpoint_problem, latest_checkpoint
from cosearch_lib.stop_signals import EXIT_STOPPED, StopRequest

from tests.doubles import tiny_model, trainer
from tests.fault_injection import STEPS

ROOT = Path(__file__).resolve().parents[1]


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]


def _adapters(t):
    return {n: p.detach().clone() for n, p in t.policies.model.named_parameters() if "lora_" in n}


@pytest.fixture(scope="module")
def uninterrupted(tok, tmp_path_factory):
    t = trainer(tok, tiny_model(tok), tmp_path_factory.mktemp("full"), steps=STEPS)
    start = _adapters(t)
    t.run()
    end = _adapters(t)  # every comparison below is with a run whose weights moved, in both adapters
    for adapter in ("agent", "ranker"):
        assert any(not torch.equal(start[n], end[n]) for n in start if f".{adapter}." in n)
    return t


def _run_faulty(out: Path, point: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "tests.fault_injection", str(out), point], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def _resume_and_compare(tok, out: Path, uninterrupted, expect_step: int) -> None:
    resumed = trainer(tok, tiny_model(tok), out, steps=STEPS)  # a fresh process's view: base model, no state
    assert resumed.load_checkpoint() == expect_step
    resumed.run()
    assert _comparable(resumed.records) == _comparable(uninterrupted.records)
    want, got = _adapters(uninterrupted), _adapters(resumed)
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    assert len(pd.read_csv(out / "steps.csv")) == STEPS
    assert not list((out / "checkpoints").glob("*.tmp")) and not list((out / "checkpoints").glob("*.old"))


@pytest.mark.slow  # ~26-28 s each on 2 AVX2 cores, most of it a fresh process's imports (make test-slow, CI)
@pytest.mark.parametrize("point", ["rollout", "update", "checkpoint-state", "checkpoint-manifest"])
def test_a_run_killed_during_step_2_resumes_from_step_1_to_the_uninterrupted_records(tok, tmp_path, uninterrupted, point):
    out = tmp_path / "run"
    done = _run_faulty(out, point)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*") if not p.name.endswith(".tmp")) == ["step_000001"]
    # step 2's scored rollouts were saved before its update: killed after them, the resumed run takes them back
    assert (ckpts / "rollouts_step_000001.pt").exists() is (point != "rollout")
    assert len(pd.read_csv(out / "steps.csv")) == 1  # the records on disk are step 1's, not half of step 2's
    if point.startswith("checkpoint"):
        half = ckpts / "step_000002.tmp"  # the interrupted write stays under its temporary name
        assert half.is_dir() and latest_checkpoint(out).name == "step_000001"
        if point == "checkpoint-state":
            assert 0 < (half / "state.pt").stat().st_size
    _resume_and_compare(tok, out, uninterrupted, expect_step=1)


@pytest.mark.slow
def test_a_stop_signal_stops_after_the_rollout_checkpoints_and_exits_75_then_the_run_resumes(tok, tmp_path, uninterrupted):
    """SIGUSR1 during step 2's rollouts, with scheduled checkpoints switched off: the run stops at the
    stage boundary, step 2's rollouts saved, and writes the checkpoint of step 1 they were sampled
    from (the schedule had skipped it); the resumed run goes into step 2's update."""
    out = tmp_path / "run"
    done = _run_faulty(out, "signal")
    assert done.returncode == EXIT_STOPPED, done.stderr[-2000:]
    assert "SIGUSR1: stopped after the rollout of step 2" in done.stdout
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["rollouts_step_000001.pt", "step_000001"]  # written by the stop
    assert checkpoint_problem(ckpts / "step_000001") is None
    _resume_and_compare(tok, out, uninterrupted, expect_step=1)


def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one_and_says_so(tok, tmp_path, uninterrupted, monkeypatch):
    out = tmp_path / "run"
    t = trainer(tok, tiny_model(tok), out, steps=STEPS)
    t.run(steps=2)
    good = (out / "checkpoints" / "step_000002" / "state.pt").read_bytes()
    steps_csv = (out / "steps.csv").read_bytes()
    save = checkpoints_mod.torch.save

    def save_until_the_disk_is_full(obj, f, *args, **kwargs):
        f.write(b"\0" * 4096)  # some bytes reach the disk, then the device is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoints_mod.torch, "save", save_until_the_disk_is_full)
    with pytest.raises(OSError, match=r"could not write checkpoint .*step_000003.*No space left on device.*"
                                      r"newest whole checkpoint is .*step_000002") as err, \
            pytest.warns(RuntimeWarning, match="could not save the rollouts of step 3"):  # the shortcut is lost, not the run
        t.run()
    assert err.value.errno == errno.ENOSPC
    monkeypatch.setattr(checkpoints_mod.torch, "save", save)
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001", "step_000002"]  # no half-written step 3 left
    assert (ckpts / "step_000002" / "state.pt").read_bytes() == good and checkpoint_problem(ckpts / "step_000002") is None
    assert (out / "steps.csv").read_bytes() == steps_csv  # the records on disk still match the last checkpoint
    _resume_and_compare(tok, out, uninterrupted, expect_step=2)


def test_stop_request_turns_the_signals_into_a_flag_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    seen = []
    with StopRequest(on_signal=seen.append) as stop:
        assert stop.active and stop.received is None
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGUSR1" and seen == [signal.SIGUSR1, signal.SIGTERM]  # the first one is named
    assert signal.getsignal(signal.SIGUSR1) is before
