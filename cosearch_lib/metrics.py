"""Answer and ranking metrics of CoSearch: pure functions, no torch.

Three families live here (docs/METHOD.md: rewards and evaluation):

* **Answer metrics** for the agent reward ``r_main`` and for evaluation:
  :func:`normalize_answer` (SQuAD / Search-R1 normalisation), :func:`exact_match`,
  :func:`token_f1`, :func:`max_token_f1`.
* **Pseudo-relevance** for the ranker reward: :func:`has_answer` (DPR-style token
  containment after Unicode NFD), :func:`is_trivial_answer`, :func:`relevance_labels`,
  :func:`simple_tokenize`.
* **Ranking metrics** over binary relevance labels listed in ranked order:
  :func:`hit_at_k`, :func:`recall_at_k`, :func:`mean_hit` (the paper's ``r_rel``),
  :func:`ndcg_at_k`, and :func:`shown_hits` (the records' ``hit@<k>`` and ``hit@K`` columns).
* **Sub-query similarity** for semantic grouping (docs/METHOD.md, semantic grouping):
  :func:`normalize_query`, :func:`query_token_f1`.

Conventions worth knowing (each is also stated on the function):

* Answer normalisation deletes ASCII punctuation (``"U.S."`` -> ``"us"``) *before* dropping
  articles, exactly as SQuAD and Search-R1 do. Sub-query normalisation instead drops
  articles first and turns every non-word, non-space character (Unicode-aware) into a space,
  as the authors' grouping code does.
* :func:`token_f1` applies the HotpotQA yes/no/noanswer rule by default; pass
  ``yes_no_rule=False`` for the plain token F1 of Search-R1 and the CoSearch release.
* :func:`has_answer` never counts trivial answers (yes/no/true/false) as contained, and
  never counts answers that have no tokens at all.
* Where the authors' released code computes differently, a keyword picks its rule: F1
  ``arithmetic="precision_recall"``, pseudo-relevance ``trivial="drop_if_all"`` (config.RuleSet).
  :func:`answer_f1` is the evaluation tables' F1 ("plain" by default: the paper's metric).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import regex

from cosearch_lib.config import EVAL_F1_METRICS, RULE_OPTIONS

#: Gold answers given as one string or as a list/tuple/NumPy array of strings.
Golds = str | Sequence[str] | np.ndarray

#: Normalised answers that say nothing about a passage's content (docs/METHOD.md, ranker reward).
__all__ = [
    "TRIVIAL_ANSWERS",
    "YES_NO_ANSWERS",
    "normalize_answer",
    "exact_match",
    "token_f1",
    "max_token_f1",
    "answer_f1",
    "normalize_query",
    "query_token_f1",
    "simple_tokenize",
    "is_trivial_answer",
    "has_answer",
    "relevance_labels",
    "hit_at_k",
    "recall_at_k",
    "mean_hit",
    "hit_cutoffs",
    "hit_label",
    "shown_hits",
    "ndcg_at_k",
]

TRIVIAL_ANSWERS: frozenset[str] = frozenset({"yes", "no", "true", "false"})

#: Normalised answers for which partial token credit is refused (HotpotQA's F1 rule).
YES_NO_ANSWERS: frozenset[str] = frozenset({"yes", "no", "noanswer"})

_ASCII_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_NON_WORD_NON_SPACE = re.compile(r"[^\w\s]")

# DPR-style simple tokenizer: a run of letters / digits / combining marks is one token;
# otherwise any single character that is neither a separator (\p{Z}) nor a control or other
# invisible code point (\p{C}) is a token on its own. Everything else separates tokens.
_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.UNICODE)


# --------------------------------------------------------------------------- helpers


def _as_str_list(values: Golds | Iterable[str], what: str) -> list[str]:
    """Turn one string or an iterable (list, tuple, NumPy array) of strings into a list."""
    if isinstance(values, str):
        return [values]
    if values is None:
        raise TypeError(f"{what} must be a string or a sequence of strings, got None")
    if isinstance(values, np.ndarray):
        items = values.ravel().tolist()
    else:
        try:
            items = list(values)
        except TypeError:
            raise TypeError(
                f"{what} must be a string or a sequence of strings, got {type(values).__name__}"
            ) from None
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"every element of {what} must be a string, got {type(item).__name__}: {item!r}")
    return items


def _check_k(k: int, name: str = "k") -> int:
    """Validate a rank cutoff: an integer >= 1 (bools are refused)."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= 1, got {type(k).__name__}: {k!r}")
    if k < 1:
        raise ValueError(f"{name} must be >= 1 (a rank cutoff counts positions from 1), got {k}")
    return int(k)


