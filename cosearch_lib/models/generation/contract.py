"""The generation contract: what every backend takes and returns.

Why: the rollout engine and the GRPO trainer need, for every generated token, the id exactly as
sampled and its log-probability under the sampling distribution, plus sampling that is
reproducible per row whatever else shares the batch (seeds derived from (step, question, sample,
turn) keys). Every backend returns the same :class:`Generation` records from token-id prompts, so
the rollout never re-tokenises and never needs to know which engine ran
(:class:`cosearch_lib.models.generation.transformers_backend.TransformersBackend`,
:class:`cosearch_lib.models.generation.vllm_backend.VLLMBackend`, or a scripted test double).

Conventions shared by all: ``token_ids`` keep eos when the model produced it (the text does not);
on a stop string, ``token_ids`` end with the token that completed the first stop occurrence and
``text`` ends right after that occurrence (so ``text`` can be a strict prefix of
``decode(token_ids)`` when the last token overhangs the stop - vLLM does the same).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from cosearch_lib.config import SamplingConfig
from cosearch_lib.seeding import derive_seed

FINISH_REASONS = ("eos", "stop", "length")


@dataclass
class Generation:
    """One generated continuation of one prompt."""

    text: str  # decoded generated text (special tokens kept out of the text, e.g. eos)
    token_ids: list[int]  # generated ids exactly as sampled (incl. eos when produced; truncated after a stop string)
    logprobs: list[float]  # log-prob of each id under logits/temperature before top-p/top-k (T=0: log_softmax)
    finish_reason: str  # "eos" | "stop" | "length"


class GenerationBackend(Protocol):
    """What the rollout engine calls. ``adapter=None`` is the base model; a name selects that LoRA."""

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        adapter: str | None = None,
        row_keys: list[object] | None = None,
    ) -> list[Generation]: ...



def prefix_scope(backend: Any, keep_rows_for: Sequence[str | None] = ()) -> AbstractContextManager[Any]:
    """``backend.prefix_scope(...)`` where the backend caches prompt prefixes, else a no-op block.

    Open it around generation with fixed weights (one rollout): prefixes computed inside are
    reused until it closes. ``keep_rows_for``: adapters whose next prompts extend their previous
    generations (the agent's turns)."""
    scope = getattr(backend, "prefix_scope", None)
    return scope(keep_rows_for) if callable(scope) else nullcontext()


@contextmanager
def bf16_scope(*backends: Any, enabled: bool = True) -> Iterator[None]:
    """Each backend's ``bf16_scope()`` (decode with bfloat16 copies of the weights until the block ends) when
    ``enabled``, once per backend (told apart by identity: a dataclass engine is unhashable, its == compares
    fields; None is skipped). A backend without one decodes as it does: an engine that holds its own weights
    (vLLM: bf16 on a GPU already) or one that computes nothing (the tests' scripted backends)."""
    with ExitStack() as scopes:
        seen: list[Any] = []
        for backend in backends:
            if backend is None or any(backend is s for s in seen):
                continue
            seen.append(backend)
            scope = getattr(backend, "bf16_scope", None) if enabled else None
            if callable(scope):
                scopes.enter_context(scope())
        yield


def row_seeds(seed: int | None, row_keys: Sequence[object] | None, n: int) -> list[int]:
    """One seed per row: ``derive_seed(seed, key)``; keys default to the row's position in the call.

    ``seed=None`` draws a fresh base seed, so rows still get distinct, independent streams.
    """
    if row_keys is not None and len(row_keys) != n:
        raise ValueError(f"row_keys has {len(row_keys)} entries for {n} prompts; give one key per prompt")
    base = random.SystemRandom().getrandbits(63) if seed is None else seed
    keys = row_keys if row_keys is not None else range(n)
    return [derive_seed(base, key) for key in keys]


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """End index (exclusive) of the earliest-ending stop occurrence in ``text``, or None."""
    ends = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
    return min(ends) if ends else None


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    """Refuse anything but a sequence of non-empty token-id lists (a string is not one), naming the bad prompt."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    for i, p in enumerate(prompts):
        if isinstance(p, str) or len(p) == 0:
            raise ValueError(f"prompt {i} must be a non-empty list of token ids, got {p!r:.60}")
