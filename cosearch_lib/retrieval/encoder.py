"""Dense text encoder: Hugging Face AutoModel + pooling + L2 normalisation.

One class serves MiniLM (the embedded default) and e5 (paper scale). e5 models were trained with
``"query: "`` / ``"passage: "`` prefixes and mean pooling; Search-R1's wiki-18 index was built that
way, so queries must be encoded the same way to match it. Inputs are sorted by length before
batching (padding is the main CPU cost) and the outputs put back in the caller's order.
"""

from __future__ import annotations

import numpy as np
import torch

from cosearch_lib.config import EncoderConfig
from cosearch_lib.models.registry import load_encoder_model
from cosearch_lib.progress import tqdm


class TextEncoder:
    """``encode_queries`` / ``encode_passages`` -> float32 arrays of shape (n, dim), rows of unit norm."""

    def __init__(self, cfg: EncoderConfig | None = None, *, device: str | None = None):
        self.cfg = cfg or EncoderConfig()
        self.model, self.tokenizer = load_encoder_model(self.cfg.model, device=device)
        self.device = next(self.model.parameters()).device
        if self.device.type == "cuda" and self.cfg.fp16:
            self.model = self.model.half()
        self._torch = torch

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode_queries(self, queries: list[str], *, progress: bool = False) -> np.ndarray:
        return self.encode(queries, kind="query", progress=progress)

    def encode_passages(self, passages: list[str], *, progress: bool = False) -> np.ndarray:
        return self.encode(passages, kind="passage", progress=progress)

    def encode(self, texts: list[str], *, kind: str = "query", progress: bool = False) -> np.ndarray:
        if kind not in {"query", "passage"}:
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("encode() takes a list of strings")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if self.cfg.use_e5_prefixes:
            texts = [f"{kind}: {t}" for t in texts]
        order = np.argsort([-len(t) for t in texts], kind="stable")  # longest first: similar lengths share a batch
        bs = self.cfg.batch_size
        starts = range(0, len(texts), bs)
        bar = tqdm(starts, desc=f"encode {kind}s", unit="batch", disable=not progress)
        # float32 whatever the caller runs under (a rollout under bf16 autocast, models.autocast.cpu_bf16): the
        # retriever is fixed, its queries encoded as its index was
        with self._torch.inference_mode(), self._torch.autocast("cpu", enabled=False):
            for start in bar:
                idx = order[start : start + bs]
                out[idx] = self._encode_batch([texts[i] for i in idx])
        return out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        batch = self.tokenizer(
            texts, max_length=self.cfg.max_length, padding=True, truncation=True, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(**batch).last_hidden_state  # (B, T, H)
        if self.cfg.pooling == "cls":
            pooled = hidden[:, 0]  # (B, H)
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, H)
        pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
        return pooled.cpu().numpy()
