"""Training a scoring ranker (a scoring ``config.RANKER_KINDS`` kind: the cross-encoder of Table 3's
ablation, the LLM judge) with GRPO, and the cross-encoder's supervised warm start.

A scoring ranker (``models.cross_encoder``, ``models.llm_judge``) ranks by sampling K of the N candidates from the
Plackett-Luce distribution of its scores (``agent.rankers.ScorerPolicyRanker``). That makes
it a policy with a log-probability per pick, so it trains with the same rewards, the same semantic
groups and the same clipped surrogate as the generative ranker; the K picks play the part of the
generated tokens (:func:`scorer_update`). What differs from the LLM ranker: it reads the
sub-query and one passage at a time (not q0, not the other candidates), writes no reasoning, and
cannot break the output protocol, so every call is valid. It has no KL term (no reference model
is kept for it).

Warm start (:func:`warm_start_cross_encoder`): the same gold data the LLM ranker's warm start uses,
the world's gold sub-queries with the retriever's N candidates, labelled by whether a candidate
contains the hop's answer; a listwise loss (softmax cross-entropy of the scores against the
answer-bearing candidates) for ``epochs`` passes. Hops whose candidates hold no answer teach it
nothing and are skipped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch

from cosearch_lib.config import GRPOConfig
from cosearch_lib.data.qa_formats import QAExample, gold_chain
from cosearch_lib.metrics import relevance_labels
from cosearch_lib.models.cross_encoder import CrossEncoderScorer, plackett_luce_logprobs
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.grpo_loss import policy_loss


@dataclass
class RelevanceList:
    """One gold sub-query, its N candidates (texts) and which of them contain the hop's answer."""

    query: str
    texts: list[str]
    relevant: list[int]


def relevance_lists(examples: Sequence[QAExample], retriever: SearchBackend, *, topn: int, n: int) -> list[RelevanceList]:
    """Up to ``n`` gold hops of ``examples`` (in order) with their top-N candidates and labels."""
    hops = list(islice(((hop["sub_query"], hop["answer"]) for ex in examples for hop in (gold_chain(ex) or [])), n))
    results = retriever.search([q for q, _ in hops], topn) if hops else []
    return [RelevanceList(q, texts, relevance_labels(texts, [a]))
            for (q, a), texts in ((h, [p.contents for p in cands]) for h, cands in zip(hops, results))]


def listwise_loss(scores: torch.Tensor, relevant: Sequence[int]) -> torch.Tensor:
    """Softmax cross-entropy of ``scores`` against the uniform distribution over relevant candidates."""
    target = torch.tensor(relevant, dtype=scores.dtype, device=scores.device)
    return -(target / target.sum() * torch.log_softmax(scores, dim=0)).sum()


