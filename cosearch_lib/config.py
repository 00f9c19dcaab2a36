"""Every setting of the workbook, as typed dataclasses, and the profiles that fill them.

A profile is one YAML file under ``papermill_runs/params/``; its sections map onto the dataclasses
below (``world:`` -> :class:`WorldConfig`, ``search:`` -> :class:`SearchBudget`, ...). Each field
has its default and a one-line doc; a profile only states what differs. Unknown keys are errors,
so a typo cannot quietly run the default. The top-level scalars (``profile``, ``seed``) are also
the papermill parameters of every notebook; ``notebooks:`` holds per-notebook parameters.

This module is the bottom layer of the package: it imports nothing heavier than PyYAML (no
torch, no fastapi), so loading a profile is cheap and every layer can depend on it. Sections
follow the data flow of the method (docs/ARCHITECTURE.md): world -> data -> retrieval -> models
-> agent -> evaluation -> rl.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosearch_lib.paths import params_dir


class ConfigError(ValueError):
    """A profile file (or a parameter) that does not match the configuration dataclasses."""


#: Marks a field that holds the profile's one shared object (set by ProfileConfig, never by YAML).
_SHARED = {"shared": True}
#: Marks a field that changes only how fast results come, not which: left out of cache fingerprints.
_SPEED_ONLY = {"speed_only": True}


def _fingerprinted(obj: Any) -> Any:
    """``dataclasses.asdict`` without the fields marked :data:`_SPEED_ONLY` (the same JSON otherwise)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _fingerprinted(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not f.metadata.get("speed_only")}
    if isinstance(obj, (list, tuple)):
        return [_fingerprinted(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _fingerprinted(v) for k, v in obj.items()}
    return obj


# ================================================================================ search budget


@dataclass
class SearchBudget:
    """N, K and the search cap: the one home of the three numbers every stage agrees on.

    The profile holds one instance; :class:`ProtocolConfig` (the prompts state K and the cap),
    :class:`RolloutConfig` (the engine retrieves N, shows K, stops at the cap) and the evaluation
    harness hold a reference to that same object, so they cannot disagree.
    """

    topn: int = 50  # N: candidates the retriever returns per sub-query (paper: 50)
    topk: int = 5  # K: passages the ranker keeps and the agent reads per search (paper: 5)
    max_searches: int = 6  # search calls allowed per trajectory (paper: 6); the turn after the last must answer

    def __post_init__(self) -> None:
        for name in ("topn", "topk", "max_searches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"search.{name} must be an int >= 1, got {value!r}")
        if self.topk > self.topn:
            raise ValueError(f"need search.topk <= search.topn, got topk={self.topk}, topn={self.topn}")


# ================================================================================ world


def _default_mix() -> dict[str, float]:
    # Paper's training set: NQ 40%, HotpotQA 28%, MuSiQue 18%, 2Wiki 15%; we also train on the
    # other families a little so every data_source has in-distribution training examples.
    return {"syn_nq": 0.28, "syn_triviaqa": 0.08, "syn_popqa": 0.08, "syn_hotpotqa": 0.24,
            "syn_2wiki": 0.12, "syn_musique": 0.14, "syn_bamboogle": 0.06}


_RATES = ("near_duplicate_rate", "distractor_rate", "near_name_rate", "namesake_rate", "indirect_rate",
          "spouse_rate", "member_rate")


@dataclass
class WorldConfig:
    seed: int = 0  # master seed: the same config always gives byte-identical files
    n_people: int = 640  # people (novelists, film directors, composers, scientists, ...)
    n_works: int = 520  # novels, films and albums, each made by one person
    n_orgs: int = 160  # organisations (publishers, studios, universities, ...)
    n_cities: int = 140  # cities, each in one country
    n_countries: int = 16  # countries, each with a capital and an official language
    n_train_questions: int = 2000  # training questions, families mixed by train_mix
    n_dev_per_family: int = 50  # dev questions per family
    n_test_per_family: int = 100  # test questions per family
    split_fractions: tuple[float, float, float] = (0.6, 0.15, 0.25)  # share of entities in the train/dev/test components
    near_duplicate_rate: float = 0.30  # near-duplicate passages per main passage (1/3 paraphrases, 2/3 missing one fact)
    distractor_rate: float = 0.10  # distractor passages per main passage (mention entities, state none of their facts)
    near_name_rate: float = 0.8  # share of people, cities, organisations and works named after a confusable earlier name (look-alikes compete for every search)
    namesake_rate: float = 0.10  # share of people who share the exact name of an earlier person (other occupation; titles and questions disambiguate)
    mention_pages: float = 1.0  # hard negatives per entity: "Circle of X"-style passages naming X whose sentences state *other* entities' values of X's relations, in the questions' words
    mention_sentences: int = 3  # such sentences per mention passage, each about a different relation of X
    indirect_rate: float = 0.5  # share of fact sentences worded unlike the questions ("a native of" for "born in")
    spouse_rate: float = 0.5  # share of people married to another person of their component
    member_rate: float = 0.8  # share of people who work for an organisation
    min_passage_words: int = 60  # passages are padded with neutral sentences up to at least this many words
    max_passage_words: int = 150  # and never exceed this many words
    train_mix: dict[str, float] = field(default_factory=_default_mix)  # family -> share of the training questions

    def __post_init__(self) -> None:
        self.split_fractions = tuple(float(x) for x in self.split_fractions)  # YAML gives a list
        for name in ("n_people", "n_works", "n_orgs", "n_cities", "n_countries"):
            if getattr(self, name) < 6:
                raise ValueError(f"WorldConfig.{name} must be >= 6 (two per component), got {getattr(self, name)}")
        if len(self.split_fractions) != 3 or min(self.split_fractions) <= 0:
            raise ValueError(f"WorldConfig.split_fractions must be three positive shares, got {self.split_fractions}")
        for name in _RATES:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorldConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.mention_pages <= 5.0:
            raise ValueError(f"WorldConfig.mention_pages must be in [0, 5], got {self.mention_pages}")
        if not 1 <= self.mention_sentences <= 6:
            raise ValueError(f"WorldConfig.mention_sentences must be in 1..6, got {self.mention_sentences}")
        if set(self.train_mix) != set(_default_mix()) or min(self.train_mix.values()) < 0:
            raise ValueError(f"WorldConfig.train_mix needs a share >= 0 for each of {sorted(_default_mix())}, "
                             f"got {self.train_mix}")
        if not 20 <= self.min_passage_words < self.max_passage_words - 30:
            raise ValueError("WorldConfig needs 20 <= min_passage_words < max_passage_words - 30, got "
                             f"{self.min_passage_words}, {self.max_passage_words}")

    @classmethod
    def tiny(cls, seed: int = 0) -> WorldConfig:
        """A world of ~500 passages for CI and quick demos (generates in a fraction of a second)."""
        return cls(seed=seed, n_people=50, n_works=40, n_orgs=14, n_cities=14, n_countries=8,
                   n_train_questions=100, n_dev_per_family=5, n_test_per_family=10)


# ================================================================================ retrieval


@dataclass
class EncoderConfig:
    model: str = "all-minilm-l6-v2"  # bundled name, local folder or hub id (e.g. intfloat/e5-base-v2)
    pooling: str = "mean"  # "mean" over unmasked tokens, or "cls" (first token)
    max_length: int = 256  # tokens per text; longer texts are truncated (Search-R1 uses 256 for e5)
    batch_size: int = 64  # texts per forward pass
    fp16: bool = True  # half precision on CUDA (ignored on CPU)
    e5_prefixes: bool | None = None  # add "query: "/"passage: "; None = on when the model name contains "e5"

    def __post_init__(self) -> None:
        if self.pooling not in {"mean", "cls"}:
            raise ValueError(f"pooling must be 'mean' or 'cls', got {self.pooling!r}")
        if self.max_length < 1 or self.batch_size < 1:
            raise ValueError("max_length and batch_size must be positive")

    @property
    def use_e5_prefixes(self) -> bool:
        if self.e5_prefixes is not None:
            return self.e5_prefixes
        return "e5" in self.model.lower().replace("\\", "/").split("/")[-1]


@dataclass
class ServerConfig:
    """Where the server listens and the limits it enforces on every request."""

    host: str = "127.0.0.1"  # interface to bind; loopback unless you mean to expose the index
    port: int = 8000  # TCP port; 0 picks a free port (serve_in_background reports the real one)
    default_topk: int = 3  # topk used when a request omits it (Search-R1's default is 3)
    max_topk: int = 100  # largest topk accepted; also capped by the corpus size when known
    max_queries_per_request: int = 256  # most queries one POST may carry
    max_query_chars: int = 2_000  # longest query string accepted (characters)
    max_batch_queries: int = 64  # most queries the batcher sends to the backend in one call
    batch_wait_ms: float = 2.0  # how long the batcher waits for more requests to fill a batch
    max_body_bytes: int = 1_000_000  # largest request body accepted (bytes)
    max_pending_queries: int = 8_192  # queued queries beyond which new requests get 503
    request_timeout_s: float = 120.0  # a request waiting longer than this gets 504
    body_timeout_s: float = 10.0  # a client that takes longer than this to send its body gets 408 (a stalled sender)
    retry_after_s: int = 1  # Retry-After of a 503 (queue full): when an overloaded client should try again
    log_level: str = "warning"  # uvicorn log level

    def __post_init__(self) -> None:
        positive = ["default_topk", "max_topk", "max_queries_per_request", "max_query_chars",
                    "max_batch_queries", "max_body_bytes", "max_pending_queries"]
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerConfig.{name} must be a positive int, got {value!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"ServerConfig.port must be in 0..65535, got {self.port!r}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"ServerConfig.default_topk={self.default_topk} exceeds "
                             f"max_topk={self.max_topk}")
        if self.batch_wait_ms < 0 or self.request_timeout_s <= 0 or self.body_timeout_s <= 0 or self.retry_after_s < 0:
            raise ValueError("ServerConfig: batch_wait_ms and retry_after_s must be >= 0, request_timeout_s and "
                             "body_timeout_s > 0")


# ================================================================================ models and generation


@dataclass
class SamplingConfig:
    """How to sample; one config per ``generate`` call (every row shares it)."""

    temperature: float = 1.0  # softmax temperature; 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    max_new_tokens: int = 256  # generated-token budget per row (finish_reason "length" when hit)
    stop: tuple[str, ...] = ()  # stop strings: generation ends right AFTER the first occurrence, which is kept
    seed: int | None = None  # base seed; row i samples with its own generator seeded derive_seed(seed, row_key_i)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        bad = [s for s in self.stop if not isinstance(s, str) or not s]
        if bad:
            raise ValueError(f"stop strings must be non-empty strings, got {bad!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


#: Generation backends (models.generation.backend_factory.make_backend).
BACKEND_KINDS = ("transformers", "vllm", "unsloth")

#: Backends :func:`load_policy_model` can train with ("vllm" alone only generates).
TRAIN_BACKENDS = ("transformers", "unsloth")


@dataclass
class LoraSettings:
    r: int = 16  # LoRA rank
    alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    dropout: float = 0.0  # LoRA dropout (0: the GRPO ratio needs deterministic forward passes)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Llama/Qwen-style linear layers

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        if self.r < 1 or self.alpha <= 0:
            raise ValueError(f"LoraSettings needs r >= 1 and alpha > 0, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")


# ================================================================================ agent and ranker

#: The tags around an observation (counted in ``max_observation_chars``).
OBSERVATION_OPEN, OBSERVATION_CLOSE = "<information>\n", "\n</information>"


@dataclass
class ProtocolConfig:
    max_passage_chars: int = 2000  # cap on one passage the agent reads (released code: 2,000)
    max_observation_chars: int = 4096  # cap on a whole observation, tags included (released code: 4,096)
    ranker_passage_chars: int = 600  # cap on one candidate in the ranker prompt; CPU budget: the paper shows whole passages
    instructions_in_system: bool = False  # put the instructions in a system message (some templates, e.g. Gemma's, reject one)
    worked_example: bool = True  # show one worked search/answer example in the agent prompt (~150 tokens; a warm-started agent needs none)
    search: SearchBudget = field(default_factory=SearchBudget, metadata=_SHARED)  # K and the cap stated in the prompts: the profile's ``search``

    def __post_init__(self) -> None:
        for name in ("max_passage_chars", "max_observation_chars", "ranker_passage_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProtocolConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_observation_chars < len(OBSERVATION_OPEN) + len(OBSERVATION_CLOSE) + 1:
            raise ValueError(f"ProtocolConfig.max_observation_chars={self.max_observation_chars} cannot hold the <information> tags")


#: An agent turn ends after a tool call or an answer.
AGENT_STOPS = ("</tool_call>", "</answer>")


# --------------------------------------------------------------------------- rule sets: the paper's or the release's


#: Where the paper's equations and the authors' released code differ, one named option each
#: (docs/METHOD.md, "Rule sets", has an example input per option). The profile's top-level
#: ``rules:`` picks one of :data:`RULE_SETS`; every stage reads the same object.
RULE_OPTIONS: dict[str, tuple[str, str]] = {
    "f1_arithmetic": ("overlap", "precision_recall"),
    "trivial_golds": ("drop_each", "drop_if_all"),
    "ranker_output": ("strict", "released"),
    "agent_format": ("strict", "released"),
    "dedupe_key": ("ranking", "rerank_text"),
    "zero_variance": ("tolerance", "exact"),
    "empty_subqueries": ("apart", "together"),
    "reward_dtype": ("float64", "float32"),
}


@dataclass(frozen=True)
class RuleSet:
    """One value per :data:`RULE_OPTIONS` entry; the first value of each is the paper's (the default)."""

    name: str = "paper"  # "paper" or "released", or "custom" for a mix
    f1_arithmetic: str = "overlap"  # token F1 as 2*overlap/(|pred|+|gold|) (exact at 0.8), or P, R then 2PR/(P+R) in floats (release)
    trivial_golds: str = "drop_each"  # pseudo-relevance: drop every gold normalising to yes/no/true/false, or none unless all are trivial by lower+strip (release)
    ranker_output: str = "strict"  # ranker validity: the strict tag protocol, or the release's (one reason block; only what follows the last </reason> is checked)
    agent_format: str = "strict"  # Eq. 4's format verdict: the strict protocol, or the release's tag counts and order (no check of extra text, JSON or tool name)
    dedupe_key: str = "ranking"  # duplicate ranker outputs (dedupe on): same prompt and parsed ranking, or same prompt and raw <rerank> text (release)
    zero_variance: str = "tolerance"  # a group is flat when its rewards differ by <= 1e-9, or when they are equal floats (release)
    empty_subqueries: str = "apart"  # exact-match grouping: empty sub-queries each alone, or all in one group (release)
    reward_dtype: str = "float64"  # rewards enter the advantages as float64, or rounded to float32 first (release stores scores as float32)

    def __post_init__(self) -> None:
        for option, allowed in RULE_OPTIONS.items():
            if getattr(self, option) not in allowed:
                raise ValueError(f"rules.{option} must be one of {allowed}, got {getattr(self, option)!r}")

    @property
    def released(self) -> bool:
        return self.name == "released"


RULE_SETS: dict[str, RuleSet] = {
    "paper": RuleSet(),
    "released": RuleSet("released", **{option: allowed[1] for option, allowed in RULE_OPTIONS.items()}),
}


def rule_set(name: str) -> RuleSet:
    """The rule set called ``name`` ("paper" or "released")."""
    if name not in RULE_SETS:
        raise ValueError(f"rules must be one of {sorted(RULE_SETS)}, got {name!r}")
    return RULE_SETS[name]


@dataclass
class RolloutConfig:
    agent_max_new_tokens: int = 256  # generated tokens per agent turn
    ranker_max_new_tokens: int = 160  # generated tokens per ranker call
    temperature: float = 1.0  # sampling temperature of both policies (0 = greedy)
    top_p: float = 1.0  # nucleus sampling of both policies
    ranker_temperature: float | None = None  # ranker's own temperature; None = same as the agent's
    max_context_tokens: int = 8192  # a trajectory longer than this is cut (finish "max_tokens")
    stop_on_invalid: bool = True  # retire a trajectory at its first protocol violation (else: corrective note, go on)
    search: SearchBudget = field(default_factory=SearchBudget, metadata=_SHARED)  # N, K and the cap: the profile's ``search``
    rules: RuleSet = field(default_factory=RuleSet, metadata=_SHARED)  # ranker validity, agent format, pseudo-relevance: the profile's ``rules``

    def agent_sampling(self, seed: int) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.agent_max_new_tokens,
                              stop=AGENT_STOPS, seed=seed)

    def ranker_sampling(self, seed: int) -> SamplingConfig:
        t = self.temperature if self.ranker_temperature is None else self.ranker_temperature
        return SamplingConfig(temperature=t, top_p=self.top_p, max_new_tokens=self.ranker_max_new_tokens,
                              stop=("</rerank>",), seed=seed)

# ================================================================================ rewards, grouping, GRPO, training

_VARIANTS = ("paper", "released")
_RELEVANCE = ("hit", "ndcg", "judge")
_NDCG_IDEAL = ("pool", "shown")
_FORMAT_FAIL = ("filter", "penalize")


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _choice(name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


# --------------------------------------------------------------------------- agent reward (Eq. 4)


@dataclass
class AgentRewardConfig:
    alpha: float = 0.2  # format penalty: a trajectory with any protocol violation gets -alpha
    yes_no_rule: bool | None = None  # HotpotQA yes/no rule inside the reward's token F1; None = the rule set's (paper: yes, released: no)
    rules: RuleSet = field(default_factory=RuleSet, metadata=_SHARED)  # F1 arithmetic: the profile's ``rules``

    def __post_init__(self) -> None:
        _finite("alpha", self.alpha)
        if self.alpha < 0:
            raise ValueError(f"alpha is a penalty size and must be >= 0, got {self.alpha}")
        if self.yes_no_rule is not None and not isinstance(self.yes_no_rule, bool):
            raise ValueError(f"yes_no_rule must be a bool or null, got {self.yes_no_rule!r}")

    @property
    def uses_yes_no_rule(self) -> bool:
        """``yes_no_rule`` with None resolved: on under the paper rule set, off under the released one."""
        return (not self.rules.released) if self.yes_no_rule is None else self.yes_no_rule


# --------------------------------------------------------------------------- ranker reward (Eq. 6)


@dataclass
class RankerRewardConfig:
    variant: str | None = None  # "paper" (Eq. 6) or "released" (authors' code: binarised r_main, >= rule, invalid penalty); None = the rule set's
    gamma: float = 0.5  # paper: an easy call gets r_main added only when r_rel > gamma
    relevance: str = "hit"  # r_rel: "hit" (mean Hit@k over hit_ks), "ndcg" (nDCG@K of the shown list, K = len(order)) or "judge" (mean Hit@k over an LLM judge's labels of the shown passages: rl.judge)
    hit_ks: tuple[int, ...] = (1, 3, 5)  # Hit@k cutoffs averaged into r_rel when relevance="hit"
    ndcg_ideal: str = "pool"  # nDCG normaliser: "pool" (best of all N candidates, as the release) or "shown" (the K)
    use_main: bool = True  # False = ablation "w/o r_main": r_rank = r_rel
    use_rel: bool = True  # False = ablation "w/o r_rel": r_rank = r_main
    released_f1_threshold: float = 0.8  # released: r_main = 1 if the agent reward >= this, else 0
    released_rel_threshold: float = 0.8  # released: an easy call gets r_main added when r_rel >= this (note >=)
    invalid_ranker_penalty: float = -0.2  # reward of an invalid ranker output, when invalid outputs are penalised
    penalize_invalid_ranker: bool | None = None  # None = variant's rule (paper: no, score the fallback; released: yes)
    agent_format_fail: str | None = None  # format-failed trajectories' calls: "filter" | "penalize"; None = variant's
    rules: RuleSet = field(default_factory=RuleSet, metadata=_SHARED)  # the profile's ``rules`` (decides ``variant`` when it is None)

    def __post_init__(self) -> None:
        _choice("variant", self.variant, (None, *_VARIANTS))
        _choice("relevance", self.relevance, _RELEVANCE)
        _choice("ndcg_ideal", self.ndcg_ideal, _NDCG_IDEAL)
        _choice("agent_format_fail", self.agent_format_fail, (None, *_FORMAT_FAIL))
        for name in ("gamma", "released_f1_threshold", "released_rel_threshold", "invalid_ranker_penalty"):
            _finite(name, getattr(self, name))
        for name in ("use_main", "use_rel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.penalize_invalid_ranker is not None and not isinstance(self.penalize_invalid_ranker, bool):
            raise ValueError(f"penalize_invalid_ranker must be a bool or None, got {self.penalize_invalid_ranker!r}")
        if not (self.use_main or self.use_rel):
            raise ValueError("use_main and use_rel cannot both be False: the ranker reward would be empty")
        if isinstance(self.hit_ks, (str, bytes)) or not hasattr(self.hit_ks, "__iter__"):
            raise ValueError(f"hit_ks must be a sequence of integers >= 1, got {self.hit_ks!r}")
        ks = tuple(self.hit_ks)
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ValueError(f"hit_ks must be a non-empty sequence of integers >= 1, got {self.hit_ks!r}")
        self.hit_ks = ks  # a YAML list becomes the tuple the annotation promises

    @property
    def form(self) -> str:
        """``variant`` with None resolved: "released" under the released rule set, else "paper"."""
        if self.variant is not None:
            return self.variant
        return "released" if self.rules.released else "paper"

    @property
    def format_fail_policy(self) -> str:
        """``agent_format_fail`` with ``None`` resolved: paper -> "filter", released -> "penalize"."""
        if self.agent_format_fail is not None:
            return self.agent_format_fail
        return "filter" if self.form == "paper" else "penalize"

    @property
    def invalid_penalized(self) -> bool:
        """``penalize_invalid_ranker`` with ``None`` resolved: paper -> False, released -> True."""
        if self.penalize_invalid_ranker is not None:
            return self.penalize_invalid_ranker
        return self.form == "released"

_MODES = ("semantic", "exact", "none")


@dataclass
class GroupingConfig:
    mode: str = "semantic"  # "semantic" (Alg. 2), "exact" (identical normalised sub-query) or "none" (one group per q0)
    delta: float = 0.8  # semantic: token-F1 threshold (>=) between a sub-query and a cluster's representative
    k_min: int | None = None  # discard clusters with fewer members than this; None = the rule set's (paper: 3; release drops size <= 3, i.e. 4)
    drop_zero_variance: bool = True  # drop groups whose rewards are all equal (they carry no GRPO gradient)
    dedupe_identical: bool | None = None  # average the rewards of identical calls (same prompt and ranking); None = the rule set's (paper: no, released: yes)
    rules: RuleSet = field(default_factory=RuleSet, metadata=_SHARED)  # similarity arithmetic, dedupe key, flatness test: the profile's ``rules``

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))}; got {self.mode!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta <= 1:
            raise ValueError(f"delta must be a number in (0, 1] (a token-F1 threshold), got {self.delta!r}")
        if self.k_min is not None and (isinstance(self.k_min, bool) or not isinstance(self.k_min, int) or self.k_min < 1):
            raise ValueError(f"k_min must be an integer >= 1 or null, got {self.k_min!r}")
        if not isinstance(self.drop_zero_variance, bool):
            raise ValueError(f"drop_zero_variance must be a bool, got {self.drop_zero_variance!r}")
        if self.dedupe_identical is not None and not isinstance(self.dedupe_identical, bool):
            raise ValueError(f"dedupe_identical must be a bool or null, got {self.dedupe_identical!r}")

    @property
    def min_size(self) -> int:
        """``k_min`` with None resolved: 3 (paper), 4 (released)."""
        return (4 if self.rules.released else 3) if self.k_min is None else self.k_min

    @property
    def dedupe(self) -> bool:
        """``dedupe_identical`` with None resolved: off (paper), on (released)."""
        return self.rules.released if self.dedupe_identical is None else self.dedupe_identical

#: Ways to turn per-token values into one scalar; see :func:`masked_aggregate`.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass
class GRPOConfig:
    clip_eps: float = 0.2  # PPO clip range: ratio kept in [1 - clip_eps, 1 + eps_high] (paper: 0.2)
    clip_eps_high: float | None = None  # upper clip range; None = clip_eps (symmetric). DAPO uses 0.28
    kl_coef: float = 0.001  # weight of the k3 KL-to-reference penalty (released code: 0.001); 0 = off
    scale_std: bool = True  # divide advantages by the group std; False = mean-centring only (Dr.GRPO)
    std_eps: float = 1e-6  # added to the group std before dividing
    aggregation: str = "token-mean"  # one of AGGREGATIONS; "token-mean" = paper and released code

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_eps < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps!r}")
        if self.clip_eps_high is not None and not self.clip_eps_high > 0.0:
            raise ValueError(f"clip_eps_high must be > 0 or None, got {self.clip_eps_high!r}")
        if not self.kl_coef >= 0.0:  # also rejects NaN
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef!r}")
        if not self.std_eps >= 0.0:
            raise ValueError(f"std_eps must be >= 0, got {self.std_eps!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")

    @property
    def eps_high(self) -> float:
        """The upper clip range actually used."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

TRAINING_METHODS = ("search_r1", "fixed_ranker", "cosearch", "oracle")
#: method -> (ranking, agent trained, ranker trained); ranking "llm" uses the ranker adapter.
ROLE_TABLE = {
    "search_r1": ("retrieval", True, False),
    "fixed_ranker": ("llm", True, False),
    "cosearch": ("llm", True, True),
    "oracle": ("oracle", True, False),
}


#: What plays the ranker of the methods that rank with a model (ranking "llm" in ROLE_TABLE).
RANKER_KINDS = ("llm", "cross_encoder")


@dataclass
class CrossEncoderConfig:
    """The trainable cross-encoder of ``training.ranker_kind: cross_encoder`` (Table 3's ablation)."""

    model: str = "all-minilm-l6-v2"  # the encoder it starts from (bundled name, local folder or hub id)
    lr: float = 2e-5  # AdamW learning rate of the encoder, warm start and GRPO
    head_lr: float = 1e-3  # of the scoring head (it starts at zero; at the encoder's rate it barely moves: measured, docs/LOG.md)
    max_length: int = 192  # tokens of one (sub-query, passage) pair
    warm_start_epochs: int = 2  # listwise passes over warmstart.n_ranker gold hops before GRPO (0: none)

    def __post_init__(self) -> None:
        if not (self.lr > 0 and self.head_lr > 0) or self.max_length < 8 or self.warm_start_epochs < 0:
            raise ValueError(f"cross_encoder: lr and head_lr > 0, max_length >= 8 and warm_start_epochs >= 0, got {self!r}")


#: Tracker kinds -> the pip package each needs.
TRACKER_KINDS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_kinds(kinds: Sequence[str] | str) -> tuple[str, ...]:
    """``kinds`` as a tuple of known tracker kinds (a single string is one kind); ValueError otherwise."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in TRACKER_KINDS]
    if unknown:
        raise ValueError(f"unknown tracker kind(s) {unknown}; expected any of {tuple(TRACKER_KINDS)}")
    return tuple(dict.fromkeys(kinds))


@dataclass
class TrainConfig:
    method: str = "cosearch"  # one of TRAINING_METHODS (see the role table above)
    steps: int = 100  # training steps (paper: ~100)
    questions_per_step: int = 8  # questions rolled out per step (paper: 512)
    group_size: int = 8  # G: rollouts per question (paper: 8)
    split: str = "train"  # QA split the questions come from
    agent_lr: float = 1e-5  # AdamW learning rate of the agent's LoRA (paper, full fine-tuning: 1e-6)
    ranker_lr: float = 1e-5  # AdamW learning rate of the ranker's LoRA
    minibatches: int = 1  # optimizer steps per training step, each on a slice of the step's sequences
    micro_batch: int = 4  # sequences per forward/backward pass (memory, not maths)
    length_grouped_micro_batches: bool = True  # build micro-batches from sequences of similar length (less padding; same gradient)
    gradient_checkpointing: bool = False  # recompute activations in the update's backward pass: trades recompute for activation memory; needed for 3B-7B shapes on one GPU
    shared_prefix_update: bool = field(default=True, metadata=_SPEED_ONLY)  # the prompt prefix a role's sequences share runs once per optimizer step, not once per sequence (same gradient); off under gradient checkpointing
    max_grad_norm: float = 1.0  # gradient clipping per adapter (0 = off)
    shared_backbone: bool = False  # ablation: one adapter plays both roles
    ranker_kind: str = "llm"  # "llm": the generative ranker (paper); "cross_encoder": a trainable cross-encoder (ablation)
    cross_encoder: CrossEncoderConfig = field(default_factory=CrossEncoderConfig)  # used with ranker_kind cross_encoder
    eval_every: int = 20  # E: validation (agent F1, ranker Hit@k on held-out sub-queries) every E steps (and after the last); 0 = never
    validate_at_start: bool = False  # also validate before the first update: a step -1 row of the step records (the starting point of the curves)
    val_split: str = "dev"  # split of the validation questions
    val_per_dataset: int = 5  # validation questions per family
    checkpoint_every: int = 1  # steps between checkpoints (0 = only after the last step)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # loss: clip range, KL weight, aggregation
    agent_reward: AgentRewardConfig = field(default_factory=AgentRewardConfig)  # Eq. 4
    ranker_reward: RankerRewardConfig = field(default_factory=RankerRewardConfig)  # Eq. 6 / released variant
    grouping: GroupingConfig = field(default_factory=GroupingConfig)  # Alg. 2 and its ablations
    log_to: tuple[str, ...] = ()  # live logging of the step records: "tensorboard" and/or "wandb" (rl/tracking.py)
    wandb_project: str = "cosearch"  # W&B project of the runs (with "wandb" in log_to)

    def __post_init__(self) -> None:
        if self.method not in TRAINING_METHODS:
            raise ValueError(f"TrainConfig.method must be one of {TRAINING_METHODS}, got {self.method!r}")
        for name in ("steps", "questions_per_step", "minibatches", "micro_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"TrainConfig.group_size must be >= 2 (GRPO compares samples), got {self.group_size}")
        if self.grpo.aggregation == "seq-mean-token-sum-norm":
            raise ValueError("the trainer splits batches into micro-batches, which needs 'token-mean' or "
                             "'seq-mean-token-mean' aggregation")
        for name in ("eval_every", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("length_grouped_micro_batches", "gradient_checkpointing", "shared_prefix_update", "validate_at_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TrainConfig.{name} must be a bool, got {getattr(self, name)!r}")
        try:
            self.log_to = check_kinds(self.log_to)
        except ValueError as err:
            raise ValueError(f"TrainConfig.log_to: {err}") from None
        if self.ranker_kind not in RANKER_KINDS:
            raise ValueError(f"TrainConfig.ranker_kind must be one of {RANKER_KINDS}, got {self.ranker_kind!r}")
        if self.ranker_kind == "cross_encoder" and self.shared_backbone:
            raise ValueError("a shared backbone plays both roles with one LLM adapter; it cannot be combined with "
                             "ranker_kind 'cross_encoder'")
        if not isinstance(self.wandb_project, str) or not self.wandb_project.strip():
            raise ValueError(f"TrainConfig.wandb_project must be a non-empty string, got {self.wandb_project!r}")

    @property
    def ranking(self) -> str:
        return ROLE_TABLE[self.method][0]

    def roles(self) -> dict[str, str | None]:
        """role -> adapter name (None: the role is played by a rule, not a policy)."""
        ranker = "ranker" if self.ranking == "llm" and self.ranker_kind == "llm" else None
        if self.shared_backbone:
            return {"agent": "shared", "ranker": "shared" if ranker else None}
        return {"agent": "agent", "ranker": ranker}

    @property
    def uses_cross_encoder(self) -> bool:
        """The method ranks with a model and that model is the cross-encoder (no ranker adapter)."""
        return self.ranking == "llm" and self.ranker_kind == "cross_encoder"

    def trainable(self) -> set[str]:
        _, agent, ranker = ROLE_TABLE[self.method]
        roles = self.roles()
        return {roles[r] for r, on in (("agent", agent), ("ranker", ranker)) if on and roles[r]}


# --------------------------------------------------------------------------- supervised warm start


@dataclass
class WarmStartConfig:
    enabled: bool = True  # False: no warm start (GRPO starts from the model as shipped, as the paper's 7B runs do)
    split: str = "train"  # QA split the gold data comes from
    n_agent: int = 256  # gold agent trajectories to train on
    n_ranker: int = 256  # gold rankings to train on
    epochs: float = 1.0  # passes over each role's gold data
    learning_rate: float = 2e-4  # AdamW learning rate of the LoRA weights
    batch_size: int = 4  # sequences per optimizer step (per device)
    grad_accum: int = 1  # micro-batches accumulated per optimizer step
    warmup_ratio: float = 0.05  # linear warm-up share of the steps, then linear decay
    max_length: int = 4096  # sequences are cut to this many tokens (their start is kept)
    logging_steps: int = 5  # optimizer steps between logged losses
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory for large models, slower (TRL's default is on)

    def __post_init__(self) -> None:
        for name in ("n_agent", "n_ranker", "batch_size", "grad_accum", "max_length", "logging_steps"):
            if getattr(self, name) < 0 or (name not in ("n_agent", "n_ranker") and getattr(self, name) < 1):
                raise ValueError(f"WarmStartConfig.{name} must be positive, got {getattr(self, name)}")
        if self.epochs <= 0 or self.learning_rate <= 0:
            raise ValueError("WarmStartConfig.epochs and learning_rate must be > 0")


@dataclass
class DataConfig:
    corpus_path: str | None = None  # wiki-18-format corpus (.jsonl/.jsonl.gz); None = the embedded world
    index_path: str | None = None  # prebuilt FAISS index for that corpus (e.g. wiki-18 e5_Flat.index); None = build and cache
    qa_paths: dict[str, str] = field(default_factory=dict)  # split -> QA file (Search-R1/CoSearch parquet, FlashRAG jsonl); empty = the world's splits


@dataclass
class RetrievalConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # the dense encoder
    index_kind: str = "flat"  # "flat" (exact inner product) or "hnsw" (approximate)
    hnsw_m: int = 32  # HNSW graph degree (hnsw only)
    ef_search: int = 128  # HNSW search breadth (hnsw only)
    mmap_index: bool = False  # memory-map the index instead of reading it into RAM (for indexes larger than RAM)

    def __post_init__(self) -> None:
        if self.index_kind not in {"flat", "hnsw"}:
            raise ConfigError(f"retrieval.index_kind must be 'flat' or 'hnsw', got {self.index_kind!r}")


@dataclass
class ModelsConfig:
    agent: str = "smollm2-135m-instruct"  # agent policy: bundled name, local folder or hub id
    ranker: str = "smollm2-135m-instruct"  # generative ranker policy (the same name shares one loaded base)
    backend: str = "transformers"  # generation backend: "transformers" (CPU/GPU), "vllm" or "unsloth" (GPU)
    batch_size: int = 8  # prompts per forward pass of the transformers backend
    compile_decode: bool | None = field(default=None, metadata=_SPEED_ONLY)  # transformers backend: compiled decode step on a static cache (None: on a GPU only)

    def __post_init__(self) -> None:
        if self.backend not in {"transformers", "vllm", "unsloth"}:
            raise ConfigError(f"models.backend must be transformers, vllm or unsloth, got {self.backend!r}")

    def transformers_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`cosearch_lib.models.generation.transformers_backend.TransformersBackend` set by the profile."""
        return {"batch_size": self.batch_size, "compile_decode": self.compile_decode}


@dataclass
class SlurmConfig:
    """The ``#SBATCH`` lines of the jobs ``cosearch grid --slurm`` writes (one array task per grid
    cell, then one aggregation job). Edit them per cluster in the profile, or in the written
    ``.sbatch`` files before submitting them by hand."""

    partition: str | None = None  # --partition (None: the cluster's default)
    account: str | None = None  # --account
    gres: str | None = "gpu:1"  # --gres of an array task (None: CPU-only tasks)
    cpus_per_task: int = 16
    mem: str = "128G"
    time: str = "24:00:00"  # per array task
    aggregate_time: str = "02:00:00"  # the aggregation job (notebooks 04 and 05)
    max_parallel: int = 0  # array throttle "%M" (0: no limit)
    extra: tuple[str, ...] = ()  # further #SBATCH options, e.g. "--constraint=a100"
    signal_lead_s: int = 600  # array tasks get SIGUSR1 this long before their time limit, checkpoint and requeue (0: no warning); make it longer than one training step
    requeue: bool = True  # --requeue: a preempted or failed-node task goes back to the queue (and resumes from its checkpoint)

    def __post_init__(self) -> None:
        self.extra = tuple(self.extra)
        if isinstance(self.signal_lead_s, bool) or not isinstance(self.signal_lead_s, int) or self.signal_lead_s < 0:
            raise ValueError(f"signal_lead_s must be an integer >= 0 (seconds), got {self.signal_lead_s!r}")
        if not isinstance(self.requeue, bool):
            raise ValueError(f"requeue must be a bool, got {self.requeue!r}")
        for name in ("cpus_per_task", "max_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "max_parallel" else 1):
                raise ValueError(f"{name} must be an integer >= {0 if name == 'max_parallel' else 1}, got {value!r}")
        for line in self.extra:
            if not isinstance(line, str) or not line.startswith("--"):
                raise ValueError(f"extra: each entry is one sbatch option starting with '--', got {line!r}")


@dataclass
class GridsConfig:
    """Grids of runs on this profile (``records.grid``, ``cosearch grid``).

    ``run`` names the cells ``cosearch run`` (``make demo``) runs before the grids' aggregate notebooks
    (04, 05): a reduced grid sized for the profile; the other cells stay for ``cosearch grid``.
    ``parameters`` are notebook parameters every grid cell of this profile gets (the cell budget, e.g.
    fewer GRPO steps), over the grid file's and under the cell's own; ``cosearch grid`` applies them too,
    so every cell of one profile is run alike and comparable."""

    run: dict[str, list[str]] = field(default_factory=dict)  # grid name -> cell names to run inside `cosearch run`
    parameters: dict[str, Any] = field(default_factory=dict)  # notebook parameters of every grid cell on this profile

    def __post_init__(self) -> None:
        if not isinstance(self.run, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(c, str) for c in v)
                for k, v in self.run.items()):
            raise ValueError(f"run: expected a mapping of grid name -> non-empty list of cell names, got {self.run!r}")
        if not isinstance(self.parameters, dict):
            raise ValueError(f"parameters: expected a mapping of notebook parameter -> value, got {self.parameters!r}")


#: The answer F1 the evaluation tables report (EvaluationConfig.f1; metrics.answer_f1).
EVAL_F1_METRICS = ("plain", "yes_no")


@dataclass
class EvaluationConfig:
    split: str = "test"  # which split the evaluation harness reads
    n_per_dataset: int | None = None  # questions per data source (None = all)
    n_samples: int = 1  # rollouts per question at evaluation
    temperature: float = 0.0  # evaluation sampling temperature (0 = greedy)
    answer_max_new_tokens: int = 64  # tokens of the direct / RAG replies (CoT and agent turns: rollout.agent_max_new_tokens)
    f1: str = "plain"  # answer F1 of the tables: "plain" (SQuAD token F1 as the paper's code computes it) or "yes_no" (HotpotQA's yes/no rule)

    def __post_init__(self) -> None:
        _choice("evaluation.f1", self.f1, EVAL_F1_METRICS)


@dataclass
class ProfileConfig:
    profile: str = "demo"  # profile name; executed notebooks land in papermill_runs/<profile>/
    seed: int = 0  # the one seed every random choice derives from
    rules: str = "paper"  # rule set: "paper" (the paper's equations, strict protocol) or "released" (the authors' code); docs/METHOD.md
    search: SearchBudget = field(default_factory=SearchBudget)  # N, K and the search cap, shared by reference with protocol and rollout
    world: WorldConfig = field(default_factory=WorldConfig)  # the embedded world (used when data.corpus_path is None)
    data: DataConfig = field(default_factory=DataConfig)  # real corpora / QA files for cluster runs
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)  # encoder and index
    server: ServerConfig = field(default_factory=ServerConfig)  # the HTTP retrieval server
    models: ModelsConfig = field(default_factory=ModelsConfig)  # agent and ranker models, backend
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # token budgets and sampling of the multi-turn loop
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)  # the evaluation harness
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)  # prompts and passage caps
    lora: LoraSettings = field(default_factory=LoraSettings)  # LoRA adapters of both policies (warm start and GRPO)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)  # supervised warm start on gold data
    training: TrainConfig = field(default_factory=TrainConfig)  # joint GRPO training
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)  # notebook stem -> papermill parameters for it (checked against its parameters cell)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)  # resources of the jobs `cosearch grid --slurm` submits
    grids: GridsConfig = field(default_factory=GridsConfig)  # the reduced grid `cosearch run` runs, and every cell's budget

    def __post_init__(self) -> None:
        # one SearchBudget object, shared by reference: the prompts, the rollout engine and the
        # harness built from this profile can never disagree on N, K or the cap
        self.protocol.search = self.search
        self.rollout.search = self.search
        rules = rule_set(self.rules)  # and one rule set, read by every stage
        self.rollout.rules = rules
        self.training.agent_reward.rules = rules
        self.training.ranker_reward.rules = rules
        self.training.grouping.rules = rules
        if not isinstance(self.notebooks, dict) or not all(isinstance(v, dict) for v in self.notebooks.values()):
            raise ConfigError(f"notebooks: expected a mapping of notebook -> {{parameter: value}}, got {self.notebooks!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short stable hash of the named sections (all when none), for cache folder names; fields
        that only change speed (:data:`_SPEED_ONLY`) are left out."""
        d = _fingerprinted(self)
        picked = {k: d[k] for k in sections} if sections else d
        return hashlib.sha1(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:12]

    @property
    def uses_embedded_world(self) -> bool:
        return self.data.corpus_path is None


def from_dict(cls: type, data: dict | None, where: str = "") -> Any:
    """Build dataclass ``cls`` from a (possibly nested) dict, rejecting unknown keys by name."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where or cls.__name__}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        key = f"{where}.{name}" if where else name
        if fields[name].metadata.get("shared"):
            raise ConfigError(f"{key}: set in the profile's top-level '{name}:' section, which every stage shares")
        if dataclasses.is_dataclass(hint):
            kwargs[name] = from_dict(hint, value, key)
        else:
            kwargs[name] = _check_scalar(value, hint, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err


def _check_scalar(value: Any, hint: Any, key: str) -> Any:
    """Light type check of YAML scalars against the field's annotation (int/float/str/bool/None)."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    plain = tuple(t for t in allowed if t in (int, float, str, bool, type(None)))
    if not plain or len(plain) != len(allowed):
        return value  # containers and other types: trust the dataclass
    if isinstance(value, bool) and bool not in plain:
        raise ConfigError(f"{key}: expected {_names(plain)}, got a boolean")
    if isinstance(value, int) and not isinstance(value, bool) and float in plain and int not in plain:
        return float(value)
    if not isinstance(value, plain):
        raise ConfigError(f"{key}: expected {_names(plain)}, got {value!r}")
    return value


def _names(types: tuple) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def profile_path(name_or_path: str | Path) -> Path:
    """``"demo"`` -> ``papermill_runs/params/demo.yaml``; a path to a .yaml file is used as is."""
    p = Path(name_or_path)
    if p.suffix in {".yaml", ".yml"}:
        return p
    return params_dir() / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in params_dir().glob("*.yaml"))


def _merged(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """``child`` over ``base``, section by section (nested mappings merge; anything else replaces)."""
    out = dict(base)
    for key, value in child.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping (profiles, grid files); ConfigError naming the file otherwise
    (``what`` completes "<path>: ..." when the top level is not a mapping)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what}, got {type(data).__name__}")
    return data


def profile_data(name_or_path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A profile file's mapping, with ``extends: <profile>`` resolved: the named profile's settings
    first, this file's on top (so a larger profile can reuse a smaller one's world, models and
    warm start and change only what it scales up)."""
    path = profile_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"no profile file {path}; available profiles: {available_profiles()}")
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: 'extends' loops back to itself ({' -> '.join(p.stem for p in _seen)})")
    data = read_yaml_mapping(path, "a profile is a mapping of settings")
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: 'extends' names one profile, got {base!r}")
    return _merged(profile_data(base, (*_seen, path.resolve())), data)


def load_profile(name_or_path: str | Path = "demo", **overrides: Any) -> ProfileConfig:
    """Read a profile; keyword overrides replace top-level scalars (e.g. ``seed=3`` from papermill)."""
    path = profile_path(name_or_path)
    data = profile_data(name_or_path)
    for key, value in overrides.items():
        if value is not None:
            data[key] = value
    try:
        return from_dict(ProfileConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def papermill_parameters(name_or_path: str | Path) -> dict[str, Any]:
    """The top-level scalars of a profile (``extends`` resolved): what papermill injects into each notebook."""
    data = profile_data(name_or_path)
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
