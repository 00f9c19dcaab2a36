"""Writing, caching and summarising a world: wiki-18 corpus rows, Search-R1 parquet, a manifest."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from cosearch_lib.config import WorldConfig
from cosearch_lib.world.built_world import World
from cosearch_lib.world.families import FAMILIES, GENERATOR_VERSION, SPLITS, world_fingerprint
from cosearch_lib.world.generate import generate_world

_DATA_FILES = ("corpus.jsonl", "train.parquet", "dev.parquet", "test.parquet", "passage_meta.jsonl", "entities.jsonl")


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")


def _counts(world: World) -> dict:
    return {"passages": dict(sorted(Counter(m["kind"] for m in world.passage_meta).items())),
            "entities": dict(sorted(Counter(e.type for e in world.entities.values()).items())),
            "questions": {s: dict(sorted(Counter(r["data_source"] for r in rows).items()))
                          for s, rows in world.questions.items()}}


def world_paths(out_dir: str | Path) -> dict[str, Path]:
    """Where the files of a world written to out_dir are (keys: file stems, e.g. "corpus", "train")."""
    out = Path(out_dir)
    return {name.split(".")[0]: out / name for name in (*_DATA_FILES, "world.json")}


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl, {train,dev,test}.parquet, passage_meta.jsonl, entities.jsonl and world.json.

    Atomic per world: everything is written into a temp folder inside out_dir, the old manifest is
    removed first, files are renamed into place, and world.json (the fingerprint build_world
    trusts) is renamed last; a crash at any point leaves no manifest vouching for partial files.
    """

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".world-tmp-", dir=out))
    try:
        _write_jsonl(tmp / "corpus.jsonl", world.passages)
        for split in SPLITS:
            pd.DataFrame(world.questions[split]).to_parquet(tmp / f"{split}.parquet", engine="pyarrow", index=False)
        _write_jsonl(tmp / "passage_meta.jsonl", world.passage_meta)
        _write_jsonl(tmp / "entities.jsonl", [{"id": e.id, "type": e.type, "name": e.name, "split": e.split,
                                               "attrs": e.attrs, "info": e.info} for e in world.entities.values()])
        manifest = {"fingerprint": world_fingerprint(world.config), "generator_version": GENERATOR_VERSION,
                    "config": asdict(world.config), "counts": _counts(world),
                    "files": {n: (tmp / n).stat().st_size for n in _DATA_FILES}}
        (tmp / "world.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (out / "world.json").unlink(missing_ok=True)
        for name in _DATA_FILES:
            os.replace(tmp / name, out / name)
        os.replace(tmp / "world.json", out / "world.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return world_paths(out)


def read_manifest(out_dir: str | Path) -> dict | None:
    """The world.json of a written world, or None when absent or unreadable."""
    try:
        return json.loads((Path(out_dir) / "world.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def build_world(cfg: WorldConfig, out_dir: str | Path, force: bool = False) -> dict[str, Path]:
    """Reuse the world in out_dir when its manifest matches cfg and its files are intact, else
    generate and write it. Returns the file paths (see world_paths)."""
    m = read_manifest(out_dir)
    paths = world_paths(out_dir)
    intact = m is not None and all((Path(out_dir) / n).is_file() and (Path(out_dir) / n).stat().st_size == size
                                   for n, size in m.get("files", {}).items()) and set(m.get("files", {})) == set(_DATA_FILES)
    if not force and intact and m.get("fingerprint") == world_fingerprint(cfg):
        return paths
    return write_world(generate_world(cfg), out_dir)


def world_summary(world: World):
    """A tidy table for the notebook: one row per (split, family) of questions and one per passage
    kind, with counts, mean words, mean hops and the yes/no shares."""

    rows = []
    for split, qs in world.questions.items():
        for fam in FAMILIES:
            sel = [q for q in qs if q["data_source"] == fam]
            if not sel:
                continue
            ans = [q["golden_answers"][0] for q in sel]
            rows.append({"section": "questions", "split": split, "name": fam, "group": FAMILIES[fam].group,
                         "count": len(sel), "mean_words": sum(len(q["question"].split()) for q in sel) / len(sel),
                         "mean_hops": sum(q["extra_info"]["hops"] for q in sel) / len(sel),
                         "share_yes": ans.count("yes") / len(sel), "share_no": ans.count("no") / len(sel)})
    for kind in ("main", "paraphrase", "ablated", "distractor", "mention"):
        sel = [p for p, m in zip(world.passages, world.passage_meta) if m["kind"] == kind]
        if sel:
            rows.append({"section": "passages", "split": "corpus", "name": kind, "group": "", "count": len(sel),
                         "mean_words": sum(len(p["contents"].split("\n", 1)[1].split()) for p in sel) / len(sel)})
    return pd.DataFrame(rows)
