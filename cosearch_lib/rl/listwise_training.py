"""Supervised listwise training of a scoring ranker, with its held-out learning curve.

A scoring ranker (``models.cross_encoder.CrossEncoderScorer``, ``models.llm_judge.LLMJudgeScorer``)
gives each of a sub-query's candidates a score; the ranking policy samples K of them Plackett-Luce.
Before GRPO it learns from the gold hops of the training split: the sub-query, the retriever's N
candidates (``rl.scorer_policy.relevance_lists``) and which of them contain the hop's answer.

The loss of one list is the softmax cross-entropy of its scores against the uniform distribution
over its relevant candidates (``listwise_loss``). Two choices keep it cheap on CPU: each list can
be cut to one relevant candidate and ``negatives`` sampled non-relevant ones (a localised
contrastive estimate: the scores of the others do not enter the softmax), and ``batch`` lists share
one optimizer step. Lists with no relevant candidate, or nothing but relevant ones, teach nothing
and are skipped.

The curve (:func:`train_listwise`) is the held-out Hit@1 every ``eval_every`` lists: the greedy
policy's first pick, the argmax of the scores over all N candidates in retriever order (ties to
the retriever's earlier one). A recipe whose curve has not risen above its start after
``patience`` lists is stopped early: issue 35 chooses recipes by their curve per CPU minute.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cosearch_lib.metrics import relevance_labels
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.scorer_policy import RelevanceList, listwise_loss, make_optimizer


@dataclass
class ListwiseRecipe:
    """How a scoring ranker is trained on gold lists (each field's default is the judge's measured recipe)."""

    examples: int = 1200  # lists trained on (the pool is cycled in a seeded order)
    batch: int = 4  # lists per optimizer step
    negatives: int = 3  # non-relevant candidates sampled beside one relevant one per list (0: the whole list)
    shuffle: bool = True  # present each trained list in a seeded random order (a listwise scorer then cannot use position)
    lr: float = 5e-4  # AdamW learning rate (LoRA; a full fine-tune wants ~10x less)
    head_lr: float = 1e-3  # of a scoring head, when the scorer has one (the cross-encoder's)
    max_grad_norm: float = 1.0  # clipping per optimizer step (0: off)
    eval_every: int = 200  # lists between two held-out Hit@1 points of the curve (0: start and end only)
    patience: int = 400  # stop when Hit@1 has not risen above its start after this many lists (0: never)

    def __post_init__(self) -> None:
        for name in ("examples", "batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ListwiseRecipe.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("negatives", "eval_every", "patience"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"ListwiseRecipe.{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"ListwiseRecipe.lr must be > 0, got {self.lr!r}")


def usable_lists(lists: Sequence[RelevanceList]) -> list[RelevanceList]:
    """The lists that teach something: at least one relevant and one non-relevant candidate."""
    return [x for x in lists if any(x.relevant) and not all(x.relevant)]


def training_view(lst: RelevanceList, negatives: int, shuffle: bool, rng: random.Random) -> RelevanceList:
    """What one training step shows of ``lst``: one relevant candidate and ``negatives`` others drawn
    at random (all of them with ``negatives`` 0), in a random order with ``shuffle``."""
    idx = list(range(len(lst.texts)))
    if negatives:
        pos = [i for i in idx if lst.relevant[i]]
        neg = [i for i in idx if not lst.relevant[i]]
        idx = [rng.choice(pos), *rng.sample(neg, min(negatives, len(neg)))]
    if shuffle:
        rng.shuffle(idx)
    else:
        idx.sort()
    return RelevanceList(lst.query, [lst.texts[i] for i in idx], [lst.relevant[i] for i in idx])


def first_picks(scorer: Any, lists: Sequence[RelevanceList]) -> list[int]:
    """The greedy first pick of ``scorer`` on each list (argmax of its scores; the earliest on ties)."""
    was_training = scorer.training
    scorer.eval()
    picks = []
    try:
        with torch.inference_mode():
            for x in lists:
                s = scorer.scores(x.query, x.texts).float().cpu()
                picks.append(int(torch.nonzero(s == s.max())[0]))
    finally:
        scorer.train(was_training)
    return picks


def hits_at_1(scorer: Any, lists: Sequence[RelevanceList]) -> list[float]:
    """Per list: 1.0 when the scorer's first pick contains the answer (every list counts, answerable or not)."""
    return [float(x.relevant[p]) for x, p in zip(lists, first_picks(scorer, lists))]


