"""The figure of the ranker's listwise-SFT probes (``benchmarks/ranker_sft.py``, issue 23)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from cosearch_lib.viz.plots import no_data, whole_steps


def _numbers(values: pd.Series) -> bool:
    return bool(pd.to_numeric(values, errors="coerce").notna().any())


def plot_ranker_sft_probes(losses: pd.DataFrame, hits: pd.DataFrame, *, title: str = ""):
    """The ranker's listwise-SFT probes (``benchmarks/ranker_sft.py``): SFT loss per optimizer step,
    one line per probe (``losses``: probe, step, loss), and held-out Hit@1 of each probe's ranker
    minus the retriever's order with its paired 95% interval (``hits``: probe, diff, ci_low, ci_high)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.4, 1]})
    left.set(xlabel="optimizer step", ylabel="cross-entropy per reply token", title="SFT loss")
    right.set(xlabel="Hit@1: SFT ranker - retriever's order", title="Held-out sub-queries")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    probes = list(dict.fromkeys([*losses.get("probe", []), *hits.get("probe", [])]))
    colors = dict(zip(probes, sns.color_palette("tab10", max(len(probes), 1))))
    if losses.empty or not _numbers(losses["loss"]):
        no_data(left, "no SFT losses recorded")
    else:
        for probe, part in losses.groupby("probe", sort=False):
            left.plot(part["step"], part["loss"], lw=1.2, color=colors[probe], label=probe)
        left.set_yscale("log")
        whole_steps([left], losses["step"])
        left.legend(frameon=False, fontsize=8)
    if hits.empty or not _numbers(hits["diff"]):
        no_data(right, "no probe scored on held-out sub-queries")
    else:
        ys = np.arange(len(hits))
        for y, row in zip(ys, hits.itertuples()):
            right.errorbar(row.diff, y, xerr=[[row.diff - row.ci_low], [row.ci_high - row.diff]], fmt="o",
                           color=colors[row.probe], capsize=4)
        right.axvline(0, color="black", lw=0.8)
        right.set_yticks(ys, hits["probe"])
        right.set_ylim(len(hits) - 0.5, -0.5)
        span = max(0.05, float(np.nanmax(np.abs(hits[["ci_low", "ci_high"]].to_numpy()))) * 1.3)
        right.set_xlim(-span, span)
    fig.suptitle(title or "Listwise SFT of the 135M ranker: loss, and Hit@1 against the retriever's order")
    fig.tight_layout()
    return fig


def plot_ranker_recipes(curves: pd.DataFrame, retriever_hit1: float, *, n_items: int = 0, title: str = ""):
    """The scoring rankers' learning curves (``benchmarks/ranker_recipes.py``, issue 35): held-out
    Hit@1 of each recipe's first pick against training lists (left) and against CPU minutes of
    training (right), with the retriever's own order as a dashed line (``curves``: recipe,
    examples, hit@1, train_s)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    left.set(xlabel="training lists (gold hops)", ylabel="held-out Hit@1", title="Per list trained")
    right.set(xlabel="CPU minutes of training (held-out scoring excluded)", title="Per minute of training")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    if curves.empty or not _numbers(curves["hit@1"]):
        for ax in (left, right):
            no_data(ax, "no recipe recorded")
    else:
        recipes = list(dict.fromkeys(curves["recipe"]))
        colors = dict(zip(recipes, sns.color_palette("tab10", len(recipes))))
        for recipe, part in curves.groupby("recipe", sort=False):
            left.plot(part["examples"], part["hit@1"], "o-", ms=3, lw=1.4, color=colors[recipe], label=recipe)
            right.plot(part["train_s"] / 60, part["hit@1"], "o-", ms=3, lw=1.4, color=colors[recipe])
        for ax in (left, right):
            if pd.notna(retriever_hit1):
                ax.axhline(retriever_hit1, color="black", ls="--", lw=1)
        if pd.notna(retriever_hit1):
            left.plot([], [], color="black", ls="--", lw=1, label="retriever's order")
        left.legend(frameon=False, fontsize=8, loc="best")
        left.set_ylim(0, 1)
    items = f" ({n_items} held-out sub-queries)" if n_items else ""
    fig.suptitle(title or f"Which recipe makes the 135M ranker read? Hit@1 of its first pick{items}")
    fig.tight_layout()
    return fig
