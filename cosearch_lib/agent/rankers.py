"""Ranking modes: what the agent reads after each search.

Every mode turns a batch of :class:`RankRequest` (the question, the sub-query, the retriever's N
candidates) into one :class:`Ranking` per request: the K passages shown to the agent, and, for
the generative ranker, everything GRPO needs to train it later (prompt and output token ids,
old log-probs, validity).

* ``retrieval``: the retriever's top-K, unchanged (the paper's "Retrieval Only").
* ``oracle``: paper Eq. 7, answer-containing candidates promoted (the oracle-gap study).
* ``hop_oracle``: the candidates holding the current hop's answer first (a diagnostic ceiling).
* ``llm``: a generative ranker LLM writes ``[i] > [j] > ...``; an invalid output falls back to the
  retriever's top-K and the call is flagged invalid (the released code then gives it -0.2).
* ``cross_encoder``: a pointwise cross-encoder scores each (sub-query, passage) pair (ablation).
* ``scorer_policy``: a trainable scoring ranker (a scoring ``config.RANKER_KINDS`` kind: the
  cross-encoder of Table 3's row, the LLM judge) that samples its K passages from the Plackett-Luce
  distribution of its scores (greedy: the K best), recording each pick's log-probability so GRPO can
  train it like the generative ranker.

The modes are registered by name in :data:`RANKING_MODES` and built with :func:`make_ranker` from a
:class:`RankerContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from cosearch_lib.agent.parsers import parse_ranking
from cosearch_lib.agent.prompts import ranker_messages
from cosearch_lib.data.passage import Passage
from cosearch_lib.metrics import has_answer, token_f1
from cosearch_lib.models.cross_encoder import CrossEncoderScorer, plackett_luce_logprobs, sample_ranking
from cosearch_lib.models.registry import resolve_model
from cosearch_lib.seeding import derive_seed


@dataclass
class RankRequest:
    """One search call to rank."""

    q0: str  # the original question
    sub_query: str  # the agent's query for this turn
    candidates: list[Passage]  # the retriever's top-N, best first
    k: int  # how many passages the agent will read
    golds: list[str] = field(default_factory=list)  # gold answers: used by the oracle only
    row_key: tuple = ()  # (step, question, sample, turn): seeds the ranker's sampling


@dataclass
class Ranking:
    """The ranker's decision for one request."""

    order: list[int]  # 0-based indices into the candidates, length <= k, what the agent reads
    valid: bool = True  # False when an LLM output broke the protocol (order is then the fallback)
    error: str | None = None  # the parser's error code when invalid
    prompt_ids: list[int] = field(default_factory=list)  # LLM ranker: the rendered prompt
    output_ids: list[int] = field(default_factory=list)  # LLM ranker: generated ids
    output_logprobs: list[float] = field(default_factory=list)  # LLM ranker: old-policy log-probs
    output_text: str = ""  # LLM ranker: generated text
    candidate_texts: list[str] = field(default_factory=list)  # cross-encoder policy: what it scored (its update re-scores them)

    def shown(self, candidates: list[Passage]) -> list[Passage]:
        return [candidates[i] for i in self.order]


class Ranker(Protocol):
    """``rank(requests) -> one Ranking per request``, batched (one LLM call for all of them)."""

    mode: str

    def rank(self, requests: list[RankRequest]) -> list[Ranking]: ...


def top_k_order(n_candidates: int, k: int) -> list[int]:
    return list(range(min(k, n_candidates)))


def oracle_order(candidates: list[Passage], golds: list[str], k: int, trivial: str = "drop_each") -> list[int]:
    """Paper Eq. 7: the answer-containing candidates D+ in retriever order, then the best-ranked
    non-relevant ones, K in total; when D+ is empty, the retriever's top-K unchanged. ``trivial``:
    the rule set's treatment of yes/no golds (``metrics.has_answer``)."""
    relevant = [i for i, p in enumerate(candidates) if has_answer(p.contents, golds, trivial=trivial)]
    if not relevant:
        return top_k_order(len(candidates), k)
    chosen = set(relevant)
    rest = [i for i in range(len(candidates)) if i not in chosen]
    return (relevant + rest)[:k]


class RetrievalOnlyRanker:
    """The retriever's own top-K."""

    mode = "retrieval"

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        return [Ranking(order=top_k_order(len(r.candidates), r.k)) for r in requests]


class OracleRanker:
    """Promotes answer-containing candidates (needs the gold answers: analysis only)."""

    mode = "oracle"

    def __init__(self, trivial: str = "drop_each"):
        self.trivial = trivial  # the rule set's trivial_golds

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        return [Ranking(order=oracle_order(r.candidates, r.golds, r.k, self.trivial)) for r in requests]


