"""Evaluation harness: methods x datasets -> tidy per-question records (the tables: ``eval.tables``).

Methods (string ids; the ``method`` column of every record):

* ``direct``: answer from memory, one generation (the paper's "Direct inference").
* ``cot``: reason, then answer, one generation ("CoT").
* ``rag``: one retrieval with the question, its top-K passages in the prompt, then answer ("RAG").
* ``agent_retrieval``: the ReAct agent reading the retriever's top-K ("Retrieval Only", Search-R1 style).
* ``agent_fixed_ranker``: the agent + a frozen ranker: the generative LLM ranker (the base model, or a given
  adapter), or a saved scoring ranker (the LLM judge, a cross-encoder) when given its folder.
* ``agent_trained_ranker``: the agent + the LLM ranker with a trained adapter (CoSearch); skipped without one.
* ``agent_oracle``: the agent + oracle ranking, paper Eq. 7 (the oracle-gap study; reads the golds).
* ``agent_scorer``: the agent + a scoring ranker (``config.RANKER_KINDS``: a trained cross-encoder or LLM
  judge, greedy; or a pretrained cross-encoder by name); skipped without one.
* ``agent_hop_oracle``: the agent + the passages holding the current hop's answer first
  (``agent.rankers.HopOracleRanker``; a diagnostic ceiling, not a paper method; reads the gold chains).

Every method gives one row per (method, question, sample) with the same columns
(:data:`RECORD_GLOSSARY`). The tables of ``eval.tables`` read only those columns, so a notebook
can rebuild every table from records saved on disk.

Departures worth knowing: ``n_searches`` counts the searches actually run (one ranker call each;
a search refused at the ``max_searches`` cap is not counted, as in ``Trajectory.n_searches``);
direct / CoT / RAG always use the base model (no agent adapter), and by default their replies are
started with the answer tag for them (``baseline_reply``, :func:`_prefilled_replies`); agent methods share row keys,
so at temperature > 0 they draw common random numbers (differences come from the ranking, not noise).
"""

from __future__ import annotations

import hashlib
import re
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from peft import PeftModel

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.parsers import parse_answer_only
from cosearch_lib.agent.prompts import cot_messages, direct_messages, rag_messages
from cosearch_lib.agent.rankers import RANKING_MODES, Ranker, RankerContext, make_ranker
from cosearch_lib.agent.rollout import RolloutEngine, Trajectory, run_together
from cosearch_lib.config import BASELINE_REPLIES, ProtocolConfig, RolloutConfig, RuleSet, SamplingConfig, SearchBudget
from cosearch_lib.data.qa_formats import QAExample, gold_chain
from cosearch_lib.eval.benchmark_families import hop_group
from cosearch_lib.metrics import ANSWER_F1_METRICS, answer_f1, exact_match, has_answer, hit_cutoffs, shown_hits
from cosearch_lib.models.generation.contract import GenerationBackend, bf16_scope
from cosearch_lib.models.registry import quiet_loading
from cosearch_lib.models.scoring_rankers import is_scoring_ranker_folder, load_scoring_ranker
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.run_schema import RENAMED_EVAL_METHODS, expand_hit_patterns, hit_names

#: The one-generation baselines, then the agent with each ranking. A rule ranking mode registered in
#: ``agent.rankers.RANKING_MODES`` is offered as ``agent_<mode>`` without an entry here (:func:`eval_methods`).
EVAL_METHODS = ("direct", "cot", "rag", "agent_retrieval", "agent_fixed_ranker", "agent_trained_ranker",
                "agent_oracle", "agent_scorer", "agent_hop_oracle")
#: What runs without extra artefacts (no trained adapter, no cross-encoder).
DEFAULT_EVAL_METHODS = ("direct", "cot", "rag", "agent_retrieval", "agent_fixed_ranker", "agent_oracle")

