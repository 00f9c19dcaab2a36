"""Encoder, FAISS index and the in-process Retriever on a small corpus with the bundled MiniLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cosearch_lib.config import EncoderConfig
from cosearch_lib.data.passage import Passage, make_contents, split_contents
from cosearch_lib.retrieval.corpus_store import CorpusStore
from cosearch_lib.retrieval.encoder import TextEncoder
from cosearch_lib.retrieval.faiss_index import build_index, build_index_from_corpus, load_index, new_index, save_index
from cosearch_lib.retrieval.retriever import Retriever

DOCS = [
    ("Orvane Tellis", "Orvane Tellis was a cartographer born in the harbour city of Kessmere in 1843."),
    ("Kessmere", "Kessmere is a harbour city on the western coast of Valdoria, known for its shipyards."),
    ("The Glass Orchard", "The Glass Orchard is a novel written by Imra Solvey and published in 1911."),
    ("Imra Solvey", "Imra Solvey was a novelist and poet from the mountain town of Drelling."),
    ("Drelling", "Drelling is a mountain town in northern Valdoria with a population of 4,200."),
    ("Valdoria", "Valdoria is a coastal republic whose capital is Amberlune."),
]


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(EncoderConfig(model="all-minilm-l6-v2", batch_size=4), device="cpu")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": make_contents(t, x)}) + "\n" for i, (t, x) in enumerate(DOCS)))
    return CorpusStore.build(path, root / "store", progress=False)


def test_contents_round_trip():
    assert split_contents(make_contents('A "quoted" title', "line one\nline two")) == ('A "quoted" title', "line one\nline two")
    assert split_contents("no title line") == ("", "no title line")
    p = Passage("7", make_contents("T", "body"), 0.5)
    assert (p.title, p.text, p.to_document()) == ("T", "body", {"id": "7", "contents": '"T"\nbody'})


def test_e5_prefixes_are_automatic_for_e5_names_only():
    assert EncoderConfig(model="intfloat/e5-base-v2").use_e5_prefixes
    assert EncoderConfig(model="/models/e5-large").use_e5_prefixes
    assert not EncoderConfig(model="all-minilm-l6-v2").use_e5_prefixes
    assert not EncoderConfig(model="intfloat/e5-base-v2", e5_prefixes=False).use_e5_prefixes
    with pytest.raises(ValueError, match="pooling"):
        EncoderConfig(pooling="max")


def test_embeddings_are_unit_norm_and_order_independent_of_batching(encoder):
    texts = [x for _, x in DOCS] + ["short", "a much longer query about harbour cities and shipyards in Valdoria"]
    together = encoder.encode_passages(texts)
    alone = np.stack([encoder.encode_passages([t])[0] for t in texts])
    assert together.shape == (len(texts), encoder.dim) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # length-sorted batching must put every vector back in the caller's order
    np.testing.assert_allclose(together, alone, atol=2e-5)
    assert encoder.encode_queries([]).shape == (0, encoder.dim)


def test_prefixes_and_pooling_change_the_vectors(encoder):
    text = ["where was the cartographer born"]
    base = encoder.encode_queries(text)
    encoder.cfg.e5_prefixes = True
    try:
        prefixed = encoder.encode_queries(text)
    finally:
        encoder.cfg.e5_prefixes = None
    encoder.cfg.pooling = "cls"
    try:
        cls = encoder.encode_queries(text)
    finally:
        encoder.cfg.pooling = "mean"
    assert not np.allclose(base, prefixed) and not np.allclose(base, cls)
    with pytest.raises(TypeError):
        encoder.encode([1, 2])


def test_flat_index_matches_brute_force_and_hnsw_agrees(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:10] + 0.05 * rng.normal(size=(10, 16)).astype(np.float32)
    flat = build_index(x, "flat")
    scores, ids = flat.search(q, 5)
    brute = np.argsort(-(q @ x.T), axis=1)[:, :5]
    np.testing.assert_array_equal(ids, brute)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ x.T, brute, 1), rtol=1e-5)
    _, hnsw_ids = build_index(x, "hnsw", hnsw_m=16).search(q, 1)
    assert (hnsw_ids[:, 0] == brute[:, 0]).mean() >= 0.9
    with pytest.raises(ValueError, match="kind"):
        new_index(16, "ivf")
    with pytest.raises(ValueError, match="non-empty"):
        build_index(np.zeros((0, 16), np.float32))


def test_index_save_load_and_mmap_round_trip(tmp_path):
    x = np.eye(8, dtype=np.float32)
    path = save_index(build_index(x), tmp_path / "sub" / "e.faiss")
    assert [p.name for p in path.parent.iterdir()] == ["e.faiss"]  # no temp file left behind
    for mmap in (False, True):
        _, ids = load_index(path, mmap=mmap).search(x[3:4], 1)
        assert ids[0, 0] == 3
    with pytest.raises(FileNotFoundError):
        load_index(tmp_path / "missing.faiss")
    bad = tmp_path / "bad.faiss"
    bad.write_bytes(b"not an index")
    with pytest.raises(ValueError, match="not a readable FAISS index"):
        load_index(bad)


def test_retriever_finds_the_right_passage(encoder, store):
    index = build_index_from_corpus(encoder, store, chunk=4, progress=False)
    retriever = Retriever(encoder, index, store)
    results = retriever.search(["Who wrote The Glass Orchard?", "capital of Valdoria"], topn=3)
    assert [r[0].title for r in results] == ["The Glass Orchard", "Valdoria"]
    for ranked in results:
        assert len(ranked) == 3 and all(isinstance(p, Passage) for p in ranked)
        assert [p.score for p in ranked] == sorted((p.score for p in ranked), reverse=True)
    assert len(retriever.search(["Kessmere"], topn=100)[0]) == len(DOCS)  # topn clipped to the corpus
    assert retriever.search([], topn=3) == []
    with pytest.raises(TypeError):
        retriever.search("one string", topn=3)
    with pytest.raises(ValueError):
        retriever.search(["q"], topn=0)


def test_retriever_refuses_index_built_from_another_corpus(encoder, store):
    with pytest.raises(ValueError, match="same corpus"):
        Retriever(encoder, build_index(np.eye(4, dtype=np.float32)), store)


class _CountingEncoder:
    """The real encoder, counting the passages it encodes; raises once ``fail_after`` calls are done."""

    def __init__(self, encoder, fail_after=None):
        self.encoder, self.fail_after, self.calls, self.encoded = encoder, fail_after, 0, []
        self.dim = encoder.dim

    def encode_passages(self, texts):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("the node went away")
        self.calls += 1
        self.encoded.extend(texts)
        return self.encoder.encode_passages(texts)


def test_the_index_builds_in_shards_over_processes_and_a_cut_build_resumes(encoder, store, tmp_path):
    """Issue 47, item 8: build-index was one process with no resume. The corpus is now encoded in
    shards shared round-robin by the ranks of a job, each kept whole on disk; a rank cut mid-build
    loses only the shard it was in, and the merged index is the one-process index, row for row."""
    import numpy as np

    from cosearch_lib.retrieval.index_shards import encode_shards, merge_shards, shards_folder

    one_process = build_index_from_corpus(encoder, store, progress=False)
    folder = shards_folder(tmp_path / "e5_Flat.index")
    n = len(store)
    rank0, rank1 = _CountingEncoder(encoder), _CountingEncoder(encoder, fail_after=1)
    assert encode_shards(rank0, store, folder, encoder_name="minilm", rank=0, world=2, shard_rows=2, chunk=1,
                         progress=False) == list(range(0, (n + 1) // 2, 2))
    with pytest.raises(KeyboardInterrupt):  # rank 1 is cut inside its first shard (2 rows, 1 per call)
        encode_shards(rank1, store, folder, encoder_name="minilm", rank=1, world=2, shard_rows=2, chunk=1, progress=False)
    assert not (folder / "shard-000001.npy").exists() and not list(folder.glob(".*"))  # nothing half-written
    with pytest.raises(FileNotFoundError, match="shard-000001.npy is missing"):
        merge_shards(folder, progress=False)
    again = _CountingEncoder(encoder)
    done = encode_shards(again, store, folder, encoder_name="minilm", rank=1, world=2, shard_rows=2, chunk=1, progress=False)
    assert done == list(range(1, (n + 1) // 2, 2)) and len(again.encoded) == n - len(rank0.encoded)  # rank 0's kept
    merged = merge_shards(folder, progress=False)
    assert merged.ntotal == n == one_process.ntotal
    np.testing.assert_allclose(merged.reconstruct_n(0, n), one_process.reconstruct_n(0, n), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="holds shards of another build"):
        encode_shards(encoder, store, folder, encoder_name="e5", rank=0, world=1, shard_rows=2, progress=False)
