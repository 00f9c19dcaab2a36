"""The sequences a GRPO update trains on, and their token log-probs under a policy.

A :class:`PolicySequence` is one sampled sequence as an update sees it (token ids, the mask of
the policy's own tokens, the rollout engine's log-probs), built from an agent's trajectories
(:func:`agent_sequences`) or a ranker's calls (:func:`ranker_sequences`). :func:`policy_token_logprobs`
recomputes the log-probs under the active adapter, running the LM head only at scored positions,
and reusing a :class:`SharedPrefix` (the prompt every sequence of a batch starts with, run once)
when given one. ``rl.policy_update`` builds the GRPO update on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.models.generation.prefix_cache import runnable_prefix_length
from cosearch_lib.rl.grpo_loss import token_logprobs


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


def padded_batch(seqs: Sequence[PolicySequence], pad_id: int, device: Any) -> tuple[torch.Tensor, ...]:
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
