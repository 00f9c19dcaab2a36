"""The one place that wires a profile into running objects.

Profile (``ProfileConfig``) -> retriever (``build_retriever``) -> generation backends
(``build_backends``) -> evaluation harness (``harness_config``, ``harness_context``) -> warm-started
adapters (``warm_start``, ``policy_adapters``) -> joint GRPO trainer (``build_trainer``) -> the
evaluation of trained policies (``evaluate_before_after``). Notebooks and the CLI call these;
every layer below takes explicit settings objects and never reads a profile itself.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import LLMRanker, RetrievalOnlyRanker
from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import SCORING_RANKER_KINDS, CrossEncoderConfig, ProfileConfig, load_profile
from cosearch_lib.config.methods import RankedBy, method_spec
from cosearch_lib.data.qa_formats import QAExample, load_qa
from cosearch_lib.eval.harness import HarnessConfig, HarnessContext, register_adapter, run_evaluation, select_examples
from cosearch_lib.eval.method_settings import policy_eval_settings
from cosearch_lib.models.cross_encoder import MARKER as CROSS_ENCODER_MARKER
from cosearch_lib.models.cross_encoder import CrossEncoderScorer
from cosearch_lib.models.generation.backend_factory import make_backend
from cosearch_lib.models.generation.contract import GenerationBackend
from cosearch_lib.models.llm_judge import LLMJudgeScorer, is_llm_judge_folder
from cosearch_lib.models.lora_policies import PolicySet, load_policy_model, vllm_max_lora_rank
from cosearch_lib.models.registry import load_causal_lm, load_tokenizer
from cosearch_lib.models.scoring_rankers import load_scoring_ranker
from cosearch_lib.paths import cache_dir, path_text, project_relative, run_dir
from cosearch_lib.retrieval.artifacts import corpus_paths, prepare_corpus, prepare_index
from cosearch_lib.retrieval.encoder import TextEncoder
from cosearch_lib.retrieval.retriever import Retriever, SearchBackend
from cosearch_lib.rl.cross_encoder_policy import relevance_lists, warm_start_cross_encoder
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.listwise_training import ListwiseRecipe, sub_query_lists, train_listwise
from cosearch_lib.rl.ranker_validation import RankerValidationSet, gold_sub_queries
from cosearch_lib.rl.relevance_training import RelevanceInputs, RelevanceTrainer
from cosearch_lib.rl.trainer import JointTrainer, TrainerInputs
from cosearch_lib.rl.warm_start import POLICY_ROLES, WARMSTART_VERSION, build_gold_data, train_sft
from cosearch_lib.run_schema import clear_run, latest_checkpoint
from cosearch_lib.seeding import seed_everything


def resolve_profile(profile: str | ProfileConfig) -> ProfileConfig:
    return profile if isinstance(profile, ProfileConfig) else load_profile(profile)


def build_retriever(profile: str | ProfileConfig, *, progress: bool = True, device: str | None = None) -> Retriever:
    """The profile's in-process dense retriever, building and caching whatever is missing."""
    cfg = resolve_profile(profile)
    store, paths = prepare_corpus(cfg, progress=progress)
    encoder = TextEncoder(cfg.retrieval.encoder, device=device)
    index = prepare_index(cfg, encoder, store, paths, progress=progress)
    return Retriever(encoder, index, store)


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
    if dp.distributed and cfg.models.backend == "unsloth":
        # Unsloth's fast_inference engine is started by Unsloth itself, without the external-launcher
        # option that one vLLM engine per rank needs (models.generation.vllm_backend.engine_options)
        raise ValueError(f"models.backend 'unsloth' under a data-parallel job of {dp.world_size} ranks is not "
                         "supported: use models.backend 'vllm' (one engine per rank) or 'transformers'")
    if roles["ranker"] is not None and cfg.models.ranker != cfg.models.agent:
        raise ValueError(f"LoRA training puts both policies on one base model, but models.agent={cfg.models.agent!r} "
                         f"and models.ranker={cfg.models.ranker!r}; use one model for both")
    warm = {k: Path(v) for k, v in (warm or {}).items()}
    starts = {"agent": warm.get("agent"), "ranker": warm.get("ranker"), "shared": warm.get("agent")}
    adapters = {name: starts[name] for name in dict.fromkeys(a for a in roles.values() if a)}
    ro = cfg.rollout  # longest sequence: a context just under the cap plus one generated turn or ranking
    max_len = ro.max_context_tokens + max(ro.agent_max_new_tokens, ro.ranker_max_new_tokens)
    model, tokenizer, policy_backend = load_policy_model(
        cfg.models.agent, adapters, cfg.lora, backend=cfg.models.backend, seed=cfg.seed, max_seq_length=max_len,
        vllm_options=vllm_options(cfg))
    backend = backend if backend is not None else policy_backend  # vllm, unsloth: their engine generates
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
    scorer = load_scoring_ranker(scoring_ranker_start(cfg, retriever, progress=progress)) \
        if tcfg.uses_scoring_ranker else None
    inputs = TrainerInputs(policies, tokenizer, retriever, load_qa(qa[tcfg.split]), cfg.rollout, cfg.protocol,
                           val_questions=val, backend=backend, cross_encoder=scorer,
                           validation=harness_config(cfg, split=tcfg.val_split, n_per_dataset=tcfg.val_per_dataset,
                                                     n_samples=1, temperature=0.0),
                           generation_options=cfg.models.transformers_options())
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


