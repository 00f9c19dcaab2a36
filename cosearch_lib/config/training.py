"""How a joint GRPO run trains: the methods and who plays which role, the trainable cross-encoder,
live tracking, the run's settings (:class:`TrainConfig`) and the supervised warm start before it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace

from cosearch_lib.config.checks import KEYED_WHEN_SET, LOCATION_ONLY, SHARED, SPEED_ONLY, ConfigError, Fields, invalid
from cosearch_lib.config.grpo import MICRO_BATCHED_AGGREGATIONS, AgentRewardConfig, GroupingConfig, GRPOConfig, RankerRewardConfig
from cosearch_lib.config.methods import MethodSpec, method_spec
from cosearch_lib.config.ranker_kinds import RANKER_KINDS, SCORING_RANKER_KINDS, ranker_kind
from cosearch_lib.config.rules import RuleSet, check_same_rules, rule_set


@dataclass
class CrossEncoderConfig:
    """The trainable cross-encoder of ``training.ranker_kind: cross_encoder`` (Table 3's ablation)."""

    model: str = "all-minilm-l6-v2"  # the encoder it starts from (bundled name, local folder or hub id)
    lr: float = 2e-5  # AdamW learning rate of the encoder, warm start and GRPO
    head_lr: float = 1e-3  # of the scoring head (it starts at zero; at the encoder's rate it barely moves: measured, docs/LOG.md)
    max_length: int = 192  # tokens of one (sub-query, passage) pair
    warm_start_epochs: int = 2  # listwise passes over warmstart.n_ranker gold hops before GRPO (0: none)

    def __post_init__(self) -> None:
        check = Fields("training.cross_encoder", self)
        check.numbers("lr", "head_lr", low=0, low_open=True)
        check.ints("max_length", minimum=8)
        check.ints("warm_start_epochs", minimum=0)


@dataclass
class LLMJudgeConfig:
    """The ranker LLM as a pointwise judge (``training.ranker_kind: llm_judge``, ``models.llm_judge``):
    before GRPO it is trained listwise on the gold hops of the warm start's split
    (``rl.listwise_training``), the recipe chosen on the dev split by its held-out Hit@1 curve
    (docs/LOG.md, issue 35; ``benchmarks/ranker_recipes.py``)."""

    lr: float = 1e-4  # AdamW learning rate of the judge's LoRA under GRPO
    max_chars: int = 160  # characters of a candidate's first sentence the judge reads (its title too)
    examples: int = 600  # gold lists of the listwise training before GRPO (0: none, the base model's own margins); laptop world: held-out Hit@1 0.806 at 600 (retriever 0.500), docs/LOG.md
    negatives: int = 3  # non-relevant candidates sampled beside one relevant one per training list
    batch: int = 4  # lists per optimizer step of the listwise training
    listwise_lr: float = 5e-4  # AdamW learning rate of the listwise training (LoRA)

    def __post_init__(self) -> None:
        check = Fields("training.llm_judge", self)
        check.numbers("lr", "listwise_lr", low=0, low_open=True)
        check.ints("max_chars", "batch", minimum=1)
        check.ints("examples", "negatives", minimum=0)


#: Tracker kinds -> the pip package each needs.
TRACKER_KINDS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_kinds(kinds: Sequence[str] | str) -> tuple[str, ...]:
    """``kinds`` as a tuple of known tracker kinds (a single string is one kind); ConfigError otherwise."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in kinds if k not in TRACKER_KINDS]
    if unknown:
        raise ConfigError(f"unknown tracker kind(s) {unknown}; expected any of {tuple(TRACKER_KINDS)}")
    return tuple(dict.fromkeys(kinds))


@dataclass(frozen=True)
class UpdateSettings:
    """How one GRPO update of an adapter runs (``rl.policy_update.grpo_update``): the loss, and the
    knobs that change memory and speed but not the maths (the length grouping, the shared prefix and
    checkpointing give the same gradient). Built by :meth:`TrainConfig.update_settings` and
    :meth:`RelevanceConfig.update_settings`, so both trainers read one set of fields."""

    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # clip range, KL weight, aggregation
    micro_batch: int = 4  # sequences per forward/backward pass
    max_grad_norm: float = 1.0  # gradient clipping (0 = off)
    minibatches: int = 1  # optimizer steps per update, each on a slice of the sequences
    length_grouped: bool = True  # micro-batches of sequences of similar length
    gradient_checkpointing: bool = False  # recompute activations in the backward pass
    shared_prefix: bool = True  # run the prompt prefix the sequences share once per optimizer step
    recompute_old: bool = False  # the ratio's old log-probs from the trainer, not the rollout engine


#: The configs of a run that read the rule set (built with the run's, or checked against it).
_RULED = {"agent_reward": AgentRewardConfig, "ranker_reward": RankerRewardConfig, "grouping": GroupingConfig}


@dataclass
class AutocastConfig:
    """bfloat16 autocast of the GRPO phase on a CPU (``training.autocast``; issue 48, item 5): a speed setting
    whose numerics the step records check. Only on a CPU with avx512_bf16 or AMX (float32 elsewhere, said
    in a warning); weights, LoRA weights and AdamW states stay float32. Validation always runs in float32, so
    the curves read every policy alike, whatever it trained in; so do the test evaluations, unless the profile's
    ``evaluation.bf16_weights`` asks for bf16 copies of the weights there."""

    rollout: bool = True  # the training rollouts' forward passes: agent turns, generative ranker calls, the LLM judge's scores
    update: bool = True  # the GRPO update's forward and backward passes (its recomputed old log-probs too)
    # Bound on the update's mean |trainer log p - rollout log p| over scored tokens (loss/<role>_logp_drift_mean):
    # a step above it turns autocast off, both stages, for the rest of the run (the records say from which step).
    # 0.05 is what the paper's own path lives with: a bf16 vLLM engine against the trainer (~0.04, run_schema).
    max_drift: float = 0.05
    # With rollout: every generation of the rollout (the agent's turns, the generative ranker's calls, the LLM-as-judge
    # ablation's labels) decodes with bf16 copies of the weights, each adapter merged into its copy once per rollout
    # (TransformersBackend.bf16_scope), instead of autocast's cast of every weight at every call; what is scored by a
    # forward pass, not decoded (the llm_judge ranker's scores), stays under autocast. Null: autocast alone.
    bf16_weights: bool | None = field(default=None, metadata=KEYED_WHEN_SET)

    def __post_init__(self) -> None:
        check = Fields("training.autocast", self)
        check.bools("rollout", "update")
        if self.bf16_weights is not None:
            check.bools("bf16_weights")
            self.bf16_weights = self.bf16_weights or None  # false is null: one key for one computation
            if self.bf16_weights and not self.rollout:
                raise ConfigError("training.autocast.bf16_weights decodes the rollouts in bf16: it needs rollout: true")
        check.numbers("max_drift", low=0, low_open=True, why="nats per token")


@dataclass
class TrainConfig:
    """One training run. The rule set (``rules``, a RuleSet or its name; the profile's top-level
    ``rules:``) reaches the reward and grouping configs by construction: those left out are built
    with it, those given must already hold it. ``cfg.rules`` is that rule set afterwards (not a
    field: the nested configs record it)."""

    method: str = "cosearch"  # a training method of config.methods.METHODS: what ranks, what trains
    steps: int = 100  # training steps (paper: ~100)
    questions_per_step: int = 8  # questions rolled out per step (paper: 512)
    group_size: int = 8  # G: rollouts per question (paper: 8)
    split: str = "train"  # QA split the questions come from
    families: tuple[str, ...] = ()  # train on these families' questions only (data_source values, or "single" / "multi" for the paper's hop groups); empty: every family. Validation reads every family
    agent_lr: float = 1e-5  # AdamW learning rate of the agent's LoRA (paper, full fine-tuning: 1e-6)
    ranker_lr: float = 1e-5  # AdamW learning rate of the ranker's LoRA
    minibatches: int = 1  # optimizer steps per training step, each on a slice of the step's sequences
    micro_batch: int = 4  # sequences per forward/backward pass (memory, not maths)
    length_grouped_micro_batches: bool = True  # build micro-batches from sequences of similar length (less padding; same gradient)
    gradient_checkpointing: bool = False  # recompute activations in the update's backward pass: trades recompute for activation memory; needed for 3B-7B shapes on one GPU
    shared_prefix_update: bool = field(default=True, metadata=SPEED_ONLY)  # the prompt prefix a role's sequences share runs once per optimizer step, not once per sequence (same gradient); off under gradient checkpointing
    max_grad_norm: float = 1.0  # gradient clipping per adapter (0 = off)
    shared_backbone: bool = False  # ablation: one adapter plays both roles
    ranker_kind: str = "llm"  # what plays the ranker policy (config.RANKER_KINDS): "llm", the generative ranker (paper); "cross_encoder", a trainable cross-encoder (ablation); "llm_judge", the ranker LLM judging each candidate (issue 35)
    cross_encoder: CrossEncoderConfig = field(default_factory=CrossEncoderConfig)  # used with ranker_kind cross_encoder
    llm_judge: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)  # used with ranker_kind llm_judge
    eval_every: int = 20  # E: validation (agent F1, ranker Hit@k on held-out sub-queries) every E steps (and after the last); 0 = never
    validate_at_start: bool = False  # also validate before the first update: a step -1 row of the step records (the starting point of the curves)
    val_split: str = "dev"  # split of the validation questions
    val_per_dataset: int = 5  # validation questions per family
    checkpoint_every: int = 1  # steps between checkpoints (0 = only after the last step)
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    grpo: GRPOConfig = field(default_factory=GRPOConfig)  # loss: clip range, KL weight, aggregation
    agent_reward: AgentRewardConfig = None  # Eq. 4 (None: built with the rule set)
    ranker_reward: RankerRewardConfig = None  # Eq. 6 / released variant (None: built with the rule set)
    grouping: GroupingConfig = None  # Alg. 2 and its ablations (None: built with the rule set)
    log_to: tuple[str, ...] = ()  # live logging of the step records: "tensorboard" and/or "wandb" (rl/tracking.py)
    wandb_project: str = "cosearch"  # W&B project of the runs (with "wandb" in log_to)
    # bf16 autocast of the rollouts and updates on a CPU with bf16 instructions (AutocastConfig); null: float32
    autocast: AutocastConfig | None = field(default=None, metadata=KEYED_WHEN_SET)
    rules: InitVar[RuleSet | str] = field(default="paper", metadata=SHARED)  # the rule set of the nested reward and grouping configs: the profile's ``rules``

    def update_settings(self, *, recompute_old: bool) -> UpdateSettings:
        """This run's :class:`UpdateSettings` (``recompute_old``: the trainer's choice of old log-probs)."""
        return UpdateSettings(grpo=self.grpo, micro_batch=self.micro_batch, max_grad_norm=self.max_grad_norm,
                              minibatches=self.minibatches, length_grouped=self.length_grouped_micro_batches,
                              gradient_checkpointing=self.gradient_checkpointing,
                              shared_prefix=self.shared_prefix_update, recompute_old=recompute_old)

    def __post_init__(self, rules: RuleSet | str) -> None:
        method_spec(self.method)  # a ConfigError listing the methods
        rules = rule_set(rules)
        self.rules = rules  # an attribute, not a field: dataclasses.replace hands it to the copy
        for name, cls in _RULED.items():
            if getattr(self, name) is None:
                setattr(self, name, cls(rules=rules))
            check_same_rules(f"training.{name}.rules", getattr(self, name).rules, rules, "training")
        check = Fields("training", self)
        check.ints("steps", "questions_per_step", "minibatches", "micro_batch", minimum=1)
        check.ints("group_size", minimum=2, why="GRPO compares samples")
        if self.grpo.aggregation not in MICRO_BATCHED_AGGREGATIONS:
            raise invalid("training.grpo.aggregation", self.grpo.aggregation, f"one of {MICRO_BATCHED_AGGREGATIONS} "
                          "(the trainer splits batches into micro-batches; this one's normaliser needs the whole batch)")
        check.ints("eval_every", "checkpoint_every", "keep_checkpoints", minimum=0)
        check.bools("length_grouped_micro_batches", "gradient_checkpointing", "shared_prefix_update", "validate_at_start")
        try:
            self.log_to = check_kinds(self.log_to)
        except ConfigError as err:
            raise ConfigError(f"training.log_to: {err}") from None
        check.choice("ranker_kind", tuple(RANKER_KINDS))
        families = self.families
        self.families = (families,) if isinstance(families, str) else tuple(str(f) for f in families)
        if self.ranker_kind in SCORING_RANKER_KINDS and self.shared_backbone:
            raise check.fail("shared_backbone", f"False with ranker_kind {self.ranker_kind!r} (a shared backbone plays "
                             "both roles with one generative LLM adapter)")
        check.strs("wandb_project")

    @property
    def spec(self) -> MethodSpec:
        """The method's record (config.methods): how it ranks, which roles it trains."""
        return method_spec(self.method)

    @property
    def ranking(self) -> str:
        """How the method ranks: "retrieval", "oracle" or "policy" (the ranker policy)."""
        return self.spec.ranked_by.value

    def roles(self) -> dict[str, str | None]:
        """role -> adapter name (None: the role is played by a rule or by the cross-encoder, not a LoRA adapter)."""
        ranker = "ranker" if self.spec.has_ranker_policy and not ranker_kind(self.ranker_kind).scoring else None
        if self.shared_backbone:
            return {"agent": "shared", "ranker": "shared" if ranker else None}
        return {"agent": "agent", "ranker": ranker}

    @property
    def uses_scoring_ranker(self) -> bool:
        """The method ranks with its ranker policy and that policy is a scoring ranker (the cross-encoder
        or the LLM judge: no generative ranker adapter)."""
        return self.spec.has_ranker_policy and self.ranker_kind in SCORING_RANKER_KINDS

    @property
    def scoring_ranker_lr(self) -> tuple[float, float | None]:
        """(learning rate, head learning rate: None without a separate head) of the scoring ranker's GRPO
        updates, from its kind's settings (``RankerKind.settings``)."""
        settings = getattr(self, ranker_kind(self.ranker_kind).settings)
        return settings.lr, getattr(settings, "head_lr", None)

    def trainable(self) -> set[str]:
        """The adapters GRPO updates: those playing a role the method trains."""
        roles = self.roles()
        return {roles[r] for r in self.spec.trains if roles[r]}


