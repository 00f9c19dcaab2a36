"""Generation backends: one contract, three engines.

Why: the rollout engine and the GRPO trainer need, for every generated token, the id exactly as
sampled and its log-probability under the sampling distribution, plus sampling that is
reproducible per row whatever else shares the batch (seeds derived from (step, question, sample,
turn) keys). Every backend returns the same :class:`Generation` records from token-id prompts, so
the rollout never re-tokenises and never needs to know which engine ran.

* :class:`TransformersBackend` - CPU or GPU, any ``AutoModelForCausalLM`` or peft model. Our own
  batched decode loop (cached prompt prefixes, a prefill of each row's new tokens with explicit
  position ids, then one token per step on the KV cache). Departures from ``model.generate``:
  per-row counter-based uniforms (a hash of row seed and token index, inverse-CDF sampling),
  per-row stop strings checked on the decoded tail, logprobs of the sampled ids under
  ``logits / temperature`` *before* top-p/top-k truncation, finished rows dropped from the batch,
  prompts sorted by length before chunking (less padding), prompt prefixes computed once.
* :class:`VLLMBackend` - GPU only; wraps ``vllm.LLM.generate`` or an Unsloth model's
  ``fast_generate``. vLLM's sampled-token logprobs are its default "raw" logprobs, i.e. of the
  untempered logits: identical to ours at temperature 0 and 1 (the paper's setting), not otherwise.

Conventions shared by all: ``token_ids`` keep eos when the model produced it (the text does not);
on a stop string, ``token_ids`` end with the token that completed the first stop occurrence and
``text`` ends right after that occurrence (so ``text`` can be a strict prefix of
``decode(token_ids)`` when the last token overhangs the stop - vLLM does the same).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from transformers import DynamicCache, StaticCache

from cosearch_lib.config import BACKEND_KINDS, SamplingConfig
from cosearch_lib.models.counter_rng import counter_uniforms, seed_halves
from cosearch_lib.models.grouped_attention import use_grouped_attention
from cosearch_lib.models.growing_cache import growing_cache
from cosearch_lib.models.prefix_cache import KVPrefix, PrefixStore, runnable_prefix_length
from cosearch_lib.models.registry import ModelNotFoundError, convert_bundled_gguf, load_causal_lm, resolve_model
from cosearch_lib.progress import tqdm
from cosearch_lib.seeding import derive_seed

FINISH_REASONS = ("eos", "stop", "length")
_GPU_HINT = "install the GPU extra on a CUDA machine: pip install -e .[gpu]"


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


# ------------------------------------------------------------------------------ shared helpers


def prefix_scope(backend: Any, keep_rows_for: Sequence[str | None] = ()) -> AbstractContextManager[Any]:
    """``backend.prefix_scope(...)`` where the backend caches prompt prefixes, else a no-op block.

    Open it around generation with fixed weights (one rollout): prefixes computed inside are
    reused until it closes. ``keep_rows_for``: adapters whose next prompts extend their previous
    generations (the agent's turns)."""
    scope = getattr(backend, "prefix_scope", None)
    return scope(keep_rows_for) if callable(scope) else nullcontext()


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


def _check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    for i, p in enumerate(prompts):
        if isinstance(p, str) or len(p) == 0:
            raise ValueError(f"prompt {i} must be a non-empty list of token ids, got {p!r:.60}")


class _Finisher:
    """The eos / stop / length rules, applied token by token (shared by the real and scripted loops)."""

    def __init__(self, decode: Callable[[list[int]], str], eos_ids: Iterable[int], sampling: SamplingConfig, *,
                 stop_tokens: frozenset[int] | None = None):
        self.decode = decode
        # ids after which the decoded tail is searched for a stop string; None: after every id
        self.stop_tokens = stop_tokens
        self.eos_ids = frozenset(eos_ids)
        self.stops = sampling.stop
        self.max_new = sampling.max_new_tokens
        # Tail window in tokens: a stop string of L characters spans at most L tokens, unless tokens
        # decode to nothing on their own (special tokens, partial UTF-8); 2L + 8 leaves room for both.
        self.window = 2 * max((len(s) for s in self.stops), default=0) + 8

    def push(self, ids: list[int], logprobs: list[float], token: int, logprob: float) -> str | None:
        """Append one sampled token to a row; return its finish reason once it is done, else None."""
        ids.append(token)
        logprobs.append(logprob)
        if token in self.eos_ids:
            return "eos"
        if (self.stops and (self.stop_tokens is None or token in self.stop_tokens)
                and find_stop(self.decode(ids[-self.window:]), self.stops) is not None):
            # Shortest prefix whose text contains a stop: normally all of ids (we check every step),
            # but walk back in case a stop slipped past the tail window earlier.
            n = len(ids)
            while n > 1 and find_stop(self.decode(ids[: n - 1]), self.stops) is not None:
                n -= 1
            del ids[n:], logprobs[n:]
            return "stop"
        if len(ids) >= self.max_new:
            return "length"
        return None

    def finish(self, ids: list[int], logprobs: list[float], reason: str) -> Generation:
        if reason == "eos":
            text = self.decode(ids[:-1])
        else:
            text = self.decode(ids)
            if reason == "stop":
                text = text[: find_stop(text, self.stops)]
        return Generation(text=text, token_ids=list(ids), logprobs=list(logprobs), finish_reason=reason)


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    return decode


def eos_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """The tokenizer's eos id plus every eos id of the model's generation config."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None)
    if extra is not None:
        ids.update(int(i) for i in (extra if isinstance(extra, (list, tuple)) else [extra]))
    if not ids:
        raise ValueError("no eos token id: the tokenizer has no eos_token_id and the model's generation_config none")
    return ids


# ------------------------------------------------------------------------------ transformers


def _is_peft(model: Any) -> bool:
    return isinstance(model, PeftModel)


@contextmanager
def adapter_context(model: Any, adapter: str | None) -> Iterator[None]:
    """Run with LoRA ``adapter`` active (None: adapters disabled), then restore the model's state.

    peft's ``set_adapter`` also flips ``requires_grad`` (the active adapter becomes trainable, the
    others frozen); a trainer that freezes one policy's adapter must not see that change, so the
    flags and the previously active adapter are restored on exit.
    """
    if not _is_peft(model):
        if adapter is not None:
            raise ValueError(f"adapter {adapter!r} requested but the model is not a peft model")
        yield
        return
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    if adapter not in model.peft_config:
        raise ValueError(f"unknown adapter {adapter!r}; the model has {sorted(model.peft_config)}")
    previous = model.active_adapter
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for name, p in model.named_parameters():
            p.requires_grad_(grads[name])


def _lora_layers(model: Any, adapter: str) -> list[Any]:
    """The LoRA-wrapped linear layers of ``model`` that carry ``adapter`` (plain LoRA only)."""
    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and adapter in getattr(m, "lora_A", {})]
    if any(m.use_dora.get(adapter) or not isinstance(m.base_layer, torch.nn.Linear) for m in layers):
        return []  # DoRA or non-linear bases: leave them to peft
    return layers


@contextmanager
def merged_adapter(model: Any, adapter: str | None) -> Iterator[bool]:
    """Run with ``adapter``'s LoRA update folded into the base weights (W + scale * B @ A) and the
    adapters switched off: one matrix product per layer instead of three. The merged weights are
    new tensors swapped in for the block and the original tensors put back after, so the base
    weights are restored bit for bit (peft's merge/unmerge would add and subtract in place).
    Yields False (nothing merged; ``adapter_context`` is used) for the base model, a non-peft
    model or an adapter peft should keep running itself."""
    layers = _lora_layers(model, adapter) if adapter is not None and _is_peft(model) else []
    if not layers:
        with adapter_context(model, adapter):
            yield False
        return
    if adapter not in model.peft_config:
        raise ValueError(f"unknown adapter {adapter!r}; the model has {sorted(model.peft_config)}")
    originals = [m.base_layer.weight for m in layers]
    with torch.no_grad():
        merged = [torch.nn.Parameter(w + m.get_delta_weight(adapter).to(w.dtype), requires_grad=False)
                  for m, w in zip(layers, originals)]
    try:
        for m, w in zip(layers, merged):
            m.base_layer.weight = w
        with adapter_context(model, None):
            yield True
    finally:
        for m, w in zip(layers, originals):
            m.base_layer.weight = w


@contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """Dropout (including LoRA dropout) off while sampling; the training flag is restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _sample(logits: Any, uniforms: Any, sampling: SamplingConfig) -> tuple[Any, Any]:
    """Pick one token per row; return (ids, logprobs of those ids).

    logits: (b, V) float32; uniforms: (b,) float64 in [0, 1), one per row (from the row's seed and
    the token index; None when greedy). Inverse-CDF sampling (first index whose cumulative mass
    exceeds u * total) keeps each row's draw a function of its own uniform and its own logits only.
    """

    if sampling.greedy:
        logp = torch.log_softmax(logits, dim=-1)  # (b, V)
        ids = logp.argmax(dim=-1)  # (b,)
        return ids, logp.gather(-1, ids[:, None])[:, 0]
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)  # (b, V) the reported distribution
    truncate = sampling.top_k > 0 or sampling.top_p < 1
    if truncate:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # (b, V)
        probs = sorted_logp.exp()  # (b, V)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if sampling.top_k > 0:
            keep[:, sampling.top_k:] = False
        if sampling.top_p < 1:
            mass_before = probs.cumsum(-1, dtype=torch.float64) - probs  # (b, V) mass of more likely tokens
            keep &= mass_before < sampling.top_p  # the most likely token always stays
        probs = probs * keep
    else:
        probs = logp.exp()  # (b, V) in vocabulary order
    cdf = probs.cumsum(-1, dtype=torch.float64)  # (b, V) float64: u * total stays below the last entry
    target = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]  # (b, 1)
    pos = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)  # (b,)
    ids = order.gather(-1, pos[:, None])[:, 0] if truncate else pos
    return ids, logp.gather(-1, ids[:, None])[:, 0]


