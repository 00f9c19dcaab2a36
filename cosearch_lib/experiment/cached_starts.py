"""Where each policy starts, trained on first use and then cached by the settings that shape it:
the warm-started adapters (``warm_start``), the generative ranker's relevance training
(``relevance_ranker``), the scoring rankers' starts (``cross_encoder_start``, ``llm_judge_start``),
the Fixed Ranker of the profile's ranker kind (``fixed_ranker``) and, per training method, the
policies it starts from (``method_starts``). One cache policy: a folder under ``data/cache/`` named
by a version and a hash of the settings, written atomically, reused when complete."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import LLMRanker, RetrievalOnlyRanker, ScorerPolicyRanker
from cosearch_lib.atomic_io import write_json
from cosearch_lib.config import SCORING_RANKER_KINDS, CrossEncoderConfig, ModelsConfig, ProfileConfig
from cosearch_lib.config.methods import RankedBy, method_spec
from cosearch_lib.data.qa_formats import load_qa
from cosearch_lib.eval.harness import register_adapter, select_examples
from cosearch_lib.experiment.building import build_backends, policy_engine, vllm_options
from cosearch_lib.models.autocast import cpu_bf16_stage
from cosearch_lib.models.cross_encoder import MARKER as CROSS_ENCODER_MARKER
from cosearch_lib.models.cross_encoder import CrossEncoderScorer
from cosearch_lib.models.generation.contract import GenerationBackend
from cosearch_lib.models.llm_judge import LLMJudgeScorer, is_llm_judge_folder
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.models.policy_loading import load_policy_model
from cosearch_lib.models.registry import load_causal_lm, load_tokenizer
from cosearch_lib.models.scoring_rankers import is_scoring_ranker_folder, load_scoring_ranker
from cosearch_lib.paths import cache_dir, path_text, project_relative
from cosearch_lib.retrieval.artifacts import corpus_paths, prepared_relevance_set, relevance_set_path
from cosearch_lib.retrieval.relevance_sets import read_relevance_set
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.listwise_training import ListwiseRecipe, sub_query_lists, train_listwise
from cosearch_lib.rl.ranker_validation import RankerValidationSet, gold_sub_queries
from cosearch_lib.rl.relevance_training import RelevanceInputs, RelevanceTrainer, prepared_items
from cosearch_lib.rl.scorer_policy import relevance_lists, warm_start_cross_encoder
from cosearch_lib.rl.warm_start import POLICY_ROLES, WARMSTART_VERSION, build_gold_data, train_sft
from cosearch_lib.run_schema import SCORER_SLOT, clear_run
from cosearch_lib.seeding import seed_everything


def warmstart_dir(cfg: ProfileConfig) -> Path:
    """Where the profile's warm-start adapters are cached (a hash of everything that shapes them).
    The generation engine (``models.backend``, ``models.vllm``) is not part of it: the gold data and
    the supervised training never generate, so ``ci_vllm`` shares ``ci``'s warm start. ``warmstart.autocast``
    counts only where bf16 runs (:func:`models.autocast.cpu_bf16_stage`): on a CPU without bf16 instructions, or on
    a GPU, the key is float32's, or the GPU's, as if it were unset."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    if not cpu_bf16_stage(cfg.warmstart.autocast):  # float32 runs here: float32's key
        cfg = dataclasses.replace(cfg, warmstart=dataclasses.replace(cfg.warmstart, autocast=None))
    key = _without_engine(cfg).fingerprint("world", "data", "retrieval", "search", "protocol", "models", "warmstart", "lora", "seed")
    return cache_dir() / "warmstart" / f"v{WARMSTART_VERSION}-{key}"


def _default_engine() -> tuple[str, Any]:
    """The generation engine's default settings: ``models.backend`` and ``models.vllm``."""
    default = ModelsConfig()
    return default.backend, default.vllm


def _without_engine(cfg: ProfileConfig) -> ProfileConfig:
    """``cfg`` with the generation engine's settings at their defaults (the same hash as before for a
    profile that sets none)."""
    backend, vllm = _default_engine()
    return replace(cfg, models=replace(cfg.models, backend=backend, vllm=vllm))


def _engine_shaping(cfg: ProfileConfig) -> dict[str, Any]:
    """The generation engine, for the key of a start that samples on it (the generative ranker's
    relevance GRPO); {} on the default engine, so that its keys stay as they were."""
    if (cfg.models.backend, cfg.models.vllm) == _default_engine():
        return {}
    return {"engine": [cfg.models.backend, dataclasses.asdict(cfg.models.vllm)]}


