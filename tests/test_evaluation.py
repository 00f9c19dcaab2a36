"""The evaluation harness: one record row per (method, question, sample), scores hand-checked, the
baselines' prompts and parsers, the oracle seeing what retrieval-only does not, the paper's tables
hand-computed, skipped methods, example selection, determinism and the saved records.
A scripted backend and a fixed in-memory retriever make every case deterministic and fast."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from cosearch_lib.agent.parsers import parse_answer_only
from cosearch_lib.config import SearchBudget
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.eval.harness import (
    HarnessConfig,
    HarnessContext,
    MethodSkippedWarning,
    evaluate,
    run_evaluation,
    select_examples,
)
from cosearch_lib.eval.tables import (
    format_fail_breakdown,
    load_records,
    oracle_gap_table,
    save_records,
    summary_table,
    turn_distribution,
)
from cosearch_lib.experiment import harness_config, harness_context
from cosearch_lib.seeding import derive_seed

from tests.doubles import FixedRetriever, ScriptedBackend, answer_turn, search_turn

CORPUS = [Passage(str(i), f'"Doc {i}"\n{text}') for i, text in enumerate([
    "Drask is a river town.", "The mill was built in 1843.", "Orvane Tellis was born in Kessmere.",
    "Kessmere lies on the coast.", "Tellis wrote atlases.", "Unrelated passage about bells."])]

Q1 = QAExample(id="q1", question="Where was Orvane Tellis born?", golden_answers=["Kessmere"], data_source="syn_nq")
Q2 = QAExample(id="q2", question="Which bridge crosses the Drask?", golden_answers=["Old Kessmere Bridge"],
               data_source="syn_hotpotqa")












def search_turn_short(q):
    return search_turn(q, reason="I look it up.")


def make_ctx(tok, chat, respond):
    backend = ScriptedBackend(tok, respond)
    return HarnessContext(agent_backend=backend, chat=chat, retriever=FixedRetriever(CORPUS)), backend


def small_cfg(**kw):
    """Baselines reply freely (the model writes every tag) unless ``baseline_reply`` says otherwise."""
    budget = SearchBudget(topn=5, topk=2, max_searches=kw.pop("max_searches", 2))
    return HarnessConfig(**{"search": budget, "baseline_reply": "free", **kw})


def by_question(table):
    """Scripted replies keyed by question id, whatever the method."""
    def respond(prompt, key):
        return table[key[1] if key[0] in ("direct", "cot", "rag") else key[2]]
    return respond


# --------------------------------------------------------------------------- records


def test_records_schema_scores_and_one_row_per_method_question_sample(tok, chat):
    ctx, _ = make_ctx(tok, chat, by_question({"q1": "<answer>Kessmere</answer>", "q2": "<answer>Kessmere Bridge</answer>"}))
    records = run_evaluation(["direct", "cot"], [Q1, Q2], ctx, small_cfg(n_samples=2), progress=False)
    assert list(records.columns) == small_cfg().record_columns()
    assert len(records) == 8 and not records.duplicated(["method", "question_id", "sample"]).any()
    assert list(records["method"]) == ["direct"] * 4 + ["cot"] * 4
    q1 = records[records.question_id == "q1"].iloc[0]
    assert q1.prediction == "Kessmere" and q1.f1 == 1.0 and q1.em == 1.0 and q1.format_ok and q1.finish == "answer"
    assert q1.dataset == "syn_nq" and q1.group == "single" and q1.golds == ["Kessmere"] and q1.split == "test"
    # "kessmere bridge" vs "old kessmere bridge": precision 1, recall 2/3 -> F1 0.8; no exact match
    q2 = records[records.question_id == "q2"].iloc[0]
    assert q2.f1 == pytest.approx(0.8) and q2.em == 0.0 and q2.group == "multi"
    assert records["n_searches"].eq(0).all() and records["ranker_hit@1"].isna().all()
    assert (records["n_generated_tokens"] > 0).all() and (records["wall_s"] > 0).all()


def test_format_failure_gives_no_prediction_and_zero_f1(tok, chat):
    ctx, _ = make_ctx(tok, chat, by_question({"q1": "It is Kessmere.", "q2": "Answer: <answer>Kessmere</answer>"}))
    records = evaluate("direct", [Q1, Q2], ctx, small_cfg(), progress=False)
    assert records["prediction"].isna().all() and (records["f1"] == 0).all() and (records["em"] == 0).all()
    assert not records["format_ok"].any() and list(records["finish"]) == ["invalid", "invalid"]
    assert list(records["error"]) == ["no_tags", "extra_text"]


def test_one_batched_generation_per_baseline_with_method_row_keys(tok, chat):
    ctx, backend = make_ctx(tok, chat, by_question({"q1": "<answer>x</answer>", "q2": "<answer>y</answer>"}))
    evaluate("cot", [Q1, Q2], ctx, small_cfg(n_samples=2, seed=5, agent_max_new_tokens=99), progress=False)
    ((prompts, sampling, adapter, keys),) = backend.calls
    assert len(prompts) == 4 and keys == [("cot", "q1", 0), ("cot", "q1", 1), ("cot", "q2", 0), ("cot", "q2", 1)]
    assert sampling.seed == 5 and sampling.temperature == 0.0 and sampling.stop == ("</answer>",)
    assert sampling.max_new_tokens == 99 and adapter is None
    assert "<reason>" in tok.decode(prompts[0]) and Q1.question in tok.decode(prompts[0])


def test_prefilled_replies_continue_the_answer_tag_and_cot_reasons_first(tok, chat):
    def respond(prompt, key):
        if key[0] == "cot" and key[-1] == "reason":
            return "Tellis was born by the old bridge.</reason>"
        return {"q1": "Kessmere</answer>", "q2": "Kessmere Bridge"}[key[1]]  # q2: ended by eos, closed for it

    ctx, backend = make_ctx(tok, chat, respond)
    direct = evaluate("direct", [Q1, Q2], ctx, small_cfg(baseline_reply="prefilled"), progress=False)
    assert list(direct["prediction"]) == ["Kessmere", "Kessmere Bridge"] and direct["format_ok"].all()
    ((prompts, sampling, _, keys),) = backend.calls
    text = tok.decode(prompts[0])
    assert text.endswith("<answer>") and "1874" not in text  # no example answer for a small model to copy
    assert sampling.stop == ("</answer>",) and keys == [("direct", "q1", 0), ("direct", "q2", 0)]
    backend.calls.clear()
    cot = evaluate("cot", [Q1], ctx, small_cfg(baseline_reply="prefilled", agent_max_new_tokens=50,
                                               answer_max_new_tokens=9), progress=False)
    (reason_prompts, reason_sampling, _, reason_keys), (answer_prompts, answer_sampling, _, _) = backend.calls
    assert tok.decode(reason_prompts[0]).endswith("<reason>") and reason_keys == [("cot", "q1", 0, "reason")]
    assert reason_sampling.stop == ("</reason>", "<answer>") and reason_sampling.max_new_tokens == 50
    assert tok.decode(answer_prompts[0]).endswith("old bridge.</reason>\n<answer>") and answer_sampling.max_new_tokens == 9
    assert cot.loc[0, "prediction"] == "Kessmere" and cot.loc[0, "format_ok"]
    assert cot.loc[0, "n_generated_tokens"] > len(tok("Kessmere</answer>")["input_ids"])  # both stages counted


def test_a_prefilled_answer_cut_by_the_budget_stays_unclosed(tok, chat):
    ctx, _ = make_ctx(tok, chat, by_question({"q1": "Kessmere " * 40, "q2": "Kessmere</answer>"}))
    records = evaluate("direct", [Q1, Q2], ctx, small_cfg(baseline_reply="prefilled", answer_max_new_tokens=8),
                       progress=False)
    assert list(records["finish"]) == ["max_tokens", "answer"] and list(records["error"]) == ["unclosed_tag", None]
    with pytest.raises(ValueError, match="baseline_reply"):
        small_cfg(baseline_reply="tagged")


def test_rag_puts_the_retrieved_passages_in_the_prompt(tok, chat):
    ctx, backend = make_ctx(tok, chat, by_question({"q1": "<answer>Drask</answer>", "q2": "<answer>Drask</answer>"}))
    records = evaluate("rag", [Q1, Q2], ctx, small_cfg(), progress=False)
    assert ctx.retriever.calls == [([Q1.question, Q2.question], 2)]  # one batched retrieval, top-K
    text = tok.decode(backend.calls[0][0][0])
    assert "<information>" in text and "Drask is a river town." in text and "The mill was built in 1843." in text
    assert "Orvane Tellis was born" not in text  # rank 3 is beyond K = 2
    assert text.index("</information>") < text.index(Q1.question)
    assert list(records["n_searches"]) == [1, 1] and records.loc[0, "ranker_hit@1"] == 0.0  # top-2 miss the answer


def test_oracle_and_retrieval_agents_see_different_observations(tok, chat):
    def respond(prompt, key):
        if key[-1] == 0:
            return search_turn_short("Orvane Tellis birthplace")
        return answer_turn("Kessmere" if "born in Kessmere" in tok.decode(prompt) else "Drask")

    ctx, _ = make_ctx(tok, chat, respond)
    kept = {}
    records = run_evaluation(["direct", "agent_retrieval", "agent_oracle"], [Q1], ctx, small_cfg(), progress=False,
                             trajectories=kept)
    records = records[records["method"] != "direct"].reset_index(drop=True)
    # the agent methods' trajectories come back for the browser; the one-generation baseline has none
    assert set(kept) == {"agent_retrieval", "agent_oracle"}
    assert [t.answer for t in kept["agent_retrieval"] + kept["agent_oracle"]] == ["Drask", "Kessmere"]
    assert kept["agent_oracle"][0].ranker_calls[0].order[0] == 2  # the answer passage was promoted to the top
    retrieval, oracle = records.iloc[0], records.iloc[1]
    assert retrieval.prediction == "Drask" and retrieval.f1 == 0.0 and retrieval["ranker_hit@1"] == 0.0
    assert oracle.prediction == "Kessmere" and oracle.f1 == 1.0 and oracle["ranker_hit@1"] == 1.0
    assert list(records["n_searches"]) == [1, 1] and list(records["ranker_valid_rate"]) == [1.0, 1.0]
    assert records["format_ok"].all() and list(records["finish"]) == ["answer", "answer"]


def test_agent_methods_roll_out_together_one_generation_per_turn_with_the_records_of_each_alone(tok, chat):
    """The agent methods of one evaluation share the agent and differ in the ranker: each turn decodes
    the rows of all of them in one batch (3 methods x 2 questions: 6 rows in one call), and every
    method gets the records it gets alone. A method that cannot run is skipped; the others still run."""
    def respond(prompt, key):
        if key[0] == "ranker":
            return "<reason>3 names the birthplace.</reason><rerank>[3] > [1]</rerank>"
        if key[-1] == 0:
            return search_turn_short("Orvane Tellis birthplace")
        return answer_turn("Kessmere" if "born in Kessmere" in tok.decode(prompt) else "Drask")

    methods = ["agent_retrieval", "agent_fixed_ranker", "agent_oracle"]
    ctx, backend = make_ctx(tok, chat, respond)
    kept = {}
    with pytest.warns(MethodSkippedWarning, match="agent_trained_ranker"):
        together = run_evaluation([*methods, "agent_trained_ranker"], [Q1, Q2], ctx, small_cfg(), progress=False,
                                  trajectories=kept)
    agent_calls = [len(c[0]) for c in backend.calls if c[3][0][0] == "agent"]
    assert agent_calls == [6, 6]  # turn 0 (searches) and turn 1 (answers), every method's rows at once
    alone = []
    for method in methods:
        ctx, backend = make_ctx(tok, chat, respond)
        alone.append(evaluate(method, [Q1, Q2], ctx, small_cfg(), progress=False))
        assert [len(c[0]) for c in backend.calls if c[3][0][0] == "agent"] == [2, 2]
    alone = pd.concat(alone, ignore_index=True)
    assert list(together["method"]) == [m for m in methods for _ in (Q1, Q2)]
    pd.testing.assert_frame_equal(together.drop(columns="wall_s"), alone.drop(columns="wall_s"))
    assert set(together["prediction"]) == {"Kessmere", "Drask"}  # the rankers made the methods differ
    assert list(kept) == methods and [len(v) for v in kept.values()] == [2, 2, 2]


def test_fixed_and_trained_llm_rankers_use_their_adapters(tok, chat):
    def respond(prompt, key):
        if key[0] == "ranker":
            return "<reason>3 names the birthplace.</reason><rerank>[3] > [1]</rerank>"
        return search_turn_short("birthplace") if key[-1] == 0 else answer_turn("Kessmere")

    ctx, backend = make_ctx(tok, chat, respond)
    cfg = small_cfg(fixed_ranker_adapter=None, trained_ranker_adapter="ranker_step100", agent_adapter="agent")
    records = run_evaluation(["agent_fixed_ranker", "agent_trained_ranker"], [Q1], ctx, cfg, progress=False)
    ranker_adapters = [c[2] for c in backend.calls if c[3][0][0] == "ranker"]
    agent_adapters = {c[2] for c in backend.calls if c[3][0][0] == "agent"}
    assert ranker_adapters == [None, "ranker_step100"] and agent_adapters == {"agent"}
    assert list(records["ranker_valid_rate"]) == [1.0, 1.0] and list(records["ranker_hit@1"]) == [1.0, 1.0]


def test_agent_format_failure_and_search_cap(tok, chat):
    ctx, _ = make_ctx(tok, chat, lambda prompt, key: "Kessmere, I think." if key[2] == "q1" else search_turn_short(f"try {key[-1]}"))
    records = evaluate("agent_retrieval", [Q1, Q2], ctx, small_cfg(max_searches=2), progress=False)
    bad, capped = records.iloc[0], records.iloc[1]
    assert bad.prediction is None and bad.f1 == 0.0 and not bad.format_ok and bad.finish == "invalid"
    assert bad.error == "no_tags" and bad.n_searches == 0 and math.isnan(bad["ranker_hit@K"])
    assert capped.finish == "max_searches" and capped.n_searches == 2 and capped.error is None  # the refused third is not counted


# --------------------------------------------------------------------------- skipping, selection, determinism


def test_methods_without_their_artefacts_are_skipped_with_a_clear_message(tok, chat):
    ctx, backend = make_ctx(tok, chat, by_question({"q1": "<answer>Kessmere</answer>"}))
    with pytest.warns(MethodSkippedWarning, match="trained_ranker_adapter"):
        empty = evaluate("agent_trained_ranker", [Q1], ctx, small_cfg(), progress=False)
    assert len(empty) == 0 and list(empty.columns) == small_cfg().record_columns() and not backend.calls
    with pytest.warns(MethodSkippedWarning, match="cross-encoder"):
        records = run_evaluation(["direct", "agent_scorer"], [Q1], ctx, small_cfg(), progress=False)
    assert list(records["method"]) == ["direct"]
    with pytest.raises(ValueError, match="unknown evaluation method 'agent_magic'"):
        HarnessConfig(methods=("direct", "agent_magic"))


def test_n_per_dataset_takes_the_first_n_per_source_in_file_order(tok, chat):
    examples = [QAExample(id=f"{src}{i}", question=f"question {src} {i}?", golden_answers=["x"], data_source=src)
                for i in range(3) for src in ("nq", "hotpotqa")]
    assert [e.id for e in select_examples(examples, 2)] == ["nq0", "hotpotqa0", "nq1", "hotpotqa1"]
    assert select_examples(examples, None) == examples
    ctx, _ = make_ctx(tok, chat, lambda prompt, key: "<answer>x</answer>")
    records = evaluate("direct", examples, ctx, small_cfg(n_per_dataset=1), progress=False)
    assert list(records["question_id"]) == ["nq0", "hotpotqa0"]


def seeded_responder(backend_ref):
    """A stand-in for sampling: the reply depends on (call seed, row key), as a real sampler's does."""
    def respond(prompt, key):
        seed = backend_ref[0].calls[-1][1].seed
        return answer_turn(["Kessmere", "Drask", "Tellis"][derive_seed(seed, key) % 3]) if key[-1] else search_turn_short("q")
    return respond


