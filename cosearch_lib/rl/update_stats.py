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
from typing import Any

import torch

from cosearch_lib.rl.grpo_loss import LossStats

#: Loss stats that are not token means: the largest value, and a mean over sequences.
_MAX_STATS, _PER_SEQUENCE_STATS = ("ratio_max",), ("adv_mean",)
_STATS = tuple(n for n in LossStats.NAMES if n != "n_tokens")  # what a tally averages (n_tokens weighs them)
_STAT_INDEX = tuple(LossStats.NAMES.index(n) for n in _STATS)
_N_TOKENS = LossStats.NAMES.index("n_tokens")


@dataclass
class RoleTally:
    """What one role's micro-batches add up to over an update: token-weighted sums of the loss
    stats (the largest value of ``ratio_max``, sequence-weighted sums of ``adv_mean``), and the
    counts the ``<role>_*`` columns report. None depends on how the sequences fell into
    micro-batches or ranks. The sums stay tensors on the update's device until :meth:`columns`
    reads them back, all in one transfer: an update does not wait on the device per micro-batch."""

    sums: torch.Tensor | None = None  # (len(_STATS),) per stat: sum over micro-batches of value * tokens (or * sequences), NaN left out
    maxima: torch.Tensor | None = None  # (len(_STATS),) per stat: the largest value (what a _MAX_STATS column reports)
    seen: torch.Tensor | None = None  # (len(_STATS),) per stat: micro-batches that measured it (not NaN)
    tokens: Any = 0.0  # scored tokens forwarded (a 0-d tensor once a micro-batch is added)
    forwarded: int = 0  # sequences forwarded
    positions: int = 0  # token positions forwarded, padding included
    padding: int = 0  # of which padding
    deltas: list[torch.Tensor] = field(default_factory=list)  # |trainer logp - rollout logp| per scored token of the first minibatch
    first_tokens: Any = 0  # scored tokens of the first minibatch (before any optimizer step)
    outside: Any = 0  # of which the ratio the loss sees lies outside [1 - eps, 1 + eps_high]
    tis_weight: Any = 0.0  # sum of the truncated importance weights over the scored tokens
    tis_tokens: Any = 0

    def add(self, stats: LossStats, n_sequences: int, positions: int, padding: int) -> None:
        """One micro-batch's :class:`LossStats` (left on the device) and its counts."""
        tokens = stats.tensor[_N_TOKENS]
        values = stats.tensor[list(_STAT_INDEX)]
        weight = torch.stack([tokens.new_tensor(float(n_sequences)) if n in _PER_SEQUENCE_STATS else tokens
                              for n in _STATS])
        measured = ~torch.isnan(values)
        if self.sums is None:
            self.sums, self.seen = torch.zeros_like(values), torch.zeros_like(values)
            self.maxima = torch.full_like(values, -math.inf)
        self.sums = self.sums + torch.where(measured, values * weight, torch.zeros_like(values))
        self.maxima = torch.where(measured, torch.maximum(self.maxima, values), self.maxima)
        self.seen = self.seen + measured.double()
        self.tokens = self.tokens + tokens
        self.forwarded += n_sequences
        self.positions += positions
        self.padding += padding

    def _read_back(self) -> dict[str, Any]:
        """Every tensor of the tally as host numbers, in one device-to-host transfer (the deltas'
        mean and 99th percentile computed where they are)."""
        n = len(_STATS)
        device = self.sums.device if self.sums is not None else torch.device("cpu")
        deltas = torch.cat([d.to(device) for d in self.deltas]).double() if self.deltas else None
        scalars = [self.tokens, self.first_tokens, self.outside, self.tis_weight, self.tis_tokens,
                   deltas.mean() if deltas is not None else math.nan,
                   torch.quantile(deltas, 0.99) if deltas is not None else math.nan]
        empty = self.sums is None  # no micro-batch added
        flat = torch.cat([torch.zeros(n, dtype=torch.float64, device=device) if empty else self.sums,
                          torch.full((n,), -math.inf, dtype=torch.float64, device=device) if empty else self.maxima,
                          torch.zeros(n, dtype=torch.float64, device=device) if empty else self.seen,
                          torch.stack([torch.as_tensor(x, dtype=torch.float64, device=device) for x in scalars])]).tolist()
        names = ("tokens", "first_tokens", "outside", "tis_weight", "tis_tokens", "drift_mean", "drift_p99")
        return {"sums": flat[:n], "maxima": flat[n:2 * n], "seen": flat[2 * n:3 * n], **dict(zip(names, flat[3 * n:]))}

    def columns(self, role: str) -> dict[str, float]:
        """``<role>_<stat>``: token-weighted means (``adv_mean``: over sequences; ``ratio_max``: the
        largest), then the counts. The one read of the tally's tensors back to the host."""
        host = self._read_back()
        tokens = host["tokens"]
        out = {}
        if tokens:
            for i, stat in enumerate(_STATS):
                if host["seen"][i] > 0:
                    out[f"{role}_{stat}"] = host["maxima"][i] if stat in _MAX_STATS else \
                        host["sums"][i] / (self.forwarded if stat in _PER_SEQUENCE_STATS else tokens)
        out.update({f"{role}_n_forwarded": self.forwarded, f"{role}_n_tokens": tokens})
        if self.positions:
            out[f"{role}_pad_frac"] = self.padding / self.positions
        if self.deltas:
            out[f"{role}_logp_drift_mean"] = host["drift_mean"]
            out[f"{role}_logp_drift_p99"] = host["drift_p99"]
        if host["first_tokens"]:
            out[f"{role}_ratio_outside_clip"] = host["outside"] / host["first_tokens"]
        if host["tis_tokens"]:
            out[f"{role}_tis_weight_mean"] = host["tis_weight"] / host["tis_tokens"]
        return out

    def on_host(self) -> RoleTally:
        """This tally on the CPU (its sums read back in one transfer, its deltas moved in one), to be
        gathered from the ranks of a data-parallel job."""
        host = self._read_back()
        return RoleTally(sums=torch.tensor(host["sums"], dtype=torch.float64),
                         maxima=torch.tensor(host["maxima"], dtype=torch.float64),
                         seen=torch.tensor(host["seen"], dtype=torch.float64), tokens=host["tokens"],
                         forwarded=self.forwarded, positions=self.positions, padding=self.padding,
                         deltas=[torch.cat(self.deltas).cpu()] if self.deltas else [],
                         first_tokens=host["first_tokens"], outside=host["outside"], tis_weight=host["tis_weight"],
                         tis_tokens=host["tis_tokens"])

    @classmethod
    def merged(cls, tallies: Sequence[RoleTally]) -> RoleTally:
        """Every rank's tally of one role (each :meth:`on_host`) as one: sums of the sums, the
        largest of the maxima, all the deltas."""
        out = cls()
        for t in tallies:
            if t.sums is not None:
                if out.sums is None:
                    out.sums, out.maxima, out.seen = t.sums.clone(), t.maxima.clone(), t.seen.clone()
                else:
                    out.sums, out.maxima, out.seen = out.sums + t.sums, torch.maximum(out.maxima, t.maxima), out.seen + t.seen
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