def warm_roles(cfg: ProfileConfig) -> tuple[str, ...]:
    """The roles :func:`warm_start` trains by default: both, or only the agent when a scoring ranker
    (``training.ranker_kind``: the LLM judge, the cross-encoder) ranks in place of a generative ranker
    adapter, which no method would then read; a role given no gold sequences (``warmstart.n_agent``
    or ``n_ranker`` of 0) starts from the model as shipped."""
    roles = ("agent",) if cfg.training.ranker_kind in SCORING_RANKER_KINDS else POLICY_ROLES
    sizes = {"agent": cfg.warmstart.n_agent, "ranker": cfg.warmstart.n_ranker}
    return tuple(r for r in roles if sizes[r] > 0)


def warm_start(cfg: ProfileConfig, retriever: SearchBackend | None, *, roles: Sequence[str] | None = None, force: bool = False,
               progress: bool = True) -> dict[str, Path]:
    """The profile's warm-started adapters, {role: folder}, for ``roles`` (None: :func:`warm_roles`):
    trained on first use, then loaded from :func:`warmstart_dir`; {} when ``cfg.warmstart.enabled``
    is false. The agent adapter is trained on the agent model, the ranker adapter on the ranker
    model (``cfg.models``); the gold data is built once for both roles. A role given no gold
    sequences (``n_agent`` or ``n_ranker`` of 0) has no warm start and is left out. ``retriever`` may
    be None when every adapter is cached (nothing to train)."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    roles = warm_roles(cfg) if roles is None else roles
    for role in roles:
        if role not in POLICY_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {POLICY_ROLES}")
    sizes = {"agent": cfg.warmstart.n_agent, "ranker": cfg.warmstart.n_ranker}
    roles = [r for r in roles if sizes[r] > 0]  # no gold sequences: the role starts from the model as shipped
    if not cfg.warmstart.enabled:
        return {}
    root = warmstart_dir(cfg)
    todo = [r for r in roles if force or not (root / r / "adapter_config.json").exists()]
    if todo:
        if retriever is None:
            raise ValueError(f"the warm start of {cfg.profile!r} must train {todo} and needs a retriever")
        ws = cfg.warmstart
        data, stats = gold_data(cfg, retriever, n_agent=ws.n_agent if "agent" in todo else 0,
                                n_ranker=ws.n_ranker if "ranker" in todo else 0)
        root.mkdir(parents=True, exist_ok=True)
        (root / "gold_data.json").write_text(json.dumps(stats.to_dict(), indent=2))
        for role in todo:
            model, tokenizer = load_causal_lm(policy_model_names(cfg)[role])
            train_sft(model, tokenizer, data[role], ws, cfg.lora, root / role, seed=cfg.seed, progress=progress)
    return {role: root / role for role in roles}


def policy_model_names(cfg: ProfileConfig) -> dict[str, str]:
    """{role: model name} of the two policies (``models.agent``, ``models.ranker``)."""
    return {"agent": cfg.models.agent, "ranker": cfg.models.ranker}


def gold_data(cfg: ProfileConfig, retriever: SearchBackend, *, n_agent: int, n_ranker: int) -> tuple[dict, Any]:
    """The profile's gold warm-start sequences (``rl.warm_start.build_gold_data`` on its ``warmstart.split``,
    with its warm-start settings and N), the first ``n_agent`` agent trajectories and ``n_ranker`` rankings;
    (sequences by role, the build's counts). ``cfg`` as the starts see it (:meth:`ProfileConfig.for_starts`)."""
    ws = cfg.warmstart
    qa_path = corpus_paths(cfg).qa.get(ws.split)
    if qa_path is None:
        raise ValueError(f"profile {cfg.profile!r} has no {ws.split!r} split for the warm start")
    chats = {role: ChatTokens(load_tokenizer(name)) for role, name in policy_model_names(cfg).items()}
    return build_gold_data(load_qa(qa_path), retriever, chats["agent"], cfg.protocol, topn=cfg.search.topn,
                           n_agent=n_agent, n_ranker=n_ranker, seed=cfg.seed, balance_hops=ws.balance_hops,
                           reasoning=ws.reasoning, ranker_chat=chats["ranker"], ranker_candidates=ws.ranker_candidates)


#: Bump when the relevance training's recipe changes, so cached Fixed Rankers are not reused.
RELEVANCE_VERSION = 1


#: The training methods whose frozen ranker is the relevance-trained one (when ``relevance.enabled``).
FIXED_RANKER_METHODS = ("fixed_ranker",)


def relevance_dir(cfg: ProfileConfig) -> Path:
    """Where the profile's relevance-trained ranker (the Fixed Ranker) and its run are cached: a hash of
    the warm start's key, the ``relevance`` section, the ranker's generation settings and the
    generation engine its GRPO samples on (when not the default)."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    ro = cfg.rollout
    shaping = {"warmstart": warmstart_dir(cfg).name, "relevance": cfg.fingerprint("relevance"),
               "ranker": [ro.ranker_max_new_tokens, ro.top_p, ro.rules.ranker_output],
               "max_grad_norm": cfg.training.max_grad_norm, **_engine_shaping(cfg)}
    if cfg.relevance.source == "prepared":  # the set's content, wherever its file lies
        done = prepared_relevance_set(cfg)
        shaping["relevance_set"] = done["sha256"] if done else None
    key = hashlib.sha1(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "relevance" / f"v{RELEVANCE_VERSION}-{key}"


def relevance_ranker(cfg: ProfileConfig, retriever: SearchBackend | None, *, force: bool = False,
                     progress: bool = True) -> Path | None:
    """The profile's relevance-trained ranker adapter (``rl.relevance_training``), or None when
    ``relevance.enabled`` is false. Trained on first use from the warm-started ranker, then loaded
    from :func:`relevance_dir`; an interrupted training resumes from its newest checkpoint there
    (``run/``, which also keeps its records). ``retriever`` may be None when it is cached."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    rc = cfg.relevance
    if not rc.enabled:
        return None
    root = relevance_dir(cfg)
    final = root / "ranker"
    if (final / "adapter_config.json").exists() and not force:
        return final
    prepared = None
    if rc.source == "prepared":
        if prepared_relevance_set(cfg) is None:
            raise FileNotFoundError(
                f"relevance.source is 'prepared' but {project_relative(relevance_set_path(cfg))} is missing or was made "
                f"with other settings: run `cosearch prepare-relevance --profile {cfg.profile}` first")
        prepared = prepared_items(read_relevance_set(relevance_set_path(cfg), topn=cfg.search.topn))
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
    prompts = [] if prepared is not None else gold_sub_queries(load_qa(qa[rc.split]))
    inputs = RelevanceInputs(policies, tokenizer, retriever, prompts, relevance_held_out(cfg),
                             ro, cfg.protocol, backend=policy_engine(cfg, model, tokenizer, backend),
                             training=cfg.training, items=prepared)
    trainer = RelevanceTrainer(rc, inputs, out_dir=root / "run", seed=cfg.seed, progress=progress)
    if force:
        clear_run(root / "run")
    elif trainer.load_checkpoint():
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
    ``None`` is the retriever's order, a saved scoring ranker its greedy top-K, a folder a ranker
    adapter ranking greedily with the profile's ranker model (``backend``: the profile's ranker backend by default)."""
    items = RankerValidationSet(relevance_held_out(cfg), retriever, topn=cfg.search.topn, topk=cfg.search.topk)
    out: dict[str, list[dict[str, Any]]] = {}
    for label, adapter in rankers.items():
        if adapter is None:
            out[label] = items.score_items(RetrievalOnlyRanker())
            continue
        if is_scoring_ranker_folder(adapter):  # a scoring ranker (LLM judge, cross-encoder): its greedy top-K
            out[label] = items.score_items(ScorerPolicyRanker(load_scoring_ranker(adapter), temperature=0.0, seed=cfg.seed))
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
    spec = method_spec(method)
    # only the roles the method starts from: Retrieval Only and the Oracle read no ranker, so on a fresh
    # machine their training does not build the ranker's warm start or the LLM judge (~15 min on 2 cores)
    starts = policy_starts(cfg, retriever, roles=spec.warm_start, progress=progress)
    takes_relevance = method in FIXED_RANKER_METHODS or (method == "cosearch" and cfg.relevance.cosearch_start == "relevance")
    # (a scoring ranker is relevance-trained by its own start: this GRPO is the generative ranker's)
    if cfg.relevance.enabled and takes_relevance and spec.ranked_by is RankedBy.POLICY \
            and cfg.training.ranker_kind == "llm":
        starts["ranker"] = relevance_ranker(cfg, retriever, progress=progress)
    return starts


def cross_encoder_dir(cfg: ProfileConfig, settings: CrossEncoderConfig | None = None) -> Path:
    """Where the cross-encoder ranker of ``settings`` (default the profile's) is cached, beside the warm start."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    ce = settings or cfg.training.cross_encoder
    key = hashlib.sha1(json.dumps(dataclasses.asdict(ce), sort_keys=True).encode()).hexdigest()[:12]
    return warmstart_dir(cfg) / f"cross_encoder-{key}"


def cross_encoder_start(cfg: ProfileConfig, retriever: SearchBackend | None, settings: CrossEncoderConfig | None = None, *,
                        progress: bool = True) -> Path:
    """The folder of the cross-encoder ranker GRPO starts from (``training.ranker_kind: cross_encoder``):
    ``settings.model`` with its head at zero, then (``warm_start_epochs`` > 0 and the profile's warm
    start enabled) trained listwise on the first ``warmstart.n_ranker`` gold hops of the warm start's
    split (``rl.scorer_policy``). Built on first use, then cached beside the profile's warm start."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    ce = settings or cfg.training.cross_encoder
    folder = cross_encoder_dir(cfg, ce)
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
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
    key = cfg.fingerprint("world", "data", "retrieval", "search", "models", "lora", "seed")
    judge = hashlib.sha1(json.dumps(dataclasses.asdict(cfg.training.llm_judge), sort_keys=True).encode()).hexdigest()[:8]
    return cache_dir() / "llm_judge" / f"v{LLM_JUDGE_VERSION}-{key}-{judge}"


def llm_judge_start(cfg: ProfileConfig, retriever: SearchBackend | None, *, progress: bool = True) -> Path:
    """The LLM judge (``training.ranker_kind: llm_judge``) GRPO starts from, and the Fixed Ranker of
    that kind: a fresh LoRA adapter on the ranker model trained listwise on the gold hops of the
    relevance training's split (``rl.listwise_training``), its held-out Hit@1 curve (the relevance
    training's held-out sub-queries) kept in ``llm_judge.json``. Trained on first use, then cached."""
    cfg = cfg.for_starts()  # N of the starts (warmstart.topn)
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
                                eval_every=jc.examples if held else 0, patience=0)
        stats = train_listwise(scorer, train, held, recipe, seed=cfg.seed, progress=progress)
        stats.pop("held_out_hits")
    scorer.save(folder, notes={"listwise": stats, "settings": dataclasses.asdict(jc)})
    return folder


