"""One GRPO update of one LoRA adapter: sequences -> token log-probs -> clipped surrogate + KL -> step.

``grpo_update`` takes the sequences a role contributes (``UpdateJob``: ids, loss masks, old
log-probs, advantages), recomputes the log-probs under the adapter in micro-batches
(``policy_token_logprobs``, which runs the LM head only at scored positions), the reference
log-probs with adapters disabled when the KL weight is non-zero, and accumulates the loss of
``rl.grpo_loss.policy_loss`` so that micro-batching does not change the gradient.

Three options make an update leaner without changing its gradient: micro-batches built from
sequences of similar length (:func:`micro_batches`: less padding forwarded), the prompt prefix a
role's sequences share run once per optimizer step for all its micro-batches (``shared_prefix``,
:class:`SharedPrefix`: every agent sequence starts with the same instructions), and gradient
checkpointing for the update only
(:func:`update_checkpointing`: activations recomputed in the backward pass instead of kept, which
3B-7B models need on one GPU).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.config import GRPOConfig
from cosearch_lib.models.generation.adapters import adapter_context
from cosearch_lib.models.generation.prefix_cache import runnable_prefix_length
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.grpo_loss import policy_loss, token_logprobs
from cosearch_lib.rl.update_stats import RoleTally

# --------------------------------------------------------------------------- sequences and updates


@dataclass
class PolicySequence:
    """One sampled sequence as the update sees it."""

    ids: list[int]  # prompt + generated (+ observations) token ids
    mask: list[int]  # 1 on the policy's sampled tokens
    old_logprobs: list[float]  # sampling log-prob per token (0 where mask is 0)


def agent_sequences(trajs: Sequence[Trajectory]) -> list[PolicySequence]:
    return [PolicySequence(t.token_ids, t.loss_mask, t.old_logprobs) for t in trajs]


def ranker_sequences(calls: Sequence[Any]) -> list[PolicySequence]:
    return [PolicySequence(list(c.prompt_ids) + list(c.output_ids), [0] * len(c.prompt_ids) + [1] * len(c.output_ids),
                           [0.0] * len(c.prompt_ids) + list(c.output_logprobs)) for c in calls]


def _padded(seqs: Sequence[PolicySequence], pad_id: int, device: Any) -> tuple[torch.Tensor, ...]:
    """Right-padded tensors: ids (B, L), attention (B, L), and for the L-1 predicted positions
    mask (B, L-1) and old log-probs (B, L-1)."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    return ids.to(device), attn.to(device), mask[:, 1:].to(device), old[:, 1:].to(device)


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body and the LM head of a causal LM (inside a peft wrapper, LoRA included)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(base, getattr(base, "base_model_prefix", "model"), None)
    head = base.get_output_embeddings()
    if body is None or head is None or body is base:
        raise ValueError(f"cannot split {type(base).__name__} into a backbone and an LM head")
    return body, head


def policy_token_logprobs(model: Any, ids: torch.Tensor, attn: torch.Tensor, *, temperature: float,
                          mask: torch.Tensor | None = None, prefix: SharedPrefix | None = None) -> torch.Tensor:
    """Log-prob of each next token under ``model`` at ``temperature``: (B, L) ids -> (B, L-1).

    With ``mask`` (B, L-1), the LM head and the log-softmax run only where mask is 1 (elsewhere the
    result is 0): generated tokens are a small share of an agent's sequence (the prompt and the
    observations are not trained on), and the head over a 49k-150k vocabulary is a large part of
    the cost of a small model's forward and backward pass. With ``prefix`` (and ``mask``), every
    row starts with ``prefix.ids``, whose hidden states and keys/values are reused, not recomputed."""
    if mask is None:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, L, V)
        return token_logprobs(logits[:, :-1], ids[:, 1:], temperature=temperature)  # (B, L-1)
    body, head = _backbone_and_head(model)
    hidden = _hidden_states(body, ids, attn, prefix)[:, :-1]  # (B, L-1, H)
    where = mask.bool()
    picked = head(hidden[where])  # (n, V): only the positions that are scored
    lp = token_logprobs(picked[None], ids[:, 1:][where][None], temperature=temperature)[0]  # (n,)
    return torch.zeros(where.shape, dtype=lp.dtype, device=lp.device).masked_scatter(where, lp)  # (B, L-1)


