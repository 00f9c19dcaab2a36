"""Evaluation harness: methods x datasets -> tidy per-question records, and the paper's tables.

Methods (string ids; the ``method`` column of every record):

* ``direct``: answer from memory, one generation (the paper's "Direct inference").
* ``cot``: reason, then answer, one generation ("CoT").
* ``rag``: one retrieval with the question, its top-K passages in the prompt, then answer ("RAG").
* ``agent_retrieval``: the ReAct agent reading the retriever's top-K ("Retrieval Only", Search-R1 style).
* ``agent_fixed_ranker``: the agent + a frozen generative LLM ranker (the base model, or a given adapter).
* ``agent_trained_ranker``: the agent + the LLM ranker with a trained adapter (CoSearch); skipped without one.
* ``agent_oracle``: the agent + oracle ranking, paper Eq. 7 (the oracle-gap study; reads the golds).
* ``agent_cross_encoder``: the agent + a pointwise cross-encoder (ablation); skipped without a model.

Every method gives one row per (method, question, sample) with the same columns
(:data:`RECORD_GLOSSARY`). The tables (:func:`summary_table`, :func:`oracle_gap_table`,
:func:`turn_distribution`, :func:`format_fail_breakdown`) read only those columns, so a notebook
can rebuild every table from records saved on disk (:func:`save_records`, :func:`load_records`).

Departures worth knowing: ``n_searches`` counts the searches actually run (one ranker call each;
a search refused at the ``max_searches`` cap is not counted, as in ``Trajectory.n_searches``); direct / CoT / RAG always use the base model (no agent adapter); agent methods share row keys,
so at temperature > 0 they draw common random numbers (differences come from the ranking, not noise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .data import QAExample
from .generation import SamplingConfig
from .groups import hop_group, order_key
from .metrics import exact_match, has_answer, hit_at_k, max_token_f1
from .protocol import ChatTokens, ProtocolConfig, cot_messages, direct_messages, parse_answer_only, rag_messages
from .ranking import LLMRanker, OracleRanker, Ranker, RetrievalOnlyRanker, make_ranker
from .rollout import RolloutConfig, RolloutEngine, Trajectory
from .runs import write_table

METHODS = ("direct", "cot", "rag", "agent_retrieval", "agent_fixed_ranker", "agent_trained_ranker",
           "agent_oracle", "agent_cross_encoder")
#: What runs without extra artefacts (no trained adapter, no cross-encoder).
DEFAULT_METHODS = ("direct", "cot", "rag", "agent_retrieval", "agent_fixed_ranker", "agent_oracle")
#: How a row ended, in the order the breakdown table shows them.
FINISH_ORDER = ("answer", "invalid", "max_searches", "max_tokens")
HIT_KS = (1, 3, 5)
AVG_COLUMNS = ("single-hop avg", "multi-hop avg", "avg")

#: Every record column, in order, with its meaning (the metric glossary of the evaluation tables).
RECORD_GLOSSARY: dict[str, str] = {
    "method": "method id (see METHODS)",
    "dataset": "the question's data_source (nq, hotpotqa, syn_nq, ...)",
    "group": "single / multi / other: the paper's hop group of the dataset",
    "split": "QA split the questions come from (EvalConfig.split)",
    "question_id": "QAExample.id",
    "sample": "which of the n_samples generations of the question (0-based)",
    "question": "the question text",
    "prediction": "the extracted answer; None when no valid answer was given",
    "golds": "gold answers (list of strings)",
    "f1": "max token F1 of prediction over golds (0 when prediction is None): the paper's metric",
    "em": "exact match after SQuAD normalisation (0 when prediction is None)",
    "format_ok": "the reply followed the tag protocol (agent: every turn, and it ended with an answer)",
    "finish": "answer | invalid (protocol broken) | max_searches (searched past the cap) | max_tokens (out of tokens)",
    "error": "parser error code of the first malformed turn or reply; None when none",
    "n_searches": "searches actually run (direct/cot: 0, rag: 1)",
    "ranker_hit@1": "mean over the row's searches of Hit@1 of the K passages shown (rag: its retrieval); NaN if none",
    "ranker_hit@3": "as ranker_hit@1, Hit@3",
    "ranker_hit@5": "as ranker_hit@1, Hit@5",
    "ranker_valid_rate": "share of the row's ranker calls that followed the protocol (rule rankers: 1.0); NaN if none",
    "n_generated_tokens": "tokens the agent / answerer generated (ranker tokens not included)",
    "wall_s": "wall-clock seconds of the method's batch divided evenly over its rows",
}
RECORD_COLUMNS = list(RECORD_GLOSSARY)


class MethodSkippedWarning(UserWarning):
    """A method could not run with the given config and context (e.g. no trained adapter); no rows."""


class _Skip(Exception):
    """Raised by a method's setup to skip it, with the reason as message."""


