"""LoRA policies: the adapter settings shared by the warm start and GRPO, and the two-role policy set.

Agent and ranker are two LoRA adapters on one frozen base model (``"agent"`` and ``"ranker"``),
each with its own optimizer (the paper trains two separate models; two adapters on one base is
the LoRA equivalent, and the base stays shared in memory). The ablation "shared backbone" uses one
adapter (``"shared"``) for both roles. The reference policy of the KL term is the base model with
the adapters disabled.

:func:`load_policy_model` builds the base and its adapters for either training path: plain
transformers + peft (CPU or GPU; rollouts then run on the policy model itself), or Unsloth with
its vLLM engine (GPU; rollouts on vLLM, which reads each adapter from a saved folder, see
:func:`sync_adapters`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from cosearch_lib.config import TRAIN_BACKENDS, LoraSettings
from cosearch_lib.models.generation.vllm_backend import GPU_EXTRA_HINT, VLLMBackend, resolved_model_path
from cosearch_lib.models.registry import align_chat_tokens, load_causal_lm, quiet_loading

#: The file peft's ``save_pretrained`` writes an adapter's weights to.
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
#: The name peft gives the adapter that ``FastLanguageModel.get_peft_model`` creates.
UNSLOTH_DEFAULT_ADAPTER = "default"
#: The ``max_lora_rank`` values vLLM accepts (its LoRAConfig rejects any other).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


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

        adapters = {a: {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=a).items()}
                    for a in self.model.peft_config}
        return {"adapters": adapters, "optimizers": {a: o.state_dict() for a, o in self.optimizers.items()}}

    def load_state_dict(self, state: dict) -> None:
        for adapter, weights in state["adapters"].items():
            result = set_peft_model_state_dict(self.model, weights, adapter_name=adapter)
            missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
            if missing:
                raise ValueError(f"checkpoint weights {missing[:3]} do not fit adapter {adapter!r}")
        for adapter, opt_state in state["optimizers"].items():
            self.optimizers[adapter].load_state_dict(opt_state)

    def save_adapters(self, out_dir: str | Path, adapters: Iterable[str] | None = None) -> dict[str, Path]:
        """Each adapter (default: all of the model's; else the named ones) in peft's format under
        ``out_dir/<adapter>/`` (loadable by the evaluation harness and by vLLM)."""
        names = list(self.model.peft_config) if adapters is None else list(dict.fromkeys(adapters))
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


def sync_adapters(policies: PolicySet, backend: Any, folder: str | Path,
                  adapters: Iterable[str] | None = None) -> dict[str, Path]:
    """Save ``adapters`` (default: every adapter that plays a role) under ``folder/<adapter>/`` and
    register each with ``backend.add_adapter(name, path)``, so a generation engine that reads LoRA
    weights from disk (vLLM) samples with the current weights. Returns {adapter: folder}.

    vLLM caches adapter weights by integer id; :meth:`models.generation.vllm_backend.VLLMBackend.add_adapter` hands out
    a fresh id on every registration, so re-registering after each update makes it reload them."""
    names = list(dict.fromkeys(a for a in policies.roles.values() if a)) if adapters is None else list(adapters)
    if not names:
        return {}
    paths = policies.save_adapters(folder, names)
    for name, path in paths.items():
        backend.add_adapter(name, str(path))
    return paths


class ServedAdapters:
    """What a generation engine that reads LoRA weights from disk (vLLM: it has ``add_adapter``) serves,
    and the training step whose weights those are; a trainer's one place for it.

    ``serve(step)`` saves and registers the adapters (:func:`sync_adapters`) unless the engine already
    serves that step's weights (its first generation; after a restore, :meth:`forget`); ``push(step)``
    does it after an update, always. A backend without ``add_adapter`` generates with the trainer's own
    model: ``enabled`` is False and nothing is written."""

    def __init__(self, policies: PolicySet, backend: Any, folder: str | Path,
                 adapters: Iterable[str] | None = None) -> None:
        self.policies, self.backend, self.folder = policies, backend, Path(folder)
        self.adapters = None if adapters is None else list(adapters)  # None: every adapter that plays a role
        self.enabled = callable(getattr(backend, "add_adapter", None))
        self.step: int | None = None  # the step whose weights the engine serves (None: none yet)

    def serve(self, step: int) -> None:
        """The engine serves the adapters as they are at ``step`` (registered now unless it already does)."""
        if self.enabled and self.step != step:
            sync_adapters(self.policies, self.backend, self.folder, self.adapters)
            self.step = step

    def push(self, step: int, adapters: Iterable[str] | None = None) -> None:
        """After an update: ``adapters`` (default: those served) registered again, now the weights of ``step``."""
        if self.enabled:
            sync_adapters(self.policies, self.backend, self.folder, self.adapters if adapters is None else adapters)
            self.step = step

    def forget(self) -> None:
        """The weights changed outside an update (a checkpoint restored): the next ``serve`` registers them."""
        self.step = None


# ------------------------------------------------------------------------------ loading


def load_policy_model(model_name: str, adapters: dict[str, str | Path | None], lora: LoraSettings, *,
                      backend: str = "transformers", seed: int = 0, max_seq_length: int = 4096,
                      gpu_memory_utilization: float = 0.5, load_in_4bit: bool = False,
                      vllm_options: dict[str, Any] | None = None, engine_per_rank: bool = False) -> tuple[Any, Any, Any]:
    """The trainable policy model: ``(peft model, tokenizer, generation backend or None)``.

    ``adapters`` maps adapter names ("agent", "ranker" or "shared") to a saved adapter folder (a
    warm start) or None (fresh from ``lora``), as in :func:`lora_model`.

    * ``backend="transformers"``: :func:`models.registry.load_causal_lm` + :func:`lora_model`; no generation
      backend (the trainer samples with the policy model itself).
    * ``backend="unsloth"`` (GPU): ``FastLanguageModel.from_pretrained(fast_inference=True)`` loads the
      base and starts vLLM on the same weights (``max_lora_rank``: :func:`vllm_max_lora_rank`, vLLM taking
      ``gpu_memory_utilization`` of the GPU, a 16-bit base unless ``load_in_4bit``); the adapters are
      then built as described in :func:`_unsloth_adapters`, and the generation backend is
      :meth:`models.generation.vllm_backend.VLLMBackend.from_unsloth` (adapters still to register: the trainer does it).
      With ``engine_per_rank`` (a data-parallel job of several ranks), Unsloth's own engine is not
      started: ``fast_inference=True`` cannot join the job's process group (unsloth_zoo's ``load_vllm``
      takes no ``distributed_executor_backend``, and every rank would start it on ``cuda:0``). The rank
      loads Unsloth's patched model alone, on its own GPU (``device_map={"": "cuda:<LOCAL_RANK>"}``),
      and generates with one plain vLLM engine of its own in ``external_launcher`` mode, as
      ``backend="vllm"`` does; the adapters reach that engine as saved folders every step. TRL runs
      Unsloth the same way when Unsloth brings no engine (docs/USAGE.md, "Many GPUs").
    * ``backend="vllm"``: transformers + peft train, as above, and a vLLM engine generates
      (:meth:`VLLMBackend.shared`, ``vllm_options``: :meth:`VLLMBackend.from_model`'s; CPU with
      ``make install-vllm``, GPU with the ``gpu`` extra). vLLM reads each adapter from a saved
      folder: the trainer saves and registers them after every update (:func:`sync_adapters`).
    """
    if not adapters:
        raise ValueError("load_policy_model needs at least one adapter name")
    if backend not in TRAIN_BACKENDS:
        raise ValueError(f"unknown training backend {backend!r}; expected one of {TRAIN_BACKENDS}")
    if backend in ("transformers", "vllm"):
        base, tokenizer = load_causal_lm(model_name)
        generation = None
        if backend == "vllm":
            options = {"max_lora_rank": vllm_max_lora_rank(lora.r), "max_model_len": max_seq_length,
                       **(vllm_options or {})}
            generation = VLLMBackend.shared(model_name, **options)
        return lora_model(base, adapters, lora), tokenizer, generation

    if UNSLOTH_DEFAULT_ADAPTER in adapters:
        raise ValueError(f"adapter name {UNSLOTH_DEFAULT_ADAPTER!r} is reserved on the unsloth backend")

    try:
        from unsloth import FastLanguageModel
    except ImportError as err:
        raise ImportError(f"backend 'unsloth' needs Unsloth (and vLLM), which is not installed; {GPU_EXTRA_HINT}") from err
    if engine_per_rank:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        base, tokenizer = FastLanguageModel.from_pretrained(
            model_name=resolved_model_path(model_name), max_seq_length=max_seq_length, load_in_4bit=load_in_4bit,
            fast_inference=False, device_map={"": f"cuda:{local_rank}"})
        align_chat_tokens(tokenizer, base.config)
        model = _unsloth_adapters(FastLanguageModel, base, adapters, lora, seed=seed)
        options = {"max_lora_rank": vllm_max_lora_rank(lora.r), "max_model_len": max_seq_length,
                   "gpu_memory_utilization": gpu_memory_utilization, **(vllm_options or {})}
        return model, tokenizer, VLLMBackend.keep_unsloth_engine(model_name, VLLMBackend.shared(model_name, **options))
    key = repr((str(resolved_model_path(model_name)), max_seq_length, load_in_4bit, dataclasses.astuple(lora)))
    kept, engine = _UNSLOTH_MODELS.get(key), VLLMBackend.kept_unsloth_engine(model_name)
    if kept is not None and engine is not None and engine.model is kept[0]:
        # the next method trained in this process: the same patched model and its engine, new adapters
        model, tokenizer = kept
        _replace_unsloth_adapters(model, adapters, lora, seed=seed)
        return model, tokenizer, engine
    base, tokenizer = FastLanguageModel.from_pretrained(
        model_name=resolved_model_path(model_name), max_seq_length=max_seq_length, load_in_4bit=load_in_4bit,
        fast_inference=True, max_lora_rank=vllm_max_lora_rank(lora.r), gpu_memory_utilization=gpu_memory_utilization)
    align_chat_tokens(tokenizer, base.config)
    model = _unsloth_adapters(FastLanguageModel, base, adapters, lora, seed=seed)
    _UNSLOTH_MODELS.clear()  # one patched model per process: it holds the process's engine
    _UNSLOTH_MODELS[key] = (model, tokenizer)
    return model, tokenizer, VLLMBackend.keep_unsloth_engine(model_name, VLLMBackend.from_unsloth(model, tokenizer))


#: The Unsloth model of this process loaded with ``fast_inference`` (its vLLM engine on the same
#: weights takes a share of the GPU), by model and loading settings. Another method trained in the
#: same process (notebook 03's methods, one after the other in one kernel) gets it back with its
#: own adapters, instead of a second model and a second engine on the same GPU.
_UNSLOTH_MODELS: dict[str, tuple[Any, Any]] = {}


def vllm_max_lora_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r`` (r itself above them all)."""
    return next((v for v in VLLM_LORA_RANKS if v >= r), r)


