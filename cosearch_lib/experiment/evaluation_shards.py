"""Evaluation at paper size: sharded over the ranks of a job, written in parts, resumed part by part.

The paper evaluates on the Search-R1 test splits (tens of thousands of questions per method). One
notebook kernel on one GPU would take days, and a job cut by its time limit would lose everything.
Here an evaluation (one harness configuration on one list of questions: one *label*, such as
``"cosearch: after GRPO"``) is stored as parts under the profile's run folder::

    papermill_runs/<profile>/evaluation/<label-slug>-<key>/
        part-r<rank>-<first question>-<n>.parquet     records of n questions, written whole (atomic)

``key`` hashes the harness settings and the contents of the adapters they name, so a part is
reused only by the same evaluation of the same weights. :func:`evaluate_in_shards` reads which
questions already have records (every part, whatever rank wrote it), splits the rest over the
ranks of ``dp`` (:meth:`~cosearch_lib.rl.data_parallel.DataParallel.shard`), evaluates each rank's
share ``chunk`` questions at a time and writes a part after each chunk; then every rank waits for
the others and reads the whole evaluation back in question order. A run stopped at any point
resumes with the questions no part holds; the records do not depend on how the questions were
split, because every row samples with its own seed (the harness's ``derive_seed`` of its key).
SIGUSR1 or SIGTERM (a cluster's time-limit warning, preemption) ends a rank after the part it is
writing, with :class:`~cosearch_lib.stop_signals.StopRequested` (``cosearch evaluate`` exits 75,
which the job script requeues).

``cosearch evaluate`` runs it under torchrun or srun; notebook 03 runs the same function in its
one process and finds the parts a job wrote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.atomic_io import write_table
from cosearch_lib.config import PAPER_HIT_KS
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.harness import HarnessConfig, empty_records
from cosearch_lib.progress import tqdm
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.run_schema import RENAMED_EVAL_METHODS, RENAMED_HARNESS_FIELDS, file_sha256, under_current_names
from cosearch_lib.stop_signals import StopRequest, StopRequested

#: Questions per part: what a rank loses at most when its job is cut.
DEFAULT_CHUNK = 64
_ADAPTER_FIELDS = ("agent_adapter", "fixed_ranker_adapter", "trained_ranker_adapter", "scorer_model")


def _folder_digest(path: str | None) -> str | None:
    """The sha256 of a folder's weight files (an adapter, a saved ranker), or the value as given
    when it is no folder (a loaded adapter's name, a hub model name, None)."""
    if path is None or not Path(path).is_dir():
        return path
    h = hashlib.sha256()
    for f in sorted(Path(path).rglob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".bin", ".pt", ".json"):
            h.update(f"{f.name}:{file_sha256(f)}".encode())
    return h.hexdigest()


def evaluation_key(label: str, cfg: HarnessConfig, context: dict | None = None) -> str:
    """What decides an evaluation's records: its label, every harness setting but the question count
    (the questions are the parts' business), the contents of the adapters it names, and ``context``
    (what else shapes them: the models, the prompt protocol; ``context_key``)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "n_per_dataset"}
    settings.update({k: _folder_digest(getattr(cfg, k)) for k in _ADAPTER_FIELDS})
    # hashed under the names its parts were first written with, so that a renamed setting or method
    # (run_schema.RENAMED_EVAL_METHODS: the scoring ranker's) keeps an evaluation's key, and its parts
    settings.update({old: settings.pop(new) for old, new in RENAMED_HARNESS_FIELDS.items()})
    if tuple(settings["hit_ks"]) == PAPER_HIT_KS:  # the cutoffs every evaluation had before the setting existed
        del settings["hit_ks"]
    if not settings["bf16"]:  # float32, as every evaluation before the setting existed
        del settings["bf16"]
    else:  # bf16 weights: not the parts an autocast evaluation (the setting's first mechanism) wrote
        settings["bf16"] = "weights"
    old_names = {new: old for old, new in RENAMED_EVAL_METHODS.items()}
    settings["methods"] = [old_names.get(m, m) for m in settings["methods"]]
    text = json.dumps({"label": label, "settings": settings, "context": context or {}}, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def context_key(ctx: Any) -> dict:
    """The parts of a harness context that change the records: the models the backends serve (their
    tokenizers' names: the model folders or hub ids) and the prompt protocol."""
    def model(backend: Any) -> Any:
        return getattr(getattr(backend, "tokenizer", None), "name_or_path", None)

    protocol = getattr(ctx, "protocol", None)
    return {"agent": model(getattr(ctx, "agent_backend", None)), "ranker": model(getattr(ctx, "ranker_backend", None)),
            "protocol": dataclasses.asdict(protocol) if dataclasses.is_dataclass(protocol) else None}


def evaluation_folder(root: str | Path, label: str, cfg: HarnessConfig, context: dict | None = None) -> Path:
    slug = re.sub(r"[^0-9A-Za-z]+", "-", label).strip("-").lower()[:48]
    return Path(root) / f"{slug}-{evaluation_key(label, cfg, context)}"


def read_parts(folder: Path, cfg: HarnessConfig | None = None) -> pd.DataFrame:
    parts = sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []
    frames = [under_current_names(pd.read_parquet(p)) for p in parts]  # parts written before a rename, too
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else empty_records(cfg)


def evaluate_in_shards(label: str, examples: Sequence[QAExample], cfg: HarnessConfig,
                       evaluate: Callable[[list[QAExample]], pd.DataFrame], root: str | Path, *,
                       dp: DataParallel = SINGLE_PROCESS, chunk: int = DEFAULT_CHUNK,
                       progress: bool = True, context: dict | None = None) -> pd.DataFrame:
    """The records of ``evaluate`` (questions -> records) on ``examples``, from the parts under
    ``root`` where they exist and by this rank's share of the rest (see the module doc); every rank
    returns the whole evaluation, in ``examples`` order."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    folder = evaluation_folder(root, label, cfg, context)
    done = set(read_parts(folder, cfg)["question_id"].astype(str))
    todo = [ex for ex in examples if ex.id not in done]
    dp.barrier()  # every rank has read the same parts before any writes one
    mine = dp.shard(todo)
    # every rank runs the same number of rounds (the largest share's), so that after each round the
    # ranks can decide together whether to stop: none is left waiting at a barrier the others left
    largest_share = math.ceil(len(todo) / dp.world_size)
    rounds = math.ceil(largest_share / chunk)
    bar = tqdm(total=len(mine), desc=f"evaluate {label}" + (f" [rank {dp.rank}]" if dp.distributed else ""),
               unit="question", disable=not progress or not mine)
    with StopRequest() as stop:
        for r in range(rounds):
            batch = mine[r * chunk:(r + 1) * chunk]
            if batch:
                records = evaluate(batch)
                if len(records):
                    write_table(records, folder / f"part-r{dp.rank}-{_part_name(batch)}.parquet")
                bar.update(len(batch))
            stopping = dp.sum(1.0 if stop.received else 0.0) > 0  # a signal to any rank stops them all
            if stopping and r + 1 < rounds:  # the time limit is near: the parts so far stay
                bar.close()
                raise StopRequested(stop.received or "a signal to another rank", r + 1, folder)
    bar.close()
    dp.barrier()  # every part is written
    records = read_parts(folder, cfg)
    if not len(records):
        return records
    order = {ex.id: i for i, ex in enumerate(examples)}
    records = records[records["question_id"].astype(str).isin(order)]
    records = records.drop_duplicates(["method", "question_id", "sample"], keep="last")
    # as one process gives them (harness.run_evaluation): method by method in the settings' order, then question, sample
    method_order = {m: i for i, m in enumerate(cfg.methods)}
    keys = {"_method": records["method"].map(method_order).fillna(len(method_order)),
            "_order": records["question_id"].astype(str).map(order)}
    return records.assign(**keys).sort_values(["_method", "_order", "sample"], kind="stable") \
        .drop(columns=list(keys)).reset_index(drop=True)


def _part_name(batch: Sequence[QAExample]) -> str:
    """A part's name: its first question (readable) and a hash of all its questions (unique)."""
    digest = hashlib.sha1("\n".join(ex.id for ex in batch).encode()).hexdigest()[:10]
    return f"{re.sub(r'[^0-9A-Za-z_.-]+', '_', batch[0].id)[:32]}-{len(batch)}-{digest}"
