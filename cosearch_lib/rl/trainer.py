"""The joint GRPO trainer: questions -> rollouts -> rewards -> groups -> updates -> records -> checkpoint.

One step (:meth:`JointTrainer.train_step`):

1. take the step's questions (a seeded permutation of the training split, epoch after epoch);
2. roll out G trajectories per question with the batched engine: the agent adapter samples turns,
   the retriever returns N candidates, the method's ranker picks K;
3. rewards: the agent's (Eq. 4) per trajectory, the ranker's (Eq. 6 or the released variant) per
   search call;
4. groups: the agent's G trajectories of a question form one group; the ranker's calls are grouped
   semantically (Alg. 2), reusing the agent's rollouts;
5. one GRPO update of each trained adapter (clipped surrogate + k3 KL to the base model);
6. a tidy record of the step; a checkpoint (adapters, optimizer states, RNG states, records).

Every ``eval_every`` steps (and after the last) the record also gets a greedy validation: the
agent's answer F1 on the validation questions (``val_f1``) and the method's ranking alone on held-out
sub-queries of those questions (``val_ranker_hit@k``, ``rl.ranker_validation``). With
``validate_at_start`` the same validation runs once before the first update, as a record of its
own with ``step = -1`` (only ``step``, ``method`` and the ``val_*`` columns): the curves, drawn
over steps completed (``step + 1``), then start at 0 from the warm start's point.

Methods (``TrainConfig.method``), one code path with a role table rather than string switches in
the loop:

==============  ===================  ==================  =====================
method          ranking              agent trained        ranker trained
==============  ===================  ==================  =====================
search_r1       retriever top-K      yes                  (no ranker)
fixed_ranker    LLM ranker adapter   yes                  no (frozen warm start)
cosearch        LLM ranker adapter   yes                  yes
oracle          Eq. 7 oracle         yes                  (no ranker)
==============  ===================  ==================  =====================

Departures from the paper: LoRA adapters on one shared base instead of two full models (so the
reference policy of the KL term is the base with adapters disabled); a much smaller rollout batch
and learning rate suited to LoRA; sequences whose advantage is exactly 0 are not forwarded (their
tokens still count in the token-mean denominator, so the policy gradient is the full batch's; their
KL term, weight 0.001, is left out); one optimizer step per training step unless ``minibatches`` > 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import CrossEncoderPolicyRanker, LLMRanker, OracleRanker, Ranker, RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine
from cosearch_lib.atomic_io import replace_dir, write_table
from cosearch_lib.config import ROLE_TABLE, ProtocolConfig, RolloutConfig, SamplingConfig, TrainConfig
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.harness import HarnessConfig, HarnessContext, evaluate, select_examples
from cosearch_lib.eval.tables import summary_table
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.lora_policies import PolicySet, sync_adapters
from cosearch_lib.paths import project_relative
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.cross_encoder_policy import cross_encoder_update, load_scorer_state, make_optimizer, scorer_state
from cosearch_lib.rl.grpo_loss import group_advantages
from cosearch_lib.rl.judge import judge_calls
from cosearch_lib.rl.policy_update import UpdateJob, agent_sequences, grpo_update, ranker_sequences
from cosearch_lib.rl.ranker_validation import (
    RANKER_VALIDATION_KS,
    RankerValidationSet,
    held_out_sub_queries,
    summarize_items,
)
from cosearch_lib.rl.rewards import agent_rewards, ranker_rewards
from cosearch_lib.rl.semantic_grouping import group_ids, group_ranker_calls
from cosearch_lib.rl.tracking import StepTracker, make_tracker
from cosearch_lib.seeding import rng
from cosearch_lib.stop_signals import StopRequest, StopRequested

#: training method -> the evaluation harness method that evaluates its policies
EVAL_METHOD = {"search_r1": "agent_retrieval", "fixed_ranker": "agent_fixed_ranker",
               "cosearch": "agent_trained_ranker", "oracle": "agent_oracle"}


#: Every column of the per-step records (``steps.csv``), for the README glossary. ``<role>`` is
#: agent or ranker (the policy updated), ``<adapter>`` agent, ranker, shared or cross_encoder (the
#: cross-encoder ranker of ``training.ranker_kind: cross_encoder``, whose stats read ``ranker_*``).
STEP_GLOSSARY: dict[str, str] = {
    "step": "0-based training step; -1: the validation before the first update (TrainConfig.validate_at_start), "
            "a row with only step, method and the val_* columns",
    "method": "training method (config.TRAINING_METHODS)",
    "n_questions": "questions rolled out this step", "n_trajectories": "trajectories (questions x G)",
    "agent_reward": "mean agent reward, Eq. 4 (F1 if the protocol was kept, else -alpha)",
    "agent_f1": "mean answer F1 of the trajectories (0 without a valid answer)",
    "agent_format_ok": "share of trajectories that kept the protocol on every turn and answered",
    "searches_per_traj": "mean searches run per trajectory",
    "n_ranker_calls": "search calls this step (one ranking each)",
    "ranker_valid_rate": "share of ranker outputs that followed the protocol (rule rankers: 1)",
    "hit@5": "mean Hit@5 of the passages shown to the agent, over all search calls",
    "i_ans_rate": "share of search calls whose N candidates held an answer passage (I_ans = 1)",
    "r_rel_pre": "mean relevance reward over all search calls (before grouping filters)",
    "r_rel_post": "mean relevance reward over the calls in surviving ranker groups",
    "ranker_reward_pre": "mean composite ranker reward over kept calls (before grouping filters)",
    "ranker_reward_post": "mean composite ranker reward over the calls in surviving groups",
    "ranker_main_pre": "mean r_main (agent term of the composite) over kept calls",
    "ranker_main_post": "mean r_main over the calls in surviving groups",
    "grouping_<stat>": "semantic-grouping statistics of the step (grouping.GROUPING_GLOSSARY)",
    "<role>_loss": "GRPO loss of the role's update (surrogate + KL), token-weighted over micro-batches",
    "<role>_pg_loss": "the clipped-surrogate part of the loss",
    "<role>_kl": "token-mean k3 KL to the reference (base model, adapters off)",
    "<role>_clip_frac": "share of tokens whose gradient the clip zeroed",
    "<role>_ratio_mean": "mean importance ratio exp(logp - old logp) over tokens",
    "<role>_ratio_max": "largest importance ratio",
    "<role>_adv_mean": "mean advantage of the forwarded sequences",
    "<role>_n_forwarded": "sequences forwarded (non-zero advantage)",
    "<role>_n_tokens": "scored tokens in the forwarded sequences",
    "<role>_pad_frac": "padding positions / all token positions forwarded in the role's micro-batches "
                       "(TrainConfig.length_grouped_micro_batches lowers it)",
    "<role>_first_abs_log_ratio": "mean |logp - old logp| over the scored tokens of the role's first micro-batch, "
                                  "before any optimizer step: the drift between the rollout's sampling log-probs and "
                                  "the update's teacher-forced ones (~0 in float32 on CPU; bf16 on a GPU shows it)",
    "<adapter>_grad_norm": "adapter gradient norm before clipping (mean over minibatches)",
    "<adapter>_update_s": "seconds spent updating the adapter",
    "sync_s": "seconds spent saving the updated adapters and re-registering them with vLLM (vLLM backend only)",
    "rollout_s": "seconds of rollout (generation, retrieval, ranking)",
    "reward_s": "seconds of rewards, advantages and grouping", "update_s": "seconds of all updates",
    "step_s": "seconds of the whole step (validation excluded, adapter sync included)",
    "val_f1": "greedy avg F1 on the validation questions (every eval_every steps, after the last, and at step -1)",
    "val_ranker_hit@1": "Hit@1 of the K passages the method's greedy ranking shows (retriever top-K for search_r1, "
                        "Eq. 7 for oracle), mean over the held-out sub-queries of the validation questions (their "
                        "gold-chain hops, relevance: the hop's answer; the question itself without a chain); "
                        "at the steps of val_f1",
    "val_ranker_hit@3": "Hit@3 of the same lists (the whole list when K < 3; see val_ranker_hit@1)",
    "val_ranker_hit@5": "Hit@5 of the same lists (the whole list when K < 5)",
    "val_ranker_valid_rate": "share of the held-out rankings that followed the protocol (rule rankings: 1)",
}


#: Columns of ``validation.csv``: one row per validation item (a validation question or a held-out
#: sub-query) and validation; what notebook 03's paired intervals on the validation curves resample.
VALIDATION_GLOSSARY: dict[str, str] = {
    "step": "the step record whose val_* columns these rows make up (0-based step; -1: before the first update)",
    "method": "training method (search_r1, fixed_ranker, cosearch, oracle)",
    "kind": "agent: one validation question through the agent loop (f1); ranker: one held-out sub-query ranked "
            "alone (hit@k, valid)",
    "question_id": "the validation question (agent rows) or <question_id>/hop<h> (ranker rows: the gold chain's hop; "
                   "/question when the question text stands in)",
    "dataset": "the question's family; the bootstrap resamples within it",
    "f1": "agent rows: greedy answer F1 of the question (val_f1 is their macro average over families)",
    **{f"hit@{k}": f"ranker rows: Hit@{k} of the K passages the method's greedy ranking shows "
                   f"(val_ranker_hit@{k} is their mean)" for k in RANKER_VALIDATION_KS},
    "valid": "ranker rows: 1 when the ranking followed the protocol (rule rankings: always)",
}
VALIDATION_COLUMNS = tuple(VALIDATION_GLOSSARY)


def describe_step_metric(name: str) -> str:
    """The glossary entry of a step-record column (patterns included); KeyError when undocumented."""
    if name in STEP_GLOSSARY:
        return STEP_GLOSSARY[name]
    if name.startswith("grouping_"):
        return STEP_GLOSSARY["grouping_<stat>"]
    for head in ("agent", "ranker", "shared", "cross_encoder"):
        tail = name[len(head) + 1:] if name.startswith(f"{head}_") else None
        for pattern in ((f"<role>_{tail}", f"<adapter>_{tail}") if tail else ()):
            if pattern in STEP_GLOSSARY:
                return STEP_GLOSSARY[pattern]
    raise KeyError(f"step metric {name!r} has no glossary entry")


# --------------------------------------------------------------------------- the trainer


def question_order(n: int, step: int, per_step: int, seed: int) -> list[int]:
    """Indices of the questions of ``step``: consecutive slices of seeded permutations of range(n),
    one permutation per epoch, so a step's questions depend only on (seed, step)."""
    if n < 1:
        raise ValueError("no training questions")
    perms: dict[int, np.ndarray] = {}  # a step spans at most a few epochs; permute each once
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, n)
        if epoch not in perms:
            perms[epoch] = rng("train-order", seed, epoch).permutation(n)
        out.append(int(perms[epoch][i]))
    return out