def _check_labels(labels: Sequence[int] | Sequence[bool] | np.ndarray, name: str = "labels") -> list[int]:
    """Validate binary relevance labels (0/1 ints or bools, NumPy scalars included) -> list of 0/1."""
    if isinstance(labels, (str, bytes)) or labels is None:
        raise TypeError(f"{name} must be a sequence of 0/1 ints or bools, got {type(labels).__name__}")
    items = labels.tolist() if isinstance(labels, np.ndarray) else list(labels)
    out: list[int] = []
    for position, value in enumerate(items):
        if isinstance(value, (bool, np.bool_)):
            out.append(int(bool(value)))
        elif isinstance(value, (int, np.integer)) and value in (0, 1):
            out.append(int(value))
        else:
            raise ValueError(
                f"{name} must contain only 0/1 ints or bools; position {position} holds {value!r} "
                f"({type(value).__name__})"
            )
    return out


#: How a token F1 is computed from the overlap (config.RULE_OPTIONS["f1_arithmetic"]).
F1_ARITHMETICS = RULE_OPTIONS["f1_arithmetic"]


def _f1_from_tokens(pred_tokens: Sequence[str], gold_tokens: Sequence[str], arithmetic: str = "overlap") -> float:
    """Harmonic mean of precision and recall of the multiset overlap of two token lists (0.0 if either is empty).

    ``arithmetic="overlap"``: 2PR / (P + R) with P = o/|pred| and R = o/|gold| is 2o / (|pred| + |gold|),
    one correctly rounded division, so 4 shared tokens out of 5 + 5 is exactly the float 0.8 and a
    ">= 0.8" threshold behaves as on paper. ``"precision_recall"``: P and R first, then 2PR / (P + R),
    in floats, as the authors' released code computes it; it can land one unit in the last place
    below the exact value (6 shared out of 7 + 8: 0.7999999999999999, not 0.8).
    """
    if arithmetic not in F1_ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {F1_ARITHMETICS}, got {arithmetic!r}")
    if not pred_tokens or not gold_tokens:
        return 0.0
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    if arithmetic == "precision_recall":
        precision = 1.0 * overlap / len(pred_tokens)
        recall = 1.0 * overlap / len(gold_tokens)
        return (2 * precision * recall) / (precision + recall)
    return 2.0 * overlap / (len(pred_tokens) + len(gold_tokens))


# --------------------------------------------------------------------------- answer metrics


def normalize_answer(s: str) -> str:
    """Normalise an answer string the SQuAD / Search-R1 way.

    In this order: lower-case; delete every ASCII punctuation character (``string.punctuation``;
    deleted, not replaced by a space, so ``"U.S."`` -> ``"us"`` and ``"don't"`` -> ``"dont"``);
    replace the whole words ``a``, ``an``, ``the`` by a space; collapse runs of whitespace to one
    space and strip the ends. Non-ASCII punctuation (curly quotes, en dashes) is kept.

    >>> normalize_answer("The  Eiffel Tower!")
    'eiffel tower'
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _ASCII_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golds: Golds) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0.

    ``golds`` may be one string or a list/tuple/NumPy array of strings; an empty list gives 0.0.
    A ``None`` prediction (no answer extracted) gives 0.0. As in SQuAD, two strings that both
    normalise to the empty string are equal (EM 1.0) - unlike :func:`token_f1`, which gives 0.0.
    """
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return 1.0 if any(pred == normalize_answer(g) for g in _as_str_list(golds, "golds")) else 0.0


