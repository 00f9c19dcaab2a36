"""Generation on vLLM (GPU only), directly or through an Unsloth model's vLLM engine.

:class:`VLLMBackend` wraps ``vllm.LLM.generate`` or an Unsloth model's ``fast_generate`` behind
the contract of :mod:`cosearch_lib.models.generation.contract`. vLLM's sampled-token logprobs are
its default "raw" logprobs, i.e. of the untempered logits: identical to the transformers
backend's at temperature 0 and 1 (the paper's setting), not otherwise.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.contract import Generation, check_prompts, row_seeds
from cosearch_lib.models.registry import ModelNotFoundError, convert_bundled_gguf, resolve_model

#: What to do when vLLM or Unsloth is missing (appended to the ImportError).
GPU_EXTRA_HINT = "install the GPU extra on a CUDA machine: pip install -e .[gpu]"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"VLLMBackend needs vLLM, which is not installed; {GPU_EXTRA_HINT}") from err
    return vllm


@dataclass
class _Adapter:
    name: str  # adapter name used by the rollout
    path: str  # folder with adapter_config.json + weights
    request: Any  # the LoRARequest handed to vLLM


@dataclass
class VLLMBackend:
    """Generation on vLLM (GPU). Build with :meth:`from_model`, :meth:`from_llm` or :meth:`from_unsloth`.

    Adapters are registered with :meth:`add_adapter`; each registration gets a fresh integer id,
    because vLLM caches LoRA weights by id: re-register after saving updated weights (every GRPO
    step) or vLLM keeps serving the old ones.
    """

    generate_fn: Callable[..., list[Any]]  # vllm.LLM.generate or an Unsloth model's fast_generate
    load_lora_fn: Callable[[str], Any] | None = None  # Unsloth's model.load_lora; None: LoRARequest
    model: Any = None  # the Unsloth/peft model when built from one (the trainer updates it)
    tokenizer: Any = None  # its tokenizer, when known
    adapters: dict[str, _Adapter] = field(default_factory=dict)  # registered LoRA adapters by name
    _next_lora_id: int = 1  # vLLM needs ids >= 1
    _warned: bool = False  # the temperature-vs-logprobs warning was shown once

    @classmethod
    def from_llm(cls, llm: Any) -> VLLMBackend:
        """Wrap an existing ``vllm.LLM`` (its tokenizer too, for chat templates)."""
        get_tokenizer = getattr(llm, "get_tokenizer", None)
        return cls(generate_fn=llm.generate, tokenizer=get_tokenizer() if get_tokenizer is not None else None)

    @classmethod
    def from_unsloth(cls, model: Any, tokenizer: Any = None) -> VLLMBackend:
        """Wrap a model from ``FastLanguageModel.from_pretrained(..., fast_inference=True)``."""
        if not hasattr(model, "fast_generate"):
            raise ValueError("model has no fast_generate: load it with "
                             "FastLanguageModel.from_pretrained(..., fast_inference=True)")
        return cls(generate_fn=model.fast_generate, load_lora_fn=getattr(model, "load_lora", None),
                   model=model, tokenizer=tokenizer)

    @classmethod
    def from_model(cls, model_name: str, *, enable_lora: bool = True, max_lora_rank: int = 64,
                   gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                   **llm_kwargs: Any) -> VLLMBackend:
        """Start a ``vllm.LLM`` on a model name or path (bundled names resolve to their converted folder)."""
        vllm = _import_vllm()
        kwargs = dict(model=resolved_model_path(model_name), enable_lora=enable_lora,
                      gpu_memory_utilization=gpu_memory_utilization, **llm_kwargs)
        if enable_lora:
            kwargs["max_lora_rank"] = max_lora_rank
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        return cls.from_llm(vllm.LLM(**kwargs))

    @classmethod
    def from_unsloth_pretrained(cls, model_name: str, *, max_seq_length: int = 4096, max_lora_rank: int = 64,
                                gpu_memory_utilization: float = 0.5, load_in_4bit: bool = False,
                                **kwargs: Any) -> VLLMBackend:
        """Load with Unsloth and its vLLM engine (``fast_inference=True``); the model stays on ``.model``."""
        try:
            from unsloth import FastLanguageModel
        except ImportError as err:
            raise ImportError(f"the 'unsloth' backend needs Unsloth, which is not installed; {GPU_EXTRA_HINT}") from err
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=resolved_model_path(model_name), max_seq_length=max_seq_length, load_in_4bit=load_in_4bit,
            fast_inference=True, max_lora_rank=max_lora_rank, gpu_memory_utilization=gpu_memory_utilization,
            **kwargs)
        return cls.from_unsloth(model, tokenizer)

    def add_adapter(self, name: str, path: str) -> None:
        """Register (or re-register, after new weights were saved) LoRA ``name`` stored at ``path``."""
        path = str(path)
        if self.load_lora_fn is not None:
            request = self.load_lora_fn(path)
        else:
            from vllm.lora.request import LoRARequest

            request = LoRARequest(name, self._next_lora_id, path)
            self._next_lora_id += 1
        self.adapters[name] = _Adapter(name, path, request)

    def sampling_params(self, sampling: SamplingConfig, seeds: list[int | None]) -> list[Any]:
        """One ``vllm.SamplingParams`` per row (they differ only in the seed)."""
        from vllm import SamplingParams

        if not sampling.greedy and sampling.temperature != 1 and not self._warned:
            self._warned = True
            warnings.warn(f"vLLM returns logprobs of the untempered logits; at temperature {sampling.temperature} "
                          "they differ from TransformersBackend's (exact at temperature 0 and 1)", stacklevel=3)
        return [SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens, stop=list(sampling.stop) or None,
            include_stop_str_in_output=True, logprobs=0, seed=seed,
        ) for seed in seeds]

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, adapter: str | None = None,
                 row_keys: list[object] | None = None) -> list[Generation]:
        check_prompts(prompts)
        _import_vllm()
        try:
            from vllm.inputs import TokensPrompt
        except ImportError:  # a TypedDict: a plain dict at runtime
            TokensPrompt = dict  # noqa: N806
        request = None
        if adapter is not None:
            if adapter not in self.adapters:
                raise ValueError(f"unknown adapter {adapter!r}; registered: {sorted(self.adapters)} (use add_adapter)")
            request = self.adapters[adapter].request
        seeds: list[int | None] = (row_seeds(sampling.seed, row_keys, len(prompts))
                                   if sampling.seed is not None else [None] * len(prompts))
        outputs = self.generate_fn([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                   sampling_params=self.sampling_params(sampling, seeds),
                                   lora_request=request, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        return [_from_vllm_output(o) for o in outputs]


def _from_vllm_output(request_output: Any) -> Generation:
    """A vLLM RequestOutput (n=1) -> Generation, mapping finish_reason/stop_reason to ours."""
    o = request_output.outputs[0]
    ids = [int(t) for t in o.token_ids]
    if o.logprobs is None or len(o.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no per-token logprobs; SamplingParams(logprobs=0) was expected")
    logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs, ids)]
    if o.finish_reason == "length":
        reason = "length"
    elif o.finish_reason == "stop":
        # stop_reason: None = eos, an int = a stop token id (an eos id of the generation config), a str = stop string
        reason = "stop" if isinstance(o.stop_reason, str) else "eos"
    else:
        raise RuntimeError(f"vLLM request ended with finish_reason={o.finish_reason!r}")
    return Generation(text=o.text, token_ids=ids, logprobs=logprobs, finish_reason=reason)


def resolved_model_path(model_name: str) -> str:
    """A folder vLLM/Unsloth can load: bundled GGUF names convert once; hub ids pass through."""

    try:
        resolved = resolve_model(model_name, allow_download=False)
    except ModelNotFoundError:
        return model_name  # a hub id vLLM may download itself
    return str(convert_bundled_gguf(model_name) if resolved.gguf_file else resolved.path)