def _unsloth_adapters(fast_lm: Any, base: Any, adapters: dict[str, str | Path | None], lora: LoraSettings, *,
                      seed: int) -> Any:
    """Wrap an Unsloth base in a peft model holding exactly the named adapters.

    ``FastLanguageModel.get_peft_model`` takes no adapter name: its adapter is peft's ``"default"``.
    It is still the entry point (it installs Unsloth's LoRA kernels, gradient checkpointing and the
    vLLM hooks ``fast_generate`` / ``load_lora`` on the peft model), so it runs once with ``lora``'s
    settings; then every named adapter is added through peft (``load_adapter`` from a warm-start
    folder, trainable, or ``add_adapter`` fresh from ``lora``), and ``"default"`` is deleted. Renaming
    it instead would mean editing peft's per-layer dicts; keeping it unused would put a stray
    adapter into every checkpoint. Unsloth's kernels read the *active* adapter of each layer, so
    the names do not matter to them; what hard-codes ``"default"`` in Unsloth (``model.save_lora``,
    ``load_lora(..., load_tensors=True)``, its own GRPO trainer's in-memory sync) is not used here:
    vLLM gets each adapter from a folder saved by :meth:`PolicySet.save_adapters`."""
    model = fast_lm.get_peft_model(
        base, r=lora.r, target_modules=list(lora.target_modules), lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        bias="none", use_gradient_checkpointing="unsloth", random_state=seed)
    _add_named_adapters(model, adapters, lora, seed=seed)
    return model


