"""The paper profile's path as a cluster user follows it (issue 47): downloads against a local
stand-in for the Hugging Face hub (the real ``huggingface_hub`` client runs), files in the formats
the paper's data ships in (public samples: tests/fixtures/flashrag/SOURCE.md), and the profile's
data layout."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cosearch_lib.config import ConfigError, load_profile
from cosearch_lib.data.corpus_stream import iter_corpus
from cosearch_lib.data.passage import split_contents
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.paths import project_root
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.retrieval.corpus_store import CorpusStore

from tests.fixture_files import (
    FLASHRAG_CORPUS,
    FLASHRAG_NQ_TEST,
    cosearch_rows_from_search_r1,
    read_flashrag_rows,
    search_r1_rows_from_flashrag,
)
from tests.hub_standin import HubStandin

# ----------------------------------------------------------------------------- public samples


def test_flashrag_wiki18_sample_streams_and_builds_a_store(tmp_path: Path) -> None:
    """The wiki-18 format as FlashRAG ships it (gzip, quoted title line, escaped quotes inside)."""
    rows = list(iter_corpus(FLASHRAG_CORPUS))
    assert len(rows) == 300 and [pid for pid, _ in rows[:3]] == ["0", "1", "2"]
    title, text = split_contents(rows[0][1])
    assert title == "Evan Morris" and text.startswith("Evan Morris Evan L. Morris (January 26, 1977")
    # a title with a combining character and text with doubled quotes survive as written
    titles = {split_contents(c)[0] for _, c in rows}
    assert "La Can\u0303ada Flintridge, California" in titles
    assert any('""New York""' in c for _, c in rows)
    store = CorpusStore.build(FLASHRAG_CORPUS, tmp_path / "store", progress=False)
    assert len(store) == 300
    assert store.get("7").title == "E.T. the Extra-Terrestrial (video game)"


def test_flashrag_nq_test_file_loads() -> None:
    """FlashRAG's own NQ test rows: no data_source column (the folder names it), golds with
    non-breaking spaces kept as written."""
    examples = load_qa(FLASHRAG_NQ_TEST)
    assert len(examples) == 17
    assert {e.data_source for e in examples} == {"nq"} and {e.split for e in examples} == {"test"}
    assert examples[0].id == "test_0" and examples[0].golden_answers == ["Wilhelm Conrad R\u00f6ntgen"]
    assert examples[7].golden_answers == ["February\u00a01,\u00a02018"]
    assert len(examples[13].golden_answers) == 16


@pytest.mark.parametrize("schema", ["search_r1", "cosearch"])
def test_parquet_made_from_the_public_sample_loads_the_same_questions(tmp_path: Path, schema: str) -> None:
    """Search-R1's parquet (nq_search.py's columns) and the columns CoSearch's release reads, made from
    the public NQ sample, load to the same questions and golds as the FlashRAG file itself."""
    flashrag = read_flashrag_rows()
    rows = search_r1_rows_from_flashrag(flashrag, "nq", "test")
    if schema == "cosearch":
        rows = cosearch_rows_from_search_r1(rows)
        assert not {"id", "question", "golden_answers"} & set(rows[0])
    folder = tmp_path / "co-search-eval" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "test-00000-of-00001.parquet")
    examples = load_qa(tmp_path / "co-search-eval")
    assert [e.question for e in examples] == [r["question"].strip() + "?" for r in flashrag]
    assert [e.golden_answers for e in examples] == [r["golden_answers"] for r in flashrag]
    assert {e.data_source for e in examples} == {"nq"}
    ids = [e.id for e in examples]
    assert len(set(ids)) == 17 and (ids[0] == "test_0" if schema == "search_r1" else ids[0] == "nq_test_0")


def test_qa_file_missing_its_question_column_names_file_row_and_column(tmp_path: Path) -> None:
    rows = cosearch_rows_from_search_r1(search_r1_rows_from_flashrag(read_flashrag_rows(), "nq", "train"))
    for r in rows:
        del r["extra_info"]["question"]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"train.parquet row 0: column 'question' is missing .*extra_info.question"):
        load_qa(path)


# ----------------------------------------------------------------------------- the hub stand-in


def _hub_tree(root: Path) -> Path:
    """A hub holding the paper's four dataset repositories (made from the public samples) and one model."""
    sample = search_r1_rows_from_flashrag(read_flashrag_rows(), "nq", "test")
    for repo, split in (("hzeng/co-search-train", "train"), ("hzeng/co-search-eval", "test")):
        folder = root / "datasets" / repo / "data"
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(cosearch_rows_from_search_r1(sample)),
                       folder / f"{split}-00000-of-00001.parquet")
        (root / "datasets" / repo / "README.md").write_text("stand-in\n")
    corpus = root / "datasets" / "PeterJinGo" / "wiki-18-corpus"
    corpus.mkdir(parents=True)
    shutil.copy(FLASHRAG_CORPUS, corpus / "wiki-18.jsonl.gz")
    index = root / "datasets" / "PeterJinGo" / "wiki-18-e5-index"
    index.mkdir(parents=True)
    (index / "part_aa").write_bytes(b"first-half-" * 1000)
    (index / "part_ab").write_bytes(b"second-half" * 77)
    model = root / "models" / "stand-in-org" / "tiny-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return root