#: Every record column, in order, with its meaning (the metric glossary of the evaluation tables).
RECORD_GLOSSARY: dict[str, str] = {
    "method": "method id (see EVAL_METHODS)",
    "dataset": "the question's data_source (nq, hotpotqa, syn_nq, ...)",
    "group": "single / multi / other: the paper's hop group of the dataset",
    "split": "QA split the questions come from (HarnessConfig.split)",
    "question_id": "QAExample.id",
    "sample": "which of the n_samples generations of the question (0-based)",
    "question": "the question text",
    "prediction": "the extracted answer; None when no valid answer was given",
    "golds": "gold answers (list of strings)",
    "f1": "max token F1 of prediction over golds (0 when prediction is None), by HarnessConfig.f1: 'plain' is the paper's metric",
    "em": "exact match after SQuAD normalisation (0 when prediction is None)",
    "format_ok": "the reply followed the tag protocol (agent: every turn, and it ended with an answer)",
    "finish": "answer | invalid (protocol broken) | max_searches (searched past the cap) | max_tokens (out of tokens)",
    "error": "parser error code of the first malformed turn or reply; None when none",
    "n_searches": "searches actually run (direct/cot: 0, rag: 1)",
    "ranker_hit@<k>": "mean over the row's searches of Hit@k of the K passages shown (rag: its retrieval), for each "
                      "cutoff k below K of HarnessConfig.hit_ks (the profile's training.ranker_reward.hit_ks: "
                      "ranker_hit@1 at K = 2; ranker_hit@1 and ranker_hit@3 at K = 5); NaN if none",
    "ranker_hit@K": "as ranker_hit@<k>, Hit@K: whether any of the K passages shown holds an answer",
    "ranker_valid_rate": "share of the row's ranker calls that followed the protocol (rule rankers: 1.0); NaN if none",
    "n_generated_tokens": "tokens the agent / answerer generated (ranker tokens not included)",
    "wall_s": "wall-clock seconds of the method's batch divided evenly over its rows (agent methods evaluated together: the shared rollout's)",
}
def record_columns(hit_ks: Sequence[int], k_shown: int) -> list[str]:
    """The record columns, in order, for Hit cutoffs ``hit_ks`` and K shown passages: the glossary's,
    its ``ranker_hit@<k>`` and ``ranker_hit@K`` expanded (``run_schema.hit_names``: ``ranker_hit@1``
    and ``ranker_hit@K`` at K = 2)."""
    return expand_hit_patterns(list(RECORD_GLOSSARY), hit_names(hit_ks, k_shown))


class MethodSkippedWarning(UserWarning):
    """A method could not run with the given config and context (e.g. no trained adapter); no rows."""


class _Skip(Exception):
    """Raised by a method's setup to skip it, with the reason as message."""


# --------------------------------------------------------------------------- configuration