# --------------------------------------------------------------------------- configuration


@dataclass
class EvalConfig:
    methods: tuple[str, ...] = DEFAULT_METHODS  # methods run_evaluation runs, in table order (see METHODS)
    split: str = "test"  # QA split the examples come from (recorded in every row)
    n_per_dataset: int | None = None  # first n questions per data_source, in file order; None = all
    n_samples: int = 1  # generations per question; > 1 only differs from 1 with temperature > 0
    seed: int = 0  # base seed: each row samples with derive_seed(seed, its row key)
    temperature: float = 0.0  # sampling temperature of every policy (0 = greedy, the evaluation default)
    top_p: float = 1.0  # nucleus sampling of every policy (1 = off)
    agent_adapter: str | None = None  # agent LoRA of agent_* methods: loaded name or checkpoint folder; None = base
    fixed_ranker_adapter: str | None = None  # ranker LoRA of agent_fixed_ranker; None = the base model, prompted
    trained_ranker_adapter: str | None = None  # ranker LoRA of agent_trained_ranker (name or folder); None = skip it
    cross_encoder_model: str | None = None  # cross-encoder when EvalContext.cross_encoder is None; None = skip
    max_searches: int = 6  # search calls allowed per trajectory (paper: 6)
    topn: int = 50  # N: retriever candidates per agent search (paper: 50)
    topk: int = 5  # K: passages the agent (and the RAG prompt) reads (paper: 5)
    agent_max_new_tokens: int = 256  # tokens per agent turn, and for the CoT reply
    ranker_max_new_tokens: int = 160  # tokens per LLM ranker call
    answer_max_new_tokens: int = 64  # tokens for the direct and RAG replies (an answer tag only)
    max_context_tokens: int = 8192  # a trajectory longer than this stops (finish "max_tokens")

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        for m in self.methods:
            check_method(m)
        if self.n_per_dataset is not None and self.n_per_dataset < 1:
            raise ValueError(f"EvalConfig.n_per_dataset must be >= 1 or None, got {self.n_per_dataset}")
        if self.n_samples < 1:
            raise ValueError(f"EvalConfig.n_samples must be >= 1, got {self.n_samples}")
        if not 1 <= self.topk <= self.topn:
            raise ValueError(f"EvalConfig needs 1 <= topk <= topn, got topk={self.topk}, topn={self.topn}")

    def rollout_config(self) -> RolloutConfig:
        """The agent methods' rollout settings (the ranker samples at the same temperature)."""
        return RolloutConfig(max_searches=self.max_searches, topn=self.topn, topk=self.topk,
                             agent_max_new_tokens=self.agent_max_new_tokens,
                             ranker_max_new_tokens=self.ranker_max_new_tokens, temperature=self.temperature,
                             top_p=self.top_p, max_context_tokens=self.max_context_tokens)

    def answer_sampling(self, method: str) -> SamplingConfig:
        """Sampling of the one-generation baselines; generation stops after ``</answer>``."""
        budget = self.agent_max_new_tokens if method == "cot" else self.answer_max_new_tokens
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=budget,
                              stop=("</answer>",), seed=self.seed)