def _cosearch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosearch_lib.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=project_root(), timeout=300)


def _profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(text)
    return path


@pytest.fixture()
def hub(tmp_path: Path):
    with HubStandin(_hub_tree(tmp_path / "hub")) as standin:
        yield standin


def _hub_env(hub: HubStandin, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}


def test_download_dest_lands_where_the_paper_profile_reads(tmp_path: Path, hub: HubStandin) -> None:
    """Break 1: data/README.md's `cosearch download cosearch-data --dest data/cosearch` must write the
    folders paper.yaml reads (co-search-train, co-search-eval), not train/ and eval/."""
    root = tmp_path / "data"
    done = _cosearch("download", "cosearch-data", "--dest", str(root / "cosearch"), env=_hub_env(hub, tmp_path))
    assert done.returncode == 0, done.stderr
    cfg = load_profile(_profile(tmp_path, f"extends: paper\ndata:\n  root: {root}\n"))
    qa = corpus_paths(cfg).qa
    assert qa["train"] == root / "cosearch" / "co-search-train"
    assert len(load_qa(qa["train"])) == 17 and len(load_qa(qa["test"])) == 17
    assert hub.requests["GET /api/datasets/hzeng/co-search-eval/revision/main"] == 1  # the real client asked


def test_download_all_for_a_profile_then_models_offline(tmp_path: Path, hub: HubStandin) -> None:
    """`cosearch download all --profile P` writes every file where P reads it and puts P's hub models
    into the cache; a node with HF_HUB_OFFLINE=1 then finds them, and names what is missing."""
    root = tmp_path / "data"
    profile = _profile(tmp_path, f"extends: paper\ndata:\n  root: {root}\n  corpus_path: wiki/corpus.jsonl.gz\n"
                                 "retrieval:\n  encoder:\n    model: stand-in-org/tiny-model\n"
                                 "models:\n  agent: smollm2-135m-instruct\n  ranker: smollm2-135m-instruct\n")
    env = _hub_env(hub, tmp_path)
    done = _cosearch("download", "all", "--profile", str(profile), env=env)
    assert done.returncode == 0, done.stderr
    cfg = load_profile(profile)
    paths = corpus_paths(cfg)
    assert paths.corpus == root / "wiki" / "corpus.jsonl.gz"  # the profile's own file name
    assert [pid for pid, _ in iter_corpus(paths.corpus)][:2] == ["0", "1"]
    assert paths.index.read_bytes() == b"first-half-" * 1000 + b"second-half" * 77  # the parts, merged
    assert not (paths.index.parent / "part_aa").exists()
    assert len(load_qa(paths.qa["test"])) == 17
    assert "retrieval.encoder.model: stand-in-org/tiny-model (hub)" in done.stdout
    assert "models.agent: smollm2-135m-instruct (bundled)" in done.stdout
    # an offline compute node reading the same cache: the prefetched model resolves...
    offline = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    check = [sys.executable, "-c", "from cosearch_lib.models.registry import check_model_name as c; "
             "import sys; print(c('retrieval.encoder.model', sys.argv[1]))"]
    ok = subprocess.run([*check, "stand-in-org/tiny-model"], capture_output=True, text=True, env={**os.environ, **offline})
    assert ok.returncode == 0 and ok.stdout.strip() == "hub", ok.stderr
    # ...and one that was never fetched is named, with the fix
    bad = subprocess.run([*check, "stand-in-org/never-fetched"], capture_output=True, text=True,
                         env={**os.environ, **offline})
    assert bad.returncode != 0
    assert "stand-in-org/never-fetched" in bad.stderr and "HF_HUB_OFFLINE" in bad.stderr
    assert "huggingface-cli download stand-in-org/never-fetched" in bad.stderr


