"""The GPU training path (Unsloth + its vLLM engine) on CPU, with a fake ``unsloth`` module.

The fake ``FastLanguageModel`` hands out a tiny random Llama and wraps it the way Unsloth does
(peft's ``get_peft_model``, so its adapter is named "default", plus ``fast_generate`` / ``load_lora``
on the peft model). What is tested is ours: the adapters end up named as the policy set expects,
warm starts land in the right adapter, the LoRA settings reach Unsloth, and the trainer keeps a
disk-reading generation backend (vLLM) in step with the updated adapters."""

from __future__ import annotations

import copy
import sys
import types
from pathlib import Path

import pytest
import torch

from cosearch_lib.config import (
    GroupingConfig,
    LoraSettings,
    ProtocolConfig,
    RolloutConfig,
    SamplingConfig,
    SearchBudget,
    TrainConfig,
)
from cosearch_lib.models.generation.backend_factory import make_backend
from cosearch_lib.models.generation.vllm_backend import VLLMBackend, resolved_model_path
from cosearch_lib.models.lora_policies import PolicySet, adapter_parameters, lora_model
from cosearch_lib.models.policy_loading import load_policy_model, vllm_max_lora_rank
from cosearch_lib.rl.trainer import JointTrainer, TrainerInputs

from tests.doubles import (
    CORPUS,
    LORA,
    QUESTIONS,
    FixedRetriever,
    ScriptedBackend,
    recorded_vllm_cases,
    replayed_request_output,
    script,
    tiny_model,
)
from tests.fixture_files import search_r1_rows, write_search_r1_parquet

MODEL = "smollm2-135m-instruct"  # a bundled name: Unsloth must get its converted folder, not the name


def fake_unsloth(monkeypatch, tok):
    """Install a fake ``unsloth`` module; returns the record of its calls."""
    calls: dict[str, list] = {"from_pretrained": [], "get_peft_model": [], "load_lora": [], "fast_generate": []}

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(model_name, **kw):
            calls["from_pretrained"].append({"model_name": model_name, **kw})
            model = tiny_model(tok)
            model.vllm_engine = "engine"  # what fast_inference=True attaches
            return model, copy.deepcopy(tok)

        @staticmethod
        def get_peft_model(model, r=16, target_modules=None, lora_alpha=16, lora_dropout=0.0, bias="none",
                           use_gradient_checkpointing="unsloth", random_state=3407, **kw):
            from peft import LoraConfig, get_peft_model

            calls["get_peft_model"].append(dict(r=r, target_modules=target_modules, lora_alpha=lora_alpha,
                                                lora_dropout=lora_dropout, bias=bias, random_state=random_state,
                                                use_gradient_checkpointing=use_gradient_checkpointing, **kw))
            torch.manual_seed(random_state)
            peft = get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias,
                                                    target_modules=list(target_modules), task_type="CAUSAL_LM"))
            peft.fast_generate = lambda *a, **k: calls["fast_generate"].append((a, k)) or replay(len(a[0]))
            peft.load_lora = lambda path: calls["load_lora"].append(path) or f"lora-request:{path}"
            return peft

    def replay(n):  # what the real vLLM engine returned (tests/fixtures, recorded by make test-vllm)
        outputs = [replayed_request_output(o) for case in recorded_vllm_cases() for o in case["outputs"]]
        return (outputs * (n // len(outputs) + 1))[:n]

    module = types.ModuleType("unsloth")
    module.FastLanguageModel = FastLanguageModel
    monkeypatch.setitem(sys.modules, "unsloth", module)
    return calls


def warm_adapter(tok, folder: Path, lora: LoraSettings = LORA, seed: int = 1) -> Path:
    """A saved "agent" adapter with non-zero weights (a stand-in for a warm start)."""
    model = lora_model(tiny_model(tok), {"agent": None}, lora)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in adapter_parameters(model, "agent").values():
            p.normal_(std=0.05)
    return PolicySet(model, {"agent": "agent"}, [], {}).save_adapters(folder)["agent"]


def adapter_weights(model, adapter: str) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=adapter).items()}


def same(a: dict, b: dict) -> bool:
    """Bit-equal weights, compared on the CPU: the model's tensors may sit on the GPU while peft's
    ``load_peft_weights`` puts what it reads on whatever device it infers (CUDA when there is one)."""
    return a.keys() == b.keys() and all(torch.equal(a[k].detach().cpu(), b[k].detach().cpu()) for k in a)


