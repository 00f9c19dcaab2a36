"""Ranker validation on held-out sub-queries: which sub-queries, Hit@k worked by hand for the rule
rankings and the scripted LLM ranker, greedy and repeatable, and the step records that carry it
(every eval_every steps, after the last, and at step -1 with validate_at_start)."""

from __future__ import annotations

import math

import pytest

from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.rl.ranker_validation import RANKER_VALIDATION_COLUMNS, HeldOutSubQuery, held_out_sub_queries
from cosearch_lib.rl.trainer import describe_step_metric
from cosearch_lib.viz.plots import plot_training_curves

from tests.doubles import tiny_model, trainer


def chain(*hops: tuple[str, str]) -> dict:
    return {"extra_info": {"gold_chain": [{"sub_query": q, "answer": a, "passage_ids": []} for q, a in hops]}}


# The validation questions reuse the training questions' ids (the scripted agent answers by id).
# FixedRetriever returns the corpus in order whatever the query: 0 Drask, 1 Tellis/Kessmere,
# 2 Tellis/atlases, 3 bells, 4 mill/1843, 5 harbour.
VAL_QUESTIONS = [
    QAExample(id="q1", question="Where was Orvane Tellis born?", golden_answers=["Kessmere"], data_source="syn_nq",
              extra=chain(("Who wrote the atlases?", "Tellis"), ("Was the mill old?", "yes"),
                          ("When was the mill built?", "1843"), ("Where was Tellis born?", "Kessmere"))),
    QAExample(id="q2", question="What did Tellis write?", golden_answers=["atlases"], data_source="syn_nq"),
    QAExample(id="q3", question="Which town is on the river?", golden_answers=["Drask"], data_source="syn_popqa"),
]


def test_held_out_sub_queries_are_the_gold_chain_hops_else_the_question():
    yes_no = QAExample(id="q9", question="Is Drask a town?", golden_answers=["yes"], data_source="syn_nq")
    got = held_out_sub_queries([*VAL_QUESTIONS, yes_no])
    assert got == [
        HeldOutSubQuery("q1", 0, "Where was Orvane Tellis born?", "Who wrote the atlases?", ("Tellis",)),
        HeldOutSubQuery("q1", 2, "Where was Orvane Tellis born?", "When was the mill built?", ("1843",)),
        HeldOutSubQuery("q1", 3, "Where was Orvane Tellis born?", "Where was Tellis born?", ("Kessmere",)),
        HeldOutSubQuery("q2", -1, "What did Tellis write?", "What did Tellis write?", ("atlases",)),
        HeldOutSubQuery("q3", -1, "Which town is on the river?", "Which town is on the river?", ("Drask",)),
    ]  # the "yes" hop and the yes/no question label nothing and are left out


# Shown passages (K = 3) and their labels per held-out sub-query:
#   retrieval top-3 [0, 1, 2]:         Tellis 011, 1843 000, Kessmere 010, atlases 001, Drask 100
#   scripted LLM ranker "[2] > [1] > [3]" -> [1, 0, 2]:
#                                      Tellis 101, 1843 000, Kessmere 100, atlases 001, Drask 010
#   oracle (Eq. 7): an answer passage is among the N = 6 for every sub-query -> first
EXPECTED = {
    "search_r1": {"val_ranker_hit@1": 1 / 5, "val_ranker_hit@3": 4 / 5, "val_ranker_hit@5": 4 / 5},
    "cosearch": {"val_ranker_hit@1": 2 / 5, "val_ranker_hit@3": 4 / 5, "val_ranker_hit@5": 4 / 5},
    "oracle": {"val_ranker_hit@1": 1.0, "val_ranker_hit@3": 1.0, "val_ranker_hit@5": 1.0},
}


