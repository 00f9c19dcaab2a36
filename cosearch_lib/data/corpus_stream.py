"""Streaming wiki-18-format corpora (``{"id", "contents"}`` jsonl, optionally gzipped), one row at a
time: a 21M-passage corpus is never held in memory here (random access: ``retrieval.corpus_store``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from cosearch_lib.data.passage import make_contents
from cosearch_lib.data.qa_formats import DataFormatError, parse_json_object, short_repr
from cosearch_lib.progress import tqdm

if TYPE_CHECKING:
    pass



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
    obj = parse_json_object(line, where)
    pid = obj.get("id")
    if isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == "":
        raise DataFormatError(f"{where}: field 'id' must be a non-empty string or integer, got {short_repr(pid)}")
    contents = obj.get("contents")
    if contents is None and "text" in obj:
        # imported here: retrieval/ may import this module, and a top-level import would cycle

        title, text = obj.get("title", ""), obj["text"]
        for name, value in (("title", title), ("text", text)):
            if not isinstance(value, str):
                raise DataFormatError(f"{where}: field {name!r} must be a string, got {short_repr(value)}")
        contents = make_contents(title, text)
    if not isinstance(contents, str):
        raise DataFormatError(
            f"{where}: field 'contents' must be a string (or give 'title' and 'text'), got {short_repr(contents)}"
        )
    return str(pid), contents
