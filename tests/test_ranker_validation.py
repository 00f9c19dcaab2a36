"""Ranker validation on held-out sub-queries: which sub-queries, Hit@k worked by hand for the rule
rankings and the scripted LLM ranker, greedy and repeatable, and the step records that carry it
(every eval_every steps, after the last, and at step -1 with validate_at_start)."""

from __future__ import annotations

import math

import pytest

from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.records.training_runs import read_validation
from cosearch_lib.rl.ranker_validation import GoldSubQuery, gold_sub_queries, ranker_validation_columns
from cosearch_lib.run_schema import VALIDATION_COLUMNS, describe_step_metric, step_metric_name
from cosearch_lib.viz.plots import TRAINING_PANELS, plot_training_curves

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


def test_gold_sub_queries_are_the_gold_chain_hops_else_the_question():
    yes_no = QAExample(id="q9", question="Is Drask a town?", golden_answers=["yes"], data_source="syn_nq")
    got = gold_sub_queries([*VAL_QUESTIONS, yes_no])
    assert got == [
        GoldSubQuery("q1", 0, "Where was Orvane Tellis born?", "Who wrote the atlases?", ("Tellis",), "syn_nq"),
        GoldSubQuery("q1", 2, "Where was Orvane Tellis born?", "When was the mill built?", ("1843",), "syn_nq"),
        GoldSubQuery("q1", 3, "Where was Orvane Tellis born?", "Where was Tellis born?", ("Kessmere",), "syn_nq"),
        GoldSubQuery("q2", -1, "What did Tellis write?", "What did Tellis write?", ("atlases",), "syn_nq"),
        GoldSubQuery("q3", -1, "Which town is on the river?", "Which town is on the river?", ("Drask",), "syn_popqa"),
    ]  # the "yes" hop and the yes/no question label nothing and are left out
    assert [s.item_id for s in got] == ["q1/hop0", "q1/hop2", "q1/hop3", "q2/question", "q3/question"]


# Shown passages (K = 3) and their labels per held-out sub-query:
#   retrieval top-3 [0, 1, 2]:         Tellis 011, 1843 000, Kessmere 010, atlases 001, Drask 100
#   scripted LLM ranker "[2] > [1] > [3]" -> [1, 0, 2]:
#                                      Tellis 101, 1843 000, Kessmere 100, atlases 001, Drask 010
#   oracle (Eq. 7): an answer passage is among the N = 6 for every sub-query -> first
EXPECTED = {
    "search_r1": {"val_ranker_hit@1": 1 / 5, "val_ranker_hit@K": 4 / 5},
    "cosearch": {"val_ranker_hit@1": 2 / 5, "val_ranker_hit@K": 4 / 5},
    "oracle": {"val_ranker_hit@1": 1.0, "val_ranker_hit@K": 1.0},
}


@pytest.mark.parametrize("method", ["search_r1", "cosearch", "oracle"])
def test_validation_hit_at_k_of_each_method_equals_the_hand_count(tok, tmp_path, method):
    t = trainer(tok, tiny_model(tok), tmp_path, method=method, val_questions=VAL_QUESTIONS)
    result = t.validate()  # before any update: validation works at step 0
    assert set(result) == {"val_f1", *ranker_validation_columns(["hit@1", "hit@K"])}  # K = 3: Hit@3 is Hit@K
    for column, want in EXPECTED[method].items():
        assert result[column] == pytest.approx(want), column
    assert result["val_ranker_valid_rate"] == 1.0
    assert result["val_f1"] == pytest.approx(1.0)  # the scripted agent answers right at sample 0


def test_the_shares_of_two_ranks_score_the_rows_of_one_process(tok, tmp_path):
    """Data parallel validation: rank r scores every 2nd sub-query from r (``DataParallel.owned``);
    put back in order (``unshard``), the shares are the rows one process scores."""
    from cosearch_lib.rl.data_parallel import DataParallel

    t = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", val_questions=VAL_QUESTIONS)
    whole = t.ranker_validation.score_items(t.val_ranker)
    n = len(t.ranker_validation.sub_queries)
    assert n >= 3 and len(whole) == n
    shares = [t.ranker_validation.score_items(t.val_ranker, list(range(rank, n, 2))) for rank in (0, 1)]
    assert [len(s) for s in shares] == [(n + 1) // 2, n // 2]
    assert DataParallel(rank=0, world_size=2).unshard(shares) == whole
    assert t.ranker_validation.score_items(t.val_ranker, []) == []


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
    validation_columns = ["val/f1", "val/ranker_hit@1", "val/ranker_hit@K", "val/ranker_valid_rate"]  # K = 3
    validated = frame[validation_columns].notna().all(axis=1).tolist()
    assert validated == [True, False, True, True]  # start, after step 2 (eval_every) and after the last
    assert frame["val/ranker_hit@1"].dropna().tolist() == pytest.approx([1 / 5] * 3)
    start = t.records[0]
    assert set(start) == {"step", "method", *validation_columns} and start["method"] == "search_r1"
    for record in t.records:
        for key in record:
            assert describe_step_metric(key)
    # the training-curve plot (x = steps completed = step + 1) puts the starting point at 0
    fig = plot_training_curves(frame, panels=(*TRAINING_PANELS, ("val/f1", "validation avg F1")))
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
    on.run(steps=1)
    assert [r["step"] for r in on.records].count(-1) == 1
    none = trainer(tok, tiny_model(tok), tmp_path / "none", method="search_r1", steps=1, validate_at_start=True)
    none.run()  # no validation questions: nothing to validate on
    assert [r["step"] for r in none.records] == [0]
    assert math.isnan(none.ranker_validation.score(none.val_ranker)["val_ranker_hit@1"])


def test_validation_items_add_up_to_the_step_columns_and_survive_a_checkpoint(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", steps=3, eval_every=2, validate_at_start=True,
                val_questions=VAL_QUESTIONS)
    frame = t.run()
    items = t.validation_frame()
    assert list(items.columns) == list(VALIDATION_COLUMNS)
    assert sorted(set(items["step"])) == [-1, 1, 2]  # the step records that carry val_* columns
    for step, part in items.groupby("step"):
        agent, ranker = part[part["kind"] == "agent"], part[part["kind"] == "ranker"]
        assert sorted(agent["question_id"]) == ["q1", "q2", "q3"]
        assert sorted(ranker["question_id"]) == ["q1/hop0", "q1/hop2", "q1/hop3", "q2/question", "q3/question"]
        assert dict(zip(ranker["question_id"], ranker["dataset"]))["q3/question"] == "syn_popqa"
        record = frame[frame["step"] == step].iloc[0]
        # val_f1 is the macro average over families of the agent rows; Hit@k the plain mean of the ranker rows
        assert record["val/f1"] == pytest.approx(agent.groupby("dataset")["f1"].mean().mean())
        for hit in ("hit@1", "hit@K"):  # K = 3
            assert record[f"val/ranker_{hit}"] == pytest.approx(ranker[hit].mean())
        assert ranker["hit@1"].tolist() == pytest.approx([1, 0, 1, 0, 0])  # the scripted ranking, by hand above
    on_disk = read_validation(tmp_path.parent, [tmp_path.name])
    assert len(on_disk) == len(items) and on_disk["f1"].sum() == pytest.approx(items["f1"].sum())
    again = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", steps=3, eval_every=2, validate_at_start=True,
                    val_questions=VAL_QUESTIONS)
    again.load_checkpoint()
    assert again.val_records == t.val_records


