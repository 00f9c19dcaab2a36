"""VLLMBackend on a real vLLM engine: SmolLM2-135M on the CPU build (``make install-vllm``) or on
CUDA vLLM (the ``gpu`` extra), against the library's own loop (TransformersBackend, fp32) as the
reference.

``make test-vllm`` runs this file; there ``COSEARCH_REQUIRE_VLLM=1`` turns a missing vLLM into a
failure instead of a skip. The engine runs in this process and binds its threads, so the file runs
in its own pytest process (``make test`` deselects the ``vllm`` marker).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.config import LoraSettings, SamplingConfig
from cosearch_lib.models.generation.teacher_forced import reference_logprobs
from cosearch_lib.models.generation.transformers_backend import TransformersBackend
from cosearch_lib.models.generation.vllm_backend import VLLMBackend
from cosearch_lib.models.lora_policies import lora_model
from cosearch_lib.models.registry import load_causal_lm

from tests import vllm_rank_worker as rank_worker

pytestmark = pytest.mark.vllm

MODEL = "smollm2-135m-instruct"
QUESTIONS = ["Name three colours of the rainbow.", "Count from one to ten in words.",
             "What is the capital of France? Answer in one sentence.", "Write a haiku about the sea."]

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("COSEARCH_REQUIRE_VLLM") == "1":
        raise RuntimeError("COSEARCH_REQUIRE_VLLM=1 but vLLM is not installed: run `make install-vllm`")
    pytest.skip("vLLM is not installed (make install-vllm)", allow_module_level=True)


@pytest.fixture(scope="module")
def hf():
    """The library's own loop on the same weights in fp32: the reference."""
    model, tok = load_causal_lm(MODEL, dtype=torch.float32, device="cpu")
    return model, tok


@pytest.fixture(scope="module")
def engine():
    # fp32 so that the comparison with the fp32 reference tests the engine, not bf16 rounding
    return VLLMBackend.from_model(MODEL, **rank_worker.ENGINE)


@pytest.fixture(scope="module")
def prompts(engine):
    chat = ChatTokens(engine.tokenizer)
    return [chat.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]


def test_chat_template_of_the_engine_tokenizer_matches_the_library_one(engine, hf, prompts):
    ours = ChatTokens(hf[1])
    assert prompts == [ours.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    assert engine.tokenizer.eos_token_id == hf[1].eos_token_id


def test_greedy_tokens_stop_strings_and_budget_match_the_library_loop(engine, hf, prompts):
    reference = TransformersBackend(*hf)
    for sampling in (SamplingConfig(temperature=0, max_new_tokens=40),  # eos or the budget
                     SamplingConfig(temperature=0, max_new_tokens=40, stop=(",", ".")),  # stop strings
                     SamplingConfig(temperature=0, max_new_tokens=5)):  # the budget
        got, want = engine.generate(prompts, sampling), reference.generate(prompts, sampling)
        for g, w in zip(got, want):
            assert (g.token_ids, g.text, g.finish_reason) == (w.token_ids, w.text, w.finish_reason), sampling
            assert g.logprobs == pytest.approx(w.logprobs, abs=2e-3)
    reasons = {g.finish_reason for g in engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=40,
                                                                                stop=(",", ".")))}
    assert "stop" in reasons  # the stop strings were met, not only the budget
    assert all(len(g.token_ids) == 5 and g.finish_reason == "length"
               for g in engine.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=5)))


def test_row_seeds_give_the_same_tokens_for_the_same_key_and_differ_across_rows(engine, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24, seed=11)
    p = prompts[0]
    first = engine.generate([p, p, p], sampling, row_keys=[("q", 0), ("q", 1), ("q", 0)])
    assert first[0].token_ids == first[2].token_ids  # same seed and key in one call
    assert first[0].token_ids != first[1].token_ids  # another row of the same prompt differs
    # the same key in another call, beside other rows, samples the same tokens
    again = engine.generate([prompts[1], p], sampling, row_keys=[("other", 3), ("q", 0)])
    assert again[1].token_ids == first[0].token_ids
    other_seed = engine.generate([p], SamplingConfig(temperature=1.0, max_new_tokens=24, seed=12), row_keys=[("q", 0)])
    assert other_seed[0].token_ids != first[0].token_ids