# ------------------------------------------------------------------------------ loading


def test_unsloth_adapters_are_named_for_the_policy_set_and_warm_start_lands_in_its_adapter(tok, tmp_path, monkeypatch):
    from peft.utils import load_peft_weights

    calls = fake_unsloth(monkeypatch, tok)
    warm = warm_adapter(tok, tmp_path / "warm")
    model, tokenizer, backend = load_policy_model(MODEL, {"agent": warm, "ranker": None}, LORA, backend="unsloth",
                                                  seed=7, max_seq_length=1024, gpu_memory_utilization=0.3)
    assert list(model.peft_config) == ["agent", "ranker"]  # Unsloth's "default" is gone
    assert not [n for n in dict(model.named_parameters()) if ".default." in n]
    saved = load_peft_weights(str(warm))
    assert same(adapter_weights(model, "agent"), saved)  # the warm start, bit for bit
    assert all(not p.any() for n, p in adapter_parameters(model, "ranker").items() if "lora_B" in n)  # fresh: B = 0
    assert (model.peft_config["ranker"].r, model.peft_config["ranker"].lora_alpha) == (LORA.r, LORA.alpha)

    (load,) = calls["from_pretrained"]
    assert load == {"model_name": resolved_model_path(MODEL), "max_seq_length": 1024, "load_in_4bit": False,
                    "fast_inference": True, "max_lora_rank": vllm_max_lora_rank(LORA.r), "gpu_memory_utilization": 0.3}
    assert load["model_name"] != MODEL and Path(load["model_name"]).is_dir()
    (peft_call,) = calls["get_peft_model"]
    assert peft_call == {"r": LORA.r, "target_modules": list(LORA.target_modules), "lora_alpha": LORA.alpha,
                         "lora_dropout": LORA.dropout, "bias": "none", "random_state": 7,
                         "use_gradient_checkpointing": "unsloth"}

    assert isinstance(backend, VLLMBackend) and backend.model is model and backend.tokenizer is tokenizer
    backend.add_adapter("agent", str(warm))
    assert calls["load_lora"] == [str(warm)] and backend.adapters["agent"].request == f"lora-request:{warm}"

    policies = PolicySet(model, {"agent": "agent", "ranker": "ranker"}, ["agent", "ranker"],
                         {"agent": 1e-2, "ranker": 1e-2})
    assert set(policies.optimizers) == {"agent", "ranker"}
    assert all(".agent." in n for n in policies.params["agent"]) and policies.params["agent"]


def test_unsloth_shared_backbone_and_guards(tok, tmp_path, monkeypatch):
    fake_unsloth(monkeypatch, tok)
    model, _, _ = load_policy_model(MODEL, {"shared": None}, LORA, backend="unsloth")
    assert list(model.peft_config) == ["shared"]
    with pytest.raises(ValueError, match="'default' is reserved"):
        load_policy_model(MODEL, {"default": None}, LORA, backend="unsloth")
    big = warm_adapter(tok, tmp_path / "big", LoraSettings(r=16, alpha=32))
    with pytest.raises(ValueError, match="rank 16, above vLLM's max_lora_rank 8"):
        load_policy_model(MODEL, {"agent": big}, LORA, backend="unsloth")
    assert [vllm_max_lora_rank(r) for r in (1, 8, 9, 64, 1000)] == [8, 8, 16, 64, 1000]


def test_unsloth_under_several_ranks_trains_its_patched_model_and_samples_on_one_vllm_engine_per_rank(
        tok, tmp_path, monkeypatch):
    """Issue 47: Unsloth's fast_inference engine cannot join a job's process group, so under torchrun
    or srun each rank loads Unsloth's patched model alone on its own GPU, and samples on a plain vLLM
    engine of its own (external_launcher), fed the adapters as saved folders, as backend vllm is."""
    from cosearch_lib.models.generation import vllm_backend

    calls = fake_unsloth(monkeypatch, tok)
    engines = []
    monkeypatch.setattr(vllm_backend.VLLMBackend, "shared",
                        classmethod(lambda cls, name, **options: engines.append((name, options)) or "engine-of-rank"))
    monkeypatch.setenv("LOCAL_RANK", "3")
    model, tokenizer, backend = load_policy_model(MODEL, {"agent": None, "ranker": None}, LORA, backend="unsloth",
                                                  max_seq_length=7647, gpu_memory_utilization=0.4,
                                                  vllm_options={"seed": 5}, engine_per_rank=True)
    (loaded,) = calls["from_pretrained"]
    assert loaded["fast_inference"] is False and loaded["device_map"] == {"": "cuda:3"}
    assert loaded["max_seq_length"] == 7647 and "gpu_memory_utilization" not in loaded
    assert backend == "engine-of-rank" and engines == [(MODEL, {"max_lora_rank": 8, "max_model_len": 7647,
                                                                "gpu_memory_utilization": 0.4, "seed": 5})]
    assert set(model.peft_config) == {"agent", "ranker"}  # Unsloth's LoRA kernels, our two adapters
    assert calls["get_peft_model"] and not calls["fast_generate"]