@dataclass
class HarnessConfig:
    methods: tuple[str, ...] = DEFAULT_EVAL_METHODS  # methods run_evaluation runs, in table order (see EVAL_METHODS)
    split: str = "test"  # QA split the examples come from (recorded in every row)
    n_per_dataset: int | None = None  # first n questions per data_source, in file order; None = all
    n_samples: int = 1  # generations per question; > 1 only differs from 1 with temperature > 0
    seed: int = 0  # base seed: each row samples with derive_seed(seed, its row key)
    temperature: float = 0.0  # sampling temperature of every policy (0 = greedy, the evaluation default)
    top_p: float = 1.0  # nucleus sampling of every policy (1 = off)
    agent_adapter: str | None = None  # agent LoRA of agent_* methods: loaded name or checkpoint folder; None = base
    fixed_ranker_adapter: str | None = None  # agent_fixed_ranker's ranker: a LoRA (name or folder) or a scoring ranker's folder; None = the base model, prompted
    trained_ranker_adapter: str | None = None  # ranker LoRA of agent_trained_ranker (name or folder); None = skip it
    scorer_model: str | None = None  # agent_scorer's ranker when HarnessContext.scorer is None: a saved scoring ranker's folder (models.scoring_rankers) or a pretrained cross-encoder's name; None = skip
    search: SearchBudget = field(default_factory=SearchBudget)  # N, K and the search cap (the profile's ``search``, by reference)
    hit_ks: tuple[int, ...] = (1, 3, 5)  # Hit@k cutoffs of the ranker_hit@ columns (the profile's training.ranker_reward.hit_ks); those >= K give ranker_hit@K
    agent_max_new_tokens: int = 256  # tokens per agent turn, and for the CoT reply
    ranker_max_new_tokens: int = 160  # tokens per LLM ranker call
    answer_max_new_tokens: int = 64  # tokens for the direct and RAG replies (an answer tag only)
    max_context_tokens: int = 8192  # a trajectory longer than this stops (finish "max_tokens")
    rules: RuleSet = field(default_factory=RuleSet)  # the profile's rule set: agent format, ranker validity, pseudo-relevance
    f1: str = "plain"  # the records' answer F1 (metrics.answer_f1): "plain" = the paper's metric, "yes_no" = HotpotQA's rule
    baseline_reply: str = "prefilled"  # direct / CoT / RAG: "prefilled" (the reply starts with its tag) or "free" (see _run_prompted)
    bf16: bool = False  # run_evaluation decodes with bf16 copies of the weights (TransformersBackend.bf16_scope); the profile's evaluation.bf16_weights where this CPU has bf16 instructions (experiment.harness_config)

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        if self.baseline_reply not in BASELINE_REPLIES:
            raise ValueError(f"HarnessConfig.baseline_reply must be one of {BASELINE_REPLIES}, got {self.baseline_reply!r}")
        if self.f1 not in ANSWER_F1_METRICS:
            raise ValueError(f"HarnessConfig.f1 must be one of {ANSWER_F1_METRICS}, got {self.f1!r}")
        for m in self.methods:
            check_method(m)
        if self.n_per_dataset is not None and self.n_per_dataset < 1:
            raise ValueError(f"HarnessConfig.n_per_dataset must be >= 1 or None, got {self.n_per_dataset}")
        if self.n_samples < 1:
            raise ValueError(f"HarnessConfig.n_samples must be >= 1, got {self.n_samples}")
        self.hit_ks = tuple(self.hit_ks)
        hit_cutoffs(self.hit_ks, self.search.topk)  # a cutoff below 1 fails here, naming it

    def record_columns(self) -> list[str]:
        """The columns of this evaluation's records (:func:`record_columns` at its cutoffs and K)."""
        return record_columns(self.hit_ks, self.search.topk)

    def shown_hits(self, shown: Sequence[int] | None) -> dict[str, float]:
        """The ``ranker_hit@`` columns of one shown list (relevance labels in the order shown); NaN
        without one."""
        if not shown:
            return {f"ranker_{name}": float("nan") for name in hit_names(self.hit_ks, self.search.topk)}
        return {f"ranker_{name}": value for name, value in shown_hits(shown, self.hit_ks, self.search.topk).items()}

    def rollout_config(self) -> RolloutConfig:
        """The agent methods' rollout settings (the ranker samples at the same temperature)."""
        return RolloutConfig(search=self.search, agent_max_new_tokens=self.agent_max_new_tokens,
                             ranker_max_new_tokens=self.ranker_max_new_tokens, temperature=self.temperature,
                             top_p=self.top_p, max_context_tokens=self.max_context_tokens, rules=self.rules)

    def answer_sampling(self, method: str) -> SamplingConfig:
        """Sampling of the one-generation baselines; generation stops after ``</answer>``."""
        budget = self.agent_max_new_tokens if method == "cot" else self.answer_max_new_tokens
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=budget,
                              stop=("</answer>",), seed=self.seed)


@dataclass
class HarnessContext:
    """The heavy objects the methods need, built once by the notebook."""

    agent_backend: GenerationBackend  # generation backend of the agent (and of direct / CoT / RAG)
    chat: ChatTokens  # the agent model's chat template, token-exact
    retriever: SearchBackend  # .search(queries, topn) -> list[list[Passage]]
    ranker_backend: GenerationBackend | None = None  # backend of the LLM ranker; None = agent_backend (adapters tell the policies apart)
    ranker_chat: ChatTokens | None = None  # the ranker model's chat template; None = chat
    protocol: ProtocolConfig | None = None  # passage caps and prompt layout; its search budget follows HarnessConfig
    scorer: Ranker | None = None  # agent_scorer's ranker (e.g. a trainer's live scoring ranker); None = cfg.scorer_model

    def protocol_for(self, cfg: HarnessConfig) -> ProtocolConfig:
        """The protocol with K and the search cap taken from ``cfg``, so prompts say what happens."""
        return replace(self.protocol or ProtocolConfig(), search=cfg.search)


