"""Paired bootstrap confidence intervals over questions, for every method comparison.

Two methods evaluated on the same questions (same seeds) are compared question by question. The
questions are resampled with replacement, *stratified by family* (``dataset``: each resample keeps
every family's question count, so the paper's macro average over families is resampled as it is
computed), and the statistic of both methods is recomputed on the SAME resampled questions. The
reported interval is the percentile interval of the difference over the resamples; ``p_le_0`` is
the share of resamples in which the difference is <= 0 (one-sided).

Statistics: ``"macro"``, the mean over families of each family's mean over questions (the paper's
"avg", as the ``avg`` column of ``tables.summary_table``), and ``"mean"``, the plain mean over
questions. A question with several samples counts once: its samples are averaged first.

A stratified bootstrap sees no spread inside a family that has one question, so every family needs
at least :data:`MIN_PER_FAMILY` questions. With fewer the functions refuse (ValueError), or, with
``when_too_few="note"``, give the estimates without an interval and say why in ``note``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import pandas as pd

from cosearch_lib.seeding import rng

STATISTICS = ("macro", "mean")
N_RESAMPLES = 2000
LEVEL = 0.95
#: Questions a family needs before a family-stratified bootstrap can show its spread.
MIN_PER_FAMILY = 2

TooFew = Literal["raise", "note"]


@dataclass(frozen=True)
class BootstrapInterval:
    """One method's statistic over the questions and its percentile bootstrap interval."""

    estimate: float
    ci_low: float  # NaN when no interval could be given (see note)
    ci_high: float
    n_questions: int
    n_families: int
    level: float
    note: str | None = None  # why there is no interval; None when there is one


@dataclass(frozen=True)
class PairedInterval:
    """Method a against method b on the same questions: estimates, a - b, and its interval."""

    estimate_a: float
    estimate_b: float
    diff: float  # estimate_a - estimate_b
    ci_low: float  # percentile interval of the resampled differences; NaN when none (see note)
    ci_high: float
    p_le_0: float  # share of resamples with a - b <= 0; NaN when no interval
    n_questions: int
    n_families: int
    level: float
    note: str | None = None

    def excludes_zero(self) -> bool:
        return interval_excludes_zero(self.ci_low, self.ci_high)


# --------------------------------------------------------------------------- arrays


def sample_problem(families: Sequence[Any]) -> str | None:
    """Why a family-stratified bootstrap cannot give an interval for questions of these families
    (one entry per question); None when it can."""
    sizes = Counter(families)
    n = sum(sizes.values())
    if n < 2:
        return f"{n} question(s); an interval needs at least 2"
    small = sorted(str(f) for f, k in sizes.items() if k < MIN_PER_FAMILY)
    if small:
        shown = ", ".join(small[:3]) + (", ..." if len(small) > 3 else "")
        return (f"{len(small)} of {len(sizes)} families have fewer than {MIN_PER_FAMILY} questions ({shown}); "
                f"a family-stratified bootstrap cannot show their spread; evaluate at least {MIN_PER_FAMILY} per family "
                f"(n_per_dataset)")
    return None


@dataclass(frozen=True)
class _Layout:
    order: np.ndarray  # question positions sorted by family
    start: np.ndarray  # per sorted question: first column of its family
    size: np.ndarray  # per sorted question: its family's question count
    weights: np.ndarray  # statistic = scores[order] @ weights
    n_families: int


def _layout(families: Sequence[Any], statistic: str, stratify: bool) -> _Layout:
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; expected one of {STATISTICS}")
    if statistic == "macro" and not stratify:
        raise ValueError("the macro mean over families needs a stratified bootstrap (stratify=True)")
    n = len(families)
    if n == 0:
        raise ValueError("no questions to bootstrap")
    codes = np.unique(np.asarray([str(f) for f in families]), return_inverse=True)[1].ravel()
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    sorted_codes = codes[order]
    size = sizes[sorted_codes]
    weights = 1.0 / (len(sizes) * size) if statistic == "macro" else np.full(n, 1.0 / n)
    start, size = (starts[sorted_codes], size) if stratify else (np.zeros(n, dtype=int), np.full(n, n))
    return _Layout(order, start, size, weights, len(sizes))


def _index_matrix(layout: _Layout, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n) positions into the family-sorted scores: column j always draws from the
    family of sorted question j, so every resample keeps each family's count."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    draws = rng("paired-bootstrap", seed).integers(0, layout.size, size=(n_resamples, len(layout.size)))
    return layout.start + draws


