"""From a profile to its on-disk retrieval artefacts: world or real corpus -> corpus store -> index.

Every stage is cached on disk under ``data/`` and keyed by the settings that determine it, so a
notebook re-run (or a second notebook) reuses the world, the store and the index instead of
re-encoding (``experiment.build_retriever`` puts them together). Layout::

    data/worlds/<world-fingerprint>/          corpus.jsonl, train/dev/test.parquet, world.json
        store/                                CorpusStore (memory-mapped rows, O(1) id lookup)
        index/<encoder>-<kind>-<fp>.faiss     FAISS index (+ .json with what built it)
    data/corpora/<name>-<fp>/store/           the same for a real corpus (wiki-18)
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosearch_lib.atomic_io import build_lock
from cosearch_lib.config import ProfileConfig
from cosearch_lib.paths import data_dir, profile_data_path, project_relative
from cosearch_lib.retrieval.corpus_store import CorpusStore
from cosearch_lib.retrieval.encoder import TextEncoder
from cosearch_lib.retrieval.faiss_index import load_index, save_index, to_gpu
from cosearch_lib.retrieval.index_shards import build_in_shards
from cosearch_lib.retrieval.relevance_sets import sidecar_path
from cosearch_lib.run_schema import file_sha256
from cosearch_lib.world.io import build_world


@dataclass
class CorpusPaths:
    """Where a profile's corpus, store, index and QA files are."""

    root: Path  # folder holding this corpus' derived artefacts
    corpus: Path  # the wiki-18-format jsonl(.gz)
    store: Path  # CorpusStore folder
    index: Path  # FAISS index file
    qa: dict[str, Path]  # split -> QA file


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower()[:60]


def _hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


def user_path(cfg: ProfileConfig, p: str) -> Path:
    """A path of the profile's ``data`` section: absolute as given, relative against ``data.root``."""
    return profile_data_path(cfg.data.root, p)


def corpus_paths(cfg: ProfileConfig) -> CorpusPaths:
    """Decide (without building anything) where each artefact of this profile lives."""
    rcfg = cfg.retrieval
    index_key = _hash({"encoder": asdict(rcfg.encoder), "kind": rcfg.index_kind, "m": rcfg.hnsw_m})
    index_name = f"{_slug(rcfg.encoder.model)}-{rcfg.index_kind}-{index_key}.faiss"
    if cfg.uses_embedded_world:
        root = data_dir() / "worlds" / cfg.fingerprint("world")
        corpus = root / "corpus.jsonl"
        qa = {split: root / f"{split}.parquet" for split in ("train", "dev", "test")}
    else:
        corpus = user_path(cfg, cfg.data.corpus_path)
        root = data_dir() / "corpora" / f"{_slug(corpus.name)}-{_hash(str(corpus.resolve()))}"
        qa = {}
    qa.update({split: user_path(cfg, p) for split, p in cfg.data.qa_paths.items()})
    index = user_path(cfg, cfg.data.index_path) if cfg.data.index_path else root / "index" / index_name
    return CorpusPaths(root=root, corpus=corpus, store=root / "store", index=index, qa=qa)


def relevance_set_path(cfg: ProfileConfig) -> Path:
    """Where ``cosearch prepare-relevance`` writes the profile's relevance set (``relevance.prepared_path``):
    relative against ``data.root``, or against the embedded world's folder for a profile that reads one."""
    p = Path(cfg.relevance.prepared_path).expanduser()
    if not p.is_absolute() and cfg.uses_embedded_world and cfg.data.root == ".":
        return data_dir() / "worlds" / cfg.fingerprint("world") / p
    return user_path(cfg, str(p))


def relevance_set_settings(cfg: ProfileConfig) -> dict[str, Any]:
    """What decides a profile's relevance set: the split's file, the sources, the sample, N, the seed."""
    rc = cfg.relevance
    qa = corpus_paths(cfg).qa
    settings = {"split": rc.split, "qa_file": project_relative(qa[rc.split]) if rc.split in qa else None,
                "query_sources": list(rc.query_sources), "n_queries": rc.n_queries, "topn": cfg.search.topn}
    if rc.n_queries:  # the seed draws the sample; without one it changes nothing
        settings["seed"] = cfg.seed
    return settings


def prepared_relevance_set(cfg: ProfileConfig) -> dict[str, Any] | None:
    """The sidecar of the profile's prepared relevance set when the file is there, whole (its sha256 is
    the sidecar's) and made with the profile's settings; else None."""
    path = relevance_set_path(cfg)
    side = sidecar_path(path)
    if not (path.is_file() and side.is_file()):
        return None
    summary = json.loads(side.read_text())
    if summary.get("settings") != relevance_set_settings(cfg) or summary.get("sha256") != file_sha256(path):
        return None
    return summary