STATIC_WIDTH_MULTIPLE = 128  # compiled decoding: static cache widths are rounded up to a multiple of this


class TransformersBackend:
    """Batched generation with a transformers causal LM (or a peft model around one).

    Why our own loop rather than ``model.generate``: we need randomness per row (so a sample
    depends on its row key, not on its batch neighbours), stop strings per row, the logprob of
    every sampled id under the untruncated tempered distribution for the GRPO ratio, and prompt
    prefixes computed once (the ~450-token instructions every agent prompt starts with, and every
    earlier turn of a trajectory). Greedy decoding gives the same ids as
    ``model.generate(do_sample=False)``, with or without cached prefixes (tested).

    The loop, per chunk of at most ``batch_size`` prompts:

    1. **Prefixes.** Every prefix that several prompts of the call share is run once (batch 1):
       the common instructions, then what each set of alike prompts shares beyond them (identical
       prompts included); inside :meth:`prefix_scope`, a trajectory's previous turn (prompt +
       generated tokens) is also found cached. Each row then runs only its uncached suffix, on a
       batch cache that holds each row's cached keys/values right-aligned (holes are masked;
       positions are explicit).
    2. **Decode on the device.** Uniforms come from :func:`counter_uniforms` (a hash of the row
       seed and the token index), the sampler runs on the device, and the host looks at the
       sampled ids only every ``sync_every`` tokens: then eos, stop strings and the length limit
       are applied per row, finished rows leave the batch (their tokens past the finish are
       discarded; the result does not depend on ``sync_every``). A stop string is searched for
       only in rows whose new tokens can end one (their text contains a stop's last character).
       With ``compile_decode`` the step is compiled and finished rows stay in the batch instead.
    """

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 16, device: Any = None,
                 progress: bool = False, share_prefixes: bool = True, sync_every: int = 8,
                 min_shared_prefix: int = 16, prefix_cache_bytes: int = 4 << 30, static_cache: bool | None = None,
                 merge_lora: bool = True, grouped_attention: bool = True, growing_cache: bool = True,
                 compile_decode: bool | None = None, compile_options: dict[str, Any] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.progress = progress
        self.share_prefixes = share_prefixes  # False: every prompt runs in full (the reference behaviour)
        self.sync_every = sync_every
        self.min_shared_prefix = min_shared_prefix  # shorter common prefixes are not worth a separate pass
        self.prefix_cache_bytes = prefix_cache_bytes
        self.merge_lora = merge_lora  # sample with the adapter folded into the weights (merged_adapter)
        # Masked attention without repeat_kv copies (models.grouped_attention): switches the model's
        # attention function, for updates too (same maths; unmasked batches take the stock path).
        self.grouped_attention = use_grouped_attention(model) if grouped_attention else False
        self.grow_in_place = growing_cache  # append keys in place, no per-token cache copy (models.growing_cache)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            model.to(self.device)
        # The static cache writes each step's keys in place: no copy of the growing cache per step, and
        # the shapes a compiled forward needs. On 2 CPU cores it measured slower (masked attention over
        # the full width: 20.3 s against 16.7 s for 8 rows x 96 tokens), so by default only on a GPU.
        # A compiled decode step (torch.compile; CUDA graphs under mode "reduce-overhead") wants the same
        # shapes step after step: the static cache (its width rounded up to a multiple of 128, so that
        # calls of similar lengths share a shape), and a batch that keeps its finished rows (their tokens
        # are discarded) instead of shrinking. By default on a GPU only: on 2 CPU cores it generated 1.34x
        # faster at batch 1 and 1.12x at batch 8, after 26-39 s of compilation per shape, and on the demo
        # the compilations cost more than they saved (docs/LOG.md).
        cuda = self.device.type == "cuda"
        self.static_cache = (cuda or bool(compile_decode)) if static_cache is None else static_cache
        self.compile_decode = (cuda and self.static_cache) if compile_decode is None else bool(compile_decode)
        if self.compile_decode and not self.static_cache:
            raise ValueError("compile_decode needs static_cache=True: a compiled step needs fixed shapes")
        self.compile_options = {"mode": "reduce-overhead"} if compile_options is None else dict(compile_options)
        self._compiled_model: Any = None
        self.eos_ids = eos_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids)
        self.decode = _decoder(tokenizer)
        self._scope: PrefixStore | None = None  # the open prefix scope, if any
        self._stop_tokens: dict[tuple[str, ...], frozenset[int]] = {}
        self.last_stats: dict[str, int] = {}  # prefix-cache counters of the last generate call

    # -- prefix scope

    @contextmanager
    def prefix_scope(self, keep_rows_for: Sequence[str | None] = ()) -> Iterator[PrefixStore]:
        """Keep computed prefixes across generate calls until the block ends (weights must not change).

        ``keep_rows_for``: adapters whose finished rows are kept, so that a next prompt extending
        one (the same trajectory's next turn) runs only its new tokens. Re-entrant: an inner scope
        joins the open one."""
        if self._scope is not None:
            added = set(keep_rows_for) - self._scope.keep_rows_for
            self._scope.keep_rows_for |= added
            try:
                yield self._scope
            finally:
                self._scope.keep_rows_for -= added
            return
        self._scope = PrefixStore(max_bytes=self.prefix_cache_bytes, keep_rows_for=keep_rows_for)
        try:
            yield self._scope
        finally:
            self._scope = None

    def stop_tokens(self, stops: Sequence[str]) -> frozenset[int]:
        """Ids whose text can complete one of ``stops``: it contains a stop's last character, or it
        is not whole text on its own (partial UTF-8, special tokens)."""
        key = tuple(stops)
        if key not in self._stop_tokens:
            last = {s[-1] for s in stops}
            texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))], skip_special_tokens=True,
                                                clean_up_tokenization_spaces=False)
            self._stop_tokens[key] = frozenset(i for i, t in enumerate(texts)
                                               if not t or "\ufffd" in t or any(c in t for c in last))
        return self._stop_tokens[key]

    # -- generation

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, adapter: str | None = None,
                 row_keys: list[object] | None = None) -> list[Generation]:
        _check_prompts(prompts)
        seeds = row_seeds(sampling.seed, row_keys, len(prompts))
        store = self._scope if self._scope is not None else PrefixStore(max_bytes=self.prefix_cache_bytes)
        before = store.stats()
        # Longest first: rows of similar length share a chunk, so less padding and fewer wasted steps.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        chunks = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.progress and len(chunks) > 1:
            chunks = tqdm(chunks, desc="generate", unit="batch")
        stop_tokens = self.stop_tokens(sampling.stop) if sampling.stop else frozenset()
        out: list[Generation | None] = [None] * len(prompts)
        scope = merged_adapter if self.merge_lora else adapter_context
        with scope(self.model, adapter), _eval_mode(self.model), torch.inference_mode():
            if self.share_prefixes:
                self._share_prefixes(prompts, adapter, store)
            for chunk in chunks:
                gens = self._generate_batch([list(prompts[i]) for i in chunk], sampling, [seeds[i] for i in chunk],
                                            adapter, store, stop_tokens)
                for i, g in zip(chunk, gens):
                    out[i] = g
        self.last_stats = {k: v - before.get(k, 0) if k in ("hits", "hit_tokens", "misses") else v
                           for k, v in store.stats().items()}
        return out  # type: ignore[return-value]

    def _share_prefixes(self, prompts: Sequence[Sequence[int]], adapter: str | None, store: PrefixStore) -> None:
        """Run every prefix that two or more prompts of the call share, once each (batch 1), and store it.

        The prompts form a tree: the prefix common to all of them (the instructions), then, inside
        each set of prompts that go on alike, the longer prefix they share (the G samples of one
        question at its first turn; ranker calls whose sub-queries came out the same, which list
        the same candidates). A node is computed on top of the longest prefix already cached, and
        only when it adds at least ``min_shared_prefix`` tokens (shorter ones cost a forward pass
        for little). Rows then start from the longest cached prefix each; prompts that share
        nothing beyond the instructions cost what they cost before."""
        stack = [list(prompts)]
        while stack:
            group = stack.pop()
            if len(group) < 2:
                continue
            n = runnable_prefix_length(group)
            self._run_prefix(tuple(group[0][:n]), adapter, store)
            branches: dict[int, list[Sequence[int]]] = {}
            for p in group:
                branches.setdefault(p[n], []).append(p)
            if len(branches) > 1:  # one branch: the shortest prompt ends at n + 1, nothing longer is common to all
                stack.extend(branches.values())

    def _run_prefix(self, ids: tuple[int, ...], adapter: str | None, store: PrefixStore) -> None:
        """Compute and store the keys/values of ``ids`` on top of its longest cached part, if worth it."""
        base = store.longest(adapter, list(ids) + [-1], consume=False)
        c = len(base.ids) if base is not None else 0
        if len(ids) - c < self.min_shared_prefix:
            return
        past = (DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in zip(base.keys, base.values)])
                if base is not None else None)
        out = self.model(input_ids=torch.tensor([ids[c:]], device=self.device), past_key_values=past,
                         position_ids=torch.arange(c, len(ids), device=self.device)[None], use_cache=True,
                         logits_to_keep=1)
        keys, values = _cache_tensors(out.past_key_values)
        store.add(adapter, KVPrefix(ids, [k[0] for k in keys], [v[0] for v in values], shared=True))

    def _batch_inputs(self, prompts: list[list[int]], adapter: str | None, store: PrefixStore,
                      max_new: int) -> tuple[Any, ...]:
        """Inputs of the first forward: each row's uncached suffix, right-aligned after a batch cache
        of its cached prefix (also right-aligned); returns (input_ids, attention, positions, cache).

        With the static cache, the cache and the attention mask are allocated once for the whole
        generation (``max_new`` slots after the prompts): a step writes its keys in place instead
        of copying the growing cache, and the mask never changes (slots not yet written are hidden
        by causality)."""
        found = [store.longest(adapter, p) if self.share_prefixes else None for p in prompts]
        cached = [len(f.ids) if f is not None else 0 for f in found]
        B, P = len(prompts), max(cached)
        S = max(len(p) - c for p, c in zip(prompts, cached))
        dev = self.device
        input_ids = torch.full((B, S), self.pad_id, dtype=torch.long)  # (B, S) suffixes, left-padded
        width = P + S + (max_new if self.static_cache else 0)
        if self.compile_decode:
            width = -(-width // STATIC_WIDTH_MULTIPLE) * STATIC_WIDTH_MULTIPLE  # fewer distinct shapes to compile
        attn = torch.zeros((B, width), dtype=torch.long)  # (B, width) 1 = a real token (cached, new, generated)
        attn[:, P + S:] = 1
        position_ids = torch.ones((B, S), dtype=torch.long)  # (B, S) pads: any position (masked)
        for i, (p, c) in enumerate(zip(prompts, cached)):
            s = len(p) - c
            input_ids[i, S - s:] = torch.tensor(p[c:], dtype=torch.long)
            attn[i, P - c:P] = 1
            attn[i, P + S - s:P + S] = 1
            position_ids[i, S - s:] = torch.arange(c, len(p))
        prefix_keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        if P > 0:
            template = next(f for f in found if f is not None)
            for layer in range(len(template.keys)):
                k0, v0 = template.keys[layer], template.values[layer]
                k = k0.new_zeros((B, k0.shape[0], P, k0.shape[2]))  # (B, heads, P, head_dim)
                v = v0.new_zeros((B, v0.shape[0], P, v0.shape[2]))
                for i, (f, c) in enumerate(zip(found, cached)):
                    if c:
                        k[i, :, P - c:] = f.keys[layer][:, :c]
                        v[i, :, P - c:] = f.values[layer][:, :c]
                prefix_keys.append((k, v))
        cache = self._static_cache(B, width, prefix_keys) if self.static_cache else None
        if cache is None and self.grow_in_place:
            cache = growing_cache(prefix_keys)
        elif cache is None and prefix_keys:
            cache = DynamicCache(ddp_cache_data=prefix_keys)
        return input_ids.to(dev), attn.to(dev), position_ids.to(dev), cache

    def _static_cache(self, batch: int, width: int, prefix_keys: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A preallocated cache of ``width`` slots per row, its first slots holding ``prefix_keys``;
        None for models with sliding-window layers (they keep the dynamic cache)."""
        config = self.model.config.get_text_config(decoder=True)
        cache = StaticCache(config=config, max_cache_len=width)
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            return None
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        empty = torch.empty((batch, heads, 0, head_dim), dtype=dtype, device=self.device)
        for i, layer in enumerate(cache.layers):
            layer.lazy_initialization(empty, empty)
            if prefix_keys:
                k, v = prefix_keys[i]
                layer.keys[:, :, :k.shape[2]] = k
                layer.values[:, :, :v.shape[2]] = v
                layer.cumulative_length.fill_(k.shape[2])
        return cache

    def _decode_step(self, **inputs: Any) -> Any:
        """One decode forward: with ``compile_decode`` through the compiled model (made once;
        torch.compile recompiles by itself for a new batch size or cache width), else the model.

        If compiling fails (no C compiler or Triton on the node, an operation the compiler does not
        support), the step runs eagerly, from then on, with a warning: compilation errors are raised
        before the compiled graph runs, so the cache has not been touched."""
        if not self.compile_decode:
            return self.model(**inputs)
        if self._compiled_model is None:
            self._compiled_model = torch.compile(self.model, **self.compile_options)
        try:
            return self._compiled_model(**inputs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            self.compile_decode = False
            cause = getattr(exc, "inner_exception", None) or exc.__cause__ or exc  # the compiler's own error
            why = (str(cause).strip().splitlines() or [""])[0]
            warnings.warn(f"compiling the decode step failed ({type(cause).__name__}: {why}); decoding eagerly "
                          "from here on (models.compile_decode: false skips the attempt)", RuntimeWarning, stacklevel=2)
            return self.model(**inputs)

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int],
                        adapter: str | None, store: PrefixStore, stop_tokens: frozenset[int]) -> list[Generation]:
        model, dev = self.model, self.device
        finisher = _Finisher(self.decode, self.eos_ids, sampling, stop_tokens=stop_tokens)
        input_ids, attn, position_ids, cache = self._batch_inputs(prompts, adapter, store, sampling.max_new_tokens)
        halves = seed_halves(seeds, dev)  # (B, 2) the rows' seeds, for the counter-based uniforms
        next_pos = torch.tensor([[len(p)] for p in prompts], device=dev)  # (B, 1) each row's next position
        keep_rows = store.keeps_rows(adapter)
        B = len(prompts)
        ids: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        results: list[Generation | None] = [None] * B
        slots = list(range(B))  # the original row in each batch slot
        running = [True] * B  # slots still generating (with compile_decode, finished ones stay in the batch)
        out = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()  # (b, V)
        done = 0  # tokens sampled per slot so far
        while True:
            n = min(self.sync_every, sampling.max_new_tokens - done)
            toks, tok_lps = [], []
            for j in range(n):  # no host sync inside this loop
                u = None if sampling.greedy else counter_uniforms(halves, done + j)  # (b,)
                tok, lp = _sample(logits, u, sampling)  # (b,), (b,)
                toks.append(tok)
                tok_lps.append(lp)
                if done + j + 1 < sampling.max_new_tokens:
                    if not isinstance(cache, StaticCache):
                        attn = torch.cat([attn, attn.new_ones((len(slots), 1))], dim=-1)  # (b, T + t)
                    out = self._decode_step(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                                            past_key_values=cache, use_cache=True)
                    next_pos = next_pos + 1
                    logits = out.logits[:, -1, :].float()
            done += n
            new_ids, new_lps = torch.stack(toks, 1).tolist(), torch.stack(tok_lps, 1).tolist()  # (b, n): one sync
            for j, r in enumerate(slots):
                if not running[j]:
                    continue
                reason = None
                for t, logp in zip(new_ids[j], new_lps[j]):
                    reason = finisher.push(ids[r], lps[r], t, logp)
                    if reason is not None:
                        break
                if reason is None:
                    continue
                running[j] = False
                results[r] = finisher.finish(ids[r], lps[r], reason)
                if keep_rows:
                    store.add(adapter, _row_prefix(cache, attn, j, prompts[r] + ids[r][:-1]))
            if not any(running):
                break
            if not all(running) and not self.compile_decode:  # drop finished rows: no compute spent on them
                keep = [j for j, run in enumerate(running) if run]
                slots, running = [slots[j] for j in keep], [True] * len(keep)
                sel = torch.tensor(keep, device=dev)
                _select_rows(cache, sel)
                attn, next_pos, logits, halves = attn[sel], next_pos[sel], logits[sel], halves[sel]
        return results  # type: ignore[return-value]


def _select_rows(cache: Any, sel: torch.Tensor) -> None:
    """Keep only rows ``sel`` of a dynamic or static cache."""
    if not isinstance(cache, StaticCache):
        cache.batch_select_indices(sel)
        return
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[sel], layer.values[sel]
        layer.batch_size = len(sel)


def _cache_tensors(cache: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer (B, heads, T, head_dim) keys and values of a transformers cache."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a transformers Cache with .layers")
    return [layer.keys for layer in layers], [layer.values for layer in layers]


def _row_prefix(cache: Any, attn: torch.Tensor, row: int, ids: list[int]) -> KVPrefix:
    """Row ``row``'s cached keys/values for ``ids`` (its real columns in order, holes and pads skipped)."""
    cols = attn[row].nonzero()[:, 0][:len(ids)]  # (len(ids),) the attention mask spans the cache's columns
    keys, values = _cache_tensors(cache)
    return KVPrefix(tuple(ids), [k[row][:, cols] for k in keys], [v[row][:, cols] for v in values], shared=False)


def reference_logprobs(model: Any, input_ids: list[list[int]], start: list[int], *, temperature: float = 1.0,
                      batch_size: int = 8) -> list[list[float]]:
    """Teacher-forced log-probs of ``input_ids[i][start[i]:]`` under ``log_softmax(logits / temperature)``.

    One forward per chunk over right-padded sequences (no cache); the reference that generation
    logprobs are tested against. ``start[i] >= 1`` (the first token has no prediction).
    """

    if len(input_ids) != len(start):
        raise ValueError(f"{len(input_ids)} sequences but {len(start)} start positions")
    for i, (seq, s) in enumerate(zip(input_ids, start)):
        if not 1 <= s <= len(seq):
            raise ValueError(f"start[{i}]={s} must be in [1, {len(seq)}] for a sequence of {len(seq)} tokens")
    dev = next(model.parameters()).device
    result: list[list[float]] = []
    with torch.inference_mode():
        for c in range(0, len(input_ids), batch_size):
            seqs, starts = input_ids[c:c + batch_size], start[c:c + batch_size]
            T = max(len(s) for s in seqs)
            ids = torch.zeros((len(seqs), T), dtype=torch.long)  # (B, T) right-padded
            attn = torch.zeros((len(seqs), T), dtype=torch.long)  # (B, T)
            for i, s in enumerate(seqs):
                ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
                attn[i, :len(s)] = 1
            ids, attn = ids.to(dev), attn.to(dev)
            logits = model(input_ids=ids, attention_mask=attn).logits.float()  # (B, T, V)
            if temperature > 0:
                logits = logits / temperature
            logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V) predicts tokens 1..T-1
            tok_lp = logp.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1)
            for i, (s, st) in enumerate(zip(seqs, starts)):
                result.append(tok_lp[i, st - 1:len(s) - 1].tolist())
    return result


