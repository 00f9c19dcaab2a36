"""Relevance training of the ranker alone: the paper's Fixed Ranker.

The paper's Fixed Ranker is a generative ranker "fine-tuned on a relevance-based IR dataset but kept
frozen during RL training": trained with RL and the Hit@{1,3,5} reward on queries whose relevant
passages are known, then frozen. This module is that stage on the project's own data, with no agent
in the loop (so it is cheap):

* **prompts**: every gold-chain hop of the training split's questions is one sub-query
  (:func:`~cosearch_lib.rl.ranker_validation.gold_sub_queries`: the question, the hop's gold
  sub-query, and as relevant the candidates containing the hop's answer); its candidates are the
  retriever's top-N, fetched once for the whole pool. Sub-queries none of whose N candidates is
  relevant are left out (the paper drops queries with no relevant passage in the top 50 too):
  every ranking of them scores the same, so their groups carry no signal. Or, as in the paper
  (``relevance.source: prepared``), the queries of a prepared relevance set
  (:mod:`~cosearch_lib.retrieval.relevance_sets`: training questions, their top-N and labels, the
  unanswerable already dropped), with no search at the start (:func:`prepared_items`);
* **a step**: ``prompts_per_step`` sub-queries (a seeded permutation of the pool, epoch after
  epoch, :func:`~cosearch_lib.seeding.step_order`), each ranked ``group_size`` times by the ranker
  adapter sampling at ``temperature``; the G rankings of one prompt form one GRPO group;
* **reward**: r_rel of the K passages a ranking shows (:func:`~cosearch_lib.rl.rewards.relevance_reward`:
  mean Hit@k over ``hit_ks``, or nDCG), and ``invalid_penalty`` for an output that breaks the
  protocol (the released reward's -0.2); group-relative advantages; one GRPO update of the ranker
  adapter (:func:`~cosearch_lib.rl.policy_update.grpo_update`, the joint trainer's loss);
* **validation**: the greedy ranking's Hit@1/3/5 on held-out sub-queries of the validation split
  (:class:`~cosearch_lib.rl.ranker_validation.RankerValidationSet`), before the first update, every
  ``eval_every`` steps (0: never between) and after the last: the Hit@k curve, and per-item rows for paired intervals.

A run's folder holds ``steps.csv`` (:data:`~cosearch_lib.run_schema.RELEVANCE_STEP_GLOSSARY`),
``validation.csv`` (:data:`~cosearch_lib.run_schema.VALIDATION_GLOSSARY`, method ``relevance``; once it has rows) and
checkpoints (:mod:`~cosearch_lib.rl.run_checkpoints`), so an interrupted run resumes where it
stopped; ``experiment.relevance_ranker`` caches the result keyed by its settings, as the warm start is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import LLMRanker, Ranking, RankRequest
from cosearch_lib.config import ProtocolConfig, RankerRewardConfig, RelevanceConfig, RolloutConfig, SamplingConfig, TrainConfig
from cosearch_lib.data.passage import Passage
from cosearch_lib.metrics import has_answer, shown_hits
from cosearch_lib.models.lora_policies import PolicySet
from cosearch_lib.models.served_adapters import ServedAdapters
from cosearch_lib.retrieval.relevance_sets import RelevanceQuery
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.rl.grpo_loss import group_advantages
from cosearch_lib.rl.policy_sequences import ranker_sequences
from cosearch_lib.rl.policy_update import UpdateJob, grpo_update
from cosearch_lib.rl.ranker_validation import GoldSubQuery, RankerValidationSet, summarize_items
from cosearch_lib.rl.rewards import relevance_reward
from cosearch_lib.rl.run_protocol import TrainingRun
from cosearch_lib.run_schema import LIVE_ADAPTERS_DIR, namespaced_record
from cosearch_lib.seeding import step_order
from cosearch_lib.stage_clock import StageClock

#: The method name of a relevance run's rows in ``validation.csv``.
RELEVANCE_METHOD = "relevance"
#: The stages whose seconds make up ``step_s``.
RELEVANCE_STAGES = ("rollout", "reward", "update")


@dataclass(frozen=True)
class RankingItem:
    """A sub-query with its retriever top-N and their relevance labels: one prompt of the pool."""

    query: GoldSubQuery
    candidates: tuple[Passage, ...]
    relevant: tuple[int, ...]  # has_answer(candidate, query.answers) per candidate

    @property
    def answerable(self) -> bool:
        return any(self.relevant)


def ranking_items(queries: Sequence[GoldSubQuery], retriever: SearchBackend, topn: int) -> list[RankingItem]:
    """Each query with the retriever's top-N for its sub-query (one batched search) and their labels."""
    found = retriever.search([q.sub_query for q in queries], topn) if queries else []
    return [RankingItem(q, tuple(c), tuple(int(has_answer(p.contents, list(q.answers))) for p in c))
            for q, c in zip(queries, found)]


