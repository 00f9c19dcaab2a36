"""``cosearch evaluate``: the evaluations notebooks 02 and 03 read, as one launched job sharded over its ranks.

At paper size the evaluation is the longest stage after training: every question of the Search-R1
test splits, for notebook 03 each trained method before and after GRPO and the hop-level ceiling,
for notebook 02 six methods with the warm-started policies. This runs exactly what the notebooks'
evaluation cells run, with the same settings, in one process or as every rank of a torchrun or srun
job: each rank evaluates its share of the questions not yet evaluated and writes parts under
``papermill_runs/<profile>/evaluation/`` (:mod:`~cosearch_lib.experiment.evaluation_shards`). Both
notebooks' evaluations share the job's start: one child process that builds the starts they read,
one engine and one retriever connection per rank. A job cut by its time limit resumes with the same
command. The notebooks, run afterwards, find every part and only read them.

* notebook 03: the profile's ``evaluation`` section, the methods' checkpoints in the run folder and
  their starts; rank 0 writes ``evaluate.run.json``;
* notebook 02: its ``methods``, ``policies`` and ``n_per_dataset`` parameters with the profile's
  ``notebooks: {"02": ...}`` entries over them, as ``cosearch run`` passes them; rank 0 writes
  ``evaluate_02.run.json``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cosearch_lib.config import ProfileConfig
from cosearch_lib.data.qa_formats import QAExample, load_qa
from cosearch_lib.eval.harness import HarnessConfig, select_examples
from cosearch_lib.experiment import (
    evaluate_before_after,
    evaluate_hop_oracle,
    evaluate_policies,
    harness_config,
    harness_context,
    method_starts,
    oracle_gap_config,
    reads_fixed_ranker,
    search_backend,
    with_policies,
)
from cosearch_lib.experiment.preflight import check_inputs, retriever_url
from cosearch_lib.paths import list_notebooks, run_dir
from cosearch_lib.records.training_runs import checkpoint_adapters, training_root
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.rl.data_parallel import DataParallel, LaunchEnvironment
from cosearch_lib.runs.launched_training import build_starts_apart, finish_job, name_failed_rank
from cosearch_lib.runs.papermill_runner import notebook_parameters, profile_notebook_parameters
from cosearch_lib.seeding import seed_everything

#: The records ``cosearch evaluate`` leaves in the profile's run folder: notebook 03's evaluation, notebook 02's.
EVALUATE_RECORD = "evaluate.run.json"
ORACLE_GAP_RECORD = "evaluate_02.run.json"
#: The notebooks whose evaluation ``cosearch evaluate`` runs, in the order it runs them.
NOTEBOOKS = ("03", "02")
#: The folder under the run folder that holds the evaluation's parts (notebook 03 reads the same).
EVALUATION_PARTS = "evaluation"


def ceiling_method(methods: Sequence[str]) -> str:
    """The method whose trained agent reads the hop-level oracle (notebook 03's choice)."""
    return "search_r1" if "search_r1" in methods else methods[0]


def oracle_gap_settings(cfg: ProfileConfig) -> dict[str, Any]:
    """Notebook 02's evaluation parameters as ``cosearch run`` gives them to it: the notebook's
    defaults, under the profile's ``notebooks`` entries for it."""
    notebook = next(p for p in list_notebooks() if p.name.startswith("02_"))
    params = {**notebook_parameters(notebook), **profile_notebook_parameters(cfg, notebook)}
    return {k: params[k] for k in ("methods", "n_per_dataset", "policies", "agent_adapter")}


def run_evaluation_job(cfg: ProfileConfig, notebooks: Sequence[str] = NOTEBOOKS, methods: Sequence[str] = ("cosearch",), *,
                       ceiling: bool = True, progress: bool = True, dp: DataParallel | None = None,
                       profile_arg: str | None = None) -> dict[str, dict[str, Any]] | None:
    """The evaluations of ``notebooks`` ("03": ``methods`` of ``cfg``, trained: their checkpoints must
    exist, with the hop-level ``ceiling``; "02": the oracle-gap study with the notebook's settings)
    under whatever launched this process, into the run folder's parts. Rank 0 returns {record file:
    record}, the others None. The retriever is the job's server when ``$COSEARCH_RETRIEVER_URL``
    names one. ``profile_arg`` (the ``--profile`` given): under several ranks, rank 0 first makes
    sure the starts both evaluations read are in the cache, in one child process (as ``cosearch
    train`` does), so that no two ranks train one."""
    unknown = sorted(set(notebooks) - set(NOTEBOOKS))
    if unknown or not notebooks:
        raise ValueError(f"cosearch evaluate runs the evaluations of notebooks {NOTEBOOKS}, got {list(notebooks)}")
    launch = LaunchEnvironment.detect()
    dp = dp or DataParallel.from_environment()
    check_inputs(cfg, world_size=dp.world_size)
    seed_everything(cfg.seed)
    out = run_dir(cfg.profile)
    gap = oracle_gap_settings(cfg) if "02" in notebooks else None
    records: dict[str, dict[str, Any]] = {}
    try:
        if dp.distributed and profile_arg is not None:
            needed = [*(methods if "03" in notebooks else ()), *(_oracle_gap_starts(cfg, gap) if gap else ())]
            if dp.is_main and needed:
                build_starts_apart(profile_arg, cfg.seed, list(dict.fromkeys(needed)), retriever_url(cfg), progress)
            dp.barrier()
        retriever = search_backend(cfg, progress=progress and dp.is_main)
        # what the evaluations read, built (one process) or read from the cache before the engine loads
        shown = progress and dp.is_main
        starts = {m: method_starts(cfg, retriever, m, progress=shown) for m in methods} if "03" in notebooks else {}
        gap_run = _oracle_gap_inputs(cfg, gap, retriever, shown) if gap else None
        ctx = harness_context(cfg, retriever)  # one engine per process for both
        job = {"profile": cfg.profile, "seed": cfg.seed, "world_size": dp.world_size, "launcher": launch.launcher}
        for notebook in (n for n in NOTEBOOKS if n in notebooks):  # each record's wall_s: its own evaluation
            t0 = time.perf_counter()
            if notebook == "03":
                name, done = EVALUATE_RECORD, {"methods": list(methods),
                                               **_trained_methods(cfg, methods, starts, ceiling, ctx, dp, progress)}
            else:
                name, done = ORACLE_GAP_RECORD, {"notebook": "02", **_oracle_gap(cfg, gap, *gap_run, ctx, dp, progress)}
            records[name] = {"step": "evaluate", **job, **done, "wall_s": round(time.perf_counter() - t0, 2)}
    except BaseException as err:
        name_failed_rank("evaluate", dp, err)
        raise
    return finish_job(records, out, dp)


def _trained_methods(cfg: ProfileConfig, methods: Sequence[str], starts: dict[str, dict[str, Any]], ceiling: bool,
                     ctx: Any, dp: DataParallel, progress: bool) -> dict[str, Any]:
    """Notebook 03's evaluation cells: each method before and after GRPO (``starts``: its warm
    start, {method: {role: folder}}), then the hop-level ceiling."""
    root, parts = training_root(cfg.profile), run_dir(cfg.profile) / EVALUATION_PARTS
    ecfg = harness_config(cfg)
    examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
    counts = {}
    for method in methods:
        records = evaluate_before_after(method, checkpoint_adapters(root, method), starts[method], examples, ctx, ecfg,
                                        parts=parts, dp=dp, progress=progress)
        counts.update(records.groupby("method").size().to_dict())
    if ceiling and methods:
        m = ceiling_method(methods)
        hop = evaluate_hop_oracle(m, checkpoint_adapters(root, m), starts[m], examples, ctx, ecfg, parts=parts, dp=dp,
                                  progress=progress)
        counts.update(hop.groupby("method").size().to_dict())
    return {"split": ecfg.split, "questions": len(examples), "records": {k: int(v) for k, v in counts.items()}}


def _oracle_gap_starts(cfg: ProfileConfig, settings: dict[str, Any]) -> list[str]:
    """The methods whose starts notebook 02's policies read: the Fixed Ranker's (warm start included)
    when a method reads it, else the agent's warm start (search_r1's); none for the shipped models."""
    if settings["policies"] != "warmstart":
        return []
    return ["fixed_ranker" if reads_fixed_ranker(oracle_gap_config(cfg, settings["methods"])) else "search_r1"]


def _oracle_gap_inputs(cfg: ProfileConfig, settings: dict[str, Any], retriever: Any,
                       progress: bool) -> tuple[HarnessConfig, list[QAExample]]:
    """Notebook 02's harness settings with its policies (built on first use: the Fixed Ranker) and its
    questions, as its cells make them (:func:`oracle_gap_settings`)."""
    ecfg = oracle_gap_config(cfg, settings["methods"], settings["n_per_dataset"] or 0)
    examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
    ecfg = with_policies(cfg, retriever, ecfg, settings["policies"], agent_adapter=settings["agent_adapter"],
                         progress=progress)
    return ecfg, examples


def _oracle_gap(cfg: ProfileConfig, settings: dict[str, Any], ecfg: HarnessConfig, examples: list[QAExample], ctx: Any,
                dp: DataParallel, progress: bool) -> dict[str, Any]:
    """Notebook 02's evaluation cells."""
    records = evaluate_policies(examples, ctx, ecfg, parts=run_dir(cfg.profile) / EVALUATION_PARTS, dp=dp, progress=progress)
    return {"methods": list(ecfg.methods), "policies": settings["policies"], "split": ecfg.split, "questions": len(examples),
            "records": {k: int(v) for k, v in records.groupby("method", sort=False).size().items()}}