@dataclass
class EvalContext:
    """The heavy objects the methods need, built once by the notebook."""

    agent_backend: Any  # generation backend of the agent (and of direct / CoT / RAG)
    chat: ChatTokens  # the agent model's chat template, token-exact
    retriever: Any  # .search(queries, topk) -> list[list[Passage]]
    ranker_backend: Any = None  # backend of the LLM ranker; None = agent_backend (adapters tell the policies apart)
    ranker_chat: ChatTokens | None = None  # the ranker model's chat template; None = chat
    protocol: ProtocolConfig | None = None  # passage caps and prompt layout; topk / max_search_turns follow EvalConfig
    cross_encoder: Ranker | None = None  # ranker for agent_cross_encoder (e.g. CrossEncoderRanker); None = cfg's model

    def protocol_for(self, cfg: EvalConfig) -> ProtocolConfig:
        """The protocol with K and the search cap taken from ``cfg``, so prompts say what happens."""
        return replace(self.protocol or ProtocolConfig(), topk=cfg.topk, max_search_turns=cfg.max_searches)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown evaluation method {method!r}; expected one of {METHODS}")
    return method


def select_examples(examples: Sequence[QAExample], n_per_dataset: int | None) -> list[QAExample]:
    """The first ``n_per_dataset`` examples of each data_source, in file order (None: all)."""
    if n_per_dataset is None:
        return list(examples)
    seen: Counter[str] = Counter()
    chosen = []
    for ex in examples:
        if seen[ex.data_source] < n_per_dataset:
            chosen.append(ex)
            seen[ex.data_source] += 1
    return chosen


def register_adapter(backend: Any, adapter: str | None) -> str | None:
    """An adapter name the backend knows: a checkpoint folder is loaded once under a name derived
    from its resolved path (vLLM: ``add_adapter``; transformers: peft ``load_adapter``); anything
    else is taken as the name of an adapter already loaded (scripted backends accept any name)."""
    if adapter is None or not Path(adapter).is_dir():
        return adapter
    path = Path(adapter).resolve()
    name = f"eval_{re.sub(r'[^0-9A-Za-z_]', '_', path.name)}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if hasattr(backend, "add_adapter"):  # vLLM / Unsloth
        backend.add_adapter(name, str(path))
    elif hasattr(backend, "model"):  # transformers
        from peft import PeftModel

        if not isinstance(backend.model, PeftModel):
            backend.model = PeftModel.from_pretrained(backend.model, str(path), adapter_name=name)
        elif name not in backend.model.peft_config:
            backend.model.load_adapter(str(path), adapter_name=name)
    return name


# --------------------------------------------------------------------------- from a profile


def eval_config_from_profile(cfg: Any, **overrides: Any) -> EvalConfig:
    """The :class:`EvalConfig` a profile describes: split, questions, samples and temperature from its
    ``evaluation`` section, token and search budgets from ``rollout``, N and K from ``retrieval``,
    the profile's seed. Keyword overrides (any EvalConfig field) win, e.g. ``methods=[...]``."""
    ev, ro = cfg.evaluation, cfg.rollout
    fields = dict(split=ev.split, n_per_dataset=ev.n_per_dataset, n_samples=ev.n_samples, seed=cfg.seed,
                  temperature=ev.temperature, max_searches=ro.max_searches, topn=cfg.retrieval.topn,
                  topk=cfg.retrieval.topk, agent_max_new_tokens=ro.agent_max_new_tokens,
                  ranker_max_new_tokens=ro.ranker_max_new_tokens, answer_max_new_tokens=ev.answer_max_new_tokens,
                  max_context_tokens=ro.max_context_tokens)
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(EvalConfig)})
    if unknown:
        raise TypeError(f"unknown EvalConfig field(s) {unknown}")
    return EvalConfig(**{**fields, **overrides})