@dataclass(frozen=True)
class RankerStart:
    """Where a ranker kind (``config.RANKER_KINDS``) starts, and its Fixed Ranker: the folder it is
    cached in, how it is built on first use, and whether it can be loaded without building it (and so
    without a retriever)."""

    folder: Callable[[ProfileConfig], Path]
    build: Callable[..., Path | None]  # (cfg, retriever, *, progress) -> its folder (None: nothing to build)
    is_cached: Callable[[ProfileConfig], bool]


#: Each ranker kind's start, by ``training.ranker_kind``. The generative ranker's Fixed Ranker is its
#: relevance training (None with ``relevance.enabled`` false: the warm-started ranker is then the
#: Fixed Ranker); a scoring kind's start is its Fixed Ranker, trained listwise.
RANKER_STARTS: dict[str, RankerStart] = {
    "llm": RankerStart(relevance_dir, relevance_ranker, lambda cfg: not cfg.relevance.enabled
                       or (relevance_dir(cfg) / "ranker" / "adapter_config.json").exists()),
    "cross_encoder": RankerStart(cross_encoder_dir, cross_encoder_start,
                                 lambda cfg: (cross_encoder_dir(cfg) / CROSS_ENCODER_MARKER).exists()),
    "llm_judge": RankerStart(llm_judge_dir, llm_judge_start, lambda cfg: is_llm_judge_folder(llm_judge_dir(cfg))),
}