def test_download_refuses_a_qa_file_where_the_hub_gives_a_folder(tmp_path: Path) -> None:
    from cosearch_lib.data.downloads import profile_targets

    cfg = load_profile(_profile(tmp_path, "extends: paper\ndata:\n  qa_paths:\n    train: cosearch/train.parquet\n"))
    with pytest.raises(ConfigError, match=r"data.qa_paths.train: 'cosearch/train.parquet' names a file.*co-search-train"):
        profile_targets(cfg.data)


def test_download_of_a_missing_repository_says_what_and_how(tmp_path: Path) -> None:
    with HubStandin(tmp_path / "empty_hub") as empty:
        (tmp_path / "empty_hub").mkdir()
        done = _cosearch("download", "cosearch-data", "--dest", str(tmp_path / "d"), env=_hub_env(empty, tmp_path))
    assert done.returncode == 2
    assert "hzeng/co-search-train" in done.stderr and "RepositoryNotFoundError" in done.stderr
    assert "Traceback" not in done.stderr


def test_gzip_sample_is_what_the_source_names() -> None:
    """The committed sample is the first 300 lines of FlashRAG's file, each a wiki-18 row."""
    with gzip.open(FLASHRAG_CORPUS, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert len(lines) == 300 and all(set(json.loads(line)) == {"id", "contents"} for line in lines)
    assert "adb2a8bc285042abf7c0c56ff004283f62318c5a" in (FLASHRAG_CORPUS.parent / "SOURCE.md").read_text()


# ----------------------------------------------------------------------------- checks before any GPU work


def _paper_mini_like(tmp_path: Path, extra: str = "") -> Path:
    """A profile extending paper, its data under tmp_path, SmolLM2 and MiniLM: what fits this machine."""
    return _profile(tmp_path, f"""extends: paper
data:
  root: {tmp_path / 'data'}
retrieval:
  encoder:
    model: all-minilm-l6-v2
models:
  agent: smollm2-135m-instruct
  ranker: smollm2-135m-instruct
  backend: vllm
rollout:
  max_context_tokens: 4096
protocol:
  ranker_passage_chars: 300  # 50 whole wiki-18 passages take ~10k SmolLM2 tokens, past its 8,192 positions
{extra}""")


def _without_relevance(tmp_path: Path, extra: str = "") -> Path:
    """:func:`_paper_mini_like` with the Fixed Ranker's relevance training off: the checks of the other
    breaks, before any relevance set is prepared (test_the_fixed_ranker_trains_on_prepared_relevance_data)."""
    return _paper_mini_like(tmp_path, "relevance:\n  enabled: false\n" + extra)


def _fill_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "wiki18").mkdir(parents=True)
    shutil.copy(FLASHRAG_CORPUS, data / "wiki18" / "wiki-18.jsonl.gz")
    rows = cosearch_rows_from_search_r1(search_r1_rows_from_flashrag(read_flashrag_rows(), "nq", "test"))
    for folder in ("co-search-train", "co-search-eval"):
        (data / "cosearch" / folder).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), data / "cosearch" / folder / "part-0.parquet")


def test_engine_holds_the_longest_ranker_prompt_of_the_paper_setting(tok, tmp_path: Path) -> None:
    """Break 3: the engine's length was the agent's context + a turn (8,192 + 512), Unsloth's default
    4,096 where unset; at N = 50 passages of wiki-18 the ranker's prompt is longer. The measured budget
    holds every ranker prompt built from the corpus."""
    import random

    from cosearch_lib.agent.context_budget import context_budget
    from cosearch_lib.agent.prompts import ranker_messages
    from cosearch_lib.data.passage import Passage

    cfg = load_profile("paper")
    sample = [Passage(pid, c) for pid, c in iter_corpus(FLASHRAG_CORPUS)]
    budget = context_budget(tok, cfg.rollout, cfg.protocol, sample)
    assert budget.ranker_prompt > 6000 and budget.engine_len == budget.ranker > 8192 + 512
    rng = random.Random(0)
    for _ in range(20):  # real ranker prompts of random candidate sets all fit
        msgs = ranker_messages("who founded the town of millbrook in the year the river flooded?",
                               "millbrook founder", rng.sample(sample, 50), 5, cfg.protocol)
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert len(tok(text, add_special_tokens=False)["input_ids"]) + cfg.rollout.ranker_max_new_tokens <= budget.engine_len


