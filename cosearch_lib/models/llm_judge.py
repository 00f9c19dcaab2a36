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
``save(folder)`` / ``load(folder)``, ``device``, ``param_groups(lr, head_lr)``. A saved judge is
a folder with the LoRA adapter (peft format) and ``llm_judge.json`` (written last: the base model's
name, the prompt settings).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from cosearch_lib.atomic_io import atomic_dir
from cosearch_lib.config import LoraSettings
from cosearch_lib.data.passage import split_contents
from cosearch_lib.models.lora_policies import peft_lora_config
from cosearch_lib.models.registry import load_causal_lm, quiet_loading

#: The file a complete judge folder holds (written last).
JUDGE_MARKER = "llm_judge.json"
#: The name of the judge's LoRA adapter inside its peft model.
JUDGE_ADAPTER = "judge"
#: The two answers whose logit margin is the score.
YES, NO = " Yes", " No"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(text: str) -> str:
    """``text`` up to its first sentence end (``.``, ``!`` or ``?`` then a space); all of it when none."""
    text = text.strip()
    end = _SENTENCE_END.search(text)
    return text[: end.start()] if end else text


def judge_prompt(query: str, contents: str, *, max_chars: int) -> str:
    """The judge's input for one (sub-query, candidate) pair: a raw completion prompt, no chat template
    (the margin is read at the token after ``Answer:``). ``contents`` is the corpus row (title line,
    then text); the first sentence is capped at ``max_chars`` characters."""
    title, text = split_contents(contents)
    sentence = first_sentence(text)
    if len(sentence) > max_chars:
        sentence = sentence[: max(max_chars - 1, 0)].rstrip() + "…"
    return (f"Search query: {query.strip()}\nPassage: {title}\n{sentence}\n"
            "Does the passage answer the search query? Answer:")


def single_token_id(tokenizer: Any, text: str) -> int:
    """The id of ``text`` when the tokenizer encodes it as one token; ValueError otherwise."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the judge needs {text!r} to be one token, but this tokenizer splits it into {len(ids)}: {ids}")
    return ids[0]


class LLMJudgeScorer(torch.nn.Module):
    """``scores(query, contents) -> (N,)``: the " Yes" - " No" logit margin of the ranker LLM
    (its ``judge`` LoRA adapter) on each candidate alone; differentiable in the adapter."""

    def __init__(self, model: Any, tokenizer: Any, *, source: str, max_chars: int = 160, max_length: int = 128) -> None:
        super().__init__()
        self.model, self.tokenizer, self.source = model, tokenizer, source
        self.max_chars, self.max_length = max_chars, max_length
        self.yes_id, self.no_id = single_token_id(tokenizer, YES), single_token_id(tokenizer, NO)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def from_model(cls, name: str, lora: LoraSettings, *, max_chars: int = 160, max_length: int = 128,
                   device: str | None = None) -> LLMJudgeScorer:
        """A fresh judge on causal LM ``name`` (bundled name, local folder or hub id): its LoRA adapter
        starts at B = 0, so the first scores are the base model's own margins."""

        base, tokenizer = load_causal_lm(name, device=device)
        model = get_peft_model(base, peft_lora_config(lora), adapter_name=JUDGE_ADAPTER)
        return cls(model, tokenizer, source=name, max_chars=max_chars, max_length=max_length)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def param_groups(self, lr: float, head_lr: float | None = None) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: the adapter's LoRA tensors at ``lr`` (a judge has no head)."""
        del head_lr
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": lr}]

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """The adapter's tensors only (what training changes): a checkpoint does not copy the base model."""
        del args, kwargs
        return {k: v.detach().clone() for k, v in self.model.named_parameters() if v.requires_grad}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True, assign: bool = False) -> Any:
        """Load :meth:`state_dict`'s tensors back; ValueError when they are not this judge's adapter tensors."""
        del assign
        own = {k for k, v in self.model.named_parameters() if v.requires_grad}
        if strict and set(state) != own:
            raise ValueError(f"judge state has {len(set(state) - own)} unknown and {len(own - set(state))} missing "
                             "adapter tensors")
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in state.items():
                params[k].copy_(v)
        return None

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


def save_lora_scorer(model: Any, adapter: str, folder: str | Path, marker: str, meta: dict) -> Path:
    """Write an LLM scorer's one LoRA adapter and its ``marker`` file (``meta``, written last) atomically."""
    with atomic_dir(Path(folder)) as tmp:
        model.save_pretrained(tmp, selected_adapters=[adapter])
        (tmp / marker).write_text(json.dumps(meta, indent=2))
    return Path(folder)


def load_lora_scorer(folder: str | Path, adapter: str, marker: str, *, device: str | None = None) -> tuple[Any, Any, dict]:
    """(peft model, tokenizer, meta) of a folder written by :func:`save_lora_scorer`: the base model named
    by its ``source``, the adapter trainable; FileNotFoundError when the marker is missing."""
    folder = Path(folder)
    if not (folder / marker).exists():
        raise FileNotFoundError(f"{folder} is not a saved LLM scorer (no {marker})")
    meta = json.loads((folder / marker).read_text())
    base, tokenizer = load_causal_lm(meta["source"], device=device)
    adapter_dir = folder / adapter if (folder / adapter / "adapter_config.json").exists() else folder
    with quiet_loading():
        model = PeftModel.from_pretrained(base, str(adapter_dir), adapter_name=adapter, is_trainable=True)
    return model, tokenizer, meta


def is_llm_judge_folder(folder: str | Path) -> bool:
    return (Path(folder) / JUDGE_MARKER).exists()


__all__ = ["JUDGE_ADAPTER", "JUDGE_MARKER", "LLMJudgeScorer", "first_sentence", "is_llm_judge_folder", "judge_prompt",
           "load_lora_scorer", "save_lora_scorer", "single_token_id"]
