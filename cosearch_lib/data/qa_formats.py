"""QA files in the three formats the paper's ecosystem uses, read into one record, :class:`QAExample`.

* Search-R1 parquet (``id, question, golden_answers, data_source, prompt, ability, reward_model,
  extra_info``);
* CoSearch parquet (``hzeng/co-search-train`` / ``-eval``): the question lives in
  ``extra_info.question`` and the golds in ``reward_model.ground_truth.target``, either as nested
  structs or as flattened dotted column names;
* FlashRAG jsonl (``<dataset>/<split>.jsonl``, rows ``{id, question, golden_answers, metadata}``).

Bad data fails loudly and early: every error names the file, the row (parquet rows are 0-based,
as ``DataFrame.iloc``; jsonl lines are 1-based, as an editor shows them) and the column, because a
silent fallback here would only surface hours later as a wrong reward.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

QA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json")
# Top-level fields that QAExample lifts out of a row; everything else goes to ``extra``.
_LIFTED = ("id", "question", "golden_answers", "data_source", "split")
_SPLIT_NAMES = ("train", "dev", "test", "validation", "val", "eval")


class DataFormatError(ValueError):
    """A data file does not have the shape its format promises (message names file, row, column)."""


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


def gold_chain(ex: QAExample) -> list[dict] | None:
    """The question's gold reasoning chain [{sub_query, answer, passage_ids}] (``extra_info.gold_chain``
    of the embedded world's questions), or None (real benchmarks have none)."""
    chain = (ex.extra.get("extra_info") or {}).get("gold_chain") if isinstance(ex.extra, dict) else None
    if not chain:
        return None
    return [dict(h) for h in chain]


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
    files = qa_files(path)
    out: list[QAExample] = []
    for f in files:
        remaining = None if limit is None else limit - len(out)
        if remaining == 0:
            break
        out.extend(_load_qa_file(f, data_source=data_source, limit=remaining))
    return out


def question_sources(path: str | os.PathLike) -> dict[str, str]:
    """Each question's id -> its data set (``data_source``), for the questions of one split file or folder
    (:func:`load_qa`'s rules, its errors too); a join key for per-question records that carry only the id.
    DataFormatError for an id that two data sets share (FlashRAG numbers each one's rows ``test_0``,
    ``test_1``, ...): records keyed by it could not say which question they are."""
    sources: dict[str, str] = {}
    for ex in load_qa(path):
        if sources.setdefault(ex.id, ex.data_source) != ex.data_source:
            raise DataFormatError(f"{path}: question id {ex.id!r} is in both {sources[ex.id]!r} and {ex.data_source!r}; "
                                  "records keyed by question id need ids unique across data sets")
    return sources


def qa_to_frame(examples: Sequence[QAExample]) -> pd.DataFrame:
    """One row per example, columns in :class:`QAExample` field order (for tables and plots)."""

    columns = ["id", "question", "golden_answers", "data_source", "split", "extra"]
    return pd.DataFrame([asdict(e) for e in examples], columns=columns)


def qa_files(path: str | Path) -> list[Path]:
    """The files :func:`load_qa` reads for ``path``: the file itself, or a folder's QA files in order (hidden
    entries skipped); FileNotFoundError for a folder without any."""
    path = Path(path)
    return _qa_files_in(path) if path.is_dir() else [path]


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
                yield number, parse_json_object(line, f"{path} line {number}")


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
            raise DataFormatError(f"{path} row {number}: expected a JSON object, got {short_repr(row)}")
        yield number, row


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def parse_json_object(line: bytes, where: str) -> dict:
    """One JSON line as a dict; a ``DataFormatError`` naming ``where`` if it is not valid JSON or not an object."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        # a line cut short fails past its newline, where colno restarts at 1: report the line's end
        column = min(e.pos, len(e.doc.rstrip("\r\n"))) + 1
        raise DataFormatError(f"{where}: not valid JSON ({e.msg} at column {column})") from e
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
    if not isinstance(obj, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {short_repr(obj)}")
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
            f"got {short_repr(source_val)}"
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
        raise DataFormatError(f"{where}: column {col!r} must be a non-empty string, got {short_repr(value)}")
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
            f"{where}: column {col!r} must be a non-empty list of strings, got {short_repr(value)}"
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
            f"{where}: column 'id' must be a non-empty string or integer, got {short_repr(value)}"
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


def short_repr(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters, for error messages that show a bad value."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
