"""Running the training methods and evaluating them: the joint trainer for a method
(``build_trainer``), several methods in turn (``train_methods``, the entry point of ``cosearch
train``), the policies a notebook evaluates (``policy_adapters``; notebook 02's settings with them:
``oracle_gap_config``, ``with_policies``), and the evaluation of trained
policies before and after GRPO (``evaluate_before_after``) with its diagnostic ceiling
(``evaluate_hop_oracle``) and the paired comparisons they feed (``before_after_pairs``)."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.agent.rollout import Trajectory
from cosearch_lib.config import ProfileConfig
from cosearch_lib.config.methods import PAPER_FINDINGS, method_spec
from cosearch_lib.data.qa_formats import QAExample, load_qa
from cosearch_lib.eval.benchmark_families import in_families
from cosearch_lib.eval.harness import HarnessConfig, HarnessContext, run_evaluation, select_examples
from cosearch_lib.eval.method_settings import policy_eval_settings
from cosearch_lib.experiment.building import harness_config, policy_engine, search_backend, vllm_options
from cosearch_lib.experiment.cached_starts import RANKER_STARTS, method_starts, warm_start
from cosearch_lib.experiment.evaluation_shards import DEFAULT_CHUNK, context_key, evaluate_in_shards
from cosearch_lib.experiment.preflight import engine_length
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.models.policy_loading import load_policy_model
from cosearch_lib.models.scoring_rankers import load_scoring_ranker
from cosearch_lib.paths import path_text, project_relative, run_dir
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.trainer import JointTrainer, TrainerInputs
from cosearch_lib.run_schema import SCORER_SLOT, clear_run, latest_checkpoint


def training_questions(questions: Sequence[QAExample], families: Sequence[str]) -> list[QAExample]:
    """The training split's questions of ``families`` (``training.families``: data-source names, or
    ``"single"`` / ``"multi"``; empty: all); a filter that keeps none is refused, naming what there is."""
    kept = [q for q in questions if in_families(q.data_source, tuple(families))]
    if not kept:
        have = sorted({q.data_source for q in questions})
        raise ValueError(f"training.families {list(families)} keeps none of the {len(questions)} training questions; "
                         f"their families: {have}, or 'single' / 'multi'")
    return kept


def build_trainer(cfg: ProfileConfig, retriever: SearchBackend, *, warm: dict[str, str | Path] | None = None,
                  out_dir: str | Path | None = None, progress: bool = True, backend: Any = None,
                  resume: bool = False, dp: DataParallel = SINGLE_PROCESS, **overrides: Any) -> JointTrainer:
    """A :class:`JointTrainer` for a profile: ``cfg.training`` with ``overrides`` (e.g. ``method=``,
    ``steps=``), the agent model with LoRA adapters started from ``warm`` ({role: adapter folder},
    e.g. :func:`warm_start`; missing roles start fresh), questions from the profile's
    splits. Output goes to ``out_dir`` (default ``papermill_runs/<profile>/training/<method>``).
    With a shared backbone the one adapter starts from the agent's warm start.

    ``resume=True`` continues from the newest checkpoint in the output folder when there is one;
    ``resume=False`` starts over: earlier checkpoints and records of that folder are deleted first
    (they belong to the run being replaced).

    ``dp``: this process's rank in a data-parallel job (``rl.data_parallel``); every rank calls this
    with the same arguments, rank 0 clears the folder, and every rank resumes from the same checkpoint."""

    tcfg = replace(cfg.training, **overrides)
    roles = tcfg.roles()
    if roles["ranker"] is not None and cfg.models.ranker != cfg.models.agent:
        raise ValueError(f"LoRA training puts both policies on one base model, but models.agent={cfg.models.agent!r} "
                         f"and models.ranker={cfg.models.ranker!r}; use one model for both")
    warm = {k: Path(v) for k, v in (warm or {}).items()}
    starts = {"agent": warm.get("agent"), "ranker": warm.get("ranker"), "shared": warm.get("agent")}
    adapters = {name: starts[name] for name in dict.fromkeys(a for a in roles.values() if a)}
    engine = {} if cfg.models.backend == "transformers" else \
        {"max_seq_length": engine_length(cfg), "gpu_memory_utilization": cfg.models.vllm.gpu_memory_utilization}
    # Unsloth under several ranks: its patched model per rank, one plain vLLM engine per rank (load_policy_model)
    per_rank = cfg.models.backend == "unsloth" and dp.distributed
    if per_rank:
        engine["engine_per_rank"] = True
    model, tokenizer, policy_backend = load_policy_model(
        cfg.models.agent, adapters, cfg.lora, backend=cfg.models.backend, seed=cfg.seed,
        vllm_options=vllm_options(cfg) if cfg.models.backend == "vllm" or per_rank else None, **engine)
    policies = PolicySet(model, roles, tcfg.trainable(),
                         {"agent": tcfg.agent_lr, "ranker": tcfg.ranker_lr, "shared": tcfg.agent_lr})
    qa = corpus_paths(cfg).qa
    for split in {tcfg.split, tcfg.val_split}:
        if split not in qa:
            raise ValueError(f"profile {cfg.profile!r} has no {split!r} split; have {sorted(qa)}")
    validates = tcfg.eval_every or tcfg.validate_at_start
    val = select_examples(load_qa(qa[tcfg.val_split]), tcfg.val_per_dataset) if validates else []
    out_dir = Path(out_dir or run_dir(cfg.profile) / "training" / tcfg.method)
    if not resume and dp.is_main:
        clear_run(out_dir)
    dp.barrier()
    scorer = load_scoring_ranker(RANKER_STARTS[tcfg.ranker_kind].build(cfg, retriever, progress=progress)) \
        if tcfg.uses_scoring_ranker else None
    backend = backend if backend is not None else policy_engine(cfg, model, tokenizer, policy_backend)
    inputs = TrainerInputs(policies, tokenizer, retriever, training_questions(load_qa(qa[tcfg.split]), tcfg.families),
                           cfg.rollout, cfg.protocol,
                           val_questions=val, backend=backend, scorer=scorer,
                           validation=harness_config(cfg, split=tcfg.val_split, n_per_dataset=tcfg.val_per_dataset,
                                                     n_samples=1, temperature=0.0, bf16=False))  # validation: float32
    trainer = JointTrainer(tcfg, inputs, out_dir=out_dir, seed=cfg.seed, progress=progress, dp=dp)
    newest = latest_checkpoint(out_dir) if resume else None  # checked (hashed) once
    if newest is not None:
        done = trainer.load_checkpoint(newest)
        if dp.is_main:
            print(f"[{tcfg.method}] resumed from checkpoint {project_relative(newest)}: {done} of {tcfg.steps} steps done",
                  flush=True)
    elif resume and dp.is_main:
        print(f"[{tcfg.method}] resume: no checkpoint under {project_relative(out_dir)}, starting at step 0", flush=True)
    return trainer


def train_methods(cfg: ProfileConfig, methods: Sequence[str], *, retriever: SearchBackend | None = None,
                  dp: DataParallel = SINGLE_PROCESS, resume: bool = False, progress: bool = True,
                  **overrides: Any) -> dict[str, Path]:
    """Train each of ``methods`` in turn into ``papermill_runs/<profile>/training/<method>/`` (what
    notebook 03 does before it evaluates): the entry point of ``cosearch train``, in one process or
    as every rank of a torchrun/srun job (``dp``). Rank 0 first builds what the ranks share and the
    cache keeps (world, index, warm start, the Fixed Ranker); the other ranks wait, then read it.
    ``retriever``: the ranks' search backend (e.g. an ``HttpRetriever`` to one shared server);
    default the profile's in-process index. Returns {method: run folder}."""
    for method in methods:
        method_spec(method)  # an unknown method fails here, before anything is built
    if dp.is_main:
        retriever = retriever or search_backend(cfg, progress=progress)
        for method in methods:
            method_starts(cfg, retriever, method, progress=progress)
    dp.barrier()
    retriever = retriever or search_backend(cfg, progress=False)  # the other ranks: from the cache (or the server)
    out: dict[str, Path] = {}
    for method in methods:
        trainer = build_trainer(cfg, retriever, warm=method_starts(cfg, retriever, method, progress=False), method=method,
                                resume=resume, dp=dp, progress=progress, **overrides)
        trainer.run()
        out[method] = trainer.out_dir
        if dp.is_main:
            print(f"{method}: {trainer.step} steps -> {project_relative(trainer.out_dir)}", flush=True)
        del trainer
        gc.collect()
    return out