def test_same_seed_gives_identical_records(tok, chat):
    def run(seed):
        ref = []
        ctx, backend = make_ctx(tok, chat, seeded_responder(ref))
        ref.append(backend)
        cfg = small_cfg(seed=seed, n_samples=4, temperature=1.0)
        return evaluate("agent_retrieval", [Q1, Q2], ctx, cfg, progress=False).drop(columns="wall_s")

    first, again, other = run(3), run(3), run(4)
    pd.testing.assert_frame_equal(first, again)
    assert list(first["prediction"]) != list(other["prediction"])


# --------------------------------------------------------------------------- tables


def hand_records(rows):
    """Minimal records: (method, dataset, question_id, f1, n_searches)."""
    from cosearch_lib.eval.benchmark_families import hop_group

    return pd.DataFrame([{"method": m, "dataset": d, "group": hop_group(d), "question_id": q, "sample": 0, "f1": f,
                          "n_searches": n, "finish": "answer", "error": None} for m, d, q, f, n in rows])


def test_summary_table_macro_averages_in_paper_order():
    records = hand_records([
        ("agent_retrieval", "hotpotqa", "h1", 1.0, 1),  # multi: 1.0
        ("agent_retrieval", "nq", "n1", 1.0, 1), ("agent_retrieval", "nq", "n2", 0.0, 1),
        ("agent_retrieval", "nq", "n3", 0.0, 1),  # single: 1/3
        ("direct", "nq", "n1", 0.5, 0), ("direct", "hotpotqa", "h1", 0.0, 0),
    ])
    table = summary_table(records)
    assert list(table.columns) == ["nq", "hotpotqa", "single-hop avg", "multi-hop avg", "avg"]
    assert list(table.index) == ["agent_retrieval", "direct"]
    row = table.loc["agent_retrieval"]
    assert row["single-hop avg"] == pytest.approx(1 / 3) and row["multi-hop avg"] == 1.0
    assert row["avg"] == pytest.approx(2 / 3)  # macro over datasets; the micro mean would be 0.5
    assert table.loc["direct", "avg"] == pytest.approx(0.25)
    assert table.attrs["n"]["agent_retrieval"] == {"nq": 3, "hotpotqa": 1}
    assert summary_table(records, methods=["direct", "agent_trained_ranker"]).loc["agent_trained_ranker"].isna().all()