def test_validate_without_a_step_keeps_no_items(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, method="search_r1", val_questions=VAL_QUESTIONS)
    t.validate()
    assert t.val_records == []
    t.validate(step=-1)
    assert len(t.val_records) == 3 + 5


def test_a_stop_signal_during_the_start_validation_finishes_the_first_step_and_checkpoints(tok, tmp_path):
    """The validation before the first update runs under the run's stop-signal guard, as a step does:
    SIGUSR1 there does not kill the process; the run stops at the first stage boundary, step 1's
    rollouts saved, with a checkpoint of step 0 that keeps the validation's record."""
    import os
    import signal

    from cosearch_lib.run_schema import latest_checkpoint
    from cosearch_lib.stop_signals import StopRequested

    t = trainer(tok, tiny_model(tok), tmp_path, method="search_r1", steps=3, validate_at_start=True,
                val_questions=VAL_QUESTIONS)
    validate = t.validate

    def validate_then_signal(step=None):
        out = validate(step=step)
        if step == -1:
            os.kill(os.getpid(), signal.SIGUSR1)  # as SLURM warns of its time limit
        return out

    t.validate = validate_then_signal
    with pytest.raises(StopRequested, match="after the rollout of step 1"):
        t.run()
    assert [r["step"] for r in t.records] == [-1] and latest_checkpoint(tmp_path).name == "step_000000"
    assert (tmp_path / "checkpoints" / "rollouts_step_000000.pt").exists()
    resumed = trainer(tok, tiny_model(tok), tmp_path, method="search_r1", steps=3, validate_at_start=True,
                      val_questions=VAL_QUESTIONS)
    assert resumed.load_checkpoint() == 0 and [r["step"] for r in resumed.records] == [-1]  # not validated again


def test_records_of_a_checkpoint_written_before_the_hit_at_k_rename_resume_under_todays_names(tok, tmp_path, monkeypatch):
    """A checkpoint whose records still say ``hit@5`` (before the step column was named for K) and
    carry flat metric keys (before the namespaces) resumes under today's names only: steps.csv then
    has one column for each, not two. It is also older than the run identity (``state["run"]``): its
    method and seed are read from its config."""
    import cosearch_lib.rl.run_protocol as protocol_mod

    t = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", steps=2)
    t.run(steps=1)
    real_load = protocol_mod.load_state

    def old_names(path):
        state = real_load(path)
        flat = {new: old for old, new in {"hit@5": "ranker/hit@K", **{old: step_metric_name(old) for r in ("agent", "ranker")
                                   for old in (f"{r}_n_forwarded", f"{r}_loss", f"{r}_kl", "agent_reward", "n_ranker_calls",
                                               "val_f1", "rollout_s", "step_s", "update_s", "grouping_n_groups_post")}}.items()}
        step = lambda r: {flat.get(k, k): v for k, v in r.items()}  # noqa: E731
        call = lambda r: {("hit@5" if k == "hit@K" else k): v for k, v in r.items()}  # noqa: E731
        return {**{k: v for k, v in state.items() if k != "run"}, "records": [step(r) for r in state["records"]],
                "call_records": [call(r) for r in state["call_records"]]}

    monkeypatch.setattr(protocol_mod, "load_state", old_names)
    with pytest.raises(ValueError, match="of method 'cosearch', not 'oracle'"):
        trainer(tok, tiny_model(tok), tmp_path, method="oracle", steps=2).load_checkpoint()
    again = trainer(tok, tiny_model(tok), tmp_path, method="cosearch", steps=2)
    assert again.load_checkpoint() == 1
    again.run()
    frame, calls = again.frame(), again.calls_frame()
    assert set(frame.columns) == set(t.frame().columns) and not [c for c in frame if "/" not in c and c not in ("step", "method")]
    assert "hit@5" not in frame and frame["ranker/hit@K"].notna().all() and len(frame) == 2
    assert "hit@5" not in calls and calls["hit@K"].notna().all()