def prepared_items(queries: Sequence[RelevanceQuery]) -> list[RankingItem]:
    """A prepared relevance set's queries as prompts of the pool: the question is the sub-query too."""
    return [RankingItem(GoldSubQuery(q.id, -1, q.question, q.question, q.golden_answers, q.data_source),
                        q.candidates, q.relevant) for q in queries]


@dataclass
class SampledRanking:
    """One of the G rankings of a prompt: what the reward reads (``relevant``, ``order``) and what the
    update trains on (the prompt and output ids, the sampling log-probs)."""

    item: RankingItem
    sample: int
    ranking: Ranking

    @property
    def relevant(self) -> list[int]:
        return list(self.item.relevant)

    @property
    def order(self) -> list[int]:
        return self.ranking.order

    @property
    def prompt_ids(self) -> list[int]:
        return self.ranking.prompt_ids

    @property
    def output_ids(self) -> list[int]:
        return self.ranking.output_ids

    @property
    def output_logprobs(self) -> list[float]:
        return self.ranking.output_logprobs


def ranking_rewards(samples: Sequence[SampledRanking], cfg: RelevanceConfig) -> list[float]:
    """The reward of each sampled ranking: ``invalid_penalty`` when its output broke the protocol
    (unless that is None), else r_rel of the K passages it shows."""
    reward_cfg = RankerRewardConfig(relevance=cfg.relevance, hit_ks=cfg.hit_ks)
    return [cfg.invalid_penalty if not s.ranking.valid and cfg.invalid_penalty is not None
            else relevance_reward(s, reward_cfg) for s in samples]


@dataclass
class RelevanceInputs:
    """What a :class:`RelevanceTrainer` runs on (``experiment.relevance_ranker`` builds it)."""

    policies: PolicySet  # the ranker adapter (trained) on the base model
    tokenizer: Any
    retriever: SearchBackend
    prompts: Sequence[GoldSubQuery]  # the training pool (before the answerable filter), searched at the start
    val_queries: Sequence[GoldSubQuery]  # the held-out sub-queries of the Hit@k curve
    rollout: RolloutConfig  # N/K, the ranker's token budget and top_p, the rule set's ranker output protocol
    protocol: ProtocolConfig  # the ranker prompt and its passage cap
    backend: Any = None  # generates the rankings (required): the policy model's own (experiment.building.policy_engine), vLLM, a test's scripted one
    training: TrainConfig = field(default_factory=TrainConfig)  # the profile's joint training: the update's clipping and memory knobs (RelevanceConfig.update_settings)
    items: Sequence[RankingItem] | None = None  # instead of prompts: queries with their candidates and labels (a prepared relevance set)


