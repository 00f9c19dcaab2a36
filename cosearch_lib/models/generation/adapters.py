"""LoRA adapter switching: run a peft model with one adapter active, merged, or none; and a bf16 copy of the
model with one adapter merged, for decoding (``bf16_decoding_copy``).

Kept apart from the backends so that the policy update (``cosearch_lib.rl.policy_update``) can
switch adapters without importing a generation engine.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer


def _is_peft(model: Any) -> bool:
    return isinstance(model, PeftModel)


def _check_adapter(model: Any, adapter: str | None) -> None:
    """ValueError unless ``adapter`` is None or an adapter of the peft model ``model``."""
    if adapter is None:
        return
    if not _is_peft(model):
        raise ValueError(f"adapter {adapter!r} requested but the model is not a peft model")
    if adapter not in model.peft_config:
        raise ValueError(f"unknown adapter {adapter!r}; the model has {sorted(model.peft_config)}")


@contextmanager
def adapter_context(model: Any, adapter: str | None) -> Iterator[None]:
    """Run with LoRA ``adapter`` active (None: adapters disabled), then restore the model's state.

    peft's ``set_adapter`` also flips ``requires_grad`` (the active adapter becomes trainable, the
    others frozen); a trainer that freezes one policy's adapter must not see that change, so the
    flags and the previously active adapter are restored on exit.
    """
    _check_adapter(model, adapter)
    if not _is_peft(model):
        yield
        return
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    previous = model.active_adapter
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for name, p in model.named_parameters():
            p.requires_grad_(grads[name])


def _lora_layers(model: Any, adapter: str) -> list[Any]:
    """The LoRA-wrapped linear layers of ``model`` that carry ``adapter`` (plain LoRA only)."""
    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and adapter in getattr(m, "lora_A", {})]
    if any(m.use_dora.get(adapter) or not isinstance(m.base_layer, torch.nn.Linear) for m in layers):
        return []  # DoRA or non-linear bases: leave them to peft
    return layers


@contextmanager
def merged_adapter(model: Any, adapter: str | None) -> Iterator[bool]:
    """Run with ``adapter``'s LoRA update folded into the base weights (W + scale * B @ A) and the
    adapters switched off: one matrix product per layer instead of three. The merged weights are
    new tensors swapped in for the block and the original tensors put back after, so the base
    weights are restored bit for bit (peft's merge/unmerge would add and subtract in place).
    Yields False (nothing merged; ``adapter_context`` is used) for the base model, a non-peft
    model or an adapter peft should keep running itself."""
    layers = _lora_layers(model, adapter) if adapter is not None and _is_peft(model) else []
    if not layers:
        with adapter_context(model, adapter):
            yield False
        return
    _check_adapter(model, adapter)
    originals = [m.base_layer.weight for m in layers]
    with torch.no_grad():
        merged = [torch.nn.Parameter(w + m.get_delta_weight(adapter).to(w.dtype), requires_grad=False)
                  for m, w in zip(layers, originals)]
    try:
        for m, w in zip(layers, merged):
            m.base_layer.weight = w
        with adapter_context(model, None):
            yield True
    finally:
        for m, w in zip(layers, originals):
            m.base_layer.weight = w


@contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Dropout (including LoRA dropout) off while sampling; the training flag is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def bf16_decoding_copy(model: Any, adapter: str | None) -> Any:
    """A plain (non-peft) copy of ``model`` in bfloat16 with ``adapter``'s LoRA update merged into its
    weights (None: the base model, adapters left out), for decoding only: nothing trains it, and it does not
    follow later changes of ``model``'s weights. ``model`` itself is untouched (the copy is merged, not the
    original, so its float32 weights stay bit for bit what they were).

    Why a copy rather than bf16 autocast: small-batch decoding on a CPU is bound by the per-call overhead of
    each linear layer, and autocast adds a cast of every weight on every call; weights stored in bf16 skip it
    (docs/LOG.md, twenty-second and twenty-third sessions of issue 48). Parameters become bf16; buffers (the
    rotary embedding's inverse frequencies) stay in their dtype, so positions keep float32 precision. The copy is
    made from a deep copy of the whole float32 model (every adapter in it): a transient second float32 model,
    nothing at SmolLM2-135M's size on a CPU; where a CPU profile runs a larger model, count it."""
    _check_adapter(model, adapter)
    with torch.no_grad():
        clone = copy.deepcopy(model)
        if _is_peft(clone):
            clone = clone.merge_and_unload(adapter_names=[adapter]) if adapter is not None else clone.unload()
        for p in clone.parameters():
            p.requires_grad_(False)
            if p.is_floating_point():
                p.data = p.data.to(torch.bfloat16)
    clone.eval()
    return clone
