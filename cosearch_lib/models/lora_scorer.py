"""What the two LLM scorers share: a causal LM with one trainable LoRA adapter that scores a query's
candidates (``models.llm_judge``, one candidate per row; ``models.listwise_logits``, the whole list
in one prompt).

* :class:`LoraScorer`, their base: ``device``, ``param_groups(lr, head_lr)`` (the adapter's tensors;
  an LLM scorer has no head), and a ``state_dict`` of the adapter's tensors only, so that a training
  checkpoint does not copy the base model;
* :func:`capped_first_sentence`: the passage text both prompts show (its first sentence, capped);
* :func:`single_token_id`: a token the scorer reads a logit of;
* :func:`save_lora_scorer` / :func:`load_lora_scorer`: a folder with the adapter (peft format) and
  a marker file of the scorer's kind, written last.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from cosearch_lib.atomic_io import atomic_dir
from cosearch_lib.config import LoraSettings
from cosearch_lib.models.lora_policies import peft_lora_config
from cosearch_lib.models.registry import load_causal_lm, quiet_loading

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(text: str) -> str:
    """``text`` up to its first sentence end (``.``, ``!`` or ``?`` then a space); all of it when none."""
    text = text.strip()
    end = _SENTENCE_END.search(text)
    return text[: end.start()] if end else text


def capped_first_sentence(text: str, max_chars: int) -> str:
    """:func:`first_sentence` of ``text``, cut to ``max_chars`` characters (an ellipsis last) when longer."""
    sentence = first_sentence(text)
    if len(sentence) > max_chars:
        sentence = sentence[: max(max_chars - 1, 0)].rstrip() + "…"
    return sentence


def single_token_id(tokenizer: Any, text: str) -> int:
    """The id of ``text`` when the tokenizer encodes it as one token; ValueError otherwise."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the scorer reads the logit of {text!r}, which must be one token, but this tokenizer "
                         f"splits it into {len(ids)}: {ids}")
    return ids[0]


def fresh_lora_model(name: str, lora: LoraSettings, adapter: str, *, device: str | None = None) -> tuple[Any, Any]:
    """(peft model, tokenizer): causal LM ``name`` (bundled name, local folder or hub id) with a new LoRA
    adapter ``adapter`` (B = 0: the first scores are the base model's own)."""
    base, tokenizer = load_causal_lm(name, device=device)
    return get_peft_model(base, peft_lora_config(lora), adapter_name=adapter), tokenizer


class LoraScorer(torch.nn.Module):
    """The base of the LLM scorers: ``model`` (a peft model whose one adapter trains), ``tokenizer``,
    ``source`` (the base model's name, saved with the adapter) and ``max_chars`` (the passage cap)."""

    def __init__(self, model: Any, tokenizer: Any, *, source: str, max_chars: int) -> None:
        super().__init__()
        self.model, self.tokenizer, self.source, self.max_chars = model, tokenizer, source, max_chars

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def param_groups(self, lr: float, head_lr: float | None = None) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: the adapter's LoRA tensors at ``lr`` (no head: ``head_lr`` unused)."""
        del head_lr
        return [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": lr}]

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """The adapter's tensors only (what training changes): a checkpoint does not copy the base model."""
        del args, kwargs
        return {k: v.detach().clone() for k, v in self.model.named_parameters() if v.requires_grad}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True, assign: bool = False) -> Any:
        """Load :meth:`state_dict`'s tensors back; ValueError when they are not this scorer's adapter tensors."""
        del assign
        own = {k for k, v in self.model.named_parameters() if v.requires_grad}
        if strict and set(state) != own:
            raise ValueError(f"scorer state has {len(set(state) - own)} unknown and {len(own - set(state))} missing "
                             "adapter tensors")
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in state.items():
                params[k].copy_(v)
        return None


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


__all__ = ["LoraScorer", "capped_first_sentence", "first_sentence", "fresh_lora_model", "load_lora_scorer",
           "save_lora_scorer", "single_token_id"]