def prepare_world(cfg: ProfileConfig, *, force: bool = False) -> CorpusPaths:
    """Generate (or reuse) the embedded world of this profile; a no-op for real corpora."""
    paths = corpus_paths(cfg)
    if cfg.uses_embedded_world:

        build_world(cfg.world, paths.root, force=force)
    elif not paths.corpus.exists():
        raise FileNotFoundError(
            f"corpus {paths.corpus} not found; download it with `cosearch download wiki18-corpus --dest ...`"
        )
    return paths


def prepare_corpus(cfg: ProfileConfig, *, progress: bool = True) -> tuple[CorpusStore, CorpusPaths]:
    paths = prepare_world(cfg)
    store = CorpusStore.build_or_open(paths.corpus, paths.store, progress=progress)
    return store, paths


def prepare_index(cfg: ProfileConfig, encoder: TextEncoder, store: CorpusStore, paths: CorpusPaths, *, progress: bool = True,
                  rank: int = 0, world: int = 1, barrier: Callable[[], None] = lambda: None):
    """Load the profile's index, or encode the corpus and save one (with a .json of what built it).

    The encoding runs in shards (:mod:`~cosearch_lib.retrieval.index_shards`): the ``world``
    processes of a job (``rank``, ``barrier``: ``cosearch build-index`` under torchrun or srun) share
    them, each shard is kept until the index is written, and a cut build resumes where it stopped.
    Under several ranks only rank 0 loads the index and returns it; the others return None."""
    if world > 1 and rank != 0:  # build-index's other ranks: they encode shards, rank 0 loads and checks
        if _needs_build(cfg, store, paths):
            _build(cfg, encoder, store, paths, rank=rank, world=world, barrier=barrier, progress=progress)
        return None
    if world == 1:  # one process: a second one building the same index waits, then finds it
        with build_lock(paths.index):
            return _ready_index(cfg, encoder, store, paths, progress=progress)
    return _ready_index(cfg, encoder, store, paths, rank=rank, world=world, barrier=barrier, progress=progress)


def _needs_build(cfg: ProfileConfig, store: CorpusStore, paths: CorpusPaths) -> bool:
    """What rank 0 decides from the index itself (:func:`_ready_index`), read without loading it: no
    index, or one this project built (its .json) for another corpus size. A user's index is never rebuilt."""
    if not paths.index.exists():
        return True
    if cfg.data.index_path:
        return False
    built = paths.index.with_suffix(".json")
    return not built.is_file() or json.loads(built.read_text()).get("ntotal") != len(store)


def _ready_index(cfg: ProfileConfig, encoder: TextEncoder, store: CorpusStore, paths: CorpusPaths, *, progress: bool,
                 rank: int = 0, world: int = 1, barrier: Callable[[], None] = lambda: None):
    rcfg = cfg.retrieval
    on_gpu = rcfg.index_device == "gpu"
    if paths.index.exists():
        index = load_index(paths.index, mmap=rcfg.mmap_index, ef_search=rcfg.ef_search)
        if index.ntotal == len(store):
            return to_gpu(index) if on_gpu else index
        if cfg.data.index_path:  # a user-supplied index must match; never overwrite it
            raise ValueError(f"index {paths.index} has {index.ntotal} vectors but the corpus has {len(store)} rows")
    index = _build(cfg, encoder, store, paths, rank=rank, world=world, barrier=barrier, progress=progress)
    return to_gpu(index) if on_gpu else index


def _build(cfg: ProfileConfig, encoder: TextEncoder, store: CorpusStore, paths: CorpusPaths, *, rank: int, world: int,
           barrier: Callable[[], None], progress: bool):
    """Encode the corpus in shards and save the index (rank 0 returns it; the others None)."""
    rcfg = cfg.retrieval
    t0 = time.perf_counter()
    extra = {"hnsw_m": rcfg.hnsw_m} if rcfg.index_kind == "hnsw" else {}

    def save(index, path: Path) -> None:
        if rcfg.index_kind == "hnsw":
            index.hnsw.efSearch = rcfg.ef_search
        save_index(index, path)
        meta = {"encoder": asdict(rcfg.encoder), "kind": rcfg.index_kind, "ntotal": index.ntotal,
                "corpus": str(paths.corpus), "build_s": round(time.perf_counter() - t0, 2), "processes": world}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2))

    encoder_key = json.dumps({**asdict(rcfg.encoder), "corpus": str(paths.corpus)}, sort_keys=True)
    return build_in_shards(encoder, store, paths.index, encoder_name=encoder_key, kind=rcfg.index_kind,
                           rank=rank, world=world, barrier=barrier, shard_rows=rcfg.index_shard_rows, progress=progress,
                           save=save, **extra)


def index_build_info(cfg: ProfileConfig) -> dict:
    """The .json written beside the profile's index (encoder, kind, size, build seconds), if any."""
    meta = corpus_paths(cfg).index.with_suffix(".json")
    return json.loads(meta.read_text()) if meta.exists() else {}
