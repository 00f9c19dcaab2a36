"""Building running objects from a profile: the retriever (``build_retriever``), the generation
backends (``build_backends``, ``vllm_options``; ``policy_engine``, what samples the policies a
trainer updates) and the evaluation harness's settings and context (``harness_config``,
``harness_context``). Nothing here trains or caches a policy (``cached_starts``) or runs a method
(``method_runs``); every layer below takes explicit settings objects and never reads a profile
itself."""

from __future__ import annotations

import dataclasses
from typing import Any

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.config import ProfileConfig, load_profile
from cosearch_lib.eval.harness import HarnessConfig, HarnessContext
from cosearch_lib.experiment.preflight import engine_length, retriever_url
from cosearch_lib.models.autocast import cpu_bf16_stage
from cosearch_lib.models.generation.backend_factory import make_backend
from cosearch_lib.models.generation.contract import GenerationBackend
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.policy_loading import vllm_max_lora_rank
from cosearch_lib.retrieval.artifacts import prepare_corpus, prepare_index
from cosearch_lib.retrieval.encoder import TextEncoder
from cosearch_lib.retrieval.http_client import HttpRetriever
from cosearch_lib.retrieval.retriever import Retriever, SearchBackend


def resolve_profile(profile: str | ProfileConfig) -> ProfileConfig:
    return profile if isinstance(profile, ProfileConfig) else load_profile(profile)


def build_retriever(profile: str | ProfileConfig, *, progress: bool = True, device: str | None = None) -> Retriever:
    """The profile's in-process dense retriever, building and caching whatever is missing."""
    cfg = resolve_profile(profile)
    store, paths = prepare_corpus(cfg, progress=progress)
    encoder = TextEncoder(cfg.retrieval.encoder, device=device)
    index = prepare_index(cfg, encoder, store, paths, progress=progress)
    return Retriever(encoder, index, store)


def search_backend(profile: str | ProfileConfig, *, progress: bool = True) -> SearchBackend:
    """What a notebook or a training rank searches with: the job's retrieval server when one is named
    (:func:`retriever_url`; the server checks its own index), else the in-process retriever
    (:func:`build_retriever`). A multi-process job runs one ``cosearch serve-retriever`` and every
    process reaches the index through it instead of loading its own copy."""
    cfg = resolve_profile(profile)
    url = retriever_url(cfg)
    if url is None:
        return build_retriever(cfg, progress=progress)
    client = HttpRetriever(url)
    client.health()  # a wrong URL or a server that is not up fails here, naming the URL
    return client


def harness_config(cfg: ProfileConfig, **overrides: Any) -> HarnessConfig:
    """The :class:`HarnessConfig` a profile describes: split, questions, samples and temperature from its
    ``evaluation`` section, token and search budgets from ``rollout``, N and K from ``retrieval``,
    the profile's seed, the Hit cutoffs of its ranker reward, bf16 weights where ``evaluation.bf16_weights`` asks for them and
    this CPU has bf16 instructions (``models.autocast.cpu_bf16_stage``). Keyword overrides (any HarnessConfig field) win, e.g. ``methods=[...]``."""
    ev, ro = cfg.evaluation, cfg.rollout
    fields = dict(split=ev.split, n_per_dataset=ev.n_per_dataset, n_samples=ev.n_samples, seed=cfg.seed,
                  temperature=ev.temperature, search=cfg.search, agent_max_new_tokens=ro.agent_max_new_tokens,
                  ranker_max_new_tokens=ro.ranker_max_new_tokens, answer_max_new_tokens=ev.answer_max_new_tokens,
                  max_context_tokens=ro.max_context_tokens, rules=ro.rules, f1=ev.f1,
                  baseline_reply=ev.baseline_reply, hit_ks=cfg.training.ranker_reward.hit_ks)
    if "bf16" not in overrides:  # decided (and warned about) only where the profile's setting is what counts
        fields["bf16"] = cpu_bf16_stage(ev.bf16_weights, warn_as="evaluation.bf16_weights")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(HarnessConfig)})
    if unknown:
        raise TypeError(f"unknown HarnessConfig field(s) {unknown}")
    return HarnessConfig(**{**fields, **overrides})


def vllm_options(cfg: ProfileConfig) -> dict[str, Any]:
    """:meth:`VLLMBackend.from_model` options of the profile (``models.vllm``), one set for every
    stage, so that training, relevance training and evaluation share one engine per process."""
    return {**cfg.models.vllm.engine_kwargs(engine_length(cfg)), "max_lora_rank": vllm_max_lora_rank(cfg.lora.r),
            "seed": cfg.seed}


def unsloth_options(cfg: ProfileConfig) -> dict[str, Any]:
    """:meth:`VLLMBackend.from_unsloth_pretrained` options of the profile: the engine holds the measured
    context budget (``experiment.preflight.engine_length``; Unsloth's default is 4,096) and takes the
    profile's share of the GPU, not Unsloth's defaults."""
    return {"max_seq_length": engine_length(cfg), "max_lora_rank": vllm_max_lora_rank(cfg.lora.r),
            "gpu_memory_utilization": cfg.models.vllm.gpu_memory_utilization}


def build_backends(cfg: ProfileConfig, *, progress: bool = False) -> tuple[GenerationBackend, GenerationBackend]:
    """(agent backend, ranker backend) for the profile's ``models`` section. When agent and ranker
    name the same model they share one loaded backend (LoRA adapters tell the two policies apart)."""

    m = cfg.models
    kwargs = {**m.transformers_options(), "progress": progress} if m.backend == "transformers" else \
        vllm_options(cfg) if m.backend == "vllm" else unsloth_options(cfg)
    agent = make_backend(m.backend, m.agent, **kwargs)
    ranker = agent if m.ranker == m.agent else make_backend(m.backend, m.ranker, **kwargs)
    return agent, ranker


def policy_engine(cfg: ProfileConfig, model: Any, tokenizer: Any, engine: GenerationBackend | None) -> GenerationBackend:
    """The engine that samples the policies a trainer updates: ``engine`` when the training backend
    brings its own (vLLM, Unsloth: ``models.policy_loading.load_policy_model`` returns it), else the
    policy model itself (a ``TransformersBackend`` with the profile's ``models`` options)."""
    return engine if engine is not None else TransformersBackend(model, tokenizer, **cfg.models.transformers_options())


def harness_context(cfg: ProfileConfig, retriever: SearchBackend, *, backends: tuple[Any, Any] | None = None,
                         progress: bool = False) -> HarnessContext:
    """A :class:`HarnessContext` for a profile: its models (:func:`build_backends`, unless
    ``backends`` are given), their chat templates, and ``retriever``."""
    agent, ranker = backends if backends is not None else build_backends(cfg, progress=progress)
    for role, backend in (("agent", agent), ("ranker", ranker)):
        if getattr(backend, "tokenizer", None) is None:
            raise ValueError(f"the {role} backend has no tokenizer; build it with one (VLLMBackend(tokenizer=...))")
    chat = ChatTokens(agent.tokenizer)
    ranker_chat = chat if ranker is agent else ChatTokens(ranker.tokenizer)
    return HarnessContext(agent_backend=agent, chat=chat, retriever=retriever, ranker_backend=ranker,
                       ranker_chat=ranker_chat, protocol=cfg.protocol)
