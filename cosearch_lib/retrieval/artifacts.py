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
from dataclasses import asdict, dataclass
from pathlib import Path

from cosearch_lib.config import ProfileConfig
from cosearch_lib.paths import data_dir, profile_data_path
from cosearch_lib.retrieval.corpus_store import CorpusStore
from cosearch_lib.retrieval.encoder import TextEncoder
from cosearch_lib.retrieval.faiss_index import build_index_from_corpus, load_index, save_index, to_gpu
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


def prepare_index(cfg: ProfileConfig, encoder: TextEncoder, store: CorpusStore, paths: CorpusPaths, *, progress: bool = True):
    """Load the profile's index, or encode the corpus and save one (with a .json of what built it)."""
    rcfg = cfg.retrieval
    on_gpu = rcfg.index_device == "gpu"
    if paths.index.exists():
        index = load_index(paths.index, mmap=rcfg.mmap_index, ef_search=rcfg.ef_search)
        if index.ntotal == len(store):
            return to_gpu(index) if on_gpu else index
        if cfg.data.index_path:  # a user-supplied index must match; never overwrite it
            raise ValueError(f"index {paths.index} has {index.ntotal} vectors but the corpus has {len(store)} rows")
    t0 = time.perf_counter()
    index = build_index_from_corpus(encoder, store, kind=rcfg.index_kind, hnsw_m=rcfg.hnsw_m, progress=progress)
    if rcfg.index_kind == "hnsw":
        index.hnsw.efSearch = rcfg.ef_search
    save_index(index, paths.index)
    meta = {"encoder": asdict(rcfg.encoder), "kind": rcfg.index_kind, "ntotal": index.ntotal,
            "corpus": str(paths.corpus), "build_s": round(time.perf_counter() - t0, 2)}
    paths.index.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    return to_gpu(index) if on_gpu else index


def index_build_info(cfg: ProfileConfig) -> dict:
    """The .json written beside the profile's index (encoder, kind, size, build seconds), if any."""
    meta = corpus_paths(cfg).index.with_suffix(".json")
    return json.loads(meta.read_text()) if meta.exists() else {}