def backends_from_profile(cfg: Any, *, progress: bool = False) -> tuple[Any, Any]:
    """(agent backend, ranker backend) for the profile's ``models`` section. When agent and ranker
    name the same model they share one loaded backend (LoRA adapters tell the two policies apart)."""
    from .generation import make_backend

    m = cfg.models
    kwargs = {"batch_size": m.batch_size, "progress": progress} if m.backend == "transformers" else {}
    agent = make_backend(m.backend, m.agent, **kwargs)
    ranker = agent if m.ranker == m.agent else make_backend(m.backend, m.ranker, **kwargs)
    return agent, ranker


def context_from_profile(cfg: Any, retriever: Any, *, backends: tuple[Any, Any] | None = None,
                         progress: bool = False) -> EvalContext:
    """An :class:`EvalContext` for a profile: its models (:func:`backends_from_profile`, unless
    ``backends`` are given), their chat templates, and ``retriever``."""
    agent, ranker = backends if backends is not None else backends_from_profile(cfg, progress=progress)
    for role, backend in (("agent", agent), ("ranker", ranker)):
        if getattr(backend, "tokenizer", None) is None:
            raise ValueError(f"the {role} backend has no tokenizer; build it with one (VLLMBackend(tokenizer=...))")
    chat = ChatTokens(agent.tokenizer)
    ranker_chat = chat if ranker is agent else ChatTokens(ranker.tokenizer)
    return EvalContext(agent_backend=agent, chat=chat, retriever=retriever, ranker_backend=ranker,
                       ranker_chat=ranker_chat, protocol=cfg.protocol)


# --------------------------------------------------------------------------- running methods


def evaluate(method: str, examples: Sequence[QAExample], ctx: EvalContext, cfg: EvalConfig, *,
             progress: bool = True, trajectories: dict[str, list[Trajectory]] | None = None) -> pd.DataFrame:
    """Run one method on the selected examples; one record row per (question, sample).

    A method that cannot run (no trained adapter, no cross-encoder) warns with
    :class:`MethodSkippedWarning`, saying what to set, and returns no rows. Pass a dict as
    ``trajectories`` to also keep the agent methods' :class:`Trajectory` objects (keyed by method),
    e.g. for the trajectory browser; records alone are what gets saved.
    """
    ranker_factory = _AGENT_RANKERS.get(check_method(method))  # None: a one-generation baseline
    chosen = select_examples(examples, cfg.n_per_dataset)
    start = time.perf_counter()
    try:
        if ranker_factory is None:
            rows = _run_prompted(method, chosen, ctx, cfg)
        else:
            trajs = _run_agent(method, ranker_factory, chosen, ctx, cfg, progress)
            rows = [_agent_row(method, t) for t in trajs]
            if trajectories is not None:
                trajectories[method] = trajs
    except _Skip as why:
        warnings.warn(f"skipping method {method!r}: {why}", MethodSkippedWarning, stacklevel=2)
        return empty_records()
    frame = _with_none(pd.DataFrame(rows, columns=RECORD_COLUMNS))
    frame["split"] = cfg.split
    frame["wall_s"] = (time.perf_counter() - start) / max(len(frame), 1)
    return frame


def run_evaluation(methods: Sequence[str] | None, examples: Sequence[QAExample], ctx: EvalContext,
                   cfg: EvalConfig, *, progress: bool = True,
                   trajectories: dict[str, list[Trajectory]] | None = None) -> pd.DataFrame:
    """:func:`evaluate` for each method (None: ``cfg.methods``), records concatenated in method order."""
    methods = [check_method(m) for m in (cfg.methods if methods is None else methods)]
    frames = []
    bar = tqdm(methods, desc="evaluate", unit="method", disable=not progress)
    for method in bar:
        bar.set_postfix_str(method)
        frames.append(evaluate(method, examples, ctx, cfg, progress=progress, trajectories=trajectories))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else empty_records()