def test_summary_table_averages_samples_within_a_question_first():
    records = hand_records([("m", "nq", "n1", 1.0, 0), ("m", "nq", "n1", 0.0, 0), ("m", "nq", "n2", 1.0, 0)])
    records["sample"] = [0, 1, 0]
    assert summary_table(records).loc["m", "nq"] == pytest.approx(0.75)  # (0.5 + 1.0) / 2


def test_oracle_gap_table_relative_gain():
    records = hand_records([
        ("agent_retrieval", "nq", "n1", 0.4, 1), ("agent_retrieval", "musique", "m1", 0.2, 2),
        ("agent_oracle", "nq", "n1", 0.5, 1), ("agent_oracle", "musique", "m1", 0.3, 1),
    ])
    table = oracle_gap_table(records)
    assert list(table.index) == ["standard", "oracle", "relative gain %"]
    assert list(table.columns) == ["single-hop avg", "multi-hop avg", "avg"]
    assert table.loc["standard", "avg"] == pytest.approx(0.3) and table.loc["oracle", "avg"] == pytest.approx(0.4)
    gain = table.loc["relative gain %"]
    assert gain["single-hop avg"] == pytest.approx(25.0) and gain["multi-hop avg"] == pytest.approx(50.0)
    assert gain["avg"] == pytest.approx(100 / 3)
    zero = hand_records([("agent_retrieval", "nq", "n1", 0.0, 1), ("agent_oracle", "nq", "n1", 0.5, 1)])
    assert math.isnan(oracle_gap_table(zero).loc["relative gain %", "single-hop avg"])
    with pytest.raises(ValueError, match="agent_oracle"):
        oracle_gap_table(zero[zero.method == "agent_retrieval"])