def fixed_ranker(cfg: ProfileConfig, retriever: SearchBackend | None, *, progress: bool = True) -> Path | None:
    """The profile's Fixed Ranker, frozen in training: its ranker kind's start (:data:`RANKER_STARTS`)."""
    return RANKER_STARTS[cfg.training.ranker_kind].build(cfg, retriever, progress=progress)


def fixed_ranker_cached(cfg: ProfileConfig) -> bool:
    """Whether :func:`fixed_ranker` can load the profile's Fixed Ranker without training it (and so
    without a retriever)."""
    return RANKER_STARTS[cfg.training.ranker_kind].is_cached(cfg)


def policy_starts(cfg: ProfileConfig, retriever: SearchBackend | None, *, roles: Sequence[str] = POLICY_ROLES,
                  progress: bool = True) -> dict[str, Path]:
    """Where the policies of ``roles`` start (default every role of the profile): the warm-started
    adapters (:func:`warm_start`) and, for the ranker with a scoring ``training.ranker_kind``, that
    ranker's start (:func:`fixed_ranker`) as ``run_schema.SCORER_SLOT``. What :func:`evaluate_before_after`
    evaluates as "before GRPO"."""
    starts = dict(warm_start(cfg, retriever, roles=[r for r in warm_roles(cfg) if r in roles], progress=progress))
    if "ranker" in roles and cfg.training.ranker_kind in SCORING_RANKER_KINDS:
        starts[SCORER_SLOT] = fixed_ranker(cfg, retriever, progress=progress)
    return starts