def token_f1(prediction: str | None, gold: str, *, yes_no_rule: bool = True, arithmetic: str = "overlap") -> float:
    """SQuAD-style token F1 between a prediction and one gold answer.

    Both sides go through :func:`normalize_answer` and are split on whitespace. Precision =
    overlap / #prediction tokens, recall = overlap / #gold tokens, where the overlap counts
    tokens as a multiset (a token found twice in each side counts twice, once if only in one).
    F1 = 2PR / (P + R); 0.0 when there is no overlap.

    Special cases:

    * ``yes_no_rule`` (default, HotpotQA convention): if either normalised side is ``yes``,
      ``no`` or ``noanswer`` and the two normalised sides differ, the score is 0.0 (so "yes it
      is" vs "yes" gets 0, not 0.5). ``yes_no_rule=False`` gives the plain F1 used by
      Search-R1-style code and the CoSearch release.
    * An empty normalised prediction (or ``None``) gives 0.0, as does an empty normalised gold,
      even when both are empty.

    ``arithmetic`` is how the ratio is computed (:func:`_f1_from_tokens`): ``"overlap"`` (exact at
    thresholds) or ``"precision_recall"`` (the release's floats).
    """
    if prediction is None:
        return 0.0
    if not isinstance(gold, str):
        raise TypeError(f"gold must be a string, got {type(gold).__name__}; use max_token_f1 for several golds")
    pred_norm = normalize_answer(prediction)
    gold_norm = normalize_answer(gold)
    if yes_no_rule and pred_norm != gold_norm and (pred_norm in YES_NO_ANSWERS or gold_norm in YES_NO_ANSWERS):
        return 0.0
    return _f1_from_tokens(pred_norm.split(), gold_norm.split(), arithmetic)


def max_token_f1(prediction: str | None, golds: Golds, *, yes_no_rule: bool = True, arithmetic: str = "overlap") -> float:
    """Maximum of :func:`token_f1` over the gold answers (the agent's ``r_main`` before format).

    ``golds`` may be one string or a list/tuple/NumPy array of strings; no golds gives 0.0.
    """
    gold_list = _as_str_list(golds, "golds")
    return max((token_f1(prediction, g, yes_no_rule=yes_no_rule, arithmetic=arithmetic) for g in gold_list), default=0.0)


#: Answer F1 metrics of the evaluation tables (config.EvaluationConfig.f1).
ANSWER_F1_METRICS = EVAL_F1_METRICS


def answer_f1(prediction: str | None, golds: Golds, metric: str = "plain") -> float:
    """The answer F1 an evaluation table reports, maximised over the golds.

    ``"plain"``: SQuAD token F1 exactly as the paper's code computes it (no yes/no rule; P and R,
    then 2PR/(P+R) in floats), so tables sit beside the paper's numbers like for like.
    ``"yes_no"``: HotpotQA's convention: no partial credit when either side is yes/no/noanswer
    ("yes it is" against "yes": 0.0, where "plain" gives 0.5).
    """
    if metric == "plain":
        return max_token_f1(prediction, golds, yes_no_rule=False, arithmetic="precision_recall")
    if metric == "yes_no":
        return max_token_f1(prediction, golds, yes_no_rule=True)
    raise ValueError(f"metric must be one of {ANSWER_F1_METRICS}, got {metric!r}")


# --------------------------------------------------------------------------- sub-query similarity


def normalize_query(q: str) -> str:
    """Normalise a sub-query for semantic grouping (docs/METHOD.md, semantic grouping).

    In this order: lower-case; replace the whole words ``a``, ``an``, ``the`` by a space; replace
    every character that is neither a word character nor whitespace (Unicode-aware, so curly
    quotes and dashes count as punctuation; ``_`` and accented letters do not) by a space;
    collapse whitespace. Unlike :func:`normalize_answer`, punctuation becomes a space, so
    ``"U.S."`` -> ``"u s"``.
    """
    text = q.lower()
    text = _ARTICLES.sub(" ", text)
    text = _NON_WORD_NON_SPACE.sub(" ", text)
    return " ".join(text.split())


def query_token_f1(q1: str, q2: str, *, arithmetic: str = "overlap") -> float:
    """Token-level F1 (ROUGE-1 F1) between two sub-queries after :func:`normalize_query`.

    Symmetric in its arguments (under both arithmetics: IEEE sums and products commute). Multiset
    overlap as in :func:`token_f1`, but without the yes/no rule. If either normalised query is empty
    the score is 0.0 (so empty queries never join a cluster), matching the authors' grouping code.
    """
    return _f1_from_tokens(normalize_query(q1).split(), normalize_query(q2).split(), arithmetic)


# --------------------------------------------------------------------------- pseudo-relevance


def simple_tokenize(text: str, *, lowercase: bool = False) -> list[str]:
    """DPR-style tokens of ``text`` (no Unicode normalisation is applied here).

    A token is a maximal run of letters, digits and combining marks, or any single other
    character that is not whitespace/separator and not a control/format character. So
    ``"U.S. $5"`` -> ``["U", ".", "S", ".", "$", "5"]``.
    """
    tokens = _TOKEN.findall(text)
    return [t.lower() for t in tokens] if lowercase else tokens


