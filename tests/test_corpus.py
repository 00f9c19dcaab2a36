"""CorpusStore: lookups by id and by row agree with the source file; builds are all-or-nothing."""

from __future__ import annotations

import json
import mmap
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from cosearch_lib.data.corpus_stream import iter_corpus
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import DataFormatError
from cosearch_lib.retrieval import corpus_store as corpus_mod
from cosearch_lib.retrieval.corpus_store import CorpusStore

from tests.fixture_files import corpus_rows, write_corpus, write_jsonl


def _odd_ids(n: int) -> list[str]:
    """Non-consecutive ids of many shapes, including ones a sloppy int() parse would confuse."""
    base = ["0005", "5", "doc-α", "Zürich#2", "", "17", "-1", " 3"]
    base = [b for b in base if b]  # ids must be non-empty
    extra = [f"wiki:{i * 7919 % 100_003}" for i in range(n)]
    return (base + extra)[:n]


def _assert_matches_source(store: CorpusStore, source: Path) -> None:
    expected = list(iter_corpus(source))
    assert len(store) == len(expected)
    for i, (pid, contents) in enumerate(expected):
        by_row, by_id = store.row(i), store.get(pid)
        assert by_row == by_id == Passage(pid, contents)
        assert store.id_of(i) == pid and store.index_of(pid) == i


@pytest.mark.parametrize("name", ["wiki.jsonl", "wiki.jsonl.gz"])
def test_consecutive_ids_use_range_index(tmp_path: Path, name: str) -> None:
    source = write_corpus(tmp_path / name, corpus_rows(n=40))
    store = CorpusStore.build(source, tmp_path / "store", progress=False)
    _assert_matches_source(store, source)
    assert store.meta["id_index"] == "range"
    assert not (tmp_path / "store" / "id_table.npy").exists()
    assert store.get("3").title == "Back\\slash"
    assert store.row(2).text == "日本の首都。\n\n人口は約1400万人。"
    for bad in ("40", "-1", "03", "3.0", "٣", "x"):
        with pytest.raises(KeyError, match="not in the corpus store"):
            store.get(bad)
        assert bad not in store
    assert "39" in store


@pytest.mark.parametrize("name", ["wiki.jsonl", "wiki.jsonl.gz"])
def test_non_consecutive_ids_use_hash_index(tmp_path: Path, name: str) -> None:
    ids = _odd_ids(60)
    source = write_corpus(tmp_path / name, corpus_rows(ids))
    store = CorpusStore.build(source, tmp_path / "store", progress=False)
    assert store.meta["id_index"] == "hash"
    _assert_matches_source(store, source)
    assert store.get("0005").id == "0005" and store.get("5").id == "5"
    assert store.index_of("0005") != store.index_of("5")
    with pytest.raises(KeyError, match=r"'wiki:12345' is not in the corpus store"):
        store.get("wiki:12345")
    assert "3" not in store and " 3" in store


def test_title_text_corpus_and_int_ids(tmp_path: Path) -> None:
    rows = corpus_rows(style="title_text")
    for r in rows:
        r["id"] = int(r["id"]) + 100  # integer ids, not starting at 0 -> hash path
    source = write_corpus(tmp_path / "w.jsonl", rows)
    store = CorpusStore.build(source, tmp_path / "s", progress=False)
    assert store.get("100").title == 'Anna "Annie" Oakley'
    assert store.get(105).text == ""  # int ids are looked up by their decimal string
    _assert_matches_source(store, source)


def test_forced_collisions_tiny_table(tmp_path: Path) -> None:
    ids = _odd_ids(300)
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(ids))
    store = CorpusStore.build(source, tmp_path / "s", progress=False, hash_slots=len(ids) + 1)
    assert len(np.load(tmp_path / "s" / "id_table.npy")) == 301
    _assert_matches_source(store, source)
    with pytest.raises(KeyError):
        store.get("missing")  # terminates: one free slot remains


def test_forced_collisions_constant_hash(tmp_path: Path, monkeypatch) -> None:
    """Every id hashes alike: one long probe chain, and lookups must still be exact."""
    monkeypatch.setattr(corpus_mod, "_id_hash", lambda b: 12345)
    ids = _odd_ids(50)
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(ids))
    store = CorpusStore.build(source, tmp_path / "s", progress=False)
    _assert_matches_source(store, source)
    with pytest.raises(KeyError):
        store.get("nope")


