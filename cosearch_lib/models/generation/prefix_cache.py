"""Key/value caches of token prefixes, so no prompt prefix is computed twice.

Why: in a rollout every agent prompt starts with the same ~450-token instructions, and every turn
of a trajectory re-sends the whole conversation so far. Recomputing those tokens dominated the
cost of a rollout on a CPU. A :class:`PrefixStore` keeps, per LoRA adapter, the attention keys
and values of token prefixes already run through the model:

* a **shared** prefix (the longest prefix common to the prompts of one generation call, computed
  once with batch size 1) serves every row of the call and, inside a scope, later calls too;
* a **row** prefix (a finished row's prompt plus its generated tokens) serves the next turn of the
  same trajectory, whose prompt extends it by the observation; it is used once, then dropped.

Caches are only valid for the weights that made them. A store therefore lives either for one
generation call or for a scope the caller opens around work with fixed weights (one rollout:
:meth:`cosearch_lib.models.generation.transformers_backend.TransformersBackend.prefix_scope`),
never across an update.
Memory is bounded: the least recently used prefixes go first once ``max_bytes`` is exceeded (a
row whose prefix was evicted is simply computed in full).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class KVPrefix:
    """The keys and values of one token prefix: per layer (heads, length, head_dim), batch dim dropped."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    shared: bool  # True: serves many rows (kept); False: one trajectory's turns (dropped after use)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in zip(self.keys, self.values))


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by every prompt."""
    if not prompts:
        return 0
    first, n = prompts[0], min(len(p) for p in prompts)
    for p in prompts[1:]:
        i = 0
        while i < n and p[i] == first[i]:
            i += 1
        n = i
    return n


def runnable_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the prefix every prompt shares that still leaves each prompt a token to run."""
    if not prompts:
        return 0
    return min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)


class PrefixStore:
    """Cached prefixes by adapter; :meth:`longest` finds the longest one a prompt extends."""

    def __init__(self, *, max_bytes: int = 4 << 30, keep_rows_for: Sequence[str | None] = ()) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.keep_rows_for = set(keep_rows_for)  # adapters whose finished rows are kept for a next turn
        self._entries: OrderedDict[tuple[str | None, tuple[int, ...]], KVPrefix] = OrderedDict()  # LRU order
        self._lengths: dict[str | None, set[int]] = {}
        self.nbytes = 0
        self.hits = self.hit_tokens = self.misses = 0  # lookups that found a prefix / its tokens / found none

    def __len__(self) -> int:
        return len(self._entries)

    def keeps_rows(self, adapter: str | None) -> bool:
        return adapter in self.keep_rows_for

    def add(self, adapter: str | None, prefix: KVPrefix) -> None:
        key = (adapter, prefix.ids)
        if key in self._entries:
            self._drop(key)
        self._entries[key] = prefix
        self._lengths.setdefault(adapter, set()).add(len(prefix.ids))
        self.nbytes += prefix.nbytes
        while self.nbytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def longest(self, adapter: str | None, prompt: Sequence[int], *, consume: bool = True) -> KVPrefix | None:
        """The longest cached prefix of ``prompt`` that leaves at least one token to run (or None).

        With ``consume``, a row prefix found here is removed from the store (its trajectory's next
        turn will store a longer one), a shared prefix moves to the recent end of the LRU order,
        and the lookup is counted; without, the store is left as it was."""
        best = None
        for n in sorted(self._lengths.get(adapter, ()), reverse=True):
            if n >= len(prompt):
                continue
            entry = self._entries.get((adapter, tuple(prompt[:n])))
            if entry is not None:
                best = entry
                break
        if best is None:
            self.misses += int(consume)
            return None
        if not consume:
            return best
        self.hits += 1
        self.hit_tokens += len(best.ids)
        key = (adapter, best.ids)
        if best.shared:
            self._entries.move_to_end(key)
        else:
            self._drop(key)
        return best

    def _drop(self, key: tuple[str | None, tuple[int, ...]]) -> None:
        entry = self._entries.pop(key)
        self.nbytes -= entry.nbytes
        adapter, ids = key
        if not any(a == adapter and len(i) == len(ids) for a, i in self._entries):
            self._lengths[adapter].discard(len(ids))

    def stats(self) -> dict[str, int]:
        return {"prefixes": len(self), "bytes": self.nbytes, "hits": self.hits, "hit_tokens": self.hit_tokens,
                "misses": self.misses}
