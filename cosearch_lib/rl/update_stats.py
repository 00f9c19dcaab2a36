"""The statistics of one GRPO update, per role: what ``rl.policy_update.grpo_update`` reports.

A :class:`RoleTally` adds up one role's micro-batches (and, data parallel, every rank's tally of
that role, :meth:`RoleTally.merged`) into the ``<role>_*`` step-record columns
(``run_schema.STEP_GLOSSARY``): token-weighted means of the loss statistics, the largest importance
ratio, the mean advantage over the forwarded sequences, counts, and the rollout engine's log-prob
drift from the trainer. None of them depends on how the sequences fell into micro-batches or ranks,
except ``<role>_pad_frac`` (a speed figure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

#: Loss stats that are not token means: the largest value, and a mean over sequences.
_MAX_STATS, _PER_SEQUENCE_STATS = ("ratio_max",), ("adv_mean",)


@dataclass
class RoleTally:
    """What one role's micro-batches add up to over an update: token-weighted sums of the loss
    stats (the largest value of ``ratio_max``, sequence-weighted sums of ``adv_mean``), and the
    counts the ``<role>_*`` columns report. None depends on how the sequences fell into
    micro-batches or ranks."""

    weighted: dict[str, float] = field(default_factory=dict)  # stat -> sum over micro-batches of value * tokens (or * sequences)
    maxima: dict[str, float] = field(default_factory=dict)  # stat -> largest value over micro-batches
    tokens: float = 0.0  # scored tokens forwarded
    forwarded: int = 0  # sequences forwarded
    positions: int = 0  # token positions forwarded, padding included
    padding: int = 0  # of which padding
    deltas: list[torch.Tensor] = field(default_factory=list)  # |trainer logp - rollout logp| per scored token of the first minibatch
    first_tokens: int = 0  # scored tokens of the first minibatch (before any optimizer step)
    outside: int = 0  # of which the ratio the loss sees lies outside [1 - eps, 1 + eps_high]
    tis_weight: float = 0.0  # sum of the truncated importance weights over the scored tokens
    tis_tokens: int = 0

    def add(self, stats: dict[str, float], n_sequences: int, positions: int, padding: int) -> None:
        tokens = stats.pop("n_tokens")
        self.tokens += tokens
        self.forwarded += n_sequences
        self.positions += positions
        self.padding += padding
        for stat, value in stats.items():
            if math.isnan(value):
                continue
            if stat in _MAX_STATS:
                self.maxima[stat] = max(self.maxima.get(stat, -math.inf), value)
            else:
                weight = n_sequences if stat in _PER_SEQUENCE_STATS else tokens
                self.weighted[stat] = self.weighted.get(stat, 0.0) + value * weight

    def columns(self, role: str) -> dict[str, float]:
        """``<role>_<stat>``: token-weighted means (``adv_mean``: over sequences; ``ratio_max``: the
        largest), then the counts."""
        out = {}
        if self.tokens:
            out = {f"{role}_{stat}": total / (self.forwarded if stat in _PER_SEQUENCE_STATS else self.tokens)
                   for stat, total in self.weighted.items()}
            out.update({f"{role}_{stat}": value for stat, value in self.maxima.items()})
        out.update({f"{role}_n_forwarded": self.forwarded, f"{role}_n_tokens": self.tokens})
        if self.positions:
            out[f"{role}_pad_frac"] = self.padding / self.positions
        if self.deltas:
            deltas = torch.cat(self.deltas).double()
            out[f"{role}_logp_drift_mean"] = float(deltas.mean())
            out[f"{role}_logp_drift_p99"] = float(torch.quantile(deltas, 0.99))
        if self.first_tokens:
            out[f"{role}_ratio_outside_clip"] = self.outside / self.first_tokens
        if self.tis_tokens:
            out[f"{role}_tis_weight_mean"] = self.tis_weight / self.tis_tokens
        return out

    @classmethod
    def merged(cls, tallies: Sequence[RoleTally]) -> RoleTally:
        """Every rank's tally of one role as one (data parallel): sums of the sums, all the deltas."""
        out = cls()
        for t in tallies:
            for stat, total in t.weighted.items():
                out.weighted[stat] = out.weighted.get(stat, 0.0) + total
            for stat, value in t.maxima.items():
                out.maxima[stat] = max(out.maxima.get(stat, -math.inf), value)
            out.tokens += t.tokens
            out.forwarded += t.forwarded
            out.positions += t.positions
            out.padding += t.padding
            out.deltas.extend(t.deltas)
            out.first_tokens += t.first_tokens
            out.outside += t.outside
            out.tis_weight += t.tis_weight
            out.tis_tokens += t.tis_tokens
        return out
