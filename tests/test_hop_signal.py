"""records.hop_signal: the training rollouts' agent rewards per hop group and per searches made."""

import math

import pandas as pd
import pytest

from cosearch_lib.records.docs import RESULT_SECTIONS
from cosearch_lib.records.hop_signal import (
    HOP_TABLES,
    concat_hop_tables,
    coverage,
    hop_signal_table,
    run_group_size,
    run_hop_tables,
    second_search_table,
    trajectory_table,
)

G = 4
DATA_SOURCE = {"m1": "syn_hotpotqa", "s1": "syn_nq"}


def _calls(trajectories: dict[str, tuple[int, float]], step: int) -> list[dict]:
    """One ranker call per search: {traj_id: (searches, agent reward)}; a trajectory with 0 searches has no call."""
    return [{"step": step, "question_id": traj.split("/")[0], "traj_id": traj, "turn": turn, "r_main": reward}
            for traj, (searches, reward) in trajectories.items() for turn in range(searches)]


@pytest.fixture
def trajectories() -> pd.DataFrame:
    rows = []
    for step in (0, 1):
        # the multi-hop question: a second search pays (1.0 against 0.0 and 0.5); its 4th trajectory never searched
        rows += _calls({"m1/0": (1, 0.0), "m1/1": (2, 1.0), "m1/2": (1, 0.5), "m1/3": (0, 0.0)}, step)
        # the single-hop one: one search answers, a second costs the answer
        rows += _calls({"s1/0": (1, 1.0), "s1/1": (1, 1.0), "s1/2": (3, 0.0), "s1/3": (1, 1.0)}, step)
    return trajectory_table(pd.DataFrame(rows), DATA_SOURCE, method="search_r1")


def test_one_row_per_trajectory_that_searched_with_its_hop_group_and_searches(trajectories):
    first = trajectories[trajectories["step"] == 0].set_index("traj_id")
    assert sorted(first.index) == ["m1/0", "m1/1", "m1/2", "s1/0", "s1/1", "s1/2", "s1/3"]  # m1/3 made no call
    assert first.loc["m1/1", "searches"] == 2 and first.loc["s1/2", "searches"] == 3
    assert set(first.loc[first["question_id"] == "m1", "hop"]) == {"multi"}
    assert set(first.loc[first["question_id"] == "s1", "hop"]) == {"single"}


def test_a_call_outside_the_training_split_is_refused():
    calls = pd.DataFrame(_calls({"x9/0": (1, 0.0)}, 0))
    with pytest.raises(ValueError, match="not in the training split.*x9"):
        trajectory_table(calls, DATA_SOURCE, method="cosearch")


def test_hop_signal_reads_mean_and_best_of_g_over_the_trajectories_that_searched(trajectories):
    table = hop_signal_table(trajectories, group_size=G, span=1).set_index(["hop", "part"])
    multi = table.loc[("multi", "first")]
    assert multi["questions"] == 1 and multi["steps"] == "0-0"
    assert multi["mean_of_g"] == pytest.approx(0.5) and multi["best_of_g"] == 1.0 and multi["with_signal"] == 1.0
    assert multi["searches_per_traj"] == pytest.approx(4 / G) and multi["never_searched"] == pytest.approx(1 / G)
    single = table.loc[("single", "all")]
    assert single["questions"] == 2 and single["mean_of_g"] == pytest.approx(0.75) and single["never_searched"] == 0.0
    assert single["searches_per_traj"] == pytest.approx(6 / G)


def test_a_second_search_is_read_within_questions_paired(trajectories):
    table = second_search_table(trajectories, span=1).set_index(["hop", "part"])
    multi = table.loc[("multi", "all")]
    assert multi["questions"] == 2  # the question at steps 0 and 1
    assert multi["more"] == 1.0 and multi["once"] == pytest.approx(0.25) and multi["diff"] == pytest.approx(0.75)
    single = table.loc[("single", "all")]
    assert single["diff"] == pytest.approx(-1.0) and single["ci_high"] == pytest.approx(-1.0)
    assert table.loc[("multi", "first"), "questions"] == 1 and math.isnan(table.loc[("multi", "first"), "ci_low"])


def test_results_render_the_hop_tables_under_their_heading(trajectories):
    title, render = RESULT_SECTIONS["05_figures"]
    row = {"method": "search_r1", "families": "all", "start_step": 0, "end_step": 2, "start": 0.1, "end": 0.2,
           "diff": 0.1, "ci_low": 0.0, "ci_high": 0.2, "n_questions": 70}
    text = "\n".join(render({"profiles": ["laptop_curve"], "methods": ["search_r1"], "questions_per_step": {"search_r1": 2.0},
                             "learning_curves": {"agent": [row]}, "grpo_signal": [],
                             "hop_signal": hop_signal_table(trajectories, group_size=G).to_dict(orient="records"),
                             "second_search": second_search_table(trajectories).to_dict(orient="records"),
                             "hop_signal_missing": ["laptop_curve_wide: no 'train' split file (run notebook 01)"]}))
    assert "#### What GRPO had to work with, per hop group" in text
    assert "| search_r1 | multi | all | 0-1 | 2 | 1.000 | 0.250 | 0.750 |" in text
    assert "No hop-group tables for laptop_curve_wide: no 'train' split file" in text


