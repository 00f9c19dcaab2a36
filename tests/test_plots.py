"""Every plotting function on degenerate records (no rows, one point, all zeros, NaN): a panel
without data says "no data: why" instead of drawing empty axes, steps get whole-number ticks,
zero bars stay visible, and no legend entry names something that is not drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cosearch_lib.eval.paper_reference import oracle_gap_beside_paper
from cosearch_lib.report import plot_table2
from cosearch_lib.viz.plots import (
    has_data,
    plot_ablations,
    plot_fig2,
    plot_oracle_gap,
    plot_recall_at_k,
    plot_topk,
    plot_training_curves,
    plot_turn_distribution,
    plot_validation_curves,
    plot_warmstart_losses,
)
from cosearch_lib.viz.ranker_dynamics import RANKER_DYNAMICS_PANELS, plot_ranker_dynamics
from cosearch_lib.viz.ranker_probes import plot_ranker_sft_probes


def no_data_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_text().startswith("no data: ")]


def visible_ticks(ax) -> list[float]:
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def legend_labels(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def drawn_labels(fig) -> set[str]:
    return {a.get_label() for ax in fig.axes for a in [*ax.lines, *ax.collections, *ax.patches]
            if not a.get_label().startswith("_")}


def test_an_empty_panel_says_why_and_keeps_no_ticks():
    fig = plot_training_curves(pd.DataFrame(columns=["step", "method", "rollout/agent_reward"]))
    assert not has_data(fig)
    for ax in fig.axes:
        assert no_data_texts(ax) == ["no data: no step records"]
        assert not list(ax.get_xticks()) and not list(ax.get_yticks()) and not ax.get_lines()
    assert legend_labels(fig) == []


def test_one_step_gets_whole_ticks_and_one_shared_range():
    steps = pd.DataFrame([{"step": 0, "method": "cosearch", "rollout/agent_reward": 0.5, "ranker/hit@K": np.nan,
                           "rollout/searches_per_traj": 1.0}])
    fig = plot_training_curves(steps)
    reward, hit5, searches = fig.axes
    assert no_data_texts(hit5) == ["no data: not logged in these step records"]  # all NaN: not an empty axis
    for ax in (reward, searches):
        assert ax.get_xlim() == (0.5, 1.5)
        assert visible_ticks(ax) == [1.0]
    assert legend_labels(fig) == ["cosearch"]


def test_fig2_without_validation_or_step_metrics_says_so_and_shares_whole_steps():
    steps = pd.DataFrame([{"step": s, "method": m, "ranker/hit@K": np.nan, "rollout/searches_per_traj": 1.0 + s}
                          for m in ("search_r1", "cosearch") for s in (0, 1)])
    fig = plot_fig2(pd.DataFrame(columns=["method", "x", "estimate", "ci_low", "ci_high"]), steps)
    val, hit5, searches = fig.axes
    assert no_data_texts(val) == ["no data: no validation records\n(training.eval_every 0)"]
    assert no_data_texts(hit5) == ["no data: not logged in these step records"]
    assert visible_ticks(searches) == [1.0, 2.0] and searches.get_xlim() == (0.5, 2.5)
    assert sorted(legend_labels(fig)) == ["cosearch", "search_r1"]


def test_ranker_dynamics_without_rewarded_calls_draw_no_empty_panels_and_no_legend():
    cols = [c for pre_post in RANKER_DYNAMICS_PANELS for c in pre_post[:2]]
    nan = pd.DataFrame([{"method": "cosearch", "step": s, **dict.fromkeys(cols, np.nan)} for s in range(4)])
    fig = plot_ranker_dynamics(nan)
    assert not has_data(fig) and legend_labels(fig) == []
    assert all(no_data_texts(ax) == ["no data: no ranker calls were rewarded"] for ax in fig.axes)
    assert all(not list(ax.get_xticks()) for ax in fig.axes)  # no "-0.045-0.030..." run together
    pre_only = nan.assign(**{"ranker/main_pre": [0.1, 0.2, 0.3, 0.4]})
    fig = plot_ranker_dynamics(pre_only)
    assert legend_labels(fig) == ["pre-filter"]  # the post-filter line is not drawn, so not named
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["pre-filter"]
    assert visible_ticks(fig.axes[0]) == [1.0, 2.0, 3.0, 4.0]
    note = [t for t in fig.texts if t.get_text().startswith("no post-filter point: no semantic group survived")]
    assert len(note) == 1
    fig.canvas.draw()  # the note and the legend do not overlap
    assert not note[0].get_window_extent().overlaps(fig.legends[0].get_window_extent())
    assert all(not note[0].get_window_extent().overlaps(ax.get_window_extent()) for ax in fig.axes)
    both = pre_only.assign(**{"ranker/main_post": [np.nan, 0.2, np.nan, np.nan]})  # one step kept a group
    fig = plot_ranker_dynamics(both)
    assert legend_labels(fig) == ["post-filter", "pre-filter"]
    assert not any(t.get_text().startswith("no post-filter point") for t in fig.texts)


def test_validation_curves_and_warm_start_losses_with_nothing_or_one_point():
    fig = plot_validation_curves({})
    assert no_data_texts(fig.axes[0]) == ["no data: no validation records"]
    curve = pd.DataFrame([{"method": "cosearch", "x": 0, "estimate": 0.2, "ci_low": np.nan, "ci_high": np.nan}])
    fig = plot_validation_curves({"val F1": curve, "empty": curve.iloc[:0]})
    assert visible_ticks(fig.axes[0]) == [0.0] and no_data_texts(fig.axes[1]) == ["no data: no validation records"]
    assert "no interval could be computed" in fig._suptitle.get_text()  # the title does not promise intervals
    with_ci = curve.assign(ci_low=[0.1], ci_high=[0.3])
    assert "95% bootstrap intervals" in plot_validation_curves({"val F1": with_ci})._suptitle.get_text()
    fig = plot_warmstart_losses(pd.DataFrame(columns=["role", "step", "loss"]))
    assert not has_data(fig) and no_data_texts(fig.axes[0])
    fig = plot_warmstart_losses(pd.DataFrame([{"role": "agent", "step": 1, "loss": 1.0}]))
    assert visible_ticks(fig.axes[0]) == [1.0]  # not 0.96-1.04
    assert legend_labels(fig) == ["agent"]


def test_zero_bars_are_drawn_visibly_and_no_interval_caption_without_intervals():
    ours = pd.DataFrame({"single-hop avg": [0.0, 0.0, np.nan], "multi-hop avg": [0.0, 0.0, np.nan],
                         "avg": [0.0, 0.0, np.nan]}, index=["standard", "oracle", "relative gain %"])
    beside = oracle_gap_beside_paper(ours, "ours")
    ci = pd.DataFrame({c: [np.nan] * 3 for c in ("standard_ci_low", "standard_ci_high", "oracle_ci_low",
                                                  "oracle_ci_high", "ci_low", "ci_high")},
                      index=["single-hop avg", "multi-hop avg", "avg"]).assign(diff=0.0)
    fig = plot_oracle_gap(beside, intervals={"ours": ci})
    bars = list(fig.axes[0].patches)
    assert len(bars) == 6 and all(p.get_height() == 0 for p in bars)
    assert zero_marks(fig.axes[0]) == 6  # an outline alone would lie on the x axis: each 0 gets a stroke and a "0"
    captions = [t.get_text() for t in fig.texts]
    assert not any("error bars:" in c for c in captions)
    assert any("no interval" in c for c in captions)
    table = pd.DataFrame({"avg": [0.0, 0.0], "paper 3B avg": [0.3, 0.4], "paper 7B avg": [0.35, 0.45]},
                         index=["search_r1", "cosearch"])
    fig = plot_table2(table)
    ours = fig.axes[0].containers[0]  # our bars (then the paper's 3B and 7B)
    assert len(ours) == 2 and all(p.get_height() == 0 for p in ours)
    assert zero_marks(fig.axes[0]) == 2  # ours only: the paper's bars are not 0
    table.loc["cosearch", "avg"] = np.nan  # a method without records: not drawn, not marked as 0
    assert zero_marks(plot_table2(table).axes[0]) == 1


def zero_marks(ax) -> int:
    """Zero bars marked by mark_zero_bars: "0" labels, each over a baseline stroke of the same count."""
    labels = [t for t in ax.texts if t.get_text() == "0"]
    strokes = [ln for ln in ax.get_lines() if list(ln.get_ydata()) == [0, 0] and ln.get_linewidth() >= 4]
    assert len(labels) == len(strokes)
    return len(labels)


@pytest.mark.parametrize("plot, empty, why", [
    (plot_ablations, pd.DataFrame(columns=["cell", "diff", "ci_low", "ci_high"]), "no finished ablation cell"),
    (plot_topk, pd.DataFrame(columns=["K", "method", "avg", "ci_low", "ci_high", "paper avg"]), "no finished K cell"),
    (plot_recall_at_k, pd.DataFrame(columns=["k", "recall", "group", "data_source"]), "no recall records"),
    (plot_turn_distribution, pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=["source", "method"])),
     "no evaluated agent method"),
])
def test_report_figures_without_records_say_so(plot, empty, why):
    fig = plot(empty)
    assert not has_data(fig)
    assert any(t.startswith(f"no data: {why}") for ax in fig.axes for t in no_data_texts(ax))
    assert legend_labels(fig) == [] or set(legend_labels(fig)) <= drawn_labels(fig)


def test_turn_distribution_legend_names_only_the_search_counts_that_have_a_bar():
    """0 searches is 0% in every row, 5 searches only in the paper's, "no answer" only in ours: the
    legend names 1, 2, 5 and "no answer", each with a bar of non-zero width somewhere."""
    index = pd.MultiIndex.from_tuples([("ours", "agent_retrieval"), ("paper", "agent_retrieval")], names=["source", "method"])
    beside = pd.DataFrame({0: [0.0, 0.0], 1: [70.0, 40.0], 2: [20.0, 50.0], 5: [0.0, 10.0],
                           "no answer": [10.0, float("nan")], "mean": [1.1, 1.9]}, index=index)
    fig = plot_turn_distribution(beside)
    assert legend_labels(fig) == ["1", "2", "5", "no answer"]
    wide = {bars.get_label() for ax in fig.axes for bars in ax.containers if any(p.get_width() > 0 for p in bars)}
    assert set(legend_labels(fig)) <= wide


def test_ranker_sft_probes_without_records_say_so_and_one_probe_gets_whole_steps():
    fig = plot_ranker_sft_probes(pd.DataFrame(columns=["probe", "step", "loss"]),
                                 pd.DataFrame(columns=["probe", "diff", "ci_low", "ci_high"]))
    assert not has_data(fig) and legend_labels(fig) == []
    assert [no_data_texts(ax) for ax in fig.axes] == [["no data: no SFT losses recorded"],
                                                      ["no data: no probe scored on held-out sub-queries"]]
    losses = pd.DataFrame({"probe": ["n5"], "step": [1], "loss": [0.05]})  # one logged step
    hits = pd.DataFrame({"probe": ["n5"], "diff": [0.0], "ci_low": [0.0], "ci_high": [0.0]})  # an all-zero interval
    fig = plot_ranker_sft_probes(losses, hits)
    left, right = fig.axes
    assert visible_ticks(left) == [1.0] and legend_labels(fig) == ["n5"] and "n5" in drawn_labels(fig)
    assert right.has_data() and right.get_xlim()[0] < 0 < right.get_xlim()[1]  # a zero difference is on the axes


def test_ablations_topk_and_recall_with_one_point_at_zero_and_no_interval():
    """One finished cell whose difference is 0 and whose interval could not be computed (NaN): the
    dot is on the axes at 0; one K: that K is the only tick; one k per family: drawn, not "no data"."""
    fig = plot_ablations(pd.DataFrame({"cell": ["no-r-main"], "diff": [0.0], "ci_low": [np.nan], "ci_high": [np.nan]}))
    ax = fig.axes[0]
    assert has_data(fig) and not no_data_texts(ax)
    lo, hi = ax.get_xlim()
    assert lo < 0 < hi and lo == -hi  # centred on the zero difference
    assert legend_labels(fig) == ["ours (no interval could be computed)"]  # not named an interval it does not draw
    fig = plot_topk(pd.DataFrame({"K": [3], "method": ["cosearch"], "avg": [0.0], "ci_low": [np.nan],
                                  "ci_high": [np.nan], "paper avg": [np.nan]}))
    ax = fig.axes[0]
    assert visible_ticks(ax) == [3.0] and ax.get_ylim()[0] < 0  # a 0 F1 sits above the bottom edge
    assert legend_labels(fig) == ["cosearch"]
    curve = pd.DataFrame({"k": [1, 1], "recall": [0.0, np.nan], "group": ["single", "multi"],
                          "data_source": ["syn_nq", "syn_hotpotqa"]})
    fig = plot_recall_at_k(curve, topk=3, topn=10)
    assert has_data(fig) and not no_data_texts(fig.axes[0])
    assert legend_labels(fig) == ["syn_nq (single)"]  # the all-NaN family has no line, so no legend entry


def test_grpo_signal_draws_mean_and_best_of_g_and_a_rolling_mean_once_a_run_is_long():
    from cosearch_lib.viz.grpo_signal import plot_grpo_signal

    rng = np.random.default_rng(0)
    long = pd.DataFrame([{"method": "search_r1", "step": s, "rollout/agent_f1": rng.random() / 2, "rollout/agent_best_of_g_f1": 0.5 + rng.random() / 2,
                          "rollout/agent_groups_without_signal": rng.random(), "rollout/agent_entropy": 0.1 * rng.random()} for s in range(25)])
    short = pd.DataFrame([{"method": "cosearch", "step": s, "rollout/agent_f1": 0.1, "rollout/agent_best_of_g_f1": 0.3} for s in range(3)])
    fig = plot_grpo_signal(pd.concat([pd.DataFrame([{"method": "search_r1", "step": -1, "val/f1": 0.1}]), long, short]))
    f1_ax, share_ax, entropy_ax = fig.axes
    labels = [line.get_label() for line in f1_ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["search_r1: mean of G (10-step mean)", "search_r1: best of G (10-step mean)",
                      "cosearch: mean of G", "cosearch: best of G"]
    rolled = next(line for line in f1_ax.get_lines() if line.get_label() == "search_r1: best of G (10-step mean)")
    y = np.asarray(rolled.get_ydata(), dtype=float)
    assert np.isnan(y[:9]).all() and y[9] == pytest.approx(long["rollout/agent_best_of_g_f1"][:10].mean())
    assert list(np.asarray(rolled.get_xdata())[:2]) == [1, 2]  # steps completed; the step -1 row is left out
    assert [line.get_label() for line in share_ax.get_lines() if not line.get_label().startswith("_")] == \
        ["search_r1 (10-step mean)"]  # cosearch logged no share: nothing drawn for it
    assert entropy_ax.get_ylim()[1] < 0.2  # the entropy keeps its own scale
