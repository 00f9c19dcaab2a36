"""Generation with a transformers causal LM (CPU or GPU): our own batched decode loop.

:class:`TransformersBackend` takes any ``AutoModelForCausalLM`` or peft model. The loop computes
cached prompt prefixes once, prefills each row's new tokens with explicit position ids, then
decodes one token per step on the KV cache. Departures from ``model.generate``: per-row
counter-based uniforms (a hash of row seed and token index, inverse-CDF sampling), per-row stop
strings checked on the decoded tail, logprobs of the sampled ids under ``logits / temperature``
*before* top-p/top-k truncation, finished rows dropped from the batch, prompts sorted by length
before chunking (less padding), prompt prefixes computed once. The speed-only pieces it uses live
beside it: :mod:`~cosearch_lib.models.generation.prefix_cache`,
:mod:`~cosearch_lib.models.generation.counter_rng`,
:mod:`~cosearch_lib.models.generation.grouped_attention` and
:mod:`~cosearch_lib.models.generation.growing_cache`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.adapters import adapter_context, bf16_decoding_copy, eval_mode, merged_adapter
from cosearch_lib.models.generation.contract import Generation, check_prompts, row_seeds
from cosearch_lib.models.generation.counter_rng import counter_uniforms, seed_halves
from cosearch_lib.models.generation.grouped_attention import use_grouped_attention
from cosearch_lib.models.generation.growing_cache import growing_cache
from cosearch_lib.models.generation.prefix_cache import KVPrefix, PrefixStore, runnable_prefix_length
from cosearch_lib.models.generation.sampling import Finisher, eos_token_ids, sample_tokens, text_decoder
from cosearch_lib.progress import tqdm

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
        # Masked attention without repeat_kv copies (models.generation.grouped_attention): switches the model's
        # attention function, for updates too (same maths; unmasked batches take the stock path).
        self.grouped_attention = use_grouped_attention(model) if grouped_attention else False
        self.grow_in_place = growing_cache  # append keys in place, no per-token cache copy (models.generation.growing_cache)
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
        self.decode = text_decoder(tokenizer)
        self._scope: PrefixStore | None = None  # the open prefix scope, if any
        self._bf16: dict[str | None, Any] | None = None  # inside bf16_scope: each adapter's bf16 copy, made at its first call
        self._net: Any = None  # the module a generate call runs: self.model, or the adapter's bf16 copy
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

    @contextmanager
    def bf16_scope(self) -> Iterator[None]:
        """Decode in bfloat16 until the block ends: each adapter's first call makes a bf16 copy of the model with
        that adapter merged (:func:`~cosearch_lib.models.generation.adapters.bf16_decoding_copy`), later calls
        reuse it, and the copies are dropped at the end. For evaluations (``evaluation.bf16_weights``) and a GRPO
        step's rollout (``training.autocast.bf16_weights``): the weights must not change inside the block, as
        inside :meth:`prefix_scope`. Opened outside any prefix
        scope, so that no float32 keys and values meet bf16 ones; re-entrant."""
        if self._bf16 is not None:
            yield
            return
        if self._scope is not None:
            raise RuntimeError("bf16_scope must be opened outside prefix_scope: its cached prefixes are float32")
        self._bf16 = {}
        try:
            yield
        finally:
            self._bf16 = None

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
        check_prompts(prompts)
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
        if self._bf16 is not None:  # inside bf16_scope: the adapter's bf16 copy, merged already
            if adapter not in self._bf16:
                self._bf16[adapter] = bf16_decoding_copy(self.model, adapter)
            self._net, scope = self._bf16[adapter], nullcontext()
        else:
            self._net = self.model
            scope = (merged_adapter if self.merge_lora else adapter_context)(self.model, adapter)
        try:
            with scope, eval_mode(self._net), torch.inference_mode(), self._dynamic_under_autocast():
                if self.share_prefixes:
                    self._share_prefixes(prompts, adapter, store)
                for chunk in chunks:
                    gens = self._generate_batch([list(prompts[i]) for i in chunk], sampling, [seeds[i] for i in chunk],
                                                adapter, store, stop_tokens)
                    for i, g in zip(chunk, gens):
                        out[i] = g
        finally:
            self._net = None
        self.last_stats = {k: v - before.get(k, 0) if k in ("hits", "hit_tokens", "misses") else v
                           for k, v in store.stats().items()}
        return out  # type: ignore[return-value]

    @contextmanager
    def _dynamic_under_autocast(self) -> Iterator[None]:
        """Under autocast (``models.autocast.cpu_bf16``) the call decodes on the dynamic cache, uncompiled:
        transformers' static cache holds keys and values in one dtype, and under autocast the rotary
        embedding leaves the keys in float32 while the values come out of their projection in bf16."""
        if not (self.static_cache and torch.is_autocast_enabled(self.device.type)):
            yield
            return
        kept = self.static_cache, self.compile_decode
        self.static_cache = self.compile_decode = False
        try:
            yield
        finally:
            self.static_cache, self.compile_decode = kept

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
        out = self._net(input_ids=torch.tensor([ids[c:]], device=self.device), past_key_values=past,
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
        config = self._net.config.get_text_config(decoder=True)
        cache = StaticCache(config=config, max_cache_len=width)
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            return None
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self._net.parameters()).dtype
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
        if not self.compile_decode or self._net is not self.model:  # a bf16 copy decodes eagerly
            return self._net(**inputs)
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
        model, dev = self._net, self.device
        finisher = Finisher(self.decode, self.eos_ids, sampling, stop_tokens=stop_tokens)
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
                tok, lp = sample_tokens(logits, u, sampling)  # (b,), (b,)
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