def test_vectorised_insert_invariant_on_random_hashes() -> None:
    """Every row sits at the end of a gap-free probe run starting at its home slot."""
    rng = np.random.default_rng(1)
    hashes = rng.integers(0, 50, size=400, dtype=np.uint64)  # heavy clustering
    slots = 401
    table = corpus_mod._insert_linear_probe(hashes, slots)
    assert sorted(table[table >= 0].tolist()) == list(range(400))
    for row, h in enumerate(hashes.tolist()):
        slot = h % slots
        while table[slot] != row:
            assert table[slot] != corpus_mod.EMPTY
            slot = (slot + 1) % slots


def test_duplicate_ids_rejected(tmp_path: Path) -> None:
    ids = ["a", "b", "c", "b"]
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(ids))
    with pytest.raises(DataFormatError, match=r"w\.jsonl line 4: duplicate id 'b', first on line 2 \(rows 1 and 3\)"):
        CorpusStore.build(source, tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
    spaced = write_corpus(tmp_path / "spaced.jsonl", corpus_rows(["a", "-", *ids[1:]]), raw_lines={2: ""})  # a blank line is no row
    with pytest.raises(DataFormatError, match=r"spaced\.jsonl line 5: duplicate id 'b', first on line 3 \(rows 1 and 3\)"):
        CorpusStore.build(spaced, tmp_path / "s", progress=False)


def test_rows_scores_and_bounds(tmp_path: Path) -> None:
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(n=10))
    store = CorpusStore.build(source, tmp_path / "s", progress=False)
    got = store.rows(np.array([[3, 0, 9]]), np.array([[0.9, 0.5, 0.1]], dtype=np.float32))
    assert [p.id for p in got] == ["3", "0", "9"]
    assert [round(p.score, 6) for p in got] == [0.9, 0.5, 0.1]
    assert all(type(p.score) is float for p in got)
    assert [p.id for p in store.get_many(["7", "1"])] == ["7", "1"]
    with pytest.raises(IndexError, match="row -1 out of range"):
        store.rows([2, -1])  # FAISS pads missing hits with -1: never read that as the last row
    with pytest.raises(IndexError):
        store.row(10)
    with pytest.raises(ValueError, match="scores"):
        store.rows([1, 2], [0.3])
    assert [p.id for p in store] == [str(i) for i in range(10)]


@pytest.mark.parametrize("bad_line, what", [
    ('{"id": "12", "contents": [', r"not valid JSON \(Expecting value at column 27\)"),
    ('{"id": "12", "contents": 7}', r"field 'contents' must be a string"),
    ('{"id": null, "contents": "x"}', r"field 'id' must be a non-empty string or integer, got None"),
    ('["12", "x"]', r"expected a JSON object"),
])
def test_a_bad_row_names_file_line_and_problem_and_leaves_nothing(tmp_path: Path, bad_line: str, what: str) -> None:
    source = write_corpus(tmp_path / "w.jsonl.gz", corpus_rows(n=20), raw_lines={13: bad_line})
    out = tmp_path / "corpora" / "wiki-1a2b" / "store"  # as retrieval.artifacts lays out a real corpus
    with pytest.raises(DataFormatError, match=rf"^{tmp_path}/w\.jsonl\.gz line 13: {what}"):
        CorpusStore.build(source, out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl.gz"]  # no store, temp or empty corpus folder
    (tmp_path / "corpora").mkdir()  # a folder that was there before the build stays
    with pytest.raises(DataFormatError):
        CorpusStore.build(source, out, progress=False)
    assert list((tmp_path / "corpora").iterdir()) == []


def test_failure_mid_build_is_atomic(tmp_path: Path, monkeypatch) -> None:
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(_odd_ids(30)))
    out = tmp_path / "stores" / "wiki"

    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # the user hits stop in the notebook while ids are hashed

    monkeypatch.setattr(corpus_mod, "_insert_linear_probe", boom)
    with pytest.raises(KeyboardInterrupt):
        CorpusStore.build(source, out, progress=False)
    assert not (tmp_path / "stores").exists()  # neither the store nor the folder the build made for it
    monkeypatch.undo()

    # a failed *re*build keeps the old store intact
    CorpusStore.build(source, out, progress=False)
    monkeypatch.setattr(corpus_mod, "_insert_linear_probe", boom)
    with pytest.raises(KeyboardInterrupt):
        CorpusStore.build(source, out, progress=False)
    assert sorted(p.name for p in (tmp_path / "stores").iterdir()) == ["wiki"]
    _assert_matches_source(CorpusStore.open(out), source)