#: The policy sources notebooks can evaluate.
POLICY_SOURCES = ("base", "warmstart")


def policy_adapters(cfg: ProfileConfig, retriever: SearchBackend, source: str, *, agent_adapter: str | Path | None = None,
                    fixed_ranker: bool = True, progress: bool = True) -> dict[str, str | None]:
    """HarnessConfig adapter fields for a policy source: ``"base"`` (the models as shipped, no adapters)
    or ``"warmstart"`` (the profile's warm-started agent and the paper's Fixed Ranker, the one notebook
    03 trains against: with a scoring ``training.ranker_kind`` (the LLM judge) that ranker's folder,
    else the relevance-trained generative ranker with ``relevance.enabled``, else the warm-started
    one; trained on first use, then cached). ``agent_adapter`` (a folder) replaces the agent whatever
    the source. ``fixed_ranker=False`` (no method reads it): only the warm-started agent, so that its
    ranker's warm start and relevance training are not trained for nothing."""
    if source not in POLICY_SOURCES:
        raise ValueError(f"unknown policy source {source!r}; expected one of {POLICY_SOURCES}")
    fields: dict[str, str | None] = {"agent_adapter": None, "fixed_ranker_adapter": None}

    if source == "warmstart" and not fixed_ranker:
        fields["agent_adapter"] = path_text(warm_start(cfg, retriever, roles=("agent",), progress=progress).get("agent"))
    elif source == "warmstart":  # a profile without a warm start gets the base models
        warm = method_starts(cfg, retriever, "fixed_ranker", progress=progress)
        fixed = warm.get(SCORER_SLOT, warm.get("ranker"))  # a scoring ranker kind's start is its Fixed Ranker
        fields = {"agent_adapter": path_text(warm.get("agent")), "fixed_ranker_adapter": path_text(fixed)}
    if agent_adapter:
        if not Path(agent_adapter).is_dir():
            raise FileNotFoundError(f"agent adapter folder {agent_adapter} does not exist")
        fields["agent_adapter"] = str(agent_adapter)
    return fields


