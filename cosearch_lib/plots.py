"""One function per figure. Each reads tidy records (DataFrames loaded from run folders), never
live state, so every figure can be regenerated from disk."""

from __future__ import annotations


import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .groups import order_key


def plot_recall_at_k(curve: pd.DataFrame, *, topk: int | None = None, topn: int | None = None, title: str = ""):
    """Answer recall@k against k per family (single-hop solid, multi-hop dashed), with K and N marked."""
    fams = curve[curve["group"].isin(["single", "multi", "other"])]
    order = sorted(fams["data_source"].unique(), key=order_key)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    palette = dict(zip(order, sns.color_palette("tab10", len(order))))
    for source in order:
        part = fams[fams["data_source"] == source]
        style = "--" if part["group"].iloc[0] == "multi" else "-"
        ax.plot(part["k"], part["recall"], style, color=palette[source], label=f"{source} ({part['group'].iloc[0]})", lw=1.8)
    for value, name in ((topk, "K"), (topn, "N")):
        if value:
            ax.axvline(value, color="grey", lw=0.8, ls=":")
            ax.text(value, 1.0, f" {name}={value}", color="grey", va="top")
    ax.set(xscale="log", xlabel="k (log scale)", ylabel="answer recall@k", ylim=(0, 1.02), title=title or "Dense retriever: answer recall@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside: curves stay visible
    fig.tight_layout()
    return fig
