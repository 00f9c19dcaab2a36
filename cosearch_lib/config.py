"""Profiles: one YAML file per profile under ``papermill_runs/params/``, mapped onto dataclasses.

Each module owns the dataclass of its own settings (``WorldConfig`` in world/config.py, ``EncoderConfig``
in retrieval/encoder.py, ...), with its defaults and a one-line doc per field; that is the one
source of defaults. A profile YAML only states what differs from them. Unknown keys are errors,
not silently ignored, so a typo in a profile cannot quietly run the default.

The YAML's top-level scalars (``profile``, ``seed``) double as the papermill parameters the runner
injects into every notebook; the nested sections are read by :func:`load_profile`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .paths import params_dir
from .retrieval.encoder import EncoderConfig
from .retrieval.server import ServerConfig
from .policies import LoraSettings
from .protocol import ProtocolConfig
from .rollout import RolloutConfig
from .training import TrainConfig
from .warmstart import WarmStartConfig
from .world import WorldConfig


class ConfigError(ValueError):
    """A profile file that does not match the configuration dataclasses."""


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
    topn: int = 50  # N: candidates the retriever returns per sub-query (paper: 50)
    topk: int = 5  # K: passages the agent reads per search (paper: 5)

    def __post_init__(self) -> None:
        if self.index_kind not in {"flat", "hnsw"}:
            raise ConfigError(f"retrieval.index_kind must be 'flat' or 'hnsw', got {self.index_kind!r}")
        if not 1 <= self.topk <= self.topn:
            raise ConfigError(f"need 1 <= retrieval.topk <= retrieval.topn, got topk={self.topk}, topn={self.topn}")


@dataclass
class ModelsConfig:
    agent: str = "smollm2-135m-instruct"  # agent policy: bundled name, local folder or hub id
    ranker: str = "smollm2-135m-instruct"  # generative ranker policy (the same name shares one loaded base)
    backend: str = "transformers"  # generation backend: "transformers" (CPU/GPU), "vllm" or "unsloth" (GPU)
    batch_size: int = 8  # prompts per forward pass of the transformers backend

    def __post_init__(self) -> None:
        if self.backend not in {"transformers", "vllm", "unsloth"}:
            raise ConfigError(f"models.backend must be transformers, vllm or unsloth, got {self.backend!r}")


@dataclass
class EvalSettings:
    split: str = "test"  # which split the evaluation harness reads
    n_per_dataset: int | None = None  # questions per data source (None = all)
    n_samples: int = 1  # rollouts per question at evaluation
    temperature: float = 0.0  # evaluation sampling temperature (0 = greedy)
    answer_max_new_tokens: int = 64  # tokens of the direct / RAG replies (CoT and agent turns: rollout.agent_max_new_tokens)


@dataclass
class ProfileConfig:
    profile: str = "demo"  # profile name; executed notebooks land in papermill_runs/<profile>/
    seed: int = 0  # the one seed every random choice derives from
    world: WorldConfig = field(default_factory=WorldConfig)  # the embedded world (used when data.corpus_path is None)
    data: DataConfig = field(default_factory=DataConfig)  # real corpora / QA files for cluster runs
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)  # encoder, index, N and K
    server: ServerConfig = field(default_factory=ServerConfig)  # the HTTP retrieval server
    models: ModelsConfig = field(default_factory=ModelsConfig)  # agent and ranker models, backend
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # multi-turn budget (N and K come from retrieval)
    evaluation: EvalSettings = field(default_factory=EvalSettings)  # the evaluation harness
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)  # prompts and passage caps (K and the search cap come from retrieval / rollout)
    lora: LoraSettings = field(default_factory=LoraSettings)  # LoRA adapters of both policies (warm start and GRPO)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)  # supervised warm start on gold data
    training: TrainConfig = field(default_factory=TrainConfig)  # joint GRPO training

    def __post_init__(self) -> None:
        # N, K and the search cap each have one home; a different value elsewhere is a mistake
        for section, name, home, home_name in (
            ("rollout", "topn", self.retrieval, "retrieval.topn"),
            ("rollout", "topk", self.retrieval, "retrieval.topk"),
            ("protocol", "topk", self.retrieval, "retrieval.topk"),
            ("protocol", "max_search_turns", self.rollout, "rollout.max_searches"),
        ):
            target = getattr(self, section)
            wanted = getattr(home, home_name.split(".")[1])
            given, default = getattr(target, name), getattr(type(target)(), name)
            if given not in (wanted, default):
                raise ConfigError(f"{section}.{name}={given} disagrees with {home_name}={wanted}; set it there only")
            setattr(target, name, wanted)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short stable hash of the named sections (all when none), for cache folder names."""
        d = self.to_dict()
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


def load_profile(name_or_path: str | Path = "demo", **overrides: Any) -> ProfileConfig:
    """Read a profile; keyword overrides replace top-level scalars (e.g. ``seed=3`` from papermill)."""
    path = profile_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"no profile file {path}; available profiles: {available_profiles()}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    for key, value in overrides.items():
        if value is not None:
            data[key] = value
    try:
        return from_dict(ProfileConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def papermill_parameters(name_or_path: str | Path) -> dict[str, Any]:
    """The top-level scalars of a profile file: what papermill injects into each notebook."""
    data = yaml.safe_load(profile_path(name_or_path).read_text()) or {}
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
