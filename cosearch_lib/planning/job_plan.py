"""``cosearch plan``: what a profile's training needs and costs on a cluster shape, before the queue.

A plan multiplies a **workload** (the profile's settings, plus the behaviour they cannot fix:
searches per trajectory, tokens per turn; ``planning.step_work``) by **measured throughputs**
(``planning.throughputs``: the H100 figures of ``docs/GPU_COSTS.md``, this machine's CPU
benchmark) and by the **model shapes** (``planning.model_shapes``). It gives:

* per rank: GPU memory by part (weights, LoRA adapters with their gradients and Adam state, the
  generation engine's KV cache, activations of the update's micro-batch with and without gradient
  checkpointing), and whether they fit;
* per node: host memory (the ranks, the retrieval server's index and corpus) and disk (data, index,
  models, checkpoints at ``training.keep_checkpoints``);
* time: seconds per step by stage (rollout generation, ranker calls, retrieval, update, validation),
  steps per job at the time limit, GPU-hours per method and per grid cell;
* :attr:`JobPlan.refusals`: what cannot fit or finish, each with its numbers and the setting to
  change (what ``cosearch slurm train`` and ``cosearch grid --slurm`` refuse before ``sbatch``).

Data parallel (``rl.data_parallel``): every rank holds the whole model and rolls out and trains
``1/R`` of a step's questions; the ranks add the LoRA gradients' all-reduce and the exchange of the
step's rollouts (bandwidths below, assumed, not measured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from cosearch_lib.config import ConfigError, ProfileConfig
from cosearch_lib.config.methods import TRAINING_METHODS, method_spec
from cosearch_lib.config.ranker_kinds import ranker_kind
from cosearch_lib.planning.model_shapes import model_shape
from cosearch_lib.planning.step_work import Behaviour, ranker_validation_s, retrieval_query_s, rollout_stages, workload
from cosearch_lib.planning.throughputs import DeviceRates, cpu_rates, gpu_rates

GIB = 2 ** 30
#: Search-R1's wiki-18 corpus (PeterJinGo/wiki-18-corpus): passages, and bytes of its e5 flat index.
WIKI18_PASSAGES = 21_015_324
#: Families of questions a validation draws ``val_per_dataset`` from (the paper's 7 benchmarks; the world's 7 families).
N_FAMILIES = 7
#: Search-R1's test splits of the paper's 7 benchmarks (NQ 3,610; TriviaQA 11,313; PopQA 14,267;
#: HotpotQA 7,405; 2Wiki 12,576; MuSiQue 2,417; Bamboogle 125): what ``evaluation.n_per_dataset: null`` evaluates.
PAPER_TEST_QUESTIONS = 51_713
#: The derived stop warning (slurm.signal_lead_s: null): the part of a step a stop cannot cut, x this, + this.
LEAD_FACTOR, LEAD_MARGIN_S = 1.1, 60.0  # the stage under way when the warning comes, + the planner's error
#: Bandwidths per GPU for the all-reduce and the rollout exchange (assumed: NVLink, 100 Gb/s InfiniBand).
INTRA_NODE_GBS, INTER_NODE_GBS = 150.0, 12.5
#: What a CUDA process holds besides its tensors (context, cuBLAS workspaces), and vLLM's own (CUDA graphs).
CUDA_CONTEXT_GIB, ENGINE_OVERHEAD_GIB = 1.0, 2.0
#: A rank's host memory besides its model and update: Python, torch, tokenizers, the world and questions
#: (a CPU rank of `ci` peaked at 3.6 GB in all, docs/LOG.md).
RANK_HOST_BASE_GIB = 1.5
#: Start of a job before its first step: model load from disk, engine start and its first compiled
#: calls (GPU_COSTS.md: the first static-cache call took 50-81 s); disk read rate assumed.
ENGINE_FIRST_CALL_S, DISK_READ_GBS = 81.0, 1.0


@dataclass(frozen=True)
class Refusal:
    """One reason a job cannot fit or finish: what, the numbers, and the setting that changes it."""

    what: str
    numbers: str
    setting: str

    def __str__(self) -> str:
        return f"{self.what}: {self.numbers} (change {self.setting})"


@dataclass
class JobPlan:
    profile: str
    nodes: int
    gpus_per_node: int
    device: str
    ranks: int
    rank_memory: dict[str, float]  # GiB by part
    rank_capacity: dict[str, float]  # GiB each share may use
    node_memory: dict[str, float]  # GiB by part, training node
    retriever_memory: dict[str, float]  # GiB by part, the retrieval server's node
    node_capacity_gib: float
    disk: dict[str, float]  # GiB by part
    stages: dict[str, dict[str, float]]  # method -> stage -> seconds per step (wall, on the job's ranks)
    step_s: dict[str, float]
    uncuttable_s: dict[str, float]  # method -> the part of a step a stop cannot cut: its longest stage and checkpoint (s)
    startup_s: float
    checkpoint_s: float
    time_limit_s: float
    signal_lead_s: float  # the stop warning the jobs get: slurm.signal_lead_s, or derived (lead_derived)
    lead_derived: bool
    steps: int
    steps_per_job: dict[str, int]
    gpu_hours: dict[str, float]  # method -> the whole run
    cell_gpu_hours: dict[str, float]  # grid -> one cell
    evaluation_s: float  # the evaluation job's work (s, on its ranks)
    evaluation_time_limit_s: float
    inputs: list[str] = field(default_factory=list)  # where the throughputs come from
    notes: list[str] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    validation_s: dict[str, float] = field(default_factory=dict)  # method -> one validation (s, on its ranks)

    @property
    def fits(self) -> bool:
        return not self.refusals


class PlanRefused(ConfigError):
    """A job the plan says cannot fit or finish; raised before anything is written or submitted."""

    def __init__(self, plan: JobPlan, command: str):
        self.plan = plan
        lines = "\n".join(f"  - {r}" for r in plan.refusals)
        super().__init__(f"{command}: refused before the queue; `cosearch plan --profile {plan.profile} --nodes {plan.nodes} "
                         f"--gpus-per-node {plan.gpus_per_node}` says {len(plan.refusals)} thing(s) cannot fit or finish:\n"
                         f"{lines}\n--force submits anyway")


def enforce(plan: JobPlan, command: str, *, force: bool = False) -> JobPlan:
    """``plan``, or :class:`PlanRefused` when it holds refusals and ``force`` is off."""
    if plan.refusals and not force:
        raise PlanRefused(plan, command)
    return plan


def slurm_seconds(text: str, setting: str = "slurm.time") -> float:
    """A SLURM time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
    if not m:
        raise ConfigError(f"{setting}: {text!r} is not a SLURM time (e.g. 24:00:00, 2-00:00:00, 90)")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:
        return int(a) * 60 + int(b)
    return int(a) * 60


