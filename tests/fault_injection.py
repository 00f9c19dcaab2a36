"""A training run that dies at a chosen point of its second step: ``python -m tests.fault_injection OUT POINT``.

The scripted joint trainer of ``tests.doubles`` (a tiny random Llama, SmolLM2's tokenizer) trains
3 steps into ``OUT``, checkpointing after every step, and the process SIGKILLs itself (no
handler, no ``finally``, nothing flushed: what a node failure or the out-of-memory killer does):

* ``rollout``: at the second generation call of step 2, halfway through its rollouts;
* ``update``: right after step 2's agent update changed the agent's weights in memory, before
  the ranker's update;
* ``checkpoint-state``: while step 2's checkpoint writes ``state.pt`` (half of it on disk);
* ``checkpoint-manifest``: after step 2's checkpoint files are written, before its manifest;
* ``signal``: not a kill: during step 2's rollouts the process sends itself SIGUSR1 (a cluster's
  time-limit warning), with scheduled checkpoints switched off; the trainer is expected to stop
  once step 2's rollouts are saved, write step 1's checkpoint anyway (the weights they were sampled
  with) and exit with :data:`cosearch_lib.stop_signals.EXIT_STOPPED`.

``tests/test_training_faults.py`` resumes each in a fresh process and compares with a run that
was never interrupted.
"""

from __future__ import annotations

import os
import signal
import sys

import cosearch_lib.rl.run_checkpoints as checkpoints_mod
import cosearch_lib.rl.trainer as trainer_mod
from cosearch_lib.models.registry import load_tokenizer
from cosearch_lib.stop_signals import EXIT_STOPPED, StopRequested

from tests.doubles import tiny_model, trainer

POINTS = ("rollout", "update", "checkpoint-state", "checkpoint-manifest", "signal")
STEPS = 3


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main(out_dir: str, point: str) -> int:
    if point not in POINTS:
        raise SystemExit(f"point must be one of {POINTS}, got {point!r}")
    tok = load_tokenizer("smollm2-135m-instruct")
    t = trainer(tok, tiny_model(tok), out_dir, steps=STEPS)

    if point == "rollout":
        generate, calls = t.backend.generate, []

        def generate_then_die(*args, **kwargs):
            if t.step == 1:
                calls.append(1)
                if len(calls) == 2:
                    _die()
            return generate(*args, **kwargs)

        t.backend.generate = generate_then_die
    elif point == "update":
        update = trainer_mod.grpo_update

        def update_then_die(policies, adapter, *args, **kwargs):
            stats = update(policies, adapter, *args, **kwargs)
            if t.step == 1:
                _die()
            return stats

        trainer_mod.grpo_update = update_then_die
    elif point == "checkpoint-state":
        save = checkpoints_mod.torch.save

        def save_half_then_die(obj, f, *args, **kwargs):
            if t.step == 2:
                import io

                buffer = io.BytesIO()
                save(obj, buffer, *args, **kwargs)
                f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                f.flush()
                _die()
            return save(obj, f, *args, **kwargs)

        checkpoints_mod.torch.save = save_half_then_die
    elif point == "checkpoint-manifest":
        manifest = checkpoints_mod.write_checkpoint_manifest

        def die_before_manifest(folder):
            if t.step == 2:
                _die()
            return manifest(folder)

        checkpoints_mod.write_checkpoint_manifest = die_before_manifest
    elif point == "signal":
        generate = t.backend.generate

        def generate_with_signal(*args, **kwargs):
            if t.step == 1:
                os.kill(os.getpid(), signal.SIGUSR1)  # step 2 is under way
            return generate(*args, **kwargs)

        t.backend.generate = generate_with_signal
        t.cfg.checkpoint_every = 0  # only the last step checkpoints: a step-1 checkpoint shows the stop wrote it
    try:
        t.run()
    except StopRequested as stop:
        print(f"stopped: {stop}", flush=True)
        return EXIT_STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
