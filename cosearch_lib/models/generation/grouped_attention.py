"""Grouped-query attention without copying the keys and values once per query head.

SmolLM2-135M (9 query heads, 3 key/value heads) and Qwen2.5 (e.g. 16 and 2) share each key/value
head among ``groups`` query heads. Given an attention mask (which batched generation always has:
left padding, prefix holes), transformers' ``sdpa`` path outside CUDA materialises
``repeat_kv(key)`` and ``repeat_kv(value)``: ``groups`` copies of the whole cache, per layer, per
decoded token. On 2 CPU cores that copy is a large part of a decode step.

:func:`grouped_query_sdpa` computes the same attention by folding each group's query heads into the
query-length axis instead, ``(B, Hq, Tq, D) -> (B, Hkv, groups * Tq, D)``, and repeating only the
mask (``(B, 1, Tq, T) -> (B, 1, groups * Tq, T)``, small when decoding), so every query still
attends to its own key/value head with its own mask row. Query head ``h`` uses key/value head
``h // groups``, as in ``repeat_kv``. The result equals the ``sdpa`` path up to float rounding
(tested). Without a mask (unpadded training micro-batches) or without grouping it calls the stock
``sdpa`` function, which then uses ``enable_gqa`` or needs no copies.

:func:`use_grouped_attention` registers it with transformers (``AttentionInterface`` and the mask
interface) as ``"sdpa_grouped"`` and switches a model that uses ``sdpa`` with grouped heads.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "sdpa_grouped"


def grouped_query_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, Hq, Tq, D), key and value (B, Hkv, T, D),
    mask (B or 1, 1, Tq, T) boolean or additive; returns ((B, Tq, Hq, D), None)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (groups == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    B, Hq, Tq, D = query.shape
    Hkv = key.shape[1]
    q = query.reshape(B, Hkv, groups * Tq, D)  # query head kv * groups + r -> row r * Tq + t of group kv
    mb, _, _, T = attention_mask.shape
    mask = attention_mask[:, :, None].expand(mb, 1, groups, Tq, T).reshape(mb, 1, groups * Tq, T)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)  # (B, Hkv, groups * Tq, D)
    return out.reshape(B, Hq, Tq, D).transpose(1, 2).contiguous(), None


def _register() -> None:
    if GROUPED_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(GROUPED_SDPA, grouped_query_sdpa)
        AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` (a transformers model, or a peft model around one) from ``sdpa`` to
    :func:`grouped_query_sdpa` when its attention groups query heads; True when it did (or had)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or not hasattr(base, "set_attn_implementation"):
        return False
    text = config.get_text_config(decoder=True)
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == GROUPED_SDPA:
        return True
    if impl != "sdpa" or not heads or not kv_heads or kv_heads >= heads:
        return False
    _register()
    base.set_attn_implementation(GROUPED_SDPA)
    return True
