"""Generation backends: our decode loop against transformers' own greedy decoding and a
teacher-forced recomputation of logprobs; per-row seeding independent of batch composition;
stop / eos / length rules; peft adapter switching; the vLLM mapping through a fake module."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from cosearch_lib.config import SamplingConfig
from cosearch_lib.models.generation.backend_factory import make_backend
from cosearch_lib.models.generation.contract import Generation, find_stop, row_seeds
from cosearch_lib.models.generation.sampling import sample_tokens
from cosearch_lib.models.generation.teacher_forced import reference_logprobs
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.generation.vllm_backend import VLLMBackend
from cosearch_lib.seeding import derive_seed

from tests.doubles import ScriptedBackend, peaked_model, token_logprob

TEXTS = ["Hello there, friend.", "a", "The quick brown fox jumps over the lazy dog", "Search: who?"]


@pytest.fixture(scope="module")
def model(tok):
    return peaked_model(tok)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode(t) for t in TEXTS]


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         pad_token_id=2, eos_token_id=2)
    return out[0, len(prompt):].tolist()


# ------------------------------------------------------------------------------ config


def test_sampling_config_validates_and_normalises():
    assert SamplingConfig(stop=["</a>", "</b>"]).stop == ("</a>", "</b>")
    assert SamplingConfig(stop="</a>").stop == ("</a>",)
    for bad in [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1),
                dict(max_new_tokens=0), dict(stop=("",))]:
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_row_seeds_follow_keys_not_positions():
    a = row_seeds(7, [("q1", 0), ("q2", 0)], 2)
    b = row_seeds(7, [("q2", 0), ("q1", 0)], 2)
    assert a == b[::-1] and a[0] == derive_seed(7, ("q1", 0)) and a[0] != a[1]
    with pytest.raises(ValueError, match="one key per prompt"):
        row_seeds(7, ["x"], 2)


def test_find_stop_returns_earliest_end():
    assert find_stop("ab</x>cd</y>", ["</y>", "</x>"]) == 6
    assert find_stop("abc", ["</x>"]) is None


# ------------------------------------------------------------------------------ sampler


def test_sampler_frequencies_match_softmax_and_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(40000, 1)  # (N, 5)
    u = torch.rand(40000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ids, lp = sample_tokens(logits, u, SamplingConfig(temperature=0.7))
    want = torch.softmax(logits[0] / 0.7, -1)
    freq = torch.bincount(ids, minlength=5).double() / len(ids)
    assert torch.allclose(freq, want.double(), atol=0.01)
    assert torch.allclose(lp, torch.log_softmax(logits / 0.7, -1).gather(-1, ids[:, None])[:, 0])
    ids, lp = sample_tokens(logits, u, SamplingConfig(temperature=1.0, top_k=2))
    freq = torch.bincount(ids, minlength=5).double() / len(ids)
    top2 = torch.softmax(logits[0, :2], -1).double()
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], top2, atol=0.01)
    # logprobs are of the untruncated distribution, not the renormalised top-k one
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, ids[:, None])[:, 0])
    ids, _ = sample_tokens(logits, u, SamplingConfig(top_p=0.6))  # p = .563, .207, .126, ...: the nucleus is {0, 1}
    assert set(ids.tolist()) == {0, 1}
    ids, _ = sample_tokens(logits, u, SamplingConfig(top_p=0.5))  # token 0 alone already holds 0.5
    assert set(ids.tolist()) == {0}


# ------------------------------------------------------------------------------ transformers backend


def test_greedy_matches_hf_generate_and_padding_does_not_change_it(model, tok, prompts):
    cfg = SamplingConfig(temperature=0, max_new_tokens=8)
    batched = TransformersBackend(model, tok, batch_size=4).generate(prompts, cfg)
    single = TransformersBackend(model, tok, batch_size=1).generate(prompts, cfg)
    for p, b, s in zip(prompts, batched, single):
        assert b.token_ids == hf_greedy(model, p, 8)
        assert b.token_ids == s.token_ids and b.finish_reason == s.finish_reason == "length"
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-4)
        assert b.text == tok.decode(b.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0, max_new_tokens=10, seed=3),
                                      SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=10, seed=3),
                                      SamplingConfig(temperature=0, max_new_tokens=10)])
def test_logprobs_match_teacher_forced_recomputation(model, tok, prompts, sampling):
    gens = TransformersBackend(model, tok, batch_size=3).generate(prompts, sampling)
    ref = reference_logprobs(model, [p + g.token_ids for p, g in zip(prompts, gens)], [len(p) for p in prompts],
                            temperature=sampling.temperature or 1.0)
    for g, r in zip(gens, ref):
        assert len(g.logprobs) == len(g.token_ids) == len(r)
        assert g.logprobs == pytest.approx(r, abs=1e-4)
    # and the check can fail: the wrong temperature gives different numbers
    if sampling.temperature not in (0, 1):
        wrong = reference_logprobs(model, [prompts[0] + gens[0].token_ids], [len(prompts[0])])[0]
        assert max(abs(a - b) for a, b in zip(wrong, gens[0].logprobs)) > 1e-2


def test_seeded_sampling_is_reproducible_and_independent_of_batch(model, tok, prompts):
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=11)
    keys = [("step0", q, 0) for q in range(len(prompts))]
    full = TransformersBackend(model, tok, batch_size=4).generate(prompts, cfg, row_keys=keys)
    again = TransformersBackend(model, tok, batch_size=4).generate(prompts, cfg, row_keys=keys)
    assert [g.token_ids for g in full] == [g.token_ids for g in again]
    # same keys, another batch: reversed order, a subset, other batch sizes
    sub = TransformersBackend(model, tok, batch_size=2).generate([prompts[3], prompts[0]], cfg,
                                                                 row_keys=[keys[3], keys[0]])
    alone = TransformersBackend(model, tok, batch_size=1).generate([prompts[0]], cfg, row_keys=[keys[0]])
    for g, ref in [(sub[0], full[3]), (sub[1], full[0]), (alone[0], full[0])]:
        assert g.token_ids == ref.token_ids
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    # the key, not the position, decides: the same prompt twice with two keys gives two samples
    two = TransformersBackend(model, tok).generate([prompts[0], prompts[0]], cfg, row_keys=[keys[0], "other"])
    assert two[0].token_ids == full[0].token_ids and two[1].token_ids != full[0].token_ids


def test_different_seeds_differ(model, tok, prompts):
    be = TransformersBackend(model, tok)
    a = be.generate(prompts, SamplingConfig(max_new_tokens=8, seed=1))
    b = be.generate(prompts, SamplingConfig(max_new_tokens=8, seed=2))
    assert [g.token_ids for g in a] != [g.token_ids for g in b]
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, b)) >= 3


def test_stop_string_truncates_right_after_it(model, tok, prompts):
    be = TransformersBackend(model, tok, batch_size=4)
    free = be.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=12))
    target = free[2]
    # a stop string that begins inside token 5's text and ends inside token 6's text (if it can)
    pre5 = tok.decode(target.token_ids[:5], skip_special_tokens=True)
    pre7 = tok.decode(target.token_ids[:7], skip_special_tokens=True)
    stop = pre7[max(len(pre5) - 2, 0):len(pre7) - 1] or pre7[-1]
    start = target.text.find(stop)
    assert start >= 0
    got = be.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=12, stop=(stop,)))
    g = got[2]
    assert g.finish_reason == "stop"
    assert g.text == target.text[:start + len(stop)] and g.text.endswith(stop)
    assert g.token_ids == target.token_ids[:len(g.token_ids)] and len(g.logprobs) == len(g.token_ids)
    # shortest prefix: without its last token the text no longer contains the stop
    assert stop not in tok.decode(g.token_ids[:-1], skip_special_tokens=True)
    # rows where the stop never appears are unaffected (finished rows leaving the batch change nothing)
    for i in (0, 1, 3):
        if stop not in free[i].text:
            assert got[i].token_ids == free[i].token_ids and got[i].finish_reason == "length"


def test_eos_is_kept_in_ids_but_not_in_text(tok, prompts):
    model = peaked_model(tok, seed=1)
    be = TransformersBackend(model, tok)
    first = be.generate([prompts[2]], SamplingConfig(temperature=0, max_new_tokens=6))[0]
    # make eos beat the 3rd greedy token: copy that token's output row into eos' row, scaled up
    x = first.token_ids[2]
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] = 3.0 * model.lm_head.weight[x]
    g = be.generate([prompts[2]], SamplingConfig(temperature=0, max_new_tokens=6))[0]
    assert g.finish_reason == "eos" and g.token_ids[-1] == tok.eos_token_id
    assert len(g.token_ids) <= 3 and len(g.logprobs) == len(g.token_ids)
    assert "<|im_end|>" not in g.text and g.text == tok.decode(g.token_ids[:-1])


def test_max_new_tokens_gives_length(model, tok, prompts):
    gens = TransformersBackend(model, tok).generate(prompts, SamplingConfig(max_new_tokens=3, seed=0))
    assert all(g.finish_reason == "length" and len(g.token_ids) == 3 for g in gens)


def test_bad_inputs_are_named(model, tok, prompts):
    be = TransformersBackend(model, tok)
    with pytest.raises(ValueError, match="prompt 1"):
        be.generate([prompts[0], []], SamplingConfig())
    with pytest.raises(ValueError, match="row_keys"):
        be.generate(prompts, SamplingConfig(seed=1), row_keys=["a"])
    with pytest.raises(ValueError, match="not a peft model"):
        be.generate(prompts, SamplingConfig(), adapter="agent")
    assert be.generate([], SamplingConfig()) == []


def test_peft_adapter_switching(tok, prompts):
    from peft import LoraConfig, get_peft_model

    model = peaked_model(tok, seed=2)
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=5)
    base = TransformersBackend(model, tok).generate(prompts, cfg)  # before wrapping (it is in place)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.5)
    peft_model = get_peft_model(model, lora, adapter_name="agent")
    peft_model.add_adapter("ranker", lora)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # non-zero B on both adapters: each really changes the model
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    peft_model.set_adapter("agent")
    peft_model.train()  # generation must switch dropout off by itself
    grads = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    be = TransformersBackend(peft_model, tok)

    off = be.generate(prompts, cfg, adapter=None)
    for a, b in zip(off, base):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    ranker = be.generate(prompts, cfg, adapter="ranker")
    assert any(a.token_ids != b.token_ids for a, b in zip(ranker, base))
    # same sequences, scored by the base model vs the ranker adapter: the distributions differ
    seqs = [p + g.token_ids for p, g in zip(prompts, ranker)]
    with peft_model.disable_adapter():
        base_lp = reference_logprobs(peft_model, seqs, [len(p) for p in prompts])
    assert max(abs(x - y) for g, r in zip(ranker, base_lp) for x, y in zip(g.logprobs, r)) > 1e-2
    # the ranker's logprobs are its own (teacher-forced with the ranker active)
    peft_model.set_adapter("ranker")
    own = reference_logprobs(peft_model.eval(), seqs, [len(p) for p in prompts])
    for g, r in zip(ranker, own):
        assert g.logprobs == pytest.approx(r, abs=1e-4)
    peft_model.set_adapter("agent")
    for n, p in peft_model.named_parameters():  # set_adapter flips requires_grad; it is restored
        p.requires_grad_(grads[n])
    peft_model.train()
    be.generate(prompts[:1], cfg, adapter="ranker")
    assert peft_model.active_adapter == "agent" and peft_model.training
    assert {n: p.requires_grad for n, p in peft_model.named_parameters()} == grads
    with pytest.raises(ValueError, match="unknown adapter 'judge'"):
        be.generate(prompts, cfg, adapter="judge")


def test_real_smollm2_greedy_matches_hf(tok):
    from cosearch_lib.models.registry import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2-135m-instruct", device="cpu")
    chats = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Say hi."}]]
    prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
               for c in chats]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
    be = TransformersBackend(model, tokenizer, batch_size=2)
    gens = be.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=6))
    for p, g in zip(prompts, gens):
        assert g.token_ids == hf_greedy(model, p, 6)[:len(g.token_ids)]
        assert len(g.text) > 0


# ------------------------------------------------------------------------------ scripted backend


def test_scripted_backend_honours_stop_eos_length_and_records_calls(tok):
    texts = {"a": "<reason>x</reason><search>paris</search> trailing", "b": "short answer",
             "c": "one two three four five"}
    be = ScriptedBackend(tok, texts)
    keys = ["a", "b", "c"]
    gens = be.generate([[1], [1], [1]], SamplingConfig(max_new_tokens=4, stop=("</search>",)), row_keys=keys)
    assert be.calls[0][3] == keys
    a, b, c = gens
    assert a.finish_reason == "length" and len(a.token_ids) == 4  # the stop comes after 4 tokens
    gens = be.generate([[1], [1], [1]], SamplingConfig(max_new_tokens=64, stop=("</search>",)), row_keys=keys)
    a, b, c = gens
    assert a.finish_reason == "stop" and a.text == "<reason>x</reason><search>paris</search>"
    assert b.finish_reason == "eos" and b.token_ids[-1] == tok.eos_token_id and b.text == "short answer"
    assert a.logprobs == [token_logprob(t) for t in a.token_ids] and len(set(a.logprobs)) > 1
    queue = ScriptedBackend(tok, ["first", "second"], append_eos=False)
    assert [g.text for g in queue.generate([[1], [1]], SamplingConfig())] == ["first", "second"]
    with pytest.raises(RuntimeError, match="ran out"):
        queue.generate([[1]], SamplingConfig())
    fn = ScriptedBackend(tok, lambda prompt, key: f"len={len(prompt)}")
    assert fn.generate([[1, 2, 3]], SamplingConfig())[0].text == "len=3"


# ------------------------------------------------------------------------------ vLLM through a fake module


def fake_vllm(monkeypatch, outputs):
    """Install a fake ``vllm`` package that records what it is given and returns ``outputs``."""
    record = SimpleNamespace(params=[], requests=[], llm_kwargs=None, prompts=None, lora=None)

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw
            record.params.append(kw)

    class LoRARequest:
        def __init__(self, name, int_id, path):
            self.args = (name, int_id, path)
            self.lora_int_id = int_id
            record.requests.append(self.args)

    class LLM:
        def __init__(self, **kw):
            record.llm_kwargs = kw

        def generate(self, prompts, sampling_params=None, *, lora_request=None, use_tqdm=True):
            record.prompts, record.lora = prompts, lora_request
            return outputs[:len(prompts)]

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams, vllm.LLM = SamplingParams, LLM
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, mod in [("vllm", vllm), ("vllm.inputs", inputs), ("vllm.lora", lora), ("vllm.lora.request", request)]:
        monkeypatch.setitem(sys.modules, name, mod)
    return record


def out(text, ids, lps, finish, stop_reason=None):
    steps = [{t: SimpleNamespace(logprob=lp), 99: SimpleNamespace(logprob=-9.0)} for t, lp in zip(ids, lps)]
    return SimpleNamespace(outputs=[SimpleNamespace(text=text, token_ids=ids, logprobs=steps,
                                                    finish_reason=finish, stop_reason=stop_reason)])


def test_vllm_backend_maps_sampling_adapters_and_outputs(monkeypatch, tmp_path):
    canned = [out("hi", [5, 2], [-0.5, -0.1], "stop", None),
              out("a</search>", [7, 8], [-1.0, -2.0], "stop", "</search>"),
              out("abc", [9, 10, 11], [-0.3, -0.2, -0.1], "length"),
              out("x", [12, 3], [-0.4, -0.6], "stop", 3)]
    rec = fake_vllm(monkeypatch, canned)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    be = VLLMBackend.from_model(str(folder), device="cuda", max_lora_rank=32, gpu_memory_utilization=0.4,
                                max_model_len=2048)
    assert rec.llm_kwargs == dict(model=str(folder.resolve()), enable_lora=True, max_lora_rank=32, max_loras=2,
                                  gpu_memory_utilization=0.4, max_model_len=2048)
    be.add_adapter("ranker", tmp_path / "ranker")
    keys = [(0, "q1", 0, 0), (0, "q1", 1, 0), (0, "q2", 0, 0), (0, "q2", 1, 0)]
    cfg = SamplingConfig(temperature=1.0, top_p=0.9, top_k=0, max_new_tokens=32, stop=("</search>",), seed=4)
    gens = be.generate([[1, 2], [3], [4], [5]], cfg, adapter="ranker", row_keys=keys)
    assert rec.prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}, {"prompt_token_ids": [4]},
                           {"prompt_token_ids": [5]}]
    assert rec.params[0] == dict(temperature=1.0, top_p=0.9, top_k=-1, max_tokens=32, stop=["</search>"],
                                 include_stop_str_in_output=True, logprobs=0, seed=derive_seed(4, keys[0]))
    assert [p["seed"] for p in rec.params] == [derive_seed(4, k) for k in keys]
    assert rec.lora.args == ("ranker", 1, str(tmp_path / "ranker"))
    assert [g.finish_reason for g in gens] == ["eos", "stop", "length", "eos"]
    assert gens[1] == Generation("a</search>", [7, 8], [-1.0, -2.0], "stop")
    # re-registering after saving new weights gets a fresh id, so vLLM reloads them
    be.add_adapter("ranker", tmp_path / "ranker")
    assert rec.requests[-1][1] == 2
    be.generate([[1]], SamplingConfig(temperature=0, top_k=5), adapter=None)
    assert rec.lora is None and rec.params[-1]["top_k"] == 5 and rec.params[-1]["seed"] is None
    with pytest.raises(ValueError, match="unknown adapter 'judge'"):
        be.generate([[1]], cfg, adapter="judge")


def test_vllm_engine_options_differ_by_device_with_reasons_and_refuse_bad_settings(monkeypatch, tmp_path):
    from cosearch_lib.models.generation.vllm_backend import ENGINE_DEVICES, engine_options

    gpu, env = engine_options("cuda", max_model_len=4096, gpu_memory_utilization=0.5, llm_kwargs={"dtype": "bfloat16"})
    assert gpu == {"max_model_len": 4096, "gpu_memory_utilization": 0.5, "dtype": "bfloat16"} and env == {}
    cpu, env = engine_options("cpu", max_model_len=4096, kv_cache_gib=2)
    # seeded rows: chunked prefill off (it crashes the CPU engine), a whole prompt per scheduler step
    assert cpu == {"max_model_len": 4096, "enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    unseeded, _ = engine_options("cpu", max_model_len=4096, seeded=False)
    assert "enable_chunked_prefill" not in unseeded
    # a rank of a data-parallel job: its engine joins the job's process group, one engine per rank
    for device in ENGINE_DEVICES:
        ranked, _ = engine_options(device, max_model_len=4096, ranks=2)
        assert ranked["distributed_executor_backend"] == "external_launcher"
        assert "distributed_executor_backend" not in engine_options(device, max_model_len=4096)[0]
    for kwargs, match in [(dict(device="tpu"), "unknown vLLM device 'tpu'"),
                          (dict(max_model_len=0), "max_model_len must be an int >= 16"),
                          (dict(kv_cache_gib=0), "whole number of GiB"),
                          (dict(kv_cache_gib=1.5), "whole number of GiB"),
                          (dict(llm_kwargs={"enable_chunked_prefill": True}), "crashes vLLM on CPU"),
                          (dict(llm_kwargs={"max_num_batched_tokens": 512}), "must fit in one scheduler step"),
                          (dict(llm_kwargs={"gpu_memory_utilization": 0.5}), "does not apply on CPU"),
                          (dict(device="cuda", gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\]"),
                          (dict(device="cuda", ranks=2, llm_kwargs={"tensor_parallel_size": 2}), "each rank runs its own engine")]:
        args = {"device": "cpu", "max_model_len": 4096, **kwargs}
        with pytest.raises(ValueError, match=match):
            engine_options(args.pop("device"), **args)
    # the engine's own refusal names the options it was given
    rec = fake_vllm(monkeypatch, [])

    def refuse(**kw):
        raise ValueError("KV cache too small")

    sys.modules["vllm"].LLM = refuse
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"vLLM could not start on cpu with .*'enable_chunked_prefill': False.*KV cache too small"):
        VLLMBackend.from_model(str(folder), device="cpu")
    assert rec.llm_kwargs is None


def test_vllm_backend_refuses_prompts_beyond_max_model_len_and_drops_replaced_adapter_ids(monkeypatch, tmp_path):
    rec = fake_vllm(monkeypatch, [out("x", [3], [-0.1], "stop")] * 4)
    removed = []
    engine = SimpleNamespace(list_loras=lambda: {1, 2}, remove_lora=removed.append)
    be = VLLMBackend.from_llm(SimpleNamespace(generate=sys.modules["vllm"].LLM().generate, llm_engine=engine),
                              max_model_len=64)
    with pytest.raises(ValueError, match=r"prompt 1 has 60 tokens; with max_new_tokens=8 it exceeds .*max_model_len=64"):
        be.generate([[1], [1] * 60], SamplingConfig(max_new_tokens=8))
    assert rec.prompts is None  # refused before the engine saw anything
    be.add_adapter("agent", tmp_path / "a")
    be.add_adapter("agent", tmp_path / "a")  # an update: id 2 replaces id 1, which the engine drops
    assert removed == [1]
    be.remove_adapter("agent")
    assert removed == [1, 2] and be.adapters == {}
    with pytest.raises(ValueError, match="unknown adapter 'agent'"):
        be.remove_adapter("agent")


def test_vllm_backend_from_unsloth_uses_fast_generate_and_load_lora(monkeypatch):
    rec = fake_vllm(monkeypatch, [out("ok", [4, 2], [-0.2, -0.3], "stop")])
    loaded = []
    model = SimpleNamespace(
        fast_generate=lambda prompts, sampling_params=None, lora_request=None, use_tqdm=True: (
            loaded.append(lora_request) or [out("ok", [4, 2], [-0.2, -0.3], "stop")]),
        load_lora=lambda path: f"lora:{path}")
    be = VLLMBackend.from_unsloth(model)
    be.add_adapter("agent", "/ckpt/agent")
    g = be.generate([[1, 2]], SamplingConfig(seed=1), adapter="agent")
    assert loaded == ["lora:/ckpt/agent"] and g[0].finish_reason == "eos" and rec.requests == []
    with pytest.raises(ValueError, match="fast_inference=True"):
        VLLMBackend.from_unsloth(SimpleNamespace())


def test_missing_vllm_and_unsloth_say_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    monkeypatch.setitem(sys.modules, "unsloth", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[gpu\]"):
        make_backend("vllm", "smollm2-135m-instruct")
    with pytest.raises(ImportError, match=r"pip install -e \.\[gpu\]"):
        make_backend("unsloth", "smollm2-135m-instruct")
    be = VLLMBackend(generate_fn=lambda *a, **k: [])
    with pytest.raises(ImportError, match="make install-vllm"):
        be.generate([[1]], SamplingConfig())
    with pytest.raises(ValueError, match="unknown backend kind 'tgi'"):
        make_backend("tgi", "x")