def eval_methods() -> tuple[str, ...]:
    """:data:`EVAL_METHODS` and ``agent_<mode>`` for every rule ranking mode registered since."""
    rules = (f"agent_{name}" for name, mode in RANKING_MODES.items() if mode.rule)
    return tuple(dict.fromkeys([*EVAL_METHODS, *rules]))


def check_method(method: str) -> str:
    if method in RENAMED_EVAL_METHODS:
        raise ValueError(f"evaluation method {method!r} is now named {RENAMED_EVAL_METHODS[method]!r}")
    if method not in eval_methods():
        raise ValueError(f"unknown evaluation method {method!r}; expected one of {eval_methods()}")
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

        with quiet_loading():
            if not isinstance(backend.model, PeftModel):
                backend.model = PeftModel.from_pretrained(backend.model, str(path), adapter_name=name)
            elif name not in backend.model.peft_config:
                backend.model.load_adapter(str(path), adapter_name=name)
    return name


# --------------------------------------------------------------------------- running methods


def evaluate(method: str, examples: Sequence[QAExample], ctx: HarnessContext, cfg: HarnessConfig, *,
             progress: bool = True, trajectories: dict[str, list[Trajectory]] | None = None,
             label: str | None = None) -> pd.DataFrame:
    """Run one method on the selected examples; one record row per (question, sample).

    A method that cannot run (no trained adapter, no cross-encoder) warns with
    :class:`MethodSkippedWarning`, saying what to set, and returns no rows. Pass a dict as
    ``trajectories`` to also keep the agent methods' :class:`Trajectory` objects (keyed by method),
    e.g. for the trajectory browser; records alone are what gets saved. The progress bar reads
    "evaluate <method>", followed by ``label`` (e.g. which policies) when given.
    """
    if _agent_ranker_factory(check_method(method)) is not None:  # an agent method: the rollout engine
        return evaluate_agents([method], examples, ctx, cfg, progress=progress, trajectories=trajectories,
                               label=label)[method]
    start = time.perf_counter()
    rows = _run_prompted(method, select_examples(examples, cfg.n_per_dataset), ctx, cfg)
    return _records_frame(rows, cfg, time.perf_counter() - start)


def run_evaluation(methods: Sequence[str] | None, examples: Sequence[QAExample], ctx: HarnessContext,
                   cfg: HarnessConfig, *, progress: bool = True,
                   trajectories: dict[str, list[Trajectory]] | None = None, label: str | None = None) -> pd.DataFrame:
    """:func:`evaluate` for each method (None: ``cfg.methods``), records concatenated in method order;
    ``label`` goes into the progress bars' names. The agent methods run together
    (:func:`evaluate_agents`): one rollout whose turns decode every method's rows in one batch."""
    methods = [check_method(m) for m in (cfg.methods if methods is None else methods)]
    agents = [m for m in methods if _agent_ranker_factory(m) is not None]
    frames = []
    with bf16_scope(ctx.agent_backend, ctx.ranker_backend, enabled=cfg.bf16):  # bf16: decoding on bf16 weight copies
        together = evaluate_agents(agents, examples, ctx, cfg, progress=progress, trajectories=trajectories, label=label)
        bar = tqdm(methods, desc="evaluate" + (f" ({label})" if label else ""), unit="method", disable=not progress)
        for method in bar:
            bar.set_postfix_str(method)
            frames.append(together[method] if method in together else
                          evaluate(method, examples, ctx, cfg, progress=progress, trajectories=trajectories, label=label))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else empty_records(cfg)


