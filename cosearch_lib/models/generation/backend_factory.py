"""``make_backend``: a generation backend by kind, as a profile names it (``BACKEND_KINDS``)."""

from __future__ import annotations

from typing import Any

from cosearch_lib.config import BACKEND_KINDS
from cosearch_lib.models.generation.contract import GenerationBackend
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.generation.vllm_backend import VLLMBackend
from cosearch_lib.models.registry import load_causal_lm


def make_backend(kind: str, model_name: str, **kw: Any) -> GenerationBackend:
    """Build a backend by kind: "transformers" (kw: dtype, device, batch_size, progress), "vllm"
    (kw: see :meth:`VLLMBackend.from_model`; one engine per model and options in a process) or "unsloth" (kw: see
    :meth:`VLLMBackend.from_unsloth_pretrained`; the engine a trainer of this process samples on, when there is one)."""
    if kind == "transformers":

        model, tokenizer = load_causal_lm(model_name, dtype=kw.pop("dtype", None), device=kw.pop("device", None))
        return TransformersBackend(model, tokenizer, **kw)
    if kind == "vllm":
        return VLLMBackend.shared(model_name, **kw)
    if kind == "unsloth":
        return VLLMBackend.unsloth_engine(model_name, **kw)
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {BACKEND_KINDS}")
