"""LoRA on vLLM's CPU engine: one matrix product per adapter instead of one weight copy per token.

vLLM on CPU applies LoRA with its PyTorch ops (``vllm.lora.ops.torch_ops``, called by
``PunicaWrapperCPU``). For every LoRA layer they gather the adapter's weights once *per token*
(``lora_b_weights[indices]``, a ``[tokens, out, rank]`` copy) and contract them with a batched
matrix-vector einsum. On a prefill of a few thousand tokens (a ranker prompt of 50 passages is
~7,000) that copy is hundreds of MB per layer call and dominates the forward pass. Measured on
this 2-core machine, idle, at 7,000 tokens in bf16 with rank 16 (``benchmarks/cpu_lora_ops.py``
prints both side by side): expanding to the MLP's 1,536 took 0.164 s per call against 0.024 s as
one product per adapter, shrinking from 1,536 0.146 s against 0.007 s. Summed over SmolLM2's 30
layers and their seven LoRA modules, that is ~32 s of a 7,000-token prefill against ~3 s.

:func:`install` replaces the three ``bgmv_*`` ops (the ``sgmv_*`` ones call them) with versions
that group the tokens by adapter slot and multiply each group by its slot's matrix once. The
result is the same product (slot indices, including vLLM's negative ones, select exactly the slots
the original indexing selects); only the summation order of the rounding differs
(tests/test_vllm_engine.py compares the two on random inputs). CUDA vLLM runs its Triton kernels
and never reaches these functions; the patch is installed for CPU engines only.
"""

from __future__ import annotations

from typing import Any

#: The ops replaced, by name, in vllm.lora.ops.torch_ops.lora_ops (and where they were imported by name).
PATCHED_OPS = ("bgmv_expand", "bgmv_shrink", "bgmv_expand_slice")


def _slot_products(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """``einsum("bi, boi -> bo", inputs, weights[indices])`` with one product per distinct slot."""
    import torch

    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    out = torch.empty(inputs.shape[0], weights.shape[1], dtype=dtype, device=inputs.device)
    slots = torch.unique(indices)
    if slots.numel() == 1:  # the common case: every token of the batch on one adapter
        return torch.matmul(inputs, weights[int(slots)].to(dtype).T, out=out)
    for slot in slots.tolist():
        rows = indices == slot
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_expand(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                add_inputs: bool = True) -> None:
    outputs = _slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_shrink(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                scaling: float = 1.0) -> None:
    outputs = _slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand_slice(inputs: Any, lora_b_weights: Any, output_tensor: Any, lora_indices_tensor: Any,
                      slice_offset: int, slice_size: int, add_inputs: bool = True) -> None:
    outputs = _slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset:slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset:slice_offset + slice_size] = outputs


def install() -> bool:
    """Put the grouped ops in place of vLLM's per-token ones (idempotent); False when this vLLM has no
    such ops (another version's layout: its own ops stay)."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:
        return False
    if not all(hasattr(lora_ops, name) for name in PATCHED_OPS):
        return False
    ours = {"bgmv_expand": bgmv_expand, "bgmv_shrink": bgmv_shrink, "bgmv_expand_slice": bgmv_expand_slice}
    for module in (lora_ops, punica_cpu):
        for name, fn in ours.items():
            if hasattr(module, name):
                setattr(module, name, fn)
    return True