def test_the_figure_draws_one_interval_per_part_and_says_when_nothing_pairs(trajectories):
    import matplotlib.pyplot as plt

    from cosearch_lib.viz.hop_groups import plot_hop_signal

    fig = plot_hop_signal(second_search_table(trajectories, span=1), hop_signal_table(trajectories, group_size=G, span=1))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "search_r1 · multi · first (0-0, n=1)" and len(labels) == 6
    assert len(fig.axes[1].patches) == 4  # two hop groups x first, last
    plt.close(fig)
    short = plot_hop_signal(second_search_table(trajectories), hop_signal_table(trajectories, group_size=G))
    assert len(short.axes[1].patches) == 2 and [t.get_text() for t in short.axes[1].get_legend().get_texts()] == ["all steps"]
    plt.close(short)
    empty = plot_hop_signal(second_search_table(trajectories.iloc[0:0]), hop_signal_table(trajectories.iloc[0:0], group_size=G))
    assert "no data: no question whose rollouts searched both once and more" in [t.get_text() for t in empty.axes[0].texts]
    plt.close(empty)


def test_g_is_the_runs_own_and_more_trajectories_than_g_are_refused(trajectories):
    steps = pd.DataFrame({"step": [-1, 0, 1], "rollout/n_questions": [None, 2, 3], "rollout/n_trajectories": [None, 8, 12]})
    assert run_group_size(steps) == G
    assert coverage(trajectories, steps) == {"rolled_out": 5, "with_a_search": 4}  # one question-step never searched
    with pytest.raises(ValueError, match="no single group size"):
        run_group_size(steps.assign(**{"rollout/n_trajectories": [None, 8, 8]}))
    with pytest.raises(ValueError, match="no rollout/n_trajectories"):
        run_group_size(steps.drop(columns="rollout/n_trajectories"))
    with pytest.raises(ValueError, match="more than G = 2"):
        hop_signal_table(trajectories, group_size=2)


def test_a_run_shorter_than_two_spans_has_only_its_all_part(trajectories):
    """With 2 steps and span 2, first and last would be the same steps: only ``all`` is shown."""
    for table in (hop_signal_table(trajectories, group_size=G), second_search_table(trajectories)):
        assert set(table["part"]) == {"all"}


def test_a_runs_hop_tables_come_from_its_calls_and_steps_up_to_the_step_asked():
    """``run_hop_tables`` (notebook 05's and the probe scripts' one way to build them): G from the run's own
    step records, the calls and steps cut at ``up_to_step``, and ``concat_hop_tables`` stacks runs in order."""
    calls = pd.DataFrame([row for step in (0, 1, 2) for row in _calls(
        {"m1/0": (1, 0.0), "m1/1": (2, 1.0 if step < 2 else 0.0), "s1/0": (1, 1.0), "s1/1": (3, 0.0)}, step)])
    steps = pd.DataFrame({"step": [-1, 0, 1, 2], "rollout/n_questions": [None, 2, 2, 3],
                          "rollout/n_trajectories": [None, 4, 4, 6]})  # G = 2; step 2 rolled out a question that never searched
    whole = run_hop_tables(calls, steps, DATA_SOURCE, method="probe")
    cut = run_hop_tables(calls, steps, DATA_SOURCE, method="probe", up_to_step=1)
    assert tuple(whole) == HOP_TABLES == tuple(cut)
    assert whole["coverage"].to_dict(orient="records") == [
        {"method": "probe", "group_size": 2, "rolled_out": 7, "with_a_search": 6}]
    assert cut["coverage"].loc[0, "rolled_out"] == 4 and cut["coverage"].loc[0, "with_a_search"] == 4
    expected = trajectory_table(calls[calls["step"] <= 1], DATA_SOURCE, method="probe")
    pd.testing.assert_frame_equal(cut["hop_signal"], hop_signal_table(expected, group_size=2))
    pd.testing.assert_frame_equal(cut["second_search"], second_search_table(expected))
    multi = cut["second_search"].set_index(["hop", "part"]).loc[("multi", "all")]
    assert multi["diff"] == pytest.approx(1.0)  # through step 1 the second search paid; step 2's reversal is cut
    assert whole["second_search"].set_index(["hop", "part"]).loc[("multi", "all"), "diff"] == pytest.approx(2 / 3)
    both = concat_hop_tables([whole, cut])
    assert tuple(both) == HOP_TABLES and len(both["coverage"]) == 2
    assert both["coverage"]["rolled_out"].tolist() == [7, 4]
    assert concat_hop_tables([]) == {}
    with pytest.raises(ValueError, match="no single group size"):
        run_hop_tables(calls, steps.assign(**{"rollout/n_trajectories": [None, 4, 4, 4]}), DATA_SOURCE, method="probe")