def test_evaluation_on_unsloth_samples_on_the_engine_its_trainer_loaded(tok, tmp_path, monkeypatch):
    """Issue 47, item 4: notebook 03 evaluated on a second Unsloth model and engine, loaded beside the
    trainer's (Unsloth's defaults: 4,096 tokens, half the GPU). One engine per process now: the
    evaluation's backend is the trainer's, and it registers the trained adapters there by path."""
    from cosearch_lib.models.generation.backend_factory import make_backend
    from cosearch_lib.models.generation.vllm_backend import close_engines

    calls = fake_unsloth(monkeypatch, tok)
    close_engines()
    model, tokenizer, trainer_engine = load_policy_model(MODEL, {"agent": None, "ranker": None}, LORA,
                                                         backend="unsloth", max_seq_length=7647)
    evaluation = make_backend("unsloth", MODEL, max_seq_length=7647, max_lora_rank=8, gpu_memory_utilization=0.9)
    assert evaluation is trainer_engine and len(calls["from_pretrained"]) == 1
    trained = warm_adapter(tok, tmp_path / "trained")
    evaluation.add_adapter("eval_agent", str(trained))
    assert calls["load_lora"] == [str(trained)]
    close_engines()  # a process without a trainer loads its own, once
    loads = []
    monkeypatch.setattr(VLLMBackend, "from_unsloth_pretrained",
                        classmethod(lambda cls, name, **kw: loads.append(kw) or object()))
    first = make_backend("unsloth", MODEL, max_seq_length=7647)
    assert make_backend("unsloth", MODEL, max_seq_length=7647) is first and loads == [{"max_seq_length": 7647}]
    close_engines()


def test_missing_unsloth_and_vllm_say_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", None)  # `import unsloth` raises ImportError
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"backend 'unsloth' needs Unsloth.*pip install -e \.\[gpu\]"):
        load_policy_model(MODEL, {"agent": None}, LORA, backend="unsloth")
    with pytest.raises(ImportError, match=r"needs vLLM.*make install-vllm"):
        load_policy_model(MODEL, {"agent": None}, LORA, backend="vllm")
    with pytest.raises(ValueError, match="unknown training backend 'tgi'"):
        load_policy_model(MODEL, {"agent": None}, LORA, backend="tgi")
    with pytest.raises(ValueError, match="at least one adapter"):
        load_policy_model(MODEL, {}, LORA)


def test_generation_through_unsloth_maps_what_the_real_engine_returned(tok, monkeypatch):
    """The fake's outputs are the real engine's (recorded by tests/test_vllm_engine.py): eos, a stop
    string and the token budget each map to the contract's finish reason, ids and log-probs."""
    from tests.test_generation import fake_vllm

    fake_vllm(monkeypatch, [])  # Unsloth's vLLM: its TokensPrompt (the engine itself is Unsloth's fake)
    fake_unsloth(monkeypatch, tok)
    model, tokenizer, backend = load_policy_model(MODEL, {"agent": None}, LORA, backend="unsloth")
    backend.add_adapter("agent", "/ckpt/agent")
    seen = set()
    for case in recorded_vllm_cases():
        want = case["outputs"]
        monkeypatch.setattr(backend, "generate_fn",
                            lambda prompts, _want=want, **kw: [replayed_request_output(o) for o in _want])
        gens = backend.generate(case["prompts"], SamplingConfig(temperature=0, max_new_tokens=case["max_new_tokens"],
                                                                stop=tuple(case["stop"])), adapter="agent")
        for g, o in zip(gens, want, strict=True):
            assert g.token_ids == o["token_ids"] and g.text == o["text"]
            assert g.logprobs == [step[str(t)] for step, t in zip(o["logprobs"], o["token_ids"])]
            expected = "length" if o["finish_reason"] == "length" else "stop" if isinstance(o["stop_reason"], str) else "eos"
            assert g.finish_reason == expected
            seen.add(g.finish_reason)
    assert seen == {"eos", "stop", "length"}
    # the fake model itself returns the same recorded outputs through fast_generate
    out = model.fast_generate([[1, 2]], sampling_params=None)
    assert out[0].outputs[0].token_ids == recorded_vllm_cases()[0]["outputs"][0]["token_ids"]