def oracle_gap_config(cfg: ProfileConfig, methods: str | Sequence[str], n_per_dataset: int = 0) -> HarnessConfig:
    """Notebook 02's harness settings: ``methods`` (comma-separated, as the notebook's parameter, or a
    list) in table order, ``n_per_dataset`` questions per family (0: the profile's). The notebook and
    ``cosearch evaluate`` both build them here (then :func:`with_policies`), so that the parts a job
    writes are the ones the notebook reads."""
    names = methods.split(",") if isinstance(methods, str) else list(methods)
    overrides = {"n_per_dataset": n_per_dataset} if n_per_dataset else {}
    return harness_config(cfg, methods=[m.strip() for m in names if m.strip()], **overrides)


def with_policies(cfg: ProfileConfig, retriever: SearchBackend, ecfg: HarnessConfig, source: str, *,
                  agent_adapter: str | Path | None = None, progress: bool = True) -> HarnessConfig:
    """``ecfg`` with the adapters of the policy ``source`` (:func:`policy_adapters`); the Fixed Ranker
    is built (or read) only when one of ``ecfg``'s methods reads it."""
    return replace(ecfg, **policy_adapters(cfg, retriever, source, agent_adapter=agent_adapter or None,
                                           fixed_ranker=reads_fixed_ranker(ecfg), progress=progress))


def reads_fixed_ranker(ecfg: HarnessConfig) -> bool:
    """Whether a method of ``ecfg`` reads the Fixed Ranker (else a warm start of the agent is all it needs)."""
    return "agent_fixed_ranker" in ecfg.methods


def trained_eval_settings(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path]) -> dict[str, Any]:
    """HarnessConfig fields that evaluate a training method's policies (``eval.method_settings``):
    its spec's evaluation method, its agent adapter and its ranker; a frozen ranker is the
    warm-started one, as in training."""
    return policy_eval_settings(method_spec(method), adapters, warm.get("ranker"))


#: The ``method`` labels :func:`evaluate_before_after` gives: (before GRPO, after GRPO).
BEFORE_AFTER_LABELS = ("warm start", "after GRPO")


def _evaluation(methods: Sequence[str] | None, examples: Sequence[QAExample], ctx: HarnessContext, ecfg: HarnessConfig,
                label: str, *, parts: str | Path | None, dp: DataParallel, progress: bool,
                trajectories: dict[str, list[Trajectory]] | None = None, chunk: int = DEFAULT_CHUNK) -> pd.DataFrame:
    """:func:`run_evaluation` of ``label``; with ``parts`` (a folder), sharded over ``dp``'s ranks,
    written part by part and resumed from the parts there (``experiment.evaluation_shards``).
    ``trajectories`` (a dict) gets the agent methods' trajectories of the questions evaluated here:
    with parts, those of this rank's chunks, none of what was read back."""
    if parts is None:
        return run_evaluation(methods, examples, ctx, ecfg, progress=progress, label=label, trajectories=trajectories)
    ecfg = replace(ecfg, methods=tuple(methods)) if methods is not None else ecfg
    if dp.distributed:  # bf16 only if every rank's CPU runs it: one parts key, ranks that compute alike
        ecfg = replace(ecfg, bf16=all(dp.gather(ecfg.bf16)))

    def chunk_records(chunk: list[QAExample]) -> pd.DataFrame:
        kept: dict[str, list[Trajectory]] | None = {} if trajectories is not None else None
        records = run_evaluation(None, chunk, ctx, ecfg, progress=False, label=label, trajectories=kept)
        for method, trajs in (kept or {}).items():
            trajectories.setdefault(method, []).extend(trajs)
        return records

    return evaluate_in_shards(label, examples, ecfg, chunk_records, parts, dp=dp, progress=progress,
                              context=context_key(ctx), chunk=chunk)


