"""What can play the ranker policy (``training.ranker_kind``): one :class:`RankerKind` per kind.

A method that ranks with its ranker policy (``RankedBy.POLICY``: CoSearch, the Fixed Ranker) ranks
with the kind the profile names. The generative LLM ranker (the paper's) writes its ranking as text
from a LoRA adapter; a *scoring* ranker scores each candidate beside the sub-query and samples K of
them Plackett-Luce (no generated text, every ranking valid; trained by ``rl.scorer_policy``), and
travels in ``run_schema.SCORER_SLOT`` whatever its model. Where each kind's start is built and
cached is ``experiment.cached_starts.RANKER_STARTS``, keyed by the same names (a test checks both
cover every kind). Adding a kind: an entry here, its start there, and its model's module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankerKind:
    """One kind of ranker policy."""

    name: str  # the value of training.ranker_kind
    scoring: bool  # scores each candidate and samples K (True), or generates its ranking as text (False)
    ranking_mode: str  # the agent.rankers mode the trained ranker ranks with
    evaluated_as: str | None  # the harness method of a method ranking with it; None: the method's own (MethodSpec.eval_method)
    settings: str | None  # the TrainConfig field of its settings (None: lora and the ranker model's)
    summary: str


RANKER_KINDS: dict[str, RankerKind] = {k.name: k for k in (
    RankerKind("llm", scoring=False, ranking_mode="llm", evaluated_as=None, settings=None,
               summary="the generative LLM ranker (the paper's): a LoRA adapter writing <rerank> lists"),
    RankerKind("cross_encoder", scoring=True, ranking_mode="scorer_policy", evaluated_as="agent_scorer",
               settings="cross_encoder", summary="a trainable cross-encoder (Table 3's ablation, models.cross_encoder)"),
    RankerKind("llm_judge", scoring=True, ranking_mode="scorer_policy", evaluated_as="agent_scorer",
               settings="llm_judge", summary="the ranker LLM judging each candidate (its own LoRA adapter, "
                                             "models.llm_judge), trained listwise before GRPO (issue 35)"),
)}

#: The kinds that rank by scoring each candidate (:attr:`RankerKind.scoring`).
SCORING_RANKER_KINDS = tuple(name for name, kind in RANKER_KINDS.items() if kind.scoring)


def ranker_kind(name: str) -> RankerKind:
    """The kind named ``name``; KeyError listing the kinds otherwise."""
    try:
        return RANKER_KINDS[name]
    except KeyError:
        raise KeyError(f"unknown ranker kind {name!r}; expected one of {sorted(RANKER_KINDS)}") from None


__all__ = ["RANKER_KINDS", "SCORING_RANKER_KINDS", "RankerKind", "ranker_kind"]
