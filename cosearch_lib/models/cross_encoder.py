"""A trainable pointwise cross-encoder: a text encoder reads (sub-query, passage) together and a
linear head turns the mean-pooled encoding into one relevance score.

This is the model of the paper's "cross-encoder ranker" ablation (Table 3): the generative ranker
replaced by a cross-encoder that is trained by the same GRPO rewards. It starts from any encoder
checkpoint (the bundled MiniLM on the embedded default, e.g. a BERT-family reranker on a GPU node);
the head starts at zero, so every candidate scores alike until the warm start
(``rl.scorer_policy.warm_start_cross_encoder``) or GRPO moves it.

A scorer is saved as a folder: the encoder in Hugging Face format, the tokenizer, ``head.pt`` and
``cross_encoder.json`` (written last: a folder without it is incomplete).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from cosearch_lib.atomic_io import atomic_dir
from cosearch_lib.models.registry import resolve_model

#: The file a complete scorer folder holds (written last).
MARKER = "cross_encoder.json"


class CrossEncoderScorer(torch.nn.Module):
    """``scores(query, passages) -> (N,)`` relevance scores, differentiable."""

    def __init__(self, encoder: torch.nn.Module, tokenizer, *, max_length: int = 192, source: str = "") -> None:
        super().__init__()
        self.encoder, self.tokenizer, self.max_length, self.source = encoder, tokenizer, max_length, source
        self.head = torch.nn.Linear(encoder.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_encoder(cls, name: str, *, max_length: int = 192) -> CrossEncoderScorer:
        """A fresh scorer on encoder ``name`` (bundled name, local folder or hub id), head at zero."""
        path = resolve_model(name).path
        return cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), max_length=max_length,
                   source=name)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def param_groups(self, lr: float, head_lr: float | None = None) -> list[dict]:
        """The optimizer's parameter groups: the encoder at ``lr``, the head at ``head_lr`` (default ``lr``)."""
        head = [p for p in self.head.parameters() if p.requires_grad]
        encoder = [p for p in self.encoder.parameters() if p.requires_grad]
        return [{"params": encoder, "lr": lr}, {"params": head, "lr": lr if head_lr is None else head_lr}]

    def scores(self, query: str, passages: Sequence[str]) -> torch.Tensor:
        """One score per passage (float32, on the scorer's device); gradients flow unless under no_grad."""
        if not passages:
            return torch.zeros(0, device=self.device)
        batch = self.tokenizer([query] * len(passages), list(passages), padding=True, truncation="only_second",
                               max_length=self.max_length, return_tensors="pt").to(self.device)
        hidden = self.encoder(**batch).last_hidden_state  # (N, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled).squeeze(-1).float()

    def save(self, folder: str | Path, *, notes: dict | None = None) -> Path:
        """Write the scorer to ``folder`` atomically (a temporary folder, then renamed); ``notes`` (e.g.
        how it was warm-started) go into its ``cross_encoder.json``."""
        with atomic_dir(Path(folder)) as tmp:
            self.encoder.save_pretrained(tmp / "encoder")
            self.tokenizer.save_pretrained(tmp / "encoder")
            torch.save(self.head.state_dict(), tmp / "head.pt")
            meta = {"max_length": self.max_length, "source": self.source, **(notes or {})}
            (tmp / MARKER).write_text(json.dumps(meta, indent=2))
        return Path(folder)

    @classmethod
    def load(cls, folder: str | Path) -> CrossEncoderScorer:
        folder = Path(folder)
        if not (folder / MARKER).exists():
            raise FileNotFoundError(f"{folder} is not a saved cross-encoder (no {MARKER})")
        meta = json.loads((folder / MARKER).read_text())
        scorer = cls(AutoModel.from_pretrained(folder / "encoder"), AutoTokenizer.from_pretrained(folder / "encoder"),
                     max_length=meta["max_length"], source=meta.get("source", ""))
        scorer.head.load_state_dict(torch.load(folder / "head.pt", map_location="cpu", weights_only=True))
        return scorer


def plackett_luce_logprobs(scores: torch.Tensor, order: Sequence[int], temperature: float) -> torch.Tensor:
    """Log-probability of each pick of ``order`` under the Plackett-Luce model of ``scores / temperature``:
    pick j is drawn from the candidates not picked before it. Their sum is the ranking's log-probability;
    GRPO treats the K picks as the ranker's K "tokens"."""
    if temperature <= 0:
        raise ValueError("Plackett-Luce log-probs need a temperature > 0")
    logits = scores / temperature
    out, taken = [], torch.zeros_like(logits, dtype=torch.bool)
    for i in order:
        out.append(logits[i] - torch.logsumexp(logits.masked_fill(taken, float("-inf")), dim=0))
        taken = taken.clone()
        taken[i] = True
    return torch.stack(out) if out else logits.new_zeros(0)


def sample_ranking(scores: torch.Tensor, k: int, temperature: float, generator: torch.Generator | None) -> list[int]:
    """K distinct candidates: Plackett-Luce sampling (Gumbel top-K) at ``temperature`` > 0, the K best
    scores (ties by index) at 0."""
    k = min(k, len(scores))
    values = scores.detach().float().cpu()
    if temperature > 0:
        uniform = torch.rand(len(values), generator=generator, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
        values = values.double() / temperature - torch.log(-torch.log(uniform))
    return sorted(range(len(values)), key=lambda i: (-float(values[i]), i))[:k]


def is_cross_encoder_folder(folder: str | Path) -> bool:
    return (Path(folder) / MARKER).exists()
