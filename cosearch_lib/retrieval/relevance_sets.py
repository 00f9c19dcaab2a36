"""The Fixed Ranker's relevance data: training queries with the retriever's top-N and their labels.

The paper's Fixed Ranker is RL-trained on relevance data (appendix): NQ (and MS MARCO) training
queries, the e5 retriever's top-50 candidates of each, a candidate relevant when it contains a gold
answer, and the queries with no relevant candidate dropped. :func:`prepare_relevance_set` builds
that set from any QA file and any :class:`~cosearch_lib.retrieval.retriever.SearchBackend` (the
in-process index or the job's retrieval server); ``cosearch prepare-relevance --profile P`` runs it
on the profile's training split and writes ``relevance.prepared_path``, which the relevance training
(``rl.relevance_training``) reads instead of searching again.

The file is self-contained (the ranker needs the passages' text, and a training job should not
have to load the corpus to get them): gzip'd JSON Lines, one kept query per line::

    {"id": "nq_train_17", "question": "...", "golden_answers": ["..."], "data_source": "nq",
     "candidates": [{"id": "123", "contents": "\\"Title\\"\\ntext", "score": 81.2}, ...],   # the top-N, retriever order
     "relevant": [0, 1, 0, ...]}                                                           # has_answer per candidate

and a sidecar ``<file>.json`` with the counts (queries read, kept, dropped) and the settings that
made it (N, the sources, the sample size and seed). The file is written whole or not at all.
"""

from __future__ import annotations

import gzip
import io
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosearch_lib.atomic_io import atomic_path, write_json
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import DataFormatError, QAExample
from cosearch_lib.metrics import has_answer
from cosearch_lib.progress import tqdm
from cosearch_lib.run_schema import file_sha256

#: The keys every line of a prepared relevance file carries.
RELEVANCE_SET_KEYS = ("id", "question", "golden_answers", "data_source", "candidates", "relevant")