def test_vllm_training_puts_peft_adapters_on_the_model_and_generates_on_one_shared_engine(monkeypatch):
    from cosearch_lib.models.generation import vllm_backend

    from tests.test_generation import fake_vllm

    rec = fake_vllm(monkeypatch, [])
    monkeypatch.setattr(vllm_backend, "_ENGINES", {})
    options = {"device": "cpu", "dtype": "auto", "kv_cache_gib": 1, "max_model_len": 512}
    model, tok, generation = load_policy_model(MODEL, {"agent": None, "ranker": None}, LORA, backend="vllm",
                                               max_seq_length=512, vllm_options=options)
    assert sorted(model.peft_config) == ["agent", "ranker"] and isinstance(generation, VLLMBackend)
    assert rec.llm_kwargs["max_lora_rank"] == 8 and rec.llm_kwargs["enable_chunked_prefill"] is False
    assert generation.max_model_len == 512
    # a second load (another method, the relevance training, an evaluation) gets the same engine
    assert load_policy_model(MODEL, {"agent": None}, LORA, backend="vllm", max_seq_length=512,
                             vllm_options=options)[2] is generation
    assert make_backend("vllm", MODEL, max_lora_rank=8, **options) is generation  # r=4 -> vLLM rank 8


# ------------------------------------------------------------------------------ keeping vLLM in step


class RegisteringBackend(ScriptedBackend):
    """Scripted rollouts plus vLLM's ``add_adapter``: records what each registration's folder holds."""

    def __init__(self, tok):
        super().__init__(tok, script)
        self.registered: list[tuple[str, Path, dict]] = []

    def add_adapter(self, name: str, path: str) -> None:
        from peft.utils import load_peft_weights

        self.registered.append((name, Path(path), load_peft_weights(path)))


def _trainer(tok, model, out_dir, backend, method="cosearch", **kw):
    cfg = TrainConfig(method=method, steps=2, questions_per_step=2, group_size=4, agent_lr=1e-2, ranker_lr=1e-2,
                      micro_batch=2, eval_every=0, grouping=GroupingConfig(k_min=2), **kw)
    policies = PolicySet(model, cfg.roles(), cfg.trainable(), {"agent": 1e-2, "ranker": 1e-2, "shared": 1e-2})
    rollout = RolloutConfig(search=SearchBudget(max_searches=2, topn=6, topk=3), temperature=1.0, agent_max_new_tokens=64)
    inputs = TrainerInputs(policies, tok, FixedRetriever(CORPUS), QUESTIONS, rollout, ProtocolConfig(search=SearchBudget(topk=3)),
                           backend=backend)
    return JointTrainer(cfg, inputs, out_dir=out_dir, seed=0, progress=False)


@pytest.mark.parametrize("method, updated", [("cosearch", ["agent", "ranker"]), ("fixed_ranker", ["agent"])])
def test_trainer_registers_the_adapters_then_re_registers_exactly_the_updated_ones(tok, tmp_path, monkeypatch,
                                                                                  method, updated):
    fake_unsloth(monkeypatch, tok)
    model, _, _ = load_policy_model(MODEL, {"agent": warm_adapter(tok, tmp_path / "warm"), "ranker": None}, LORA,
                                    backend="unsloth")
    backend = RegisteringBackend(tok)
    t = _trainer(tok, model, tmp_path / "run", backend, method=method)
    live = tmp_path / "run" / "live_adapters"
    assert backend.registered == [] and not live.exists()  # the constructor writes nothing
    before = {name: adapter_weights(model, name) for name in ("agent", "ranker")}

    rec = t.train_step()  # every adapter is registered before the engine first generates, then the updated ones
    assert [(n, p) for n, p, _ in backend.registered[:2]] == [("agent", live / "agent"), ("ranker", live / "ranker")]
    for name, _, weights in backend.registered[:2]:
        assert same(weights, before[name])
    new = backend.registered[2:]
    assert [n for n, _, _ in new] == updated and all(p == live / n for n, p, _ in new)
    for name, _, weights in new:
        assert same(weights, adapter_weights(model, name))  # the folder holds the updated weights
        assert not same(weights, before[name])
    assert rec["time/sync_s"] > 0 and rec["time/step_s"] >= rec["time/update_s"] + rec["time/sync_s"]  # the re-registration was timed


