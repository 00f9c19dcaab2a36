"""The Fig. 3 analogue: a trained ranker's rewards and semantic groups per step, over all its search calls
(pre-filter) and over the calls in the groups that survived the filters (post-filter). Drawn from the step
records alone, as every figure of :mod:`cosearch_lib.viz.plots`, whose panel helpers it uses."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from cosearch_lib.viz.plots import has_numbers, no_data, whole_steps

#: Fig. 3 panels: (pre-filter column, post-filter column, title).
RANKER_DYNAMICS_PANELS = (
    ("ranker/main_pre", "ranker/main_post", "(a) agent term r_main"),
    ("ranker/r_rel_pre", "ranker/r_rel_post", "(b) relevance reward r_rel"),
    ("ranker/reward_pre", "ranker/reward_post", "(c) composite reward"),
    ("ranker/grouping_mean_group_size_pre", "ranker/grouping_mean_group_size_post", "(d) mean group size"),
)


def plot_ranker_dynamics(steps: pd.DataFrame, *, title: str = ""):
    """The Fig. 3 analogue for one method's steps: each panel shows a ranker quantity over all
    search calls (pre-filter, dashed) and over the calls in the surviving semantic groups
    (post-filter, solid). Steps without any surviving group have no post-filter point."""
    fig, axes = plt.subplots(1, len(RANKER_DYNAMICS_PANELS), figsize=(3.6 * len(RANKER_DYNAMICS_PANELS), 3.4),
                             squeeze=False)
    x = steps["step"] + 1 if "step" in steps else pd.Series(dtype=float)
    for ax, (pre, post, label) in zip(axes[0], RANKER_DYNAMICS_PANELS):
        ax.set(xlabel="training steps completed", title=label)
        ax.grid(alpha=0.3)
        # pre-filter dashed with hollow markers, over post-filter: where every group survives the two
        # coincide, and both stay visible
        series = [(col, style) for col, style in ((post, ("-", "s", "#fc8d62", "post-filter", 4, None, 2)),
                                                   (pre, ("--", "o", "#5b6fb0", "pre-filter", 7, "none", 3)))
                  if col in steps and has_numbers(steps[col])]
        if not series:
            no_data(ax, "no step records" if steps.empty else "no ranker calls were rewarded")
            continue
        for col, (ls, marker, color, name, size, face, z) in series:
            ax.plot(x, steps[col], ls=ls, marker=marker, ms=size, color=color, mfc=face, label=name, zorder=z)
    whole_steps(axes[0], x)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    no_post = "pre-filter" in handles and "post-filter" not in handles
    if no_post:  # say why the solid line is missing, under the legend
        fig.text(0.5, 0.005, "no post-filter point: no semantic group survived the k_min and zero-variance filters "
                 "at any step, so the ranker got no gradient", ha="center", va="bottom", fontsize=8, color="0.35")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", bbox_to_anchor=(0.5, 0.06 if no_post else 0),
                   ncol=len(handles), frameon=False, fontsize=8)
    bottom = 0.14 if no_post else 0.07 if handles else 0
    method = steps["method"].iloc[0] if len(steps) else ""
    fig.suptitle(title or f"Ranker dynamics ({method}): pre- and post-filter")
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig
