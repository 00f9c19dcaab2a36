"""Rule-based rewards of CoSearch: the agent's Eq. 4 and the ranker's composite Eq. 6.

Both are plain functions over the rollout records (:class:`~cosearch_lib.agent.rollout.Trajectory`,
:class:`~cosearch_lib.agent.rollout.RankerCall`); nothing here touches a model.

* :func:`agent_reward` / :func:`agent_rewards` - Eq. 4: token F1 of the answer if every agent turn
  followed the protocol, else ``-alpha``.
* :func:`relevance_reward` - ``r_rel`` of one ranker call: mean Hit@{1,3,5} of the K passages shown
  to the agent (or nDCG@K, the paper's ablation).
* :func:`ranker_rewards` - Eq. 6 (``variant="paper"``) or the authors' released code
  (``variant="released"``), one :class:`RankerReward` per ranker call, with the branch taken.

Departures and choices where the paper is silent (each also stated on the field or function):

* **Invalid ranker output, paper variant.** The paper does not say. The agent was shown the
  retriever's top-K fallback, which is what ``RankerCall.order`` already holds, so ``r_rel`` is
  computed on that list and Eq. 6 applies unchanged. ``penalize_invalid_ranker=True`` gives such a
  call ``invalid_ranker_penalty`` instead, as the released code does.
* **Agent format failure, "penalize".** The released code keeps these calls and feeds the agent's
  Eq. 4 score (``-alpha``) into the composite as the agent term. Under the released variant that
  score is binarised (``-alpha >= 0.8`` is false), so ``r_main = 0``; under the paper variant with
  ``agent_format_fail="penalize"``, ``r_main = -alpha`` enters Eq. 6 as is (so an easy call with
  ``r_rel > gamma`` gets ``r_rel - alpha``, a hard call gets ``-alpha``).
* **Order of the rules.** Filtering (agent format) is checked first, then the invalid-output
  penalty, then the Eq. 6 branches; the ablations replace only the Eq. 6 branches.
* **Filtered calls** carry ``reward = nan`` and ``kept = False``; semantic grouping skips them.
* **Released variant, hard calls** (``I_ans = 0``): the release adds ``r_rel + binarised r_main``;
  with no relevant candidate ``r_rel`` is 0 for both Hit and nDCG, so this is ``r_main``, as on paper.
* ``gamma`` is unused by the released variant (it uses ``released_rel_threshold`` with ``>=``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cosearch_lib.config import AgentRewardConfig, RankerRewardConfig
from cosearch_lib.metrics import max_token_f1, mean_hit, ndcg_at_k

# Which rule produced a ranker call's reward (RankerReward.reason).
REASON_FILTERED = "filtered: agent format"
REASON_INVALID = "invalid ranker output"
REASON_EASY_REL_ONLY = "easy, r_rel below threshold: r_rel"
REASON_EASY_REL_PLUS_MAIN = "easy, r_rel above threshold: r_rel + r_main"
REASON_HARD_MAIN = "hard: r_main"
REASON_ABLATION_REL = "ablation w/o r_main: r_rel"
REASON_ABLATION_MAIN = "ablation w/o r_rel: r_main"


def agent_reward(traj, alpha: float = 0.2, yes_no_rule: bool = True, arithmetic: str = "overlap") -> float:
    """Eq. 4: max token F1 of the answer over the golds if ``traj.format_ok``, else ``-alpha``.

    ``format_ok`` (see :class:`~cosearch_lib.agent.rollout.Trajectory`) means every turn followed the
    protocol (the rule set's: strict, or the release's tag counts) and the trajectory ended with an
    answer; a missing answer therefore never scores F1. ``arithmetic``: the rule set's F1 arithmetic.
    """
    if not traj.format_ok:
        return -float(alpha)
    if traj.answer is None:
        return 0.0
    return max_token_f1(traj.answer, traj.golds, yes_no_rule=yes_no_rule, arithmetic=arithmetic)


def agent_rewards(trajs: Sequence, cfg: AgentRewardConfig | None = None, **fields) -> list[float]:
    """:func:`agent_reward` of each trajectory, in order, under ``cfg`` (or :class:`AgentRewardConfig` ``fields``)."""
    c = cfg if cfg is not None else AgentRewardConfig(**fields)
    return [agent_reward(t, c.alpha, c.uses_yes_no_rule, c.rules.f1_arithmetic) for t in trajs]


@dataclass
class RankerReward:
    """The reward of one ranker call and how it was reached."""

    reward: float  # r_rank (nan when not kept)
    r_rel: float  # relevance term of the shown list
    r_main: float  # agent term as it enters the composite (binarised under the released variant)
    i_ans: int  # 1 if any of the N candidates contains a gold answer
    kept: bool  # False = not trained on (agent format failed under the "filter" policy)
    reason: str  # which rule set the reward (one of the REASON_* constants)
    traj_id: str = ""  # the trajectory that made the call
    turn: int = -1  # the agent turn that issued the search


def relevance_reward(call, cfg: RankerRewardConfig | None = None) -> float:
    """``r_rel`` of one call, computed on the K passages the agent was shown (``call.order``).

    ``relevance="hit"``: mean Hit@k over ``cfg.hit_ks`` (paper: {1, 3, 5}). ``relevance="judge"``:
    the same over an LLM judge's labels of the shown passages (``call.judged``, set by
    :func:`cosearch_lib.rl.judge.judge_calls`; the paper's LLM-as-judge ablation). ``relevance="ndcg"``:
    nDCG@K with binary gains, K = ``len(call.order)``, normalised against the best list that could
    be built from all N candidates (``ndcg_ideal="pool"``) or from the K shown ones (``"shown"``).
    An empty shown list scores 0. For an invalid output ``order`` is the retriever's top-K fallback.
    """
    cfg = cfg or RankerRewardConfig()
    n = len(call.relevant)
    bad = [i for i in call.order if not 0 <= i < n]
    if bad:
        raise ValueError(f"ranker call {getattr(call, 'traj_id', '?')} turn {getattr(call, 'turn', '?')}: "
                         f"order holds indices {bad} outside 0..{n - 1} (the {n} candidates)")
    shown = [call.relevant[i] for i in call.order]
    if not shown:
        return 0.0
    return RELEVANCE_SCORES[cfg.relevance](call, shown, cfg)


def _judged_hits(call, shown: list[int], cfg: RankerRewardConfig) -> float:
    judged = getattr(call, "judged", None)
    if judged is None or len(judged) != len(shown):
        raise ValueError(f"relevance='judge' needs the judge's labels of the {len(shown)} shown passages "
                         f"(rl.judge.judge_calls before the rewards); call {getattr(call, 'traj_id', '?')} has {judged!r}")
    return mean_hit(list(judged), cfg.hit_ks)


def _ndcg(call, shown: list[int], cfg: RankerRewardConfig) -> float:
    return ndcg_at_k(shown, len(shown), ideal_labels=call.relevant if cfg.ndcg_ideal == "pool" else None)


#: r_rel by ``RankerRewardConfig.relevance``: (call, relevance labels of the shown passages, settings)
#: -> score. A new relevance reward is one entry here plus its name in the config's choices.
RELEVANCE_SCORES: dict[str, Callable[[Any, list[int], RankerRewardConfig], float]] = {
    "hit": lambda call, shown, cfg: mean_hit(shown, cfg.hit_ks),
    "ndcg": _ndcg,
    "judge": _judged_hits,
}


def main_reward(traj, cfg: RankerRewardConfig | None = None, agent_cfg: AgentRewardConfig | None = None) -> float:
    """``r_main`` of a trajectory's ranker calls: its Eq. 4 agent reward; binarised under the released variant.

    Released: ``1.0 if agent_reward >= released_f1_threshold else 0.0`` (so a format failure, -alpha,
    becomes 0).
    """
    cfg = cfg or RankerRewardConfig()
    agent_cfg = agent_cfg or AgentRewardConfig()
    f = agent_rewards([traj], agent_cfg)[0]
    if cfg.form == "released":
        return 1.0 if f >= cfg.released_f1_threshold else 0.0
    return f


def _composite(cfg: RankerRewardConfig, i_ans: int, r_rel: float, r_main: float) -> tuple[float, str]:
    """The Eq. 6 branches (or their released / ablation forms) for a kept, scorable call."""
    if not cfg.use_rel:
        return r_main, REASON_ABLATION_MAIN
    if not cfg.use_main:
        return r_rel, REASON_ABLATION_REL
    if not i_ans:
        return r_main, REASON_HARD_MAIN
    if cfg.form == "paper":
        above = r_rel > cfg.gamma
    else:
        above = r_rel >= cfg.released_rel_threshold
    if above:
        return r_rel + r_main, REASON_EASY_REL_PLUS_MAIN
    return r_rel, REASON_EASY_REL_ONLY


def ranker_rewards(trajs: Sequence, cfg: RankerRewardConfig | None = None, *,
                   agent_cfg: AgentRewardConfig | None = None) -> list[RankerReward]:
    """One :class:`RankerReward` per ranker call, aligned with ``[c for t in trajs for c in t.ranker_calls]``.

    That is: trajectories in the given order, and within each its calls in turn order. Per call:

    1. agent format failed -> "filter": ``kept=False``, ``reward=nan``; "penalize": go on, with
       the failed trajectory's ``r_main`` (paper: ``-alpha``; released: 0);
    2. invalid ranker output and invalid outputs penalised -> ``invalid_ranker_penalty``;
    3. Eq. 6 (paper): ``I_ans=1, r_rel <= gamma -> r_rel``; ``I_ans=1, r_rel > gamma -> r_rel + r_main``;
       ``I_ans=0 -> r_main``. Released: the same with ``r_rel >= released_rel_threshold`` and a
       binarised ``r_main``. Ablations: ``use_main=False -> r_rel``; ``use_rel=False -> r_main``.

    ``r_main`` is the trajectory's agent reward under ``agent_cfg`` (keep its ``alpha`` equal to
    the one the agent is trained with).
    """
    cfg = cfg or RankerRewardConfig()
    agent_cfg = agent_cfg or AgentRewardConfig()
    out: list[RankerReward] = []
    for traj in trajs:
        if not traj.ranker_calls:
            continue
        r_main = main_reward(traj, cfg, agent_cfg)
        filtered = not traj.format_ok and cfg.format_fail_policy == "filter"
        for call in traj.ranker_calls:
            r_rel = relevance_reward(call, cfg)
            i_ans = int(call.i_ans)
            if filtered:
                reward, reason, kept = math.nan, REASON_FILTERED, False
            elif not call.valid and cfg.invalid_penalized:
                reward, reason, kept = float(cfg.invalid_ranker_penalty), REASON_INVALID, True
            else:
                reward, reason = _composite(cfg, i_ans, r_rel, r_main)
                kept = True
            out.append(RankerReward(reward=reward, r_rel=r_rel, r_main=r_main, i_ans=i_ans, kept=kept,
                                    reason=reason, traj_id=call.traj_id, turn=call.turn))
    return out


#: One line per reward quantity this module produces (the project keeps a glossary of every logged metric).
REWARD_GLOSSARY: dict[str, str] = {
    "agent_reward": "Eq. 4: max token F1 of the answer over the golds if every agent turn followed the protocol, "
                    "else -alpha.",
    "reward": "r_rank of one ranker call (Eq. 6 or its released / ablation form); nan for calls not kept.",
    "r_rel": "relevance term: mean Hit@{1,3,5} (or nDCG@K, or Hit over an LLM judge's labels) of the K passages the agent was shown "
             "(the retriever's top-K when the ranker output was invalid).",
    "r_main": "agent term as it enters the ranker reward: the trajectory's Eq. 4 reward (paper) or "
              "1[that reward >= 0.8] (released).",
    "i_ans": "1 if any of the N retrieved candidates contains a gold answer (easy call), else 0 (hard call).",
    "kept": "whether the call is trained on; False when its trajectory broke the agent protocol under the "
            "'filter' policy.",
    "reason": "which rule set the reward: filtered, invalid ranker output, easy r_rel only, easy r_rel + r_main, "
              "hard r_main, or an ablation.",
    "traj_id": "the trajectory that made the call.",
    "turn": "0-based agent turn that issued the search.",
}