@dataclass
class SharedPrefix:
    """The backbone's output for token ids that start every sequence of a batch, run once (batch 1).

    Why: an agent's sequences all start with the same instructions (about 230 tokens on the demo,
    a fifth to a half of a sequence), and recomputing them per sequence, forward and backward,
    is wasted work. :meth:`run` computes the prefix and hands out detached copies (leaves); the
    micro-batches read them, expanded to their rows, and their backward passes accumulate the
    gradient of the leaves; :meth:`backward` then sends that sum through the one prefix
    computation into the LoRA weights: the same gradient as running the prefix in every row."""

    ids: tuple[int, ...]
    hidden: torch.Tensor  # (1, P, H) last hidden states
    keys_values: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (1, kv_heads, P, head_dim)
    _graph: list[torch.Tensor] | None = None  # the outputs of the computation, when gradient flows back

    @classmethod
    def run(cls, model: Any, ids: Sequence[int], device: Any) -> SharedPrefix:
        """Run ``ids`` through ``model``'s backbone (under whatever adapter is active)."""
        body, _ = _backbone_and_head(model)
        out = body(input_ids=torch.tensor([list(ids)], device=device), use_cache=True)
        hidden = out.last_hidden_state
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        if not torch.is_grad_enabled() or not hidden.requires_grad:
            return cls(tuple(ids), hidden, kv)
        graph = [hidden] + [t for pair in kv for t in pair]
        leaves = [t.detach().requires_grad_() for t in graph]
        return cls(tuple(ids), leaves[0], list(zip(leaves[1::2], leaves[2::2])), graph)

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the leaves through the prefix computation."""
        if self._graph is None:
            return
        leaves = [self.hidden] + [t for pair in self.keys_values for t in pair]
        pairs = [(out, leaf.grad) for out, leaf in zip(self._graph, leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self._graph = None  # once


def _hidden_states(body: Any, ids: torch.Tensor, attn: torch.Tensor, prefix: SharedPrefix | None) -> torch.Tensor:
    """The backbone's last hidden states (B, L, H); with ``prefix``, the rows' first ``len(prefix.ids)``
    tokens are those ids (checked) and only the rest runs, on the prefix's keys/values."""
    B, L = ids.shape
    if prefix is None:
        return body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    P = len(prefix.ids)
    if not 0 < P < L or not bool((ids[:, :P] == torch.tensor(prefix.ids, device=ids.device)).all()):
        raise ValueError(f"every row must start with the shared prefix ({P} tokens) and go on after it (L={L})")
    keys_values = [(k.expand(B, -1, -1, -1), v.expand(B, -1, -1, -1)) for k, v in prefix.keys_values]
    rest = body(input_ids=ids[:, P:], attention_mask=attn, past_key_values=DynamicCache(ddp_cache_data=keys_values),
                position_ids=torch.arange(P, L, device=ids.device)[None].expand(B, -1),
                use_cache=True).last_hidden_state  # (B, L - P, H)
    return torch.cat([prefix.hidden.expand(B, -1, -1), rest], dim=1)


def shared_prefix_length(seqs: Sequence[PolicySequence], *, minimum: int = 16) -> int:
    """Tokens at the start of every sequence in ``seqs`` (leaving each at least one token to run);
    0 when fewer than ``minimum`` or a single sequence (not worth a separate pass)."""
    if len(seqs) < 2:
        return 0
    n = runnable_prefix_length([s.ids for s in seqs])
    return n if n >= minimum else 0


@dataclass
class UpdateJob:
    """What one role contributes to an adapter's update."""

    role: str  # "agent" | "ranker": prefixes the stats
    seqs: Sequence[PolicySequence]
    advantages: Sequence[float]  # one per sequence
    temperature: float  # the temperature the sequences were sampled at (log-probs are recomputed at it)
    prompt_groups: Sequence[int] | None = None  # sequences with one label share their prompt (G samples of it): micro-batches stay inside a group and run its prompt once
    positions: Sequence[int] | None = None  # each sequence's position in the step's whole batch (data parallel: a rank holds some of them); None: 0, 1, ...

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
    minibatch's aggregate divides by (all its sequences count, forwarded or not)."""

    active: list[int]  # indices into job.seqs: non-zero advantage and some scored token
    lengths: dict[int, int]  # token count of each active sequence
    denominator: float  # tokens (token-mean) or sequences of the whole slice, over every rank

    @classmethod
    def of(cls, job: UpdateJob, part: int, minibatches: int, aggregation: str,
           dp: DataParallel = SINGLE_PROCESS) -> _JobSlice:
        """The slice ``part`` of ``job`` (round-robin over the step's positions, so a rank's slice
        holds its share of the single-process slice); its denominator is summed over ranks."""
        idx = [i for i in range(len(job.seqs)) if job.position(i) % minibatches == part]
        active = [i for i in idx if job.advantages[i] != 0.0 and any(job.seqs[i].mask)]
        return cls(active, {i: len(job.seqs[i].ids) for i in active},
                   dp.sum(_count([job.seqs[i] for i in idx], aggregation)) or 1.0)


