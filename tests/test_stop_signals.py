"""A command that runs its work in child processes (`cosearch run`: papermill's kernel) passes a
stop signal on to them instead of dying first (stop_signals.forward_stop_signals).

The trainer's own stop (finish the step, checkpoint, exit 75, resume to the same records) is
tests/test_training_faults.py; the real `ci` model through `cosearch run` stopped and resumed is
tests/test_notebooks.py's `reference` test (make test-reference)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cosearch_lib.paths import project_root

#: The kernel's stand-in, a child of the command as papermill's kernel is: it arms a StopRequest as
#: the trainer does, then waits for a signal and reports it.
_KERNEL = """
import os, sys, time
from pathlib import Path
from cosearch_lib.stop_signals import StopRequest
with StopRequest() as stop:
    Path(sys.argv[1]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while stop.received is None and time.monotonic() < deadline:
        time.sleep(0.02)
Path(sys.argv[2]).write_text(str(stop.received))
sys.exit(75 if stop.received else 1)
"""

_COMMAND = """
import subprocess, sys
from cosearch_lib.stop_signals import forward_stop_signals
with forward_stop_signals() as stop:
    code = subprocess.call([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(f"received={stop.received} child_exit={code}", flush=True)
"""


def test_the_command_passes_a_stop_signal_to_the_kernel_below_it_and_lives_to_report_it(tmp_path: Path) -> None:
    armed, got = tmp_path / "armed", tmp_path / "got"
    command = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_COMMAND), textwrap.dedent(_KERNEL),
                                str(armed), str(got)], cwd=project_root(), stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not armed.exists() and command.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert armed.exists(), "the kernel never armed its stop handler"
    command.send_signal(signal.SIGUSR1)  # to the command only, as SLURM's --signal=B:USR1 reaches the batch shell's child
    out, _ = command.communicate(timeout=60)
    assert command.returncode == 0  # the command did not die of SIGUSR1 (its default action)
    assert got.read_text() == "SIGUSR1"  # the kernel received it
    assert out.strip() == "received=SIGUSR1 child_exit=75"  # the command remembers it and sees the kernel's resumable stop


def test_without_the_forwarding_a_stop_signal_kills_the_command_and_the_kernel_never_hears_of_it(tmp_path: Path) -> None:
    """What the forwarding prevents (the control of the test above): the command dies on SIGUSR1."""
    armed, got = tmp_path / "armed", tmp_path / "got"
    bare = textwrap.dedent(_COMMAND).replace("with forward_stop_signals() as stop:", "if True:").replace(
        "stop.received", "None")
    command = subprocess.Popen([sys.executable, "-c", bare, textwrap.dedent(_KERNEL), str(armed), str(got)],
                               cwd=project_root(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not armed.exists() and command.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    command.send_signal(signal.SIGUSR1)
    command.wait(timeout=60)
    assert command.returncode == -signal.SIGUSR1
    time.sleep(0.3)
    assert not got.exists()  # the orphaned kernel was never told
    os.kill(int(armed.read_text()), signal.SIGKILL)  # rather than leave it to its 60 s


def test_a_stop_asked_before_the_process_listened_counts_as_received(monkeypatch) -> None:
    """COSEARCH_STOP_REQUESTED (set by stoppable.sh when the job's warning came before its command
    started): every StopRequest starts as if it had received that signal, so the training stops at its
    first boundary; without it, none is pending."""
    from cosearch_lib.stop_signals import EARLIER_STOP_ENV, StopRequest, pending_stop

    monkeypatch.delenv(EARLIER_STOP_ENV, raising=False)
    with StopRequest() as stop:
        assert stop.received is None and pending_stop() is None
    monkeypatch.setenv(EARLIER_STOP_ENV, "SIGUSR1")
    with StopRequest() as stop:
        assert stop.received == "SIGUSR1" and pending_stop() == "SIGUSR1"