def warmstart_dir(cfg: ProfileConfig) -> Path:
    """Where the profile's warm-start adapters are cached (a hash of everything that shapes them)."""

    key = cfg.fingerprint("world", "data", "retrieval", "search", "protocol", "models", "warmstart", "lora", "seed")
    return cache_dir() / "warmstart" / f"v{WARMSTART_VERSION}-{key}"


def warm_start(cfg: ProfileConfig, retriever: SearchBackend | None, *, roles: Sequence[str] = POLICY_ROLES, force: bool = False,
               progress: bool = True) -> dict[str, Path]:
    """The profile's warm-started adapters, {role: folder}: trained on first use, then loaded from
    :func:`warmstart_dir`; {} when ``cfg.warmstart.enabled`` is false. The agent adapter is trained on the agent model, the ranker adapter on the
    ranker model (``cfg.models``); the gold data is built once for both roles. ``retriever`` may be
    None when every adapter is cached (nothing to train)."""

    for role in roles:
        if role not in POLICY_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {POLICY_ROLES}")
    if not cfg.warmstart.enabled:
        return {}
    root = warmstart_dir(cfg)
    todo = [r for r in roles if force or not (root / r / "adapter_config.json").exists()]
    if todo:
        if retriever is None:
            raise ValueError(f"the warm start of {cfg.profile!r} must train {todo} and needs a retriever")
        ws = cfg.warmstart
        qa_path = corpus_paths(cfg).qa.get(ws.split)
        if qa_path is None:
            raise ValueError(f"profile {cfg.profile!r} has no {ws.split!r} split for the warm start")
        names = {"agent": cfg.models.agent, "ranker": cfg.models.ranker}
        chats = {role: ChatTokens(load_tokenizer(names[role])) for role in POLICY_ROLES}
        data, stats = build_gold_data(load_qa(qa_path), retriever, chats["agent"], cfg.protocol,
                                      topn=cfg.search.topn, n_agent=ws.n_agent if "agent" in todo else 0,
                                      n_ranker=ws.n_ranker if "ranker" in todo else 0, seed=cfg.seed,
                                      balance_hops=ws.balance_hops, reasoning=ws.reasoning, ranker_chat=chats["ranker"],
                                      ranker_candidates=ws.ranker_candidates)
        root.mkdir(parents=True, exist_ok=True)
        (root / "gold_data.json").write_text(json.dumps(stats.to_dict(), indent=2))
        for role in todo:
            model, tokenizer = load_causal_lm(names[role])
            train_sft(model, tokenizer, data[role], ws, cfg.lora, root / role, seed=cfg.seed, progress=progress)
    return {role: root / role for role in roles}