def _percentile(values: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def _scores(values: Any, n: int, name: str) -> np.ndarray:
    scores = np.asarray(values, dtype=float)
    if scores.shape != (n,):
        raise ValueError(f"{name} has shape {scores.shape}; expected ({n},), one score per question")
    if np.isnan(scores).any():
        raise ValueError(f"{name} has {int(np.isnan(scores).sum())} NaN score(s); drop or fill them first")
    return scores


def _check_problem(families: Sequence[Any], stratify: bool, when_too_few: TooFew) -> str | None:
    if when_too_few not in ("raise", "note"):
        raise ValueError(f"when_too_few must be 'raise' or 'note', got {when_too_few!r}")
    problem = sample_problem(families if stratify else [""] * len(families))
    if problem and when_too_few == "raise":
        raise ValueError(f"no bootstrap interval: {problem}")
    return problem


def bootstrap_interval(scores: Any, families: Sequence[Any], *, statistic: str = "macro", level: float = LEVEL,
                       n_resamples: int = N_RESAMPLES, seed: int = 0, stratify: bool = True,
                       when_too_few: TooFew = "raise") -> BootstrapInterval:
    """One method: ``statistic`` of per-question ``scores`` (one per question, ``families`` alike)
    with its percentile interval over ``n_resamples`` family-stratified resamples of the questions."""
    layout = _layout(families, statistic, stratify)
    values = _scores(scores, len(families), "scores")[layout.order]
    estimate = float(values @ layout.weights)
    problem = _check_problem(families, stratify, when_too_few)
    if problem:
        return BootstrapInterval(estimate, math.nan, math.nan, len(values), layout.n_families, level, problem)
    stats = values[_index_matrix(layout, n_resamples, seed)] @ layout.weights
    low, high = _percentile(stats, level)
    return BootstrapInterval(estimate, low, high, len(values), layout.n_families, level)


def paired_bootstrap(scores_a: Any, scores_b: Any, families: Sequence[Any], *, statistic: str = "macro",
                     level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0, stratify: bool = True,
                     when_too_few: TooFew = "raise") -> PairedInterval:
    """Method a against method b, question by question (``scores_a[i]`` and ``scores_b[i]`` belong to
    the same question, of family ``families[i]``): both statistics on the same resampled questions,
    the percentile interval of a - b and the share of resamples where a - b <= 0."""
    layout = _layout(families, statistic, stratify)
    a = _scores(scores_a, len(families), "scores_a")[layout.order]
    b = _scores(scores_b, len(families), "scores_b")[layout.order]
    est_a, est_b = float(a @ layout.weights), float(b @ layout.weights)
    problem = _check_problem(families, stratify, when_too_few)
    if problem:
        return PairedInterval(est_a, est_b, est_a - est_b, math.nan, math.nan, math.nan, len(a), layout.n_families,
                              level, problem)
    diffs = (a - b)[_index_matrix(layout, n_resamples, seed)] @ layout.weights
    low, high = _percentile(diffs, level)
    return PairedInterval(est_a, est_b, est_a - est_b, low, high, float(np.mean(diffs <= 0)), len(a),
                          layout.n_families, level)


# --------------------------------------------------------------------------- records


def question_scores(records: pd.DataFrame, method: str, metric: str = "f1", family: str = "dataset") -> pd.Series:
    """One method's ``metric`` per question, its samples averaged, indexed by (family, question_id), sorted."""
    part = records[records["method"] == method]
    if part.empty:
        raise ValueError(f"no records for method {method!r}; have {sorted(set(records['method']))}")
    return part.groupby([family, "question_id"])[metric].mean().astype(float).sort_index()


def _examples(index: pd.Index) -> str:
    return ", ".join("/".join(map(str, key)) for key in list(index[:3])) + (", ..." if len(index) > 3 else "")


def paired_scores(records: pd.DataFrame, a: str, b: str, metric: str = "f1",
                  family: str = "dataset") -> tuple[pd.Series, pd.Series]:
    """The two methods' per-question scores, aligned; ValueError unless they cover the same questions."""
    sa, sb = question_scores(records, a, metric, family), question_scores(records, b, metric, family)
    if not sa.index.equals(sb.index):
        only_a, only_b = sa.index.difference(sb.index), sb.index.difference(sa.index)
        raise ValueError(f"{a!r} and {b!r} do not cover the same questions, so they cannot be paired: "
                         f"{len(only_a)} only in {a!r} ({_examples(only_a)}), {len(only_b)} only in {b!r} "
                         f"({_examples(only_b)})")
    return sa, sb


def compare_methods(records: pd.DataFrame, a: str, b: str, *, metric: str = "f1", statistic: str = "macro",
                    level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0, family: str = "dataset",
                    when_too_few: TooFew = "raise") -> PairedInterval:
    """:func:`paired_bootstrap` of a - b on evaluation records (one row per method, question, sample)."""
    sa, sb = paired_scores(records, a, b, metric, family)
    return paired_bootstrap(sa.to_numpy(), sb.to_numpy(), sa.index.get_level_values(family), statistic=statistic,
                            level=level, n_resamples=n_resamples, seed=seed, when_too_few=when_too_few)


def method_interval(records: pd.DataFrame, method: str, *, metric: str = "f1", statistic: str = "macro",
                    level: float = LEVEL, n_resamples: int = N_RESAMPLES, seed: int = 0, family: str = "dataset",
                    when_too_few: TooFew = "raise") -> BootstrapInterval:
    """:func:`bootstrap_interval` of one method on evaluation records. With the same seed and
    questions it draws the same resamples as :func:`compare_methods`."""
    scores = question_scores(records, method, metric, family)
    return bootstrap_interval(scores.to_numpy(), scores.index.get_level_values(family), statistic=statistic,
                              level=level, n_resamples=n_resamples, seed=seed, when_too_few=when_too_few)


def questions_for_power(records: pd.DataFrame, a: str, b: str, *, metric: str = "f1", power: float = 0.8,
                        level: float = LEVEL, family: str = "dataset") -> dict[str, float]:
    """How many test questions a paired comparison of a and b needs to show the difference these
    records measured (a two-sided test at ``level``, with probability ``power``), for the macro
    average over families with equal questions per family: the normal approximation
    n_per_family = ((z_(1-alpha/2) + z_power) * sqrt(sum_f var_f) / (F * |diff|))^2, where var_f is
    the variance of the per-question differences inside family f and diff the measured macro
    difference. Returns ``diff``, ``per_family`` and ``questions`` (= F x per_family; inf when the
    difference is 0), and the ``n_questions`` it was measured on."""
    if not 0 < power < 1 or not 0 < level < 1:
        raise ValueError(f"power and level must lie in (0, 1), got {power} and {level}")
    sa, sb = paired_scores(records, a, b, metric, family)
    diffs = (sa - sb).groupby(level=family)
    if (diffs.size() < MIN_PER_FAMILY).any():
        raise ValueError(f"every family needs >= {MIN_PER_FAMILY} questions to estimate its variance; have "
                         f"{diffs.size().to_dict()}")
    n_families, diff = diffs.ngroups, float(diffs.mean().mean())
    z = NormalDist().inv_cdf(1 - (1 - level) / 2) + NormalDist().inv_cdf(power)
    spread = math.sqrt(float(diffs.var(ddof=1).sum())) / n_families
    per_family = math.ceil((z * spread / abs(diff)) ** 2) if diff else math.inf
    return {"diff": diff, "per_family": per_family, "questions": per_family * n_families if diff else math.inf,
            "n_questions": int(len(sa))}


# --------------------------------------------------------------------------- sentences


def interval_excludes_zero(low: float, high: float) -> bool:
    """True when the interval lies entirely above or entirely below 0 (False for a missing one)."""
    return bool(low > 0 or high < 0)


def metric_label(metric: str, statistic: str = "macro") -> str:
    """``"f1"`` -> ``"avg F1"`` (macro, the paper's avg) or ``"mean F1"`` (plain mean over questions)."""
    name = metric.upper() if metric in ("f1", "em") else metric
    return f"{'avg' if statistic == 'macro' else 'mean'} {name}"


def verdict(row: Mapping[str, Any], *, a: str | None = None, b: str | None = None, metric: str = "f1",
            statistic: str = "macro", level: float = LEVEL, unit: str = "questions") -> str:
    """A plain-language reading of one comparison (keys diff, ci_low, ci_high, n_questions and, unless
    given, a and b; optional note), e.g. ``"agent_oracle - agent_retrieval = +0.071 avg F1 (95% CI
    +0.020 to +0.125, 140 questions): the interval excludes 0, agent_oracle scores higher"``."""
    a, b = a or row["a"], b or row["b"]
    head = f"{a} - {b} = {row['diff']:+.3f} {metric_label(metric, statistic)}"
    n = f"{int(row['n_questions'])} {unit}"
    low, high = row["ci_low"], row["ci_high"]
    if pd.isna(low) or pd.isna(high):
        return f"{head} ({n}): no interval, {row.get('note') or 'none computed'}"
    ci = f"{level * 100:g}% CI {low:+.3f} to {high:+.3f}, {n}"
    if interval_excludes_zero(low, high):
        return f"{head} ({ci}): the interval excludes 0, {a if low > 0 else b} scores higher"
    return f"{head} ({ci}): the interval includes 0: no difference shown at this sample size"


def verdicts(table: pd.DataFrame) -> list[str]:
    """:func:`verdict` for every row of a comparison table (``tables.comparison_table`` or
    ``tables.oracle_gap_intervals``; metric, statistic and level from its ``attrs``), then one line
    per pair the table left out."""
    attrs = table.attrs
    settings = {k: attrs[k] for k in ("metric", "statistic", "level", "unit") if k in attrs}
    lines = []
    for label, row in table.iterrows():
        if "a" in row:
            lines.append(verdict(row, **settings))
        else:  # one row per hop group: the pair is the table's
            lines.append(f"{label}: {verdict(row, a=attrs['a'], b=attrs['b'], **settings)}")
    return lines + [f"not compared: {why}" for why in attrs.get("skipped", [])]
