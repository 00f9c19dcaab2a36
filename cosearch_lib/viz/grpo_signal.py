"""The figure of what GRPO has to work with during training: per step, the answer F1 of the G samples
(mean and best), the questions without reward variance and the agent's entropy (issue 48)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from cosearch_lib.viz.plots import has_numbers, method_palette, no_data, whole_steps

#: Steps a rolling mean spans in :func:`plot_grpo_signal` (a step holds a few questions: one step's
#: value is noisy), drawn once a method has at least twice as many steps.
SIGNAL_WINDOW = 10


def plot_grpo_signal(steps: pd.DataFrame, *, window: int = SIGNAL_WINDOW, title: str = ""):
    """What GRPO has to work with, per training step and method (the step records): (a) the answer F1
    of the step's G samples per question, their mean (``agent_f1``, solid) and the best of them
    (``agent_best_of_g_f1``, dashed); (b) the share of questions whose G rewards are all equal (no
    gradient from them); (c) the agent's sampled-token entropy. Each step is a faint point; once a
    method has ``2 * window`` steps, a rolling mean over ``window`` steps is the line."""
    methods = list(dict.fromkeys(steps["method"])) if "method" in steps else []
    palette = method_palette(methods)
    panels = ((("rollout/agent_f1", "-", "mean of G"), ("rollout/agent_best_of_g_f1", "--", "best of G")),
              (("rollout/agent_groups_without_signal", "-", None),), (("rollout/agent_entropy", "-", None),))
    titles = ("(a) answer F1 of the G samples", "(b) questions without reward variance", "(c) agent entropy per token")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.6), squeeze=False)
    trained = steps[steps["step"] >= 0] if "step" in steps else steps
    xs = []
    for ax, lines, label in zip(axes[0], panels, titles):
        ax.set(xlabel="training steps completed", title=label)
        ax.grid(alpha=0.3)
        if not any(c in trained and has_numbers(trained[c]) for c, _, _ in lines):
            no_data(ax, "no step records" if trained.empty else "not logged in these step records")
            continue
        for method in methods:
            for column, style, what in lines:
                part = trained[(trained["method"] == method) & trained[column].notna()] if column in trained else trained.iloc[:0]
                if part.empty:
                    continue
                x = part["step"] + 1
                xs += list(x)
                name = f"{method}: {what}" if what else method
                if len(part) >= 2 * window:
                    ax.plot(x, part[column], ls="none", marker="o", ms=2, alpha=0.25, color=palette[method])
                    ax.plot(x, part[column].rolling(window, min_periods=window).mean(), ls=style, lw=1.8,
                            color=palette[method], label=f"{name} ({window}-step mean)")
                else:
                    ax.plot(x, part[column], ls=style, marker="o", ms=3, lw=1.4, color=palette[method], label=name)
        if label != titles[-1]:
            ax.set_ylim(-0.02, 1.02)  # an F1 and a share
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, frameon=False)
    whole_steps(axes[0], xs)
    fig.suptitle(title or "What GRPO has to work with (training questions, x = steps completed)")
    fig.tight_layout()
    return fig