def test_turn_distribution_percentages_and_mean():
    records = hand_records([("a", "nq", f"n{i}", 0.0, n) for i, n in enumerate([0, 1, 1, 2])]
                           + [("b", "nq", f"n{i}", 0.0, n) for i, n in enumerate([1, 3])])
    table = turn_distribution(records)
    assert list(table.columns) == [0, 1, 2, 3, "no answer", "mean"]
    assert list(table.loc["a", [0, 1, 2, 3]]) == [25.0, 50.0, 25.0, 0.0] and table.loc["a", "mean"] == 1.0
    assert list(table.loc["b", [0, 1, 2, 3]]) == [0.0, 50.0, 0.0, 50.0] and table.loc["b", "mean"] == 2.0
    assert table[[0, 1, 2, 3, "no answer"]].sum(axis=1).tolist() == [100.0, 100.0]
    capped = turn_distribution(records, max_turns=2)
    assert list(capped.loc["b", [0, 1, 2]]) == [0.0, 50.0, 50.0] and capped.loc["b", "mean"] == 2.0


def test_rows_that_never_answered_are_not_answered_after_zero_searches():
    records = hand_records([("a", "nq", f"n{i}", 0.0, n) for i, n in enumerate([0, 0, 1, 2])])
    records.loc[[0, 3], "finish"] = ["invalid", "max_searches"]  # broke the protocol at once; hit the cap
    table = turn_distribution(records)
    assert table.loc["a", 0] == 25.0 and table.loc["a", 1] == 25.0 and table.loc["a", 2] == 0.0
    assert table.loc["a", "no answer"] == 50.0 and table.loc["a", "mean"] == 0.75  # mean searches of all rows
    with pytest.raises(ValueError, match="finish"):
        turn_distribution(records.drop(columns="finish"))


