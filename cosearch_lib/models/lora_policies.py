"""LoRA policies: the adapter settings shared by the warm start and GRPO, and the two-role policy set.

Agent and ranker are two LoRA adapters on one frozen base model (``"agent"`` and ``"ranker"``),
each with its own optimizer (the paper trains two separate models; two adapters on one base is
the LoRA equivalent, and the base stays shared in memory). The ablation "shared backbone" uses one
adapter (``"shared"``) for both roles. The reference policy of the KL term is the base model with
the adapters disabled, or (``training.grpo.kl_reference: start``) a frozen copy of each trained
adapter as GRPO started it (:meth:`PolicySet.freeze_start_references`).

Loading the policy model for either training path is ``models.policy_loading``; serving the
adapters to an engine that reads them from disk, ``models.served_adapters``; what training did to
an adapter, ``models.adapter_weights``.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

from cosearch_lib.config import LoraSettings
from cosearch_lib.models.registry import quiet_loading


def peft_lora_config(lora: LoraSettings) -> LoraConfig:
    """The peft ``LoraConfig`` of the profile's ``lora`` section (causal-LM task, no bias)."""
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")


def lora_model(base: Any, adapters: dict[str, str | Path | None], lora: LoraSettings) -> Any:
    """Wrap ``base`` in a peft model holding the named adapters: each loaded from a saved adapter
    folder (e.g. the warm start) or, for None, freshly initialised from ``lora`` (LoRA B = 0, so a
    fresh adapter starts as the base model). All adapters are loaded trainable."""

    if not adapters:
        raise ValueError("lora_model needs at least one adapter name")
    model = None
    for name, path in adapters.items():
        if model is None and path:
            with quiet_loading():
                model = PeftModel.from_pretrained(base, str(path), adapter_name=name, is_trainable=True)
        elif model is None:
            model = get_peft_model(base, peft_lora_config(lora), adapter_name=name)
        elif path:
            with quiet_loading():
                model.load_adapter(str(path), adapter_name=name, is_trainable=True)
        else:
            model.add_adapter(name, peft_lora_config(lora))
    return model


#: The name of a trained adapter's frozen start copy: ``<adapter>`` + this (peft names its tensors
#: ``...lora_A.<name>.weight``, so the copy's never match the adapter's own).
REFERENCE_SUFFIX = "_reference"


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

        self.model, self.roles, self.trainable = model, dict(roles), sorted(set(trainable))
        self.references: dict[str, str] = {}  # trained adapter -> its frozen start copy (freeze_start_references)
        self._loaded = False  # a checkpoint's weights replaced the start
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

    def policy_adapters(self) -> list[str]:
        """The model's adapters that play a role or could (trained and frozen), without the start copies."""
        copies = set(self.references.values())
        return [a for a in self.model.peft_config if a not in copies]

    def reference_adapter(self, adapter: str) -> str | None:
        """The adapter the KL term of ``adapter``'s update reads: its frozen start copy, or None (the
        base model, adapters off) when :meth:`freeze_start_references` did not run."""
        return self.references.get(adapter)

    def freeze_start_references(self) -> None:
        """Keep a frozen copy of each trained adapter as it is now, the start GRPO begins from (a warm
        start; a fresh adapter is the base model), as the KL term's reference
        (``training.grpo.kl_reference: start``). It must run before the first optimizer step and
        before a checkpoint is loaded, so that a resumed run rebuilds its reference from the start,
        not from the checkpoint; checkpoints and saved adapters leave the copies out (a checkpoint keeps
        their digests, and a resume whose rebuilt start differs is refused). Running it again changes
        nothing."""
        todo = [a for a in self.trainable if a not in self.references]
        if not todo:
            return
        if self._loaded or any(self.optimizers[a].state for a in todo):
            raise ValueError(f"adapters {todo} have moved from their start (a checkpoint was loaded or an optimizer "
                             "stepped): freeze their start references before training or resuming")
        taken = [a + REFERENCE_SUFFIX for a in todo if a + REFERENCE_SUFFIX in self.model.peft_config]
        if taken:
            raise ValueError(f"the model already has adapters named {taken}")
        grads = {n: p.requires_grad for n, p in self.model.named_parameters()}  # peft may flip them: kept
        active = self.model.active_adapter
        try:
            for adapter in todo:
                name = adapter + REFERENCE_SUFFIX
                weights = get_peft_model_state_dict(self.model, adapter_name=adapter)
                config = copy.deepcopy(self.model.peft_config[adapter])
                config.init_lora_weights = False  # overwritten at once: no initialiser (some would touch the base)
                self.model.add_adapter(name, config)
                set_peft_model_state_dict(self.model, weights, adapter_name=name)
                self.references[adapter] = name
        finally:
            self.model.set_adapter(active)
            for n, p in self.model.named_parameters():
                p.requires_grad_(grads.get(n, False))  # the copies: frozen

    def _reference_digests(self) -> dict[str, str]:
        """{trained adapter: sha256 of its start copy's weights}: what a checkpoint was trained against."""
        out = {}
        for adapter, name in sorted(self.references.items()):
            h = hashlib.sha256()
            for key, value in sorted(get_peft_model_state_dict(self.model, adapter_name=name).items()):
                h.update(key.encode())
                h.update(value.detach().float().cpu().numpy().tobytes())
            out[adapter] = h.hexdigest()
        return out

    def state_dict(self) -> dict:
        """Adapter weights (trained and frozen, not the start copies: they are rebuilt from the start)
        and optimizer states: what a checkpoint holds."""

        adapters = {a: {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=a).items()}
                    for a in self.policy_adapters()}
        return {"adapters": adapters, "optimizers": {a: o.state_dict() for a, o in self.optimizers.items()},
                "references": self._reference_digests()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's adapters and optimizer states. Its KL references (the digests of the start copies;
        none in a run whose KL term reads the base model) must be this policy set's: a resume whose start
        changed (a rebuilt warm start) or whose reference setting changed is refused (ValueError).
        Checkpoints written before the digests were kept carry none and are not checked."""
        saved, ours = state.get("references"), self._reference_digests()
        if saved is not None and saved != ours:
            changed = sorted(a for a in set(saved) | set(ours) if saved.get(a) != ours.get(a))
            raise ValueError(f"the checkpoint's KL reference of adapters {changed} is not this run's (saved: "
                             f"{'start copies' if saved else 'the base model'}; here: "
                             f"{'start copies' if ours else 'the base model'}): the start or "
                             "training.grpo.kl_reference changed since it was written")
        self._loaded = True
        for adapter, weights in state["adapters"].items():
            result = set_peft_model_state_dict(self.model, weights, adapter_name=adapter)
            missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
            if missing:
                raise ValueError(f"checkpoint weights {missing[:3]} do not fit adapter {adapter!r}")
        for adapter, opt_state in state["optimizers"].items():
            self.optimizers[adapter].load_state_dict(opt_state)

    def save_adapters(self, out_dir: str | Path, adapters: Iterable[str] | None = None) -> dict[str, Path]:
        """Each adapter (default: all of the model's but the start copies; else the named ones) in
        peft's format under ``out_dir/<adapter>/`` (loadable by the evaluation harness and by vLLM)."""
        names = self.policy_adapters() if adapters is None else list(dict.fromkeys(adapters))
        unknown = [a for a in names if a not in self.model.peft_config]
        if unknown:
            raise ValueError(f"cannot save adapters {unknown}: the model has {sorted(self.model.peft_config)}")
        out = {}
        for adapter in names:
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