@pytest.mark.parametrize("method", ["search_r1", "cosearch", "oracle"])
def test_validation_hit_at_k_of_each_method_equals_the_hand_count(tok, tmp_path, method):
    t = trainer(tok, tiny_model(tok), tmp_path, method=method, val_questions=VAL_QUESTIONS)
    result = t.validate()  # before any update: validation works at step 0
    assert set(result) == {"val_f1", *RANKER_VALIDATION_COLUMNS}
    for column, want in EXPECTED[method].items():
        assert result[column] == pytest.approx(want), column
    assert result["val_ranker_valid_rate"] == 1.0
    assert result["val_f1"] == pytest.approx(1.0)  # the scripted agent answers right at sample 0


def test_greedy_validation_ranks_at_temperature_zero_and_repeats_exactly(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", val_questions=VAL_QUESTIONS)
    retriever, backend = t.retriever, t.backend

    def validation_ranker_temperatures() -> set[float]:
        return {sampling.temperature for _, sampling, _, keys in backend.calls
                if keys and keys[0][:2] == ("ranker", "validation")}

    first = t.validate()
    searches = [c for c in retriever.calls if c[0] == [s.sub_query for s in t.ranker_validation.sub_queries]]
    assert len(searches) == 1 and searches[0][1] == 6  # the held-out sub-queries' top-N, fetched once
    assert validation_ranker_temperatures() == {0.0}  # greedy, while the training ranker samples:
    assert t.ranker.sampling.temperature == 1.0 and t.val_ranker.sampling.temperature == 0.0
    assert t.val_ranker.adapter == t.ranker.adapter == "ranker"
    second = t.validate()
    assert second == first
    assert len([c for c in retriever.calls if c[0] == searches[0][0]]) == 1  # cached, not searched again


def test_step_records_carry_the_validation_at_the_eval_steps_and_at_step_minus_one(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, method="search_r1", steps=3, eval_every=2, validate_at_start=True,
                val_questions=VAL_QUESTIONS)
    frame = t.run()
    assert frame["step"].tolist() == [-1, 0, 1, 2]
    validated = frame[["val_f1", *RANKER_VALIDATION_COLUMNS]].notna().all(axis=1).tolist()
    assert validated == [True, False, True, True]  # start, after step 2 (eval_every) and after the last
    assert frame["val_ranker_hit@1"].dropna().tolist() == pytest.approx([1 / 5] * 3)
    start = t.records[0]
    assert set(start) == {"step", "method", "val_f1", *RANKER_VALIDATION_COLUMNS} and start["method"] == "search_r1"
    for record in t.records:
        for key in record:
            assert describe_step_metric(key)
    # the training-curve plot (x = steps completed = step + 1) puts the starting point at 0
    fig = plot_training_curves(frame)
    val_axis = next(ax for ax in fig.axes if ax.get_title() == "validation avg F1")
    assert list(val_axis.lines[0].get_xdata()) == [0, 2, 3]
    reward_axis = next(ax for ax in fig.axes if ax.get_title().startswith("agent reward"))
    assert list(reward_axis.lines[0].get_xdata()) == [1, 2, 3]  # the start row has no training metrics


def test_validation_at_start_runs_once_and_only_when_asked(tok, tmp_path):
    off = trainer(tok, tiny_model(tok), tmp_path / "off", method="search_r1", steps=1, eval_every=1,
                  val_questions=VAL_QUESTIONS)
    off.run()
    assert [r["step"] for r in off.records] == [0]
    on = trainer(tok, tiny_model(tok), tmp_path / "on", method="search_r1", steps=2, validate_at_start=True,
                 val_questions=VAL_QUESTIONS)
    on.run(steps=1)
    on.step = 0  # even if step 0 came round again, the start row is not written twice
    on.train_step()
    assert [r["step"] for r in on.records].count(-1) == 1
    none = trainer(tok, tiny_model(tok), tmp_path / "none", method="search_r1", steps=1, validate_at_start=True)
    none.run()  # no validation questions: nothing to validate on
    assert [r["step"] for r in none.records] == [0]
    assert math.isnan(none.ranker_validation.score(none.val_ranker)["val_ranker_hit@1"])