# --------------------------------------------------------------------------- supervised warm start


#: How the warm start's gold agent turns reason about the chain (``rl.warm_start``).
WARMSTART_REASONING = ("plan", "count")
#: The order a gold ranking lists its candidates in (WarmStartConfig.ranker_candidates).
RANKER_CANDIDATE_ORDERS = ("retriever", "shuffled")


@dataclass
class WarmStartConfig:
    enabled: bool = True  # False: no warm start (GRPO starts from the model as shipped, as the paper's 7B runs do)
    split: str = "train"  # QA split the gold data comes from
    n_agent: int = 256  # gold agent trajectories to train on
    n_ranker: int = 256  # gold rankings to train on
    balance_hops: bool = True  # take questions of each chain length in turn (rl.warm_start.hop_balanced), not in file order
    reasoning: str = "plan"  # the gold agent turns' reasoning: "plan" (list the chain's steps, then tick them off) or "count" ("search 2 of 3")
    ranker_candidates: str = "retriever"  # the candidates of a gold ranking in the retriever's order (as at run time) or "shuffled" (seeded, per hop): position then says nothing of relevance
    epochs: float = 1.0  # passes over each role's gold data
    learning_rate: float = 2e-4  # AdamW learning rate of the LoRA weights
    batch_size: int = 4  # sequences per optimizer step (per device)
    grad_accum: int = 1  # micro-batches accumulated per optimizer step
    warmup_ratio: float = 0.05  # linear warm-up share of the steps, then linear decay
    max_length: int = 4096  # sequences are cut to this many tokens (their start is kept)
    logging_steps: int = 5  # optimizer steps between logged losses
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory for large models, slower (TRL's default is on)
    # N of the starts: the retriever candidates the gold sequences here and the Fixed Rankers' training before
    # GRPO (LLM judge, cross-encoder, relevance GRPO) are built from; null: search.topn. A profile that changes N
    # for GRPO and the evaluation alone sets it to the N its starts were trained at, and shares them.
    topn: int | None = field(default=None, metadata=KEYED_WHEN_SET)
    # bf16 autocast of the supervised passes on a CPU with avx512_bf16 or AMX (float32 on a CPU without them, with a
    # warning; a GPU trains in bf16 whatever this says): the LoRA weights and AdamW's states stay float32. null or
    # false: float32 on a CPU. The cache key holds the precision that runs (experiment.cached_starts.warmstart_dir).
    autocast: bool | None = field(default=None, metadata=KEYED_WHEN_SET)

    def __post_init__(self) -> None:
        check = Fields("warmstart", self)
        check.ints("n_agent", "n_ranker", minimum=0)
        if self.autocast is not None:
            check.bools("autocast")
            self.autocast = self.autocast or None  # false is null: one key for one computation
        if self.topn is not None:
            check.ints("topn", minimum=1)
        check.bools("balance_hops", "enabled")
        check.choice("reasoning", WARMSTART_REASONING)
        check.choice("ranker_candidates", RANKER_CANDIDATE_ORDERS)
        check.ints("batch_size", "grad_accum", "max_length", "logging_steps", minimum=1)
        check.numbers("epochs", "learning_rate", low=0, low_open=True)
        if self.enabled:  # a schedule that cannot move an adapter is refused when the profile is read
            self.check_schedule(self.n_agent, "agent")
            self.check_schedule(self.n_ranker, "ranker")

    def schedule(self, n_rows: int) -> dict[str, int]:
        """The optimizer steps the warm start takes on ``n_rows`` sequences (as the Trainer counts
        them: batches per epoch, a last partial accumulation counted, times ``epochs``, rounded up),
        the warm-up steps of ``warmup_ratio``, and how many steps train at a learning rate above zero
        (a linear warm-up's first step runs at 0)."""
        batches = math.ceil(n_rows / self.batch_size)
        total = math.ceil(max(math.ceil(batches / self.grad_accum), 1) * self.epochs)
        warmup = math.ceil(self.warmup_ratio * total) if self.warmup_ratio < 1 else int(self.warmup_ratio)
        return {"steps": total, "warmup_steps": warmup, "effective_steps": total - (1 if warmup > 0 else 0)}

    def check_schedule(self, n_rows: int, role: str) -> None:
        """Refuse a warm start of ``n_rows`` sequences whose every optimizer step runs at learning rate 0."""
        plan = self.schedule(n_rows)
        if n_rows and plan["effective_steps"] < 1:
            raise ConfigError(
                f"warmstart: the {role} warm start has {n_rows} sequences, {plan['steps']} optimizer step(s) "
                f"(batch_size={self.batch_size}, grad_accum={self.grad_accum}, epochs={self.epochs}), and "
                f"warmup_ratio={self.warmup_ratio} runs the first step at learning rate 0: the adapter would stay "
                "at its initial value (lora_B = 0); set warmstart.warmup_ratio: 0 or train on more sequences")


#: r_rel of the ranker's relevance training (the joint reward's choices but the judge, which needs rollouts' labels).
RELEVANCE_REWARDS = ("hit", "ndcg")
#: Where the relevance training's prompts come from (RelevanceConfig.source).
RELEVANCE_SOURCES = ("gold_chains", "prepared")
#: What CoSearch's ranker adapter starts from when the relevance training is on (docs/METHOD.md).
COSEARCH_RANKER_STARTS = ("warmstart", "relevance")


@dataclass
class RelevanceConfig:
    """Relevance training of the ranker alone before joint training (``rl.relevance_training``):
    ranker-only GRPO on the training split's gold-chain hops with r_rel, from the warm-started
    ranker. The result, frozen, is the paper's Fixed Ranker. Off: the Fixed Ranker is the
    warm-started ranker itself (the project's earlier departure)."""

    enabled: bool = False  # train it (cached by its settings, like the warm start)
    steps: int = 60  # GRPO steps
    prompts_per_step: int = 8  # sub-queries per step; each is one group of group_size sampled rankings
    group_size: int = 8  # G samples of one prompt (paper's joint G: 8)
    lr: float = 1e-4  # AdamW learning rate of the ranker's LoRA
    temperature: float = 1.0  # sampling temperature of the rankings
    relevance: str = "hit"  # r_rel: "hit" (mean Hit@k over hit_ks, the paper's) or "ndcg" (nDCG@K against the N candidates)
    hit_ks: tuple[int, ...] = (1, 3, 5)  # Hit@k cutoffs averaged into r_rel
    invalid_penalty: float | None = -0.2  # reward of an output that breaks the protocol (the release's); None: score its retriever fallback
    source: str = "gold_chains"  # the prompts: "gold_chains" (every gold-chain hop of ``split``, searched at the start) or "prepared" (the paper's: ``prepared_path``, written by `cosearch prepare-relevance`)
    split: str = "train"  # the prompts' questions (the prepared set's too)
    query_sources: tuple[str, ...] = ()  # prepared: the data_source values whose questions are the queries (paper appendix: nq); empty: all
    n_queries: int = 0  # prepared: a seeded sample of that many queries before the unanswerable are dropped (0: all)
    prepared_path: str = field(default="relevance/relevance-set.jsonl.gz", metadata=LOCATION_ONLY)  # prepared: the set's file, relative to data.root
    val_split: str = "dev"  # the held-out sub-queries of the Hit@k curve
    val_per_dataset: int = 10  # validation questions per family
    eval_every: int = 10  # greedy Hit@k on the held-out sub-queries every E steps (0: none between), and always before the first and after the last
    micro_batch: int = 4  # sequences per forward/backward pass (memory, not maths)
    checkpoint_every: int = 5  # steps between checkpoints (0: after the last only); an interrupted run resumes
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(kl_coef=0.0))  # the loss (clip range, aggregation); no KL: the warm start is no reference worth staying near
    cosearch_start: str = "warmstart"  # CoSearch's ranker starts from "warmstart" (as the release starts from the instruct model) or "relevance" (the Fixed Ranker)

    def update_settings(self, training: TrainConfig, *, recompute_old: bool) -> UpdateSettings:
        """The relevance update's :class:`UpdateSettings`: its own loss and micro-batch, one optimizer
        step per training step, and the profile's ``training`` memory and speed knobs (clipping,
        length grouping, shared prefix, gradient checkpointing), as the joint update runs them."""
        return replace(training.update_settings(recompute_old=recompute_old), grpo=self.grpo,
                       micro_batch=self.micro_batch, minibatches=1)

    def __post_init__(self) -> None:
        check = Fields("relevance", self)
        check.bools("enabled")
        check.ints("steps", "prompts_per_step", "micro_batch", minimum=1)
        check.ints("group_size", minimum=2, why="GRPO compares samples")
        check.ints("eval_every", "checkpoint_every", "val_per_dataset", minimum=0)
        check.numbers("lr", "temperature", low=0, low_open=True)
        check.choice("relevance", RELEVANCE_REWARDS)
        check.choice("cosearch_start", COSEARCH_RANKER_STARTS)
        check.choice("source", RELEVANCE_SOURCES)
        check.ints("n_queries", minimum=0)
        sources = self.query_sources
        self.query_sources = (sources,) if isinstance(sources, str) else tuple(str(s) for s in sources)
        if self.invalid_penalty is not None:
            check.numbers("invalid_penalty")
        self.hit_ks = check.positive_ints("hit_ks")