def empty_records() -> pd.DataFrame:
    return pd.DataFrame(columns=RECORD_COLUMNS)


def _with_none(records: pd.DataFrame) -> pd.DataFrame:
    """``prediction`` and ``error`` as object columns holding None (pandas would infer NaN-filled strings)."""
    for column in ("prediction", "error"):
        records[column] = records[column].astype(object).where(records[column].notna(), None)
    return records


def _base_row(method: str, ex_id: str, data_source: str, question: str, golds: list[str], sample: int) -> dict:
    return {"method": method, "dataset": data_source, "group": hop_group(data_source), "question_id": ex_id,
            "sample": sample, "question": question, "golds": list(golds)}


def _mean_or_nan(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


# -- direct, CoT, RAG: one batched generation each

def _prompt_messages(method: str, question: str, passages, protocol: ProtocolConfig) -> list[dict[str, str]]:
    if method == "direct":
        return direct_messages(question)
    if method == "cot":
        return cot_messages(question)
    return rag_messages(question, passages, protocol)


def _run_prompted(method: str, examples: list[QAExample], ctx: EvalContext, cfg: EvalConfig) -> list[dict]:
    protocol = ctx.protocol_for(cfg)
    passages = ctx.retriever.search([ex.question for ex in examples], cfg.topk) if method == "rag" and examples \
        else [None] * len(examples)
    jobs = [(ex, s, p) for ex, p in zip(examples, passages) for s in range(cfg.n_samples)]
    if not jobs:
        return []
    prompts = [ctx.chat.prompt_ids(_prompt_messages(method, ex.question, p, protocol)) for ex, _, p in jobs]
    gens = ctx.agent_backend.generate(prompts, cfg.answer_sampling(method), adapter=None,
                                      row_keys=[(method, ex.id, s) for ex, s, _ in jobs])
    return [_prompted_row(method, ex, s, p, gen) for (ex, s, p), gen in zip(jobs, gens)]


def _prompted_row(method: str, ex: QAExample, sample: int, passages, gen) -> dict:
    answer, ok, error = parse_answer_only(gen.text)
    finish = "answer" if ok else ("max_tokens" if gen.finish_reason == "length" else "invalid")
    shown = [int(has_answer(p.contents, ex.golden_answers)) for p in passages] if passages is not None else None
    hits = {f"ranker_hit@{k}": hit_at_k(shown, k) if shown else float("nan") for k in HIT_KS}
    return {**_base_row(method, ex.id, ex.data_source, ex.question, ex.golden_answers, sample),
            "prediction": answer, "f1": max_token_f1(answer, ex.golden_answers),
            "em": exact_match(answer, ex.golden_answers),
            "format_ok": ok, "finish": finish, "error": error, "n_searches": int(passages is not None), **hits,
            "ranker_valid_rate": float("nan"), "n_generated_tokens": len(gen.token_ids)}


# -- agent methods: the rollout engine with a ranker per method

def _llm_ranker(ctx: EvalContext, cfg: EvalConfig, adapter: str | None) -> LLMRanker:
    backend = ctx.ranker_backend if ctx.ranker_backend is not None else ctx.agent_backend
    return LLMRanker(backend, ctx.ranker_chat or ctx.chat, ctx.protocol_for(cfg),
                     cfg.rollout_config().ranker_sampling(cfg.seed), adapter=register_adapter(backend, adapter))


def _trained_ranker(ctx: EvalContext, cfg: EvalConfig) -> LLMRanker:
    if cfg.trained_ranker_adapter is None:
        raise _Skip("no trained ranker adapter (EvalConfig.trained_ranker_adapter is None); train one "
                    "(notebook 03), then pass its adapter name or checkpoint folder")
    return _llm_ranker(ctx, cfg, cfg.trained_ranker_adapter)


def _cross_encoder(ctx: EvalContext, cfg: EvalConfig) -> Ranker:
    if ctx.cross_encoder is not None:
        return ctx.cross_encoder
    if cfg.cross_encoder_model is None:
        raise _Skip("no cross-encoder configured (EvalContext.cross_encoder and EvalConfig.cross_encoder_model "
                    "are both None); give one, e.g. cross-encoder/ms-marco-MiniLM-L-6-v2")
    return make_ranker("cross_encoder", model_name=cfg.cross_encoder_model)


_AGENT_RANKERS = {
    "agent_retrieval": lambda ctx, cfg: RetrievalOnlyRanker(),
    "agent_fixed_ranker": lambda ctx, cfg: _llm_ranker(ctx, cfg, cfg.fixed_ranker_adapter),
    "agent_trained_ranker": _trained_ranker,
    "agent_oracle": lambda ctx, cfg: OracleRanker(),
    "agent_cross_encoder": _cross_encoder,
}


def _run_agent(method: str, make: Any, examples: list[QAExample], ctx: EvalContext, cfg: EvalConfig,
               progress: bool) -> list[Trajectory]:
    ranker = make(ctx, cfg)  # may skip the method, before any generation
    engine = RolloutEngine(ctx.agent_backend, ctx.chat, ctx.retriever, ranker, cfg.rollout_config(),
                           ctx.protocol_for(cfg), agent_adapter=register_adapter(ctx.agent_backend, cfg.agent_adapter))
    return engine.run(examples, n_samples=cfg.n_samples, seed=cfg.seed, progress=progress) if examples else []


def _agent_row(method: str, t: Trajectory) -> dict:
    calls = t.ranker_calls
    hits = {f"ranker_hit@{k}": _mean_or_nan([c.hit_at.get(k, 0.0) for c in calls]) for k in HIT_KS}
    return {**_base_row(method, t.question_id, t.data_source, t.question, t.golds, t.sample),
            "prediction": t.answer, "f1": t.f1, "em": t.em, "format_ok": t.format_ok, "finish": t.finish,
            "error": next((turn.error for turn in t.turns if not turn.format_ok), None), "n_searches": t.n_searches,
            **hits, "ranker_valid_rate": _mean_or_nan([float(c.valid) for c in calls]),
            "n_generated_tokens": int(sum(t.loss_mask))}


# --------------------------------------------------------------------------- tables


def _method_order(records: pd.DataFrame, methods: Sequence[str] | None) -> list[str]:
    return list(methods) if methods is not None else list(dict.fromkeys(records["method"]))


def question_counts(records: pd.DataFrame, methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Distinct questions per method (rows) and dataset (columns, paper order)."""
    counts = records.groupby(["method", "dataset"])["question_id"].nunique().unstack("dataset")
    datasets = sorted(counts.columns, key=order_key)
    counts = counts.reindex(index=_method_order(records, methods), columns=datasets).fillna(0).astype(int)
    counts.columns.name = None
    return counts


def summary_table(records: pd.DataFrame, metric: str = "f1", methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Mean ``metric`` per method (rows, in the given or first-seen order) and dataset (columns, paper
    order), then the paper's macro averages over datasets: single-hop avg, multi-hop avg, avg.

    A question with several samples counts once (its samples are averaged first). Methods without
    records get a NaN row. ``attrs["n"]`` holds the question counts ({method: {dataset: n}}).
    """
    per_question = records.groupby(["method", "dataset", "question_id"])[metric].mean()
    table = per_question.groupby(["method", "dataset"]).mean().unstack("dataset")
    datasets = sorted(table.columns, key=order_key)
    table = table.reindex(index=_method_order(records, methods), columns=datasets).astype(float)
    for column, group in zip(AVG_COLUMNS, ("single", "multi", None)):
        chosen = [d for d in datasets if group is None or hop_group(d) == group]
        table[column] = table[chosen].mean(axis=1) if chosen else float("nan")
    table.columns.name = None
    table.attrs = {"metric": metric, "n": question_counts(records, table.index).to_dict(orient="index")}
    return table


def oracle_gap_table(records: pd.DataFrame, standard: str = "agent_retrieval", oracle: str = "agent_oracle",
                     metric: str = "f1") -> pd.DataFrame:
    """The paper's Table 1: rows standard / oracle / relative gain % ((oracle / standard - 1) * 100,
    NaN where standard is 0), columns single-hop avg, multi-hop avg, avg."""
    missing = [m for m in (standard, oracle) if m not in set(records["method"])]
    if missing:
        raise ValueError(f"no records for method(s) {missing}; have {sorted(set(records['method']))}")
    table = summary_table(records, metric, methods=[standard, oracle])[list(AVG_COLUMNS)]
    base, best = table.loc[standard], table.loc[oracle]
    gain = (best / base.where(base != 0) - 1) * 100
    out = pd.DataFrame([base, best, gain], index=["standard", "oracle", "relative gain %"])
    out.attrs = {"standard": standard, "oracle": oracle, "metric": metric}
    return out


def turn_distribution(records: pd.DataFrame, max_turns: int | None = None,
                      methods: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's Table 7: % of each method's rows with 0, 1, ..., T searches, and the mean.

    T is ``max_turns`` (rows with more searches count in column T) or else the largest count seen.
    Rows are (question, sample) pairs: with one sample, % of questions. Mean is of the raw counts.
    """
    turns = records["n_searches"].astype(int)
    top = max_turns if max_turns is not None else (int(turns.max()) if len(turns) else 0)
    table = pd.crosstab(records["method"], turns.clip(upper=top), normalize="index") * 100
    table = table.reindex(columns=range(top + 1), fill_value=0.0).reindex(_method_order(records, methods))
    table.columns.name = None
    table["mean"] = records.groupby("method")["n_searches"].mean()
    return table


def format_fail_breakdown(records: pd.DataFrame, by: str = "finish",
                          methods: Sequence[str] | None = None) -> pd.DataFrame:
    """Why rows score what they score: % of each method's rows per finish reason (``by="error"``: per
    parser error code, "(none)" when no turn was malformed), then "answered, f1 = 0 %" (answered
    but wrong) and "f1 | answered" (mean F1 of the rows that gave a valid answer)."""
    table = pd.crosstab(records["method"], records[by].fillna("(none)"), normalize="index") * 100
    if by == "finish":
        table = table.reindex(columns=[*FINISH_ORDER, *sorted(set(table.columns) - set(FINISH_ORDER))], fill_value=0.0)
    table.columns.name = None
    answered = records["finish"] == "answer"
    table["answered, f1 = 0 %"] = (answered & (records["f1"] == 0)).groupby(records["method"]).mean() * 100
    table["f1 | answered"] = records[answered].groupby("method")["f1"].mean()
    return table.reindex(_method_order(records, methods))


# --------------------------------------------------------------------------- saving


def _json_cell(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value


def save_records(records: pd.DataFrame, out_dir: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``<out_dir>/<name>.parquet`` and ``.csv`` atomically (list cells as JSON strings in the CSV)."""
    out = Path(out_dir)
    parquet = write_table(records, out / f"{name}.parquet")
    csv = write_table(records.apply(lambda col: col.map(_json_cell)) if len(records) else records, out / f"{name}.csv")
    return parquet, csv


def load_records(path: str | Path) -> pd.DataFrame:
    """Read records written by :func:`save_records` (parquet or CSV); ``golds`` come back as lists."""
    path = Path(path)
    if path.suffix == ".parquet":
        records = pd.read_parquet(path)
        records["golds"] = records["golds"].map(list)
    elif path.suffix == ".csv":
        # only empty cells are missing: an answer such as "NA" or "None" stays a string
        records = pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in RECORD_COLUMNS})
        records["golds"] = records["golds"].map(json.loads)
    else:
        raise ValueError(f"records path must end in .parquet or .csv, got {path}")
    return _with_none(records)
