"""GRPO groups for the ranker: semantic grouping of ranker calls (paper Alg. 2) and its ablations.

The ranker gets no rollouts of its own: the calls made while the agent rolled out its G
trajectories per question are reused. A GRPO group must hold calls that answer "the same
request", so the advantages compare like with like:

1. **Pool** the kept calls by ``question_id`` (pass one training step's calls at a time).
2. **Split** each pool by ``I_ans``: easy (a gold answer is among the N candidates) and hard.
3. **Cluster** each split greedily, in call order: normalise the sub-query
   (:func:`~cosearch_lib.metrics.normalize_query`); join the first cluster whose *representative*
   (its first member) has :func:`~cosearch_lib.metrics.query_token_f1` ``>= delta`` with it, else
   open a new cluster with this call as representative.
4. **Filter**: drop clusters smaller than ``k_min``; then (optionally) drop clusters whose rewards
   are all equal, which would give zero advantages and no gradient.

Modes: ``"semantic"`` (the above), ``"exact"`` (clusters = identical normalised sub-queries,
still split by ``I_ans``, as the release's exact-match grouping), ``"none"`` (the paper's
"w/o semantic grouping" ablation: every kept call of one q0 forms a single group; *not* split by
``I_ans``, since the paper's ablation states one group per q0).

Departures and choices where the paper is silent (the paper rule set; ``rules: released`` switches
each to the authors' code, config.RuleSet and docs/METHOD.md "Rule sets"):

* ``k_min`` None: 3 under the paper rules; 4 under the released ones (the release drops groups of
  size <= 3).
* A sub-query that normalises to the empty string never joins a cluster and nothing joins it
  (its token F1 is 0 with everything); in ``"exact"`` mode empty sub-queries are kept apart too,
  for the same behaviour (released: ``empty_subqueries="together"``, the release's exact-match keys
  put them in one group).
* ``dedupe_identical`` (None: off for the paper, on for the release): inside each cluster, calls with
  the same prompt ids and the same output (:func:`dedupe_key`) get the mean of their rewards, *before*
  the filters (so the zero-variance check sees the averaged rewards). The output key is ``order`` for
  valid outputs, with all invalid outputs sharing one key (their ``order`` is only the retriever
  fallback); released: the raw text of the first ``<rerank>`` block.
* "All rewards equal" (:func:`is_flat`) is tested with a tolerance of 1e-9, so averaging noise does
  not keep a group whose advantages would all be ~0 (released: exact float equality).
* Groups are listed in order of their first member; members in input order.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from cosearch_lib.config import RULE_SETS, GroupingConfig, RuleSet
from cosearch_lib.metrics import normalize_query, query_token_f1
from cosearch_lib.rl.rewards import RankerReward

_ZERO_VAR_TOL = 1e-9


@dataclass
class Grouping:
    """The ranker's GRPO groups for one step, with what happened along the way."""

    groups: list[list[int]]  # surviving groups: indices into the input call list
    clusters: list[list[int]]  # every cluster formed, before the size / variance filters
    rewards: list[float | None]  # reward per input call to use for advantages (deduped if asked); None if not kept
    stats: dict[str, float] = field(default_factory=dict)  # see GROUPING_GLOSSARY


def _cluster(indices: list[int], queries: dict[int, str], mode: str, delta: float,
             rules: RuleSet = RULE_SETS["paper"]) -> list[list[int]]:
    """Greedy clustering of one split (indices in call order) against each cluster's representative."""
    clusters: list[list[int]] = []
    release_keys = mode == "exact" and rules.empty_subqueries == "together"
    for i in indices:
        q = queries[i]
        home = None
        if q or release_keys:  # an empty normalised query never joins, and nothing joins it (unless release keys)
            for c in clusters:
                rep = queries[c[0]]
                if release_keys:  # the release's group keys: the query with spaces made "_", so "" meets ""
                    same = rep.replace(" ", "_") == q.replace(" ", "_")
                elif mode == "exact":
                    same = rep == q
                else:
                    same = query_token_f1(rep, q, arithmetic=rules.f1_arithmetic) >= delta
                if same:
                    home = c
                    break
        if home is None:
            clusters.append([i])
        else:
            home.append(i)
    return clusters