def test_store_holds_maps_not_rows(tmp_path: Path) -> None:
    n = 3000
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(_odd_ids(n)))
    store = CorpusStore.build(source, tmp_path / "s", progress=False)
    state = vars(store)
    assert isinstance(state["_offsets"], np.memmap) and isinstance(state["_id_offsets"], np.memmap)
    assert isinstance(state["_table"], np.memmap)
    assert isinstance(state["_contents"], mmap.mmap) and isinstance(state["_ids"], mmap.mmap)
    for name, value in state.items():
        if isinstance(value, (list, tuple, dict, set, str, bytes)):
            assert len(value) < 100, f"attribute {name} holds {len(value)} items"
        if isinstance(value, np.ndarray):
            assert isinstance(value, np.memmap), f"attribute {name} is an in-memory array"
    assert len(pickle.dumps(store)) < 500  # pickles by path, not by contents


def test_reopen_and_pickle(tmp_path: Path) -> None:
    source = write_corpus(tmp_path / "w.jsonl.gz", corpus_rows(_odd_ids(25)))
    CorpusStore.build(source, tmp_path / "s", progress=False).close()
    with CorpusStore.open(tmp_path / "s") as store:
        _assert_matches_source(store, source)
        clone = pickle.loads(pickle.dumps(store))
    _assert_matches_source(clone, source)
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["count"] == 25 and meta["format_version"] == corpus_mod.FORMAT_VERSION
    assert meta["source_size"] == source.stat().st_size
    offsets = np.load(tmp_path / "s" / "offsets.npy")
    assert offsets.dtype == np.uint64 and offsets.shape == (26,)
    assert offsets[-1] == (tmp_path / "s" / "contents.bin").stat().st_size


def test_build_or_open_reuses_matching_store(tmp_path: Path, monkeypatch) -> None:
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(n=8))
    first = CorpusStore.build_or_open(source, tmp_path / "s", progress=False)
    assert len(first) == 8

    def no_build(*a, **k):
        raise AssertionError("should have reused the store")

    monkeypatch.setattr(CorpusStore, "build", no_build)
    assert len(CorpusStore.build_or_open(source, tmp_path / "s")) == 8
    monkeypatch.undo()

    write_corpus(source, corpus_rows(n=12))  # the source changed: rebuild
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert len(CorpusStore.build_or_open(source, tmp_path / "s", progress=False)) == 12


def test_refuses_to_replace_foreign_folder(tmp_path: Path) -> None:
    source = write_corpus(tmp_path / "w.jsonl", corpus_rows(n=3))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="not a corpus store"):
        CorpusStore.build(source, tmp_path / "notes", progress=False)
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "precious"
    with pytest.raises(FileNotFoundError, match="not a corpus store"):
        CorpusStore.open(tmp_path / "notes")


def test_empty_corpus_and_odd_text(tmp_path: Path) -> None:
    empty = write_jsonl(tmp_path / "e.jsonl", [])
    with pytest.raises(DataFormatError, match="no passages"):
        CorpusStore.build(empty, tmp_path / "e", progress=False)
    # all-empty contents (zero-byte contents.bin) and a lone surrogate escaped in JSON
    src = tmp_path / "odd.jsonl"
    src.write_text('{"id": "0", "contents": ""}\n{"id": "1", "contents": ""}\n{"id": "2", "contents": "\\ud800x"}\n')
    store = CorpusStore.build(src, tmp_path / "odd", progress=False)
    assert store.row(0).contents == "" and store.row(2).contents == "\ud800x"