def test_a_budget_longer_than_the_engine_or_the_model_is_refused_with_the_numbers(tmp_path: Path) -> None:
    from cosearch_lib.experiment.preflight import check_inputs

    _fill_data(tmp_path)
    fits = check_inputs(load_profile(_without_relevance(tmp_path)), index=False)
    assert fits.engine_len is not None and 4096 + 512 < fits.engine_len <= 8192
    short = load_profile(_without_relevance(tmp_path))
    short.models.vllm.max_model_len = 4096
    with pytest.raises(ConfigError, match=r"models.vllm.max_model_len=4096 is shorter .*ranker: prompt \d+ \(N=50"):
        check_inputs(short, index=False)
    # the paper's own agent context (8,192 + 512) does not fit SmolLM2's 8,192 positions
    paper_context = load_profile(_without_relevance(tmp_path))
    paper_context.rollout.max_context_tokens = 8192
    with pytest.raises(ConfigError, match=r"does not fit 'smollm2-135m-instruct'.*8192 positions"):
        check_inputs(paper_context, index=False)


def test_missing_data_folder_is_named_with_the_download_command(tmp_path: Path) -> None:
    from cosearch_lib.experiment.preflight import check_inputs

    cfg = load_profile(_without_relevance(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"data.corpus_path: .*wiki-18.jsonl.gz not found .*cosearch download wiki18-corpus --profile"):
        check_inputs(cfg)
    _fill_data(tmp_path)
    shutil.rmtree(tmp_path / "data" / "cosearch" / "co-search-eval")
    with pytest.raises(FileNotFoundError, match=r"data.qa_paths.test: .*co-search-eval not found .*cosearch download cosearch-data"):
        check_inputs(cfg, index=False)


def test_qa_file_missing_a_column_is_refused_at_start(tmp_path: Path) -> None:
    from cosearch_lib.experiment.preflight import check_inputs

    _fill_data(tmp_path)
    rows = cosearch_rows_from_search_r1(search_r1_rows_from_flashrag(read_flashrag_rows(), "nq", "train"))
    for r in rows:
        del r["reward_model"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "cosearch" / "co-search-train" / "part-0.parquet")
    with pytest.raises(ValueError, match=r"part-0.parquet row 0: column 'golden_answers' is missing .*reward_model.ground_truth.target"):
        check_inputs(load_profile(_without_relevance(tmp_path)), index=False, engine=False)


def test_an_index_of_another_dimension_than_the_encoder_is_refused(tmp_path: Path) -> None:
    """A 768-d index (wiki-18's e5) with the 384-d MiniLM encoder: refused from the file's header."""
    import faiss
    import numpy as np

    from cosearch_lib.experiment.preflight import check_inputs

    _fill_data(tmp_path)
    index = faiss.IndexFlatIP(768)
    index.add(np.random.default_rng(0).standard_normal((300, 768)).astype("float32"))
    faiss.write_index(index, str(tmp_path / "data" / "wiki18" / "e5_Flat.index"))
    with pytest.raises(ConfigError, match=r"e5_Flat.index holds 768-d vectors, but retrieval.encoder.model "
                                          r"'all-minilm-l6-v2' makes 384-d ones.*intfloat/e5-base-v2"):
        check_inputs(load_profile(_without_relevance(tmp_path)), engine=False)


@pytest.mark.slow  # ~47 s on 2 AVX2 cores (make test-slow, CI)
def test_the_fixed_ranker_trains_on_prepared_relevance_data(tmp_path: Path, monkeypatch) -> None:
    """Break 6: paper.yaml left relevance training off and nothing read the appendix's data, so at
    paper scale the "Fixed Ranker" was the untrained instruct model. paper.yaml now turns it on, on a
    set `cosearch prepare-relevance` writes: the NQ training questions, the retriever's top-50 of
    each, answer containment, the queries with no relevant candidate dropped. A job without the set
    is refused at its check, naming the command; a set made with other settings counts as missing."""
    from cosearch_lib.cli import main as cosearch
    from cosearch_lib.experiment.preflight import check_inputs
    from cosearch_lib.metrics import has_answer
    from cosearch_lib.paths import cache_dir
    from cosearch_lib.retrieval.relevance_sets import read_relevance_set

    paper = load_profile("paper").relevance
    assert paper.enabled and paper.source == "prepared" and paper.query_sources == ("nq",) and paper.split == "train"
    monkeypatch.setenv("COSEARCH_CACHE", str(cache_dir()))  # the converted models stay where they are
    monkeypatch.setenv("COSEARCH_DATA", str(tmp_path / "derived"))  # the store and index of the sample go here
    _fill_data(tmp_path)
    # training questions the sample can answer: a passage's opening words, its title as the answer;
    # half NQ, half HotpotQA (not among the relevance queries); three NQ ones nothing answers
    passages = [(pid, split_contents(c)) for pid, c in iter_corpus(FLASHRAG_CORPUS)][:40]
    rows = [{"id": f"q{i}", "question": " ".join(text.split()[:12]) + "?", "golden_answers": [title],
             "data_source": "nq" if i % 2 == 0 else "hotpotqa"} for i, (_, (title, text)) in enumerate(passages)]
    rows += [{"id": f"x{i}", "question": f"Which zqxv number {i} is unanswerable?", "golden_answers": [f"zqxv{i}qq"],
              "data_source": "nq"} for i in range(3)]
    train = cosearch_rows_from_search_r1(search_r1_rows_from_flashrag(rows, "nq", "train"))
    for row, src in zip(train, rows):
        row["data_source"] = src["data_source"]
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "data" / "cosearch" / "co-search-train" / "part-0.parquet")
    profile = _paper_mini_like(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"relevance.prepared_path: .*relevance-set.jsonl.gz not found.*"
                                                r"cosearch prepare-relevance --profile"):
        check_inputs(load_profile(profile), engine=False, index=False)
    assert cosearch(["prepare-relevance", "--profile", str(profile), "--quiet"]) == 0
    cfg = load_profile(profile)
    kept = read_relevance_set(tmp_path / "data" / "relevance" / "relevance-set.jsonl.gz", topn=50)
    assert {q.data_source for q in kept} == {"nq"} and 15 <= len(kept) <= 20  # the 20 answerable NQ ones, at most
    assert not any(q.id.startswith("x") for q in kept) and all(len(q.candidates) == 50 and any(q.relevant) for q in kept)
    assert all(q.relevant == tuple(int(has_answer(p.contents, q.golden_answers)) for p in q.candidates) for q in kept)
    assert any(line.startswith("relevance.prepared_path") for line in check_inputs(cfg, engine=False, index=False).checked)
    fewer = load_profile(_paper_mini_like(tmp_path, "relevance:\n  n_queries: 5\n"))
    with pytest.raises(FileNotFoundError, match="was made with other settings"):
        check_inputs(fewer, engine=False, index=False)