def _containment_tokens(text: str) -> list[str]:
    """NFD-normalise, tokenise and lower-case, the way DPR's has_answer prepares both sides."""
    return simple_tokenize(unicodedata.normalize("NFD", text), lowercase=True)


def is_trivial_answer(answer: str) -> bool:
    """True if the answer, after :func:`normalize_answer`, is ``yes``, ``no``, ``true`` or ``false``.

    Such answers occur in almost any passage, so they are useless as relevance evidence.
    """
    return normalize_answer(answer) in TRIVIAL_ANSWERS


#: Which gold answers pseudo-relevance ignores (config.RULE_OPTIONS["trivial_golds"]).
TRIVIAL_GOLD_RULES = RULE_OPTIONS["trivial_golds"]


def _answer_sequences(answers: Golds, trivial: str = "drop_each") -> list[list[str]]:
    """Token sequences of the answers that can count as contained (see :func:`has_answer`)."""
    answer_list = _as_str_list(answers, "answers")
    if trivial == "drop_each":
        kept = [a for a in answer_list if not is_trivial_answer(a)]
    elif trivial == "drop_if_all":  # the release: lower-case and strip only; all golds stay unless every one is trivial
        kept = [] if all(a.lower().strip() in TRIVIAL_ANSWERS for a in answer_list) else answer_list
    else:
        raise ValueError(f"trivial must be one of {TRIVIAL_GOLD_RULES}, got {trivial!r}")
    return [tokens for tokens in map(_containment_tokens, kept) if tokens]


def _contains_any(text_tokens: Sequence[str], sequences: Sequence[Sequence[str]]) -> bool:
    """True if any sequence occurs as a contiguous run inside ``text_tokens``."""
    n = len(text_tokens)
    for seq in sequences:
        m = len(seq)
        first = seq[0]
        for start in range(n - m + 1):
            if text_tokens[start] == first and list(text_tokens[start : start + m]) == list(seq):
                return True
    return False


def has_answer(text: str, answers: Golds, *, trivial: str = "drop_each") -> bool:
    """DPR-style pseudo-relevance: does ``text`` contain any gold answer as a token sequence?

    Text and answers are Unicode NFD-normalised (so composed and decomposed forms of "Zoë" or
    "Škoda" match each other; accents are *not* stripped, so "Zoe" does not match "Zoë"),
    tokenised with :func:`simple_tokenize` and lower-cased. An answer is contained if its token
    sequence occurs contiguously among the text's tokens, which respects token boundaries:
    "Paris" is not in "Parisian", "1843" is not in "18435", "New York" is in "New York City".

    Trivial answers (:func:`is_trivial_answer`: yes/no/true/false) never count as contained,
    and neither do answers with no tokens (DPR's own loop would match those everywhere). So if
    every answer is trivial (or there are none) the result is always ``False``. That is
    ``trivial="drop_each"``; ``"drop_if_all"`` is the authors' released rule: a gold is trivial
    when its lower-cased, stripped form is one of those words ("Yes." is not), and trivial golds
    are dropped only when every gold is trivial; otherwise all of them, trivial ones included,
    are looked for (so ["yes", "Paris"] is found in a passage saying "yes").
    """
    sequences = _answer_sequences(answers, trivial)
    if not sequences:
        return False
    return _contains_any(_containment_tokens(text), sequences)


def relevance_labels(passages_texts: Sequence[str] | Iterable[str], answers: Golds, *,
                     trivial: str = "drop_each") -> list[int]:
    """Binary relevance label (1 = :func:`has_answer`, same ``trivial`` rule) for each passage, in order.

    The answers are tokenised once for all passages. Passages are plain strings (pass the
    title-plus-text form you want judged).
    """
    texts = _as_str_list(passages_texts, "passages_texts")
    sequences = _answer_sequences(answers, trivial)
    if not sequences:
        return [0] * len(texts)
    return [int(_contains_any(_containment_tokens(t), sequences)) for t in texts]


# --------------------------------------------------------------------------- ranking metrics


def hit_at_k(labels: Sequence[int] | Sequence[bool] | np.ndarray, k: int) -> float:
    """Hit@k: 1.0 if any of the first ``k`` labels (in ranked order) is relevant, else 0.0.

    If ``k`` exceeds the list length the whole list is used; an empty list gives 0.0.
    Raises ``ValueError`` for ``k < 1`` or labels that are not 0/1 ints or bools.
    """
    k = _check_k(k)
    values = _check_labels(labels)
    return 1.0 if any(values[:k]) else 0.0