class HopOracleRanker:
    """A diagnostic ceiling, not a paper method: the passages that hold the answer of the *current
    hop* first. ``chains`` maps a question to its gold reasoning chain, (sub-query, answer) per hop;
    the current hop is the one whose gold sub-query has the highest token F1 with the agent's
    sub-query (the earlier hop on a tie). Its answer is then the relevance label of Eq. 7's order
    (:func:`oracle_order`); a question without a chain, or a search none of whose candidates holds
    that hop's answer, falls back to Eq. 7 on the final answers. What a perfect reader of each
    search could give this agent, where :class:`OracleRanker` only knows the final answer."""

    mode = "hop_oracle"

    def __init__(self, chains: dict[str, list[tuple[str, str]]], trivial: str = "drop_each"):
        self.chains, self.trivial = chains, trivial

    def current_hop(self, request: RankRequest) -> tuple[str, str] | None:
        """The (gold sub-query, answer) of the hop ``request`` searches for; None without a chain."""
        chain = self.chains.get(request.q0)
        if not chain:
            return None
        scores = [token_f1(request.sub_query, sub_query, yes_no_rule=False) for sub_query, _ in chain]
        return chain[max(range(len(chain)), key=lambda h: (scores[h], -h))]

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        out = []
        for r in requests:
            hop = self.current_hop(r)
            if hop is not None and any(has_answer(p.contents, [hop[1]], trivial=self.trivial) for p in r.candidates):
                out.append(Ranking(order=oracle_order(r.candidates, [hop[1]], r.k, self.trivial)))
            else:
                out.append(Ranking(order=oracle_order(r.candidates, r.golds, r.k, self.trivial)))
        return out


class LLMRanker:
    """A generative ranker: one batched generation for every search call of a turn."""

    mode = "llm"

    def __init__(self, backend, chat, protocol_cfg, sampling, *, adapter: str | None = None,
                 output_protocol: str = "strict"):
        self.backend, self.chat, self.protocol_cfg = backend, chat, protocol_cfg
        self.sampling, self.adapter = sampling, adapter
        self.output_protocol = output_protocol  # the rule set's ranker_output: "strict" or "released" (agent.parsers)

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        if not requests:
            return []
        prompts = [self.chat.prompt_ids(ranker_messages(r.q0, r.sub_query, r.candidates, min(r.k, len(r.candidates)),
                                                        self.protocol_cfg)) for r in requests]
        gens = self.backend.generate(prompts, self.sampling, adapter=self.adapter,
                                     row_keys=[("ranker", *r.row_key) for r in requests])
        out = []
        for r, prompt, gen in zip(requests, prompts, gens):
            parsed = parse_ranking(gen.text, len(r.candidates), min(r.k, len(r.candidates)), protocol=self.output_protocol)
            order = parsed.order if parsed.valid else top_k_order(len(r.candidates), r.k)
            out.append(Ranking(order=order, valid=parsed.valid, error=parsed.error, prompt_ids=prompt,
                               output_ids=list(gen.token_ids), output_logprobs=list(gen.logprobs), output_text=gen.text))
        return out


class CrossEncoderRanker:
    """Pointwise: score each (sub-query, candidate) pair with a sequence-classification model,
    keep the K best. Any HF cross-encoder works (e.g. ``cross-encoder/ms-marco-MiniLM-L-6-v2``)."""

    mode = "cross_encoder"

    def __init__(self, model, tokenizer, *, batch_size: int = 32, max_length: int = 256):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.max_length = batch_size, max_length

    @classmethod
    def from_pretrained(cls, name: str, **kw) -> CrossEncoderRanker:
        path = resolve_model(name).path
        return cls(AutoModelForSequenceClassification.from_pretrained(path), AutoTokenizer.from_pretrained(path), **kw)

    def scores(self, query: str, passages: list[Passage]) -> list[float]:
        out: list[float] = []
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(passages), self.batch_size):
                chunk = passages[start : start + self.batch_size]
                batch = self.tokenizer([query] * len(chunk), [p.contents for p in chunk], padding=True,
                                       truncation=True, max_length=self.max_length, return_tensors="pt").to(device)
                logits = self.model(**batch).logits  # (B, C)
                # one logit: a relevance score; two or more: log-odds of the last ("relevant") class
                col = logits[:, 0] if logits.shape[1] == 1 else logits[:, -1] - torch.logsumexp(logits[:, :-1], dim=1)
                out.extend(col.float().cpu().tolist())
        return out

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        result = []
        for r in requests:
            s = self.scores(r.sub_query, r.candidates)
            order = sorted(range(len(s)), key=lambda i: (-s[i], i))[: r.k]
            result.append(Ranking(order=order))
        return result