def test_a_launch_unsloth_cannot_run_is_refused_when_the_job_is_written(tmp_path: Path) -> None:
    """Break 2: the refusal of a launch came after the queue wait and the index load. Unsloth on CPU
    ranks is now refused by the dry run, before any script is written: by the plan first (issue 50),
    and with ``--force`` past it, by the launch check; Unsloth on 8 GPUs per rank passes the launch
    check (its patched model and one vLLM engine per rank, test_gpu_path.py)."""
    from cosearch_lib.experiment.preflight import _check_launch

    env = {"COSEARCH_RUNS": str(tmp_path / "runs")}
    done = _cosearch("slurm", "train", "--profile", "paper", "--gpus-per-node", "0", "--tasks-per-node", "2",
                     "--dry-run", env=env)
    assert done.returncode == 2, done.stderr
    assert "no GPU for the Unsloth backend" in done.stderr and "change --gpus-per-node" in done.stderr
    forced = _cosearch("slurm", "train", "--profile", "paper", "--gpus-per-node", "0", "--tasks-per-node", "2",
                       "--dry-run", "--force", env=env)
    assert forced.returncode == 2, forced.stderr
    assert "models.backend 'unsloth' needs CUDA GPUs" in forced.stderr and "--gpus-per-node 0" in forced.stderr
    assert "Traceback" not in done.stderr + forced.stderr
    assert not (tmp_path / "runs" / "paper" / "slurm").exists()
    paper = load_profile("paper")
    assert "one vLLM engine per rank" in _check_launch(paper, 16, True)
    paper.models.vllm.device = "cpu"
    with pytest.raises(ConfigError, match="models.vllm.device: cpu"):
        _check_launch(paper, 1, None)


