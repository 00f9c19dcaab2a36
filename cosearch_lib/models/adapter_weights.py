"""What training did to a LoRA adapter, read from its saved folder: its tensors, how far it moved from
another folder of the same adapter, and whether it ever left the base model (``lora_B`` at zero)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

#: The file peft's ``save_pretrained`` writes an adapter's weights to.
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def adapter_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """The LoRA tensors of an adapter folder in peft's format (``adapter_model.safetensors``)."""
    path = Path(folder) / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no adapter weights at {path}: expected a folder written by peft's save_pretrained")
    return load_file(str(path))


def adapter_change(before: str | Path, after: str | Path) -> dict[str, float]:
    """How far the adapter in folder ``after`` moved from the one in ``before`` (same tensor names):
    ``tensors``, ``changed`` (tensors not bit-identical), ``max_abs_delta`` over all of them and
    ``lora_B_max_abs`` of ``after`` (peft starts every ``lora_B`` at zero: 0 means the adapter still
    equals the base model)."""
    old, new = adapter_weights(before), adapter_weights(after)
    if old.keys() != new.keys():
        raise ValueError(f"adapters {before} and {after} hold different tensors: "
                         f"{sorted(old.keys() ^ new.keys())[:4]} ...")
    deltas = [float((new[k].float() - old[k].float()).abs().max()) if new[k].numel() else 0.0 for k in new]
    return {"tensors": len(new), "changed": sum(not torch.equal(old[k], new[k]) for k in new),
            "max_abs_delta": max(deltas, default=0.0), "lora_B_max_abs": lora_b_max_abs(new)}


def lora_b_max_abs(adapter: str | Path | dict[str, torch.Tensor]) -> float:
    """Largest |weight| over an adapter's ``lora_B`` matrices (a folder or its tensors): 0.0 exactly
    while the adapter has never taken an effective optimizer step (peft initialises ``lora_B`` to zero)."""
    tensors = adapter if isinstance(adapter, dict) else adapter_weights(adapter)
    b = [t for name, t in tensors.items() if "lora_B" in name]
    if not b:
        raise ValueError("the adapter has no lora_B tensors")
    return max(float(t.float().abs().max()) for t in b)