def test_resumed_trainer_registers_the_checkpoint_weights_before_rolling_out(tok, tmp_path):
    first = _trainer(tok, lora_model(tiny_model(tok), {"agent": None, "ranker": None}, LORA), tmp_path / "run",
                     RegisteringBackend(tok))
    first.run(steps=1)
    trained = adapter_weights(first.policies.model, "agent")
    backend = RegisteringBackend(tok)
    resumed = _trainer(tok, lora_model(tiny_model(tok), {"agent": None, "ranker": None}, LORA), tmp_path / "run",
                       backend)
    assert resumed.load_checkpoint() == 1 and backend.registered == []  # nothing generated yet
    resumed.run(steps=1)  # nothing left to train: nothing generates, nothing to register
    assert backend.registered == []
    resumed.run(steps=2)  # vLLM serves the checkpoint's adapters for the rollout, then the updated ones
    assert [n for n, _, _ in backend.registered] == ["agent", "ranker", "agent", "ranker"]
    assert same(backend.registered[0][2], trained) and not same(backend.registered[2][2], trained)


def test_transformers_path_registers_nothing(tok, tmp_path):
    t = _trainer(tok, lora_model(tiny_model(tok), {"agent": None, "ranker": None}, LORA), tmp_path / "run",
                 ScriptedBackend(tok, script))
    rec = t.train_step()
    assert not t.served.enabled and "time/sync_s" not in rec and not (tmp_path / "run" / "live_adapters").exists()


def test_build_trainer_uses_the_generation_backend_of_the_policy_model(tok, tmp_path, monkeypatch):
    import cosearch_lib.experiment.method_runs as experiment_mod
    from cosearch_lib.config import ProfileConfig, from_dict
    from cosearch_lib.experiment import build_trainer

    qa = {s: str(write_search_r1_parquet(tmp_path / f"{s}.parquet", search_r1_rows(3, split=s)))
          for s in ("train", "dev")}
    cfg = from_dict(ProfileConfig, {"data": {"qa_paths": qa}, "models": {"backend": "unsloth"},
                                    "rollout": {"max_context_tokens": 2048}, "search": {"topn": 10, "topk": 3},  # SmolLM2: 8,192 positions
                                    "lora": {"r": 4, "alpha": 8}, "training": {"eval_every": 0}})
    backend, seen = RegisteringBackend(tok), {}

    def fake_load(name, adapters, lora, **kw):
        seen.update(name=name, adapters=adapters, **kw)
        return lora_model(tiny_model(tok), adapters, lora), tok, backend

    monkeypatch.setattr(experiment_mod, "load_policy_model", fake_load)
    trainer = build_trainer(cfg, FixedRetriever(CORPUS), out_dir=tmp_path / "run", progress=False)
    assert trainer.backend is backend and backend.registered == []  # registered when it first generates
    from cosearch_lib.experiment.preflight import profile_budget

    assert seen.pop("vllm_options") is None  # Unsloth starts its own engine
    # the engine holds the measured budget (not Unsloth's default 4,096) on the profile's share of the GPU
    assert seen == {"name": cfg.models.agent, "adapters": {"agent": None, "ranker": None}, "backend": "unsloth",
                    "seed": cfg.seed, "max_seq_length": profile_budget(cfg).engine_len,
                    "gpu_memory_utilization": cfg.models.vllm.gpu_memory_utilization}
    assert seen["max_seq_length"] == cfg.rollout.max_context_tokens + cfg.rollout.agent_max_new_tokens
    other = RegisteringBackend(tok)  # a backend the caller passes wins
    assert build_trainer(cfg, FixedRetriever(CORPUS), out_dir=tmp_path / "run2", progress=False,
                         backend=other).backend is other
    # validation questions are loaded when the run validates: every eval_every steps, or only at the start
    assert trainer.val_questions == []
    starting = build_trainer(cfg, FixedRetriever(CORPUS), out_dir=tmp_path / "run3", progress=False, backend=other,
                             validate_at_start=True)
    assert starting.val_questions and {q.split for q in starting.val_questions} == {"dev"}