# ----------------------------------------------------------------------------- the miniature


def _flat(mapping: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


#: What the CPU miniature may override of paper.yaml: names and sizes, the engine, and what 2 cores and
#: SmolLM2's 8,192 positions cannot hold (each says why in paper_mini.yaml). Growing this list takes a
#: reason there and here; everything else CI runs is paper.yaml's own setting.
PAPER_MINI_OVERRIDES = {
    "profile", "scope.shows", "scope.cannot_show",  # its name and what it can show
    "data.root",  # paper's layout, under data/paper_mini/
    # the size of the synthetic world exported as its corpus and questions
    "world.n_people", "world.n_works", "world.n_orgs", "world.n_cities", "world.n_countries",
    "world.n_train_questions", "world.n_dev_per_family", "world.n_test_per_family",
    "world.min_passage_words", "world.max_passage_words",
    "retrieval.encoder.model", "retrieval.encoder.batch_size",  # the bundled MiniLM
    "models.agent", "models.ranker",  # the bundled SmolLM2
    "models.backend", "models.vllm.device", "models.vllm.dtype", "models.vllm.kv_cache_gib",  # vLLM on CPU
    "rollout.max_context_tokens",  # SmolLM2's positions
    "search.topn",  # N = 10: a ranker call at N = 50 takes 15 s on 2 cores (the N = 50 budget: the engine test above)
    # a 135M model does not follow the protocol zero-shot: a small agent warm start (paper: none)
    "warmstart.enabled", "warmstart.n_agent", "warmstart.n_ranker", "warmstart.learning_rate",
    "warmstart.warmup_ratio", "warmstart.batch_size",
    "training.steps", "training.questions_per_step", "training.minibatches",  # sizes
    "training.val_per_dataset", "evaluation.n_per_dataset",  # sizes
    "relevance.steps", "relevance.prompts_per_step", "relevance.val_per_dataset",  # sizes
}


def test_the_miniature_overrides_only_what_the_cpu_cannot_hold() -> None:
    """A test lists the keys paper_mini overrides; it fails when the list grows, so a change to
    paper.yaml reaches CI unless it is one of these."""
    from cosearch_lib.config.profile import profile_path, read_yaml_mapping

    mini = read_yaml_mapping(profile_path("paper_mini"), "a profile")
    assert mini.pop("extends") == "paper"
    paper = _flat(read_yaml_mapping(profile_path("paper"), "a profile"))
    overridden = {k for k, v in _flat(mini).items() if paper.get(k, object()) != v}
    assert overridden <= PAPER_MINI_OVERRIDES, f"paper_mini overrides more of paper.yaml: {sorted(overridden - PAPER_MINI_OVERRIDES)}"
    cfg, base = load_profile("paper_mini"), load_profile("paper")
    # what the issue keeps: the paper's search budget, rules, G, warm start off, evaluation, slurm
    assert (base.search.topn, cfg.search.topk, cfg.search.max_searches) == (50, 5, 6) and cfg.search.topn == 10
    assert cfg.training.group_size == base.training.group_size == 8 and cfg.rules == base.rules
    assert cfg.rollout.temperature == 1.0 and base.warmstart.enabled is False
    assert cfg.slurm == base.slurm and replace(cfg.protocol, search=base.protocol.search) == base.protocol
    assert cfg.data.corpus_path == base.data.corpus_path and cfg.data.qa_paths == base.data.qa_paths


def test_every_process_of_a_job_searches_through_the_one_server_when_it_is_named(tmp_path: Path, monkeypatch) -> None:
    """Break 4: each notebook kernel and each rank without --retriever-url loaded the index itself
    (8 ranks: 8 copies of ~64 GB). With the job's server named ($COSEARCH_RETRIEVER_URL or
    retrieval.server_url), search_backend reaches the index through it and builds nothing."""
    from cosearch_lib.config import ServerConfig
    from cosearch_lib.experiment import building
    from cosearch_lib.experiment.preflight import check_inputs
    from cosearch_lib.retrieval.http_client import HttpRetriever
    from cosearch_lib.retrieval.http_server import serve_in_background

    from tests.doubles import CORPUS, FixedRetriever

    def no_index(*a, **k):
        raise AssertionError("the index was loaded in this process")

    monkeypatch.setattr(building, "build_retriever", no_index)
    cfg = load_profile(_without_relevance(tmp_path))
    with serve_in_background(FixedRetriever(CORPUS), ServerConfig(port=0)) as url:
        monkeypatch.setenv("COSEARCH_RETRIEVER_URL", url)
        backend = building.search_backend(cfg)
        assert isinstance(backend, HttpRetriever) and backend.search(["q"], 2)[0][0].id == CORPUS[0].id
    _fill_data(tmp_path)  # no index file: a process searching through the server does not need one
    assert not any(line.startswith("index") for line in check_inputs(cfg, engine=False).checked)
    monkeypatch.setenv("COSEARCH_RETRIEVER_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(Exception, match="127.0.0.1:9"):
        building.search_backend(cfg)
    monkeypatch.delenv("COSEARCH_RETRIEVER_URL")
    with pytest.raises(ConfigError, match="retrieval.server_url: expected an http"):
        load_profile(_paper_mini_like(tmp_path, "retrieval:\n  server_url: localhost:8000\n"))


def test_rank_zero_builds_the_starts_in_a_process_outside_the_job(monkeypatch) -> None:
    """Under torchrun, TRL's warm-start trainer saw the job's variables in rank 0, wrapped the model in
    DDP and waited for ranks that were waiting at the job's barrier (paper_mini hung there). The
    starts are now built by a child process that sees none of the launcher's variables."""
    from cosearch_lib.runs import launched_training

    seen = {}

    def fake_run(cmd, env, stdout):
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(launched_training.subprocess, "run", fake_run)
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x", "SLURM_STEP_NUM_TASKS": "2",
                       "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    launched_training.build_starts_apart("paper_mini", 3, ["cosearch", "search_r1"], "http://127.0.0.1:8000", False)
    assert seen["cmd"][1:] == ["-m", "cosearch_lib.cli", "build-starts", "--profile", "paper_mini", "--seed", "3",
                               "--methods", "cosearch,search_r1", "--retriever-url", "http://127.0.0.1:8000", "--quiet"]
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} & set(seen["env"])
    assert seen["env"]["SLURM_STEP_NUM_TASKS"] == "1" and "OMP_NUM_THREADS" not in seen["env"]  # torchrun's 1 thread
    from cosearch_lib.rl.data_parallel import LaunchEnvironment

    assert LaunchEnvironment.detect(seen["env"]).launcher == "single"
    monkeypatch.setattr(launched_training.subprocess, "run", lambda cmd, env, stdout: subprocess.CompletedProcess(cmd, 3))
    with pytest.raises(RuntimeError, match="exit 3"):
        launched_training.build_starts_apart("paper_mini", 0, ["cosearch"], None, False)


def test_the_flat_index_goes_onto_the_gpus_replicated_or_sharded_by_its_size(monkeypatch, tmp_path: Path) -> None:
    """retrieval.index_device: gpu reaches faiss's GPU path (a fake GPU faiss here: no GPU is lent):
    a copy per GPU when the vectors fit one, sharded over them when not (wiki-18's ~62 GB e5 index on
    8 GPUs), refused with the numbers when they do not fit all of them together."""
    import faiss
    import numpy as np

    from cosearch_lib.retrieval import faiss_index

    cloned = []

    class Options:
        shard = False

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 8, raising=False)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", Options, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus",
                        lambda index, co=None: cloned.append(co.shard) or ("on gpus", index), raising=False)
    index = faiss.IndexFlatIP(768)
    index.add(np.zeros((1000, 768), dtype="float32"))
    gib = 2 ** 30
    assert faiss_index.to_gpu(index, free_bytes=[80 * gib] * 8)[0] == "on gpus" and cloned == [False]
    wiki18 = type("Flat", (), {"ntotal": 21_015_324, "d": 768})()  # the e5 index's shape: 64.6 GB of float32
    faiss_index.to_gpu(wiki18, free_bytes=[40 * gib] * 8)
    assert cloned[-1] is True
    with pytest.raises(RuntimeError, match=r"needs 60.1 GiB but the 8 GPU\(s\) have 16.0 GiB free"):
        faiss_index.to_gpu(wiki18, free_bytes=[2 * gib] * 8)
    with pytest.raises(ConfigError, match="FAISS has no GPU HNSW"):
        load_profile(_profile(tmp_path, "extends: paper\nretrieval:\n  index_device: gpu\n  index_kind: hnsw\n"))


