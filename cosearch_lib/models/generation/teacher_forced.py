"""Teacher-forced log-probs: the reference that generation log-probs are tested against."""

from __future__ import annotations

from typing import Any

import torch


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