def slurm_gib(text: str, setting: str = "slurm.mem") -> float:
    """A SLURM memory size (``128G``, ``4000M``, ``1T``; no unit: megabytes) in GiB."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", str(text).strip().upper())
    if not m:
        raise ConfigError(f"{setting}: {text!r} is not a SLURM memory size (e.g. 128G, 4000M)")
    scale = {"K": 2 ** -20, "M": 2 ** -10, "": 2 ** -10, "G": 1.0, "T": 1024.0}[m.group(2)]
    return float(m.group(1)) * scale




def plan_job(cfg: ProfileConfig, *, nodes: int = 1, gpus_per_node: int = 1, gpu: str = "h100",
             methods: tuple[str, ...] | None = None, behaviour: Behaviour | None = None,
             rates: DeviceRates | None = None, ranks_per_node: int | None = None, steps: int | None = None) -> JobPlan:
    """The plan of training ``methods`` (default: every training method) of ``cfg`` on ``nodes`` x
    ``gpus_per_node`` ranks, one per GPU (``gpus_per_node=0``: ``ranks_per_node`` CPU ranks per node,
    default 1, each with ``slurm.cpus_per_task`` threads at this machine's CPU rates), with every
    refusal the shape earns; ``steps`` replaces ``training.steps``. Bad shapes (no node, a negative
    count) raise ConfigError."""
    behaviour = behaviour or Behaviour()
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: a job needs at least one node")
    if gpus_per_node < 0:
        raise ConfigError(f"--gpus-per-node {gpus_per_node}: expected 0 (CPU ranks) or more")
    on_gpu = gpus_per_node > 0
    per_node = gpus_per_node if on_gpu else (ranks_per_node or 1)
    if per_node < 1:
        raise ConfigError(f"--tasks-per-node {ranks_per_node}: expected 1 or more")
    rates = rates or (gpu_rates(gpu) if on_gpu else cpu_rates(cfg.slurm.cpus_per_task))
    methods = tuple(methods or TRAINING_METHODS)
    for m in methods:
        method_spec(m)
    t, s = cfg.training, cfg.slurm
    n_steps = t.steps if steps is None else steps
    if n_steps < 1:
        raise ConfigError(f"--steps {steps}: expected 1 or more")
    ranks = nodes * per_node
    agent, ranker = model_shape(cfg.models.agent), model_shape(cfg.models.ranker)
    encoder = model_shape(cfg.retrieval.encoder.model)
    shared_base = cfg.models.agent.lower() == cfg.models.ranker.lower()
    refusals: list[Refusal] = []
    notes: list[str] = []

    # -- the impossible, named
    if not on_gpu and cfg.models.backend == "unsloth":
        refusals.append(Refusal("no GPU for the Unsloth backend", "0 GPUs per node asked, models.backend is unsloth (CUDA only)",
                                "--gpus-per-node (1 or more) or models.backend"))
    rows = t.questions_per_step * t.group_size
    if rows % ranks:  # the ranks are dealt rows (a question's G rollouts), rl.data_parallel.DataParallel.block
        refusals.append(Refusal("the ranks cannot share a step's rollouts evenly",
                                f"{t.questions_per_step} questions x G={t.group_size} = {rows} rollouts per step over "
                                f"{ranks} ranks ({nodes} node(s) x {per_node}): some ranks would idle while others roll out",
                                "training.questions_per_step or --nodes / --gpus-per-node"))
    sequences_per_update = t.questions_per_step * t.group_size / max(t.minibatches, 1) / ranks
    if t.micro_batch > sequences_per_update:
        refusals.append(Refusal("the micro-batch is larger than a rank's batch",
                                f"micro-batch {t.micro_batch} > {sequences_per_update:g} sequences per optimizer step per rank "
                                f"({t.questions_per_step} questions x G={t.group_size} / {t.minibatches} minibatches / {ranks} ranks)",
                                "training.micro_batch"))
    time_limit = slurm_seconds(s.time)
    if time_limit < 60:
        refusals.append(Refusal("the time limit is under a minute", f"slurm.time {s.time!r} = {time_limit:.0f} s", "slurm.time"))

    # -- memory per rank
    dtype = 2 if on_gpu else 4  # bf16 on GPUs; float32 on CPU
    weights = (agent.parameters + (0 if shared_base else ranker.parameters)) * dtype / GIB
    lora = cfg.lora
    adapters = [agent] + [ranker] * any(method_spec(m).trains_ranker and not ranker_kind(t.ranker_kind).scoring for m in methods)
    lora_gib = sum(a.lora_parameters(lora.r, lora.target_modules) for a in adapters) * 16 / GIB  # fp32 weight, grad, Adam m and v
    longest = cfg.rollout.max_context_tokens
    # attention scores are materialised where a padding mask goes with them (transformers, micro-batches > 1);
    # one unpadded sequence per forward (the CPU profiles) and Unsloth's kernels keep none
    attention = "flash" if cfg.models.backend == "unsloth" or t.micro_batch == 1 else "eager"
    mb_tokens = t.micro_batch * longest
    act_ckpt = max(a.activation_bytes(mb_tokens, longest, checkpointing=True, attention=attention, dtype_bytes=dtype)
                   for a in (agent, ranker)) / GIB
    act_full = max(a.activation_bytes(mb_tokens, longest, checkpointing=False, attention=attention, dtype_bytes=dtype)
                   for a in (agent, ranker)) / GIB
    activations = act_ckpt if t.gradient_checkpointing else act_full
    rows_per_rank = t.questions_per_step * t.group_size / ranks
    w_mean = workload(cfg, methods[0], behaviour, t.questions_per_step / ranks)
    kv_needed = rows_per_rank * w_mean.agent_context * agent.kv_bytes_per_token(dtype) / GIB
    engine = cfg.models.backend in ("vllm", "unsloth") and on_gpu
    memory_gib = rates.memory_gib or 0.0
    rank_memory = {"weights": weights, "LoRA + grads + Adam": lora_gib,
                   "activations (checkpointing)": act_ckpt, "activations (no checkpointing)": act_full}
    capacity: dict[str, float] = {}
    if engine:
        share = cfg.models.vllm.gpu_memory_utilization * memory_gib
        kv_pool = share - weights - ENGINE_OVERHEAD_GIB
        rank_memory["KV cache (engine pool)"] = max(kv_pool, 0.0)
        rank_memory["KV cache needed (all rows at once)"] = kv_needed
        trainer_room = memory_gib - share - CUDA_CONTEXT_GIB - (0.0 if cfg.models.backend == "unsloth" else weights)
        capacity = {"engine": share, "trainer": trainer_room}
        if kv_pool < longest * agent.kv_bytes_per_token(dtype) / GIB:
            refusals.append(Refusal("the generation engine has no room for one sequence's KV cache",
                                    f"{share:.1f} GiB engine share - {weights:.1f} GiB weights - {ENGINE_OVERHEAD_GIB:g} GiB overhead "
                                    f"= {kv_pool:.1f} GiB on a {rates.name}", "models.vllm.gpu_memory_utilization or a larger --gpu"))
        elif kv_pool < kv_needed:
            notes.append(f"the engine's KV pool ({kv_pool:.1f} GiB) holds {kv_pool / kv_needed:.0%} of the rank's "
                         f"{rows_per_rank:g} rows at once: generation runs in waves (time below assumes one wave)")
        used = lora_gib + activations
        if used > trainer_room:
            refusals.append(Refusal("a rank's update does not fit its GPU",
                                    f"LoRA + Adam {lora_gib:.1f} GiB + activations {activations:.1f} GiB "
                                    f"(micro-batch {t.micro_batch} x {longest} tokens, checkpointing {'on' if t.gradient_checkpointing else 'off'}) "
                                    f"> {trainer_room:.1f} GiB left beside the engine on a {rates.name}",
                                    "training.micro_batch, training.gradient_checkpointing, rollout.max_context_tokens "
                                    "or models.vllm.gpu_memory_utilization"))
    elif on_gpu:
        kv_batch = min(cfg.models.batch_size, rows_per_rank) * longest * agent.kv_bytes_per_token(dtype) / GIB
        rank_memory["KV cache (a generation batch)"] = kv_batch
        need = weights + lora_gib + max(activations, kv_batch) + CUDA_CONTEXT_GIB
        capacity = {"GPU": memory_gib}
        if need > memory_gib:
            refusals.append(Refusal("a rank does not fit its GPU",
                                    f"{need:.1f} GiB (weights {weights:.1f}, LoRA + Adam {lora_gib:.1f}, activations or KV cache "
                                    f"{max(activations, kv_batch):.1f}) > {memory_gib:.1f} GiB on a {rates.name}",
                                    "training.micro_batch, training.gradient_checkpointing or models.batch_size"))

    # -- host memory per node, disk
    node_capacity = slurm_gib(s.mem)
    per_rank_host = RANK_HOST_BASE_GIB + (weights if not on_gpu else weights / 2) + (lora_gib + activations if not on_gpu else 0.0)
    node_memory = {f"{per_node} rank(s) x {per_rank_host:.1f} GiB": per_node * per_rank_host}
    passages = WIKI18_PASSAGES if cfg.data.corpus_path else 6_000
    index_gib = passages * encoder.hidden * 4 / GIB
    corpus_gib = passages * behaviour.passage_chars * 2.5 / GIB  # text in Python strings with their objects
    retriever_memory = {"flat index": index_gib, "corpus text": corpus_gib, "encoder": encoder.parameters * 4 / GIB + 1.0}
    if sum(node_memory.values()) > node_capacity:
        refusals.append(Refusal("a node's ranks do not fit its memory",
                                f"{sum(node_memory.values()):.1f} GiB > slurm.mem {s.mem}", "slurm.mem or --gpus-per-node"))
    if sum(retriever_memory.values()) > node_capacity and not cfg.retrieval.mmap_index:
        refusals.append(Refusal("the retrieval server's index and corpus do not fit its node",
                                f"{sum(retriever_memory.values()):.1f} GiB > slurm.mem {s.mem}",
                                "slurm.mem or retrieval.mmap_index: true"))
    checkpoint_gib = sum(a.lora_parameters(lora.r, lora.target_modules) for a in adapters) * 12 / GIB  # weights + Adam state, fp32
    models_gib = (agent.parameters + (0 if shared_base else ranker.parameters)) * 2 / GIB + encoder.parameters * 4 / GIB
    disk = {"data (corpus)": passages * behaviour.passage_chars / GIB * 0.4 if cfg.data.corpus_path else 0.01,
            "flat index": index_gib, "models": models_gib,
            f"checkpoints ({len(methods)} methods x keep {t.keep_checkpoints})": len(methods) * max(t.keep_checkpoints, 1) * checkpoint_gib}

    # -- time
    query_s = retrieval_query_s(32.0, rates.encoder_tps.value, passages * encoder.hidden / 768, rates.search_vectors_per_s.value)
    stages: dict[str, dict[str, float]] = {}
    step_s, uncuttable, gpu_hours, per_job, validation_s = {}, {}, {}, {}, {}
    startup = (weights * GIB / 1e9) / DISK_READ_GBS + (ENGINE_FIRST_CALL_S if on_gpu else 0.0)
    checkpoint_s = checkpoint_gib * GIB / 1e9 / 0.5 + 2.0
    grad_bytes = sum(a.lora_parameters(lora.r, lora.target_modules) for a in adapters) * 4
    bandwidth = (INTRA_NODE_GBS if nodes == 1 else INTER_NODE_GBS) * 1e9
    # bf16 autocast of a CPU rank's rollouts and updates (training.autocast; validation and evaluation in float32).
    # Not modelled: decoding on bf16 weights (training.autocast.bf16_weights, evaluation.bf16_weights), planned
    # at autocast's factors (the CPU record has no bf16-weights rates):
    # at the CPU record's bf16 factors, which assume the ranks' CPUs have bf16 instructions like the measured one
    autocast = t.autocast if not on_gpu else None
    roll_bf16 = bool(autocast and autocast.rollout and cfg.models.backend == "transformers" and rates.bf16)
    update_bf16 = bool(autocast and autocast.update and rates.bf16)
    if autocast and (autocast.rollout or autocast.update) and rates.bf16:
        source = next(iter(rates.bf16.values())).source
        notes.append(f"training.autocast: rollouts {'bf16' if roll_bf16 else 'float32'}, updates "
                     f"{'bf16' if update_bf16 else 'float32'} at the CPU record's bf16 factors ({source}), on CPUs with bf16 "
                     "instructions like the measured one (without them the run trains in float32)")
    elif autocast and (autocast.rollout or autocast.update):
        notes.append("training.autocast: planned in float32: the CPU record has no bf16 factors "
                     "(python benchmarks/cpu_throughput.py --bf16 on a CPU with avx512_bf16 or AMX)")
    for m in methods:
        w = workload(cfg, m, behaviour, t.questions_per_step / ranks)
        pr, rk = rates.policy(agent), rates.policy(ranker)
        st = rollout_stages(cfg, w, rates.policy(agent, bf16=roll_bf16), rates.policy(ranker, bf16=roll_bf16), on_gpu, query_s)
        # reference and old log-probs: forward only; under autocast the update recomputes the old ones (rl.trainer)
        passes = 1 + (cfg.training.grpo.kl_coef > 0) + cfg.training.grpo.recomputes_old_logprobs(
            generated_by_trainer=cfg.models.backend == "transformers" and not (roll_bf16 or update_bf16))
        pu, ru = rates.policy(agent, bf16=update_bf16), rates.policy(ranker, bf16=update_bf16)
        update = w.trained_agent / pu.train_tps.value + w.trained_agent * (passes - 1) / pu.prefill_tps.value
        if w.judged_prompts:  # a scoring ranker trains on its candidates' short prompts, batched per call; its
            # ratio's old log-probs are the rollout's own and it has no KL term (rl.scorer_policy): no extra pass
            update += w.trained_ranker / ru.scoring_train_tps.value
        else:
            update += w.trained_ranker / ru.train_tps.value + w.trained_ranker * (passes - 1) / ru.prefill_tps.value
        comms = (2 * (ranks - 1) / ranks * grad_bytes * t.minibatches / bandwidth) if ranks > 1 else 0.0
        # a trajectory's tokens the ranks send each other: its context, and its ranker calls' prompts and replies
        # (a scoring ranker's: one prompt per candidate); none for a method without a ranker policy
        ranker_tokens = (w.ranker_calls * (w.ranker_prompt + w.ranker_reply) + w.judged_prompts * w.judge_prompt) / max(w.trajectories, 1.0)
        exchange = ((ranks - 1) / ranks * t.questions_per_step * t.group_size * (w.agent_context + ranker_tokens) * 12
                    / bandwidth) if ranks > 1 else 0.0
        st["update"] = update + comms + exchange
        val_q = t.val_per_dataset * N_FAMILIES / ranks  # greedy, one trajectory each, + the ranker on their gold sub-queries
        vw = workload(cfg, m, behaviour, val_q, samples=1)
        validation_s[m] = (sum(rollout_stages(cfg, vw, pr, rk, on_gpu, query_s).values())
                           + ranker_validation_s(cfg, m, behaviour, val_q * behaviour.hops, rk, on_gpu))
        st["validation"] = validation_s[m] / t.eval_every if t.eval_every else 0.0
        stages[m] = st
        step_s[m] = sum(st.values())
        # a stop is honoured at the stage boundary (the rollouts saved, rl.run_protocol) or after the update
        # (the step's checkpoint): the longest stage and what it writes cannot be cut
        uncuttable[m] = max(st["rollout"] + st["ranker calls"] + st["retrieval"], st["update"]) + checkpoint_s
    derived = s.signal_lead_s is None
    lead = (max(uncuttable.values()) * LEAD_FACTOR + LEAD_MARGIN_S) if derived else float(s.signal_lead_s)
    for m in methods:
        per_job[m] = max(int((time_limit - startup - lead) // (step_s[m] + checkpoint_s)), 0)
        jobs = math.ceil(n_steps / per_job[m]) if per_job[m] else math.inf
        gpu_hours[m] = (n_steps * (step_s[m] + checkpoint_s) + jobs * startup) * ranks / 3600 if per_job[m] else math.inf
    cells = {"table3": ("cosearch",), "table4": tuple(TRAINING_METHODS)}
    cell_hours = {g: sum(gpu_hours.get(m, math.nan) for m in ms) for g, ms in cells.items() if all(m in gpu_hours for m in ms)}

    for m in methods:
        if per_job[m] < 1:
            refusals.append(Refusal(f"the time limit holds no {m} step",
                                    f"slurm.time {s.time} ({time_limit / 3600:.1f} h) < start {startup:.0f} s + one step "
                                    f"{step_s[m] / 3600:.2f} h + checkpoint {checkpoint_s:.0f} s + warning {lead:.0f} s",
                                    "slurm.time or more ranks (--nodes, --gpus-per-node)"))
        elif lead < uncuttable[m]:
            refusals.append(Refusal(f"the stop warning is shorter than a {m} step",
                                    f"slurm.signal_lead_s {lead:.0f} s < {uncuttable[m]:.0f} s that a stop cannot cut "
                                    f"(the longest stage of a step and its checkpoint): the job would reach its time limit mid-stage",
                                    f"slurm.signal_lead_s (>= {math.ceil(uncuttable[m] * LEAD_FACTOR + LEAD_MARGIN_S)}, "
                                    "or null: derived from the plan) or more ranks"))
        total_s = gpu_hours[m] * 3600 / ranks if math.isfinite(gpu_hours[m]) else math.inf
        budget = time_limit * (1 + s.max_requeues)
        if math.isfinite(total_s) and total_s > budget:
            refusals.append(Refusal(f"{m} cannot finish within its job's requeues",
                                    f"{total_s / 3600:.0f} h of work on {ranks} ranks > {1 + s.max_requeues} runs x "
                                    f"{time_limit / 3600:.1f} h (slurm.max_requeues {s.max_requeues}: the cluster's MaxBatchRequeue)",
                                    "more ranks (--nodes, --gpus-per-node), training.steps, slurm.time or slurm.max_requeues"))

    # -- the evaluation job: every test question of each method, greedy, on the same ranks
    eval_q = (cfg.evaluation.n_per_dataset * N_FAMILIES if cfg.evaluation.n_per_dataset else PAPER_TEST_QUESTIONS) / ranks
    evaluation = 0.0
    for m in methods:
        ew = workload(cfg, m, behaviour, eval_q, samples=1)
        evaluation += sum(rollout_stages(cfg, ew, rates.policy(agent), rates.policy(ranker), on_gpu, query_s).values())
    eval_limit = slurm_seconds(s.time)  # the training job's ranks run it after the training (runs.slurm_training)
    if evaluation > eval_limit * (1 + s.max_requeues):
        refusals.append(Refusal("the evaluation cannot finish within its job's requeues",
                                f"{evaluation / 3600:.1f} h on {ranks} ranks > {1 + s.max_requeues} x {eval_limit / 3600:.1f} h",
                                "evaluation.n_per_dataset or more ranks"))
    # the job trains its methods one after the other, then evaluates them: all of it within its requeues
    run_s = sum(gpu_hours[m] * 3600 / ranks for m in methods) + evaluation
    if len(methods) > 1 and math.isfinite(run_s) and run_s > time_limit * (1 + s.max_requeues):
        refusals.append(Refusal("the run (its methods in turn, then their evaluation) cannot finish within its job's requeues",
                                f"{run_s / 3600:.0f} h on {ranks} ranks > {1 + s.max_requeues} runs x {time_limit / 3600:.1f} h",
                                "more ranks (--nodes, --gpus-per-node, slurm.gpus_per_node), fewer methods per job, "
                                "slurm.time or slurm.max_requeues"))
    inputs = sorted({rates.policy(agent).decode_step_s.source, rates.policy(agent).train_tps.source,
                     rates.policy(agent).prefill_tps.source})
    if rates.note:
        notes.append(rates.note)
    return JobPlan(cfg.profile, nodes, gpus_per_node, rates.name, ranks, rank_memory, capacity, node_memory,
                   retriever_memory, node_capacity, disk, stages, step_s, uncuttable, startup, checkpoint_s, time_limit,
                   lead, derived, n_steps, per_job, gpu_hours, cell_hours, evaluation, eval_limit, inputs, notes,
                   refusals, validation_s)


def gpus_in_gres(gres: str | None) -> int:
    """GPUs a ``--gres`` asks for (``gpu:2``, ``gpu:h100:8``; None: 0, a CPU job)."""
    if not gres:
        return 0
    last = str(gres).split(",")[0].split(":")[-1]
    if not last.isdigit():
        raise ConfigError(f"slurm.gres {gres!r}: expected gpu:<count> or gpu:<type>:<count>")
    return int(last)
