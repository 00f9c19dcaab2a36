"""A key/value cache that grows into spare capacity instead of being copied at every token.

transformers' ``DynamicLayer`` appends a decoded token with ``torch.cat([keys, new])``: a copy of the
whole cache per layer per token, O(T^2) bytes over a generation. :class:`GrowingLayer` keeps keys
and values in buffers with spare room (capacity doubled, in chunks of :data:`CHUNK` slots, when
full) and writes each new token in place; ``keys`` and ``values`` are views of the filled part,
so everything that reads a layer (attention, row selection, the prefix store) sees what a
``DynamicLayer`` would hold, value for value (tested).

It pays off together with :mod:`grouped_attention`: with the stock ``sdpa`` path the views are
copied by ``repeat_kv`` anyway (measured on 2 CPU cores, SmolLM2 shape, 8 rows of ~700 tokens:
282 ms per decode step with the dynamic cache, 289 growing; 213 with grouped attention, 169 with
both; docs/LOG.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

#: Capacity is a multiple of this many positions.
CHUNK = 256


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by (B, heads, capacity, head_dim) buffers filled up to ``length``."""

    def __init__(self) -> None:
        super().__init__()
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0

    @property
    def capacity(self) -> int:
        return 0 if self._k is None else self._k.shape[-2]

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, need: int) -> None:
        if need <= self.capacity:
            return
        size = -(-max(need, 2 * self.capacity) // CHUNK) * CHUNK
        k = keys.new_empty((*keys.shape[:-2], size, keys.shape[-1]))
        v = values.new_empty((*values.shape[:-2], size, values.shape[-1]))
        if self.length:
            k[..., :self.length, :] = self._k[..., :self.length, :]
            v[..., :self.length, :] = self._v[..., :self.length, :]
        self._k, self._v = k, v

    def _views(self) -> None:
        self.keys = self._k[..., :self.length, :]
        self.values = self._v[..., :self.length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, heads, t, head_dim) keys and values; return all of them (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        need = self.length + key_states.shape[-2]
        self._reserve(key_states, value_states, need)
        self._k[..., self.length:need, :] = key_states
        self._v[..., self.length:need, :] = value_states
        self.length = need
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (finished rows leave the batch)."""
        if self._k is not None:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``|tokens_to_remove|`` positions (negative, as transformers >= 5.18 passes it)."""
        if tokens_to_remove > 0:  # the legacy form: the length to keep
            tokens_to_remove = self.length - tokens_to_remove if tokens_to_remove < self.length else 0
        self.length = max(0, self.length - abs(tokens_to_remove))
        if self._k is not None:
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._k is not None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self._k is not None:
            self._k = self._k.index_select(0, beam_idx.to(self._k.device))
            self._v = self._v.index_select(0, beam_idx.to(self._v.device))
            self._views()


def growing_cache(prefix: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> DynamicCache:
    """A ``DynamicCache`` of :class:`GrowingLayer` (one per model layer, made at its first update),
    optionally holding per-layer (B, heads, P, head_dim) ``prefix`` keys and values already."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    for k, v in prefix:
        layer = GrowingLayer()
        layer.update(k, v)
        cache.layers.append(layer)
    return cache
