"""Building a corpus' index in shards: several processes encode, each shard is kept, a cut build resumes.

Encoding wiki-18 (21M passages) with e5 takes ~21 min on an H100 (docs/GPU_COSTS.md) and hours
on fewer or slower devices; one process that dies at 90% loses everything. Here the corpus rows are
cut into fixed shards of ``shard_rows`` rows (shard j: rows ``j*shard_rows`` to ``(j+1)*shard_rows``)
and the processes of a job (torchrun's or srun's ranks, or one process) encode them round-robin
(rank r: shards j with ``j % world == r``), each written whole to::

    <index file>.shards/shard-<j>.npy        float32 (rows, dim): the shard's passage embeddings
    <index file>.shards/meta.json            rows, dim, shard_rows, encoder: what the shards were made with

A shard already on disk is not encoded again, so the same command resumes a cut build. When every
shard is there, :func:`merge_shards` adds them in row order to one index (row i of the corpus is
vector i, as Search-R1's flat index is), which the caller saves; the shard folder goes once the
index is written. Shards made with another encoder or corpus size are refused, naming the folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cosearch_lib.atomic_io import atomic_path, write_json
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.faiss_index import new_index

#: Rows per shard: ~190 MB of 768-d float32 embeddings; wiki-18 makes 327 of them.
DEFAULT_SHARD_ROWS = 1 << 16


def shards_folder(index_path: str | Path) -> Path:
    index_path = Path(index_path)
    return index_path.with_name(index_path.name + ".shards")


def shard_count(n: int, shard_rows: int) -> int:
    return (n + shard_rows - 1) // shard_rows


def _check_meta(folder: Path, meta: dict[str, Any]) -> None:
    path = folder / "meta.json"
    if path.is_file():
        have = json.loads(path.read_text())
        if have != meta:
            raise ValueError(f"{folder} holds shards of another build ({have}, this one: {meta}); remove the folder "
                             "to encode again")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        write_json(meta, path)


def encode_shards(encoder: Any, corpus: Any, folder: str | Path, *, encoder_name: str, rank: int = 0, world: int = 1,
                  shard_rows: int = DEFAULT_SHARD_ROWS, chunk: int = 4096, progress: bool = True) -> list[int]:
    """Encode this rank's missing shards of ``corpus`` (``corpus.row(i).contents``) into ``folder``;
    returns the shard numbers it encoded."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a job of {world}")
    n = len(corpus)
    if n == 0:
        raise ValueError("cannot index an empty corpus")
    folder = Path(folder)
    meta = {"rows": n, "dim": int(encoder.dim), "shard_rows": shard_rows, "encoder": encoder_name}
    if rank == 0:
        _check_meta(folder, meta)
    mine = [j for j in range(shard_count(n, shard_rows)) if j % world == rank
            and not (folder / f"shard-{j:06d}.npy").is_file()]
    bar = tqdm(total=sum(min(n, (j + 1) * shard_rows) - j * shard_rows for j in mine), unit="passage",
               desc="encode shards" + (f" [rank {rank}]" if world > 1 else ""), disable=not progress or not mine)
    for j in mine:
        lo, hi = j * shard_rows, min(n, (j + 1) * shard_rows)
        parts = []
        for start in range(lo, hi, chunk):
            texts = [corpus.row(i).contents for i in range(start, min(hi, start + chunk))]
            parts.append(np.asarray(encoder.encode_passages(texts), dtype=np.float32))
            bar.update(len(texts))
        with atomic_path(folder / f"shard-{j:06d}.npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, np.concatenate(parts))
    bar.close()
    return mine


def merge_shards(folder: str | Path, *, kind: str = "flat", progress: bool = True, **kwargs: Any) -> Any:
    """One index of every shard in ``folder``, in row order; a missing or short shard is named."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    n, rows = meta["rows"], meta["shard_rows"]
    index = new_index(meta["dim"], kind, **kwargs)
    for j in tqdm(range(shard_count(n, rows)), desc="merge shards", unit="shard", disable=not progress):
        path = folder / f"shard-{j:06d}.npy"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the build again to encode it")
        vectors = np.load(path)
        want = min(n, (j + 1) * rows) - j * rows
        if vectors.shape != (want, meta["dim"]):
            raise ValueError(f"{path} holds {vectors.shape}, expected ({want}, {meta['dim']})")
        index.add(vectors)
    return index


def build_in_shards(encoder: Any, corpus: Any, index_path: str | Path, *, encoder_name: str, kind: str = "flat",
                    rank: int = 0, world: int = 1, barrier: Callable[[], None] = lambda: None,
                    shard_rows: int = DEFAULT_SHARD_ROWS, progress: bool = True,
                    save: Callable[[Any, Path], Any], **kwargs: Any) -> Any:
    """Every rank encodes its shards; after ``barrier``, rank 0 merges and ``save``-s the index to
    ``index_path``, then removes the shards; every rank waits for that and returns the index (rank 0)
    or None."""
    folder = shards_folder(index_path)
    if rank == 0:
        _check_meta(folder, {"rows": len(corpus), "dim": int(encoder.dim), "shard_rows": shard_rows,
                             "encoder": encoder_name})
    barrier()
    encode_shards(encoder, corpus, folder, encoder_name=encoder_name, rank=rank, world=world, shard_rows=shard_rows,
                  progress=progress)
    barrier()
    index = None
    if rank == 0:
        index = merge_shards(folder, kind=kind, progress=progress, **kwargs)
        save(index, Path(index_path))
        shutil.rmtree(folder)
    barrier()
    return index