class JointTrainer:
    """Trains the policies of one method; ``run`` steps, records and checkpoints."""

    def __init__(self, cfg: TrainConfig, policies: PolicySet, tokenizer: Any, retriever: SearchBackend,
                 questions: Sequence[QAExample], rollout_cfg: RolloutConfig, protocol: ProtocolConfig, *,
                 out_dir: str | Path, seed: int = 0, val_questions: Sequence[QAExample] = (),
                 generation_options: Mapping[str, Any] | None = None, progress: bool = True, chat: ChatTokens | None = None,
                 backend: Any = None, tracker: StepTracker | None = None, cross_encoder: Any = None) -> None:
        if rollout_cfg.temperature <= 0:
            raise ValueError("GRPO needs sampled rollouts: rollout temperature must be > 0")
        self.cfg, self.policies, self.tokenizer, self.retriever = cfg, policies, tokenizer, retriever
        self.questions, self.val_questions = list(questions), list(val_questions)
        self.rollout_cfg, self.protocol, self.seed, self.progress = rollout_cfg, protocol, seed, progress
        self.out_dir = Path(out_dir)
        self.chat = chat or ChatTokens(tokenizer)
        # Rollouts run on ``backend`` when given (vLLM on GPU, a scripted backend in tests), else on
        # the policy model itself (TransformersBackend with ``generation_options``, e.g. the profile's
        # batch_size and compile_decode); the updates always run on the policy model.
        self.backend = backend if backend is not None else TransformersBackend(policies.model, tokenizer,
                                                                               **(generation_options or {}))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # The cross-encoder ranker (training.ranker_kind: cross_encoder) lives beside the LoRA policies,
        # with its own optimizer when the method trains its ranker.
        if cfg.uses_cross_encoder and cross_encoder is None:
            raise ValueError(f"training.ranker_kind 'cross_encoder' with method {cfg.method!r} needs a cross_encoder scorer")
        self.cross_encoder = cross_encoder if cfg.uses_cross_encoder else None
        self.cross_encoder_trained = self.cross_encoder is not None and ROLE_TABLE[cfg.method][2]
        self.cross_encoder_optimizer = make_optimizer(self.cross_encoder, cfg.cross_encoder.lr, cfg.cross_encoder.head_lr) \
            if self.cross_encoder_trained else None
        self.step = 0  # steps completed
        self.records: list[dict] = []
        self.call_records: list[dict] = []
        self.val_records: list[dict] = []  # one row per validation item and validation (validation.csv)
        sampling = rollout_cfg.ranker_sampling(seed)
        self.ranker = self._method_ranker(sampling)
        # Validation ranks greedily (the training ranker samples), on sub-queries fixed once per trainer.
        self.val_ranker = self._method_ranker(replace(sampling, temperature=0.0))
        self.ranker_validation = RankerValidationSet(
            held_out_sub_queries(select_examples(self.val_questions, cfg.val_per_dataset)), retriever,
            topn=rollout_cfg.search.topn, topk=rollout_cfg.search.topk)
        self.engine = RolloutEngine(self.backend, self.chat, retriever, self.ranker, rollout_cfg, protocol,
                                    agent_adapter=policies.adapter("agent"))
        # A backend that reads adapters from disk (vLLM: it has add_adapter) samples with saved copies:
        # every role adapter is saved and registered now, and the updated ones again after each step.
        self.live_dir = self.out_dir / "live_adapters"
        self.live_adapters = callable(getattr(self.backend, "add_adapter", None))
        if self.live_adapters:
            sync_adapters(policies, self.backend, self.live_dir)
        self._live_step = self.step  # the step whose adapter weights the backend serves
        # Live logging (cfg.log_to): the given tracker, else one made at the first step and closed by run().
        self.tracker = tracker

    def _method_ranker(self, sampling: SamplingConfig) -> Ranker:
        """The method's ranking: a rule (retrieval top-K, oracle) or the ranker adapter sampling with ``sampling``."""
        rules = self.rollout_cfg.rules
        if self.cfg.ranking == "retrieval":
            return RetrievalOnlyRanker()
        if self.cfg.ranking == "oracle":
            return OracleRanker(rules.trivial_golds)
        if self.cross_encoder is not None:
            return CrossEncoderPolicyRanker(self.cross_encoder, temperature=sampling.temperature, seed=self.seed)
        return LLMRanker(self.backend, self.chat, self.protocol, sampling, adapter=self.policies.adapter("ranker"),
                         output_protocol=rules.ranker_output)

    # -- one step

    def step_questions(self, step: int) -> list[QAExample]:
        return [self.questions[i] for i in question_order(len(self.questions), step, self.cfg.questions_per_step,
                                                           self.seed)]

    def train_step(self) -> dict:
        cfg, step = self.cfg, self.step
        if step == 0 and cfg.validate_at_start and self.val_questions and not self._validated_at_start():
            self._keep({"step": -1, "method": cfg.method, **self.validate(step=-1)})
        t0 = time.perf_counter()
        trajs = self.engine.run(self.step_questions(step), n_samples=cfg.group_size, seed=self.seed, step=step,
                                progress=self.progress)
        t_rollout = time.perf_counter()
        a_rewards = agent_rewards(trajs, cfg.agent_reward)
        q_index = {q: i for i, q in enumerate(dict.fromkeys(t.question_id for t in trajs))}
        reward_dtype = torch.float32 if self.rollout_cfg.rules.reward_dtype == "float32" else torch.float64
        a_adv = group_advantages(torch.tensor(a_rewards, dtype=reward_dtype),
                                 torch.tensor([q_index[t.question_id] for t in trajs]),
                                 scale_std=cfg.grpo.scale_std, eps=cfg.grpo.std_eps).tolist()
        calls = [c for t in trajs for c in t.ranker_calls]
        if cfg.ranker_reward.relevance == "judge":  # the LLM-as-judge ablation: the base model labels the shown passages
            judge_calls(calls, self.backend, self.chat, adapter=None, seed=self.seed)
        r_rewards = ranker_rewards(trajs, cfg.ranker_reward, agent_cfg=cfg.agent_reward)
        grouping = group_ranker_calls(calls, r_rewards, cfg.grouping)
        gids = group_ids(grouping, len(calls))
        r_adv = [0.0] * len(calls)
        in_group = [i for i, g in enumerate(gids) if g >= 0]
        if in_group:
            adv = group_advantages(torch.tensor([grouping.rewards[i] for i in in_group], dtype=reward_dtype),
                                   torch.tensor([gids[i] for i in in_group]), scale_std=cfg.grpo.scale_std,
                                   eps=cfg.grpo.std_eps)
            for i, a in zip(in_group, adv.tolist()):
                r_adv[i] = a
        t_reward = time.perf_counter()

        jobs: dict[str, list[UpdateJob]] = {}
        ro = self.rollout_cfg
        if self.policies.is_trained("agent"):
            jobs.setdefault(self.policies.adapter("agent"), []).append(
                UpdateJob("agent", agent_sequences(trajs), a_adv, ro.temperature))
        if self.policies.is_trained("ranker") and calls:
            ranker_t = ro.temperature if ro.ranker_temperature is None else ro.ranker_temperature
            jobs.setdefault(self.policies.adapter("ranker"), []).append(
                UpdateJob("ranker", ranker_sequences(calls), r_adv, ranker_t))
        update_stats, update_time = {}, {}
        if self.cross_encoder_trained and calls:
            u0 = time.perf_counter()
            ranker_t = ro.temperature if ro.ranker_temperature is None else ro.ranker_temperature
            update_stats["cross_encoder"] = cross_encoder_update(
                self.cross_encoder, self.cross_encoder_optimizer, calls, r_adv, cfg.grpo, temperature=ranker_t,
                max_grad_norm=cfg.max_grad_norm)
            update_time["cross_encoder"] = time.perf_counter() - u0
        for adapter, adapter_jobs in jobs.items():
            u0 = time.perf_counter()
            update_stats[adapter] = grpo_update(self.policies, adapter, adapter_jobs, cfg.grpo,
                                                micro_batch=cfg.micro_batch, max_grad_norm=cfg.max_grad_norm,
                                                pad_id=self.pad_id, minibatches=cfg.minibatches,
                                                length_grouped=cfg.length_grouped_micro_batches,
                                                gradient_checkpointing=cfg.gradient_checkpointing,
                                                shared_prefix=cfg.shared_prefix_update)
            update_time[adapter] = time.perf_counter() - u0
        t_update = time.perf_counter()
        if self.live_adapters:  # the updated adapters' new weights, to the generation engine
            sync_adapters(self.policies, self.backend, self.live_dir, list(jobs))
            self._live_step = step + 1
        t_sync = time.perf_counter()

        record = self._step_record(trajs, a_rewards, calls, r_rewards, grouping, update_stats)
        record.update(rollout_s=t_rollout - t0, reward_s=t_reward - t_rollout, update_s=t_update - t_reward,
                      step_s=t_sync - t0, **{f"{a}_update_s": s for a, s in update_time.items()})
        if self.live_adapters:
            record["sync_s"] = t_sync - t_update
        self.call_records.extend(_call_rows(step, calls, r_rewards, gids, r_adv))
        self.step += 1
        if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps) and self.val_questions:
            record.update(self.validate(step=step))
        self._keep(record)
        return record

    def _keep(self, record: dict) -> None:
        """Append ``record`` to the step records and hand it to the live tracker (made at the first record)."""
        cfg = self.cfg
        self.records.append(record)
        if self.tracker is None and cfg.log_to:
            self.tracker = make_tracker(cfg.log_to, self.out_dir / "tb", f"{cfg.method}-seed{self.seed}",
                                        {**asdict(cfg), "seed": self.seed, "out_dir": str(self.out_dir)},
                                        project=cfg.wandb_project)
        if self.tracker is not None:
            self.tracker.log(record)

    def _validated_at_start(self) -> bool:
        return any(r.get("step") == -1 for r in self.records)

    def _step_record(self, trajs, a_rewards, calls, r_rewards, grouping, update_stats) -> dict:
        kept = [r for r in r_rewards if r.kept]
        in_groups = {i for g in grouping.groups for i in g}
        post = [grouping.rewards[i] for i in sorted(in_groups)]
        rec = {
            "step": self.step, "method": self.cfg.method, "n_questions": len({t.question_id for t in trajs}),
            "n_trajectories": len(trajs),
            "agent_reward": float(np.mean(a_rewards)), "agent_f1": float(np.mean([t.f1 for t in trajs])),
            "agent_format_ok": float(np.mean([t.format_ok for t in trajs])),
            "searches_per_traj": float(np.mean([t.n_searches for t in trajs])),
            "n_ranker_calls": len(calls),
            "ranker_valid_rate": _mean([float(c.valid) for c in calls]),
            "hit@5": _mean([c.hit_at.get(5, 0.0) for c in calls]),
            "i_ans_rate": _mean([float(c.i_ans) for c in calls]),
            "r_rel_pre": _mean([r.r_rel for r in r_rewards]),
            "r_rel_post": _mean([r_rewards[i].r_rel for i in sorted(in_groups)]),
            "ranker_reward_pre": _mean([r.reward for r in kept]),
            "ranker_reward_post": _mean(post),
            "ranker_main_pre": _mean([r.r_main for r in kept]),
            "ranker_main_post": _mean([r_rewards[i].r_main for i in sorted(in_groups)]),
        }
        rec.update({f"grouping_{k}": v for k, v in grouping.stats.items()})
        for adapter, stats in update_stats.items():
            rec.update({(f"{adapter}_{k}" if k == "grad_norm" else k): v for k, v in stats.items()})
        return rec

    # -- validation

    def validate(self, step: int | None = None) -> dict[str, float]:
        """Greedy validation of the method's policies as they are now (before the first update too):
        ``val_f1``, the avg F1 (macro over families) of the agent loop on the validation questions,
        and the ``val_ranker_*`` columns of :meth:`RankerValidationSet.score`, the method's greedy
        ranking on the held-out sub-queries of those questions.

        With ``step`` (the step record the columns join; -1 before the first update) the per-item
        scores are also kept in :attr:`val_records` (``validation.csv``, :data:`VALIDATION_COLUMNS`):
        what the paired intervals of notebook 03 resample."""
        agent = self._agent_records()
        ranker_rows = self.ranker_validation.score_items(self.val_ranker)
        if step is not None:
            base = {"step": step, "method": self.cfg.method}
            self.val_records.extend({**base, "kind": "agent", "question_id": r.question_id, "dataset": r.dataset,
                                     "f1": float(r.f1)} for r in agent.itertuples())
            self.val_records.extend({**base, "kind": "ranker", **row} for row in ranker_rows)
        f1 = float(summary_table(agent)["avg"].iloc[0]) if len(agent) else float("nan")
        return {"val_f1": f1, **summarize_items(ranker_rows)}

    def _agent_records(self) -> pd.DataFrame:
        """The harness records (one per validation question) of the agent loop, greedy, with the method's ranking."""
        method = "agent_cross_encoder" if self.cross_encoder is not None else EVAL_METHOD[self.cfg.method]
        ranker = self.policies.adapter("ranker")
        ecfg = HarnessConfig(methods=(method,), split=self.cfg.val_split, n_per_dataset=self.cfg.val_per_dataset,
                          seed=self.seed, temperature=0.0, agent_adapter=self.policies.adapter("agent"),
                          fixed_ranker_adapter=ranker, trained_ranker_adapter=ranker,
                          search=self.rollout_cfg.search, agent_max_new_tokens=self.rollout_cfg.agent_max_new_tokens,
                          ranker_max_new_tokens=self.rollout_cfg.ranker_max_new_tokens,
                          max_context_tokens=self.rollout_cfg.max_context_tokens, rules=self.rollout_cfg.rules)
        ctx = HarnessContext(agent_backend=self.backend, chat=self.chat, retriever=self.retriever, protocol=self.protocol,
                             cross_encoder=self.val_ranker if self.cross_encoder is not None else None)
        return evaluate(method, self.val_questions, ctx, ecfg, progress=False)

    # -- running, checkpoints

    def run(self, steps: int | None = None) -> pd.DataFrame:
        """Train until ``steps`` (default ``cfg.steps``) steps are done; checkpoint as configured.

        SIGUSR1 or SIGTERM (a cluster's time-limit warning or preemption, :mod:`cosearch_lib.stop_signals`)
        does not kill the run: the step under way finishes, a checkpoint is written (whatever
        ``checkpoint_every`` says) and :class:`~cosearch_lib.stop_signals.StopRequested` is raised;
        the run resumes from that checkpoint (``resume=True``)."""
        until = self.cfg.steps if steps is None else steps
        if self.live_adapters and self._live_step != self.step:  # weights restored from a checkpoint since
            sync_adapters(self.policies, self.backend, self.live_dir)
            self._live_step = self.step
        bar = tqdm(total=until, initial=self.step, desc=f"train {self.cfg.method}", unit="step", disable=not self.progress)
        try:
            with StopRequest() as stop:
                while self.step < until:
                    rec = self.train_step()
                    bar.update(1)
                    bar.set_postfix(reward=f"{rec['agent_reward']:.3f}", hit5=f"{rec['hit@5']:.2f}")
                    every = self.cfg.checkpoint_every
                    saved = None
                    if (every and self.step % every == 0) or self.step == until or stop.received:
                        saved = self.save_checkpoint()
                    if stop.received and self.step < until:
                        print(f"[train {self.cfg.method}] {stop.received}: stopped after step {self.step}, "
                              f"checkpoint {project_relative(saved)}", flush=True)
                        raise StopRequested(stop.received, self.step, project_relative(saved))
        finally:
            bar.close()
            if self.tracker is not None:
                self.tracker.close()
                self.tracker = None
        return self.frame()

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.records)

    def calls_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.call_records)

    def validation_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.val_records, columns=list(VALIDATION_COLUMNS))

    def checkpoint_dir(self, step: int | None = None) -> Path:
        return self.out_dir / "checkpoints" / f"step_{self.step if step is None else step:06d}"

    def save_checkpoint(self) -> Path:
        """``out_dir/checkpoints/step_N/``: state.pt (adapters, optimizers, RNG, step, records) and the
        adapters in peft format; written to a temporary folder and renamed. Records are also written
        as ``out_dir/steps.csv`` and ``ranker_calls.parquet``."""
        final = self.checkpoint_dir()
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            self._write_checkpoint(tmp)
        except BaseException as err:  # a full disk, a quota, a kill: the checkpoints already there stay as they are
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(err, OSError):
                raise
            before = latest_checkpoint(self.out_dir)
            raise OSError(err.errno, f"could not write checkpoint {project_relative(final)} ({err.strerror or err}); "
                                     f"the newest whole checkpoint is {project_relative(before) if before else 'none'}, "
                                     "and the run resumes from it") from err
        replace_dir(tmp, final)  # the same step written again (a resumed run): the old copy goes only once the new one is in
        write_table(self.frame(), self.out_dir / "steps.csv")
        if self.call_records:
            write_table(self.calls_frame(), self.out_dir / "ranker_calls.parquet")
        if self.val_records:
            write_table(self.validation_frame(), self.out_dir / "validation.csv")
        self._prune()
        return final

    def _write_checkpoint(self, tmp: Path) -> None:
        """Everything a resumed run needs, into the folder ``tmp``; the manifest last."""
        tmp.mkdir(parents=True)
        state = {"step": self.step, "policies": self.policies.state_dict(), "records": self.records,
                 "call_records": self.call_records, "val_records": self.val_records, "config": asdict(self.cfg), "seed": self.seed,
                 "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}}
        if self.cross_encoder is not None:
            state["cross_encoder"] = scorer_state(self.cross_encoder, self.cross_encoder_optimizer) \
                if self.cross_encoder_trained else {"model": self.cross_encoder.state_dict()}
        with (tmp / "state.pt").open("wb") as f:  # a Python file: a full disk raises OSError (ENOSPC), not a RuntimeError
            torch.save(state, f)
        self.policies.save_adapters(tmp / "adapters")
        if self.cross_encoder is not None:  # a folder the evaluation harness loads (HarnessConfig.cross_encoder_model)
            self.cross_encoder.save(tmp / "adapters" / "cross_encoder")
        (tmp / "config.json").write_text(json.dumps(asdict(self.cfg), indent=2, default=str))
        write_checkpoint_manifest(tmp)  # last: sizes and hashes of everything above

    def _prune(self) -> None:
        done = sorted(p for p in (self.out_dir / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
        for old in done[: max(0, len(done) - self.cfg.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, path: str | Path | None = None) -> int:
        """Restore from ``path`` (default: the newest checkpoint in ``out_dir``); returns the step."""
        path = Path(path) if path is not None else latest_checkpoint(self.out_dir)
        if path is None:
            raise FileNotFoundError(f"no checkpoint under {self.out_dir / 'checkpoints'}")
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        if state["config"]["method"] != self.cfg.method:
            raise ValueError(f"checkpoint {path} is of method {state['config']['method']!r}, not {self.cfg.method!r}")
        self.policies.load_state_dict(state["policies"])
        if self.cross_encoder is not None:
            if "cross_encoder" not in state:
                raise ValueError(f"checkpoint {path} holds no cross-encoder, but this run ranks with one")
            if self.cross_encoder_trained:
                load_scorer_state(self.cross_encoder, self.cross_encoder_optimizer, state["cross_encoder"])
            else:
                self.cross_encoder.load_state_dict(state["cross_encoder"]["model"])
        self.step, self.records, self.call_records = state["step"], state["records"], state["call_records"]
        self.val_records = state.get("val_records", [])  # checkpoints older than validation.csv have none
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.live_adapters:  # the generation engine must serve the restored weights
            sync_adapters(self.policies, self.backend, self.live_dir)
            self._live_step = self.step
        return self.step


#: The file a checkpoint folder lists its files in (size and SHA-256 each), written last.
CHECKPOINT_MANIFEST = "MANIFEST.json"


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checkpoint_manifest(folder: Path) -> Path:
    """List every file of a checkpoint folder with its size and SHA-256 (``MANIFEST.json``)."""
    files = {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _file_digest(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CHECKPOINT_MANIFEST}
    path = folder / CHECKPOINT_MANIFEST
    path.write_text(json.dumps(files, indent=1))
    return path


def checkpoint_problem(folder: str | Path) -> str | None:
    """None when the checkpoint is whole, else what is wrong with it: no ``state.pt``, or a file
    missing, truncated or changed against its manifest. Checkpoints written before manifests existed
    are checked for ``state.pt`` only."""
    folder = Path(folder)
    if not (folder / "state.pt").exists():
        return "no state.pt"
    manifest = folder / CHECKPOINT_MANIFEST
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{CHECKPOINT_MANIFEST} unreadable"
    for name, want in files.items():
        path = folder / name
        if not path.exists():
            return f"{name} missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']} (truncated?)"
        if _file_digest(path) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (corrupted)"
    return None


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest whole checkpoint of ``out_dir``. A newer one that is damaged
    (:func:`checkpoint_problem`) is skipped with a warning naming it and what is wrong."""
    done = sorted(p for p in (Path(out_dir) / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    for path in reversed(done):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        warnings.warn(f"checkpoint {path} skipped: {problem}; trying the one before it", RuntimeWarning, stacklevel=2)
    return None


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(values)) if values else float("nan")


def _call_rows(step: int, calls, rewards, gids, advs) -> list[dict]:
    return [{"step": step, "question_id": c.question_id, "traj_id": c.traj_id, "turn": c.turn, "sub_query": c.sub_query,
             "i_ans": c.i_ans, "valid": c.valid, "r_rel": r.r_rel, "r_main": r.r_main, "reward": r.reward,
             "kept": r.kept, "reason": r.reason, "group": g, "advantage": a, "hit@5": c.hit_at.get(5, 0.0)}
            for c, r, g, a in zip(calls, rewards, gids, advs)]


#: What a training run writes into its folder (removed by :func:`clear_run`).
RUN_OUTPUTS = ("checkpoints", "steps.csv", "ranker_calls.parquet", "validation.csv", "live_adapters", "tb")


def clear_run(out_dir: str | Path) -> None:
    """Delete a training folder's checkpoints and records (nothing else in it)."""
    for name in RUN_OUTPUTS:
        path = Path(out_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