#: The label of notebook 02's evaluation (its parts' folder name; ``cosearch evaluate`` writes the same).
ORACLE_GAP_LABEL = "oracle gap study"


def evaluate_policies(examples: Sequence[QAExample], ctx: HarnessContext, ecfg: HarnessConfig, *,
                      label: str = ORACLE_GAP_LABEL, parts: str | Path | None = None,
                      dp: DataParallel = SINGLE_PROCESS, progress: bool = True,
                      trajectories: dict[str, list[Trajectory]] | None = None, chunk: int = DEFAULT_CHUNK) -> pd.DataFrame:
    """Notebook 02's evaluation: every method of ``ecfg`` with the policies its fields name, records
    in method order as :func:`run_evaluation` gives them. ``parts`` (a folder): kept in parts there,
    sharded over ``dp``'s ranks and resumed (a kernel or a job cut at its time limit continues with
    the questions no part holds; ``cosearch evaluate`` fills the same parts on many
    ranks first). ``trajectories``: as :func:`_evaluation`; ``chunk``: questions per part."""
    return _evaluation(None, examples, ctx, ecfg, label, parts=parts, dp=dp, progress=progress, trajectories=trajectories,
                       chunk=chunk)


def evaluate_before_after(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path],
                          examples: Sequence[QAExample], ctx: HarnessContext, base_cfg: HarnessConfig, *, progress: bool = True,
                          labels: tuple[str, str] = BEFORE_AFTER_LABELS, before: bool = True,
                          parts: str | Path | None = None, dp: DataParallel = SINGLE_PROCESS) -> pd.DataFrame:
    """The method's evaluation (``base_cfg``: a HarnessConfig) with the warm-started policies (unless
    ``before`` is False: the cells of a grid share one warm start) and with the trained ones, on the
    same questions. The ``method`` column reads ``"<method>: <label>"``; the harness's own method name
    stays in ``eval_method``. ``parts``: a folder where the evaluation is kept in parts, sharded over
    the ranks of ``dp`` and resumed (``cosearch evaluate`` and notebook 03 share the run folder's)."""

    frames = []
    warm_adapters = {role: warm[role] for role in ("agent", "ranker", SCORER_SLOT) if role in warm}
    runs = list(zip(labels, (warm_adapters, adapters)))
    for label, chosen in runs if before else runs[1:]:
        fields = trained_eval_settings(method, chosen, warm)
        ecfg = replace(base_cfg, **fields)
        records = _evaluation(None, examples, ctx, ecfg, f"{method}: {label}", parts=parts, dp=dp, progress=progress)
        frames.append(records.assign(eval_method=records["method"], method=f"{method}: {label}"))
    return pd.concat(frames, ignore_index=True)


#: The ``method`` label of :func:`evaluate_hop_oracle`'s records, given the method whose agent reads.
HOP_ORACLE_LABEL = "hop oracle: {method} agent"


def evaluate_hop_oracle(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path],
                        examples: Sequence[QAExample], ctx: HarnessContext, base_cfg: HarnessConfig, *,
                        progress: bool = True, parts: str | Path | None = None,
                        dp: DataParallel = SINGLE_PROCESS) -> pd.DataFrame:
    """A diagnostic ceiling: ``method``'s trained agent (``adapters``) reading the passages that hold
    the current hop's answer first (``agent_hop_oracle``), on ``examples``; ``method`` reads
    :data:`HOP_ORACLE_LABEL`. Paired with ``"<method>: after GRPO"`` it shows what a perfect reader
    of each search could give that agent."""
    fields = trained_eval_settings(method, adapters, warm)
    ecfg = replace(base_cfg, agent_adapter=fields.get("agent_adapter"))
    label = HOP_ORACLE_LABEL.format(method=method)
    records = _evaluation(["agent_hop_oracle"], examples, ctx, ecfg, label, parts=parts, dp=dp, progress=progress)
    return records.assign(eval_method=records["method"], method=label)


def before_after_pairs(methods: Sequence[str], labels: tuple[str, str] = BEFORE_AFTER_LABELS) -> list[tuple[str, str]]:
    """The (a, b) comparisons of :func:`evaluate_before_after` records, as ``method`` labels: each
    training method after GRPO against its own start, then the paper's findings among the trained
    methods present, all trained for the same steps on the same questions: Oracle - Retrieval Only
    (the gap: ``oracle`` vs ``search_r1``), Fixed Ranker - Retrieval Only, CoSearch - Fixed Ranker and
    CoSearch - Retrieval Only."""
    before, after = labels
    pairs = [(f"{m}: {after}", f"{m}: {before}") for m in methods]
    pairs += [(f"{a}: {after}", f"{b}: {after}") for a, b, _ in PAPER_FINDINGS if a in methods and b in methods]
    return pairs
