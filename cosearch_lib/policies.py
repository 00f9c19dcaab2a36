"""LoRA policies: the adapter settings shared by the warm start and GRPO, and the two-role policy set.

Agent and ranker are two LoRA adapters on one frozen base model (``"agent"`` and ``"ranker"``),
each with its own optimizer (the paper trains two separate models; two adapters on one base is
the LoRA equivalent, and the base stays shared in memory). The ablation "shared backbone" uses one
adapter (``"shared"``) for both roles. The reference policy of the KL term is the base model with
the adapters disabled.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LoraSettings:
    r: int = 16  # LoRA rank
    alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # LoRA dropout (0: the GRPO ratio needs deterministic forward passes)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Llama/Qwen-style linear layers

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        if self.r < 1 or self.alpha <= 0:
            raise ValueError(f"LoraSettings needs r >= 1 and alpha > 0, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM")


def lora_model(base: Any, adapters: dict[str, str | Path | None], lora: LoraSettings) -> Any:
    """Wrap ``base`` in a peft model holding the named adapters: each loaded from a saved adapter
    folder (e.g. the warm start) or, for None, freshly initialised from ``lora`` (LoRA B = 0, so a
    fresh adapter starts as the base model). All adapters are loaded trainable."""
    from peft import PeftModel, get_peft_model

    if not adapters:
        raise ValueError("lora_model needs at least one adapter name")
    model = None
    for name, path in adapters.items():
        if model is None:
            model = (PeftModel.from_pretrained(base, str(path), adapter_name=name, is_trainable=True) if path
                     else get_peft_model(base, lora.peft_config(), adapter_name=name))
        elif path:
            model.load_adapter(str(path), adapter_name=name, is_trainable=True)
        else:
            model.add_adapter(name, lora.peft_config())
    return model


def adapter_parameters(model: Any, adapter: str) -> dict[str, Any]:
    """The LoRA tensors of one adapter, by parameter name (peft names them ``...lora_A.<adapter>.weight``)."""
    params = {n: p for n, p in model.named_parameters() if "lora_" in n and f".{adapter}." in n}
    if not params:
        raise ValueError(f"model has no LoRA parameters for adapter {adapter!r}")
    return params


class PolicySet:
    """The policies of one training run: LoRA adapters on one base, an AdamW optimizer per trained one.

    ``roles`` maps each role ("agent", "ranker") to the adapter that plays it: two adapters by
    default, the same one for both in the shared-backbone ablation, None for a role played by a
    rule (retrieval-only or oracle ranking). Only adapters in ``trainable`` get optimizers; every
    other parameter, base weights included, has ``requires_grad=False``.
    """

    def __init__(self, model: Any, roles: dict[str, str | None], trainable: set[str] | list[str],
                 learning_rates: dict[str, float], *, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999)) -> None:
        import torch

        self.model, self.roles, self.trainable = model, dict(roles), sorted(set(trainable))
        unknown = [a for a in self.trainable if a not in model.peft_config]
        if unknown:
            raise ValueError(f"trainable adapters {unknown} are not in the model ({sorted(model.peft_config)})")
        for p in model.parameters():
            p.requires_grad_(False)
        self.params = {a: adapter_parameters(model, a) for a in self.trainable}
        self.optimizers = {}
        for adapter, params in self.params.items():
            for p in params.values():
                p.requires_grad_(True)
            lr = learning_rates[adapter]
            self.optimizers[adapter] = torch.optim.AdamW(list(params.values()), lr=lr, betas=betas,
                                                         weight_decay=weight_decay)

    def adapter(self, role: str) -> str | None:
        return self.roles.get(role)

    def is_trained(self, role: str) -> bool:
        return self.roles.get(role) in self.params

    def state_dict(self) -> dict:
        """Adapter weights (trained and frozen) and optimizer states: what a checkpoint holds."""
        from peft import get_peft_model_state_dict

        adapters = {a: {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=a).items()}
                    for a in self.model.peft_config}
        return {"adapters": adapters, "optimizers": {a: o.state_dict() for a, o in self.optimizers.items()}}

    def load_state_dict(self, state: dict) -> None:
        from peft import set_peft_model_state_dict

        for adapter, weights in state["adapters"].items():
            result = set_peft_model_state_dict(self.model, weights, adapter_name=adapter)
            missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
            if missing:
                raise ValueError(f"checkpoint weights {missing[:3]} do not fit adapter {adapter!r}")
        for adapter, opt_state in state["optimizers"].items():
            self.optimizers[adapter].load_state_dict(opt_state)

    def save_adapters(self, out_dir: str | Path) -> dict[str, Path]:
        """Each adapter in peft's format under ``out_dir/<adapter>/`` (loadable by the evaluation harness)."""
        out = {}
        for adapter in self.model.peft_config:
            folder = Path(out_dir) / adapter
            self.model.save_pretrained(str(folder.parent / f".{adapter}.tmp"), selected_adapters=[adapter])
            saved = folder.parent / f".{adapter}.tmp"
            # peft writes non-default adapters into a sub-folder named after them
            src = saved / adapter if (saved / adapter).is_dir() else saved
            if folder.exists():
                shutil.rmtree(folder)
            src.rename(folder)
            shutil.rmtree(saved, ignore_errors=True)
            out[adapter] = folder
        return out
