"""Grouped-query attention without repeat_kv copies, and the cache that grows in place: both give what
transformers' stock sdpa path and DynamicLayer give, and generation through them is unchanged."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.grouped_attention import GROUPED_SDPA, grouped_query_sdpa, use_grouped_attention
from cosearch_lib.models.generation.growing_cache import CHUNK, GrowingLayer, growing_cache
from cosearch_lib.models.generation.transformers_backend import TransformersBackend

from tests.doubles import peaked_model, tiny_model


def qkv(B: int, Hq: int, Hkv: int, Tq: int, T: int, D: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, Tq, D, generator=g), torch.randn(B, Hkv, T, D, generator=g),
            torch.randn(B, Hkv, T, D, generator=g))


def padded_causal_mask(B: int, Tq: int, T: int, pads: list[int], additive: bool) -> torch.Tensor:
    """(B, 1, Tq, T): row b cannot see its first pads[b] columns; query t sees columns <= T - Tq + t."""
    cols, rows = torch.arange(T), torch.arange(Tq)[:, None] + (T - Tq)
    allowed = (cols[None, :] <= rows)[None].repeat(B, 1, 1)
    for b, p in enumerate(pads):
        allowed[b, :, :p] = False
    allowed = allowed[:, None]
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min) if additive else allowed


@pytest.mark.parametrize("Tq", [1, 5])
@pytest.mark.parametrize("additive", [False, True])
def test_grouped_attention_equals_the_sdpa_path_with_its_kv_copies(Tq, additive):
    B, Hq, Hkv, T = 3, 6, 2, 11
    q, k, v = qkv(B, Hq, Hkv, Tq, T)
    module = types.SimpleNamespace(num_key_value_groups=Hq // Hkv, is_causal=True)
    mask = padded_causal_mask(B, Tq, T, [0, 2, 4], additive)
    ours, _ = grouped_query_sdpa(module, q, k, v, mask, scaling=0.3)
    stock, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert ours.shape == (B, Tq, Hq, 8)
    torch.testing.assert_close(ours, stock, atol=1e-6, rtol=1e-5)
    # query head h reads key/value head h // groups: shifting the values of kv head 1 moves only heads 3..5
    v2 = v.clone()
    v2[:, 1] += 1.0
    moved, _ = grouped_query_sdpa(module, q, k, v2, mask, scaling=0.3)
    changed = (moved - ours).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert changed.tolist() == [False, False, False, True, True, True]


def test_without_a_mask_or_grouping_the_stock_function_runs(monkeypatch):
    from cosearch_lib.models.generation import grouped_attention

    calls = []
    monkeypatch.setattr(grouped_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(a[4]) or ("stock", None))
    q, k, v = qkv(1, 4, 2, 3, 3)
    assert grouped_query_sdpa(types.SimpleNamespace(num_key_value_groups=2), q, k, v, None)[0] == "stock"
    q, k, v = qkv(1, 2, 2, 3, 3)
    mask = padded_causal_mask(1, 3, 3, [0], False)
    assert grouped_query_sdpa(types.SimpleNamespace(num_key_value_groups=1), q, k, v, mask)[0] == "stock"
    assert len(calls) == 2


def test_a_gqa_model_switches_and_its_logits_do_not_move(tok):
    model = peaked_model(tok)
    ids = torch.randint(5, len(tok) - 1, (2, 12), generator=torch.Generator().manual_seed(0))
    attn = torch.ones(2, 12, dtype=torch.long)
    attn[1, :4] = 0  # left padding: a mask, so the stock path copies keys and values per head
    with torch.inference_mode():
        before = model(input_ids=ids, attention_mask=attn).logits
    assert model.config._attn_implementation == "sdpa" and use_grouped_attention(model)
    assert model.config._attn_implementation == GROUPED_SDPA and use_grouped_attention(model)  # idempotent
    with torch.inference_mode():
        after = model(input_ids=ids, attention_mask=attn).logits
    torch.testing.assert_close(after[1, 4:], before[1, 4:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after[0], before[0], atol=1e-5, rtol=1e-5)
    plain = tiny_model(tok)  # 2 heads, 2 key/value heads: nothing to group
    assert not use_grouped_attention(plain) and plain.config._attn_implementation == "sdpa"


def test_growing_layer_holds_what_a_dynamic_layer_holds_through_appends_row_drops_and_crops():
    ours, ref = GrowingLayer(), DynamicLayer()
    g = torch.Generator().manual_seed(0)
    for t in (300, 1, 1, 40, 1, 250):  # crosses the first capacity (256 -> 512 -> 1024)
        k, v = torch.randn(4, 2, t, 8, generator=g), torch.randn(4, 2, t, 8, generator=g)
        got, want = ours.update(k, v), ref.update(k, v)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    assert ours.get_seq_length() == ref.get_seq_length() == 593 and ours.capacity == 1024 and ours.capacity % CHUNK == 0
    keep = torch.tensor([0, 2])
    ours.batch_select_indices(keep)
    ref.batch_select_indices(keep)
    torch.testing.assert_close(ours.keys, ref.keys, rtol=0, atol=0)
    ours.crop(-3)
    ref.crop(-3)
    torch.testing.assert_close(ours.values, ref.values, rtol=0, atol=0)
    k = torch.randn(2, 2, 1, 8, generator=g)
    torch.testing.assert_close(ours.update(k, k)[0], ref.update(k, k)[0], rtol=0, atol=0)  # writes over the cropped slots


def test_growing_cache_starts_from_prefix_keys():
    prefix = [(torch.ones(2, 3, 5, 4) * i, torch.ones(2, 3, 5, 4) * -i) for i in range(3)]
    cache = growing_cache(prefix)
    assert len(cache.layers) == 3 and all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 5 and float(cache.layers[2].values[0, 0, 0, 0]) == -2.0
    fresh = growing_cache()
    fresh.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), layer_idx=0)
    assert isinstance(fresh.layers[0], GrowingLayer) and fresh.get_seq_length() == 3


def test_generation_is_unchanged_by_grouped_attention_and_the_growing_cache(tok):
    prompts = [tok.encode(t) for t in ("The river town of Drask was founded", "Who wrote the atlases?",
                                       "A much longer question about the mill that was built in 1843 by the guild")]
    sampling = SamplingConfig(temperature=0.9, max_new_tokens=24, seed=3)
    runs = {}
    for fast in (False, True):
        model = peaked_model(tok)  # a fresh model each time: the fast backend switches its attention
        backend = TransformersBackend(model, tok, batch_size=4, grouped_attention=fast, growing_cache=fast)
        assert model.config._attn_implementation == (GROUPED_SDPA if fast else "sdpa")
        runs[fast] = backend.generate(prompts, sampling, row_keys=[("t", i) for i in range(3)])
    for slow, fast in zip(runs[False], runs[True]):
        assert fast.token_ids == slow.token_ids
        assert fast.logprobs == pytest.approx(slow.logprobs, abs=1e-4)
