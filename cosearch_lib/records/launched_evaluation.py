"""``cosearch evaluate``: notebook 03's (or 02's) evaluation as a launched job, sharded over its ranks.

At paper size the evaluation (every question of the Search-R1 test splits, each trained method
before and after GRPO, and the hop-level ceiling) is the longest stage after training. This runs
exactly what notebook 03's evaluation cells run, with the same settings (the profile's
``evaluation`` section, the methods' checkpoints in the run folder, their starts), in one process
or as every rank of a torchrun or srun job: each rank evaluates its share of the questions not yet
evaluated and writes parts under ``papermill_runs/<profile>/evaluation/``
(:mod:`~cosearch_lib.experiment.evaluation_shards`). A job cut by its time limit resumes with the
same command. Notebook 03, run afterwards, finds every part and only reads them. Rank 0 writes
``evaluate.run.json``.

``--notebook 02`` does the same for notebook 02's oracle-gap evaluation (every method of its
``methods`` parameter, the warm-started or shipped policies of its ``policies``; the notebook's
parameters with the profile's ``notebooks: {"02": ...}`` entries over them, as ``cosearch run``
passes them): at paper size six methods on every test question. Rank 0 writes
``evaluate_02.run.json``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cosearch_lib.config import ProfileConfig
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.harness import select_examples
from cosearch_lib.experiment import (
    evaluate_before_after,
    evaluate_hop_oracle,
    evaluate_policies,
    harness_config,
    harness_context,
    method_starts,
    policy_adapters,
    search_backend,
)
from cosearch_lib.experiment.preflight import check_inputs, retriever_url
from cosearch_lib.paths import run_dir
from cosearch_lib.records.launched_training import build_starts_apart, finish_job, name_failed_rank
from cosearch_lib.records.papermill_runner import list_notebooks, notebook_parameters, profile_notebook_parameters
from cosearch_lib.records.training_runs import checkpoint_adapters, training_root
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.rl.data_parallel import DataParallel, LaunchEnvironment
from cosearch_lib.seeding import seed_everything

#: The record ``cosearch evaluate`` leaves in the profile's run folder (``--notebook 02``: the second).
EVALUATE_RECORD = "evaluate.run.json"
ORACLE_GAP_RECORD = "evaluate_02.run.json"
#: The folder under the run folder that holds the evaluation's parts (notebook 03 reads the same).
EVALUATION_PARTS = "evaluation"


def ceiling_method(methods: Sequence[str]) -> str:
    """The method whose trained agent reads the hop-level oracle (notebook 03's choice)."""
    return "search_r1" if "search_r1" in methods else methods[0]


def run_evaluation_job(cfg: ProfileConfig, methods: Sequence[str], *, ceiling: bool = True, progress: bool = True,
                       dp: DataParallel | None = None, profile_arg: str | None = None) -> dict[str, Any] | None:
    """Evaluate ``methods`` of ``cfg`` (trained: their checkpoints must exist) under whatever launched
    this process, into the run folder's parts; rank 0 returns the record, the others None. The
    retriever is the job's server when ``$COSEARCH_RETRIEVER_URL`` names one. ``profile_arg`` (the
    ``--profile`` given): under several ranks, rank 0 first makes sure the methods' starts are in
    the cache, in a child process (as ``cosearch train`` does), so that no two ranks train one."""
    launch = LaunchEnvironment.detect()
    dp = dp or DataParallel.from_environment()
    check_inputs(cfg, world_size=dp.world_size)
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    root, out = training_root(cfg.profile), run_dir(cfg.profile)
    parts = out / EVALUATION_PARTS
    try:
        if dp.distributed and profile_arg is not None:
            if dp.is_main:
                build_starts_apart(profile_arg, cfg.seed, methods, retriever_url(cfg), progress)
            dp.barrier()
        retriever = search_backend(cfg, progress=progress and dp.is_main)
        ecfg = harness_config(cfg)
        examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
        ctx = harness_context(cfg, retriever)
        counts = {}
        for method in methods:
            adapters, starts = checkpoint_adapters(root, method), method_starts(cfg, retriever, method, progress=False)
            records = evaluate_before_after(method, adapters, starts, examples, ctx, ecfg, parts=parts, dp=dp,
                                            progress=progress)
            counts.update(records.groupby("method").size().to_dict())
        if ceiling and methods:
            m = ceiling_method(methods)
            hop = evaluate_hop_oracle(m, checkpoint_adapters(root, m), method_starts(cfg, retriever, m, progress=False),
                                      examples, ctx, ecfg, parts=parts, dp=dp, progress=progress)
            counts.update(hop.groupby("method").size().to_dict())
    except BaseException as err:
        name_failed_rank("evaluate", dp, err)
        raise
    record = {"step": "evaluate", "profile": cfg.profile, "seed": cfg.seed, "methods": list(methods),
              "split": ecfg.split, "questions": len(examples), "records": {k: int(v) for k, v in counts.items()},
              "world_size": dp.world_size, "launcher": launch.launcher, "wall_s": round(time.perf_counter() - t0, 2)}
    return finish_job(record, out, EVALUATE_RECORD, dp)


def oracle_gap_settings(cfg: ProfileConfig) -> dict[str, Any]:
    """Notebook 02's evaluation parameters as ``cosearch run`` gives them to it: the notebook's
    defaults, under the profile's ``notebooks`` entries for it."""
    notebook = next(p for p in list_notebooks() if p.name.startswith("02_"))
    params = {**notebook_parameters(notebook), **profile_notebook_parameters(cfg, notebook)}
    return {k: params[k] for k in ("methods", "n_per_dataset", "policies", "agent_adapter")}


def run_oracle_gap_job(cfg: ProfileConfig, *, progress: bool = True, dp: DataParallel | None = None,
                       profile_arg: str | None = None) -> dict[str, Any] | None:
    """Notebook 02's evaluation (:func:`oracle_gap_settings`) under whatever launched this process,
    into the run folder's parts, with exactly the notebook's settings, so that the notebook then
    reads them; rank 0 returns the record, the others None. Under several ranks, rank 0 first builds
    the policies' starts (warm start, Fixed Ranker) in a child process."""
    launch = LaunchEnvironment.detect()
    dp = dp or DataParallel.from_environment()
    check_inputs(cfg, world_size=dp.world_size)
    t0 = time.perf_counter()
    seed_everything(cfg.seed)
    out = run_dir(cfg.profile)
    settings = oracle_gap_settings(cfg)
    methods = [m.strip() for m in str(settings["methods"]).split(",") if m.strip()]
    uses_fixed = "agent_fixed_ranker" in methods  # as the notebook: else only the agent's warm start is read
    try:
        if dp.distributed and profile_arg is not None and settings["policies"] == "warmstart":
            if dp.is_main:
                build_starts_apart(profile_arg, cfg.seed, ["fixed_ranker" if uses_fixed else "search_r1"],
                                   retriever_url(cfg), progress)
            dp.barrier()
        retriever = search_backend(cfg, progress=progress and dp.is_main)
        overrides = {"n_per_dataset": settings["n_per_dataset"]} if settings["n_per_dataset"] else {}
        ecfg = harness_config(cfg, methods=methods, **overrides)
        examples = select_examples(load_qa(corpus_paths(cfg).qa[ecfg.split]), ecfg.n_per_dataset)
        ecfg = replace(ecfg, **policy_adapters(cfg, retriever, settings["policies"], agent_adapter=settings["agent_adapter"] or None,
                                               fixed_ranker=uses_fixed, progress=False))
        ctx = harness_context(cfg, retriever)
        records = evaluate_policies(examples, ctx, ecfg, parts=out / EVALUATION_PARTS, dp=dp, progress=progress)
    except BaseException as err:
        name_failed_rank("evaluate", dp, err)
        raise
    record = {"step": "evaluate", "notebook": "02", "profile": cfg.profile, "seed": cfg.seed, "methods": methods,
              "policies": settings["policies"], "split": ecfg.split, "questions": len(examples),
              "records": {k: int(v) for k, v in records.groupby("method", sort=False).size().items()},
              "world_size": dp.world_size, "launcher": launch.launcher, "wall_s": round(time.perf_counter() - t0, 2)}
    return finish_job(record, out, ORACLE_GAP_RECORD, dp)
