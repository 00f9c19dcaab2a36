"""QA loaders, corpus streaming, download helpers (hub monkeypatched; the real client against a hub stand-in: test_paper_path.py) and merge_parts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cosearch_lib.data import downloads as data
from cosearch_lib.data.corpus_stream import iter_corpus
from cosearch_lib.data.downloads import HubUnavailableError, merge_parts
from cosearch_lib.data.passage import split_contents
from cosearch_lib.data.qa_formats import (
    DataFormatError,
    QAExample,
    example_from_row,
    load_qa,
    qa_to_frame,
    question_sources,
)

from tests.fixture_files import (
    TRICKY_PASSAGES,
    corpus_rows,
    cosearch_rows,
    flashrag_rows,
    search_r1_rows,
    write_corpus,
    write_cosearch_parquet,
    write_jsonl,
    write_search_r1_parquet,
)

# ----------------------------------------------------------------------------- Search-R1 parquet


def test_search_r1_parquet_round_trip(tmp_path: Path) -> None:
    path = write_search_r1_parquet(tmp_path / "train.parquet")
    examples = load_qa(path)
    src = search_r1_rows()
    assert [e.id for e in examples] == [r["id"] for r in src]
    assert [e.question for e in examples] == [r["question"] for r in src]
    assert examples[2].golden_answers == ["Founder 2", "F. 2"]
    assert all(isinstance(e.golden_answers, list) for e in examples)
    assert {e.data_source for e in examples} == {"nq"}
    assert examples[0].split == "train"
    # everything else is kept, nested, as plain Python (no ndarrays)
    extra = examples[1].extra
    assert set(extra) == {"prompt", "ability", "reward_model", "extra_info"}
    assert extra["reward_model"]["ground_truth"]["target"] == ["Founder 1", "F. 1"]
    assert extra["prompt"][0]["role"] == "user"
    assert extra["extra_info"]["index"] == 1


def test_limit_stops_early(tmp_path: Path) -> None:
    path = write_search_r1_parquet(tmp_path / "train.parquet", search_r1_rows(n=10))
    assert [e.id for e in load_qa(path, limit=3)] == ["train_0", "train_1", "train_2"]
    assert load_qa(path, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_qa(path, limit=-1)


def test_missing_golden_answers_names_file_row_and_column(tmp_path: Path) -> None:
    rows = search_r1_rows(n=20)
    rows[17]["golden_answers"] = None
    rows[17]["reward_model"] = None
    path = write_search_r1_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataFormatError) as err:
        load_qa(path)
    msg = str(err.value)
    assert "train.parquet row 17" in msg
    assert "'golden_answers'" in msg


def test_bad_golden_answers_type(tmp_path: Path) -> None:
    rows = search_r1_rows(n=3)
    for r in rows:
        r["golden_answers"] = []
    path = write_search_r1_parquet(tmp_path / "test.parquet", rows)
    with pytest.raises(DataFormatError, match=r"test\.parquet row 0: column 'golden_answers' must be a non-empty list of strings, got \[\]"):
        load_qa(path)


def test_empty_question_is_an_error(tmp_path: Path) -> None:
    rows = search_r1_rows(n=3)
    rows[1]["question"] = "   "
    path = write_search_r1_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataFormatError, match=r"row 1: column 'question' must be a non-empty string"):
        load_qa(path)


def test_missing_question_column(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "question"} for r in search_r1_rows(n=2)]
    path = write_search_r1_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataFormatError, match=r"train\.parquet row 0: column 'question' is missing"):
        load_qa(path)


def test_missing_data_source_uses_argument_else_errors(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "data_source"} for r in search_r1_rows(n=2)]
    path = write_search_r1_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataFormatError, match="'data_source'"):
        load_qa(path)
    assert {e.data_source for e in load_qa(path, data_source="triviaqa")} == {"triviaqa"}


def test_corrupt_parquet_names_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not a parquet file at all")
    with pytest.raises(DataFormatError, match="broken.parquet"):
        load_qa(path)


# ----------------------------------------------------------------------------- CoSearch parquet


@pytest.mark.parametrize("flattened", [False, True])
def test_cosearch_parquet_nested_and_dotted(tmp_path: Path, flattened: bool) -> None:
    path = write_cosearch_parquet(tmp_path / "test-00000-of-00001.parquet", flattened=flattened)
    examples = load_qa(path)
    assert [e.question for e in examples] == [r["extra_info"]["question"] for r in cosearch_rows()]
    assert [e.golden_answers for e in examples] == [["River 0"], ["River 1"], ["River 2"]]
    assert [e.data_source for e in examples] == ["nq", "hotpotqa", "nq"]
    assert [e.id for e in examples] == ["nq_test_0", "hotpotqa_test_1", "nq_test_2"]
    assert examples[0].split == "test"
    # the id -> data set join key of per-question records: every row's own data_source
    assert question_sources(path) == {"nq_test_0": "nq", "hotpotqa_test_1": "hotpotqa", "nq_test_2": "nq"}
    # the nested original survives in extra, also when the file had dotted columns
    assert examples[1].extra["reward_model"]["ground_truth"]["target"] == ["River 1"]
    assert examples[1].extra["extra_info"]["question"] == examples[1].question


def test_cosearch_single_string_target(tmp_path: Path) -> None:
    path = write_cosearch_parquet(tmp_path / "train.parquet", cosearch_rows(target="str"))
    assert [e.golden_answers for e in load_qa(path)] == [["River 0"], ["River 1"], ["River 2"]]


def test_cosearch_rows_via_pandas_ndarray_targets(tmp_path: Path) -> None:
    """pandas.read_parquet gives list columns as ndarrays; example_from_row must accept them."""
    path = write_cosearch_parquet(tmp_path / "train.parquet", flattened=True)
    frame = pd.read_parquet(path)
    value = frame.iloc[0]["reward_model.ground_truth.target"]
    assert isinstance(value, np.ndarray)
    ex = example_from_row(frame.iloc[0].to_dict(), "frame row 0")
    assert ex.golden_answers == ["River 0"]
    assert ex.extra["reward_model"]["ground_truth"]["target"] == ["River 0"]


def test_cosearch_missing_target_names_dotted_column(tmp_path: Path) -> None:
    rows = cosearch_rows()
    rows[2]["reward_model"]["ground_truth"]["target"] = [""]
    path = write_cosearch_parquet(tmp_path / "train.parquet", rows, flattened=True)
    with pytest.raises(DataFormatError, match=r"train\.parquet row 2: column 'reward_model\.ground_truth\.target'"):
        load_qa(path)


# ----------------------------------------------------------------------------- FlashRAG jsonl


@pytest.mark.parametrize("name", ["test.jsonl", "test.jsonl.gz"])
def test_flashrag_jsonl(tmp_path: Path, name: str) -> None:
    path = write_jsonl(tmp_path / "hotpotqa" / name, flashrag_rows(), gz=name.endswith(".gz"))
    examples = load_qa(path)
    assert [e.id for e in examples] == ["test_0", "test_1", "test_2"]
    assert {e.data_source for e in examples} == {"hotpotqa"}  # from the parent folder
    assert {e.split for e in examples} == {"test"}
    assert examples[1].golden_answers == ["1901"]
    assert examples[1].extra["metadata"]["type"] == "comparison"
    assert {e.data_source for e in load_qa(path, data_source="hq")} == {"hq"}


def test_flashrag_bad_json_line_names_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "nq" / "dev.jsonl", flashrag_rows(n=5), raw_lines={4: '{"id": "x", "question": '})
    with pytest.raises(DataFormatError, match=r"dev\.jsonl line 4: not valid JSON"):
        load_qa(path)


def test_flashrag_non_object_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "nq" / "dev.jsonl", flashrag_rows(n=2), raw_lines={2: "[1, 2]"})
    with pytest.raises(DataFormatError, match=r"dev\.jsonl line 2: expected a JSON object"):
        load_qa(path)


def test_question_sources_of_a_folder_take_each_files_data_set_and_refuse_an_id_two_share(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "nq" / "test.jsonl", flashrag_rows(n=2))
    rows = [{**r, "id": f"hq_{r['id']}"} for r in flashrag_rows(n=2)]
    write_jsonl(tmp_path / "hotpotqa" / "test.jsonl", rows)
    assert question_sources(tmp_path) == {"hq_test_0": "hotpotqa", "hq_test_1": "hotpotqa",  # each from its folder
                                          "test_0": "nq", "test_1": "nq"}
    write_jsonl(tmp_path / "triviaqa" / "test.jsonl", flashrag_rows(n=1))  # FlashRAG's own ids: test_0 again
    with pytest.raises(DataFormatError, match=r"question id 'test_0' is in both 'nq' and 'triviaqa'"):
        question_sources(tmp_path)


def test_json_array_and_folder_and_suffix(tmp_path: Path) -> None:
    rows = flashrag_rows(n=2)
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "test.json").write_text(json.dumps(rows))
    write_jsonl(tmp_path / "nq" / "train.jsonl", flashrag_rows(n=2, split="train"))
    loaded = load_qa(tmp_path / "nq")  # sorted: test.json, train.jsonl
    assert [e.id for e in loaded] == ["test_0", "test_1", "train_0", "train_1"]
    assert [e.id for e in load_qa(tmp_path / "nq", limit=3)] == ["test_0", "test_1", "train_0"]
    (tmp_path / "q.csv").write_text("id,question\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_qa(tmp_path / "q.csv")
    with pytest.raises(FileNotFoundError):
        load_qa(tmp_path / "nope.parquet")


def test_qa_to_frame(tmp_path: Path) -> None:
    examples = load_qa(write_search_r1_parquet(tmp_path / "train.parquet"))
    frame = qa_to_frame(examples)
    assert list(frame.columns) == ["id", "question", "golden_answers", "data_source", "split", "extra"]
    assert len(frame) == len(examples)
    assert frame.loc[3, "golden_answers"] == ["Founder 3", "F. 3"]
    assert list(qa_to_frame([]).columns) == list(frame.columns)
    assert isinstance(examples[0], QAExample)


# ----------------------------------------------------------------------------- corpus streaming


@pytest.mark.parametrize("name", ["wiki.jsonl", "wiki.jsonl.gz"])
def test_iter_corpus_preserves_rows(tmp_path: Path, name: str) -> None:
    rows = corpus_rows()
    path = write_corpus(tmp_path / name, rows)
    got = list(iter_corpus(path))
    assert got == [(r["id"], r["contents"]) for r in rows]
    assert [split_contents(c) for _, c in got] == TRICKY_PASSAGES
    assert list(iter_corpus(path, limit=2)) == got[:2]


def test_iter_corpus_title_text_and_int_ids(tmp_path: Path) -> None:
    rows = corpus_rows(style="title_text")
    rows[0]["id"] = 0  # some dumps store integer ids
    path = write_corpus(tmp_path / "wiki.jsonl", rows)
    got = list(iter_corpus(path))
    assert got[0][0] == "0"
    assert [split_contents(c) for _, c in got] == TRICKY_PASSAGES


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"id": "3", "contents": 5}', "'contents'"),
        ('{"id": null, "contents": "x"}', "'id'"),
        ('{"id": true, "contents": "x"}', "'id'"),
        ('{"id": "3", "title": 1, "text": "x"}', "'title'"),
        ('{"id": "3"}', "'contents'"),
    ],
)
def test_iter_corpus_bad_field_names_file_line_field(tmp_path: Path, line: str, field: str) -> None:
    path = write_corpus(tmp_path / "wiki.jsonl.gz", corpus_rows(), raw_lines={4: line})
    with pytest.raises(DataFormatError) as err:
        list(iter_corpus(path))
    assert "wiki.jsonl.gz line 4" in str(err.value)
    assert field in str(err.value)


def test_iter_corpus_bad_json_and_skips_blank_lines(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "wiki.jsonl", corpus_rows(), raw_lines={2: "{oops"})
    with pytest.raises(DataFormatError, match=r"wiki\.jsonl line 2: not valid JSON"):
        list(iter_corpus(path))
    blank = write_corpus(tmp_path / "b.jsonl", corpus_rows(), raw_lines={3: "   "})
    assert [pid for pid, _ in iter_corpus(blank)] == ["0", "1", "3", "4", "5"]
    (tmp_path / "x.parquet").write_text("")
    with pytest.raises(ValueError, match="jsonl"):
        list(iter_corpus(tmp_path / "x.parquet"))


def test_iter_corpus_is_lazy(tmp_path: Path) -> None:
    """A generator: the bad line 5 is not reached when only two rows are taken."""
    path = write_corpus(tmp_path / "wiki.jsonl", corpus_rows(), raw_lines={5: "{oops"})
    it = iter_corpus(path)
    assert next(it)[0] == "0" and next(it)[0] == "1"


# ----------------------------------------------------------------------------- downloads


def _offline(*args, **kwargs):
    raise ConnectionError("Failed to resolve 'huggingface.co'")


def test_download_corpus_uses_hub_and_returns_local_file(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    fixture = write_corpus(tmp_path / "src" / "wiki-18.jsonl.gz", corpus_rows())
    calls = []

    def fake_download(repo_id, filename, *, repo_type=None, local_dir=None, **kw):
        calls.append((repo_id, filename, repo_type))
        target = Path(local_dir) / filename
        target.write_bytes(fixture.read_bytes())
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    got = data.download_wiki18_corpus(tmp_path / "wiki18")
    assert calls == [("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "dataset")]
    assert got == tmp_path / "wiki18" / "wiki-18.jsonl.gz"
    assert [pid for pid, _ in iter_corpus(got)] == [r["id"] for r in corpus_rows()]


def test_download_offline_says_repo_file_and_how(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _offline)
    with pytest.raises(HubUnavailableError) as err:
        data.download_wiki18_corpus(tmp_path)
    msg = str(err.value)
    for needle in ("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "huggingface-cli download", "--repo-type dataset", "HF_ENDPOINT", "ConnectionError"):
        assert needle in msg
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _offline)
    with pytest.raises(HubUnavailableError, match="hzeng/co-search-eval"):
        data.download_cosearch_data(tmp_path, which=("eval",))


def test_download_cosearch_data(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    seen = []

    def fake_snapshot(repo_id, *, repo_type=None, local_dir=None, **kw):
        seen.append((repo_id, repo_type))
        write_cosearch_parquet(Path(local_dir) / "data" / "test-00000-of-00001.parquet")
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    files = data.download_cosearch_data(tmp_path, which=("train", "eval"))
    assert seen == [("hzeng/co-search-train", "dataset"), ("hzeng/co-search-eval", "dataset")]
    assert files["eval"] == [tmp_path / "co-search-eval" / "data" / "test-00000-of-00001.parquet"]
    assert len(load_qa(tmp_path / "co-search-train")) == 3
    with pytest.raises(ValueError, match="which"):
        data.download_cosearch_data(tmp_path, which=("dev",))


def test_download_e5_index_merges_parts(tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    payload = {"part_aa": b"FAISS-head" * 100, "part_ab": b"tail-bytes" * 37}

    def fake_download(repo_id, filename, *, repo_type=None, local_dir=None, **kw):
        assert repo_id == "PeterJinGo/wiki-18-e5-index" and repo_type == "dataset"
        target = Path(local_dir) / filename
        target.write_bytes(payload[filename])
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    index = data.download_wiki18_e5_index(tmp_path)
    assert index == tmp_path / "e5_Flat.index"
    assert index.read_bytes() == payload["part_aa"] + payload["part_ab"]
    assert not (tmp_path / "part_aa").exists()  # parts dropped after a verified merge
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _offline)
    assert data.download_wiki18_e5_index(tmp_path) == index  # reused, no download


# ----------------------------------------------------------------------------- merge_parts


def _parts(tmp_path: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    sizes = [1000, 1, 2500]
    paths = []
    for k, size in enumerate(sizes):
        p = tmp_path / f"part_a{chr(97 + k)}"
        p.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        paths.append(p)
    return paths


def test_merge_parts_concatenates_in_order(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    out = merge_parts(parts, tmp_path / "out" / "e5_Flat.index", chunk_size=64, progress=False)
    assert out.read_bytes() == b"".join(p.read_bytes() for p in parts)
    assert sorted(p.name for p in out.parent.iterdir()) == ["e5_Flat.index"]


def test_merge_parts_failure_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    parts = _parts(tmp_path)
    real_copy = data._copy_into
    calls = {"n": 0}

    def flaky(src, out, chunk_size, bar):
        calls["n"] += 1
        if calls["n"] == 2:
            out.write(b"half")
            raise OSError("disk full")
        real_copy(src, out, chunk_size, bar)

    monkeypatch.setattr(data, "_copy_into", flaky)
    dest = tmp_path / "merged" / "e5_Flat.index"
    with pytest.raises(OSError, match="disk full"):
        merge_parts(parts, dest, chunk_size=64, progress=False)
    assert list(dest.parent.iterdir()) == []  # no output, no .partial temp file


def test_merge_parts_size_check(tmp_path: Path, monkeypatch) -> None:
    parts = _parts(tmp_path)
    monkeypatch.setattr(data, "_copy_into", lambda src, out, chunk_size, bar: out.write(src.read_bytes()[:-1]))
    dest = tmp_path / "m" / "e5_Flat.index"
    with pytest.raises(OSError, match="expected 3501"):
        merge_parts(parts, dest, progress=False)
    assert list(dest.parent.iterdir()) == []


def test_merge_parts_missing_part(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="part_zz"):
        merge_parts([tmp_path / "part_zz"], tmp_path / "x.index", progress=False)


def test_gzip_fixture_really_is_gzip(tmp_path: Path) -> None:
    """Guards the fixtures themselves: a .gz corpus must not silently be plain text."""
    path = write_corpus(tmp_path / "w.jsonl.gz", corpus_rows())
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        assert json.loads(fh.readline())["id"] == "0"