_FIRST_RERANK = re.compile(r"<rerank>(.*?)</rerank>", re.S)


def dedupe_key(call, key: str = "ranking") -> tuple:
    """What makes two ranker calls "the same output" for ``dedupe_identical``: the prompt ids, and
    either the parsed ranking (all invalid outputs share one) or, as the release, the stripped text
    of the first ``<rerank>`` block of the raw output ("" when there is none)."""
    if key == "rerank_text":
        found = _FIRST_RERANK.search(call.output_text or "")
        return tuple(call.prompt_ids), found.group(1).strip() if found else ""
    return tuple(call.prompt_ids), tuple(call.order) if call.valid else "invalid"


def _dedupe(cluster: list[int], calls: Sequence, rewards: list[float | None], rules: RuleSet = RULE_SETS["paper"]) -> int:
    """Average rewards of identical calls (:func:`dedupe_key`) inside one cluster; returns the extra copies."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i in cluster:
        by_key[dedupe_key(calls[i], rules.dedupe_key)].append(i)
    extra = 0
    for members in by_key.values():
        if len(members) > 1:
            mean = float(np.mean([rewards[i] for i in members]))  # as the release averages them
            for i in members:
                rewards[i] = mean
            extra += len(members) - 1
    return extra


def is_flat(rewards: Sequence[float], test: str = "tolerance") -> bool:
    """Whether a group's rewards are all equal: within 1e-9 (``"tolerance"``), or as floats compared
    exactly (``"exact"``, the release's ``len(set(...)) == 1``: 0.1 + 0.2 and 0.3 are then two values)."""
    if test == "exact":
        return len(set(rewards)) == 1
    return max(rewards) - min(rewards) <= _ZERO_VAR_TOL


def _mean_size(groups: list[list[int]]) -> float:
    return sum(map(len, groups)) / len(groups) if groups else math.nan


def group_ranker_calls(calls: Sequence, rewards: Sequence[RankerReward], cfg: GroupingConfig | None = None,
                       **overrides) -> Grouping:
    """Form the ranker's GRPO groups from one step's calls (paper Alg. 2 or an ablation).

    ``calls`` need ``question_id``, ``sub_query`` and ``i_ans`` (plus ``prompt_ids``, ``order``,
    ``valid`` when ``dedupe_identical``); ``rewards`` is aligned with them (as returned by
    :func:`~cosearch_lib.rl.rewards.ranker_rewards`) and only ``kept`` calls take part. ``overrides``
    are :class:`GroupingConfig` fields applied on top of ``cfg``.
    """
    cfg = replace(cfg or GroupingConfig(), **overrides)
    if len(calls) != len(rewards):
        raise ValueError(f"calls and rewards must be aligned: got {len(calls)} calls and {len(rewards)} rewards")

    kept = [i for i, r in enumerate(rewards) if r.kept]
    values: list[float | None] = [float(r.reward) if r.kept else None for r in rewards]
    bad = [i for i in kept if not math.isfinite(values[i])]
    if bad:
        raise ValueError(f"kept calls must have finite rewards; calls {bad[:5]} do not")

    # 1-2. pools by question (first-appearance order), split by I_ans unless mode "none"
    splits: dict[tuple, list[int]] = defaultdict(list)
    for i in kept:
        c = calls[i]
        key = (c.question_id,) if cfg.mode == "none" else (c.question_id, int(c.i_ans))
        splits[key].append(i)

    # 3. clusters
    clusters: list[list[int]] = []
    if cfg.mode == "none":
        clusters = list(splits.values())
    else:
        queries = {i: normalize_query(calls[i].sub_query) for i in kept}
        for members in splits.values():
            clusters.extend(_cluster(members, queries, cfg.mode, cfg.delta, cfg.rules))
    clusters.sort(key=lambda c: c[0])

    n_duplicates = sum(_dedupe(c, calls, values, cfg.rules) for c in clusters) if cfg.dedupe else 0

    # 4. filters: size first, then zero variance
    groups, n_small, n_flat = [], 0, 0
    for c in clusters:
        if len(c) < cfg.min_size:
            n_small += 1
            continue
        if cfg.drop_zero_variance and is_flat([values[i] for i in c], cfg.rules.zero_variance):
            n_flat += 1
            continue
        groups.append(c)

    in_groups = {i for g in groups for i in g}
    easy = [i for i in kept if int(calls[i].i_ans) == 1]
    stats = {
        "n_calls": len(calls),
        "n_kept_calls": len(kept),
        "n_pools": len({calls[i].question_id for i in kept}),
        "n_easy_calls": len(easy),
        "n_hard_calls": len(kept) - len(easy),
        "n_clusters_pre": len(clusters),
        "n_groups_post": len(groups),
        "mean_group_size_pre": _mean_size(clusters),
        "mean_group_size_post": _mean_size(groups),
        "n_dropped_small": n_small,
        "n_dropped_zero_var": n_flat,
        "n_duplicate_calls": n_duplicates,
        "calls_in_groups": len(in_groups) / len(kept) if kept else math.nan,
        "n_easy_calls_in_groups": sum(int(calls[i].i_ans) == 1 for i in in_groups),
        "n_hard_calls_in_groups": sum(int(calls[i].i_ans) == 0 for i in in_groups),
    }
    return Grouping(groups=groups, clusters=clusters, rewards=values, stats=stats)


def group_ids(grouping: Grouping, n: int) -> list[int]:
    """Group index of each of ``n`` calls (position in ``grouping.groups``), -1 for calls in no group.

    Keep only the calls with an id >= 0 (and their ``grouping.rewards``) before calling
    ``rl.grpo_loss.group_advantages``: it treats -1 as an ordinary label and refuses the None/nan of filtered calls.
    """
    top = max((i for g in grouping.groups for i in g), default=-1)
    if n <= top:
        raise ValueError(f"n={n} is too small: grouping.groups refers to call index {top}")
    ids = [-1] * n
    for gid, g in enumerate(grouping.groups):
        for i in g:
            ids[i] = gid
    return ids


#: One line per statistic in ``Grouping.stats`` (the project keeps a glossary of every logged metric).
GROUPING_GLOSSARY: dict[str, str] = {
    "n_calls": "ranker calls passed in (one training step).",
    "n_kept_calls": "calls whose reward was kept (not filtered for an agent format failure).",
    "n_pools": "distinct questions (q0) among the kept calls; each is one pool.",
    "n_easy_calls": "kept calls with I_ans = 1 (a gold answer among the N candidates).",
    "n_hard_calls": "kept calls with I_ans = 0.",
    "n_clusters_pre": "clusters formed before the size and zero-variance filters.",
    "n_groups_post": "groups that survive the filters (the ranker's GRPO groups).",
    "mean_group_size_pre": "mean cluster size before the filters (nan if there are none).",
    "mean_group_size_post": "mean size of the surviving groups (nan if there are none).",
    "n_dropped_small": "clusters dropped for having fewer than k_min members.",
    "n_dropped_zero_var": "clusters of size >= k_min dropped because all their rewards were equal.",
    "n_duplicate_calls": "with dedupe_identical: calls beyond the first in each set of identical prompt+ranking calls.",
    "calls_in_groups": "fraction of kept calls that end up in a surviving group (nan if none were kept).",
    "n_easy_calls_in_groups": "easy (I_ans = 1) calls inside surviving groups.",
    "n_hard_calls_in_groups": "hard (I_ans = 0) calls inside surviving groups.",
}
