"""What GRPO optimises: the agent reward (Eq. 4), the ranker reward (Eq. 6), the ranker's groups
(Alg. 2) and the clipped loss.

A ``None`` setting here means "the rule set's choice"; each config resolves those once, when it is
built with its rule set (and again if a field is assigned later), and exposes the resolved value
under a property (:attr:`RankerRewardConfig.form`, :attr:`GroupingConfig.min_size`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosearch_lib.config.checks import KEYED_WHEN_SET, SHARED, Fields, invalid
from cosearch_lib.config.rules import PAPER_RULES, RuleSet, rule_set

_VARIANTS = ("paper", "released")
RANKER_RELEVANCE_KINDS = ("hit", "ndcg", "judge")
_NDCG_IDEAL = ("pool", "shown")
_FORMAT_FAIL = ("filter", "penalize")


class _Resolved:
    """Base of a config whose ``None`` settings resolve against its rule set: ``_resolve`` runs at the
    end of construction and again whenever a field is assigned afterwards, so the resolved values
    are computed once per change and never go stale."""

    def _resolve(self) -> dict[str, Any]:
        raise NotImplementedError

    def _resolve_now(self) -> None:
        object.__setattr__(self, "_resolved", self._resolve())

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if "_resolved" in self.__dict__ and name in self.__dataclass_fields__:
            self._resolve_now()


# --------------------------------------------------------------------------- agent reward (Eq. 4)


@dataclass
class AgentRewardConfig(_Resolved):
    alpha: float = 0.2  # format penalty: a trajectory with any protocol violation gets -alpha
    yes_no_rule: bool | None = None  # HotpotQA yes/no rule inside the reward's token F1; None = the rule set's (paper: yes, released: no)
    rules: RuleSet = field(default=PAPER_RULES, metadata=SHARED)  # F1 arithmetic: the profile's ``rules`` (a RuleSet or its name)

    def __post_init__(self) -> None:
        self.rules = rule_set(self.rules)
        check = Fields("training.agent_reward", self)
        check.numbers("alpha", low=0, why="a penalty size")
        check.bools("yes_no_rule", allow_none=True)
        self._resolve_now()

    def _resolve(self) -> dict[str, Any]:
        return {"uses_yes_no_rule": (not self.rules.released) if self.yes_no_rule is None else self.yes_no_rule}

    @property
    def uses_yes_no_rule(self) -> bool:
        """``yes_no_rule`` with None resolved: on under the paper rule set, off under the released one."""
        return self._resolved["uses_yes_no_rule"]


# --------------------------------------------------------------------------- ranker reward (Eq. 6)


#: The paper's Hit@k cutoffs of r_rel (Eq. 5), the default of every ``hit_ks``.
PAPER_HIT_KS = (1, 3, 5)


@dataclass
class RankerRewardConfig(_Resolved):
    variant: str | None = None  # "paper" (Eq. 6) or "released" (authors' code: binarised r_main, >= rule, invalid penalty); None = the rule set's
    gamma: float = 0.5  # paper: an easy call gets r_main added only when r_rel > gamma
    relevance: str = "hit"  # r_rel: "hit" (mean Hit@k over hit_ks), "ndcg" (nDCG@K of the shown list, K = len(order)) or "judge" (mean Hit@k over an LLM judge's labels of the shown passages: rl.judge)
    hit_ks: tuple[int, ...] = PAPER_HIT_KS  # Hit@k cutoffs averaged into r_rel when relevance="hit"; also the ranker Hit columns of the records (those >= K give hit@K)
    ndcg_ideal: str = "pool"  # nDCG normaliser: "pool" (best of all N candidates, as the release) or "shown" (the K)
    use_main: bool = True  # False = ablation "w/o r_main": r_rank = r_rel
    use_rel: bool = True  # False = ablation "w/o r_rel": r_rank = r_main
    released_f1_threshold: float = 0.8  # released: r_main = 1 if the agent reward >= this, else 0
    released_rel_threshold: float = 0.8  # released: an easy call gets r_main added when r_rel >= this (note >=)
    invalid_ranker_penalty: float = -0.2  # reward of an invalid ranker output, when invalid outputs are penalised
    penalize_invalid_ranker: bool | None = None  # None = variant's rule (paper: no, score the fallback; released: yes)
    agent_format_fail: str | None = None  # format-failed trajectories' calls: "filter" | "penalize"; None = variant's
    rules: RuleSet = field(default=PAPER_RULES, metadata=SHARED)  # the profile's ``rules`` (decides ``variant`` when it is None; a RuleSet or its name)

    def __post_init__(self) -> None:
        self.rules = rule_set(self.rules)
        check = Fields("training.ranker_reward", self)
        check.choice("variant", (None, *_VARIANTS))
        check.choice("relevance", RANKER_RELEVANCE_KINDS)
        check.choice("ndcg_ideal", _NDCG_IDEAL)
        check.choice("agent_format_fail", (None, *_FORMAT_FAIL))
        check.numbers("gamma", "released_f1_threshold", "released_rel_threshold", "invalid_ranker_penalty")
        check.bools("use_main", "use_rel")
        check.bools("penalize_invalid_ranker", allow_none=True)
        if not (self.use_main or self.use_rel):
            raise invalid("training.ranker_reward.use_main", self.use_main,
                          "True when use_rel is False (the ranker reward would be empty)")
        self.hit_ks = check.positive_ints("hit_ks")  # a YAML list becomes the tuple the annotation promises
        self._resolve_now()

    def _resolve(self) -> dict[str, Any]:
        form = self.variant if self.variant is not None else ("released" if self.rules.released else "paper")
        fail = self.agent_format_fail if self.agent_format_fail is not None else (
            "filter" if form == "paper" else "penalize")
        penalized = self.penalize_invalid_ranker if self.penalize_invalid_ranker is not None else form == "released"
        return {"form": form, "format_fail_policy": fail, "invalid_penalized": penalized}

    @property
    def form(self) -> str:
        """``variant`` with None resolved: "released" under the released rule set, else "paper"."""
        return self._resolved["form"]

    @property
    def format_fail_policy(self) -> str:
        """``agent_format_fail`` with ``None`` resolved: paper -> "filter", released -> "penalize"."""
        return self._resolved["format_fail_policy"]

    @property
    def invalid_penalized(self) -> bool:
        """``penalize_invalid_ranker`` with ``None`` resolved: paper -> False, released -> True."""
        return self._resolved["invalid_penalized"]


# --------------------------------------------------------------------------- grouping (Alg. 2)

_MODES = ("semantic", "exact", "none")


@dataclass
class GroupingConfig(_Resolved):
    mode: str = "semantic"  # "semantic" (Alg. 2), "exact" (identical normalised sub-query) or "none" (one group per q0)
    delta: float = 0.8  # semantic: token-F1 threshold (>=) between a sub-query and a cluster's representative
    k_min: int | None = None  # discard clusters with fewer members than this; None = the rule set's (paper: 3; release drops size <= 3, i.e. 4)
    drop_zero_variance: bool = True  # drop groups whose rewards are all equal (they carry no GRPO gradient)
    dedupe_identical: bool | None = None  # average the rewards of identical calls (same prompt and ranking); None = the rule set's (paper: no, released: yes)
    rules: RuleSet = field(default=PAPER_RULES, metadata=SHARED)  # similarity arithmetic, dedupe key, flatness test: the profile's ``rules`` (a RuleSet or its name)

    def __post_init__(self) -> None:
        self.rules = rule_set(self.rules)
        check = Fields("training.grouping", self)
        check.choice("mode", _MODES)
        check.numbers("delta", low=0, high=1, low_open=True, why="a token-F1 threshold")
        check.ints("k_min", minimum=1, allow_none=True)
        check.bools("drop_zero_variance")
        check.bools("dedupe_identical", allow_none=True)
        self._resolve_now()

    def _resolve(self) -> dict[str, Any]:
        return {"min_size": (4 if self.rules.released else 3) if self.k_min is None else self.k_min,
                "dedupe": self.rules.released if self.dedupe_identical is None else self.dedupe_identical}

    @property
    def min_size(self) -> int:
        """``k_min`` with None resolved: 3 (paper), 4 (released)."""
        return self._resolved["min_size"]

    @property
    def dedupe(self) -> bool:
        """``dedupe_identical`` with None resolved: off (paper), on (released)."""
        return self._resolved["dedupe"]


# --------------------------------------------------------------------------- the GRPO loss

#: Ways to turn per-token values into one scalar, by name (their code: ``rl.grpo_loss.LOSS_AGGREGATIONS``).
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: Those the joint trainer's micro-batched update reproduces (``LossAggregation.splits_into_micro_batches``):
#: Dr.GRPO's constant normaliser depends on the whole batch's padded shape.
MICRO_BATCHED_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


#: Where the old log-probs of the GRPO ratio come from: the generation backend as it sampled, or
#: the trainer's forward pass before the update's first optimizer step (verl's default).
OLD_LOGPROBS = ("auto", "backend", "recompute")

#: What the KL term stays near: the base model with the LoRA adapters off, or the adapters as GRPO
#: started them (a warm start; a frozen copy made before the first step, rebuilt from the start on a
#: resume). Without a warm start the two are the same policy (a fresh LoRA adapter is the base model).
KL_REFERENCES = ("base", "start")


@dataclass
class GRPOConfig:
    clip_eps: float = 0.2  # PPO clip range: ratio kept in [1 - clip_eps, 1 + eps_high] (paper: 0.2)
    clip_eps_high: float | None = None  # upper clip range; None = clip_eps (symmetric). DAPO uses 0.28
    kl_coef: float = 0.001  # weight of the k3 KL-to-reference penalty (released code: 0.001); 0 = off
    scale_std: bool = True  # divide advantages by the group std; False = mean-centring only (Dr.GRPO)
    std_eps: float = 1e-6  # added to the group std before dividing
    aggregation: str = "token-mean"  # one of AGGREGATIONS; "token-mean" = paper and released code
    old_logprobs: str = "auto"  # one of OLD_LOGPROBS: the ratio's denominator; "auto" = "recompute" unless the trainer's own model generated
    tis_cap: float | None = None  # truncated importance sampling: each token weighted by min(pi_trainer_old / pi_rollout, tis_cap); None = off
    # The KL term's reference, one of KL_REFERENCES: "start" keeps a frozen copy of each trained adapter as GRPO
    # began it (verl's reference is the actor's initial weights); null = "base", the adapters switched off.
    kl_reference: str | None = field(default=None, metadata=KEYED_WHEN_SET)

    def __post_init__(self) -> None:
        check = Fields("training.grpo", self)
        check.numbers("clip_eps", low=0, high=1, low_open=True, high_open=True)
        check.numbers("clip_eps_high", low=0, low_open=True, finite=False, allow_none=True)
        check.numbers("kl_coef", "std_eps", low=0)
        check.choice("aggregation", AGGREGATIONS)
        check.choice("old_logprobs", OLD_LOGPROBS)
        check.numbers("tis_cap", low=1, allow_none=True, why="a cap on pi_trainer / pi_rollout; 1 = weights never above 1")
        check.choice("kl_reference", (None, *KL_REFERENCES))
        if self.kl_reference == "base" or self.kl_coef == 0:
            self.kl_reference = None  # "base", or no KL term, is null: one key for one computation

    @property
    def start_reference(self) -> bool:
        """Whether the update needs frozen copies of the adapters as GRPO started them: a KL term
        (``kl_coef`` > 0) whose ``kl_reference`` is "start"."""
        return self.kl_coef > 0 and self.kl_reference == "start"

    def recomputes_old_logprobs(self, generated_by_trainer: bool) -> bool:
        """Whether the update takes the trainer's own pre-update log-probs as the old ones.

        ``generated_by_trainer``: the rollouts were sampled by the trainer's model in its dtype (the
        transformers backend), so the backend's log-probs are the trainer's up to kernel noise."""
        if self.old_logprobs == "auto":
            return not generated_by_trainer
        return self.old_logprobs == "recompute"

    @property
    def eps_high(self) -> float:
        """The upper clip range actually used."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high