class ScorerPolicyRanker:
    """A cross-encoder as a stochastic ranking policy: scores the N candidates of each request, then
    samples K of them without replacement from the Plackett-Luce distribution at ``temperature``
    (greedy top-K at 0). The picks are the output "tokens": ``output_ids`` is the order,
    ``output_logprobs`` each pick's log-probability, and the sampling noise depends only on ``seed``
    and the request's row key (as the LLM ranker's does)."""

    mode = "scorer_policy"

    def __init__(self, scorer: CrossEncoderScorer, *, temperature: float, seed: int = 0) -> None:
        self.scorer, self.temperature, self.seed = scorer, temperature, seed

    def rank(self, requests: list[RankRequest]) -> list[Ranking]:
        out = []
        was_training = self.scorer.training
        self.scorer.eval()
        try:
            with torch.inference_mode():
                for r in requests:
                    texts = [p.contents for p in r.candidates]
                    scores = self.scorer.scores(r.sub_query, texts)
                    gen = torch.Generator().manual_seed(derive_seed(self.seed, "ranker", *r.row_key))
                    order = sample_ranking(scores, r.k, self.temperature, gen)
                    logprobs = plackett_luce_logprobs(scores, order, self.temperature).tolist() \
                        if self.temperature > 0 else [0.0] * len(order)
                    out.append(Ranking(order=order, output_ids=list(order), output_logprobs=logprobs,
                                       output_text=" > ".join(f"[{i + 1}]" for i in order), candidate_texts=texts))
        finally:
            self.scorer.train(was_training)
        return out


@dataclass
class RankerContext:
    """Everything a ranking mode may be built from; each mode reads only the fields it needs (its
    entry in :data:`RANKING_MODES`). Callers fill what they have: the trainer its backend, adapter
    and sampling, the evaluation harness its context and the questions' gold chains."""

    trivial_golds: str = "drop_each"  # the rule set's treatment of yes/no golds (oracle modes)
    backend: Any = None  # llm: the ranker's generation backend ...
    chat: Any = None  # ... its chat-token assembly ...
    protocol: Any = None  # ... the protocol (K, caps) ...
    sampling: Any = None  # ... and its sampling settings
    adapter: str | None = None  # llm: the ranker's LoRA adapter name (None: the base model)
    output_protocol: str = "strict"  # llm: the rule set's ranker_output
    scorer: Any = None  # scorer_policy: a scoring ranker (cross-encoder, LLM judge)
    model_name: str | None = None  # cross_encoder: a pretrained cross-encoder to load
    temperature: float = 1.0  # scorer_policy: Plackett-Luce temperature (0: greedy top-K)
    seed: int = 0  # scorer_policy: the sampling seed
    chains: Mapping[str, list[tuple[str, str]]] = field(default_factory=dict)  # hop_oracle: question -> (sub-query, answer) per hop


@dataclass(frozen=True)
class RankingMode:
    """One registered way of turning N candidates into K: how to build it, and whether it is a rule
    (it needs no model or artefact, so the evaluation harness offers it as ``agent_<name>`` by itself)."""

    build: Callable[[RankerContext], Ranker]
    rule: bool = False


def _pretrained_cross_encoder(c: RankerContext) -> CrossEncoderRanker:
    if not c.model_name:
        raise ValueError("the cross_encoder ranking mode needs RankerContext.model_name (a pretrained cross-encoder)")
    return CrossEncoderRanker.from_pretrained(c.model_name)


#: The one registry of ranking modes, by name (as verl's ``core_algos`` registers its estimators):
#: the trainer, the evaluation harness and :func:`make_ranker` all build rankers from it. A new mode is
#: one entry here plus its class (docs/ARCHITECTURE.md, "How to add a ranking mode").
RANKING_MODES: dict[str, RankingMode] = {
    "retrieval": RankingMode(lambda c: RetrievalOnlyRanker(), rule=True),
    "oracle": RankingMode(lambda c: OracleRanker(c.trivial_golds), rule=True),
    "hop_oracle": RankingMode(lambda c: HopOracleRanker(dict(c.chains), c.trivial_golds), rule=True),
    "llm": RankingMode(lambda c: LLMRanker(c.backend, c.chat, c.protocol, c.sampling, adapter=c.adapter,
                                           output_protocol=c.output_protocol)),
    "cross_encoder": RankingMode(_pretrained_cross_encoder),
    "scorer_policy": RankingMode(lambda c: ScorerPolicyRanker(c.scorer, temperature=c.temperature, seed=c.seed)),
}


def register_ranking_mode(name: str, mode: RankingMode) -> None:
    """Add a ranking mode to :data:`RANKING_MODES` (a name already there is an error, not a silent override)."""
    if name in RANKING_MODES:
        raise ValueError(f"ranking mode {name!r} is already registered")
    RANKING_MODES[name] = mode


def make_ranker(mode: str, context: RankerContext | None = None, **fields: Any) -> Ranker:
    """The ranker of a registered ``mode``, built from ``context`` with ``fields`` (RankerContext
    fields) on top, e.g. ``make_ranker("oracle")``, ``make_ranker("scorer_policy", scorer=s,
    temperature=0.0)``; ValueError naming the modes for an unknown one."""
    if mode not in RANKING_MODES:
        raise ValueError(f"ranking mode must be one of {sorted(RANKING_MODES)}, got {mode!r}")
    return RANKING_MODES[mode].build(replace(context or RankerContext(), **fields))