def _replace_unsloth_adapters(model: Any, adapters: dict[str, str | Path | None], lora: LoraSettings, *, seed: int) -> None:
    """Give a kept Unsloth peft model (:data:`_UNSLOTH_MODELS`) exactly the named adapters, as a fresh
    load would: a placeholder ``"default"`` adapter holds the model while the previous method's
    adapters are deleted (peft keeps at least one), then :func:`_add_named_adapters`."""
    model.add_adapter(UNSLOTH_DEFAULT_ADAPTER, peft_lora_config(lora))
    model.set_adapter(UNSLOTH_DEFAULT_ADAPTER)
    for name in [n for n in model.peft_config if n != UNSLOTH_DEFAULT_ADAPTER]:
        model.delete_adapter(name)
    _add_named_adapters(model, adapters, lora, seed=seed)


def _add_named_adapters(model: Any, adapters: dict[str, str | Path | None], lora: LoraSettings, *, seed: int) -> None:
    """Add each named adapter to a peft model that holds only ``"default"``, then delete that one. The
    fresh adapters' initial weights come from ``seed`` alone, so a method trained second in a process
    starts where it would start alone."""
    torch.manual_seed(seed)
    for name, path in adapters.items():
        if path:
            with quiet_loading():
                model.load_adapter(str(path), adapter_name=name, is_trainable=True)
            rank = model.peft_config[name].r
            if rank > vllm_max_lora_rank(lora.r):
                raise ValueError(f"adapter {name!r} from {path} has rank {rank}, above vLLM's max_lora_rank "
                                 f"{vllm_max_lora_rank(lora.r)} (from lora.r={lora.r}); warm-start with the same "
                                 "LoRA settings")
        else:
            model.add_adapter(name, peft_lora_config(lora))
    model.set_adapter(next(iter(adapters)))
    model.delete_adapter(UNSLOTH_DEFAULT_ADAPTER)