def test_format_fail_breakdown_shares():
    records = hand_records([("a", "nq", f"n{i}", f, 1) for i, f in enumerate([1.0, 0.0, 0.0, 0.0])])
    records.loc[2, ["finish", "error"]] = ["invalid", "no_tags"]
    records.loc[3, ["finish", "error"]] = ["max_tokens", None]
    table = format_fail_breakdown(records)
    assert list(table.columns[:4]) == ["answer", "invalid", "max_searches", "max_tokens"]
    assert list(table.loc["a", ["answer", "invalid", "max_searches", "max_tokens"]]) == [50.0, 25.0, 0.0, 25.0]
    assert table.loc["a", "answered, f1 = 0 %"] == 25.0 and table.loc["a", "f1 | answered"] == 0.5
    errors = format_fail_breakdown(records, by="error")
    assert errors.loc["a", "no_tags"] == 25.0 and errors.loc["a", "(none)"] == 75.0


# --------------------------------------------------------------------------- saving and parsing


def test_save_and_load_records_roundtrip(tok, chat, tmp_path):
    ctx, _ = make_ctx(tok, chat, by_question({"q1": "<answer>NA</answer>", "q2": "no tags"}))
    records = evaluate("rag", [Q1, Q2], ctx, small_cfg(), progress=False)
    parquet, csv = save_records(records, tmp_path / "eval", "rag_test")
    assert parquet.exists() and csv.exists()
    raw = pd.read_csv(csv)
    assert json.loads(raw.loc[1, "golds"]) == ["Old Kessmere Bridge"]
    for path in (parquet, csv):
        back = load_records(path)
        assert back["golds"].tolist() == records["golds"].tolist()
        assert back["prediction"].tolist() == ["NA", None] and back["error"].tolist() == [None, "no_tags"]
        pd.testing.assert_frame_equal(summary_table(back), summary_table(records))