def evaluate_agents(methods: Sequence[str], examples: Sequence[QAExample], ctx: HarnessContext, cfg: HarnessConfig, *,
                    progress: bool = True, trajectories: dict[str, list[Trajectory]] | None = None,
                    label: str | None = None) -> dict[str, pd.DataFrame]:
    """:func:`evaluate` of several agent methods on the same questions, rolled out together
    (:func:`~cosearch_lib.agent.rollout.run_together`): they share the agent and differ in the
    ranker, so each turn decodes all their rows in one batch. Records per method, as :func:`evaluate`
    gives them; ``wall_s`` is the shared rollout's time per row. A method that cannot run warns and
    gets no rows, as in :func:`evaluate`."""
    chosen = select_examples(examples, cfg.n_per_dataset)
    start = time.perf_counter()
    engines: dict[str, RolloutEngine] = {}
    for method in methods:
        factory = _agent_ranker_factory(check_method(method))
        if factory is None:
            raise ValueError(f"{method!r} is not an agent method; evaluate it with evaluate()")
        try:
            engines[method] = _rollout_engine(factory(ctx, cfg, chosen), ctx, cfg)  # the ranker may skip the method
        except _Skip as why:
            warnings.warn(f"skipping method {method!r}: {why}", MethodSkippedWarning, stacklevel=2)
    desc = f"evaluate {'+'.join(engines)}" + (f" ({label})" if label else "")
    trajs = run_together(list(engines.values()), chosen, n_samples=cfg.n_samples, seed=cfg.seed, progress=progress,
                         desc=desc) if chosen and engines else [[] for _ in engines]
    seconds = (time.perf_counter() - start) / max(sum(map(len, trajs)), 1)
    out = {method: empty_records(cfg) for method in methods}
    for method, rows in zip(engines, trajs):
        if trajectories is not None:
            trajectories[method] = rows
        out[method] = _records_frame([_agent_row(method, t, cfg) for t in rows], cfg, seconds * len(rows))
    return out


def _records_frame(rows: list[dict], cfg: HarnessConfig, seconds: float) -> pd.DataFrame:
    """The records of one method: ``seconds`` spread over its rows as ``wall_s``."""
    frame = missing_as_none(pd.DataFrame(rows, columns=cfg.record_columns()))
    frame["split"] = cfg.split
    frame["wall_s"] = seconds / max(len(frame), 1)
    return frame


def empty_records(cfg: HarnessConfig | None = None) -> pd.DataFrame:
    """No rows, with the columns of ``cfg``'s records (None: the default HarnessConfig's)."""
    return pd.DataFrame(columns=(cfg or HarnessConfig()).record_columns())


def missing_as_none(records: pd.DataFrame) -> pd.DataFrame:
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

def _prompt_messages(method: str, question: str, passages, protocol: ProtocolConfig, *,
                     example: bool = True) -> list[dict[str, str]]:
    if method == "direct":
        return direct_messages(question, example=example)
    if method == "cot":
        return cot_messages(question, example=example)
    return rag_messages(question, passages, protocol, example=example)


def _run_prompted(method: str, examples: list[QAExample], ctx: HarnessContext, cfg: HarnessConfig) -> list[dict]:
    protocol = ctx.protocol_for(cfg)
    passages = ctx.retriever.search([ex.question for ex in examples], cfg.search.topk) if method == "rag" and examples \
        else [None] * len(examples)
    jobs = [(ex, s, p) for ex, p in zip(examples, passages) for s in range(cfg.n_samples)]
    if not jobs:
        return []
    free = cfg.baseline_reply == "free"
    prompts = [ctx.chat.prompt_ids(_prompt_messages(method, ex.question, p, protocol, example=free)) for ex, _, p in jobs]
    keys = [(method, ex.id, s) for ex, s, _ in jobs]
    if free:
        gens = ctx.agent_backend.generate(prompts, cfg.answer_sampling(method), adapter=None, row_keys=keys)
        replies = [(g.text, g.finish_reason, len(g.token_ids)) for g in gens]
    else:
        replies = _prefilled_replies(method, prompts, keys, ctx, cfg)
    return [_prompted_row(method, ex, s, p, reply, cfg) for (ex, s, p), reply in zip(jobs, replies)]


def _closed(text: str, close: str, finish_reason: str) -> str:
    """``text`` up to and including ``close``; a reply the model ended itself (eos) is closed for it;
    one cut by the token budget stays open (the parser then calls it unclosed)."""
    if close in text:
        return text[: text.index(close) + len(close)]
    return text + close if finish_reason == "eos" else text