def test_one_engine_per_rank_of_a_gloo_job_samples_the_rows_one_engine_samples(engine, tmp_path):
    """Two torchrun ranks, each with its own engine (external-launcher mode) and half of the rows,
    give every row the tokens this process's engine gives it: a row's sample depends on its seed
    and key, not on which rank drew it."""
    import sys

    from tests.test_data_parallel import run_job  # killed whole (launcher and ranks) on a timeout

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(root / "tests" / "vllm_rank_worker.py"), str(out), json.dumps(QUESTIONS[:3])]
    proc = run_job(cmd, env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    ranks = json.loads(out.read_text())
    assert ranks["executors"] == ["external_launcher", "external_launcher"] and ranks["rows_per_rank"] == [3, 3]
    prompts, keys = rank_worker.rows(QUESTIONS[:3], ChatTokens(engine.tokenizer))
    one = engine.generate(prompts, rank_worker.SAMPLING, row_keys=keys)
    assert ranks["tokens"] == [list(g.token_ids) for g in one]
    assert ranks["tokens"][0] != ranks["tokens"][1]  # two samples of one prompt differ: the seeds are per row


def test_sampled_logprobs_match_the_trainers_teacher_forced_ones(engine, hf, prompts):
    gens = engine.generate(prompts * 2, SamplingConfig(temperature=1.0, max_new_tokens=32, seed=3))
    seqs = [p + g.token_ids for p, g in zip(prompts * 2, gens)]
    ref = reference_logprobs(hf[0], seqs, [len(p) for p in prompts * 2])
    deltas = [abs(a - b) for g, r in zip(gens, ref) for a, b in zip(g.logprobs, r)]
    assert len(deltas) > 100
    assert max(deltas) < 5e-3, max(deltas)  # fp32 engine vs fp32 trainer: numerical noise only


def _adapter(hf, folder, seed):
    """A LoRA (r=8) with random B on a fresh base copy, saved in peft's format; its model for the reference."""
    base, tok = load_causal_lm(MODEL, dtype=torch.float32, device="cpu")
    model = lora_model(base, {"agent": None}, LoraSettings(r=8, alpha=16))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.eval()
    model.save_pretrained(str(folder), selected_adapters=["agent"])
    saved = folder / "agent" if (folder / "agent").is_dir() else folder
    return model, tok, saved


def test_adapters_add_refresh_after_an_update_and_remove(engine, hf, prompts, tmp_path):
    from vllm.lora.request import LoRARequest

    greedy = SamplingConfig(temperature=0, max_new_tokens=24)
    base = engine.generate(prompts, greedy)
    model_a, tok, path_a = _adapter(hf, tmp_path / "a", seed=1)
    engine.add_adapter("agent", str(path_a))
    with_a = engine.generate(prompts, greedy, adapter="agent")
    want_a = TransformersBackend(model_a, tok).generate(prompts, greedy, adapter="agent")
    assert [g.token_ids for g in with_a] == [w.token_ids for w in want_a]
    assert [g.token_ids for g in with_a] != [g.token_ids for g in base]  # the adapter changes the model

    # an update: new weights written over the same folder, then registered again
    model_b, _, path_b = _adapter(hf, tmp_path / "b", seed=2)
    for f in path_b.iterdir():
        (path_a / f.name).write_bytes(f.read_bytes())
    stale_id = engine.adapters["agent"].request.lora_int_id
    engine.add_adapter("agent", str(path_a))
    assert engine.adapters["agent"].request.lora_int_id != stale_id
    assert stale_id not in engine.llm.llm_engine.list_loras()  # the replaced id was dropped
    with_b = engine.generate(prompts, greedy, adapter="agent")
    want_b = TransformersBackend(model_b, tok).generate(prompts, greedy, adapter="agent")
    assert [g.token_ids for g in with_b] == [w.token_ids for w in want_b]
    assert [g.token_ids for g in with_b] != [g.token_ids for g in with_a]

    # why a fresh id: the engine caches weights by id, so reusing one serves what it loaded first
    engine.adapters["stale"] = type(engine.adapters["agent"])("stale", str(path_a), LoRARequest("stale", 900, str(path_a)))
    engine.generate(prompts[:1], greedy, adapter="stale")  # loads B's weights under id 900
    _, _, path_c = _adapter(hf, tmp_path / "c", seed=3)
    for f in path_c.iterdir():
        (path_a / f.name).write_bytes(f.read_bytes())  # C on disk now
    stale = engine.generate(prompts, greedy, adapter="stale")
    assert [g.token_ids for g in stale] == [g.token_ids for g in with_b]  # still B: the check above has teeth

    engine.remove_adapter("stale")
    engine.remove_adapter("agent")
    assert engine.llm.llm_engine.list_loras() == set()
    with pytest.raises(ValueError, match="unknown adapter 'agent'"):
        engine.generate(prompts, greedy, adapter="agent")
    assert [g.token_ids for g in engine.generate(prompts, greedy)] == [g.token_ids for g in base]


def test_a_prompt_beyond_the_engine_length_is_refused_by_name(engine, prompts):
    with pytest.raises(ValueError, match=r"prompt 1 has 1100 tokens.*max_model_len=1024"):
        engine.generate([prompts[0], [1] * 1100], SamplingConfig(max_new_tokens=8))


# ------------------------------------------------------------------------------ the fixture the Unsloth fake replays

#: What the real engine returned for the three ways a request ends; tests/test_gpu_path.py replays
#: it through a fake Unsloth model, so the fake returns what vLLM returns. Rewritten by this test
#: when COSEARCH_RECORD_VLLM=1 (or when missing); otherwise the engine must still return it.
FIXTURE = Path(__file__).parent / "fixtures" / "vllm_request_outputs.json"
CASES = {"eos": SamplingConfig(temperature=0, max_new_tokens=96),
         "stop": SamplingConfig(temperature=0, max_new_tokens=40, stop=(",", ".")),
         "length": SamplingConfig(temperature=0, max_new_tokens=5)}


def _serialised(request_output) -> dict:
    o = request_output.outputs[0]
    return {"request_output": type(request_output).__name__, "completion_output": type(o).__name__,
            "text": o.text, "token_ids": [int(t) for t in o.token_ids],
            "logprobs": [{str(t): float(lp.logprob) for t, lp in step.items()} for step in o.logprobs],
            "logprob_type": type(next(iter(o.logprobs[0].values()))).__name__,
            "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}


def test_the_recorded_engine_outputs_are_what_the_engine_returns(engine, prompts):
    recorded = {"device": engine.llm.llm_engine.vllm_config.device_config.device_type, "cases": []}
    for name, sampling in CASES.items():
        params = engine.sampling_params(sampling, [None] * len(prompts))
        outputs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        recorded["cases"].append({"case": name, "max_new_tokens": sampling.max_new_tokens, "stop": list(sampling.stop),
                                  "prompts": prompts, "outputs": [_serialised(o) for o in outputs]})
    finish = {c["case"]: {o["finish_reason"] for o in c["outputs"]} for c in recorded["cases"]}
    assert "stop" in finish["eos"] and finish["length"] == {"length"} and "stop" in finish["stop"]
    stop_reasons = {type(o["stop_reason"]).__name__ for c in recorded["cases"] for o in c["outputs"]
                    if o["finish_reason"] == "stop"}
    assert {"str", "NoneType"} <= stop_reasons  # a stop string, and eos (None)
    if os.environ.get("COSEARCH_RECORD_VLLM") == "1" or not FIXTURE.exists():
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(recorded, indent=1) + "\n")
    fixture = json.loads(FIXTURE.read_text())
    assert [c["case"] for c in fixture["cases"]] == list(CASES)
    for old, new in zip(fixture["cases"], recorded["cases"]):
        for a, b in zip(old["outputs"], new["outputs"]):
            assert set(a) == set(b) and {k: a[k] for k in ("request_output", "completion_output", "logprob_type")} == \
                {k: b[k] for k in ("request_output", "completion_output", "logprob_type")}
            if fixture["device"] == recorded["device"]:  # the same kernels: the same greedy tokens
                assert (a["token_ids"], a["text"], a["finish_reason"], a["stop_reason"]) == \
                    (b["token_ids"], b["text"], b["finish_reason"], b["stop_reason"])


# ------------------------------------------------------------------------------ the ci profile end to end on vLLM


@pytest.mark.slow  # make test-vllm-notebooks, by hand: CI runs the engine's notebooks in make test-paper (paper_mini)
@pytest.mark.timeout(1800)  # two notebooks, a warm start and a relevance training on the engine: minutes on 2 cores
def test_ci_profile_on_vllm_trains_and_evaluates_with_the_engine(tmp_path, monkeypatch):
    """`cosearch run --profile ci_vllm --notebooks 02 03`: rollouts on the engine, both adapters
    saved and registered again after every update, old log-probs recomputed by the trainer, the
    drift recorded, and records in the transformers backend's schema."""
    import pandas as pd

    from cosearch_lib.config import load_profile
    from cosearch_lib.eval.tables import load_records
    from cosearch_lib.experiment import harness_config, warmstart_dir
    from cosearch_lib.models.adapter_weights import adapter_change
    from cosearch_lib.run_schema import describe_step_metric
    from cosearch_lib.runs.papermill_runner import list_notebooks, run_notebook

    monkeypatch.setenv("COSEARCH_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("COSEARCH_RUNS", str(tmp_path / "runs"))
    runs = tmp_path / "runs" / "ci_vllm"
    # notebook 02 without direct and cot (one generation each, the engine path rag takes); notebook 03
    # without the hop oracle (ci's notebook-03 test runs it) and without evaluating the warm start again
    # (notebook 02's agent_fixed_ranker served its adapters on the engine); ci_vllm validates no step
    baselines = "rag,agent_retrieval,agent_fixed_ranker,agent_oracle"
    for prefix, params in (("02_", {"methods": baselines}), ("03_", {"evaluate_ceiling": False, "evaluate_before": False})):
        nb = next(p for p in list_notebooks() if p.name.startswith(prefix))
        run_notebook(nb, "ci_vllm", parameters=params, progress=False, cell_timeout=900)
    records = load_records(runs / "02_eval_records.parquet")
    assert list(records.columns) == (columns := harness_config(load_profile("ci_vllm")).record_columns()) and list(dict.fromkeys(records["method"])) == baselines.split(",")
    steps = pd.read_csv(runs / "training" / "cosearch" / "steps.csv")
    assert steps["step"].tolist() == [0, 1] and all(describe_step_metric(c) for c in steps.columns)
    assert steps["time/sync_s"].notna().all()  # both adapters re-registered with the engine after each update
    for role in ("agent", "ranker"):
        forwarded = steps[f"loss/{role}_n_forwarded"] > 0
        assert forwarded.any(), steps.to_string()
        # bf16 engine against the fp32 trainer: a drift the records show, and a ratio of exactly 1
        # before the first step because the trainer recomputed the old log-probs (grpo.old_logprobs: auto)
        assert (steps.loc[forwarded, f"loss/{role}_logp_drift_mean"] > 0).all()
        assert (steps.loc[forwarded, f"loss/{role}_ratio_outside_clip"] == 0).all()
    warm = warmstart_dir(load_profile("ci_vllm"))
    last = sorted((runs / "training" / "cosearch" / "checkpoints").iterdir())[-1] / "adapters"
    for adapter in ("agent", "ranker"):
        assert adapter_change(warm / adapter, last / adapter)["changed"] > 0, adapter
    evaluated = load_records(runs / "03_eval_records.parquet")
    assert list(evaluated.columns) == [*columns, "eval_method"]  # as on the transformers backend
    assert set(evaluated["method"]) == {"cosearch: after GRPO"}
    assert "val/f1" not in steps or steps["val/f1"].isna().all()  # eval_every: 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grouped_cpu_lora_ops_compute_what_vllms_per_token_ops_compute(dtype):
    """cpu_lora_ops replaces vLLM's per-token weight gather with one product per adapter slot: the same
    numbers (to rounding) for one slot, several slots, and the negative index vLLM's indexing wraps."""
    from vllm.lora.ops.torch_ops import lora_ops as upstream
    from vllm.lora.punica_wrapper import punica_cpu

    from cosearch_lib.models.generation import cpu_lora_ops as ours

    assert ours.install()  # what a CPU engine runs: vLLM's ops, where the punica wrapper calls them, are ours
    assert all(getattr(m, name) is getattr(ours, name) for m in (upstream, punica_cpu) for name in ours.PATCHED_OPS)
    gen = torch.Generator().manual_seed(0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=0.25)
    for indices in (torch.full((37,), 1), torch.tensor([0, 1, 2, 1, 0, -1, 2] * 5), torch.tensor([-1] * 9)):
        t = len(indices)
        x_small, x_big = torch.randn(t, 16, generator=gen), torch.randn(t, 64, generator=gen)
        b = torch.randn(3, 1, 48, 16, generator=gen).to(dtype)  # expand: rank 16 -> 48
        a = torch.randn(3, 1, 16, 64, generator=gen).to(dtype)  # shrink: 64 -> rank 16
        selected_b, selected_a = b.squeeze(1)[indices].float(), a.squeeze(1)[indices].float()
        expand_ref = torch.einsum("bi, boi -> bo", x_small.to(dtype).float(), selected_b)
        shrink_ref = 0.5 * torch.einsum("bi, boi -> bo", x_big.to(dtype).float(), selected_a)
        out = torch.ones(t, 48, dtype=dtype)
        ours.bgmv_expand(x_small, b, out, indices, add_inputs=True)
        torch.testing.assert_close(out.float(), 1 + expand_ref, **tol)
        out = torch.zeros(t, 100, dtype=dtype)
        ours.bgmv_expand_slice(x_small, b, out, indices, 20, 48, add_inputs=False)
        torch.testing.assert_close(out[:, 20:68].float(), expand_ref, **tol)
        assert not out[:, :20].any() and not out[:, 68:].any()
        out = torch.zeros(t, 16, dtype=dtype)
        ours.bgmv_shrink(x_big, a, out, indices, scaling=0.5)
        torch.testing.assert_close(out.float(), shrink_ref, **tol)