# ------------------------------------------------------------------------------ vLLM / Unsloth


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"VLLMBackend needs vLLM, which is not installed; {_GPU_HINT}") from err
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
        kwargs = dict(model=_model_path(model_name), enable_lora=enable_lora,
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
            raise ImportError(f"the 'unsloth' backend needs Unsloth, which is not installed; {_GPU_HINT}") from err
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name=_model_path(model_name), max_seq_length=max_seq_length, load_in_4bit=load_in_4bit,
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
        _check_prompts(prompts)
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


def _model_path(model_name: str) -> str:
    """A folder vLLM/Unsloth can load: bundled GGUF names convert once; hub ids pass through."""

    try:
        resolved = resolve_model(model_name, allow_download=False)
    except ModelNotFoundError:
        return model_name  # a hub id vLLM may download itself
    return str(convert_bundled_gguf(model_name) if resolved.gguf_file else resolved.path)


def make_backend(kind: str, model_name: str, **kw: Any) -> GenerationBackend:
    """Build a backend by kind: "transformers" (kw: dtype, device, batch_size, progress), "vllm"
    (kw: see :meth:`VLLMBackend.from_model`) or "unsloth" (kw: see
    :meth:`VLLMBackend.from_unsloth_pretrained`)."""
    if kind == "transformers":

        model, tokenizer = load_causal_lm(model_name, dtype=kw.pop("dtype", None), device=kw.pop("device", None))
        return TransformersBackend(model, tokenizer, **kw)
    if kind == "vllm":
        return VLLMBackend.from_model(model_name, **kw)
    if kind == "unsloth":
        return VLLMBackend.from_unsloth_pretrained(model_name, **kw)
    raise ValueError(f"unknown backend kind {kind!r}; expected one of {BACKEND_KINDS}")
