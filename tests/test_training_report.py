"""Reading training runs back (records.training_runs) and the Fig. 2 / Fig. 3 / warm-start plots."""

import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from cosearch_lib.experiment import trained_eval_settings
from cosearch_lib.records.training_runs import (
    checkpoint_adapters,
    read_ranker_calls,
    read_steps,
    warmstart_losses,
    warmstart_table,
)
from cosearch_lib.viz.plots import TRAINING_PANELS, plot_training_curves, plot_warmstart_losses
from cosearch_lib.viz.ranker_dynamics import plot_ranker_dynamics


def steps_frame(method, n=3, offset=0.0):
    return pd.DataFrame({
        "step": range(n), "method": method, "rollout/agent_reward": [0.1 * i + offset for i in range(n)],
        "ranker/hit@K": [0.5, 0.6, 0.7][:n], "rollout/searches_per_traj": [1.0, 1.5, 2.0][:n], "val/f1": [np.nan] * (n - 1) + [0.3],
        "ranker/main_pre": [0.2] * n, "ranker/main_post": [0.25, np.nan, 0.3][:n], "ranker/r_rel_pre": [0.4] * n,
        "ranker/r_rel_post": [0.5] * n, "ranker/reward_pre": [0.3] * n, "ranker/reward_post": [0.35] * n,
        "ranker/grouping_mean_group_size_pre": [2.0] * n, "ranker/grouping_mean_group_size_post": [4.0, np.nan, 5.0][:n]})


def test_read_steps_concatenates_methods_in_method_order_and_names_what_is_missing(tmp_path):
    for method, off in (("cosearch", 0.0), ("search_r1", 1.0)):
        (tmp_path / method).mkdir()
        steps_frame(method, offset=off).to_csv(tmp_path / method / "steps.csv", index=False)
    steps = read_steps(tmp_path)
    assert list(dict.fromkeys(steps["method"])) == ["search_r1", "cosearch"]  # METHODS order
    assert steps.loc[steps["method"] == "search_r1", "rollout/agent_reward"].tolist() == pytest.approx([1.0, 1.1, 1.2])
    with pytest.raises(FileNotFoundError, match="oracle"):
        read_steps(tmp_path, ["oracle"])
    with pytest.raises(FileNotFoundError, match="any method"):
        read_steps(tmp_path / "nothing")
    assert read_ranker_calls(tmp_path, "cosearch").empty


def test_checkpoint_adapters_takes_the_newest_complete_checkpoint(tmp_path):
    for step, complete in ((1, True), (2, True), (3, False)):
        ckpt = tmp_path / "cosearch" / "checkpoints" / f"step_{step:06d}"
        for name in ("agent", "ranker"):
            (ckpt / "adapters" / name).mkdir(parents=True)
            (ckpt / "adapters" / name / "adapter_config.json").write_text("{}")
        if complete:
            (ckpt / "state.pt").write_bytes(b"x")
    with pytest.warns(RuntimeWarning, match="step_000003 skipped: no state.pt"):  # said, not silently passed over
        found = checkpoint_adapters(tmp_path, "cosearch")
    assert set(found) == {"agent", "ranker"} and all("step_000002" in str(p) for p in found.values())
    with pytest.raises(FileNotFoundError, match="oracle"):
        checkpoint_adapters(tmp_path, "oracle")


def test_trained_eval_settings_map_each_method_to_its_harness_method_and_adapters():
    warm = {"agent": "w/agent", "ranker": "w/ranker"}
    got = trained_eval_settings("cosearch", {"agent": "c/agent", "ranker": "c/ranker"}, warm)
    assert got == {"methods": ("agent_trained_ranker",), "agent_adapter": "c/agent", "trained_ranker_adapter": "c/ranker"}
    got = trained_eval_settings("fixed_ranker", {"agent": "f/agent"}, warm)
    assert got["fixed_ranker_adapter"] == "w/ranker" and got["methods"] == ("agent_fixed_ranker",)
    shared = trained_eval_settings("cosearch", {"shared": "s"}, warm)
    assert shared["agent_adapter"] == shared["trained_ranker_adapter"] == "s"
    assert trained_eval_settings("oracle", {"agent": "o"}, warm) == {"methods": ("agent_oracle",), "agent_adapter": "o"}
    with pytest.raises(ValueError, match="training.method must be one of"):
        trained_eval_settings("ppo", {"agent": "x"}, warm)
    with pytest.raises(ValueError, match="no agent adapter"):
        trained_eval_settings("search_r1", {"ranker": "x"}, warm)