def recall_at_k(labels: Sequence[int] | Sequence[bool] | np.ndarray, k: int) -> float:
    """"Answer recall"@k as used in open-domain QA: identical to :func:`hit_at_k`.

    In QA papers (DPR, Search-R1) "top-k retrieval accuracy" / "recall@k" means: does at least
    one of the top-k passages contain an answer? That is Hit@k. It is *not* the IR recall@k
    (fraction of all relevant documents that appear in the top k), which needs the total number
    of relevant documents and is not computed here.
    """
    return hit_at_k(labels, k)


def mean_hit(labels: Sequence[int] | Sequence[bool] | np.ndarray, ks: Sequence[int] = (1, 3, 5)) -> float:
    """The paper's ranker relevance reward ``r_rel``: mean of Hit@k over the cutoffs ``ks``.

    Example: labels [0, 0, 1, 0, 0] -> Hit@1 = 0, Hit@3 = 1, Hit@5 = 1 -> 2/3.
    ``ks`` must be non-empty and every cutoff >= 1.
    """
    cutoffs = [_check_k(k, "every k in ks") for k in ks]
    if not cutoffs:
        raise ValueError("ks must contain at least one cutoff")
    values = _check_labels(labels)
    return sum(1.0 if any(values[:k]) else 0.0 for k in cutoffs) / len(cutoffs)


def hit_cutoffs(ks: Sequence[int], k_shown: int) -> tuple[int, ...]:
    """The Hit@k cutoffs a list of ``k_shown`` passages tells apart: each ``k`` of ``ks`` below K, then
    K itself. A cutoff at or above K measures the whole list (Hit@K), so at K = 2 the paper's
    {1, 3, 5} become (1, 2), and at K = 5 they stay (1, 3, 5).
    """
    k_shown = _check_k(k_shown, "k_shown")
    cutoffs = [_check_k(k, "every k in ks") for k in ks]
    return (*sorted({k for k in cutoffs if k < k_shown}), k_shown)


def hit_label(k: int, k_shown: int) -> str:
    """The record column of Hit@k of a K-long shown list: ``hit@K`` for the whole list (k >= K),
    ``hit@<k>`` below it. Columns named so mean the same thing in every profile, whatever its K."""
    return "hit@K" if k >= k_shown else f"hit@{k}"


def shown_hits(labels: Sequence[int] | Sequence[bool] | np.ndarray, ks: Sequence[int], k_shown: int) -> dict[str, float]:
    """{:func:`hit_label`: Hit@k} of the passages shown, at each of :func:`hit_cutoffs` (``ks``, K).
    Example: labels [0, 1], ks (1, 3, 5), K = 2 -> {"hit@1": 0.0, "hit@K": 1.0}."""
    return {hit_label(k, k_shown): hit_at_k(labels, k) for k in hit_cutoffs(ks, k_shown)}


def _dcg(gains: Sequence[int]) -> float:
    """Discounted cumulative gain with binary gains: sum of g_i / log2(i + 1), i counted from 1."""
    return sum(g / np.log2(i + 2) for i, g in enumerate(gains) if g)


def ndcg_at_k(
    labels: Sequence[int] | Sequence[bool] | np.ndarray,
    k: int,
    *,
    ideal_labels: Sequence[int] | Sequence[bool] | np.ndarray | None = None,
) -> float:
    """nDCG@k with binary gains and a log2 discount.

    DCG@k = sum over ranks i = 1..k of label_i / log2(i + 1). The ideal DCG@k is the DCG@k of
    the labels sorted in descending order. By default the ideal ordering is built from the same
    ``labels`` (relevance judged only among the ranked list). Pass ``ideal_labels`` - e.g. the
    labels of all N retrieved candidates - to normalise against the best list that could have
    been built from that pool instead, as the CoSearch release's nDCG ablation does (there,
    qrels cover the whole top-N pool).

    Returns 0.0 when there is no relevant item in the ideal labels (or the list is empty).
    If ``k`` exceeds the list length the whole list is used. ``ideal_labels`` must describe a
    pool that contains the ranked items, otherwise the value can exceed 1.
    """
    k = _check_k(k)
    values = _check_labels(labels)
    ideal = values if ideal_labels is None else _check_labels(ideal_labels, "ideal_labels")
    idcg = _dcg(sorted(ideal, reverse=True)[:k])
    if idcg == 0.0:
        return 0.0
    return float(_dcg(values[:k]) / idcg)
