"""The profile -> retriever pipeline on real-format fixtures (wiki-18 jsonl.gz corpus + Search-R1
parquet), the paper profile's paths, and the CLI around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cosearch_lib import cli
from cosearch_lib.config import load_profile
from cosearch_lib.data.passage import make_contents
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.experiment import build_retriever
from cosearch_lib.paths import project_root
from cosearch_lib.retrieval.artifacts import corpus_paths, index_build_info, prepare_world

from tests.fixture_files import search_r1_rows, write_corpus, write_search_r1_parquet

PASSAGES = [
    ("Founder 0", "Founder 0 established fictional town 0 on the river bend in 1702."),
    ("Fictional town 1", "Fictional town 1 was founded by Founder 1, a salt merchant."),
    ("Salt trade", "The salt trade shaped the coast for two centuries."),
    ("River bend", "A river bend is a curve in the course of a river."),
    ("Fictional town 2", "Founder 2 laid out the streets of fictional town 2."),
]


@pytest.fixture
def real_format_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_DATA", str(tmp_path / "data"))
    corpus = write_corpus(tmp_path / "wiki" / "wiki-18.jsonl.gz",
                          [{"id": str(i), "contents": make_contents(t, x)} for i, (t, x) in enumerate(PASSAGES)])
    qa = write_search_r1_parquet(tmp_path / "qa" / "test.parquet", search_r1_rows(3, split="test"))
    profile = tmp_path / "wiki.yaml"
    profile.write_text(yaml.safe_dump({
        "profile": "wiki-fixture", "seed": 1,
        "data": {"corpus_path": str(corpus), "qa_paths": {"test": str(qa)}},
        "retrieval": {"encoder": {"model": "all-minilm-l6-v2", "batch_size": 2}}, "search": {"topn": 4, "topk": 2},
    }))
    return load_profile(profile)


def test_real_format_corpus_builds_a_cached_retriever(real_format_profile):
    cfg = real_format_profile
    retriever = build_retriever(cfg, progress=False)
    paths = corpus_paths(cfg)
    assert len(retriever) == len(PASSAGES) and paths.index.exists() and paths.store.is_dir()
    assert index_build_info(cfg)["ntotal"] == len(PASSAGES)
    questions = load_qa(paths.qa["test"])
    ranked = retriever.search([q.question for q in questions], topn=2)
    # "who founded fictional town 1?" must find the passage that names its founder
    assert any("Founder 1" in p.contents for p in ranked[1])
    mtime = paths.index.stat().st_mtime_ns
    build_retriever(cfg, progress=False)  # second call reuses the index instead of re-encoding
    assert paths.index.stat().st_mtime_ns == mtime


def test_user_index_with_the_wrong_size_is_refused(real_format_profile, tmp_path):
    import numpy as np

    from cosearch_lib.retrieval.faiss_index import build_index, save_index

    cfg = real_format_profile
    cfg.data.index_path = str(save_index(build_index(np.eye(3, dtype=np.float32)), tmp_path / "other.faiss"))
    with pytest.raises(ValueError, match="3 vectors but the corpus has 5 rows"):
        build_retriever(cfg, progress=False)


def test_paper_profile_paths_and_missing_download_message():
    cfg = load_profile("paper")
    paths = corpus_paths(cfg)
    assert not cfg.uses_embedded_world and cfg.retrieval.encoder.use_e5_prefixes
    assert paths.corpus == project_root() / "data/wiki18/wiki-18.jsonl.gz"
    assert paths.index == project_root() / "data/wiki18/e5_Flat.index"
    if not paths.corpus.exists():
        with pytest.raises(FileNotFoundError, match="cosearch download wiki18-corpus"):
            prepare_world(cfg)


def test_cli_build_index_and_errors(real_format_profile, tmp_path, capsys, monkeypatch):
    profile_file = tmp_path / "wiki.yaml"
    assert cli.main(["build-index", "--profile", str(profile_file)]) == 0
    assert json.loads(capsys.readouterr().out)["passages"] == len(PASSAGES)
    assert cli.main(["build-world", "--profile", "no-such-profile"]) == 2
    assert "available profiles" in capsys.readouterr().err


def test_cli_download_offline_is_a_clear_error(monkeypatch, tmp_path, capsys):
    from cosearch_lib.data import downloads as data

    def offline(*args, **kwargs):
        raise data.HubUnavailableError("cannot reach the hub for PeterJinGo/wiki-18-corpus; run huggingface-cli download ...")

    monkeypatch.setattr(data, "download_wiki18_corpus", offline)
    assert cli.main(["download", "wiki18-corpus", "--dest", str(tmp_path)]) == 2
    assert "PeterJinGo/wiki-18-corpus" in capsys.readouterr().err


def test_cli_models_lists_bundled_models(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "all-minilm-l6-v2" in out and "MISSING" not in out


def test_build_index_under_torchrun_shares_the_shards_between_ranks(real_format_profile, tmp_path):
    """`torchrun --nproc-per-node 2 cosearch build-index --profile P` (docs/USAGE.md, the cluster path):
    the ranks encode the corpus' shards round-robin, rank 0 merges them into the index the one-process
    build writes, and the shards folder is gone once the index is saved."""
    import os
    import shutil
    import subprocess
    import sys

    import numpy as np

    from cosearch_lib.retrieval.faiss_index import load_index
    from cosearch_lib.retrieval.index_shards import shards_folder

    profile = tmp_path / "wiki.yaml"
    text = yaml.safe_load(profile.read_text())
    text["retrieval"]["index_shard_rows"] = 2  # 5 passages: shards 0 and 2 on rank 0, shard 1 on rank 1
    profile.write_text(yaml.safe_dump(text))
    cosearch = shutil.which("cosearch") or str(Path(sys.executable).parent / "cosearch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", cosearch,
                           "build-index", "--profile", str(profile), "--quiet"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout[done.stdout.index("{"):])["processes"] == 2
    cfg = load_profile(profile)
    path = corpus_paths(cfg).index
    assert not shards_folder(path).exists() and json.loads(path.with_suffix(".json").read_text())["processes"] == 2
    two = load_index(path)
    path.unlink()
    one = build_retriever(cfg, progress=False).index  # one process, the same shards
    np.testing.assert_allclose(two.reconstruct_n(0, two.ntotal), one.reconstruct_n(0, one.ntotal), rtol=1e-5, atol=1e-6)