def test_warmstart_tables_read_the_saved_summaries(tmp_path):
    for role, losses in (("agent", [2.0, 1.5, 1.2]), ("ranker", [1.0, 0.8])):
        (tmp_path / role).mkdir()
        summary = {"n_sequences": 8, "tokens": 800, "trained_tokens": 100, "steps": 2 * len(losses), "train_loss": 1.0,
                   "wall_s": 3.5, "losses": [{"step": 2 * (i + 1), "loss": v} for i, v in enumerate(losses)]}
        if role == "agent":  # the ranker's summary predates warmstart.autocast: no bf16 field
            summary["bf16"] = True
        (tmp_path / role / "warmstart.json").write_text(json.dumps(summary))
    folders = {"agent": tmp_path / "agent", "ranker": tmp_path / "ranker"}
    table = warmstart_table(folders)
    assert table.loc["agent", "first_loss"] == 2.0 and table.loc["agent", "last_loss"] == 1.2
    assert table.loc["ranker", "steps"] == 4
    assert table.loc["agent", "bf16"] is True and pd.isna(table.loc["ranker", "bf16"])
    losses = warmstart_losses(folders)
    assert losses.groupby("role")["step"].apply(list).to_dict() == {"agent": [2, 4, 6], "ranker": [2, 4]}
    fig = plot_warmstart_losses(losses)
    drawn = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert drawn == {"agent": [2.0, 1.5, 1.2], "ranker": [1.0, 0.8]}


def test_training_curves_draw_one_line_per_method_and_val_f1_only_where_logged():
    steps = pd.concat([steps_frame("search_r1", offset=1.0), steps_frame("cosearch")], ignore_index=True)
    fig = plot_training_curves(steps)
    assert [ax.get_title() for ax in fig.axes] == [label for _, label in TRAINING_PANELS]  # validation: its own figure
    reward_ax = fig.axes[0]
    lines = {line.get_label(): line for line in reward_ax.get_lines()}
    assert list(lines["cosearch"].get_xdata()) == [1, 2, 3]
    assert list(lines["search_r1"].get_ydata()) == pytest.approx([1.0, 1.1, 1.2])
    assert all(tick == int(tick) for tick in reward_ax.get_xticks())  # steps are whole numbers
    with_val = plot_training_curves(steps, panels=(*TRAINING_PANELS, ("val/f1", "validation avg F1")))
    assert [list(line.get_xdata()) for line in with_val.axes[3].get_lines()] == [[3], [3]]
    no_val = plot_training_curves(steps.drop(columns="val/f1"), panels=(("val/f1", "validation avg F1"),))
    assert no_val.axes[0].texts[0].get_text() == "no data: not logged in these step records"
    assert not no_val.axes[0].get_lines() and not list(no_val.axes[0].get_xticks())


def test_ranker_dynamics_draw_pre_and_post_filter_values():
    fig = plot_ranker_dynamics(steps_frame("cosearch"))
    size_ax = fig.axes[3]
    lines = {line.get_label(): line for line in size_ax.get_lines()}
    assert sorted(lines) == ["post-filter", "pre-filter"]
    pre, post = lines["pre-filter"], lines["post-filter"]
    assert pre.get_linestyle() == "--"  # drawn dashed over the solid post-filter line
    assert list(pre.get_ydata()) == [2.0, 2.0, 2.0]
    np.testing.assert_array_equal(post.get_ydata(), [4.0, np.nan, 5.0])
    assert "(d) mean group size" == size_ax.get_title()


def test_without_a_warm_start_the_before_policies_are_the_base_models():
    assert warmstart_table({}).empty
    assert trained_eval_settings("cosearch", {}, {}) == {"methods": ("agent_fixed_ranker",), "agent_adapter": None,
                                                         "trained_ranker_adapter": None}
    assert trained_eval_settings("fixed_ranker", {"agent": "a"}, {})["fixed_ranker_adapter"] is None


def test_a_disabled_warm_start_trains_nothing_and_yields_base_policies():
    from cosearch_lib.config import load_profile
    from cosearch_lib.experiment import policy_adapters, warm_start

    cfg = load_profile("ci")
    cfg.warmstart.enabled = False
    assert warm_start(cfg, retriever=None) == {}  # returns before touching the retriever or a model
    with pytest.raises(ValueError, match="relevance training of 'ci' must run"):  # the Fixed Ranker still trains
        policy_adapters(cfg, None, "warmstart")
    cfg.relevance.enabled = False
    assert policy_adapters(cfg, None, "warmstart") == {"agent_adapter": None, "fixed_ranker_adapter": None}


def test_with_a_scoring_ranker_kind_the_warm_start_trains_the_agent_only(tmp_path, monkeypatch):
    """Under ``training.ranker_kind: llm_judge`` no method reads a generative ranker adapter, so the
    warm start neither trains one nor needs a retriever once the agent's adapter is cached."""
    from cosearch_lib.config import load_profile
    from cosearch_lib.experiment import warm_roles, warm_start, warmstart_dir

    monkeypatch.setenv("COSEARCH_CACHE", str(tmp_path))
    judged, generative = load_profile("laptop"), load_profile("ci")
    assert warm_roles(judged) == ("agent",) and warm_roles(generative) == ("agent", "ranker")
    for cfg in (judged, generative):
        (warmstart_dir(cfg) / "agent").mkdir(parents=True)
        (warmstart_dir(cfg) / "agent" / "adapter_config.json").write_text("{}")
    assert warm_start(judged, retriever=None) == {"agent": warmstart_dir(judged) / "agent"}
    with pytest.raises(ValueError, match=r"must train \['ranker'\] and needs a retriever"):
        warm_start(generative, retriever=None)