@dataclass(frozen=True)
class RelevanceQuery:
    """One query of the relevance set: its top-N candidates in retriever order and their labels."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    data_source: str
    candidates: tuple[Passage, ...]
    relevant: tuple[int, ...]  # 1 where the candidate contains a gold answer

    def to_row(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "golden_answers": list(self.golden_answers),
                "data_source": self.data_source,
                "candidates": [{"id": p.id, "contents": p.contents, "score": round(float(p.score), 4)}
                               for p in self.candidates],
                "relevant": list(self.relevant)}


def select_queries(examples: Sequence[QAExample], *, sources: Sequence[str] = (), n: int = 0,
                   seed: int = 0) -> list[QAExample]:
    """The examples whose ``data_source`` is one of ``sources`` (all when empty), then a seeded sample
    of ``n`` of them in file order (all when ``n`` is 0 or at least their count)."""
    wanted = {s.lower() for s in sources}
    pool = [ex for ex in examples if not wanted or ex.data_source.lower() in wanted]
    if n and n < len(pool):
        keep = sorted(random.Random(f"relevance-set-{seed}").sample(range(len(pool)), n))
        pool = [pool[i] for i in keep]
    return pool


def label_candidates(example: QAExample, candidates: Sequence[Passage]) -> RelevanceQuery:
    """``example`` with ``candidates`` labelled by answer containment (:func:`~cosearch_lib.metrics.has_answer`)."""
    answers = list(example.golden_answers)
    return RelevanceQuery(example.id, example.question, tuple(answers), example.data_source, tuple(candidates),
                          tuple(int(has_answer(p.contents, answers)) for p in candidates))


def prepare_relevance_set(examples: Sequence[QAExample], retriever: Any, topn: int, out_path: str | Path, *,
                          settings: dict[str, Any] | None = None, batch_size: int = 256,
                          progress: bool = True) -> dict[str, Any]:
    """Search each example's question (``batch_size`` per request), label its top-``topn``, keep those with
    a relevant candidate, and write them to ``out_path`` (gzip'd JSON Lines) with the sidecar of counts;
    returns the sidecar. ``settings`` (what selected the examples) goes into the sidecar as it is."""
    if topn < 1:
        raise ValueError(f"prepare_relevance_set: topn must be at least 1, got {topn}")
    if not examples:
        raise ValueError("prepare_relevance_set: no training queries to prepare (check relevance.query_sources "
                         "against the split's data_source values)")
    out_path = Path(out_path)
    kept = dropped = 0
    by_source: dict[str, list[int]] = {}
    bar = tqdm(total=len(examples), desc="relevance set", unit="query", disable=not progress)
    # no time stamp or file name in the gzip header: the same set gives the same bytes (its sha256 keys the Fixed Ranker)
    with atomic_path(out_path) as tmp, open(tmp, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as zipped, \
            io.TextIOWrapper(zipped, encoding="utf-8") as out:
        for start in range(0, len(examples), batch_size):
            chunk = list(examples[start:start + batch_size])
            found = retriever.search([ex.question for ex in chunk], topn)
            if len(found) != len(chunk):
                raise RuntimeError(f"the retriever answered {len(found)} of {len(chunk)} queries")
            for ex, cands in zip(chunk, found):
                item = label_candidates(ex, cands)
                counts = by_source.setdefault(ex.data_source, [0, 0])
                counts[0] += 1
                if any(item.relevant):
                    out.write(json.dumps(item.to_row(), ensure_ascii=False) + "\n")
                    kept += 1
                    counts[1] += 1
                else:
                    dropped += 1
            bar.update(len(chunk))
        if not kept:  # raised inside: the temp file goes, a set already there stays
            raise ValueError(f"prepare_relevance_set: none of the {len(examples)} queries has a relevant passage "
                             f"among its top-{topn} candidates; nothing written")
    bar.close()
    summary = {"queries": len(examples), "kept": kept, "dropped": dropped, "topn": topn,
               "per_source": {s: {"queries": q, "kept": k} for s, (q, k) in sorted(by_source.items())},
               "settings": settings or {}, "sha256": file_sha256(out_path)}
    write_json(summary, sidecar_path(out_path))
    return summary


def sidecar_path(path: str | Path) -> Path:
    """``<file>.json``: the counts and settings of a prepared relevance file."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def read_relevance_set(path: str | Path, *, topn: int | None = None) -> list[RelevanceQuery]:
    """The queries of a prepared relevance file. A missing file, a line that is not a JSON object, a
    missing key, labels that do not match the candidates, or (with ``topn``) fewer candidates than the
    profile's N raise :class:`~cosearch_lib.data.qa_formats.DataFormatError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no relevance set at {path}: prepare it with `cosearch prepare-relevance --profile P`")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(f"{where}: not a JSON line ({err.msg})") from None
            if not isinstance(row, dict):
                raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in RELEVANCE_SET_KEYS if k not in row]
            if missing:
                raise DataFormatError(f"{where}: missing {missing}; a relevance set line has {list(RELEVANCE_SET_KEYS)} "
                                      "(re-run `cosearch prepare-relevance`)")
            cands, labels = row["candidates"], row["relevant"]
            if len(cands) != len(labels):
                raise DataFormatError(f"{where}: {len(cands)} candidates but {len(labels)} relevance labels")
            if topn is not None and len(cands) < topn:
                raise DataFormatError(f"{where}: {len(cands)} candidates, fewer than the profile's N = {topn}; "
                                      "prepare the set again at this N")
            out.append(RelevanceQuery(str(row["id"]), str(row["question"]), tuple(map(str, row["golden_answers"])),
                                      str(row["data_source"]),
                                      tuple(Passage(str(c["id"]), str(c["contents"]), float(c.get("score", 0.0)))
                                            for c in cands[:topn]),
                                      tuple(int(v) for v in labels[:topn])))
    if not out:
        raise DataFormatError(f"{path}: no queries")
    return out