@dataclass
class _Prefixes:
    """The shared prompt prefix of a job slice, under the adapter and (for the KL term) the reference."""

    policy: SharedPrefix | None = None
    reference: SharedPrefix | None = None

    @classmethod
    def run(cls, model: Any, adapter: str, seqs: Sequence[PolicySequence], *, with_reference: bool,
            device: Any) -> _Prefixes:
        n_shared = shared_prefix_length(seqs)
        if not n_shared:
            return cls()
        ids = seqs[0].ids[:n_shared]
        with adapter_context(model, adapter):
            policy = SharedPrefix.run(model, ids, device)
        reference = None
        if with_reference:
            with torch.no_grad(), adapter_context(model, None):
                reference = SharedPrefix.run(model, ids, device)
        return cls(policy, reference)

    def backward(self, model: Any, adapter: str) -> None:
        """The micro-batches' gradient of the shared prefix, through it once."""
        if self.policy is not None:
            with adapter_context(model, adapter):
                self.policy.backward()


def _micro_batch(model: Any, adapter: str, job: UpdateJob, chunk: list[int], part: _JobSlice, prefixes: _Prefixes,
                 cfg: GRPOConfig, *, pad_id: int, device: Any, tally: RoleTally, first_part: bool,
                 recompute_old: bool = False, pre_update: Mapping[int, torch.Tensor] | None = None) -> None:
    """Forward ``chunk`` of ``job`` under the adapter, backward its loss weighted by its share of the
    slice's aggregate (so micro-batching does not change the gradient), and add its stats to ``tally``.

    The trainer's pre-update log-probs are this forward's own in the first minibatch (no optimizer
    step has run yet), else ``pre_update[i]`` (:func:`_pre_update_logprobs`). ``recompute_old``
    makes them the ratio's denominator (the first minibatch's ratio is then exactly 1); with
    ``cfg.tis_cap`` each token's surrogate is weighted by min(pi_trainer / pi_rollout, cap)."""
    seqs = [job.seqs[i] for i in chunk]
    ids, attn, mask, old = _padded(seqs, pad_id, device)  # (B, L), (B, L), (B, L-1), (B, L-1)
    adv = torch.tensor([job.advantages[i] for i in chunk], dtype=torch.float32, device=device)  # (B,)
    m = mask.bool()  # (B, L-1)
    with adapter_context(model, adapter):
        lp = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask, prefix=prefixes.policy)
        rollout_old = old
        trainer_old = lp.detach() if first_part else _rows_like(old, [pre_update[i] for i in chunk]) if pre_update else None
        if first_part:
            tally.deltas.append((trainer_old - rollout_old)[m].abs().cpu())  # the rollout engine's drift from the trainer
        if recompute_old:
            old = trainer_old
        weights = None
        if cfg.tis_cap is not None:
            weights = torch.exp(trainer_old - rollout_old).clamp(max=cfg.tis_cap)  # (B, L-1) min(pi_trainer / pi_rollout, C)
            tally.tis_weight += float(weights[m].sum())
            tally.tis_tokens += int(m.sum())
        if first_part:
            ratio = torch.exp(lp.detach() - old)[m]  # what the clip sees before any step
            tally.outside += int(((ratio < 1 - cfg.clip_eps) | (ratio > 1 + cfg.eps_high)).sum())
            tally.first_tokens += int(m.sum())
        ref = None
        if cfg.kl_coef > 0:
            with torch.no_grad(), adapter_context(model, None):
                ref = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask,
                                            prefix=prefixes.reference)
        loss, stats = policy_loss(lp, old, adv, mask, cfg, ref_logprobs=ref, token_weights=weights)
        (loss * (_denominator(seqs, cfg.aggregation) / part.denominator)).backward()
    tally.add(stats, len(chunk), ids.numel(), ids.numel() - sum(part.lengths[i] for i in chunk))


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
            ids, attn, mask, _ = _padded(seqs, pad_id, device)
            lp = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask)  # (B, L-1)
            for row, i in enumerate(chunk):
                out[i] = lp[row, :len(job.seqs[i].ids) - 1].cpu()
    return out