class RelevanceTrainer(TrainingRun):
    """Ranker-only GRPO with r_rel; ``run`` steps, records, validates and checkpoints (the protocol
    both trainers share: ``rl.run_protocol.TrainingRun``)."""

    def __init__(self, cfg: RelevanceConfig, inputs: RelevanceInputs, *, out_dir: str | Path, seed: int = 0,
                 progress: bool = True) -> None:
        self.cfg, self.seed, self.progress = cfg, seed, progress
        self.policies, self.retriever, self.rollout = inputs.policies, inputs.retriever, inputs.rollout
        self.adapter = inputs.policies.adapter("ranker")
        if self.adapter is None or not inputs.policies.is_trained("ranker"):
            raise ValueError("relevance training needs a trainable ranker adapter (PolicySet roles {'ranker': ...})")
        self._start_run(out_dir, name=RELEVANCE_METHOD, keep_checkpoints=1)
        self.pad_id = inputs.tokenizer.pad_token_id if inputs.tokenizer.pad_token_id is not None \
            else inputs.tokenizer.eos_token_id
        backend = inputs.backend
        if backend is None:
            raise ValueError("RelevanceInputs.backend is None: build the generation engine first "
                             "(experiment.building.policy_engine builds the policy model's own)")
        # A backend that reads adapters from disk (vLLM) samples with saved copies: registered before
        # it first generates, again after every update and after a resume (as the joint trainer does).
        self.backend = backend
        self.served = ServedAdapters(self.policies, backend, self.out_dir / LIVE_ADAPTERS_DIR, [self.adapter])
        if cfg.grpo.start_reference:  # the KL term's reference: the ranker as it starts, before any resume
            self.policies.freeze_start_references()
        self.update_settings = cfg.update_settings(
            inputs.training, recompute_old=cfg.grpo.recomputes_old_logprobs(generated_by_trainer=not self.served.enabled))
        chat = ChatTokens(inputs.tokenizer)
        sampling = SamplingConfig(temperature=cfg.temperature, top_p=inputs.rollout.top_p,
                                  max_new_tokens=inputs.rollout.ranker_max_new_tokens, stop=("</rerank>",), seed=seed)
        output = inputs.rollout.rules.ranker_output
        self.ranker = LLMRanker(backend, chat, inputs.protocol, sampling, adapter=self.adapter, output_protocol=output)
        greedy = SamplingConfig(temperature=0.0, top_p=1.0, max_new_tokens=sampling.max_new_tokens, stop=sampling.stop,
                                seed=seed)
        self.val_ranker = LLMRanker(backend, chat, inputs.protocol, greedy, adapter=self.adapter, output_protocol=output)
        search = inputs.rollout.search
        self.topn, self.topk = search.topn, search.topk
        all_items = list(inputs.items) if inputs.items is not None else \
            ranking_items(list(inputs.prompts), self.retriever, self.topn)
        self.pool = [it for it in all_items if it.answerable]
        if not self.pool:
            raise ValueError(f"relevance training: none of the {len(all_items)} training sub-queries has a relevant "
                             f"passage among its top-{self.topn} candidates")
        self.pool_stats = {"sub_queries": len(all_items), "answerable": len(self.pool)}
        self.validation = RankerValidationSet(list(inputs.val_queries), self.retriever, topn=self.topn, topk=self.topk,
                                              hit_ks=cfg.hit_ks)

    # -- one step

    def step_items(self, step: int) -> list[RankingItem]:
        return [self.pool[i] for i in step_order(len(self.pool), step, self.cfg.prompts_per_step, self.seed,
                                                 stream="relevance-order")]

    def train_step(self) -> dict:
        """One GRPO step on ``prompts_per_step`` prompts x G samples; keeps and returns its record
        (:meth:`run` adds the validation when it is due)."""
        cfg, step = self.cfg, self.step
        self.served.serve(self.step)
        clock = StageClock()
        with clock("rollout"):
            items = self.step_items(step)
            requests = [RankRequest(q0=it.query.question, sub_query=it.query.sub_query, candidates=list(it.candidates),
                                    k=self.topk, row_key=("relevance", step, j, it.query.item_id, g))
                        for j, it in enumerate(items) for g in range(cfg.group_size)]  # j: an item drawn twice samples twice
            rankings = self.ranker.rank(requests)
            samples = [SampledRanking(items[i // cfg.group_size], i % cfg.group_size, r) for i, r in enumerate(rankings)]
        with clock("reward"):
            rewards = ranking_rewards(samples, cfg)
            groups = torch.tensor([i // cfg.group_size for i in range(len(samples))])
            advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), groups,
                                          scale_std=cfg.grpo.scale_std, eps=cfg.grpo.std_eps).tolist()
        with clock("update"):
            stats = grpo_update(self.policies, self.adapter,
                                [UpdateJob("ranker", ranker_sequences(samples), advantages, cfg.temperature,
                                           prompt_groups=groups.tolist())], self.update_settings, pad_id=self.pad_id)
            self.served.push(step + 1)  # the engine gets the updated weights
        self.step += 1
        record = {"step": step, **self._step_stats(samples, rewards), **stats}
        record.update(clock.columns(), step_s=clock.total(*RELEVANCE_STAGES))
        record = namespaced_record(record)
        self.records.append(record)
        return record

    def _validation_due(self) -> bool:
        """Every ``eval_every`` steps (0: none between) and always after the last."""
        every = self.cfg.eval_every
        return bool(every and self.step % every == 0) or self.step == self.cfg.steps

    def _progress_figures(self, record: dict) -> dict[str, str]:
        return {"reward": f"{record['ranker/reward']:.3f}", "hitK": f"{record['ranker/hit@K']:.2f}"}

    def _save_weights(self, folder: Path) -> None:
        self.policies.save_adapters(folder / "adapters", [self.adapter])

    def _step_stats(self, samples: Sequence[SampledRanking], rewards: Sequence[float]) -> dict[str, float]:
        """The step's sampled rankings in numbers (columns of RELEVANCE_STEP_GLOSSARY)."""
        g = self.cfg.group_size
        by_group = np.asarray(rewards, dtype=float).reshape(-1, g)
        hits = [shown_hits([s.item.relevant[i] for i in s.order] or [0], self.cfg.hit_ks, self.topk)
                for s in samples]  # nothing shown: no hit
        return {"n_prompts": len(samples) // g, "n_samples": len(samples), "reward": float(np.mean(rewards)),
                **{h: float(np.mean([r[h] for r in hits])) for h in self.validation.hits},
                "valid_rate": float(np.mean([s.ranking.valid for s in samples])),
                "groups_with_signal": int(np.sum(by_group.max(axis=1) > by_group.min(axis=1))),
                "output_tokens": float(np.mean([len(s.output_ids) for s in samples]))}

    # -- validation

    def validate(self, step: int) -> dict[str, float]:
        """The greedy ranking's ``val_ranker_*`` columns on the held-out sub-queries; the per-item rows
        go to :attr:`val_records` under ``step`` (-1: before the first update)."""
        self.served.serve(self.step)
        rows = self.validation.score_items(self.val_ranker)
        self.val_records.extend({"step": step, "method": RELEVANCE_METHOD, "kind": "ranker", **row} for row in rows)
        return summarize_items(rows, self.validation.hits)

    # -- the result

    def save_ranker(self, root: str | Path) -> Path:
        """The trained ranker adapter in peft's format, ``root/<adapter>/`` (what the Fixed Ranker loads)."""
        return self.policies.save_adapters(root, [self.adapter])[self.adapter]
