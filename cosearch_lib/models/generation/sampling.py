"""Sampling and finishing: logits and uniforms to tokens, tokens to finished generations.

:func:`sample_tokens` draws one token per row by inverse-CDF sampling from that row's own uniform
(see :mod:`cosearch_lib.models.generation.counter_rng`), so a row's draw depends on its own seed
and logits only, and reports each id's log-prob under ``logits / temperature`` before top-p/top-k
truncation (what the GRPO ratio needs). :class:`Finisher` applies the eos / stop-string / length
rules token by token; the transformers loop and the scripted test backends share it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.contract import Generation, find_stop


def sample_tokens(logits: Any, uniforms: Any, sampling: SamplingConfig) -> tuple[Any, Any]:
    """Pick one token per row; return (ids, logprobs of those ids).

    logits: (b, V) float32; uniforms: (b,) float64 in [0, 1), one per row (from the row's seed and
    the token index; None when greedy). Inverse-CDF sampling (first index whose cumulative mass
    exceeds u * total) keeps each row's draw a function of its own uniform and its own logits only.
    """

    if sampling.greedy:
        logp = torch.log_softmax(logits, dim=-1)  # (b, V)
        ids = logp.argmax(dim=-1)  # (b,)
        return ids, logp.gather(-1, ids[:, None])[:, 0]
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)  # (b, V) the reported distribution
    truncate = sampling.top_k > 0 or sampling.top_p < 1
    if truncate:
        sorted_logp, order = logp.sort(dim=-1, descending=True)  # (b, V)
        probs = sorted_logp.exp()  # (b, V)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if sampling.top_k > 0:
            keep[:, sampling.top_k:] = False
        if sampling.top_p < 1:
            mass_before = probs.cumsum(-1, dtype=torch.float64) - probs  # (b, V) mass of more likely tokens
            keep &= mass_before < sampling.top_p  # the most likely token always stays
        probs = probs * keep
    else:
        probs = logp.exp()  # (b, V) in vocabulary order
    cdf = probs.cumsum(-1, dtype=torch.float64)  # (b, V) float64: u * total stays below the last entry
    target = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]  # (b, 1)
    pos = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)  # (b,)
    ids = order.gather(-1, pos[:, None])[:, 0] if truncate else pos
    return ids, logp.gather(-1, ids[:, None])[:, 0]


class Finisher:
    """The eos / stop / length rules, applied token by token (shared by the real and scripted loops)."""

    def __init__(self, decode: Callable[[list[int]], str], eos_ids: Iterable[int], sampling: SamplingConfig, *,
                 stop_tokens: frozenset[int] | None = None):
        self.decode = decode
        # ids after which the decoded tail is searched for a stop string; None: after every id
        self.stop_tokens = stop_tokens
        self.eos_ids = frozenset(eos_ids)
        self.stops = sampling.stop
        self.max_new = sampling.max_new_tokens
        # Tail window in tokens: a stop string of L characters spans at most L tokens, unless tokens
        # decode to nothing on their own (special tokens, partial UTF-8); 2L + 8 leaves room for both.
        self.window = 2 * max((len(s) for s in self.stops), default=0) + 8

    def push(self, ids: list[int], logprobs: list[float], token: int, logprob: float) -> str | None:
        """Append one sampled token to a row; return its finish reason once it is done, else None."""
        ids.append(token)
        logprobs.append(logprob)
        if token in self.eos_ids:
            return "eos"
        if (self.stops and (self.stop_tokens is None or token in self.stop_tokens)
                and find_stop(self.decode(ids[-self.window:]), self.stops) is not None):
            # Shortest prefix whose text contains a stop: normally all of ids (we check every step),
            # but walk back in case a stop slipped past the tail window earlier.
            n = len(ids)
            while n > 1 and find_stop(self.decode(ids[: n - 1]), self.stops) is not None:
                n -= 1
            del ids[n:], logprobs[n:]
            return "stop"
        if len(ids) >= self.max_new:
            return "length"
        return None

    def finish(self, ids: list[int], logprobs: list[float], reason: str) -> Generation:
        if reason == "eos":
            text = self.decode(ids[:-1])
        else:
            text = self.decode(ids)
            if reason == "stop":
                text = text[: find_stop(text, self.stops)]
        return Generation(text=text, token_ids=list(ids), logprobs=list(logprobs), finish_reason=reason)


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """Ids -> text as a :class:`Generation` reports it: special tokens left out, spaces not cleaned up."""
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    return decode


def eos_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """The tokenizer's eos id plus every eos id of the model's generation config."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    extra = getattr(gen_cfg, "eos_token_id", None)
    if extra is not None:
        ids.update(int(i) for i in (extra if isinstance(extra, (list, tuple)) else [extra]))
    if not ids:
        raise ValueError("no eos token id: the tokenizer has no eos_token_id and the model's generation_config none")
    return ids
