"""A disk-backed corpus store: any passage by id or by FAISS row, without 21M Python objects.

Search-R1's FAISS index stores vectors in corpus order, so a search hit ``i`` is row ``i`` of the
corpus file. Keeping wiki-18 (21M passages, ~14 GB of text) as a list of Python strings costs
tens of GB and minutes to load; this store instead keeps flat files that the OS pages in on
demand, opened in milliseconds by every worker:

```
<store>/contents.bin     utf-8 contents of all rows, concatenated
<store>/offsets.npy      uint64 (n+1,): row i is contents.bin[offsets[i]:offsets[i+1]]
<store>/ids.bin          utf-8 ids, concatenated
<store>/id_offsets.npy   uint64 (n+1,)
<store>/id_table.npy     int64 (slots,): open-addressing hash table of rows (only for "hash" ids)
<store>/meta.json        count, id index kind, source path/size/mtime, format version
```

Id lookup: when the ids are exactly ``"0".."n-1"`` in order (wiki-18, and the embedded world),
the row *is* ``int(id)`` and no table is built. Otherwise a linear-probing table keyed by a
64-bit blake2b hash of the id maps ids to rows; a probe confirms the hit by comparing the stored
id bytes, so hash collisions cost a step, never a wrong passage.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosearch_lib.atomic_io import atomic_dir
from cosearch_lib.data.corpus_stream import iter_corpus_lines
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import DataFormatError
from cosearch_lib.progress import tqdm

FORMAT_VERSION = 1
EMPTY = -1  # free slot in the id table
_BATCH = 8192  # rows per write batch while building
_ENC = ("utf-8", "surrogatepass")  # JSON may carry lone surrogates; keep them round-trippable


def _id_hash(id_bytes: bytes) -> int:
    """Stable 64-bit hash of an id (Python's ``hash`` is salted per process, so unusable on disk)."""
    return int.from_bytes(hashlib.blake2b(id_bytes, digest_size=8).digest(), "little")


def _table_slots(n: int) -> int:
    """Twice the row count: a 0.5 load factor keeps linear-probe chains a few slots long."""
    return max(2 * n, 8)


class CorpusStore:
    """Read-only random access to a corpus by id (O(1)) or by row (FAISS label).

    Build once with :meth:`build` (or :meth:`build_or_open`), then :meth:`open` anywhere; the
    object holds only memory maps, so it is cheap to open per process and pickles by path.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{self.directory} is not a corpus store (no meta.json); build one with CorpusStore.build"
            )
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{self.directory}: store format {self.meta.get('format_version')} "
                f"!= {FORMAT_VERSION}; rebuild it"
            )
        self._n = int(self.meta["count"])
        self._offsets = np.load(self.directory / "offsets.npy", mmap_mode="r")
        self._id_offsets = np.load(self.directory / "id_offsets.npy", mmap_mode="r")
        self._contents = _map_bytes(self.directory / "contents.bin")
        self._ids = _map_bytes(self.directory / "ids.bin")
        self._table = (
            np.load(self.directory / "id_table.npy", mmap_mode="r")
            if self.meta["id_index"] == "hash"
            else None
        )

    # ------------------------------------------------------------------ building

    @classmethod
    def build(
        cls,
        corpus_path: str | os.PathLike,
        out_dir: str | os.PathLike,
        *,
        progress: bool = True,
        hash_slots: int | None = None,
    ) -> CorpusStore:
        """Stream ``corpus_path`` (.jsonl / .jsonl.gz) once into a store at ``out_dir``.

        Built in a temp folder beside ``out_dir`` and renamed into place (``atomic_io.atomic_dir``),
        so a bad row, a crash or Ctrl-C leaves either the old store or nothing at all: no half-built
        store, and no empty folder that the build created for it. A bad row's error names the file,
        its line and what is wrong. ``hash_slots`` overrides the id-table size (tests use it to
        force collisions).
        """
        corpus_path, out_dir = Path(corpus_path), Path(out_dir)
        _check_replaceable(out_dir)
        with atomic_dir(out_dir) as tmp:
            _build_into(corpus_path, tmp, progress=progress, hash_slots=hash_slots)
        return cls(out_dir)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> CorpusStore:
        """Open a built store (memory maps only; nothing is read until asked for)."""
        return cls(directory)

    @classmethod
    def build_or_open(
        cls, corpus_path: str | os.PathLike, out_dir: str | os.PathLike, *, progress: bool = True
    ) -> CorpusStore:
        """Reuse ``out_dir`` when it was built from this very file (same size and mtime), else build."""
        out_dir = Path(out_dir)
        meta_path = out_dir / "meta.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            if meta.get("format_version") == FORMAT_VERSION and _same_source(meta, Path(corpus_path)):
                return cls(out_dir)
        return cls.build(corpus_path, out_dir, progress=progress)

    # ------------------------------------------------------------------ access

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Passage]:
        for i in range(self._n):
            yield self.row(i)

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, (str, int)) and self._find(str(pid)) is not None

    def get(self, pid: str) -> Passage:
        """The passage with id ``pid``; KeyError if the corpus has none."""
        return self.row(self.index_of(pid))

    def get_many(self, pids: Iterable[str]) -> list[Passage]:
        return [self.get(p) for p in pids]

    def index_of(self, pid: str) -> int:
        """Row (= FAISS label) of id ``pid``."""
        row = self._find(str(pid))
        if row is None:
            raise KeyError(
                f"passage id {pid!r} is not in the corpus store {self.directory} "
                f"({self._n} passages, ids {self._id_description()})"
            )
        return row

    def row(self, i: int, score: float = 0.0) -> Passage:
        """Row ``i`` of the corpus file. Negative rows are refused: FAISS pads misses with -1."""
        i = self._check_row(i)
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        return Passage(id=self.id_of(i), contents=self._contents[a:b].decode(*_ENC), score=float(score))

    def rows(
        self,
        indices: Sequence[int] | np.ndarray,
        scores: Sequence[float] | np.ndarray | None = None,
    ) -> list[Passage]:
        """Passages for FAISS labels ``indices`` (one query's hits), with their ``scores``."""
        indices = list(np.asarray(indices).reshape(-1).tolist())
        if scores is None:
            scores = [0.0] * len(indices)
        scores = list(np.asarray(scores, dtype=float).reshape(-1).tolist())
        if len(scores) != len(indices):
            raise ValueError(f"got {len(indices)} indices but {len(scores)} scores")
        return [self.row(i, s) for i, s in zip(indices, scores)]

    def id_of(self, i: int) -> str:
        i = self._check_row(i)
        return self._id_bytes(i).decode(*_ENC)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        for m in (self._contents, self._ids):
            if isinstance(m, mmap.mmap):
                m.close()

    def __enter__(self) -> CorpusStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        # mmaps do not pickle; a worker process reopens the same files instead.
        return {"directory": str(self.directory)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])

    def __repr__(self) -> str:
        return f"CorpusStore({str(self.directory)!r}, n={self._n}, id_index={self.meta['id_index']!r})"

    # ------------------------------------------------------------------ internals

    def _check_row(self, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"row must be an integer, got {i!r}")
        if not 0 <= int(i) < self._n:
            raise IndexError(
                f"row {int(i)} out of range for a corpus of {self._n} passages (0..{self._n - 1})"
            )
        return int(i)

    def _id_bytes(self, i: int) -> bytes:
        return self._ids[int(self._id_offsets[i]) : int(self._id_offsets[i + 1])]

    def _find(self, pid: str) -> int | None:
        if self._table is None:
            return _range_row(pid, self._n)
        key = pid.encode(*_ENC)
        slots = len(self._table)
        slot = _id_hash(key) % slots
        for _ in range(slots):
            row = int(self._table[slot])
            if row == EMPTY:
                return None
            if self._id_bytes(row) == key:
                return row
            slot = (slot + 1) % slots
        return None

    def _id_description(self) -> str:
        if self._table is None:
            return f"'0'..'{self._n - 1}'"
        return f"e.g. {self.id_of(0)!r}" if self._n else "none"


# ---------------------------------------------------------------------- helpers


def _map_bytes(path: Path) -> mmap.mmap | bytes:
    """Read-only map of a file; an empty file (mmap refuses length 0) maps to ``b""``."""
    if path.stat().st_size == 0:
        return b""
    with open(path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def _range_row(pid: str, n: int) -> int | None:
    """Row of ``pid`` in a store whose ids are '0'..'n-1': only canonical decimals qualify."""
    if not (pid.isascii() and pid.isdigit()) or (len(pid) > 1 and pid[0] == "0"):
        return None
    row = int(pid)
    return row if row < n else None


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a folder that is neither empty nor a corpus store (it may be user data)."""
    if out_dir.exists() and not (out_dir / "meta.json").is_file():
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} exists and is not a corpus store; refusing to replace it")


def _fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"source": str(path.resolve()), "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns}


def _same_source(meta: dict, path: Path) -> bool:
    """Size and mtime decide (not the path), so moving a data folder does not force a rebuild."""
    if not path.is_file():
        return False
    fp = _fingerprint(path)
    keys = ("source_size", "source_mtime_ns")
    return all(meta.get(k) == fp[k] for k in keys)


def _build_into(corpus_path: Path, tmp: Path, *, progress: bool, hash_slots: int | None) -> None:
    fingerprint = _fingerprint(corpus_path)  # before reading: an edit mid-build then forces a rebuild
    n, consecutive = _write_rows(corpus_path, tmp, progress=progress)
    _lengths_to_offsets(tmp / "contents.len", tmp / "offsets.npy", n)
    _lengths_to_offsets(tmp / "ids.len", tmp / "id_offsets.npy", n)
    meta: dict[str, Any] = {"format_version": FORMAT_VERSION, "count": n, **fingerprint}
    if consecutive:
        meta["id_index"] = "range"
    else:
        slots = hash_slots if hash_slots is not None else _table_slots(n)
        if slots <= n:
            raise ValueError(f"hash_slots must exceed the row count {n}, got {slots}")
        table = _build_id_table(tmp, n, slots, corpus_path, progress=progress)
        np.save(tmp / "id_table.npy", table)
        meta.update(id_index="hash", hash="blake2b-64", hash_slots=slots)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))


def _write_rows(corpus_path: Path, tmp: Path, *, progress: bool) -> tuple[int, bool]:
    """One streaming pass: contents and ids to .bin files, their byte lengths to raw uint64 files."""
    n, consecutive = 0, True
    with open(tmp / "contents.bin", "wb") as cf, open(tmp / "ids.bin", "wb") as idf, open(
        tmp / "contents.len", "wb"
    ) as clf, open(tmp / "ids.len", "wb") as ilf:
        batch_c: list[bytes] = []
        batch_i: list[bytes] = []
        for _, pid, contents in iter_corpus_lines(corpus_path, progress=progress):
            consecutive = consecutive and pid == str(n)
            batch_c.append(contents.encode(*_ENC))
            batch_i.append(pid.encode(*_ENC))
            n += 1
            if len(batch_c) == _BATCH:
                _flush(batch_c, cf, clf)
                _flush(batch_i, idf, ilf)
        _flush(batch_c, cf, clf)
        _flush(batch_i, idf, ilf)
    if n == 0:
        raise DataFormatError(f"{corpus_path}: the corpus has no passages")
    return n, consecutive


def _flush(batch: list[bytes], data_fh: Any, len_fh: Any) -> None:
    if batch:
        data_fh.write(b"".join(batch))
        np.fromiter((len(b) for b in batch), dtype=np.uint64, count=len(batch)).tofile(len_fh)
        batch.clear()


def _lengths_to_offsets(lengths_path: Path, offsets_path: Path, n: int, chunk: int = 1 << 22) -> None:
    """Raw per-row lengths -> an (n+1,) offsets .npy, by chunked cumsum (never all n in RAM at once)."""
    lengths = np.memmap(lengths_path, dtype=np.uint64, mode="r", shape=(n,))
    offsets = np.lib.format.open_memmap(offsets_path, mode="w+", dtype=np.uint64, shape=(n + 1,))
    offsets[0] = 0
    carry = np.uint64(0)
    for start in range(0, n, chunk):
        part = np.cumsum(lengths[start : start + chunk], dtype=np.uint64) + carry
        offsets[start + 1 : start + 1 + len(part)] = part
        carry = part[-1]
    offsets.flush()
    del offsets, lengths
    lengths_path.unlink()


def _build_id_table(tmp: Path, n: int, slots: int, corpus_path: Path, *, progress: bool) -> np.ndarray:
    hashes = _hash_ids(tmp, n, progress=progress)
    _check_unique_ids(tmp, hashes, corpus_path)
    return _insert_linear_probe(hashes, slots)


def _hash_ids(tmp: Path, n: int, *, progress: bool) -> np.ndarray:
    """(n,) uint64 hashes of the ids, read back from ids.bin."""

    id_offsets = np.load(tmp / "id_offsets.npy", mmap_mode="r")
    ids = _map_bytes(tmp / "ids.bin")
    hashes = np.empty(n, dtype=np.uint64)
    bounds = np.asarray(id_offsets).tolist() if n <= _BATCH else None
    for i in tqdm(range(n), desc="hashing ids", disable=not progress, mininterval=1.0):
        a, b = (bounds[i], bounds[i + 1]) if bounds else (int(id_offsets[i]), int(id_offsets[i + 1]))
        hashes[i] = _id_hash(ids[a:b])
    if isinstance(ids, mmap.mmap):
        ids.close()
    return hashes


def _check_unique_ids(tmp: Path, hashes: np.ndarray, corpus_path: Path) -> None:
    """Duplicate ids would make lookups ambiguous; only equal-hash groups need a byte compare."""
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    same = np.nonzero(ordered[1:] == ordered[:-1])[0]
    if same.size == 0:
        return
    id_offsets = np.load(tmp / "id_offsets.npy", mmap_mode="r")
    ids = _map_bytes(tmp / "ids.bin")
    try:
        for h in np.unique(ordered[same]):
            seen: dict[bytes, int] = {}
            for row in sorted(int(r) for r in order[ordered == h]):
                key = ids[int(id_offsets[row]) : int(id_offsets[row + 1])]
                if key in seen:
                    lines = _lines_of(corpus_path, (seen[key], row))
                    raise DataFormatError(
                        f"{corpus_path} line {lines[row]}: duplicate id {key.decode(*_ENC)!r}, first on line "
                        f"{lines[seen[key]]} (rows {seen[key]} and {row})"
                    )
                seen[key] = row
    finally:
        if isinstance(ids, mmap.mmap):
            ids.close()


def _lines_of(corpus_path: Path, rows: Sequence[int]) -> dict[int, int]:
    """1-based file lines of passage ``rows`` (blank lines are not rows): read again, only for an error."""
    wanted, found = set(rows), {}
    for row, (line, _, _) in enumerate(iter_corpus_lines(corpus_path, limit=max(rows) + 1)):
        if row in wanted:
            found[row] = line
    return found


def _insert_linear_probe(hashes: np.ndarray, slots: int) -> np.ndarray:
    """Vectorised linear-probing insert: (slots,) int64 table of rows, EMPTY where free.

    Each round, every pending row bids for its current slot; for each free slot the lowest
    pending row wins, the rest step to the next slot. A row only moves past occupied slots, so
    the lookup's probe from ``hash % slots`` meets no gap before reaching it.
    """
    table = np.full(slots, EMPTY, dtype=np.int64)
    pending = np.arange(len(hashes), dtype=np.int64)
    pos = (hashes % np.uint64(slots)).astype(np.int64)
    while pending.size:
        free = np.nonzero(table[pos] == EMPTY)[0]
        won_slots, first = np.unique(pos[free], return_index=True)
        winners = free[first]
        table[won_slots] = pending[winners]
        keep = np.ones(pending.size, dtype=bool)
        keep[winners] = False
        pending, pos = pending[keep], (pos[keep] + 1) % slots
    return table