def grpo_update(policies: PolicySet, adapter: str, jobs: Sequence[UpdateJob], cfg: GRPOConfig, *, micro_batch: int,
                max_grad_norm: float, pad_id: int, minibatches: int = 1, length_grouped: bool = True,
                gradient_checkpointing: bool = False, shared_prefix: bool = True,
                recompute_old: bool = False, dp: DataParallel = SINGLE_PROCESS) -> dict[str, float]:
    """GRPO update(s) of one adapter from its ``jobs`` (one per role it plays: two with a shared
    backbone). Each job's loss is aggregated over its own tokens; the jobs' losses are summed.

    The sequences are split round-robin into ``minibatches`` slices, one optimizer step each; a
    slice's forwarded sequences are cut into micro-batches of ``micro_batch`` (:func:`micro_batches`,
    longest first with ``length_grouped``). ``shared_prefix`` runs the prefix a job's sequences
    share once per optimizer step (:class:`SharedPrefix`; not with checkpointing, which keeps no
    cache). ``gradient_checkpointing`` recomputes activations in the backward pass
    (:func:`update_checkpointing`). A job with ``prompt_groups`` (G samples of each prompt) is cut into
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
    model, optimizer = policies.model, policies.optimizers[adapter]
    params = list(policies.params[adapter].values())
    device = next(model.parameters()).device
    tallies = {job.role: RoleTally() for job in jobs}
    norms = []
    pre_update: dict[str, dict[int, torch.Tensor]] = {}
    if (recompute_old or cfg.tis_cap is not None) and minibatches > 1:
        for job in jobs:  # the later minibatches' old log-probs, before the first step changes the adapter
            later = [i for part in range(1, minibatches) for i in _JobSlice.of(job, part, minibatches, cfg.aggregation, dp).active]
            pre_update[job.role] = _pre_update_logprobs(model, adapter, job, later, micro_batch=micro_batch,
                                                        pad_id=pad_id, device=device)
    with update_checkpointing(model, gradient_checkpointing):
        for part in range(minibatches):
            optimizer.zero_grad(set_to_none=True)
            for job in jobs:
                piece = _JobSlice.of(job, part, minibatches, cfg.aggregation, dp)
                sharing = shared_prefix and not gradient_checkpointing
                if job.prompt_groups is not None:  # a prefix per micro-batch: its group's prompt
                    for chunk in grouped_micro_batches(piece.active, job.prompt_groups, micro_batch):
                        prefixes = _Prefixes.run(model, adapter, [job.seqs[i] for i in chunk], device=device,
                                                 with_reference=cfg.kl_coef > 0) if sharing else _Prefixes()
                        _micro_batch(model, adapter, job, chunk, piece, prefixes, cfg, pad_id=pad_id, device=device,
                                     tally=tallies[job.role], first_part=part == 0, pre_update=pre_update.get(job.role),
                                     recompute_old=recompute_old)
                        prefixes.backward(model, adapter)
                    continue
                prefixes = _Prefixes.run(model, adapter, [job.seqs[i] for i in piece.active], device=device,
                                         with_reference=cfg.kl_coef > 0) if sharing else _Prefixes()
                for chunk in micro_batches(piece.active, piece.lengths, micro_batch, by_length=length_grouped):
                    _micro_batch(model, adapter, job, chunk, piece, prefixes, cfg, pad_id=pad_id, device=device,
                                 tally=tallies[job.role], first_part=part == 0, pre_update=pre_update.get(job.role),
                                 recompute_old=recompute_old)
                prefixes.backward(model, adapter)
            if dp.sum_grads(params):  # this rank's gradient, summed over ranks: the whole batch's
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)))
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if dp.distributed:  # the whole batch's statistics: every rank's tally of each role, merged
        every_rank = dp.gather(tallies)
        tallies = {role: RoleTally.merged([ranked[role] for ranked in every_rank]) for role in tallies}
    out = {key: value for job in jobs for key, value in tallies[job.role].columns(job.role).items()}
    out["grad_norm"] = float(np.mean(norms)) if norms else 0.0
    return out


def _count(seqs: Sequence[PolicySequence], aggregation: str) -> float:
    """What the aggregation divides by over ``seqs``: tokens (token-mean) or sequences with tokens."""
    if aggregation == "token-mean":
        return float(sum(sum(s.mask[1:]) for s in seqs))
    return float(sum(1 for s in seqs if any(s.mask[1:])))


def _denominator(seqs: Sequence[PolicySequence], aggregation: str) -> float:
    """:func:`_count`, or 1 where there is nothing to count."""
    return _count(seqs, aggregation) or 1.0