def test_served_adapters_register_each_step_once_again_after_an_update_and_after_a_restore(tmp_path):
    """ServedAdapters (the trainers' one record of what a disk-reading engine serves): the first
    ``serve`` saves and registers every adapter that plays a role, a second ``serve`` of the same step
    writes nothing, ``push`` after an update always registers (here only the trained adapter), and
    after ``forget`` (a checkpoint restored) the next ``serve`` registers again. An engine without
    ``add_adapter`` is never written to."""
    from cosearch_lib.models.served_adapters import ServedAdapters

    class Policies:
        def __init__(self):
            self.roles, self.saved = {"agent": "agent", "ranker": "ranker"}, []

        def save_adapters(self, folder, names):
            self.saved.append(list(names))
            return {name: Path(folder) / name for name in names}

    class Engine:
        def __init__(self):
            self.registered = []

        def add_adapter(self, name, path):
            self.registered.append((name, Path(path).name))

    policies, engine = Policies(), Engine()
    served = ServedAdapters(policies, engine, tmp_path / "live")
    assert served.enabled and served.step is None
    served.serve(0)
    served.serve(0)
    assert engine.registered == [("agent", "agent"), ("ranker", "ranker")] and served.step == 0
    served.push(1, ["ranker"])
    assert engine.registered[2:] == [("ranker", "ranker")] and served.step == 1
    served.serve(1)
    assert len(engine.registered) == 3  # step 1's weights are served already
    served.forget()
    served.serve(1)
    assert len(engine.registered) == 5 and policies.saved == [["agent", "ranker"], ["ranker"], ["agent", "ranker"]]

    untouched = Policies()
    quiet = ServedAdapters(untouched, object(), tmp_path / "never")
    quiet.serve(0)
    quiet.push(1)
    assert not quiet.enabled and quiet.step is None and untouched.saved == []


def test_methods_trained_one_after_another_in_a_process_share_one_unsloth_model_and_engine(tok, tmp_path, monkeypatch):
    """Issue 47, item 4: notebook 03 trains its methods one after another in one kernel, and each
    loaded Unsloth again: a second model and a second vLLM engine (``fast_inference``) on the same
    GPU. Now the next method gets the process's patched model and engine back, with its own
    adapters, starting from the weights a process of its own would give it."""
    from peft.utils import load_peft_weights

    from cosearch_lib.models.generation.vllm_backend import close_engines

    calls = fake_unsloth(monkeypatch, tok)
    close_engines()
    warm = warm_adapter(tok, tmp_path / "warm")
    first, _, engine = load_policy_model(MODEL, {"agent": warm, "ranker": None}, LORA, backend="unsloth", seed=7)
    with torch.no_grad():  # the first method trains both adapters
        for p in [*adapter_parameters(first, "agent").values(), *adapter_parameters(first, "ranker").values()]:
            p.add_(0.5)
    second, _, engine2 = load_policy_model(MODEL, {"agent": warm, "ranker": None}, LORA, backend="unsloth", seed=7)
    assert second is first and engine2 is engine and len(calls["from_pretrained"]) == 1
    assert list(second.peft_config) == ["agent", "ranker"] and second.active_adapter == "agent"
    assert same(adapter_weights(second, "agent"), load_peft_weights(str(warm)))  # the warm start again, not the trained one
    reused_ranker = adapter_weights(second, "ranker")
    assert all(not v.any() for k, v in reused_ranker.items() if "lora_B" in k)
    close_engines()  # a process of its own: the same fresh ranker, bit for bit
    alone, _, _ = load_policy_model(MODEL, {"agent": warm, "ranker": None}, LORA, backend="unsloth", seed=7)
    assert alone is not first and len(calls["from_pretrained"]) == 2
    assert same(adapter_weights(alone, "ranker"), reused_ranker)
    # another method with one shared adapter
    shared, _, _ = load_policy_model(MODEL, {"shared": None}, LORA, backend="unsloth", seed=7)
    assert shared is alone and list(shared.peft_config) == ["shared"] and len(calls["from_pretrained"]) == 2
    close_engines()
