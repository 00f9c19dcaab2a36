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


#: Public sample files (FlashRAG, MIT): tests/fixtures/flashrag/SOURCE.md names their origin.
FLASHRAG_DIR = Path(__file__).parent / "fixtures" / "flashrag"
FLASHRAG_CORPUS = FLASHRAG_DIR / "wiki18_sample.jsonl.gz"  # 300 wiki-18 rows
FLASHRAG_NQ_TEST = FLASHRAG_DIR / "nq" / "test.jsonl"  # 17 NQ test questions


def read_flashrag_rows(path: Path = FLASHRAG_NQ_TEST) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def search_r1_rows_from_flashrag(rows: list[dict], data_source: str, split: str) -> list[dict]:
    """FlashRAG QA rows -> the rows Search-R1's ``scripts/data_process/nq_search.py`` writes: the
    question stripped and ended with "?", one user message as ``prompt``, ``ability``,
    ``reward_model.ground_truth.target`` = the gold list, ``extra_info`` = {split, index}; the
    FlashRAG columns (id, question, golden_answers) stay, as its ``datasets.map`` keeps them."""
    out = []
    for index, row in enumerate(rows):
        question = row["question"].strip()
        question = question if question.endswith("?") else question + "?"
        out.append({**row, "question": question, "data_source": data_source,
                    "prompt": [{"role": "user", "content": f"Answer the question, searching when you need to. Question: {question}\n"}],
                    "ability": "fact-reasoning",
                    "reward_model": {"style": "rule", "ground_truth": {"target": list(row["golden_answers"])}},
                    "extra_info": {"split": split, "index": index}})
    return out


def cosearch_rows_from_search_r1(rows: list[dict]) -> list[dict]:
    """Search-R1 rows -> rows with only the columns the authors' CoSearch release reads: ``prompt``,
    ``data_source``, ``reward_model.ground_truth.target``, ``extra_info.question`` and
    ``extra_info.index`` (no top-level id, question or golden_answers)."""
    return [{"data_source": r["data_source"], "prompt": r["prompt"], "ability": r["ability"],
             "reward_model": r["reward_model"],
             "extra_info": {**r["extra_info"], "question": r["question"]}} for r in rows]


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
