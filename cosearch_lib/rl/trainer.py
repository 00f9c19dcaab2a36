"""The joint GRPO trainer: one step reads top to bottom as the method's stages.

:meth:`JointTrainer.train_step`, stage by stage (each timed by one :class:`~cosearch_lib.stage_clock.StageClock`
and recorded as ``<stage>_s``):

1. **rollout**: the step's questions (a seeded permutation of the training split, epoch after
   epoch, :func:`~cosearch_lib.seeding.step_order`), G trajectories each from the batched engine: the agent adapter
   samples turns, the retriever returns N candidates, the method's ranking picks K;
2. **reward**: Eq. 4 per trajectory, the ranker's composite (Eq. 6 or the released variant) per
   search call (:func:`~cosearch_lib.rl.step_scoring.reward_rollouts`);
3. **group**: the agent's G trajectories of a question form one group; the ranker's calls are
   grouped semantically (Alg. 2), reusing the agent's rollouts; group-relative advantages
   (:func:`~cosearch_lib.rl.step_scoring.group_rollouts`);
4. **update**: one GRPO update of each trained adapter (clipped surrogate + k3 KL to the base model,
   ``rl.policy_update.grpo_update``), or of the cross-encoder ranker;
5. **sync**: a generation engine that reads adapters from disk (vLLM) gets the updated ones;
6. **log**: the step record (``rl.step_records``; columns in ``run_schema.STEP_GLOSSARY``).

:meth:`JointTrainer.run` then adds, after each step, the validation when due (stage **validate**)
and hands the record to the live tracker, and checkpoints (adapters, optimizer and RNG states,
records, written whole or not at all). The rollout stage returns a
:class:`~cosearch_lib.rl.step_batch.StepBatch` that knows which rows this rank rolled out, so
the update stage reads as one job per trained role.

Data parallel (``dp``, :mod:`cosearch_lib.rl.data_parallel`): each rank rolls out its contiguous
block of the step's rows (``DataParallel.block``: G per question, questions in step order); the rollouts are exchanged, so stages 2-3 and the record are the whole step's on
every rank; stage 4 updates on the rank's own sequences with the gradients and denominators summed
over ranks; rank 0 writes checkpoints and records, and shows the progress bars.

Every ``eval_every`` steps (and after the last) the record also gets a greedy validation: the
agent's answer F1 on the validation questions (``val_f1``) and the method's ranking alone on held-out
sub-queries of those questions (``val_ranker_hit@k``, ``rl.ranker_validation``). With
``validate_at_start`` the same validation runs once before the first update, as a record of its
own with ``step = -1`` (only ``step``, ``method`` and the ``val_*`` columns): the curves, drawn
over steps completed (``step + 1``), then start at 0 from the warm start's point.

What a method ranks with, trains and is evaluated as comes from its spec
(:func:`cosearch_lib.config.methods.method_spec`); the step has no per-method branches.

Departures from the paper: LoRA adapters on one shared base instead of two full models (so the
reference policy of the KL term is the base with adapters disabled, or with ``grpo.kl_reference: start``
a frozen copy of the adapters as they started); a much smaller rollout batch
and learning rate suited to LoRA; without a KL term, sequences whose advantage is exactly 0 are not
forwarded (their tokens still count in the token-mean denominator, so the gradient is the full
batch's; with a KL term they are, for it); one optimizer step per training step unless ``minibatches`` > 1.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import Ranker, RankerContext, make_ranker
from cosearch_lib.agent.rollout import RolloutEngine
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SamplingConfig, TrainConfig, UpdateSettings, ranker_kind
from cosearch_lib.config.methods import RankedBy, method_spec
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.harness import HarnessConfig, HarnessContext, evaluate, select_examples
from cosearch_lib.eval.method_settings import policy_eval_settings
from cosearch_lib.eval.tables import summary_table
from cosearch_lib.models.autocast import AutocastPlan, autocast_plan, cpu_bf16
from cosearch_lib.models.generation.contract import bf16_scope
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.models.served_adapters import ServedAdapters
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.data_parallel import SINGLE_PROCESS, DataParallel
from cosearch_lib.rl.judge import judge_calls
from cosearch_lib.rl.policy_update import UpdateJob, grpo_update
from cosearch_lib.rl.ranker_validation import RankerValidationSet, gold_sub_queries, summarize_items
from cosearch_lib.rl.run_protocol import TrainingRun
from cosearch_lib.rl.scorer_policy import load_scorer_state, make_optimizer, scorer_state, scorer_update
from cosearch_lib.rl.step_batch import TRAINED_ROLES, StepBatch, role_job
from cosearch_lib.rl.step_records import call_rows, step_record
from cosearch_lib.rl.step_scoring import StepGroups, StepRewards, group_rollouts, reward_rollouts
from cosearch_lib.rl.tracking import StepTracker, make_tracker
from cosearch_lib.run_schema import LIVE_ADAPTERS_DIR, SCORER_SLOT, TRACKER_DIR, namespaced_record, renamed_slots
from cosearch_lib.seeding import step_order
from cosearch_lib.stage_clock import StageClock

#: The stages whose seconds make up ``step_s`` (validation is timed apart, as ``validate_s``).
STEP_STAGES = ("rollout", "reward", "group", "update", "sync")


@dataclass
class TrainerInputs:
    """What a :class:`JointTrainer` runs on (``experiment.build_trainer`` builds it from a profile)."""

    policies: PolicySet  # the LoRA adapters on one base, an optimizer per trained one
    tokenizer: Any  # the base model's tokenizer (chat template, pad id)
    retriever: SearchBackend  # the frozen first-stage retriever (in process or over HTTP)
    questions: Sequence[QAExample]  # the training split
    rollout: RolloutConfig  # token budgets, sampling, N/K and the search cap, the rule set
    protocol: ProtocolConfig  # prompts and passage caps
    val_questions: Sequence[QAExample] = ()  # the validation questions (empty: no validation)
    validation: HarnessConfig | None = None  # the greedy evaluation validation runs (None: from ``rollout``)
    backend: Any = None  # generates the rollouts (required): the policy model's own (experiment.building.policy_engine), vLLM, a test's scripted one
    scorer: Any = None  # the scoring ranker of a scoring training.ranker_kind (config.RANKER_KINDS: cross-encoder, LLM judge)
    chat: ChatTokens | None = None  # chat-token assembly (None: from the tokenizer)


class JointTrainer(TrainingRun):
    """Trains the policies of one method; ``run`` steps, records and checkpoints (the protocol both
    trainers share: ``rl.run_protocol.TrainingRun``)."""

    def __init__(self, cfg: TrainConfig, inputs: TrainerInputs, *, out_dir: str | Path, seed: int = 0,
                 progress: bool = True, tracker: StepTracker | None = None, dp: DataParallel = SINGLE_PROCESS) -> None:
        rollout = inputs.rollout
        if rollout.temperature <= 0:
            raise ValueError("GRPO needs sampled rollouts: rollout temperature must be > 0")
        self.cfg, self.spec, self.seed, self.dp = cfg, method_spec(cfg.method), seed, dp
        self.progress = progress and dp.is_main  # one set of bars per job
        self.policies, self.tokenizer, self.retriever = inputs.policies, inputs.tokenizer, inputs.retriever
        self.questions, self.val_questions = list(inputs.questions), list(inputs.val_questions)
        self.rollout_cfg, self.protocol = rollout, inputs.protocol
        self._start_run(out_dir, name=cfg.method, keep_checkpoints=cfg.keep_checkpoints, dp=dp)
        self.chat = inputs.chat or ChatTokens(inputs.tokenizer)
        # Rollouts run on the given engine (the policy model's own, vLLM, a test's scripted backend);
        # the updates always run on the policy model.
        if inputs.backend is None:
            raise ValueError("TrainerInputs.backend is None: build the generation engine first "
                             "(experiment.building.policy_engine builds the policy model's own)")
        self.backend = inputs.backend
        self.pad_id = inputs.tokenizer.pad_token_id if inputs.tokenizer.pad_token_id is not None else inputs.tokenizer.eos_token_id
        # A scoring ranker (a scoring training.ranker_kind) lives beside the LoRA policies, with its
        # own optimizer when the method trains its ranker; it travels in the SCORER_SLOT whatever its model.
        if cfg.uses_scoring_ranker and inputs.scorer is None:
            raise ValueError(f"training.ranker_kind {cfg.ranker_kind!r} with method {cfg.method!r} needs a scoring ranker "
                             "(TrainerInputs.scorer)")
        self.scorer = inputs.scorer if cfg.uses_scoring_ranker else None
        self.scorer_trained = self.scorer is not None and self.spec.trains_ranker
        if self.scorer_trained and dp.distributed:
            raise ValueError("a scoring ranker trains in one process only; launch this method without torchrun/srun")
        self.scorer_optimizer = make_optimizer(self.scorer, *cfg.scoring_ranker_lr) \
            if self.scorer_trained else None
        self.validation = inputs.validation if inputs.validation is not None else _validation_harness(cfg, rollout, seed)
        sampling = rollout.ranker_sampling(seed)
        self.ranker = self._method_ranker(sampling)
        # Validation ranks greedily (the training ranker samples), on sub-queries fixed once per trainer.
        self.val_ranker = self._method_ranker(replace(sampling, temperature=0.0))
        self.ranker_validation = RankerValidationSet(
            gold_sub_queries(select_examples(self.val_questions, cfg.val_per_dataset)), self.retriever,
            topn=rollout.search.topn, topk=rollout.search.topk, hit_ks=cfg.ranker_reward.hit_ks)
        self.engine = RolloutEngine(self.backend, self.chat, self.retriever, self.ranker, rollout, self.protocol,
                                    agent_adapter=self.policies.adapter("agent"))
        # A backend that reads adapters from disk (vLLM: it has add_adapter) samples with saved copies:
        # every role adapter is saved and registered before the engine first generates
        # (``self.served``, :class:`~cosearch_lib.models.served_adapters.ServedAdapters`), and the updated ones again after each step.
        # Every rank starts from rank 0's adapters (a fresh LoRA's random init included), before any
        # engine gets them.
        dp.broadcast_params(p for adapter in self.policies.params.values() for p in adapter.values())
        if cfg.grpo.start_reference:  # the KL term's reference: the adapters as GRPO starts them, before any resume
            self.policies.freeze_start_references()
        self.served = ServedAdapters(self.policies, self.backend,
                                     self.out_dir / LIVE_ADAPTERS_DIR / (f"rank{dp.rank}" if dp.distributed else ""))
        # The ratio's old log-probs: a disk-reading engine is not the trainer's model (vLLM samples
        # in bf16 with its own kernels), so by default the update recomputes them (GRPOConfig.old_logprobs).
        # bf16 autocast of the rollouts and the updates (training.autocast), on CPUs that multiply bf16 in
        # hardware, every rank's (models.autocast.autocast_plan); validation runs in float32 whatever it says.
        # A disk-reading engine (vLLM) samples in its own dtype: the rollout's autocast is the trainer's model's only.
        ac, device = cfg.autocast, next(self.policies.model.parameters()).device
        self.autocast = autocast_plan(ac.rollout and not self.served.enabled, ac.update, device,
                                      every_rank=lambda ok: all(dp.gather(ok)), weights=bool(ac.bf16_weights)) if ac else AutocastPlan()
        self.update_settings = self._update_settings(bf16_step=self.autocast.any)
        # Live logging (cfg.log_to): the given tracker, else one made at the first step and closed by run().
        self.tracker = tracker

    def _update_settings(self, *, bf16_step: bool) -> UpdateSettings:
        """The update's settings for a step that computes under autocast in some stage (``bf16_step``) or not.
        Rollouts under autocast are not the trainer's own: in bf16 a cached decode and the update's
        whole-sequence forward differ by kernel noise (ci, both in bf16: mean |delta log p| 0.007, p99 0.2,
        1-2% of the ratios outside the clip before any step), so with ``grpo.old_logprobs: auto`` the update
        recomputes the old log-probs then, as for a vLLM engine."""
        by_trainer = not self.served.enabled and not bf16_step
        return self.cfg.update_settings(recompute_old=self.cfg.grpo.recomputes_old_logprobs(generated_by_trainer=by_trainer))

    def _method_ranker(self, sampling: SamplingConfig) -> Ranker:
        """The method's ranking (``agent.rankers.RANKING_MODES``): a rule named by its ``RankedBy``
        (retrieval top-K, oracle), or the ranker policy sampling with ``sampling``: the ranking mode of
        its kind (``config.RANKER_KINDS``), the scoring ranker or the LLM ranker's adapter."""
        rules = self.rollout_cfg.rules
        mode = self.spec.ranked_by.value
        if self.spec.ranked_by is RankedBy.POLICY:
            mode = ranker_kind(self.cfg.ranker_kind).ranking_mode
        return make_ranker(mode, RankerContext(
            trivial_golds=rules.trivial_golds, backend=self.backend, chat=self.chat, protocol=self.protocol, sampling=sampling,
            adapter=self.policies.adapter("ranker"), output_protocol=rules.ranker_output, scorer=self.scorer,
            temperature=sampling.temperature, seed=self.seed))

    # -- one step

    def step_questions(self, step: int) -> list[QAExample]:
        return [self.questions[i] for i in step_order(len(self.questions), step, self.cfg.questions_per_step,
                                                        self.seed)]

    def train_step(self) -> dict:
        """One GRPO step of the method, stages rollout to sync; keeps and returns its record (:meth:`run`
        adds the validation when it is due, and hands the record to the live tracker). The scored
        rollouts are saved before the update (:meth:`save_stage`), and a stop signal that arrived
        during them stops the run there; a resumed run takes them back instead of rolling out again."""
        cfg, step = self.cfg, self.step
        clock = StageClock()
        bf16 = self.autocast_on()  # read from the earlier steps' records: the same after a stop
        saved = self.take_stage(step)
        if saved is not None:  # resumed at the stage boundary: the same rollouts, rewards and groups
            batch = StepBatch(saved["trajectories"], tuple(self.dp.block(len(saved["trajectories"]))))
            rewards, groups = saved["rewards"], saved["groups"]
            clock.seconds.update(saved["seconds"])
            rollout_bf16 = bool(saved.get("rollout_bf16", False))  # what they were sampled in, on whichever machine
        else:
            rollout_bf16 = self.autocast.rollout and bf16
            # bf16 weights: the turns decode on bf16 copies made for this rollout (the weights move only in the update)
            with cpu_bf16(rollout_bf16), bf16_scope(self.backend, enabled=rollout_bf16 and self.autocast.weights):
                batch, rewards, groups = self.scored_rollouts(step, clock)
            self.save_stage(step, {"trajectories": list(batch.trajectories), "rewards": rewards, "groups": groups,
                                   "seconds": dict(clock.seconds), "rollout_bf16": rollout_bf16})
            self.stop_at_boundary(step)  # rollouts taken back are not a boundary: the resumed run goes on into the update
        update_bf16 = self.autocast.update and bf16
        with clock("update"), cpu_bf16(update_bf16):
            update_stats = self._update(batch, rewards, groups, clock, self._update_settings(bf16_step=rollout_bf16 or update_bf16))
        with clock("sync"):
            self._sync(update_stats)
        record = step_record(step, cfg.method, rewards, groups, update_stats)
        if cfg.autocast is not None:  # what this step computed in
            record.update({"rollout/bf16": float(rollout_bf16), "loss/bf16": float(update_bf16)})
        self.call_records.extend(call_rows(step, rewards, groups))
        timings = clock.columns()
        if not self.served.enabled:
            timings.pop("sync_s")  # nothing to sync: no column
        record.update(timings, step_s=clock.total(*STEP_STAGES))
        record = namespaced_record(record)
        self.records.append(record)
        if bf16 and not self.autocast_on():
            warnings.warn(f"step {step + 1}: the rollout's log-probs drifted past training.autocast.max_drift = "
                          f"{cfg.autocast.max_drift} from the trainer's under bf16 autocast; the rest of the run "
                          "computes in float32", stacklevel=2)
        self.step += 1
        return record

    def scored_rollouts(self, step: int, clock: StageClock | None = None) -> tuple[StepBatch, StepRewards, StepGroups]:
        """The stages before the update, for the questions of ``step`` with the policies as they are
        now: rollout, rewards, groups and advantages (each timed on ``clock``). :meth:`train_step`
        goes on to the update; ``benchmarks/sampling_signal.py`` reads what GRPO would have to work with."""
        clock = clock or StageClock()
        self.served.serve(self.step)
        with clock("rollout"):
            batch = self._rollouts(step)
        with clock("reward"):
            rewards = reward_rollouts(batch.trajectories, self.cfg, judge=self._judge)
        with clock("group"):
            groups = group_rollouts(rewards, self.cfg, self.rollout_cfg.rules)
        return batch, rewards, groups

    def autocast_on(self) -> bool:
        """Whether this step computes under bf16 autocast: ``training.autocast`` asks for it, this CPU has
        bf16 instructions, and no earlier step of the run (the records a resumed run restored included)
        drifted past ``training.autocast.max_drift``: the first that does turns it off for good."""
        if not self.autocast.any:
            return False
        bound = self.cfg.autocast.max_drift
        for rec in self.records:
            if not (rec.get("rollout/bf16") or rec.get("loss/bf16")):
                continue
            for key in (k for k in rec if k.endswith("_logp_drift_mean")):
                scored = rec.get(key.replace("_logp_drift_mean", "_n_tokens"), 0)
                if scored > 0 and not rec[key] <= bound:  # a NaN drift of a role that scored tokens fails too
                    return False
        return True

    def _rollouts(self, step: int) -> StepBatch:
        """The rollout stage: G trajectories per question of the step. This rank rolls out its block
        of the step's rows (``rl.data_parallel``); the ranks' blocks are then exchanged, so the batch
        is the whole step's."""
        questions, g = self.step_questions(step), self.cfg.group_size
        trajectories, rows = self.dp.map_block(
            len(questions) * g, lambda block: self.engine.run(questions, n_samples=g, rows=block, seed=self.seed, step=step,
                                                             progress=self.progress,
                                                             desc=f"{self.cfg.method}: rollout step {step + 1}/{self.cfg.steps}"))
        return StepBatch(trajectories, tuple(rows))

    def _judge(self, calls: list) -> None:
        """The LLM-as-judge ablation's labels of the shown passages: the base model (adapters off) judges."""
        judge_calls(calls, self.backend, self.chat, adapter=None, seed=self.seed)

    def _update(self, batch: StepBatch, rewards: StepRewards, groups: StepGroups, clock: StageClock,
                settings: UpdateSettings) -> dict[str, dict[str, float]]:
        """The update stage: one job per trained role (:func:`~cosearch_lib.rl.step_batch.role_job`, on
        this rank's rows), each adapter's GRPO update on the jobs of the roles it plays, or the
        cross-encoder's own update when it is the trained ranker; {adapter: stats}."""
        cfg, ro = self.cfg, self.rollout_cfg
        temperatures = {"agent": ro.temperature,
                        "ranker": ro.temperature if ro.ranker_temperature is None else ro.ranker_temperature}
        jobs: dict[str, list[UpdateJob]] = {}
        for role in TRAINED_ROLES:
            if self.policies.is_trained(role) and (role == "agent" or rewards.calls):
                jobs.setdefault(self.policies.adapter(role), []).append(
                    role_job(role, batch, rewards, groups, temperatures[role]))
        stats: dict[str, dict[str, float]] = {}
        if self.scorer_trained and rewards.calls:
            with clock(f"{SCORER_SLOT}_update"):
                stats[SCORER_SLOT] = scorer_update(
                    self.scorer, self.scorer_optimizer, rewards.calls, groups.ranker_advantages, cfg.grpo,
                    temperature=temperatures["ranker"], max_grad_norm=cfg.max_grad_norm)
        for adapter, adapter_jobs in jobs.items():
            with clock(f"{adapter}_update"):
                stats[adapter] = grpo_update(self.policies, adapter, adapter_jobs, settings,
                                             pad_id=self.pad_id, dp=self.dp)
        return stats

    def _sync(self, updated: Mapping[str, Any]) -> None:
        """The sync stage: the updated adapters' new weights, to a generation engine that reads them from disk."""
        self.served.push(self.step + 1, [a for a in updated if a != SCORER_SLOT])

    def _log(self, record: dict) -> None:
        """Hand ``record`` to the live tracker (made at the first record, ``cfg.log_to``)."""
        cfg = self.cfg
        if not self.dp.is_main:
            return  # the same record is on every rank; rank 0 logs it
        if self.tracker is None and cfg.log_to:
            self.tracker = make_tracker(cfg.log_to, self.out_dir / TRACKER_DIR, f"{cfg.method}-seed{self.seed}",
                                        {**asdict(cfg), "seed": self.seed, "out_dir": str(self.out_dir)},
                                        project=cfg.wandb_project)
        if self.tracker is not None:
            self.tracker.log(record)

    def _validates_at_start(self) -> bool:
        return self.cfg.validate_at_start and bool(self.val_questions)

    def _validation_due(self) -> bool:
        """Every ``eval_every`` steps and after the last; never with ``eval_every`` 0 or no validation questions."""
        every = self.cfg.eval_every
        return bool(every) and (self.step % every == 0 or self.step == self.cfg.steps) and bool(self.val_questions)

    def _record_keys(self) -> dict[str, Any]:
        return {"method": self.cfg.method}

    def _progress_figures(self, record: dict) -> dict[str, str]:
        return {"reward": f"{record['rollout/agent_reward']:.3f}", "hitK": f"{record['ranker/hit@K']:.2f}"}

    # -- validation

    def validate(self, step: int | None = None) -> dict[str, float]:
        """Greedy validation of the method's policies as they are now (before the first update too):
        ``val_f1``, the avg F1 (macro over families) of the agent loop on the validation questions,
        and the ``val_ranker_*`` columns of :meth:`RankerValidationSet.score`, the method's greedy
        ranking on the held-out sub-queries of those questions.

        With ``step`` (the step record the columns join; -1 before the first update) the per-item
        scores are also kept in :attr:`val_records` (``validation.csv``, ``run_schema.VALIDATION_COLUMNS``):
        what the paired intervals of notebook 03 resample."""
        self.served.serve(self.step)
        agent = self._agent_records()
        # data parallel: each rank scores its share of the sub-queries, and every rank gets all rows, in order
        ranker_rows = self.dp.map_items(range(len(self.ranker_validation.sub_queries)),
                                        lambda owned: self.ranker_validation.score_items(self.val_ranker, owned))
        if step is not None:
            base = {"step": step, "method": self.cfg.method}
            self.val_records.extend({**base, "kind": "agent", "question_id": r.question_id, "dataset": r.dataset,
                                     "f1": float(r.f1)} for r in agent.itertuples())
            self.val_records.extend({**base, "kind": "ranker", **row} for row in ranker_rows)
        f1 = float(summary_table(agent)["avg"].iloc[0]) if len(agent) else float("nan")
        return {"val_f1": f1, **summarize_items(ranker_rows, self.ranker_validation.hits)}

    def _agent_records(self) -> pd.DataFrame:
        """The harness records (one per validation question) of the agent loop, greedy, with the
        method's ranking and the policies as loaded (adapters by name; the live scoring ranker).
        Under data parallelism the ranks split the questions (validation costs 1/world_size of one
        process's time, not all of it on every rank)."""
        live = {role: name for role in ("agent", "ranker") if (name := self.policies.adapter(role))}
        if self.scorer is not None:
            live[SCORER_SLOT] = None  # the live scorer, handed to the harness in its context below
        ecfg = replace(self.validation, **policy_eval_settings(self.spec, live))
        ctx = HarnessContext(agent_backend=self.backend, chat=self.chat, retriever=self.retriever, protocol=self.protocol,
                             scorer=self.val_ranker if self.scorer is not None else None)
        if not self.dp.distributed:
            return evaluate(ecfg.methods[0], self.val_questions, ctx, ecfg, progress=False)
        # data parallel: each rank answers its share of the questions one process would answer (not
        # selected again), and every rank gets all records (one list per question), in order
        def answered(mine: list[QAExample]) -> list[list[dict]]:
            rows = evaluate(ecfg.methods[0], mine, ctx, replace(ecfg, n_per_dataset=None), progress=False).to_dict("records")
            return [[r for r in rows if r["question_id"] == q.id] for q in mine]

        per_question = self.dp.map_items(select_examples(self.val_questions, ecfg.n_per_dataset), answered)
        return pd.DataFrame([r for records in per_question for r in records])

    # -- checkpoints (the protocol: rl.run_protocol.TrainingRun)

    def _close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None

    def _extra_state(self) -> dict[str, Any]:
        if self.scorer is None:
            return {}
        return {SCORER_SLOT: scorer_state(self.scorer, self.scorer_optimizer)
                if self.scorer_trained else {"model": self.scorer.state_dict()}}

    def _save_weights(self, folder: Path) -> None:
        self.policies.save_adapters(folder / "adapters")
        if self.scorer is not None:  # a folder the evaluation harness loads (HarnessConfig.scorer_model)
            self.scorer.save(folder / "adapters" / SCORER_SLOT)

    def _load_extra_state(self, state: dict[str, Any], path: Path) -> None:
        if self.scorer is None:
            return
        saved = renamed_slots(state)
        if SCORER_SLOT not in saved:
            raise ValueError(f"checkpoint {path} holds no scoring ranker, but this run ranks with one")
        if self.scorer_trained:
            load_scorer_state(self.scorer, self.scorer_optimizer, saved[SCORER_SLOT])
        else:
            self.scorer.load_state_dict(saved[SCORER_SLOT]["model"])


def _validation_harness(cfg: TrainConfig, rollout: RolloutConfig, seed: int) -> HarnessConfig:
    """The greedy evaluation of the validation questions when none is given: the rollout's budgets,
    N/K and rule set (``experiment.build_trainer`` passes the profile's ``harness_config`` instead)."""
    return HarnessConfig(split=cfg.val_split, n_per_dataset=cfg.val_per_dataset, seed=seed, temperature=0.0,
                         search=rollout.search, agent_max_new_tokens=rollout.agent_max_new_tokens,
                         ranker_max_new_tokens=rollout.ranker_max_new_tokens,
                         max_context_tokens=rollout.max_context_tokens, rules=rollout.rules,
                         hit_ks=cfg.ranker_reward.hit_ks)
