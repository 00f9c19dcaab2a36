"""FAISS index build / save / load.

Inner product over L2-normalised vectors (= cosine), as Search-R1's e5 flat index. ``flat`` is exact
and the default; ``hnsw`` is approximate and faster on big corpora. ``load_index(..., mmap=True)``
memory-maps the file, so an index larger than RAM (wiki-18's e5 flat index is ~62 GB) can be
searched with pages read on demand.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from cosearch_lib.atomic_io import apply_umask
from cosearch_lib.progress import tqdm

INDEX_KINDS = ("flat", "hnsw")


def _faiss():
    try:
        import faiss
    except ImportError as err:  # pragma: no cover - faiss-cpu is in the cpu extra
        raise ImportError(
            "FAISS is not installed: `pip install -e .[cpu]` (faiss-cpu) or `.[gpu]` (CUDA FAISS)"
        ) from err
    return faiss


def new_index(dim: int, kind: str = "flat", *, hnsw_m: int = 32, ef_construction: int = 200):
    """An empty inner-product index of the given kind."""
    faiss = _faiss()
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        return index
    raise ValueError(f"index kind must be one of {INDEX_KINDS}, got {kind!r}")


def build_index(embeddings: np.ndarray, kind: str = "flat", **kwargs):
    """Index an (n, dim) float32 array; row i of the array is id i of the index."""
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty 2-D array, got shape {emb.shape}")
    index = new_index(emb.shape[1], kind, **kwargs)
    index.add(emb)
    return index


def build_index_from_corpus(encoder, corpus, *, kind: str = "flat", chunk: int = 4096, progress: bool = True, **kwargs):
    """Encode every corpus row (``contents``, as Search-R1 indexes it) and add it, chunk by chunk.

    Only one chunk of embeddings is held at a time, so memory stays flat whatever the corpus size
    (for HNSW the graph itself still grows with n).
    """
    n = len(corpus)
    if n == 0:
        raise ValueError("cannot index an empty corpus")
    index = new_index(encoder.dim, kind, **kwargs)
    bar = tqdm(total=n, desc=f"index {kind}", unit="passage", disable=not progress)
    for start in range(0, n, chunk):
        texts = [corpus.row(i).contents for i in range(start, min(n, start + chunk))]
        index.add(encoder.encode_passages(texts))
        bar.update(len(texts))
    bar.close()
    return index


def save_index(index, path: str | os.PathLike) -> Path:
    """Write atomically: a temp file in the same folder, then rename over the target."""
    faiss = _faiss()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        faiss.write_index(index, tmp)
        apply_umask(tmp)  # mkstemp's 0600 would hide the index from the rest of a cluster group
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_index(path: str | os.PathLike, *, mmap: bool = False, ef_search: int | None = None, gpu: bool = False):
    """Read an index; ``mmap=True`` maps it read-only instead of reading it into RAM."""
    faiss = _faiss()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"FAISS index not found: {path}")
    flags = (faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) if mmap else 0
    try:
        index = faiss.read_index(str(path), flags)
    except RuntimeError as err:
        raise ValueError(f"{path} is not a readable FAISS index: {str(err).splitlines()[0]}") from err
    if ef_search is not None and hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search
    if gpu:
        index = to_gpu(index)
    return index


def to_gpu(index, *, free_bytes: list[int] | None = None, headroom: float = 0.8):
    """Move a flat index onto every visible GPU (a CUDA FAISS build, the ``gpu`` extra).

    Replicated (each GPU a whole copy, queries spread over them) when the vectors fit in
    ``headroom`` of the smallest GPU's free memory; else sharded (each GPU 1/n of the rows, every
    query asks all of them and the results merge), so wiki-18's ~62 GB e5 index fits 8 GPUs of
    16 GB or more. ``free_bytes``: free memory per GPU (default: asked of torch)."""
    faiss = _faiss()
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        raise RuntimeError("no GPU FAISS available: install the gpu extra on a CUDA machine (faiss-gpu-cu12), "
                           "or set retrieval.index_device: cpu")
    n_gpus = faiss.get_num_gpus()
    if free_bytes is None:
        import torch

        free_bytes = [torch.cuda.mem_get_info(i)[0] for i in range(n_gpus)]
    need = index_bytes(index)
    options = faiss.GpuMultipleClonerOptions()
    options.shard = need > headroom * min(free_bytes)
    if options.shard and need > headroom * sum(free_bytes):
        raise RuntimeError(f"the index needs {need / 2**30:.1f} GiB but the {n_gpus} GPU(s) have "
                           f"{sum(free_bytes) / 2**30:.1f} GiB free together; use more GPUs, "
                           "or retrieval.index_device: cpu (with retrieval.mmap_index: true)")
    return faiss.index_cpu_to_all_gpus(index, co=options)


def index_bytes(index) -> int:
    """Bytes of a flat index's vectors (float32 rows of ``d`` values)."""
    return int(index.ntotal) * int(index.d) * 4
