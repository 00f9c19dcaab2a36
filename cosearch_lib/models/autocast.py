"""bfloat16 autocast on a CPU: whether this CPU multiplies bf16 in hardware, and the one context that
turns autocast on for a stage (``training.autocast``, ``warmstart.autocast``; issue 48 item 5). Decoding can run
on bf16 copies of the weights instead (``TransformersBackend.bf16_scope``): the test evaluations with
``evaluation.bf16_weights`` (autocast made them slower, docs/LOG.md; :func:`cpu_bf16_stage` decides it too), a
step's rollout with ``training.autocast.bf16_weights`` (:class:`AutocastPlan`'s ``weights``).

Why only where the hardware has it (``benchmarks/bf16_autocast.py``, SmolLM2-135M, float32 -> bf16
autocast speed-up; docs/LOG.md):

* AMD EPYC with avx512_bf16, no AMX, 2 threads: prefill 2.74x, forward + backward 2.07x;
* Intel with AMX: 2.67x and 1.30x;
* AMD EPYC with AVX2 only, 1 thread: 0.17x and 0.06x: without bf16 instructions oneDNN converts and
  multiplies in software, 6-18x slower than float32.

So :func:`autocast_plan` keeps float32 on a CPU without avx512_bf16 or AMX, and says so. On a GPU the
policies are loaded in bfloat16 already (``models.registry.load_causal_lm``): the context is a no-op.
Autocast keeps the weights (and the LoRA weights AdamW updates) in float32; matmuls run in bf16. Torch's CPU
autocast lists leave softmax and log-softmax in the input's dtype (bf16 after a bf16 matmul; cross-entropy runs in
float32), so the samplers, the GRPO loss and transformers' causal-LM loss upcast the logits to float32 before they
take log-probs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


def cpu_bf16_instructions() -> str | None:
    """The bf16 matrix instructions of this CPU that oneDNN uses: "amx", "avx512_bf16", or None."""
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    return None


@dataclass(frozen=True)
class AutocastPlan:
    """Which training stages run under CPU bf16 autocast (the step records carry the flags)."""

    rollout: bool = False  # the training rollouts' forward passes (agent turns, ranker calls, the judge's scores)
    update: bool = False  # the GRPO update's forward and backward passes
    weights: bool = False  # with rollout: its decoding on bf16 copies of the weights (training.autocast.bf16_weights)

    @property
    def any(self) -> bool:
        """Some stage computes under autocast."""
        return self.rollout or self.update


def autocast_plan(rollout: bool, update: bool, device: Any, *,
                  every_rank: Callable[[bool], bool] = bool, weights: bool = False) -> AutocastPlan:
    """What ``training.autocast``'s ``rollout`` / ``update`` asks for becomes on ``device``: bf16 autocast on
    a CPU with bf16 instructions (:func:`cpu_bf16_instructions`); float32 on a CPU without them, with a
    warning; nothing on a GPU (its policies are bf16 already). ``every_rank`` turns this process's answer
    into the job's (data parallel: bf16 only if every rank's CPU has the instructions, so that the ranks
    compute alike)."""
    if not (rollout or update) or torch.device(device).type != "cpu":
        return AutocastPlan()
    found = cpu_bf16_instructions()
    if not every_rank(found is not None):
        _warn_float32("training.autocast", "another rank's CPU has" if found else "this CPU has")
        return AutocastPlan()
    return AutocastPlan(rollout=rollout, update=update, weights=bool(weights and rollout))


def _warn_float32(setting: str, where: str = "this CPU has") -> None:
    warnings.warn(f"{setting} asks for bf16, but {where} no avx512_bf16 or AMX instructions: bf16 would "
                  "run 6-18x slower there (docs/LOG.md), so it stays in float32", stacklevel=3)


def cpu_bf16_stage(requested: bool | None, *, warn_as: str | None = None) -> bool:
    """Whether a one-process stage that asks for CPU bf16 autocast (``requested``) gets it on this machine: only
    on a CPU with bf16 instructions and no GPU to train on (a GPU trains in bf16 anyway). The one decision for
    the stage and its cache key (the key holds the precision that runs); ``warn_as`` (the setting's name) warns
    when a CPU without the instructions keeps float32."""
    if not requested or torch.cuda.is_available():
        return False
    if cpu_bf16_instructions() is None:
        if warn_as:
            _warn_float32(warn_as)
        return False
    return True


@contextmanager
def cpu_bf16(enabled: bool) -> Iterator[None]:
    """``torch.autocast("cpu", bfloat16)`` when ``enabled``, else nothing; without autocast's weight cache.

    Autocast keeps the bf16 copy of each trainable weight until its outermost context exits, and an
    optimizer step inside the context does not refresh it: an update's later minibatches would then
    forward the weights as they were before its first step. So every forward casts afresh."""
    if not enabled:
        yield
        return
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        yield