def _reasoning(text: str) -> str:
    """CoT's reasoning as the model wrote it after ``<reason>``: up to its first tag, any tag removed."""
    cut = min((text.index(t) for t in ("</reason>", "<answer>") if t in text), default=len(text))
    return re.sub(r"</?(reason|answer)>", "", text[:cut]).strip() or "..."


def _prefilled_replies(method: str, prompts: list[list[int]], keys: list[tuple], ctx: HarnessContext,
                       cfg: HarnessConfig) -> list[tuple[str, str, int]]:
    """The baselines' replies with their tags started for the model (``baseline_reply: prefilled``):
    Direct and RAG continue ``<answer>`` up to ``</answer>``; CoT first continues ``<reason>`` up to
    ``</reason>`` (the CoT budget), then, as two-stage zero-shot CoT extracts its answer, its
    reasoning is closed and ``<answer>`` continued. A small instruct model answers in free text
    (measured: SmolLM2-135M wrote no tag in any of 42 replies, so every F1 read 0); here it only has
    to write the answer and close it. Returns (reply text with the prefills, finish reason, tokens
    generated) per prompt."""
    backend, encode = ctx.agent_backend, ctx.chat.encode
    heads, used = [""] * len(prompts), [0] * len(prompts)
    if method == "cot":
        reason = replace(cfg.answer_sampling(method), stop=("</reason>", "<answer>"))
        gens = backend.generate([p + encode("<reason>") for p in prompts], reason, adapter=None,
                                row_keys=[(*k, "reason") for k in keys])
        heads = [f"<reason>{_reasoning(g.text)}</reason>\n" for g in gens]
        used = [len(g.token_ids) for g in gens]
    answer = replace(cfg.answer_sampling(method), max_new_tokens=cfg.answer_max_new_tokens, stop=("</answer>",))
    gens = backend.generate([p + encode(h + "<answer>") for p, h in zip(prompts, heads)], answer, adapter=None,
                            row_keys=keys)
    return [(h + "<answer>" + _closed(g.text, "</answer>", g.finish_reason), g.finish_reason, n + len(g.token_ids))
            for h, g, n in zip(heads, gens, used)]


def _prompted_row(method: str, ex: QAExample, sample: int, passages, reply: tuple[str, str, int],
                  cfg: HarnessConfig) -> dict:
    text, finish_reason, n_tokens = reply
    answer, ok, error = parse_answer_only(text)
    finish = "answer" if ok else ("max_tokens" if finish_reason == "length" else "invalid")
    shown = [int(has_answer(p.contents, ex.golden_answers, trivial=cfg.rules.trivial_golds)) for p in passages] \
        if passages is not None else None
    hits = cfg.shown_hits(shown)
    return {**_base_row(method, ex.id, ex.data_source, ex.question, ex.golden_answers, sample),
            "prediction": answer, "f1": answer_f1(answer, ex.golden_answers, cfg.f1),
            "em": exact_match(answer, ex.golden_answers),
            "format_ok": ok, "finish": finish, "error": error, "n_searches": int(passages is not None), **hits,
            "ranker_valid_rate": float("nan"), "n_generated_tokens": n_tokens}


# -- agent methods: the rollout engine with a ranker per method

def _ranker_context(ctx: HarnessContext, cfg: HarnessConfig, examples: Sequence[QAExample],
                    adapter: str | None = None) -> RankerContext:
    """What the harness gives every ranking mode: its ranker backend and chat, the protocol, greedy
    ranker sampling, the rule set, the questions' gold chains (the hop oracle) and ``adapter``."""
    backend = ctx.ranker_backend if ctx.ranker_backend is not None else ctx.agent_backend
    chains = {ex.question: [(hop["sub_query"], hop["answer"]) for hop in gold_chain(ex) or []] for ex in examples}
    return RankerContext(trivial_golds=cfg.rules.trivial_golds, backend=backend, chat=ctx.ranker_chat or ctx.chat,
                         protocol=ctx.protocol_for(cfg), sampling=cfg.rollout_config().ranker_sampling(cfg.seed),
                         adapter=register_adapter(backend, adapter) if adapter else None,
                         output_protocol=cfg.rules.ranker_output, temperature=0.0, seed=cfg.seed, chains=chains)


