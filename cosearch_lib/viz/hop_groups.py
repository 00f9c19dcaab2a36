"""The figure of what GRPO had to work with per hop group (``records.hop_signal``): whether a second
search paid within a question's G rollouts, and how often the agent searched more than once."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from cosearch_lib.viz.plots import method_palette, no_data

#: The parts of a run the figure shows, in this order (``records.hop_signal``'s first and last steps, all).
PARTS = ("first", "last", "all")
HOP_MARKERS = {"single": "o", "multi": "s", "other": "^"}


def plot_hop_signal(second_search: pd.DataFrame, hop_signal: pd.DataFrame, *, title: str = ""):
    """(a) Per method, hop group and part: the mean agent reward of a question's trajectories that searched
    more than once minus those that searched once, paired over the questions that had both, with its 95%
    interval (a point left of 0 hints that GRPO's advantage favours stopping at one search). (b) Searches per
    trajectory per hop group over the first and the last steps, per method (over every step when the run is
    too short to tell them apart)."""
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    methods = list(dict.fromkeys([*second_search.get("method", []), *hop_signal.get("method", [])]))
    palette = method_palette(methods)
    ax_a.set(title="(a) a second search pays? (more - once, within questions)", xlabel="agent reward, more - once")
    ax_a.axvline(0, color="#555555", lw=1)
    ax_a.grid(alpha=0.3, axis="x")
    ax_a.grid(False, axis="y")  # a grid line through each row would read as an interval
    rows = second_search.dropna(subset=["diff"]) if len(second_search) else second_search
    if not len(rows):
        no_data(ax_a, "no question whose rollouts searched both once and more")
    else:
        order = rows.assign(p=rows["part"].map(PARTS.index)).sort_values(["method", "hop", "p"], kind="stable")
        labels = []
        for y, r in enumerate(order.itertuples()):
            low, high = r.ci_low, r.ci_high
            if pd.notna(low):
                ax_a.plot([low, high], [y, y], color=palette[r.method], lw=1.6)
            ax_a.plot(r.diff, y, marker=HOP_MARKERS.get(r.hop, "o"), color=palette[r.method], ms=6)
            labels.append(f"{r.method} · {r.hop} · {r.part} ({r.steps}, n={r.questions})")
        ax_a.set_yticks(range(len(labels)), labels, fontsize=7)
        ax_a.invert_yaxis()
    ax_b.set(title="(b) searches per trajectory", ylabel="searches per trajectory")
    ax_b.grid(alpha=0.3, axis="y")
    shown = ("first", "last") if len(hop_signal) and hop_signal["part"].isin(("first", "last")).any() else ("all",)
    parts = hop_signal[hop_signal["part"].isin(shown)] if len(hop_signal) else hop_signal
    if not len(parts):
        no_data(ax_b, "no ranker calls")
    else:
        groups = list(dict.fromkeys(zip(parts["method"], parts["hop"])))
        width = 0.76 / len(shown)
        for i, (method, hop) in enumerate(groups):
            mine = parts[(parts["method"] == method) & (parts["hop"] == hop)].set_index("part")
            for j, part in enumerate(shown):
                if part in mine.index:
                    ax_b.bar(i + (j - (len(shown) - 1) / 2) * width, mine.loc[part, "searches_per_traj"], width=width,
                             color=palette[method], alpha=0.45 if part == "first" else 0.95, edgecolor="#555555",
                             label=f"{part} steps" if i == 0 else None)
        ax_b.set_xticks(range(len(groups)), [f"{m}\n{h}-hop" for m, h in groups], fontsize=8)
        ax_b.legend(fontsize=8, frameon=False)
    fig.suptitle(title or "What GRPO had to work with per hop group (training rollouts)")
    fig.tight_layout()
    return fig