@pytest.mark.parametrize("text, expected", [
    ("<answer>Kessmere</answer>", ("Kessmere", True, None)),
    ("<reason>It says so.</reason>\n<answer> Kessmere </answer><|im_end|>", ("Kessmere", True, None)),
    ("<answer>Kessmere</answer><reason>late</reason>", (None, False, "wrong_order")),
    ("So: <answer>Kessmere</answer>", (None, False, "extra_text")),
    ("<answer>a</answer><answer>b</answer>", (None, False, "multiple_answers")),
    ("<reason>thinking</reason>", (None, False, "missing_answer")),
    ("<answer> </answer>", (None, False, "empty_answer")),
    ("<answer>Kessmere", (None, False, "unclosed_tag")),
    ("Kessmere", (None, False, "no_tags")),
])
def test_parse_answer_only(text, expected):
    assert tuple(parse_answer_only(text)) == expected


def test_register_adapter_loads_checkpoint_folders_once(tmp_path):
    """A folder becomes a named adapter (peft on transformers, add_adapter on vLLM); a name passes through."""
    from types import SimpleNamespace

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from cosearch_lib.eval.harness import register_adapter

    tiny = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2)
    lora = LoraConfig(r=2, target_modules=["q_proj"])
    for step in ("step_1", "step_2"):
        get_peft_model(LlamaForCausalLM(LlamaConfig(**tiny)), lora).save_pretrained(tmp_path / step / "ranker")
    backend = SimpleNamespace(model=LlamaForCausalLM(LlamaConfig(**tiny)))
    assert register_adapter(backend, "ranker") == "ranker" and register_adapter(backend, None) is None
    first = register_adapter(backend, str(tmp_path / "step_1" / "ranker"))
    second = register_adapter(backend, str(tmp_path / "step_2" / "ranker"))
    assert isinstance(backend.model, PeftModel) and first != second and first.startswith("eval_ranker_")
    assert {first, second} <= set(backend.model.peft_config)
    assert register_adapter(backend, str(tmp_path / "step_1" / "ranker")) == first  # loaded once
    added = []
    vllm_like = SimpleNamespace(add_adapter=lambda name, path: added.append((name, path)))
    assert register_adapter(vllm_like, str(tmp_path / "step_1" / "ranker")) == first
    assert added == [(first, str((tmp_path / "step_1" / "ranker").resolve()))]