def train_listwise(scorer: Any, train: Sequence[RelevanceList], held_out: Sequence[RelevanceList],
                   recipe: ListwiseRecipe, *, seed: int = 0, progress: bool = True,
                   on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``scorer`` in place for ``recipe.examples`` lists of ``train``; returns the curve (one
    row per held-out point: ``examples``, ``hit@1``, ``train_s`` (seconds of training so far, the
    held-out scoring excluded), ``loss`` (mean over the lists since the last point)), the final
    per-list held-out hits, and whether the patience rule stopped it. ``on_point`` sees each row as
    it is measured (a live log)."""
    pool = usable_lists(train)
    if not pool:
        raise ValueError(f"none of the {len(train)} training lists has both a relevant and a non-relevant candidate")
    rng = random.Random(seed)
    order: list[int] = []
    optimizer = make_optimizer(scorer, recipe.lr, recipe.head_lr)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    curve: list[dict[str, Any]] = []
    hits = hits_at_1(scorer, held_out)

    def point(n: int, train_s: float, losses: list[float]) -> None:
        row = {"examples": n, "hit@1": sum(hits) / max(len(hits), 1), "train_s": train_s,
               "loss": sum(losses) / len(losses) if losses else math.nan}
        curve.append(row)
        if on_point is not None:
            on_point(row)

    point(0, 0.0, [])
    scorer.train()
    train_s, losses, stopped = 0.0, [], False
    bar = tqdm(total=recipe.examples, desc="listwise training", disable=not progress)
    n = 0
    for n in range(1, recipe.examples + 1):
        if not order:
            order = list(range(len(pool)))
            rng.shuffle(order)
        view = training_view(pool[order.pop()], recipe.negatives, recipe.shuffle, rng)
        t0 = time.perf_counter()
        loss = listwise_loss(scorer.scores(view.query, view.texts), view.relevant)
        (loss / recipe.batch).backward()
        if n % recipe.batch == 0 or n == recipe.examples:
            if recipe.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, recipe.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        losses.append(float(loss.detach()))
        bar.update(1)
        if (recipe.eval_every and n % recipe.eval_every == 0) or n == recipe.examples:
            hits = hits_at_1(scorer, held_out)
            point(n, train_s, losses)
            losses = []
            if recipe.patience and n >= recipe.patience and max(r["hit@1"] for r in curve[1:]) <= curve[0]["hit@1"]:
                stopped = True
                break
    bar.close()
    scorer.eval()
    return {"curve": curve, "held_out_hits": hits, "trained_lists": n, "pool": len(pool), "stopped_early": stopped,
            "train_s": train_s}


def sub_query_lists(queries: Sequence[Any], retriever: SearchBackend, topn: int) -> list[RelevanceList]:
    """Gold sub-queries (``rl.ranker_validation.GoldSubQuery``) as relevance lists: every one kept,
    answerable or not, in order (the held-out items of the ranker-quality table)."""
    found = retriever.search([q.sub_query for q in queries], topn) if queries else []
    return [RelevanceList(q.sub_query, [p.contents for p in c], relevance_labels([p.contents for p in c], list(q.answers)))
            for q, c in zip(queries, found)]


__all__ = ["ListwiseRecipe", "first_picks", "hits_at_1", "sub_query_lists", "train_listwise", "training_view",
           "usable_lists"]