def test_split_index_parts_join_back_to_the_file(tmp_path: Path) -> None:
    """export-world splits the index as the hub stores wiki-18's (part_aa, part_ab); merge_parts joins them."""
    from cosearch_lib.data.downloads import merge_parts
    from cosearch_lib.experiment.paper_export import split_file

    src = tmp_path / "e5_Flat.index"
    src.write_bytes(bytes(range(256)) * 4097 + b"tail")
    parts = split_file(src, [tmp_path / "part_aa", tmp_path / "part_ab"], chunk_size=1000)
    assert [p.stat().st_size for p in parts] == [524418, 524418]
    assert merge_parts(parts, tmp_path / "joined", progress=False).read_bytes() == src.read_bytes()


def test_a_role_without_gold_sequences_starts_from_the_model_as_shipped() -> None:
    """A warm start of the agent only (warmstart.n_ranker: 0, as paper_mini had it: the paper's ranker
    starts from the instruct model). The Fixed Ranker's relevance training asked the warm start for
    the ranker by name and stopped the job with "no gold examples to train on"; the role is now left
    out, so the relevance training starts from a fresh adapter (no retriever needed: nothing to train)."""
    from cosearch_lib.experiment.cached_starts import warm_start

    cfg = load_profile("paper_mini")
    cfg = replace(cfg, warmstart=replace(cfg.warmstart, n_ranker=0))
    assert cfg.warmstart.enabled
    assert warm_start(cfg, None, roles=("ranker",)) == {}