# ------------------------------------------------------------------------------ from a profile


def test_harness_config_reads_the_evaluation_rollout_and_search_sections(tmp_path):
    from cosearch_lib.config import load_profile

    path = tmp_path / "p.yaml"
    path.write_text("profile: p\nseed: 7\nsearch: {topn: 12, topk: 3, max_searches: 2}\n"
                    "rollout: {agent_max_new_tokens: 40, ranker_max_new_tokens: 30, max_context_tokens: 900}\n"
                    "evaluation: {split: dev, n_per_dataset: 4, n_samples: 2, temperature: 0.5, answer_max_new_tokens: 20}\n")
    cfg = load_profile(path)
    ec = harness_config(cfg)
    assert (ec.split, ec.n_per_dataset, ec.n_samples, ec.temperature, ec.seed) == ("dev", 4, 2, 0.5, 7)
    assert (ec.search.topn, ec.search.topk, ec.search.max_searches, ec.max_context_tokens) == (12, 3, 2, 900)
    assert (ec.agent_max_new_tokens, ec.ranker_max_new_tokens, ec.answer_max_new_tokens) == (40, 30, 20)
    assert ec.answer_sampling("cot").max_new_tokens == 40 and ec.answer_sampling("rag").max_new_tokens == 20
    over = harness_config(cfg, methods=["rag"], n_per_dataset=None)
    assert over.methods == ("rag",) and over.n_per_dataset is None and over.search.topk == 3
    with pytest.raises(TypeError, match="n_per_datset"):
        harness_config(cfg, n_per_datset=3)
    with pytest.raises(ValueError, match="unknown evaluation method"):
        harness_config(cfg, methods=["agent_magic"])