#: Bump when the relevance training's recipe changes, so cached Fixed Rankers are not reused.
RELEVANCE_VERSION = 1
#: The training methods whose frozen ranker is the relevance-trained one (when ``relevance.enabled``).
FIXED_RANKER_METHODS = ("fixed_ranker",)


def relevance_dir(cfg: ProfileConfig) -> Path:
    """Where the profile's relevance-trained ranker (the Fixed Ranker) and its run are cached: a hash of
    the warm start's key, the ``relevance`` section and the ranker's generation settings."""
    ro = cfg.rollout
    shaping = {"warmstart": warmstart_dir(cfg).name, "relevance": cfg.fingerprint("relevance"),
               "ranker": [ro.ranker_max_new_tokens, ro.top_p, ro.rules.ranker_output],
               "max_grad_norm": cfg.training.max_grad_norm}
    key = hashlib.sha1(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "relevance" / f"v{RELEVANCE_VERSION}-{key}"


def relevance_ranker(cfg: ProfileConfig, retriever: SearchBackend | None, *, force: bool = False,
                     progress: bool = True) -> Path | None:
    """The profile's relevance-trained ranker adapter (``rl.relevance_training``), or None when
    ``relevance.enabled`` is false. Trained on first use from the warm-started ranker, then loaded
    from :func:`relevance_dir`; an interrupted training resumes from its newest checkpoint there
    (``run/``, which also keeps its records). ``retriever`` may be None when it is cached."""
    rc = cfg.relevance
    if not rc.enabled:
        return None
    root = relevance_dir(cfg)
    final = root / "ranker"
    if (final / "adapter_config.json").exists() and not force:
        return final
    if retriever is None:
        raise ValueError(f"the relevance training of {cfg.profile!r} must run and needs a retriever")
    start = warm_start(cfg, retriever, roles=("ranker",), progress=progress).get("ranker")
    ro = cfg.rollout
    model, tokenizer, backend = load_policy_model(cfg.models.ranker, {"ranker": start}, cfg.lora, backend=cfg.models.backend,
                                                  seed=cfg.seed, max_seq_length=ro.max_context_tokens + ro.ranker_max_new_tokens,
                                                  vllm_options=vllm_options(cfg))
    policies = PolicySet(model, {"ranker": "ranker"}, ["ranker"], {"ranker": rc.lr})
    qa = corpus_paths(cfg).qa
    if rc.split not in qa:
        raise ValueError(f"profile {cfg.profile!r} has no {rc.split!r} split for the relevance training; have {sorted(qa)}")
    inputs = RelevanceInputs(policies, tokenizer, retriever, gold_sub_queries(load_qa(qa[rc.split])), relevance_held_out(cfg),
                             ro, cfg.protocol, backend=backend, generation_options=cfg.models.transformers_options(),
                             max_grad_norm=cfg.training.max_grad_norm)
    trainer = RelevanceTrainer(rc, inputs, out_dir=root / "run", seed=cfg.seed, progress=progress)
    if force:
        clear_run(root / "run")
    elif trainer.resume():
        print(f"[relevance] resumed at step {trainer.step} of {rc.steps} from {project_relative(root / 'run')}", flush=True)
    trainer.run()
    trainer.save_ranker(root)
    write_json({"pool": trainer.pool_stats, "steps": trainer.step, "start": path_text(start), "seed": cfg.seed,
                "config": dataclasses.asdict(rc)}, root / "relevance.json")
    return final


def relevance_held_out(cfg: ProfileConfig) -> list:
    """The held-out sub-queries of the relevance training's Hit@k curve (``relevance.val_per_dataset``
    validation questions per family, their gold-chain hops): the items every ranker of the
    ranker-quality table is scored on."""
    rc = cfg.relevance
    qa = corpus_paths(cfg).qa
    if rc.val_split not in qa:
        raise ValueError(f"profile {cfg.profile!r} has no {rc.val_split!r} split; have {sorted(qa)}")
    return gold_sub_queries(select_examples(load_qa(qa[rc.val_split]), rc.val_per_dataset)) if rc.val_per_dataset else []


def held_out_ranker_rows(cfg: ProfileConfig, retriever: SearchBackend, rankers: dict[str, str | Path | None], *,
                         backend: GenerationBackend | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per-item rows (``RankerValidationSet.score_items``) of each ranker on :func:`relevance_held_out`:
    ``None`` is the retriever's order, a folder a ranker adapter ranking greedily with the profile's
    ranker model (``backend``: the profile's ranker backend by default)."""
    items = RankerValidationSet(relevance_held_out(cfg), retriever, topn=cfg.search.topn, topk=cfg.search.topk)
    out: dict[str, list[dict[str, Any]]] = {}
    for label, adapter in rankers.items():
        if adapter is None:
            out[label] = items.score_items(RetrievalOnlyRanker())
            continue
        backend = backend or build_backends(cfg)[1]
        sampling = replace(cfg.rollout.ranker_sampling(cfg.seed), temperature=0.0)
        ranker = LLMRanker(backend, ChatTokens(backend.tokenizer), cfg.protocol, sampling,
                           adapter=register_adapter(backend, str(adapter)), output_protocol=cfg.rollout.rules.ranker_output)
        out[label] = items.score_items(ranker)
    return out


def method_starts(cfg: ProfileConfig, retriever: SearchBackend | None, method: str, *, progress: bool = True) -> dict[str, Path]:
    """Where a training method's policies start: :func:`policy_starts`, with the ranker replaced by the
    relevance-trained one (:func:`relevance_ranker`) for the Fixed Ranker, and for CoSearch when
    ``relevance.cosearch_start`` is ``"relevance"`` (docs/METHOD.md: the release starts CoSearch's
    ranker from the model as shipped, ours from its warm start)."""
    starts = policy_starts(cfg, retriever, progress=progress)
    takes_relevance = method in FIXED_RANKER_METHODS or (method == "cosearch" and cfg.relevance.cosearch_start == "relevance")
    # (a scoring ranker is relevance-trained by its own start: this GRPO is the generative ranker's)
    if cfg.relevance.enabled and takes_relevance and method_spec(method).ranked_by is RankedBy.POLICY \
            and cfg.training.ranker_kind == "llm":
        starts["ranker"] = relevance_ranker(cfg, retriever, progress=progress)
    return starts


def cross_encoder_start(cfg: ProfileConfig, retriever: SearchBackend | None, settings: CrossEncoderConfig | None = None, *,
                        progress: bool = True) -> Path:
    """The folder of the cross-encoder ranker GRPO starts from (``training.ranker_kind: cross_encoder``):
    ``settings.model`` with its head at zero, then (``warm_start_epochs`` > 0 and the profile's warm
    start enabled) trained listwise on the first ``warmstart.n_ranker`` gold hops of the warm start's
    split (``rl.cross_encoder_policy``). Built on first use, then cached beside the profile's warm start."""
    ce = settings or cfg.training.cross_encoder
    key = hashlib.sha1(json.dumps(dataclasses.asdict(ce), sort_keys=True).encode()).hexdigest()[:12]
    folder = warmstart_dir(cfg) / f"cross_encoder-{key}"
    if (folder / CROSS_ENCODER_MARKER).exists():
        return folder
    scorer = CrossEncoderScorer.from_encoder(ce.model, max_length=ce.max_length)
    stats: dict[str, Any] = {"trained": False}
    if ce.warm_start_epochs and cfg.warmstart.enabled:
        qa_path = corpus_paths(cfg).qa.get(cfg.warmstart.split)
        if retriever is None or qa_path is None:
            raise ValueError(f"the cross-encoder warm start of {cfg.profile!r} must be trained: it needs a retriever "
                             f"and the {cfg.warmstart.split!r} split")
        lists = relevance_lists(load_qa(qa_path), retriever, topn=cfg.search.topn, n=cfg.warmstart.n_ranker)
        stats = {"trained": True, **warm_start_cross_encoder(scorer, lists, lr=ce.lr, head_lr=ce.head_lr, epochs=ce.warm_start_epochs,
                                                             seed=cfg.seed, progress=progress)}
    scorer.save(folder, notes={"warm_start": stats})
    return folder


LLM_JUDGE_VERSION = 1  #: bump when the judge's listwise recipe changes (cached judges are then retrained)


def llm_judge_dir(cfg: ProfileConfig) -> Path:
    """Where the profile's listwise-trained LLM judge is cached (a hash of what shapes it)."""
    key = cfg.fingerprint("world", "data", "retrieval", "search", "models", "lora", "seed")
    judge = hashlib.sha1(json.dumps(dataclasses.asdict(cfg.training.llm_judge), sort_keys=True).encode()).hexdigest()[:8]
    return cache_dir() / "llm_judge" / f"v{LLM_JUDGE_VERSION}-{key}-{judge}"


def llm_judge_start(cfg: ProfileConfig, retriever: SearchBackend | None, *, progress: bool = True) -> Path:
    """The LLM judge (``training.ranker_kind: llm_judge``) GRPO starts from, and the Fixed Ranker of
    that kind: a fresh LoRA adapter on the ranker model trained listwise on the gold hops of the
    relevance training's split (``rl.listwise_training``), its held-out Hit@1 curve (the relevance
    training's held-out sub-queries) kept in ``llm_judge.json``. Trained on first use, then cached."""
    folder, jc = llm_judge_dir(cfg), cfg.training.llm_judge
    if is_llm_judge_folder(folder):
        return folder
    seed_everything(cfg.seed)  # the LoRA A matrices' initialisation
    scorer = LLMJudgeScorer.from_model(cfg.models.ranker, cfg.lora, max_chars=jc.max_chars)
    stats: dict[str, Any] = {"trained_lists": 0}
    if jc.examples:
        qa = corpus_paths(cfg).qa
        if retriever is None or cfg.relevance.split not in qa:
            raise ValueError(f"the LLM judge of {cfg.profile!r} must be trained: it needs a retriever and the "
                             f"{cfg.relevance.split!r} split (have {sorted(qa)})")
        train = sub_query_lists(gold_sub_queries(load_qa(qa[cfg.relevance.split])), retriever, cfg.search.topn)
        held = sub_query_lists(relevance_held_out(cfg), retriever, cfg.search.topn)
        recipe = ListwiseRecipe(examples=jc.examples, batch=jc.batch, negatives=jc.negatives, lr=jc.listwise_lr,
                                eval_every=max(jc.examples // 2, 1) if held else 0, patience=0)
        stats = train_listwise(scorer, train, held, recipe, seed=cfg.seed, progress=progress)
        stats.pop("held_out_hits")
    scorer.save(folder, notes={"listwise": stats, "settings": dataclasses.asdict(jc)})
    return folder


def scoring_ranker_start(cfg: ProfileConfig, retriever: SearchBackend | None, *, progress: bool = True) -> Path:
    """The scoring ranker of ``training.ranker_kind`` (cross-encoder or LLM judge) a run starts from."""
    start = llm_judge_start if cfg.training.ranker_kind == "llm_judge" else cross_encoder_start
    return start(cfg, retriever, progress=progress)


def policy_starts(cfg: ProfileConfig, retriever: SearchBackend | None, *, progress: bool = True) -> dict[str, Path]:
    """Where every policy of the profile starts: the warm-started adapters (:func:`warm_start`) and,
    with a scoring ``training.ranker_kind``, that ranker (:func:`scoring_ranker_start`) as ``cross_encoder``.
    What :func:`evaluate_before_after` evaluates as "before GRPO"."""
    starts = dict(warm_start(cfg, retriever, progress=progress))
    if cfg.training.ranker_kind in SCORING_RANKER_KINDS:
        starts["cross_encoder"] = scoring_ranker_start(cfg, retriever, progress=progress)
    return starts


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
        retriever = retriever or build_retriever(cfg, progress=progress)
        for method in methods:
            method_starts(cfg, retriever, method, progress=progress)
    dp.barrier()
    retriever = retriever or build_retriever(cfg, progress=False)  # the other ranks: from the cache
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
                    progress: bool = True) -> dict[str, str | None]:
    """HarnessConfig adapter fields for a policy source: ``"base"`` (the models as shipped, no adapters)
    or ``"warmstart"`` (the profile's warm-started agent and the paper's Fixed Ranker: the
    relevance-trained ranker with ``relevance.enabled``, else the warm-started one; trained on first
    use, then cached). ``agent_adapter`` (a folder) replaces the agent whatever the source."""
    if source not in POLICY_SOURCES:
        raise ValueError(f"unknown policy source {source!r}; expected one of {POLICY_SOURCES}")
    fields: dict[str, str | None] = {"agent_adapter": None, "fixed_ranker_adapter": None}

    if source == "warmstart":  # a profile without a warm start gets the base models
        warm = method_starts(cfg, retriever, "fixed_ranker", progress=progress)
        fields = {"agent_adapter": path_text(warm.get("agent")), "fixed_ranker_adapter": path_text(warm.get("ranker"))}
    if agent_adapter:
        if not Path(agent_adapter).is_dir():
            raise FileNotFoundError(f"agent adapter folder {agent_adapter} does not exist")
        fields["agent_adapter"] = str(agent_adapter)
    return fields


# --------------------------------------------------------------------------- from a profile


def harness_config(cfg: ProfileConfig, **overrides: Any) -> HarnessConfig:
    """The :class:`HarnessConfig` a profile describes: split, questions, samples and temperature from its
    ``evaluation`` section, token and search budgets from ``rollout``, N and K from ``retrieval``,
    the profile's seed. Keyword overrides (any HarnessConfig field) win, e.g. ``methods=[...]``."""
    ev, ro = cfg.evaluation, cfg.rollout
    fields = dict(split=ev.split, n_per_dataset=ev.n_per_dataset, n_samples=ev.n_samples, seed=cfg.seed,
                  temperature=ev.temperature, search=cfg.search, agent_max_new_tokens=ro.agent_max_new_tokens,
                  ranker_max_new_tokens=ro.ranker_max_new_tokens, answer_max_new_tokens=ev.answer_max_new_tokens,
                  max_context_tokens=ro.max_context_tokens, rules=ro.rules, f1=ev.f1,
                  baseline_reply=ev.baseline_reply)
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(HarnessConfig)})
    if unknown:
        raise TypeError(f"unknown HarnessConfig field(s) {unknown}")
    return HarnessConfig(**{**fields, **overrides})


def vllm_options(cfg: ProfileConfig) -> dict[str, Any]:
    """:meth:`VLLMBackend.from_model` options of the profile (``models.vllm``), one set for every
    stage, so that training, relevance training and evaluation share one engine per process."""
    ro = cfg.rollout
    longest = ro.max_context_tokens + max(ro.agent_max_new_tokens, ro.ranker_max_new_tokens)
    return {**cfg.models.vllm.engine_kwargs(longest), "max_lora_rank": vllm_max_lora_rank(cfg.lora.r), "seed": cfg.seed}


def build_backends(cfg: ProfileConfig, *, progress: bool = False) -> tuple[GenerationBackend, GenerationBackend]:
    """(agent backend, ranker backend) for the profile's ``models`` section. When agent and ranker
    name the same model they share one loaded backend (LoRA adapters tell the two policies apart)."""

    m = cfg.models
    kwargs = {**m.transformers_options(), "progress": progress} if m.backend == "transformers" else \
        vllm_options(cfg) if m.backend == "vllm" else {}
    agent = make_backend(m.backend, m.agent, **kwargs)
    ranker = agent if m.ranker == m.agent else make_backend(m.backend, m.ranker, **kwargs)
    return agent, ranker


def harness_context(cfg: ProfileConfig, retriever: SearchBackend, *, backends: tuple[Any, Any] | None = None,
                         progress: bool = False) -> HarnessContext:
    """A :class:`HarnessContext` for a profile: its models (:func:`build_backends`, unless
    ``backends`` are given), their chat templates, and ``retriever``."""
    agent, ranker = backends if backends is not None else build_backends(cfg, progress=progress)
    for role, backend in (("agent", agent), ("ranker", ranker)):
        if getattr(backend, "tokenizer", None) is None:
            raise ValueError(f"the {role} backend has no tokenizer; build it with one (VLLMBackend(tokenizer=...))")
    chat = ChatTokens(agent.tokenizer)
    ranker_chat = chat if ranker is agent else ChatTokens(ranker.tokenizer)
    return HarnessContext(agent_backend=agent, chat=chat, retriever=retriever, ranker_backend=ranker,
                       ranker_chat=ranker_chat, protocol=cfg.protocol)


def trained_eval_settings(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path]) -> dict[str, Any]:
    """HarnessConfig fields that evaluate a training method's policies (``eval.method_settings``):
    its spec's evaluation method, its agent adapter and its ranker; a frozen ranker is the
    warm-started one, as in training."""
    return policy_eval_settings(method_spec(method), adapters, warm.get("ranker"))


#: The ``method`` labels :func:`evaluate_before_after` gives: (before GRPO, after GRPO).
BEFORE_AFTER_LABELS = ("warm start", "after GRPO")


def evaluate_before_after(method: str, adapters: dict[str, str | Path], warm: dict[str, str | Path],
                          examples: Sequence[QAExample], ctx: HarnessContext, base_cfg: HarnessConfig, *, progress: bool = True,
                          labels: tuple[str, str] = BEFORE_AFTER_LABELS, before: bool = True) -> pd.DataFrame:
    """The method's evaluation (``base_cfg``: a HarnessConfig) with the warm-started policies (unless
    ``before`` is False: the cells of a grid share one warm start) and with the trained ones, on the
    same questions. The ``method`` column reads ``"<method>: <label>"``; the harness's own method name
    stays in ``eval_method``."""

    frames = []
    warm_adapters = {role: warm[role] for role in ("agent", "ranker", "cross_encoder") if role in warm}
    runs = list(zip(labels, (warm_adapters, adapters)))
    for label, chosen in runs if before else runs[1:]:
        fields = trained_eval_settings(method, chosen, warm)
        ecfg = replace(base_cfg, **fields)
        records = run_evaluation(None, examples, ctx, ecfg, progress=progress, label=f"{method}: {label}")
        frames.append(records.assign(eval_method=records["method"], method=f"{method}: {label}"))
    return pd.concat(frames, ignore_index=True)


def before_after_pairs(methods: Sequence[str], labels: tuple[str, str] = BEFORE_AFTER_LABELS) -> list[tuple[str, str]]:
    """The (a, b) comparisons of :func:`evaluate_before_after` records, as ``method`` labels: each
    training method after GRPO against its own start, then the paper's findings among the trained
    methods present, all trained for the same steps on the same questions: Oracle - Retrieval Only
    (the gap: ``oracle`` vs ``search_r1``), Fixed Ranker - Retrieval Only, CoSearch - Fixed Ranker and
    CoSearch - Retrieval Only."""
    before, after = labels
    pairs = [(f"{m}: {after}", f"{m}: {before}") for m in methods]
    findings = (("oracle", "search_r1"), ("fixed_ranker", "search_r1"), ("cosearch", "fixed_ranker"), ("cosearch", "search_r1"))
    pairs += [(f"{a}: {after}", f"{b}: {after}") for a, b in findings if a in methods and b in methods]
    return pairs
