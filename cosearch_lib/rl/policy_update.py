"""One GRPO update of one LoRA adapter: sequences -> token log-probs -> clipped surrogate + KL -> step.

``grpo_update`` takes the sequences a role contributes (``UpdateJob``: ids, loss masks, old
log-probs, advantages) and runs each micro-batch in three named pieces: the forward pass under the
adapter (``rl.policy_sequences.policy_token_logprobs``, which runs the LM head only at scored
positions), the ratio with its corrections (which old log-probs it divides by, truncated
importance weights, the drift and clip tallies), and the backward pass of
``rl.grpo_loss.policy_loss`` (with the reference log-probs when the KL weight is non-zero: the base
model with the adapters disabled, or the adapter's frozen start copy with ``kl_reference: start``),
weighted so that micro-batching does not change the gradient.

Three options make an update leaner without changing its gradient: micro-batches built from
sequences of similar length (:func:`micro_batches`: less padding forwarded), the prompt prefix a
role's sequences share run once per optimizer step for all its micro-batches (``shared_prefix``,
``rl.policy_sequences.SharedPrefix``: every agent sequence starts with the same instructions), and gradient
checkpointing for the update only
(:func:`update_checkpointing`: activations recomputed in the backward pass instead of kept, which
3B-7B models need on one GPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from cosearch_lib.config import GRPOConfig, UpdateSettings
from cosearch_lib.models.generation.adapters import adapter_context
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.grpo_loss import LossStats, policy_loss
from cosearch_lib.rl.policy_sequences import (
    PolicySequence,
    SharedPrefix,
    padded_batch,
    policy_token_logprobs,
    shared_prefix_length,
)
from cosearch_lib.rl.update_stats import RoleTally

# --------------------------------------------------------------------------- updates


@dataclass
class UpdateJob:
    """What one role contributes to an adapter's update."""

    role: str  # "agent" | "ranker": prefixes the stats
    seqs: Sequence[PolicySequence]
    advantages: Sequence[float]  # one per sequence
    temperature: float  # the temperature the sequences were sampled at (log-probs are recomputed at it)
    prompt_groups: Sequence[int] | None = None  # sequences with one label share their prompt (G samples of it): micro-batches stay inside a group and run its prompt once
    positions: Sequence[int] | None = None  # each sequence's position in the step's whole batch (data parallel: a rank holds some of them); None: 0, 1, ...
    trained: Sequence[bool] | None = None  # False: not trained on (a ranker call no surviving group holds): never forwarded, not even for a KL term (its tokens still count in the denominator); None: every sequence

    def position(self, i: int) -> int:
        return i if self.positions is None else self.positions[i]