def warm_start_cross_encoder(scorer: CrossEncoderScorer, lists: Sequence[RelevanceList], *, lr: float, head_lr: float,
                             epochs: int, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Train ``scorer`` in place on the lists with an answer-bearing candidate (and a candidate
    without); returns the loss per epoch and counts. One list per optimizer step, a seeded order per
    epoch, ``lr`` for the encoder and ``head_lr`` for the scoring head."""
    usable = [x for x in lists if any(x.relevant) and not all(x.relevant)]
    optimizer = make_optimizer(scorer, lr, head_lr)
    order = random.Random(seed)
    losses = []
    scorer.train()
    bar = tqdm(total=epochs * len(usable), desc="cross-encoder warm start", disable=not progress)
    for _ in range(epochs):
        idx = list(range(len(usable)))
        order.shuffle(idx)
        total = 0.0
        for i in idx:
            loss = listwise_loss(scorer.scores(usable[i].query, usable[i].texts), usable[i].relevant)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            bar.update(1)
        losses.append(total / max(len(usable), 1))
    bar.close()
    scorer.eval()
    return {"lists": len(lists), "trained_lists": len(usable), "epochs": epochs, "losses": losses}


def make_optimizer(scorer: CrossEncoderScorer, lr: float, head_lr: float) -> torch.optim.Optimizer:
    """AdamW, no weight decay, over the scorer's ``param_groups``: ``lr`` for the encoder (a judge's
    adapter), ``head_lr`` for a head."""
    return torch.optim.AdamW(scorer.param_groups(lr, head_lr), weight_decay=0.0)


def scorer_update(scorer: CrossEncoderScorer, optimizer: torch.optim.Optimizer, calls: Sequence[Any],
                  advantages: Sequence[float], cfg: GRPOConfig, *, temperature: float,
                  max_grad_norm: float) -> dict[str, float]:
    """One GRPO step of the scoring ranker on its calls (``RankerCall`` with ``candidate_texts``): each
    call's picks are re-scored, their Plackett-Luce log-probs compared with the recorded ones, and
    the clipped surrogate aggregated over all picks of the calls (token-mean, calls with advantage 0
    counted in the denominator as in :func:`rl.policy_update.grpo_update`). Returns ``ranker_*`` stats
    named like the LLM ranker's: loss, clip_frac, ratio_mean, logp_drift_mean (mean |logp - old logp|
    over the trained picks, before the step), n_forwarded (calls trained), n_tokens, and grad_norm.
    Calls that ranked the same list are scored once, together (the same gradient, fewer forwards)."""
    if len(calls) != len(advantages):
        raise ValueError(f"{len(calls)} calls but {len(advantages)} advantages")
    missing = [i for i, c in enumerate(calls) if len(c.candidate_texts) == 0 and c.order]
    if missing:
        raise ValueError(f"calls {missing[:5]} carry no candidate_texts: they were not ranked by a cross-encoder policy")
    denom = float(sum(len(c.order) for c in calls)) or 1.0
    active = [i for i, a in enumerate(advantages) if a != 0.0 and calls[i].order]
    scorer.eval()  # no dropout: the ratio must be 1 where the weights are those that sampled
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    weight, deltas = 0.0, []
    # Calls that ranked the same list (the same sub-query, so the same candidates: often the G rollouts'
    # first search) share one scoring and one backward pass; each keeps its own picks and advantage.
    lists: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i in active:
        lists.setdefault((calls[i].sub_query, tuple(calls[i].candidate_texts)), []).append(i)
    for (sub_query, texts), members in lists.items():
        scores = scorer.scores(sub_query, list(texts))
        total = None
        for i in members:
            c = calls[i]
            lp = plackett_luce_logprobs(scores, c.order, temperature).unsqueeze(0)
            old = torch.tensor([c.output_logprobs], dtype=lp.dtype)
            deltas.append((lp.detach() - old).abs().reshape(-1))
            loss, stats = policy_loss(lp, old, torch.tensor([advantages[i]]), torch.ones_like(lp), cfg)
            stats = dict(stats)  # one read of the call's statistics (a CPU scorer: no device to wait on)
            term = loss * (len(c.order) / denom)
            total = term if total is None else total + term
            w = stats.pop("n_tokens")
            weight += w
            for k, v in stats.items():
                if not math.isnan(v):
                    sums[k] = sums.get(k, 0.0) + v * w
        total.backward()
    grad_norm = 0.0
    params = [p for p in scorer.parameters() if p.requires_grad]
    if any(p.grad is not None for p in params):
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else math.inf))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {f"ranker_{k}": v / weight for k, v in sums.items()} if weight else {}
    out.update(ranker_n_forwarded=len(active), ranker_n_tokens=weight, grad_norm=grad_norm)
    if deltas:
        out["ranker_logp_drift_mean"] = float(torch.cat(deltas).double().mean())
    return out


def scorer_state(scorer: CrossEncoderScorer, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What a checkpoint keeps of the cross-encoder (weights and optimizer moments)."""
    return {"model": {k: v.detach().clone() for k, v in scorer.state_dict().items()},
            "optimizer": optimizer.state_dict()}


def load_scorer_state(scorer: CrossEncoderScorer, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    scorer.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


__all__ = ["RelevanceList", "scorer_update", "listwise_loss", "load_scorer_state", "make_optimizer",
           "relevance_lists", "scorer_state", "warm_start_cross_encoder"]