def test_context_from_profile_shares_one_backend_when_agent_and_ranker_are_the_same_model(tok, monkeypatch):
    from cosearch_lib.config import load_profile
    from cosearch_lib.experiment import building

    built = []

    def fake_make_backend(kind, name, **kw):
        built.append((kind, name, kw))
        return ScriptedBackend(tok, [])

    monkeypatch.setattr(building, "make_backend", fake_make_backend)
    cfg = load_profile("ci")
    retriever = FixedRetriever([])
    ctx = harness_context(cfg, retriever)
    assert len(built) == 1 and built[0][:2] == ("transformers", cfg.models.agent)
    assert built[0][2]["batch_size"] == cfg.models.batch_size
    assert ctx.ranker_backend is ctx.agent_backend and ctx.ranker_chat is ctx.chat and ctx.retriever is retriever
    cfg.models.ranker = "some-other-ranker"
    ctx = harness_context(cfg, retriever)
    assert [b[1] for b in built[1:]] == [cfg.models.agent, "some-other-ranker"]
    assert ctx.ranker_backend is not ctx.agent_backend
    no_tok = ScriptedBackend(tok, [])
    no_tok.tokenizer = None
    with pytest.raises(ValueError, match="ranker backend has no tokenizer"):
        harness_context(cfg, retriever, backends=(ctx.agent_backend, no_tok))


def test_searches_by_family_beside_the_gold_chain_lengths():
    from cosearch_lib.eval.tables import GOLD_CHAIN_ROW, searches_by_family

    def chained(qid, family, hops):
        chain = [{"sub_query": f"s{h}", "answer": "a", "passage_ids": []} for h in range(hops)]
        return QAExample(id=qid, question="?", golden_answers=["a"], data_source=family,
                         extra={"extra_info": {"gold_chain": chain}})

    examples = [chained("n1", "syn_nq", 1), chained("h1", "syn_hotpotqa", 2), chained("m1", "syn_musique", 3)]
    records = pd.DataFrame([
        {"method": "agent_retrieval", "dataset": d, "question_id": q, "n_searches": n}
        for d, q, n in (("syn_nq", "n1", 1), ("syn_hotpotqa", "h1", 1), ("syn_musique", "m1", 2))])
    table = searches_by_family(records, examples)
    assert list(table.index) == [GOLD_CHAIN_ROW, "agent_retrieval"]
    assert table.loc[GOLD_CHAIN_ROW, "syn_musique"] == 3 and table.loc[GOLD_CHAIN_ROW, "multi-hop avg"] == 2.5
    assert table.loc["agent_retrieval", "multi-hop avg"] == 1.5 and table.loc["agent_retrieval", "single-hop avg"] == 1
    assert list(searches_by_family(records).index) == ["agent_retrieval"]  # no chains: no gold row


def test_a_new_ranking_mode_is_one_registry_entry_and_the_harness_builds_it(tok, chat, request):
    """docs/ARCHITECTURE.md, "How to add a ranking mode": a class plus one RANKING_MODES entry."""
    from cosearch_lib.agent.rankers import RANKING_MODES, Ranking, RankingMode, make_ranker, register_ranking_mode

    class LastFirst:  # the retriever's candidates read from the bottom up
        mode = "last_first"

        def rank(self, requests):
            return [Ranking(order=list(range(len(r.candidates) - 1, -1, -1))[:r.k]) for r in requests]

    request.addfinalizer(lambda: RANKING_MODES.pop("last_first", None))
    register_ranking_mode("last_first", RankingMode(lambda c: LastFirst(), rule=True))
    with pytest.raises(ValueError, match="already registered"):
        register_ranking_mode("last_first", RankingMode(lambda c: LastFirst(), rule=True))
    assert make_ranker("last_first").mode == "last_first"

    def respond(prompt, key):
        return search_turn_short("Orvane Tellis") if key[-1] == 0 else answer_turn("Kessmere")

    ctx, _ = make_ctx(tok, chat, respond)
    kept = {}
    records = run_evaluation(["agent_last_first"], [Q1], ctx, small_cfg(), progress=False, trajectories=kept)
    assert list(records["method"]) == ["agent_last_first"]
    assert kept["agent_last_first"][0].ranker_calls[0].order == [4, 3]  # N = 5 candidates, K = 2, bottom up
    with pytest.raises(ValueError, match="unknown evaluation method"):
        run_evaluation(["agent_no_such_mode"], [Q1], ctx, small_cfg(), progress=False)