def test_the_cluster_steps_of_the_readme_are_the_commands_the_miniature_runs() -> None:
    """README and docs/USAGE.md give the cluster path as numbered steps; each cosearch command in them
    is one tests/test_paper_mini.py runs (the same subcommand, the same --methods), with the profile,
    ranks and host changed."""
    import re

    runner = (project_root() / "tests" / "test_paper_mini.py").read_text()
    for doc in ("README.md", "docs/USAGE.md"):
        text = (project_root() / doc).read_text()
        steps = re.findall(r"^\s*\d\. \*{0,2}[^\n]*(?:\n {3}[^\n]*)*", text, flags=re.M)
        commands = [c for step in steps for c in re.findall(r"`([^`]*cosearch[^`]*)`", step)
                    if re.search(r"\bcosearch\)? (download|prepare-relevance|check|serve-retriever|train|evaluate|run)\b", c)]
        found = {re.search(r"\bcosearch\)? (\S+)", c).group(1) for c in commands}
        assert {"download", "prepare-relevance", "check", "serve-retriever", "train", "evaluate", "run"} <= found, (doc, found)
        for command in commands:
            sub = re.search(r"\bcosearch\)? (\S+)", command).group(1)
            assert f'"{sub}"' in runner, (doc, command)
            methods = re.search(r"--methods (\S+)", command)
            if methods:
                assert f'"--methods", "{methods.group(1)}"' in runner, (doc, command)
            assert "-p methods" not in command, (doc, command)  # it would reach notebook 02's own methods
            notebooks = re.search(r"--notebooks((?: \d\d)+)", command)
            if notebooks:  # the same notebooks, in the same order
                listed = ", ".join(f'"{n}"' for n in notebooks.group(1).split())
                assert f'"{sub}", "--profile", PROFILE, "--notebooks", {listed}' in runner, (doc, command)
