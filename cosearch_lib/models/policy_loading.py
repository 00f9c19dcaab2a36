"""Loading the trainable policy model for either training path: plain transformers + peft (CPU or GPU;
rollouts then run on the policy model itself), or Unsloth with its vLLM engine (GPU; rollouts on
vLLM, which reads each adapter from a saved folder: ``models.served_adapters``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from cosearch_lib.config import TRAIN_BACKENDS, LoraSettings
from cosearch_lib.models.generation.vllm_backend import GPU_EXTRA_HINT, VLLMBackend, resolved_model_path
from cosearch_lib.models.lora_policies import lora_model, peft_lora_config
from cosearch_lib.models.registry import align_chat_tokens, load_causal_lm, quiet_loading

#: The name peft gives the adapter that ``FastLanguageModel.get_peft_model`` creates.
UNSLOTH_DEFAULT_ADAPTER = "default"
#: The ``max_lora_rank`` values vLLM accepts (its LoRAConfig rejects any other).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)

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
      folder: the trainer saves and registers them after every update (``models.served_adapters.sync_adapters``).
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
