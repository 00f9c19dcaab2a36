"""Writers for small fixture files in the exact formats of the real artefacts.

Nothing binary is committed: each test writes what it needs into its ``tmp_path``. Shapes follow
the public files (docs/METHOD.md, data formats): Search-R1 parquet, the CoSearch parquet (nested or
dotted columns), FlashRAG jsonl, and the wiki-18 jsonl(.gz) corpus.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Titles and texts that break naive parsing: quotes, unicode, newlines, a lone backslash.
TRICKY_PASSAGES: list[tuple[str, str]] = [
    ('Anna "Annie" Oakley', "Sharpshooter.\nBorn 1860 in Ohio."),
    ("Zürich", "Größte Stadt der Schweiz — 421 878 Einwohner."),
    ("東京", "日本の首都。\n\n人口は約1400万人。"),
    ("Back\\slash", 'A "quoted" text with a tab\tand emoji 🎉.'),
    ("", "A passage without a title."),
    ("Plain", ""),
]


def search_r1_rows(n: int = 4, data_source: str = "nq", split: str = "train") -> list[dict]:
    """Rows shaped like Search-R1's ``train.parquet`` / ``test.parquet``."""
    rows = []
    for i in range(n):
        question = f"who founded fictional town {i}?"
        golds = [f"Founder {i}", f"F. {i}"]
        rows.append(
            {
                "id": f"{split}_{i}",
                "question": question,
                "golden_answers": golds,
                "data_source": data_source,
                "prompt": [{"role": "user", "content": f"Answer the question: {question}"}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def write_search_r1_parquet(path: Path, rows: list[dict] | None = None) -> Path:
    rows = search_r1_rows() if rows is None else rows
    return _write_parquet(path, rows)


def cosearch_rows(n: int = 3, *, target: str = "list", split: str = "test") -> list[dict]:
    """Rows shaped like ``hzeng/co-search-*``: no ``question``/``golden_answers`` columns.

    ``target`` is "list" (the usual) or "str" (a single gold stored as a string).
    """
    rows = []
    for i in range(n):
        question = f"which river runs through fictional city {i}?"
        gold: Any = [f"River {i}"] if target == "list" else f"River {i}"
        rows.append(
            {
                "data_source": "hotpotqa" if i % 2 else "nq",
                "prompt": [{"role": "user", "content": question}],
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": gold}},
                "extra_info": {"index": i, "split": split, "question": question},
            }
        )
    return rows


def flatten_row(row: dict, prefix: str = "") -> dict:
    """Nested dict -> dotted keys, as some parquet exports write structs."""
    flat: dict = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_row(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def write_cosearch_parquet(
    path: Path, rows: list[dict] | None = None, *, flattened: bool = False
) -> Path:
    rows = cosearch_rows() if rows is None else rows
    if flattened:
        rows = [flatten_row(r) for r in rows]
    return _write_parquet(path, rows)


def flashrag_rows(n: int = 3, split: str = "test") -> list[dict]:
    return [
        {
            "id": f"{split}_{i}",
            "question": f"when was fictional bridge {i} opened?",
            "golden_answers": [f"{1900 + i}"],
            "metadata": {"type": "comparison" if i % 2 else "bridge", "supporting_facts": [["X", 0]]},
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[Any], *, gz: bool = False, raw_lines: dict[int, str] | None = None) -> Path:
    """One JSON document per line; ``raw_lines`` {1-based line: text} replaces lines verbatim."""
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    for number, text in (raw_lines or {}).items():
        lines[number - 1] = text
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path


def corpus_rows(ids: list[str] | None = None, *, style: str = "contents", n: int | None = None) -> list[dict]:
    """wiki-18 rows: ``{"id", "contents"}`` (contents = quoted title line + text) or ``title``/``text``."""
    n = len(TRICKY_PASSAGES) if n is None else n
    ids = [str(i) for i in range(n)] if ids is None else ids
    rows = []
    for k, pid in enumerate(ids):
        title, text = TRICKY_PASSAGES[k % len(TRICKY_PASSAGES)]
        title = f"{title} #{k}" if k >= len(TRICKY_PASSAGES) else title
        if style == "contents":
            rows.append({"id": pid, "contents": f'"{title}"\n{text}'})
        else:
            rows.append({"id": pid, "title": title, "text": text})
    return rows


def write_corpus(path: Path, rows: list[dict], **kw: Any) -> Path:
    return write_jsonl(path, rows, gz=path.name.endswith(".gz"), **kw)


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --- test doubles for the rollout engine, the evaluation harness and the widgets ---------------
