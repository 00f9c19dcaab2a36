"""The embedded world exported as the paper's public artefacts, in the Hugging Face hub's layout.

The CPU miniature of the ``paper`` profile (``paper_mini``) reads exactly what a cluster user
downloads: a wiki-18 corpus (``wiki-18.jsonl.gz``, rows ``{"id", "contents": "\\"Title\\"\\ntext"}``),
Search-R1's flat inner-product index split in two parts (``part_aa``, ``part_ab``), and CoSearch's
two parquet files (the columns the authors' release reads: ``prompt``, ``data_source``,
``reward_model.ground_truth.target``, ``extra_info.question``, ``extra_info.index``). This module
writes those files from a profile's synthetic world into a folder laid out as the hub names its
repositories, so that ``cosearch download`` fetches them, through the real ``huggingface_hub``
client, from a local stand-in of the hub (``tests/hub_standin.py``)::

    <out>/datasets/PeterJinGo/wiki-18-corpus/wiki-18.jsonl.gz
    <out>/datasets/PeterJinGo/wiki-18-e5-index/part_aa, part_ab       (the profile's encoder; flat IP)
    <out>/datasets/hzeng/co-search-train/data/train-00000-of-00001.parquet
    <out>/datasets/hzeng/co-search-eval/data/test-00000-of-00001.parquet

What the real files do not carry is dropped (the world's families and hop counts, the ``syn_`` prefix
of its data sources: ``syn_2wiki`` is written ``2wikimultihopqa``) with one exception: each
question's gold chain stays under ``extra_info.gold_chain``, a field the real files lack and the
loaders read only where present. A 135M model does not follow the tag protocol zero-shot (the
paper's 7B instruct model does, so the paper runs no warm start): without it, the 16 rollouts of
one ``paper_mini`` step made no search call, and the ranker had nothing to train on. The
miniature's warm start reads the chains; everything else reads the columns the real files have.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cosearch_lib.atomic_io import atomic_path
from cosearch_lib.config import DataConfig, ProfileConfig
from cosearch_lib.data.downloads import (
    COSEARCH_REPOS,
    WIKI18_CORPUS_FILE,
    WIKI18_CORPUS_REPO,
    WIKI18_INDEX_PARTS,
    WIKI18_INDEX_REPO,
)
from cosearch_lib.eval.benchmark_families import mirrored_benchmark
from cosearch_lib.experiment.building import build_retriever
from cosearch_lib.retrieval.artifacts import corpus_paths, prepare_world

#: The world split each CoSearch file is made from.
EXPORTED_SPLITS = {"train": "train", "eval": "test"}


def cosearch_row(row: dict) -> dict:
    """One world question (Search-R1 row) as a CoSearch parquet row: no top-level id, question or
    golden_answers, the question in ``extra_info``, the benchmark's real name as ``data_source``."""
    extra = row["extra_info"]
    return {"data_source": mirrored_benchmark(row["data_source"]),
            "prompt": [{"role": "user", "content": row["question"]}],
            "ability": row.get("ability", "fact-reasoning"),
            "reward_model": {"style": "rule", "ground_truth": {"target": list(row["golden_answers"])}},
            "extra_info": {"split": extra["split"], "index": int(extra["index"]), "question": row["question"],
                           "gold_chain": [dict(h) for h in extra.get("gold_chain") or []]}}


def world_profile(cfg: ProfileConfig) -> ProfileConfig:
    """``cfg`` reading its embedded world (its ``world`` section) instead of its ``data`` files."""
    return dataclasses.replace(cfg, data=DataConfig())


def export_paper_hub(cfg: ProfileConfig, out: str | Path, *, progress: bool = True) -> dict[str, Path]:
    """Write the profile's world as the paper's four dataset repositories under ``out`` (module
    docstring); returns {repository: its folder}. Each file is written whole or not at all."""
    out = Path(out)
    world_cfg = world_profile(cfg)
    paths = prepare_world(world_cfg)
    repos: dict[str, Path] = {}

    corpus_repo = out / "datasets" / WIKI18_CORPUS_REPO
    corpus_repo.mkdir(parents=True, exist_ok=True)
    with atomic_path(corpus_repo / WIKI18_CORPUS_FILE) as tmp, open(paths.corpus, "rb") as src, \
            gzip.open(tmp, "wb", compresslevel=6) as dst:
        for line in src:  # the world writes wiki-18 rows already; keep only the two columns the format has
            row = json.loads(line)
            dst.write((json.dumps({"id": row["id"], "contents": row["contents"]}, ensure_ascii=False) + "\n").encode())
    repos[WIKI18_CORPUS_REPO] = corpus_repo

    for which, split in EXPORTED_SPLITS.items():
        repo = COSEARCH_REPOS[which]
        folder = out / "datasets" / repo / "data"
        folder.mkdir(parents=True, exist_ok=True)
        rows = [cosearch_row(r) for r in pq.read_table(paths.qa[split]).to_pylist()]
        with atomic_path(folder / f"{split}-00000-of-00001.parquet") as tmp:
            pq.write_table(pa.Table.from_pylist(rows), tmp)
        repos[repo] = folder.parent

    build_retriever(world_cfg, progress=progress)  # the profile's encoder over the world's corpus, cached
    index = corpus_paths(world_cfg).index
    index_repo = out / "datasets" / WIKI18_INDEX_REPO
    index_repo.mkdir(parents=True, exist_ok=True)
    split_file(index, [index_repo / name for name in WIKI18_INDEX_PARTS])
    repos[WIKI18_INDEX_REPO] = index_repo
    return repos


def split_file(src: Path, parts: list[Path], chunk_size: int = 1 << 20) -> list[Path]:
    """``src`` cut into ``len(parts)`` consecutive pieces (as ``split`` does; ``cat`` joins them)."""
    size = src.stat().st_size
    bounds = [round(i * size / len(parts)) for i in range(len(parts) + 1)]
    with open(src, "rb") as fh:
        for part, start, end in zip(parts, bounds, bounds[1:], strict=False):
            with atomic_path(part) as tmp, open(tmp, "wb") as dst:
                left = end - start
                while left:
                    chunk = fh.read(min(chunk_size, left))
                    dst.write(chunk)
                    left -= len(chunk)
    return parts
