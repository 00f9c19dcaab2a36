"""One GRPO update of one LoRA adapter: sequences -> token log-probs -> clipped surrogate + KL -> step.

``grpo_update`` takes the sequences a role contributes (``UpdateJob``: ids, loss masks, old
log-probs, advantages), recomputes the log-probs under the adapter in micro-batches
(``policy_token_logprobs``, which runs the LM head only at scored positions), the reference
log-probs with adapters disabled when the KL weight is non-zero, and accumulates the loss of
``rl.grpo_loss.policy_loss`` so that micro-batching does not change the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.config import GRPOConfig
from cosearch_lib.models.backends import adapter_context
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.rl.grpo_loss import policy_loss, token_logprobs

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
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Log-prob of each next token under ``model`` at ``temperature``: (B, L) ids -> (B, L-1).

    With ``mask`` (B, L-1), the LM head and the log-softmax run only where mask is 1 (elsewhere the
    result is 0): generated tokens are a small share of an agent's sequence (the prompt and the
    observations are not trained on), and the head over a 49k-150k vocabulary is a large part of
    the cost of a small model's forward and backward pass."""
    if mask is None:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, L, V)
        return token_logprobs(logits[:, :-1], ids[:, 1:], temperature=temperature)  # (B, L-1)
    body, head = _backbone_and_head(model)
    hidden = body(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state[:, :-1]  # (B, L-1, H)
    where = mask.bool()
    picked = head(hidden[where])  # (n, V): only the positions that are scored
    lp = token_logprobs(picked[None], ids[:, 1:][where][None], temperature=temperature)[0]  # (n,)
    return torch.zeros(where.shape, dtype=lp.dtype, device=lp.device).masked_scatter(where, lp)  # (B, L-1)


@dataclass
class UpdateJob:
    """What one role contributes to an adapter's update."""

    role: str  # "agent" | "ranker": prefixes the stats
    seqs: Sequence[PolicySequence]
    advantages: Sequence[float]  # one per sequence
    temperature: float  # the temperature the sequences were sampled at (log-probs are recomputed at it)


def grpo_update(policies: PolicySet, adapter: str, jobs: Sequence[UpdateJob], cfg: GRPOConfig, *, micro_batch: int,
                max_grad_norm: float, pad_id: int, minibatches: int = 1) -> dict[str, float]:
    """GRPO update(s) of one adapter from its ``jobs`` (one per role it plays: two with a shared
    backbone). Each job's loss is aggregated over its own tokens; the jobs' losses are summed.

    The sequences are split round-robin into ``minibatches`` slices, one optimizer step each.
    Returns ``<role>_<stat>`` (token-weighted means over micro-batches of :func:`grpo.policy_loss`'s
    stats, plus ``<role>_n_forwarded`` and ``<role>_n_tokens``) and ``grad_norm`` (mean pre-clip norm)."""
    model, optimizer = policies.model, policies.optimizers[adapter]
    params = list(policies.params[adapter].values())
    device = next(model.parameters()).device
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    counts: dict[str, int] = {}
    norms = []
    for part in range(minibatches):
        optimizer.zero_grad(set_to_none=True)
        for job in jobs:
            idx = [i for i in range(len(job.seqs)) if i % minibatches == part]
            denom = _denominator([job.seqs[i] for i in idx], cfg.aggregation)
            active = [i for i in idx if job.advantages[i] != 0.0 and any(job.seqs[i].mask)]
            for start in range(0, len(active), micro_batch):
                chunk = active[start:start + micro_batch]
                ids, attn, mask, old = _padded([job.seqs[i] for i in chunk], pad_id, device)
                adv = torch.tensor([job.advantages[i] for i in chunk], dtype=torch.float32, device=device)
                with adapter_context(model, adapter):
                    lp = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask)
                    ref = None
                    if cfg.kl_coef > 0:
                        with torch.no_grad(), adapter_context(model, None):
                            ref = policy_token_logprobs(model, ids, attn, temperature=job.temperature, mask=mask)
                    loss, stats = policy_loss(lp, old, adv, mask, cfg, ref_logprobs=ref)
                    # the micro-batch's aggregate -> its share of the (mini)batch aggregate
                    share = _denominator([job.seqs[i] for i in chunk], cfg.aggregation) / denom
                    (loss * share).backward()
                counts[job.role] = counts.get(job.role, 0) + len(chunk)
                w = stats.pop("n_tokens")
                weights[job.role] = weights.get(job.role, 0.0) + w
                for k, v in stats.items():
                    if not math.isnan(v):
                        sums[f"{job.role}_{k}"] = sums.get(f"{job.role}_{k}", 0.0) + v * w
        if any(p.grad is not None for p in params):
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf)))
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    out = {k: v / weights[k.split("_", 1)[0]] for k, v in sums.items() if weights.get(k.split("_", 1)[0])}
    for job in jobs:
        out[f"{job.role}_n_forwarded"] = counts.get(job.role, 0)
        out[f"{job.role}_n_tokens"] = weights.get(job.role, 0.0)
    out["grad_norm"] = float(np.mean(norms)) if norms else 0.0
    return out


def _denominator(seqs: Sequence[PolicySequence], aggregation: str) -> float:
    """What the aggregation divides by over ``seqs``: tokens (token-mean) or sequences with tokens."""
    if aggregation == "token-mean":
        return float(sum(sum(s.mask[1:]) for s in seqs)) or 1.0
    return float(sum(1 for s in seqs if any(s.mask[1:]))) or 1.0
