"""A ranker LLM that reads each candidate: the pointwise judge.

The generative ranker of the paper reads the N candidates in one prompt and writes their order.
At 135M parameters on CPU budgets it never learnt to read that way (docs/LOG.md, issues 23 and 35:
every listwise recipe ended at the retriever's own order or at a fixed position). The judge asks
the same LLM a smaller question, once per candidate, with the sub-query right beside the passage:

    Search query: <sub-query>
    Passage: <title>
    <first sentence, capped>
    Does the passage answer the search query? Answer:

and scores the candidate by the logit margin of " Yes" over " No" at the next token (one forward
pass for the N candidates, left-padded so every row ends at its own last token). The model is the
ranker's base LLM with its own LoRA adapter (``judge``); the ranking policy samples K candidates
Plackett-Luce from the N margins (``agent.rankers.ScorerPolicyRanker`` takes any scorer with
this interface), so every sampled ranking is valid and its log-probability is exact.

Why the first sentence: in the embedded world (and in most encyclopaedic text) the first sentence
names the entity and states the relation the sub-query asks for; it halves the tokens per
candidate against the ranker prompt's 120-character cap (measured: ~1.5 s per training list of 4
candidates on one core, against ~5.8 s for 10 capped candidates).

Same interface as ``models.cross_encoder.CrossEncoderScorer``: ``scores(query, contents) -> (N,)``,
``save(folder)`` / ``load(folder)``, ``device``, ``param_groups(lr, head_lr)`` (the last two, and the
adapter-only ``state_dict``, from ``models.lora_scorer.LoraScorer``). A saved judge is a folder with
the LoRA adapter (peft format) and ``llm_judge.json`` (written last: the base model's name, the
prompt settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from cosearch_lib.config import LoraSettings
from cosearch_lib.data.passage import split_contents
from cosearch_lib.models.lora_scorer import (
    LoraScorer,
    capped_first_sentence,
    fresh_lora_model,
    load_lora_scorer,
    save_lora_scorer,
    single_token_id,
)

#: The file a complete judge folder holds (written last).
JUDGE_MARKER = "llm_judge.json"
#: The name of the judge's LoRA adapter inside its peft model.
JUDGE_ADAPTER = "judge"
#: The two answers whose logit margin is the score.
YES, NO = " Yes", " No"


def judge_prompt(query: str, contents: str, *, max_chars: int) -> str:
    """The judge's input for one (sub-query, candidate) pair: a raw completion prompt, no chat template
    (the margin is read at the token after ``Answer:``). ``contents`` is the corpus row (title line,
    then text); the first sentence is capped at ``max_chars`` characters."""
    title, text = split_contents(contents)
    sentence = capped_first_sentence(text, max_chars)
    return (f"Search query: {query.strip()}\nPassage: {title}\n{sentence}\n"
            "Does the passage answer the search query? Answer:")


class LLMJudgeScorer(LoraScorer):
    """``scores(query, contents) -> (N,)``: the " Yes" - " No" logit margin of the ranker LLM
    (its ``judge`` LoRA adapter) on each candidate alone; differentiable in the adapter."""

    def __init__(self, model: Any, tokenizer: Any, *, source: str, max_chars: int = 160, max_length: int = 128) -> None:
        super().__init__(model, tokenizer, source=source, max_chars=max_chars)
        self.max_length = max_length
        self.yes_id, self.no_id = single_token_id(tokenizer, YES), single_token_id(tokenizer, NO)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def from_model(cls, name: str, lora: LoraSettings, *, max_chars: int = 160, max_length: int = 128,
                   device: str | None = None) -> LLMJudgeScorer:
        """A fresh judge on causal LM ``name`` (bundled name, local folder or hub id): its LoRA adapter
        starts at B = 0, so the first scores are the base model's own margins."""
        model, tokenizer = fresh_lora_model(name, lora, JUDGE_ADAPTER, device=device)
        return cls(model, tokenizer, source=name, max_chars=max_chars, max_length=max_length)

    def prompt_ids(self, query: str, contents: Sequence[str]) -> list[list[int]]:
        """Token ids of each candidate's judge prompt, cut from the left to ``max_length`` (the question
        at the end must survive)."""
        rows = [self.tokenizer.encode(judge_prompt(query, c, max_chars=self.max_chars), add_special_tokens=False)
                for c in contents]
        return [r[-self.max_length:] for r in rows]

    def scores(self, query: str, contents: Sequence[str]) -> torch.Tensor:
        """One margin per candidate (float32, on the judge's device); gradients flow unless under no_grad."""
        if not contents:
            return torch.zeros(0, device=self.device)
        rows = self.prompt_ids(query, contents)
        width = max(map(len, rows))
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], device=self.device)  # (N, T)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        # left padding: position ids count from each row's first real token
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]  # (N, V)
        return (logits[:, self.yes_id] - logits[:, self.no_id]).float()

    def save(self, folder: str | Path, *, notes: dict | None = None) -> Path:
        """Write the judge atomically: its adapter (peft folder) and ``llm_judge.json`` (``notes``: how
        it was trained)."""
        meta = {"source": self.source, "max_chars": self.max_chars, "max_length": self.max_length, **(notes or {})}
        return save_lora_scorer(self.model, JUDGE_ADAPTER, folder, JUDGE_MARKER, meta)

    @classmethod
    def load(cls, folder: str | Path, *, device: str | None = None) -> LLMJudgeScorer:
        model, tokenizer, meta = load_lora_scorer(folder, JUDGE_ADAPTER, JUDGE_MARKER, device=device)
        return cls(model, tokenizer, source=meta["source"], max_chars=meta["max_chars"], max_length=meta["max_length"])


def is_llm_judge_folder(folder: str | Path) -> bool:
    return (Path(folder) / JUDGE_MARKER).exists()


__all__ = ["JUDGE_ADAPTER", "JUDGE_MARKER", "LLMJudgeScorer", "is_llm_judge_folder", "judge_prompt"]
