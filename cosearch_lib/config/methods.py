"""The training methods, each a named record: how it ranks, which policies it trains, how its
policies are evaluated, and what it starts from.

A method is looked up by name (:func:`method_spec`, re-exported by ``cosearch_lib.config``) everywhere: the trainer, the wiring in
``experiment``, the report, the notebooks and the benchmarks. Nothing else switches on a
method's name, so adding a method is one :data:`METHODS` entry (plus, for a new way of ranking,
one :class:`RankedBy` member and the ranker that implements it in ``agent.rankers``).

=================  ==============  =============  ======================  ==============================
method             ranking         trains         evaluated as            paper row
=================  ==============  =============  ======================  ==============================
``search_r1``      retrieval       agent          agent_retrieval         Retrieval Only
``fixed_ranker``   ranker policy   agent          agent_fixed_ranker      Fixed Ranker (ranker frozen)
``cosearch``       ranker policy   agent, ranker  agent_trained_ranker    CoSearch
``oracle``         oracle (Eq. 7)  agent          agent_oracle            Oracle
=================  ==============  =============  ======================  ==============================

"Ranker policy" is whatever ``training.ranker_kind`` makes the ranker: the generative LLM ranker
(a LoRA adapter, the paper's) or the cross-encoder of the Table 3 ablation; a method whose
ranking is the ranker policy is then evaluated as ``agent_scorer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cosearch_lib.config.checks import invalid
from cosearch_lib.config.ranker_kinds import RANKER_KINDS

#: Roles a policy can play.
ROLES = ("agent", "ranker")


class RankedBy(str, Enum):
    """How a method turns the retriever's N candidates into the K passages the agent reads."""

    RETRIEVAL = "retrieval"  # the retriever's own top-K (no ranker)
    ORACLE = "oracle"  # answer-containing candidates first (paper Eq. 7; needs the gold answers)
    POLICY = "policy"  # the ranker policy: the LLM ranker adapter, or the cross-encoder (training.ranker_kind)


@dataclass(frozen=True)
class MethodSpec:
    """One training method."""

    name: str  # the id profiles, records and run folders use
    ranked_by: RankedBy  # how the agent's searches are ranked
    trains: tuple[str, ...]  # the roles whose policy GRPO updates (of ROLES)
    eval_method: str  # the evaluation harness method that evaluates its policies (eval.harness.EVAL_METHODS)
    warm_start: tuple[str, ...]  # the roles whose warm-started policy it starts from (a frozen ranker included)
    paper_name: str  # its row in the paper's tables
    summary: str  # one line for tables and docs

    @property
    def has_ranker_policy(self) -> bool:
        """Its searches are ranked by the ranker policy (so a ranker adapter or cross-encoder exists)."""
        return self.ranked_by is RankedBy.POLICY

    @property
    def trains_ranker(self) -> bool:
        return "ranker" in self.trains

    def trains_role(self, role: str) -> bool:
        return role in self.trains

    def evaluated_as(self, ranker_kind: str = "llm") -> str:
        """The harness method of its policies: its own, or its ranker kind's when that kind ranks for it
        (``RankerKind.evaluated_as``: a scoring ranker is evaluated by the harness's ``agent_scorer``)."""
        kind_method = RANKER_KINDS[ranker_kind].evaluated_as if self.has_ranker_policy else None
        return kind_method or self.eval_method


def _spec(name: str, ranked_by: RankedBy, trains: tuple[str, ...], eval_method: str, paper_name: str,
          summary: str) -> MethodSpec:
    warm = ("agent", "ranker") if ranked_by is RankedBy.POLICY else ("agent",)
    return MethodSpec(name, ranked_by, trains, eval_method, warm, paper_name, summary)


#: Every training method, in the order tables list them.
METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    _spec("search_r1", RankedBy.RETRIEVAL, ("agent",), "agent_retrieval", "Retrieval Only",
          "the agent reads the retriever's top-K; only the agent trains"),
    _spec("fixed_ranker", RankedBy.POLICY, ("agent",), "agent_fixed_ranker", "Fixed Ranker",
          "the agent trains; the ranker policy ranks but stays frozen at its start"),
    _spec("cosearch", RankedBy.POLICY, ("agent", "ranker"), "agent_trained_ranker", "CoSearch",
          "agent and ranker policies train jointly (composite ranker reward, semantic groups)"),
    _spec("oracle", RankedBy.ORACLE, ("agent",), "agent_oracle", "Oracle",
          "answer-containing candidates are promoted (Eq. 7); only the agent trains"),
)}

#: The method names, in table order (those registered at import; :func:`method_spec` reads :data:`METHODS` itself).
TRAINING_METHODS = tuple(METHODS)

#: The paper's findings among the trained methods, as (a, b, what a - b measures).
PAPER_FINDINGS = (("oracle", "search_r1", "the oracle gap"), ("fixed_ranker", "search_r1", "Fixed Ranker - Retrieval Only"),
                  ("cosearch", "fixed_ranker", "CoSearch - Fixed Ranker"), ("cosearch", "search_r1", "CoSearch - Retrieval Only"))


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` called ``name``; a :class:`ConfigError` naming the methods otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise invalid("training.method", name, f"one of {', '.join(METHODS)}") from None


def method_rows(names: tuple[str, ...] | list[str] = TRAINING_METHODS) -> list[dict[str, str]]:
    """One row per named method (for a table): ranking, roles trained, evaluation method, paper row."""
    specs = [method_spec(n) for n in names]
    return [{"method": s.name, "ranking": s.ranked_by.value, "trains": ", ".join(s.trains), "evaluated as": s.eval_method,
             "paper": s.paper_name, "what": s.summary} for s in specs]