def _trained_ranker(ctx: HarnessContext, cfg: HarnessConfig, examples: Sequence[QAExample]) -> Ranker:
    if cfg.trained_ranker_adapter is None:
        raise _Skip("no trained ranker adapter (HarnessConfig.trained_ranker_adapter is None); train one "
                    "(notebook 03), then pass its adapter name or checkpoint folder")
    return make_ranker("llm", _ranker_context(ctx, cfg, examples, cfg.trained_ranker_adapter))


def _saved_scoring_ranker(folder: str, seed: int) -> Ranker:
    """A trained scoring ranker (cross-encoder, LLM judge) saved in ``folder``, ranking greedily (its top-K)."""
    return make_ranker("scorer_policy", scorer=load_scoring_ranker(folder), temperature=0.0, seed=seed)


def _fixed_ranker(ctx: HarnessContext, cfg: HarnessConfig, examples: Sequence[QAExample]) -> Ranker:
    if cfg.fixed_ranker_adapter is not None and is_scoring_ranker_folder(cfg.fixed_ranker_adapter):
        return _saved_scoring_ranker(cfg.fixed_ranker_adapter, cfg.seed)  # the Fixed Ranker of a scoring ranker kind
    return make_ranker("llm", _ranker_context(ctx, cfg, examples, cfg.fixed_ranker_adapter))


def _scorer(ctx: HarnessContext, cfg: HarnessConfig, examples: Sequence[QAExample]) -> Ranker:
    if ctx.scorer is not None:
        return ctx.scorer
    if cfg.scorer_model is None:
        raise _Skip("no scoring ranker configured (HarnessContext.scorer and HarnessConfig.scorer_model are both "
                    "None); give a saved one's folder, or a cross-encoder, e.g. cross-encoder/ms-marco-MiniLM-L-6-v2")
    if is_scoring_ranker_folder(cfg.scorer_model):
        return _saved_scoring_ranker(cfg.scorer_model, cfg.seed)
    return make_ranker("cross_encoder", model_name=cfg.scorer_model)


#: The agent methods that are not a rule mode's ``agent_<mode>``: which ranker each one builds from
#: (harness context, settings, the questions to run).
_AGENT_RANKERS = {
    "agent_fixed_ranker": _fixed_ranker,
    "agent_trained_ranker": _trained_ranker,
    "agent_scorer": _scorer,
}


def _agent_ranker_factory(method: str) -> Any:
    """How ``method`` builds its ranker; None for a one-generation baseline."""
    if method in _AGENT_RANKERS:
        return _AGENT_RANKERS[method]
    mode = method.removeprefix("agent_")
    if method.startswith("agent_") and mode in RANKING_MODES and RANKING_MODES[mode].rule:
        return lambda ctx, cfg, examples: make_ranker(mode, _ranker_context(ctx, cfg, examples))
    return None


def _rollout_engine(ranker: Ranker, ctx: HarnessContext, cfg: HarnessConfig) -> RolloutEngine:
    return RolloutEngine(ctx.agent_backend, ctx.chat, ctx.retriever, ranker, cfg.rollout_config(),
                         ctx.protocol_for(cfg), agent_adapter=register_adapter(ctx.agent_backend, cfg.agent_adapter))


def _agent_row(method: str, t: Trajectory, cfg: HarnessConfig) -> dict:
    calls = t.ranker_calls
    per_call = [cfg.shown_hits(c.shown_labels or [0]) for c in calls]  # an empty shown list scores 0
    hits = {name: _mean_or_nan([h[name] for h in per_call]) for name in cfg.shown_hits(None)}
    return {**_base_row(method, t.question_id, t.data_source, t.question, t.golds, t.sample),
            "prediction": t.answer, "f1": answer_f1(t.answer, t.golds, cfg.f1), "em": t.em, "format_ok": t.format_ok, "finish": t.finish,
            "error": next((turn.error for turn in t.turns if not turn.format_ok), None), "n_searches": t.n_searches,
            **hits, "ranker_valid_rate": _mean_or_nan([float(c.valid) for c in calls]),
            "n_generated_tokens": int(sum(t.loss_mask))}
