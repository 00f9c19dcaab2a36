"""A listwise ranker LLM read at its first ranking position (FIRST, Gangi Reddy et al. 2024).

The N candidates sit in one prompt, each behind a one-token identifier (``[A]`` .. ``[T]``: the
SmolLM2 and Qwen tokenizers split ``[10]`` into ``[``, ``1``, ``0``, so numbers would make
``[10]`` start like ``[1]``); the sub-query is repeated after them, and the reply is opened with
``<rerank>[``. The logits of the N identifier tokens at that position are the candidates' scores:
one forward pass ranks the whole list, and a listwise loss on those logits trains exactly the token
that decides Hit@1 (the generative ranker's SFT spreads its loss over ~54 template tokens).

Same interface as ``models.llm_judge.LLMJudgeScorer`` (``scores(query, contents)``, ``save``,
``load``, and from their base ``models.lora_scorer.LoraScorer`` ``param_groups`` and the adapter-only
``state_dict``), so the same listwise training and Plackett-Luce policy use it. Measured
on the embedded world (docs/LOG.md, issue 35): it loses the retriever's position prior under
shuffled training faster than it learns to read; the pointwise judge is the recipe that read.
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

#: The file a complete folder holds (written last).
LISTWISE_MARKER = "listwise_logits.json"
#: The name of the LoRA adapter inside its peft model.
LISTWISE_ADAPTER = "listwise"
#: One-token identifiers, in candidate order.
IDENTIFIERS = "ABCDEFGHIJKLMNOPQRST"
#: The reply's opening: the next token is the first pick's identifier.
REPLY_OPENING = "<rerank>["


def listwise_messages(query: str, contents: Sequence[str], *, max_chars: int) -> list[dict[str, str]]:
    """The prompt: the candidates (title, first sentence capped at ``max_chars``) behind their
    identifiers, then the sub-query again, then what to reply."""
    if len(contents) > len(IDENTIFIERS):
        raise ValueError(f"at most {len(IDENTIFIERS)} candidates have one-token identifiers, got {len(contents)}")
    blocks = []
    for ident, row in zip(IDENTIFIERS, contents):
        title, text = split_contents(row)
        sentence = capped_first_sentence(text, max_chars)
        blocks.append(f"[{ident}] {title}\n{sentence}")
    listing = "\n\n".join(blocks)
    content = (f"Search query: {query.strip()}\n\nCandidate passages:\n{listing}\n\n"
               f"Search query: {query.strip()}\nWhich passage answers the search query? Reply with its letter.")
    return [{"role": "user", "content": content}]


class ListwiseLogitScorer(LoraScorer):
    """``scores(query, contents) -> (N,)``: the identifier logits at the first ranking position."""

    def __init__(self, model: Any, tokenizer: Any, *, source: str, max_chars: int = 160) -> None:
        super().__init__(model, tokenizer, source=source, max_chars=max_chars)
        self.identifier_ids = [single_token_id(tokenizer, c) for c in IDENTIFIERS]
        self.opening_ids = tokenizer.encode(REPLY_OPENING, add_special_tokens=False)

    @classmethod
    def from_model(cls, name: str, lora: LoraSettings, *, max_chars: int = 160, device: str | None = None) -> ListwiseLogitScorer:
        model, tokenizer = fresh_lora_model(name, lora, LISTWISE_ADAPTER, device=device)
        return cls(model, tokenizer, source=name, max_chars=max_chars)

    def prompt_ids(self, query: str, contents: Sequence[str]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(listwise_messages(query, contents, max_chars=self.max_chars),
                                                 add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        return [*ids, *self.opening_ids]

    def scores(self, query: str, contents: Sequence[str]) -> torch.Tensor:
        if not contents:
            return torch.zeros(0, device=self.device)
        ids = torch.tensor([self.prompt_ids(query, contents)], device=self.device)  # (1, T)
        logits = self.model(input_ids=ids).logits[0, -1]  # (V,)
        return logits[self.identifier_ids[: len(contents)]].float()

    def save(self, folder: str | Path, *, notes: dict | None = None) -> Path:
        meta = {"source": self.source, "max_chars": self.max_chars, **(notes or {})}
        return save_lora_scorer(self.model, LISTWISE_ADAPTER, folder, LISTWISE_MARKER, meta)

    @classmethod
    def load(cls, folder: str | Path, *, device: str | None = None) -> ListwiseLogitScorer:
        model, tokenizer, meta = load_lora_scorer(folder, LISTWISE_ADAPTER, LISTWISE_MARKER, device=device)
        return cls(model, tokenizer, source=meta["source"], max_chars=meta["max_chars"])


__all__ = ["IDENTIFIERS", "ListwiseLogitScorer", "listwise_messages"]
