"""QA and corpus loading for the paper-scale world, plus the cluster download helpers.

Three QA formats meet in one record, :class:`QAExample`:

* Search-R1 parquet (``id, question, golden_answers, data_source, prompt, ability, reward_model,
  extra_info``);
* CoSearch parquet (``hzeng/co-search-train`` / ``-eval``): the question lives in
  ``extra_info.question`` and the golds in ``reward_model.ground_truth.target``, either as nested
  structs or as flattened dotted column names;
* FlashRAG jsonl (``<dataset>/<split>.jsonl``, rows ``{id, question, golden_answers, metadata}``).

Bad data fails loudly and early: every error names the file, the row (parquet rows are 0-based,
as ``DataFrame.iloc``; jsonl lines are 1-based, as an editor shows them) and the column, because a
silent fallback here would only surface hours later as a wrong reward.

The wiki-18 corpus (21M rows) is only ever *streamed* (:func:`iter_corpus`); nothing in this
module holds a whole corpus in memory. Random access lives in
:class:`cosearch_lib.retrieval.corpus.CorpusStore`.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from cosearch_lib.paths import data_dir
if TYPE_CHECKING:
    import pandas as pd

COSEARCH_REPOS = {"train": "hzeng/co-search-train", "eval": "hzeng/co-search-eval"}
WIKI18_CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
WIKI18_CORPUS_FILE = "wiki-18.jsonl.gz"
WIKI18_INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
WIKI18_INDEX_PARTS = ("part_aa", "part_ab")
WIKI18_INDEX_FILE = "e5_Flat.index"

QA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")
# Top-level fields that QAExample lifts out of a row; everything else goes to ``extra``.
_LIFTED = ("id", "question", "golden_answers", "data_source", "split")
_SPLIT_NAMES = ("train", "dev", "test", "validation", "val", "eval")


class DataFormatError(ValueError):
    """A data file does not have the shape its format promises (message names file, row, column)."""


class HubUnavailableError(RuntimeError):
    """A Hugging Face download failed (offline machine, missing file, no access)."""


@dataclass
class QAExample:
    """One question with its gold answers, whatever file format it came from."""

    id: str
    question: str
    golden_answers: list[str]
    data_source: str  # benchmark name: nq, hotpotqa, ... (the per-dataset tables group by it)
    split: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # every other original field, nested


# ----------------------------------------------------------------------------- QA loading


def load_qa(
    path: str | os.PathLike, *, data_source: str | None = None, limit: int | None = None
) -> list[QAExample]:
    """Load QA examples from a parquet / jsonl(.gz) / json file, or a folder of such files.

    ``data_source`` is used for rows that do not name their own (FlashRAG rows never do; their
    default is the parent folder's name, as FlashRAG lays files out as ``<dataset>/<split>.jsonl``).
    A folder (e.g. a Hugging Face snapshot with ``data/train-00000-of-00001.parquet``) is read in
    sorted file order.
    """
    path = Path(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    if not path.exists():
        raise FileNotFoundError(f"QA file not found: {path}")
    files = _qa_files_in(path) if path.is_dir() else [path]
    out: list[QAExample] = []
    for f in files:
        remaining = None if limit is None else limit - len(out)
        if remaining == 0:
            break
        out.extend(_load_qa_file(f, data_source=data_source, limit=remaining))
    return out


def qa_to_frame(examples: Sequence[QAExample]) -> pd.DataFrame:
    """One row per example, columns in :class:`QAExample` field order (for tables and plots)."""
    import pandas as pd

    columns = ["id", "question", "golden_answers", "data_source", "split", "extra"]
    return pd.DataFrame([asdict(e) for e in examples], columns=columns)


def _qa_files_in(folder: Path) -> list[Path]:
    # hidden entries skipped: huggingface_hub keeps its download metadata under .cache/
    files = sorted(
        p for p in folder.rglob("*")
        if p.is_file() and _qa_suffix(p) is not None
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise FileNotFoundError(f"no QA files ({', '.join(QA_SUFFIXES)}) under {folder}")
    return files


def _qa_suffix(path: Path) -> str | None:
    name = path.name.lower()
    # .jsonl.gz first: it also ends in .gz, never in .jsonl
    for suffix in (".jsonl.gz", ".parquet", ".jsonl", ".json"):
        if name.endswith(suffix):
            return suffix
    return None


def _load_qa_file(path: Path, *, data_source: str | None, limit: int | None) -> list[QAExample]:
    suffix = _qa_suffix(path)
    if suffix is None:
        raise ValueError(f"{path}: unsupported QA file type; expected one of {', '.join(QA_SUFFIXES)}")
    split = _split_from_name(path)
    if suffix == ".parquet":
        rows = _parquet_rows(path)
        where = "row"
        source = data_source
    else:
        rows = _json_rows(path) if suffix == ".json" else _jsonl_rows(path)
        where = "row" if suffix == ".json" else "line"
        source = data_source or path.parent.name or None
    out: list[QAExample] = []
    for number, row in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(
            example_from_row(row, f"{path} {where} {number}", data_source=source, split=split)
        )
    return out


def _split_from_name(path: Path) -> str | None:
    """``test.jsonl`` -> ``test``; ``train-00000-of-00001.parquet`` -> ``train``; else None."""
    stem = path.name.split(".")[0].lower()
    head = stem.split("-")[0].split("_")[0]
    for candidate in (stem, head):
        if candidate in _SPLIT_NAMES:
            return candidate
    return None


def _parquet_rows(path: Path, batch_size: int = 1024) -> Iterator[tuple[int, dict]]:
    """Rows of a parquet file as plain dicts, 0-based row numbers, streamed in batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataFormatError(f"{path}: not a readable parquet file ({e})") from e
    number = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        for row in batch.to_pylist():
            yield number, row
            number += 1


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """Non-blank lines of a jsonl(.gz) file as dicts, 1-based line numbers."""
    with _open_binary(path) as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                yield number, _parse_json_object(line, f"{path} line {number}")


def _json_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """A ``.json`` file holding one array of row objects, 0-based row numbers."""
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, list):
        raise DataFormatError(f"{path}: expected a JSON array of row objects, got {type(data).__name__}")
    for number, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataFormatError(f"{path} row {number}: expected a JSON object, got {_show(row)}")
        yield number, row


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _parse_json_object(line: bytes, where: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from e
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
    if not isinstance(obj, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {_show(obj)}")
    return obj


# ----------------------------------------------------------------------------- one row


def example_from_row(
    row: dict, where: str, *, data_source: str | None = None, split: str | None = None
) -> QAExample:
    """Normalise one row of any supported format; ``where`` prefixes every error ("f.parquet row 3").

    ``data_source`` and ``split`` are defaults for rows that do not state their own.
    """
    row = _unflatten(_to_python(row))
    source = _first_present(row, ("data_source",))
    if source is None:
        source = (None, data_source)
    source_col, source_val = source
    if not isinstance(source_val, str) or not source_val.strip():
        col = source_col or "data_source"
        raise DataFormatError(
            f"{where}: column {col!r} must be a non-empty string (or pass data_source=...), "
            f"got {_show(source_val)}"
        )
    question = _question(row, where)
    golds = _golden_answers(row, where)
    row_split = _dig(row, ("extra_info", "split")) or row.get("split") or split
    return QAExample(
        id=_example_id(row, where, source_val, row_split),
        question=question,
        golden_answers=golds,
        data_source=source_val,
        split=None if row_split is None else str(row_split),
        extra={k: v for k, v in row.items() if k not in _LIFTED},
    )


def _question(row: dict, where: str) -> str:
    found = _first_present(row, ("question",), ("extra_info", "question"))
    if found is None:
        raise DataFormatError(
            f"{where}: column 'question' is missing (also looked for 'extra_info.question'); "
            f"row has columns {sorted(row)}"
        )
    col, value = found
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(f"{where}: column {col!r} must be a non-empty string, got {_show(value)}")
    return value


def _golden_answers(row: dict, where: str) -> list[str]:
    found = _first_present(row, ("golden_answers",), ("reward_model", "ground_truth", "target"))
    if found is None:
        raise DataFormatError(
            f"{where}: column 'golden_answers' is missing (also looked for "
            f"'reward_model.ground_truth.target'); row has columns {sorted(row)}"
        )
    col, value = found
    golds = [value] if isinstance(value, str) else value
    ok = (
        isinstance(golds, list)
        and len(golds) > 0
        and all(isinstance(g, str) and g.strip() for g in golds)
    )
    if not ok:
        raise DataFormatError(
            f"{where}: column {col!r} must be a non-empty list of strings, got {_show(value)}"
        )
    return list(golds)


def _example_id(row: dict, where: str, source: str, split: str | None) -> str:
    """The row's own id; else ``<source>_<split>_<extra_info.index>`` (CoSearch rows have no id)."""
    value = row.get("id")
    if value is None:
        index = _dig(row, ("extra_info", "index"))
        if index is None:
            raise DataFormatError(
                f"{where}: column 'id' is missing and there is no 'extra_info.index' to derive one"
            )
        return "_".join(str(p) for p in (source, split, index) if p is not None)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise DataFormatError(
            f"{where}: column 'id' must be a non-empty string or integer, got {_show(value)}"
        )
    return str(value)


def _first_present(row: dict, *paths: tuple[str, ...]) -> tuple[str, Any] | None:
    """(dotted column name, value) of the first path whose value is not None."""
    for p in paths:
        value = _dig(row, p)
        if value is not None:
            return ".".join(p), value
    return None


def _dig(row: dict, path: tuple[str, ...]) -> Any:
    node: Any = row
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _to_python(value: Any) -> Any:
    """ndarrays (pandas/pyarrow give them for list columns) and numpy scalars -> plain Python."""
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [_to_python(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_to_python(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _unflatten(row: dict) -> dict:
    """``{"reward_model.ground_truth.target": x}`` -> ``{"reward_model": {"ground_truth": {"target": x}}}``.

    Some exports flatten nested structs into dotted column names; a nested value already present
    wins over a dotted duplicate.
    """
    out = {k: v for k, v in row.items() if "." not in k}
    for key, value in row.items():
        if "." not in key:
            continue
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        if node.get(leaf) is None:
            node[leaf] = value
    return out


def _show(value: Any, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# ----------------------------------------------------------------------------- corpus


def iter_corpus(
    path: str | os.PathLike, *, limit: int | None = None, progress: bool = False
) -> Iterator[tuple[str, str]]:
    """Stream ``(id, contents)`` from a wiki-18 style ``.jsonl`` / ``.jsonl.gz`` corpus.

    Rows are ``{"id", "contents"}`` (contents = quoted title line + text); dumps with ``title`` and
    ``text`` instead are accepted and joined with :func:`make_contents`, so downstream code sees
    one format. Integer ids become strings. Blank lines are skipped. Row order is preserved:
    row i pairs with vector i of the FAISS index.
    """
    for _, pid, contents in iter_corpus_lines(path, limit=limit, progress=progress):
        yield pid, contents


def iter_corpus_lines(
    path: str | os.PathLike, *, limit: int | None = None, progress: bool = False
) -> Iterator[tuple[int, str, str]]:
    """Like :func:`iter_corpus` but also yields the 1-based line number (for error messages).

    Progress counts bytes of the file on disk, so the bar has a true total even for a gzip file
    whose line count is unknown until the end.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    name = path.name.lower()
    if not (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
        raise ValueError(f"{path}: a corpus must be .jsonl or .jsonl.gz")
    from tqdm.auto import tqdm

    yielded = 0
    with open(path, "rb") as raw, tqdm(
        total=path.stat().st_size, unit="B", unit_scale=True, desc=f"reading {path.name}",
        disable=not progress,
    ) as bar:
        fh = gzip.GzipFile(fileobj=raw, mode="rb") if name.endswith(".gz") else raw
        for number, line in enumerate(fh, start=1):
            if limit is not None and yielded >= limit:
                break
            if number % 4096 == 0:
                bar.update(raw.tell() - bar.n)
            if not line.strip():
                continue
            pid, contents = _corpus_record(line, f"{path} line {number}")
            yielded += 1
            yield number, pid, contents
        bar.update(raw.tell() - bar.n)


def _corpus_record(line: bytes, where: str) -> tuple[str, str]:
    obj = _parse_json_object(line, where)
    pid = obj.get("id")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == "":
        raise DataFormatError(f"{where}: field 'id' must be a non-empty string or integer, got {_show(pid)}")
    contents = obj.get("contents")
    if contents is None and "text" in obj:
        # imported here: retrieval/ may import this module, and a top-level import would cycle
        from cosearch_lib.retrieval.base import make_contents

        title, text = obj.get("title", ""), obj["text"]
        for name, value in (("title", title), ("text", text)):
            if not isinstance(value, str):
                raise DataFormatError(f"{where}: field {name!r} must be a string, got {_show(value)}")
        contents = make_contents(title, text)
    if not isinstance(contents, str):
        raise DataFormatError(
            f"{where}: field 'contents' must be a string (or give 'title' and 'text'), got {_show(contents)}"
        )
    return str(pid), contents


# ----------------------------------------------------------------------------- downloads


def download_cosearch_data(
    dest: str | os.PathLike | None = None, which: Iterable[str] = ("train", "eval")
) -> dict[str, list[Path]]:
    """Fetch ``hzeng/co-search-{train,eval}`` into ``dest/<which>``; returns their parquet files.

    Default ``dest`` is ``data_dir()/"cosearch"``. Only needed on a machine with internet access
    (the cluster); development machines use the embedded world.
    """
    dest = Path(dest) if dest is not None else data_dir() / "cosearch"
    out: dict[str, list[Path]] = {}
    for name in which:
        if name not in COSEARCH_REPOS:
            raise ValueError(f"which must name some of {sorted(COSEARCH_REPOS)}, got {name!r}")
        repo = COSEARCH_REPOS[name]
        hub = _hub()
        local = _hub_call(
            repo, "all parquet files",
            lambda: hub.snapshot_download(
                repo_id=repo, repo_type="dataset", local_dir=str(dest / name),
                allow_patterns=["*.parquet", "*.md"],
            ),
        )
        files = sorted(Path(local).rglob("*.parquet"))
        if not files:
            raise HubUnavailableError(f"{repo} downloaded to {local} but holds no .parquet files")
        out[name] = files
    return out


def download_wiki18_corpus(dest: str | os.PathLike | None = None) -> Path:
    """Fetch Search-R1's wiki-18 corpus (``wiki-18.jsonl.gz``, ~21M passages) into ``dest``."""
    dest = Path(dest) if dest is not None else data_dir() / "wiki18"
    return _hub_file(WIKI18_CORPUS_REPO, WIKI18_CORPUS_FILE, dest)


def download_wiki18_e5_index(
    dest: str | os.PathLike | None = None, *, keep_parts: bool = False
) -> Path:
    """Fetch the e5-base-v2 flat index parts and join them into ``dest/e5_Flat.index``.

    The hub stores the index split in two (``part_aa``, ``part_ab``: ``split`` output, joined by
    plain concatenation). The parts are deleted after a verified merge unless ``keep_parts``,
    because keeping both copies doubles a ~65 GB footprint. An existing
    merged file is reused as is: the merge is atomic, so a file under that name is complete
    (delete it to fetch again).
    """
    dest = Path(dest) if dest is not None else data_dir() / "wiki18"
    target = dest / WIKI18_INDEX_FILE
    if target.is_file():
        return target
    parts = [_hub_file(WIKI18_INDEX_REPO, name, dest) for name in WIKI18_INDEX_PARTS]
    merged = merge_parts(parts, target)
    if not keep_parts:
        for p in parts:
            p.unlink(missing_ok=True)
    return merged


def merge_parts(
    parts: Sequence[str | os.PathLike],
    dest: str | os.PathLike,
    *,
    chunk_size: int = 64 << 20,
    progress: bool = True,
) -> Path:
    """Concatenate ``parts`` in order into ``dest``; all or nothing.

    Streams in ``chunk_size`` chunks (the parts are tens of GB) into a temp file beside ``dest``,
    checks the total size, then renames it into place, so an interrupted merge never leaves a
    truncated index that FAISS would later fail to read (or worse, read).
    """
    from tqdm.auto import tqdm

    parts = [Path(p) for p in parts]
    dest = Path(dest)
    if not parts:
        raise ValueError("merge_parts needs at least one part")
    for p in parts:
        if not p.is_file():
            raise FileNotFoundError(f"part file not found: {p}")
    expected = sum(p.stat().st_size for p in parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, tqdm(
            total=expected, unit="B", unit_scale=True, desc=f"merging {dest.name}", disable=not progress
        ) as bar:
            for p in parts:
                _copy_into(p, out, chunk_size, bar)
            out.flush()
            os.fsync(out.fileno())
        written = tmp.stat().st_size
        if written != expected:
            raise OSError(f"merged {dest.name} has {written} bytes, expected {expected} (sum of parts)")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _copy_into(src: Path, out: IO[bytes], chunk_size: int, bar: Any) -> None:
    with open(src, "rb") as fh:
        while chunk := fh.read(chunk_size):
            out.write(chunk)
            bar.update(len(chunk))


def _hub():
    """huggingface_hub, imported only when a download is asked for."""
    try:
        import huggingface_hub
    except ImportError as e:  # pragma: no cover - it is a core dependency
        raise ImportError("downloads need huggingface_hub: pip install huggingface_hub") from e
    return huggingface_hub


def _hub_file(repo: str, filename: str, dest: Path) -> Path:
    hub = _hub()
    dest.mkdir(parents=True, exist_ok=True)
    local = _hub_call(
        repo, filename,
        lambda: hub.hf_hub_download(
            repo_id=repo, filename=filename, repo_type="dataset", local_dir=str(dest)
        ),
    )
    return Path(local)


def _hub_call(repo: str, what: str, call) -> str:
    """Run one hub call; any failure becomes an error that says what to fetch and how."""
    try:
        return call()
    except Exception as e:  # offline, 404, gated, proxy: the advice is the same
        raise HubUnavailableError(
            f"could not download {what} from the Hugging Face dataset {repo!r} "
            f"({type(e).__name__}: {e}). This needs internet access to huggingface.co: run on a "
            f"machine that has it (e.g. a cluster login node) with "
            f"`huggingface-cli download {repo} --repo-type dataset --local-dir <dir>`, "
            f"or set HF_ENDPOINT to a reachable mirror, then point the profile at the files."
        ) from e