def grouped_micro_batches(indices: Sequence[int], groups: Sequence[int], size: int) -> list[list[int]]:
    """``indices`` cut into micro-batches of at most ``size`` that never mix groups (``groups[i]``:
    the label of sequence i), groups in order of first appearance: each micro-batch then shares its
    group's whole prompt, which :func:`grpo_update` runs once per micro-batch."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    members: dict[int, list[int]] = {}
    for i in indices:
        members.setdefault(groups[i], []).append(i)
    return [rows[start:start + size] for rows in members.values() for start in range(0, len(rows), size)]


def micro_batches(indices: Sequence[int], lengths: Mapping[int, int], size: int, *, by_length: bool) -> list[list[int]]:
    """``indices`` cut into micro-batches of ``size``; ``lengths[i]`` is sequence i's token count.

    With ``by_length`` the indices are first ordered longest first (ties keep their given order), so
    each micro-batch holds sequences of similar length and pads little; the first micro-batch is the
    largest, so one that does not fit in memory fails at once. Without it they are cut in the given
    order. The GRPO gradient does not depend on the grouping (each micro-batch's loss is weighted by
    its share of the batch's aggregate)."""
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    order = sorted(indices, key=lambda i: -lengths[i]) if by_length and size > 1 else list(indices)
    return [order[start:start + size] for start in range(0, len(order), size)]


@contextmanager
def update_checkpointing(model: Any, enabled: bool) -> Iterator[None]:
    """Gradient checkpointing on ``model`` (a peft wrapper or a transformers model) inside the block,
    the model's previous state after it. A no-op when ``enabled`` is False or the model already
    checkpoints (e.g. Unsloth's own checkpointing): that state is left as it was.

    Non-reentrant checkpointing (``use_reentrant=False``): LoRA weights inside a checkpointed layer
    get their gradient even though the frozen embeddings' output does not require grad.
    transformers checkpoints a decoder layer only while that layer is in training mode, and the
    policy model stays in eval mode (dropout would make the GRPO ratio noisy), so only the decoder
    layers themselves (not their submodules: attention dropout keeps reading eval mode) are flagged
    as training inside the block. transformers also hooks the input embeddings to require grad when
    checkpointing is enabled; that hook is removed again unless it was there before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not enabled or base.is_gradient_checkpointing:
        yield
        return
    had_input_hooks = bool(getattr(base, "_require_grads_hooks", None))
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    modes = [m.training for m in layers]
    for layer in layers:
        layer.training = True  # this module only: its submodules keep their mode
    try:
        yield
    finally:
        for layer, mode in zip(layers, modes):
            layer.training = mode
        base.gradient_checkpointing_disable()
        if not had_input_hooks:
            base.disable_input_require_grads()


@dataclass
class _JobSlice:
    """One job's sequences in one minibatch: those with a gradient (``active``), and what the
    minibatch's aggregate divides by (all its sequences count, forwarded or not).

    Without a KL term a sequence whose advantage is 0 has no gradient and is not forwarded; with one
    (``kl``) its KL term has a gradient, so every sequence of the batch with a scored token is
    forwarded, as a loss over the whole batch (verl's, the release's) computes it. A sequence not
    trained on (``UpdateJob.trained``: a ranker call the semantic grouping dropped) is never forwarded."""

    active: list[int]  # indices into job.seqs: some scored token, and a non-zero advantage or a KL term
    lengths: dict[int, int]  # token count of each active sequence
    count: float  # tokens (token-mean) or sequences of this rank's part of the slice
    denominator: float = 1.0  # the same over every rank (:meth:`over_ranks`)

    @classmethod
    def of(cls, job: UpdateJob, part: int, minibatches: int, aggregation: str, *, kl: bool) -> _JobSlice:
        """The slice ``part`` of ``job`` on this rank (round-robin over the step's positions, so a
        rank's slice holds its share of the single-process slice). No collective: its denominator is
        this rank's count until :meth:`over_ranks`."""
        idx = [i for i in range(len(job.seqs)) if job.position(i) % minibatches == part]
        trained = job.trained or [True] * len(job.seqs)
        active = [i for i in idx if (job.advantages[i] != 0.0 or (kl and trained[i])) and any(job.seqs[i].mask)]
        count = _count([job.seqs[i] for i in idx], aggregation)
        return cls(active, {i: len(job.seqs[i].ids) for i in active}, count, count or 1.0)

    def over_ranks(self, dp: DataParallel) -> _JobSlice:
        """This slice with the denominator of the whole step's slice: the counts summed over ranks.
        A collective: every rank calls it, for the same slices in the same order."""
        return replace(self, denominator=dp.sum(self.count) or 1.0)


@dataclass
class _Prefixes:
    """The shared prompt prefix of a job slice, under the adapter and (for the KL term) the reference."""

    policy: SharedPrefix | None = None
    reference: SharedPrefix | None = None

    @classmethod
    def run(cls, model: Any, adapter: str, seqs: Sequence[PolicySequence], *, with_reference: bool,
            device: Any, reference: str | None = None) -> _Prefixes:
        """``reference``: the KL term's adapter (None: the base model)."""
        n_shared = shared_prefix_length(seqs)
        if not n_shared:
            return cls()
        ids = seqs[0].ids[:n_shared]
        with adapter_context(model, adapter):
            policy = SharedPrefix.run(model, ids, device)
        reference_prefix = None
        if with_reference:
            with torch.no_grad(), adapter_context(model, reference):
                reference_prefix = SharedPrefix.run(model, ids, device)
        return cls(policy, reference_prefix)

    def backward(self, model: Any, adapter: str) -> None:
        """The micro-batches' gradient of the shared prefix, through it once."""
        if self.policy is not None:
            with adapter_context(model, adapter):
                self.policy.backward()


@dataclass
class _UpdateSetting:
    """What every micro-batch of one adapter's update shares."""

    model: Any
    adapter: str  # the adapter being trained
    reference: str | None  # the KL term's adapter: the trained one's frozen start copy, or None (the base model)
    cfg: GRPOConfig
    pad_id: int
    device: Any
    recompute_old: bool  # the trainer's pre-update log-probs are the ratio's denominator


@dataclass
class _Forwarded:
    """One micro-batch after its forward pass under the adapter: (B, L) ids and attention, and for
    the L-1 predicted positions the scored-token mask, the rollout engine's log-probs and the
    policy's (with gradient); one advantage per row."""

    ids: torch.Tensor
    attn: torch.Tensor
    mask: torch.Tensor
    rollout_old: torch.Tensor
    advantages: torch.Tensor
    logprobs: torch.Tensor


def _forward(s: _UpdateSetting, job: UpdateJob, chunk: Sequence[int], prefix: SharedPrefix | None) -> _Forwarded:
    """The forward stage: ``chunk`` of ``job`` padded and run under the active adapter."""
    ids, attn, mask, old = padded_batch([job.seqs[i] for i in chunk], s.pad_id, s.device)  # (B, L), (B, L), (B, L-1), (B, L-1)
    adv = torch.tensor([job.advantages[i] for i in chunk], dtype=torch.float32, device=s.device)  # (B,)
    lp = policy_token_logprobs(s.model, ids, attn, temperature=job.temperature, mask=mask, prefix=prefix)
    return _Forwarded(ids, attn, mask, old, adv, lp)


def _ratio_terms(s: _UpdateSetting, fw: _Forwarded, trainer_old: torch.Tensor | None, tally: RoleTally, *,
                 first_part: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ratio with its corrections: the old log-probs it divides by (the rollout engine's, or the
    trainer's with ``recompute_old``) and, with ``cfg.tis_cap``, each token's truncated importance
    weight min(pi_trainer / pi_rollout, cap). In the first minibatch (no optimizer step yet) it also
    tallies the rollout engine's drift from the trainer and the share of ratios the clip sees."""
    m = fw.mask.bool()  # (B, L-1)
    if first_part:  # every tally stays on the device until the update ends (rl.update_stats.RoleTally)
        tally.deltas.append((trainer_old - fw.rollout_old)[m].abs())
    old = trainer_old if s.recompute_old else fw.rollout_old
    weights = None
    if s.cfg.tis_cap is not None:
        weights = torch.exp(trainer_old - fw.rollout_old).clamp(max=s.cfg.tis_cap)  # (B, L-1)
        tally.tis_weight = tally.tis_weight + weights[m].sum().double()
        tally.tis_tokens = tally.tis_tokens + m.sum()
    if first_part:
        ratio = torch.exp(fw.logprobs.detach() - old)[m]  # what the clip sees before any step
        tally.outside = tally.outside + ((ratio < 1 - s.cfg.clip_eps) | (ratio > 1 + s.cfg.eps_high)).sum()
        tally.first_tokens = tally.first_tokens + m.sum()
    return old, weights


def _reference_logprobs(s: _UpdateSetting, fw: _Forwarded, temperature: float,
                        prefix: SharedPrefix | None) -> torch.Tensor | None:
    """The reference policy's log-probs for the KL term (``s.reference``: the base model or the
    adapter's start copy; no gradient); None without a KL term."""
    if s.cfg.kl_coef <= 0:
        return None
    with torch.no_grad(), adapter_context(s.model, s.reference):
        return policy_token_logprobs(s.model, fw.ids, fw.attn, temperature=temperature, mask=fw.mask, prefix=prefix)


def _backward(s: _UpdateSetting, fw: _Forwarded, old: torch.Tensor, weights: torch.Tensor | None,
              ref: torch.Tensor | None, share: float) -> LossStats:
    """The backward stage: the micro-batch's GRPO loss weighted by ``share`` (its part of the
    slice's aggregate, so that micro-batching does not change the gradient); returns its stats."""
    loss, stats = policy_loss(fw.logprobs, old, fw.advantages, fw.mask, s.cfg, ref_logprobs=ref, token_weights=weights)
    (loss * share).backward()
    return stats


def _micro_batch(s: _UpdateSetting, job: UpdateJob, chunk: list[int], part: _JobSlice, prefixes: _Prefixes, *,
                 tally: RoleTally, first_part: bool, pre_update: Mapping[int, torch.Tensor] | None = None) -> None:
    """One micro-batch of ``job``: forward under the adapter, the ratio's terms, backward; its stats into ``tally``.

    The trainer's pre-update log-probs are this forward's own in the first minibatch (no optimizer
    step has run yet), else ``pre_update[i]`` (:func:`_pre_update_logprobs`)."""
    seqs = [job.seqs[i] for i in chunk]
    with adapter_context(s.model, s.adapter):
        fw = _forward(s, job, chunk, prefixes.policy)
        trainer_old = fw.logprobs.detach() if first_part else \
            _rows_like(fw.rollout_old, [pre_update[i] for i in chunk]) if pre_update else None
        old, weights = _ratio_terms(s, fw, trainer_old, tally, first_part=first_part)
        ref = _reference_logprobs(s, fw, job.temperature, prefixes.reference)
        stats = _backward(s, fw, old, weights, ref, _denominator(seqs, s.cfg.aggregation) / part.denominator)
    tally.add(stats, len(chunk), fw.ids.numel(), fw.ids.numel() - sum(part.lengths[i] for i in chunk))


def _rows_like(template: torch.Tensor, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-sequence log-prob rows (length L_i - 1 each) right-padded with 0 into ``template``'s (B, L-1)."""
    out = torch.zeros_like(template)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row.to(out.device, out.dtype)
    return out


def _pre_update_logprobs(model: Any, adapter: str, job: UpdateJob, indices: Sequence[int], *, micro_batch: int,
                         pad_id: int, device: Any) -> dict[int, torch.Tensor]:
    """The trainer's log-probs of sequences ``indices`` under the adapter as it is now (before the
    update's first optimizer step), without gradient: the old log-probs of the minibatches after the
    first one, whose own forward comes after a step. Row i has one entry per predicted position."""
    out: dict[int, torch.Tensor] = {}
    with torch.no_grad(), adapter_context(model, adapter):
        for start in range(0, len(indices), micro_batch):
            chunk = list(indices[start:start + micro_batch])
            seqs = [job.seqs[i] for i in chunk]
            ids, attn, mask, _ = padded_batch(seqs, pad_id, device)
            lp = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask)  # (B, L-1)
            for row, i in enumerate(chunk):
                out[i] = lp[row, :len(job.seqs[i].ids) - 1].cpu()
    return out


def grpo_update(policies: PolicySet, adapter: str, jobs: Sequence[UpdateJob], settings: UpdateSettings, *,
                pad_id: int, dp: DataParallel = SINGLE_PROCESS) -> dict[str, float]:
    """GRPO update(s) of one adapter from its ``jobs`` (one per role it plays: two with a shared
    backbone), under ``settings`` (:class:`~cosearch_lib.config.UpdateSettings`: the loss
    ``settings.grpo`` and how it runs). Each job's loss is aggregated over its own tokens; the jobs'
    losses are summed.

    The sequences are split round-robin into ``settings.minibatches`` slices, one optimizer step
    each; a slice's forwarded sequences are cut into micro-batches of ``settings.micro_batch``
    (:func:`micro_batches`, longest first with ``length_grouped``). ``shared_prefix`` runs the
    prefix a job's sequences share once per optimizer step (:class:`SharedPrefix`; not with
    checkpointing, which keeps no cache). ``gradient_checkpointing`` recomputes activations in the
    backward pass (:func:`update_checkpointing`). A job with ``prompt_groups`` (G samples of each prompt) is cut into
    micro-batches inside its groups (:func:`grouped_micro_batches`) and each runs its group's whole
    prompt once. Returns ``<role>_<stat>`` (token-weighted means
    over micro-batches of :func:`cosearch_lib.rl.grpo_loss.policy_loss`'s stats, plus ``<role>_n_forwarded``,
    ``<role>_n_tokens``, ``<role>_pad_frac``: padding positions / positions forwarded) and
    ``grad_norm`` (mean pre-clip norm).

    Data parallel (``dp``, ``rl.data_parallel``): each rank passes the jobs of its own sequences,
    with their ``positions`` in the step's whole batch; the aggregate's denominators and the
    gradients are summed over ranks before each optimizer step, and the statistics are those of
    the whole batch, so every rank returns what one process would.

    Old log-probs: the sequences' own (what the rollout backend reported) unless ``recompute_old``,
    then the trainer's before the first optimizer step (``GRPOConfig.recomputes_old_logprobs``);
    ``cfg.tis_cap`` adds truncated importance weights. Either way the first minibatch records the
    rollout backend's drift from the trainer: ``<role>_logp_drift_mean`` / ``_p99`` (|delta logp|
    per scored token), ``<role>_ratio_outside_clip`` (share of its ratios outside [1 - eps, 1 +
    eps_high] before any step: 0 with ``recompute_old``) and ``<role>_tis_weight_mean``."""
    cfg, micro_batch, minibatches = settings.grpo, settings.micro_batch, settings.minibatches
    recompute_old = settings.recompute_old
    model, optimizer = policies.model, policies.optimizers[adapter]
    params = list(policies.params[adapter].values())
    device = next(model.parameters()).device
    reference = policies.reference_adapter(adapter) if cfg.start_reference else None  # None: the base model
    if cfg.start_reference and reference is None:
        raise ValueError(f"training.grpo.kl_reference is 'start' but adapter {adapter!r} has no frozen start copy: "
                         "call PolicySet.freeze_start_references() before training (JointTrainer does)")
    setting = _UpdateSetting(model, adapter, reference, cfg, pad_id, device, recompute_old)
    kl = cfg.kl_coef > 0  # a KL term: zero-advantage sequences are forwarded too (_JobSlice)
    tallies = {job.role: RoleTally() for job in jobs}
    norms = []
    pre_update: dict[str, dict[int, torch.Tensor]] = {}
    if (recompute_old or cfg.tis_cap is not None) and minibatches > 1:
        for job in jobs:  # the later minibatches' old log-probs, before the first step changes the adapter
            later = [i for part in range(1, minibatches) for i in _JobSlice.of(job, part, minibatches, cfg.aggregation, kl=kl).active]
            pre_update[job.role] = _pre_update_logprobs(model, adapter, job, later, micro_batch=micro_batch,
                                                        pad_id=pad_id, device=device)
    with update_checkpointing(model, settings.gradient_checkpointing):
        for part in range(minibatches):
            optimizer.zero_grad(set_to_none=True)
            for job in jobs:
                piece = _JobSlice.of(job, part, minibatches, cfg.aggregation, kl=kl).over_ranks(dp)
                sharing = settings.shared_prefix and not settings.gradient_checkpointing
                if job.prompt_groups is not None:  # a prefix per micro-batch: its group's prompt
                    for chunk in grouped_micro_batches(piece.active, job.prompt_groups, micro_batch):
                        prefixes = _Prefixes.run(model, adapter, [job.seqs[i] for i in chunk], device=device,
                                                 with_reference=cfg.kl_coef > 0, reference=reference) if sharing else _Prefixes()
                        _micro_batch(setting, job, chunk, piece, prefixes, tally=tallies[job.role], first_part=part == 0,
                                     pre_update=pre_update.get(job.role))
                        prefixes.backward(model, adapter)
                    continue
                prefixes = _Prefixes.run(model, adapter, [job.seqs[i] for i in piece.active], device=device,
                                         with_reference=cfg.kl_coef > 0, reference=reference) if sharing else _Prefixes()
                for chunk in micro_batches(piece.active, piece.lengths, micro_batch, by_length=settings.length_grouped):
                    _micro_batch(setting, job, chunk, piece, prefixes, tally=tallies[job.role], first_part=part == 0,
                                 pre_update=pre_update.get(job.role))
                prefixes.backward(model, adapter)
            if dp.sum_grads(params):  # this rank's gradient, summed over ranks: the whole batch's
                clip = settings.max_grad_norm if settings.max_grad_norm > 0 else math.inf
                norms.append(torch.nn.utils.clip_grad_norm_(params, clip).detach())  # read back once, below
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if dp.distributed:  # the whole batch's statistics: every rank's tally of each role, merged
        every_rank = dp.gather({role: tally.on_host() for role, tally in tallies.items()})
        tallies = {role: RoleTally.merged([ranked[role] for ranked in every_rank]) for role in tallies}
    out = {key: value for job in jobs for key, value in tallies[job.role].columns(job.role).items()}
    out["grad_norm"] = float(np.mean(torch.stack(norms).tolist())) if norms else 0.0
    return out


def _count(seqs: Sequence[PolicySequence], aggregation: str) -> float:
    """What the aggregation divides by over ``seqs``: tokens (token-mean) or sequences with tokens."""
    if aggregation == "token-mean":
        return float(sum(sum(s.mask[1:]) for s in seqs))
    return float(sum(1 for s in seqs if any(s.mask[1:])))


def _denominator(seqs: Sequence[PolicySequence], aggregation: str) -> float:
    """:func:`_count`, or 1 where there is nothing to count."""
    return _count(seqs, aggregation) or 1.0
