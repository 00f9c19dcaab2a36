"""Stop requests from a cluster: SIGUSR1 and SIGTERM become a flag that a long loop checks.

A SLURM job can be warned before its time limit (``#SBATCH --signal=B:USR1@600`` sends SIGUSR1
to the batch shell 600 s before the end), and it gets SIGTERM when it is preempted or cancelled
(SIGKILL follows after the cluster's ``KillWait``, 30 s by default). The default action of both
signals is to die on the spot, which loses every step since the last checkpoint. Two pieces turn
them into an orderly stop that the job script requeues (docs/USAGE.md, "Time limits, preemption and requeueing"):

* :class:`StopRequest`, in the process that trains (``JointTrainer.run``, inside the notebook's
  kernel): while it is active a stop signal only sets :attr:`StopRequest.received`; the trainer
  finishes the step it is in, writes a checkpoint and raises :class:`StopRequested`.
* :func:`forward_stop_signals`, in the ``cosearch`` command that runs the notebooks: it does not
  die on a stop signal but passes it on to its child processes (the papermill kernel), remembers
  it, and the command then exits with :data:`EXIT_STOPPED`, which the job script reads as
  "resumable: requeue me".

Only the main thread of a process can install signal handlers; elsewhere :class:`StopRequest` is
inactive (it warns) and the signals keep their default action.
"""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

#: The signals that ask for an orderly stop: the time-limit warning and preemption / cancellation.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)

#: Exit status of a command that stopped because it was asked to and can be resumed (BSD's EX_TEMPFAIL).
EXIT_STOPPED = 75

#: Set by ``stoppable.sh`` to the signal's name when the job's warning came before its command started
#: (during the warm start, or while the job waited for its retrieval server): every StopRequest of the
#: command starts as if it had received it, so the command stops at its first boundary (after the first
#: stage of training, the first round of an evaluation) and the job requeues with that progress kept.
EARLIER_STOP_ENV = "COSEARCH_STOP_REQUESTED"


class StopRequested(RuntimeError):
    """Raised by a loop that stopped on a stop signal after saving what a resumed run needs (a training
    loop: after ``step``, into ``checkpoint``, or with ``after_rollout`` at the boundary inside the next
    step, its rollouts in ``checkpoint``; a loop over notebooks: before the next one, ``step`` None)."""

    def __init__(self, signal_name: str, step: int | None = None, checkpoint: str | os.PathLike | None = None, *,
                 after_rollout: bool = False):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        if after_rollout:  # at the stage boundary of step ``step`` + 1: its rollouts saved, before its update
            super().__init__(f"stopped on {signal_name} after the rollout of step {step + 1} (its rollouts in "
                             f"{checkpoint}); resume=True continues into its update")
        elif step is None:
            super().__init__(f"stopped on {signal_name} before the next notebook; run the same command again")
        else:
            saved = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint"
            super().__init__(f"stopped on {signal_name} after step {step} ({saved}); resume=True continues from it")


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class StopRequest:
    """While entered, :data:`STOP_SIGNALS` set :attr:`received` (the first signal's name) instead of
    killing the process; the previous handlers come back on exit. ``on_signal`` (optional) is called
    with the signal number each time one arrives, inside the handler: keep it short."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
                 on_signal: Callable[[int], None] | None = None):
        self.signals = tuple(signals)
        self.on_signal = on_signal
        self.received: str | None = None
        self.active = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        if self.on_signal is not None:
            self.on_signal(signum)

    def __enter__(self) -> StopRequest:
        _ACTIVE.append(self)
        if self.received is None and os.environ.get(EARLIER_STOP_ENV):  # asked before this process could listen
            self.received = os.environ[EARLIER_STOP_ENV]
        if not _in_main_thread():
            warnings.warn("StopRequest outside the main thread: stop signals keep their default action "
                          "(the process dies on SIGUSR1/SIGTERM and resumes from its last checkpoint)",
                          RuntimeWarning, stacklevel=2)
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self.active = False


#: The StopRequests entered in this process and not yet left (innermost last).
_ACTIVE: list[StopRequest] = []


def pending_stop() -> str | None:
    """The name of the stop signal an active :class:`StopRequest` of this process has received, if any:
    what a loop over notebooks or grid cells checks before it starts the next one."""
    return next((r.received for r in _ACTIVE if r.received is not None), None)


def _descendants() -> list:
    """Every child process of this one, recursively."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _forward(signum: int) -> None:
    for child in _descendants():
        try:
            child.send_signal(signum)
        except psutil.Error:  # a child that has just exited
            pass


@contextmanager
def forward_stop_signals() -> Iterator[StopRequest]:
    """For a command that runs the training in a child process (papermill's kernel): on a stop
    signal, remember it and pass it on to every descendant process, instead of dying first and
    orphaning them. Yields the :class:`StopRequest`; check ``received`` when the work returns."""
    with StopRequest(on_signal=_forward) as request:
        yield request
