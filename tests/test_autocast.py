"""bf16 autocast of GRPO's rollouts and updates on a CPU (training.autocast, issue 48 item 5): only where
the CPU has bf16 instructions, recorded per step, and turned off for good by a step whose rollout
log-probs drift from the trainer's past the stated bound.

The trainer tests run the scripted rollouts on a tiny random Llama (tests.doubles.trainer); the CPU's
instructions are forced on where a test needs bf16 to run, so they pass on an AVX2 machine too (where
bf16 is emulated: slow for a real model, instant for this one)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import cosearch_lib.models.autocast as autocast_mod
from cosearch_lib.config import AutocastConfig, ConfigError, TrainConfig, from_dict, load_profile
from cosearch_lib.models.autocast import AutocastPlan, autocast_plan, cpu_bf16

from tests.doubles import tiny_model, trainer
from tests.test_training import changed, snapshot


def test_the_plan_keeps_float32_without_bf16_instructions_and_on_a_gpu(monkeypatch):
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: None)
    with pytest.warns(UserWarning, match="this CPU has no avx512_bf16 or AMX"):
        assert autocast_plan(True, True, "cpu") == AutocastPlan()
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: "avx512_bf16")
    assert autocast_plan(True, False, "cpu") == AutocastPlan(rollout=True, update=False)
    with pytest.warns(UserWarning, match="another rank's CPU has no"):  # data parallel: every rank or none
        assert autocast_plan(True, True, "cpu", every_rank=lambda ok: ok and False) == AutocastPlan()
    assert autocast_plan(True, True, "cuda") == AutocastPlan()  # the GPU's policies are bf16 already
    assert autocast_plan(False, False, "cpu") == AutocastPlan()


def test_the_context_computes_matmuls_in_bf16_and_leaves_the_weights_in_float32():
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with cpu_bf16(True):
        assert layer(x).dtype == torch.bfloat16
    with cpu_bf16(False):
        assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32


def test_an_optimizer_step_inside_the_context_is_seen_by_the_next_forward():
    """Autocast's weight cache would hand an update's later minibatches the weights before its first step."""
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    x = torch.randn(2, 4)
    with cpu_bf16(True):
        before = layer(x)
        before.sum().backward()
        optimizer.step()
        assert not torch.equal(before, layer(x))


@pytest.mark.parametrize("static", [False, True])
def test_generation_under_the_context_runs_on_either_cache_and_reports_float32_log_probs(tok, static):
    from cosearch_lib.config import SamplingConfig
    from cosearch_lib.models.generation.transformers_backend import TransformersBackend

    from tests.doubles import peaked_model

    model = peaked_model(tok)
    prompts = [tok.encode("Who founded the city of Varn?"), tok.encode("Which river crosses the old town of Olden?")]
    sampling = SamplingConfig(temperature=0, max_new_tokens=8)
    exact = TransformersBackend(model, tok, static_cache=static).generate(prompts, sampling)
    with cpu_bf16(True):
        low = TransformersBackend(model, tok, static_cache=static).generate(prompts, sampling)
    assert [g.token_ids for g in low] == [g.token_ids for g in exact]  # a peaked model: the same argmax
    drift = max(abs(a - b) for g, h in zip(low, exact) for a, b in zip(g.logprobs, h.logprobs))
    assert 0 < drift < 0.5  # bf16 changes the numbers, not the choices


def test_a_profile_sets_it_as_a_section_and_bad_values_are_refused():
    assert TrainConfig().autocast is None
    cfg = from_dict(TrainConfig, {"autocast": {"update": False, "max_drift": 0.02}}, "training")
    assert cfg.autocast == AutocastConfig(rollout=True, update=False, max_drift=0.02)
    assert from_dict(TrainConfig, {"autocast": {}}, "training").autocast == AutocastConfig()
    with pytest.raises(ConfigError, match="training.autocast.max_drift"):
        AutocastConfig(max_drift=0)
    with pytest.raises(ConfigError, match="training.autocast.rollout"):
        AutocastConfig(rollout="yes")
    with pytest.raises(ConfigError, match="expected a mapping"):
        from_dict(TrainConfig, {"autocast": True}, "training")


def test_training_autocast_leaves_the_starts_cache_keys():
    from cosearch_lib.experiment.cached_starts import llm_judge_dir, warmstart_dir

    laptop = load_profile("laptop")
    with_bf16 = dataclasses.replace(laptop, training=dataclasses.replace(laptop.training, autocast=AutocastConfig()))
    assert warmstart_dir(laptop) == warmstart_dir(with_bf16) and llm_judge_dir(laptop) == llm_judge_dir(with_bf16)
    assert warmstart_dir(load_profile("laptop_curve_bf16")) == warmstart_dir(load_profile("laptop_curve"))


def _bf16_cpu(monkeypatch):
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: "avx512_bf16")


def _spy_autocast(t, monkeypatch):
    """Record, per stage, whether CPU autocast was on when the rollout generated and the update forwarded."""
    import cosearch_lib.rl.policy_update as policy_update

    seen = {"rollout": [], "update": []}
    generate, forward = t.backend.generate, policy_update.policy_token_logprobs

    def spied_generate(*a, **kw):
        seen["rollout"].append(torch.is_autocast_enabled("cpu"))
        return generate(*a, **kw)

    def spied_forward(*a, **kw):
        seen["update"].append(torch.is_autocast_enabled("cpu"))
        return forward(*a, **kw)

    monkeypatch.setattr(t.backend, "generate", spied_generate)
    monkeypatch.setattr(policy_update, "policy_token_logprobs", spied_forward)
    return seen


@pytest.mark.parametrize("update", [True, False])
def test_a_bf16_step_computes_each_stage_as_asked_records_it_and_trains(tok, tmp_path, monkeypatch, update):
    _bf16_cpu(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=1, autocast=AutocastConfig(update=update))
    seen = _spy_autocast(t, monkeypatch)
    before = snapshot(t.policies.model, "agent")
    rec = t.train_step()
    assert seen["rollout"] and set(seen["rollout"]) == {True}
    assert seen["update"] and set(seen["update"]) == {update}
    assert rec["rollout/bf16"] == 1.0 and rec["loss/bf16"] == float(update)
    assert changed(before, t.policies.model)  # the agent's LoRA weights moved
    assert all(p.dtype == torch.float32 for p in t.policies.model.parameters())  # weights stay float32
    # measured and within the bound: bf16 sampling against a float32 trainer drifts; the scripted backend's
    # bf16 forward is the update's own bf16 forward, so there both agree
    assert 0 <= rec["loss/agent_logp_drift_mean"] <= AutocastConfig().max_drift
    assert (rec["loss/agent_logp_drift_mean"] > 0) == (not update)
    assert not torch.is_autocast_enabled("cpu")  # nothing left on after the step


def _counted_bf16_scope(backend):
    """Give ``backend`` a ``bf16_scope`` that counts its openings (``scopes``) and a ``generate`` that records how
    many are open at each call (``inside``); returns that state."""
    from contextlib import contextmanager

    state = {"open": 0, "scopes": 0, "inside": []}

    @contextmanager
    def bf16_scope():
        state["open"] += 1
        state["scopes"] += 1
        try:
            yield
        finally:
            state["open"] -= 1

    generate = backend.generate
    backend.bf16_scope = bf16_scope
    backend.generate = lambda *a, **kw: state["inside"].append(state["open"]) or generate(*a, **kw)
    return state


def test_bf16_weights_decode_the_rollout_inside_the_backends_bf16_scope_and_nothing_else(tok, tmp_path, monkeypatch):
    """training.autocast.bf16_weights: the rollout's generations run inside the backend's bf16 scope (one scope per
    rollout: the update moves the weights after it), under autocast as before; validation decodes outside it."""
    _bf16_cpu(monkeypatch)
    with pytest.raises(ConfigError, match="needs rollout: true"):
        AutocastConfig(rollout=False, bf16_weights=True)
    assert AutocastConfig(bf16_weights=False).bf16_weights is None  # false is null: one key for one computation
    t = trainer(tok, tiny_model(tok), tmp_path, steps=2, autocast=AutocastConfig(bf16_weights=True))
    seen = _spy_autocast(t, monkeypatch)
    state = _counted_bf16_scope(t.backend)
    inside = state["inside"]
    before = snapshot(t.policies.model, "agent")
    t.train_step()
    assert inside and set(inside) == {1} and state["scopes"] == 1 and set(seen["rollout"]) == {True}
    assert changed(before, t.policies.model)  # the update trained the weights, outside the scope
    inside.clear()
    t.val_questions = t.questions[:2]
    t.validate()
    assert inside and set(inside) == {0}  # validation: float32, no bf16 copies
    t.train_step()
    assert state["scopes"] == 2 and state["open"] == 0  # a fresh scope (fresh copies) for each step's rollout
    plain = trainer(tok, tiny_model(tok), tmp_path / "autocast", steps=1, autocast=AutocastConfig())
    assert plain.autocast.rollout and not plain.autocast.weights


def test_a_float32_run_records_no_dtype_and_validates_in_float32(tok, tmp_path, monkeypatch):
    _bf16_cpu(monkeypatch)
    from cosearch_lib.eval import harness

    assert "rollout/bf16" not in trainer(tok, tiny_model(tok), tmp_path / "fp32", steps=1).train_step()
    t = trainer(tok, tiny_model(tok), tmp_path / "bf16", steps=1, autocast=AutocastConfig())
    seen = []
    evaluate = harness.evaluate
    monkeypatch.setattr("cosearch_lib.rl.trainer.evaluate",
                        lambda *a, **kw: seen.append(torch.is_autocast_enabled("cpu")) or evaluate(*a, **kw))
    t.train_step()
    t.val_questions = t.questions[:2]
    t.validate()
    assert seen == [False]  # validation reads the policies in float32, whatever they trained in


def test_under_autocast_the_update_recomputes_the_old_log_probs(tok, tmp_path, monkeypatch):
    _bf16_cpu(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=1, autocast=AutocastConfig(update=False))
    assert t.update_settings.recompute_old  # the rollout's bf16 log-probs are not the trainer's
    rec = t.train_step()
    assert rec["rollout/bf16"] == 1.0 and rec["loss/bf16"] == 0.0
    assert rec["loss/agent_logp_drift_mean"] > 0  # bf16 sampling against the float32 trainer: measured
    assert rec["loss/agent_ratio_outside_clip"] == 0.0  # the ratio divides by the trainer's own log-probs
    # both in bf16: a cached decode and a whole-sequence forward still differ by bf16's kernel noise
    both = trainer(tok, tiny_model(tok), tmp_path / "both", steps=1, autocast=AutocastConfig())
    assert both.update_settings.recompute_old and both.train_step()["loss/agent_ratio_outside_clip"] == 0.0
    assert not trainer(tok, tiny_model(tok), tmp_path / "fp32", steps=1).update_settings.recompute_old


def test_a_step_past_the_drift_bound_turns_autocast_off_for_the_rest_of_the_run(tok, tmp_path, monkeypatch):
    _bf16_cpu(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=3, autocast=AutocastConfig(update=False, max_drift=1e-9))
    with pytest.warns(UserWarning, match="max_drift"):
        first = t.train_step()
    assert first["rollout/bf16"] == 1.0 and first["loss/agent_logp_drift_mean"] > 1e-9
    second = t.train_step()
    assert second["rollout/bf16"] == 0.0 and second["loss/bf16"] == 0.0
    # float32 rollouts of the float32 trainer's own model: the drift is gone
    assert second["loss/agent_logp_drift_mean"] < 1e-4
    # a resumed run reads the same decision from its records
    t.save_checkpoint()
    resumed = trainer(tok, tiny_model(tok), tmp_path, steps=3, autocast=AutocastConfig(update=False, max_drift=1e-9))
    assert resumed.load_checkpoint() == 2 and not resumed.autocast_on()


def test_a_nan_drift_trips_the_guard_and_a_step_without_scored_tokens_does_not(tok, tmp_path, monkeypatch):
    _bf16_cpu(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=3, autocast=AutocastConfig())
    step = {"step": 0, "rollout/bf16": 1.0, "loss/bf16": 1.0}
    t.records = [{**step, "loss/agent_logp_drift_mean": float("nan"), "loss/agent_n_tokens": 0.0}]
    assert t.autocast_on()  # nothing was measured: no update that step
    t.records = [{**step, "loss/agent_logp_drift_mean": float("nan"), "loss/agent_n_tokens": 40.0}]
    assert not t.autocast_on()


def test_rollouts_taken_back_after_a_stop_keep_the_dtype_they_were_sampled_in(tok, tmp_path, monkeypatch):
    """Saved bf16 rollouts resumed on a CPU without bf16 instructions: recorded as bf16, old log-probs recomputed."""
    _bf16_cpu(monkeypatch)
    t = trainer(tok, tiny_model(tok), tmp_path, steps=1, autocast=AutocastConfig(update=False))
    monkeypatch.setattr(t, "stop_at_boundary", lambda step: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        t.train_step()  # stopped after the rollout, which is saved
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: None)
    with pytest.warns(UserWarning, match="stays in float32"):
        resumed = trainer(tok, tiny_model(tok), tmp_path, steps=1, autocast=AutocastConfig(update=False))
    assert not resumed.update_settings.recompute_old and not resumed.autocast.any
    rec = resumed.train_step()
    assert rec["rollout/bf16"] == 1.0 and rec["loss/bf16"] == 0.0
    assert rec["loss/agent_ratio_outside_clip"] == 0.0  # the ratio divided by the trainer's own log-probs


def test_without_bf16_instructions_the_run_stays_float32_and_says_so(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: None)
    with pytest.warns(UserWarning, match="stays in float32"):
        t = trainer(tok, tiny_model(tok), tmp_path, steps=1, autocast=AutocastConfig())
    rec = t.train_step()
    assert rec["rollout/bf16"] == 0.0 and rec["loss/bf16"] == 0.0
    assert rec["loss/agent_logp_drift_mean"] < 1e-4


@pytest.mark.parametrize("profile", ["laptop", "laptop_seed1", "laptop_n20", "laptop_curve_wide"])
def test_demos_bf16_leaves_the_committed_laptop_runs_starts_where_their_records_say(profile):
    """demo sets warmstart.autocast and training.autocast; laptop pins both to null, so its runs' starts keep the
    cache keys their committed records name (docs/results/<profile>/): the same adapters, whatever demo does."""
    import json
    import re

    from cosearch_lib.experiment.cached_starts import llm_judge_dir, warmstart_dir
    from cosearch_lib.paths import project_root

    folder = project_root() / "docs" / "results" / profile
    agent = json.loads((folder / "warmstart.run.json").read_text())["adapters"]["agent"]
    judges = {m for f in folder.glob("*.json") for m in re.findall(r"llm_judge/(v1-[0-9a-f-]+)", f.read_text())}
    cfg = load_profile(profile)
    assert cfg.warmstart.autocast is None and Path(agent).parent.name == warmstart_dir(cfg).name
    assert judges == {llm_judge_dir(cfg).name}
    # GRPO: float32 where the profile's records were float32 (laptop_curve_wide turned bf16 on itself, and says so)
    assert (cfg.training.autocast is None) is (profile != "laptop_curve_wide")
    assert cfg.evaluation.bf16_weights is None  # the test evaluations of the committed records: float32
    demo = load_profile("demo")
    assert demo.warmstart.autocast is True and demo.evaluation.bf16_weights is True
    assert demo.training.autocast == AutocastConfig(rollout=True, update=True, bf16_weights=True)


# --------------------------------------------------------------------------- evaluation.bf16_weights


def _with_eval_bf16(value):
    cfg = load_profile("ci")
    return dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, bf16_weights=value))


def test_evaluation_bf16_weights_is_decided_once_for_the_harness_and_its_parts_key(monkeypatch):
    """evaluation.bf16_weights becomes HarnessConfig.bf16 where the CPU has bf16 instructions (float32 and a warning
    where it has not); the parts of a bf16 evaluation get their own key, a float32 one keeps the key it had."""
    import warnings

    from cosearch_lib.experiment import harness_config
    from cosearch_lib.experiment.evaluation_shards import evaluation_key

    with pytest.raises(ConfigError, match="evaluation.bf16_weights"):
        from_dict(type(load_profile("ci").evaluation), {"bf16_weights": "yes"}, "evaluation")
    with pytest.raises(ConfigError, match="autocast"):  # the setting's first name, an autocast, is gone
        from_dict(type(load_profile("ci").evaluation), {"autocast": True}, "evaluation")
    assert _with_eval_bf16(False).evaluation.bf16_weights is None  # false is null: one key for one computation
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's decision, on a GPU node too
    _bf16_cpu(monkeypatch)
    assert harness_config(_with_eval_bf16(True)).bf16 is True
    assert harness_config(_with_eval_bf16(None)).bf16 is False
    monkeypatch.setattr(autocast_mod, "cpu_bf16_instructions", lambda: None)
    with pytest.warns(UserWarning, match="evaluation.bf16_weights asks for bf16, but this CPU has no"):
        assert harness_config(_with_eval_bf16(True)).bf16 is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an override decides it: nothing to warn about
        assert harness_config(_with_eval_bf16(True), bf16=False).bf16 is False
    float32 = harness_config(load_profile("ci"))
    assert evaluation_key("x", float32) != evaluation_key("x", dataclasses.replace(float32, bf16=True))


def test_run_evaluation_decodes_inside_the_backends_bf16_scope_only_when_its_config_says_bf16(tok, chat):
    from tests.test_evaluation import Q1, Q2, by_question, make_ctx, small_cfg

    reply = "<answer>Kessmere</answer>"
    ctx, backend = make_ctx(tok, chat, by_question({"q1": reply, "q2": reply}))
    state = _counted_bf16_scope(backend)
    seen = state["inside"]
    backend.__class__ = type("Unhashable", (type(backend),), {"__hash__": None})  # as a dataclass engine (VLLMBackend) is
    ctx.ranker_backend = backend  # the same backend as agent and ranker: one scope, not two
    from cosearch_lib.eval.harness import run_evaluation

    f32 = run_evaluation(["direct", "agent_retrieval"], [Q1, Q2], ctx, small_cfg(), progress=False)
    assert seen and set(seen) == {0} and state["scopes"] == 0
    seen.clear()
    b16 = run_evaluation(["direct", "agent_retrieval"], [Q1, Q2], ctx, small_cfg(bf16=True), progress=False)
    assert seen and set(seen) == {1} and state["scopes"] == 1  # every method's generations, the agent's turns too
    assert state["open"] == 0  # closed after the evaluation
    assert list(b16["method"]) == list(f32["method"]) and list(b16["question_id"]) == list(f32["question_id"])


def _peft_with_update(tok):
    from peft import LoraConfig, get_peft_model

    from tests.doubles import peaked_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], lora_dropout=0.0)
    model = get_peft_model(peaked_model(tok, seed=3), lora, adapter_name="agent")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a non-zero update, so merging has something to fold in
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model


def test_a_bf16_copy_holds_the_merged_adapter_in_bf16_and_leaves_the_model_bit_for_bit(tok):
    from cosearch_lib.models.generation.adapters import adapter_context, bf16_decoding_copy

    model = _peft_with_update(tok)
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    ids = torch.tensor([tok.encode("Who founded the city of Varn? The river guild")])
    with torch.no_grad():
        with adapter_context(model, "agent"):
            want = model(input_ids=ids).logits.float()
        with adapter_context(model, None):
            base = model(input_ids=ids).logits.float()
        copy = bf16_decoding_copy(model, "agent")
        got = copy(input_ids=ids).logits.float()
        plain = bf16_decoding_copy(model, None)(input_ids=ids).logits.float()
    assert not any("lora" in n for n, _ in copy.named_modules())  # a plain model: the update is in its weights
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in copy.buffers()} == {torch.float32}  # the rotary frequencies keep their precision
    scale = (want - base).abs().max()
    assert scale > 1.0  # the adapter moves the logits ...
    assert (got - want).abs().max() < 0.1 * scale  # ... and the bf16 copy follows it, up to bf16 rounding
    assert (plain - base).abs().max() < 0.1 * scale  # the base copy leaves the update out
    assert (got - want).abs().max() > 0  # bf16 numbers, not float32's
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[n], t) for n, t in before.items())
    with pytest.raises(ValueError, match="unknown adapter 'ranker'"):
        bf16_decoding_copy(model, "ranker")


def test_a_bf16_scope_decodes_with_the_copies_and_float32_comes_back_after(tok):
    from cosearch_lib.config import SamplingConfig
    from cosearch_lib.models.generation.transformers_backend import TransformersBackend

    backend = TransformersBackend(_peft_with_update(tok), tok)
    prompts = [tok.encode("Who founded the city of Varn?"), tok.encode("Which river crosses the old town of Olden?")]
    sampling = SamplingConfig(temperature=0, max_new_tokens=8)
    exact = {a: backend.generate(prompts, sampling, adapter=a) for a in ("agent", None)}
    assert [g.token_ids for g in exact["agent"]] != [g.token_ids for g in exact[None]]  # the adapter acts
    with backend.bf16_scope():
        with backend.bf16_scope():  # re-entrant: the same copies
            low = {a: backend.generate(prompts, sampling, adapter=a) for a in ("agent", None)}
        assert set(backend._bf16) == {"agent", None}  # one copy per adapter, made at its first call
        again = backend.generate(prompts, sampling, adapter="agent")
    for a in exact:  # a peaked model: the same first argmaxes (later ones may flip on rounding), bf16's numbers
        assert [g.token_ids[:4] for g in low[a]] == [g.token_ids[:4] for g in exact[a]]
        drift = max(abs(x - y) for g, h in zip(low[a], exact[a]) for x, y in zip(g.logprobs[:4], h.logprobs[:4]))
        assert 0 < drift < 0.5
    assert [g.logprobs for g in again] == [g.logprobs for g in low["agent"]]
    assert backend._bf16 is None  # the copies are dropped at the end of the scope
    after = backend.generate(prompts, sampling, adapter="agent")
    assert [g.logprobs for g in after] == [g.logprobs for g in exact["agent"]]  # float32 again, bit for bit
    with backend.prefix_scope(), pytest.raises(RuntimeError, match="outside prefix_scope"):
        with backend.bf16_scope():
            pass


def test_inside_a_bf16_scope_a_trajectorys_next_turn_reuses_its_kept_bf16_rows(tok):
    """The rollout's order of scopes (bf16 outside, the prefix scope that keeps the agent's rows inside): a next turn
    starts from its trajectory's bf16 keys and values, and decodes what a bf16 copy decodes without any cache."""
    from cosearch_lib.config import SamplingConfig
    from cosearch_lib.models.generation.transformers_backend import TransformersBackend

    model = _peft_with_update(tok)
    cached, plain = TransformersBackend(model, tok), TransformersBackend(model, tok, share_prefixes=False)
    prompts = [tok.encode("Who founded the city of Varn?"), tok.encode("Which river crosses the old town of Olden?")]
    sampling = SamplingConfig(temperature=0, max_new_tokens=6)
    with cached.bf16_scope(), cached.prefix_scope(keep_rows_for=("agent",)):
        first = cached.generate(prompts, sampling, adapter="agent")
        follow = [p + g.token_ids + tok.encode(" Observation: the guild of river masons.") for p, g in zip(prompts, first)]
        second = cached.generate(follow, sampling, adapter="agent")
        hits, hit_tokens = cached.last_stats["hits"], cached.last_stats["hit_tokens"]
    with plain.bf16_scope():
        want = [plain.generate(prompts, sampling, adapter="agent"), plain.generate(follow, sampling, adapter="agent")]
    assert hits >= len(prompts) and hit_tokens >= sum(len(p) for p in prompts)  # each row's previous turn, reused
    for got, ref in zip((first, second), want):
        assert [g.token_ids[:3] for g in got] == [g.token_ids[:3] for g in ref]
        assert max(abs(a - b) for g, h in zip(got, ref) for a, b in zip(g.logprobs[:3], h.logprobs[:3])) < 0.2


def test_the_retrievers_queries_are_encoded_in_float32_under_bf16_autocast():
    """The retriever is fixed: a rollout under bf16 autocast must not encode its queries in bf16 against a float32
    index (near-ties in the top N would move)."""
    from cosearch_lib.config import EncoderConfig
    from cosearch_lib.retrieval.encoder import TextEncoder

    encoder = TextEncoder(EncoderConfig(batch_size=2), device="cpu")  # CPU autocast is the one in question
    seen = []
    hook = encoder.model.register_forward_hook(lambda mod, args, out: seen.append(torch.is_autocast_enabled("cpu")))
    queries = ["who founded the river guild", "where was Tellis born"]
    plain = encoder.encode_queries(queries)
    with cpu_bf16(True):
        under = encoder.encode_queries(queries)
    hook.remove()
    assert seen == [False, False]
    assert (plain == under).all()
