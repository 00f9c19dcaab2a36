"""One function per figure. Each reads tidy records (DataFrames loaded from run folders), never
live state, so every figure can be regenerated from disk.

Every function draws degenerate records legibly: a panel without data says "no data: <why>" in
place of empty axes (:func:`no_data`), training steps get whole-number ticks and one x range
across panels (:func:`whole_steps`), a series that is all NaN is not drawn (so no legend entry
names a line that is not there), and a bar of height 0 is marked (:func:`mark_zero_bars`).
:func:`has_data` says whether a figure drew anything (notebook 05's index of figures)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from cosearch_lib.eval.benchmark_families import order_key


def no_data(ax, why: str) -> None:
    """``ax`` says "no data: <why>" instead of showing empty axes (no ticks, no grid)."""
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes, color="grey",
            fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)


def whole_steps(axes, xs) -> None:
    """Whole-number x ticks on the panels that drew something, over one shared range of the steps
    ``xs`` (half a step of margin: a single point gets ticks at whole steps, not 0.96-1.04)."""
    xs = [float(x) for x in xs if pd.notna(x)]
    for ax in axes:
        if not ax.has_data():
            continue
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if xs:
            ax.set_xlim(min(xs) - max(0.5, 0.03 * (max(xs) - min(xs))), max(xs) + max(0.5, 0.03 * (max(xs) - min(xs))))


def mark_zero_bars(ax, xs, heights, *, width: float, color: str | list[str]) -> int:
    """Make bars of height 0 visible: a thick stroke in the bar's colour along the baseline and a "0"
    over it (an outline alone lies on the x axis, so 0 would read as missing). ``color``: one colour
    name for every bar, or a list with one per bar. Bars that are NaN stay undrawn. Returns how many
    were marked."""
    xs, heights = list(xs), list(heights)
    colors = [color] * len(xs) if isinstance(color, str) else list(color)
    marked = 0
    for x, h, c in zip(xs, heights, colors):
        if pd.isna(h) or float(h) != 0.0:
            continue
        ax.plot([x - width / 2, x + width / 2], [0, 0], color=c, lw=4, solid_capstyle="butt", clip_on=False, zorder=4)
        ax.annotate("0", (x, 0), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=7,
                    color="#333333")
        marked += 1
    return marked


def has_data(fig) -> bool:
    """Whether any panel of ``fig`` drew data (lines, bars, points), not only "no data" notes."""
    return fig is not None and any(ax.has_data() for ax in fig.axes)


def has_numbers(values: pd.Series) -> bool:
    """Whether ``values`` hold any number (a panel with none says so instead of drawing an empty axis)."""
    return bool(pd.to_numeric(values, errors="coerce").notna().any())


def plot_recall_at_k(curve: pd.DataFrame, *, topk: int | None = None, topn: int | None = None, title: str = ""):
    """Answer recall@k against k per family (single-hop solid, multi-hop dashed), with K and N marked."""
    fams = curve[curve["group"].isin(["single", "multi", "other"]) & curve["recall"].notna()] if "group" in curve else curve.iloc[:0]
    order = sorted(fams["data_source"].unique(), key=order_key) if len(fams) else []
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if not order:
        no_data(ax, "no recall records")
        ax.set_title(title or "Dense retriever: answer recall@k")
        return fig
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


def _gap_interval_marks(ax, part: pd.DataFrame, ci: pd.DataFrame, offsets: dict[str, float], width: float) -> list[str]:
    """Error bars (each setting's own interval) on one panel's bars, and the paired gap per column as
    text. ``ax.containers`` then holds an ErrorbarContainer per setting with an interval."""
    cols = list(part.columns)
    ci = ci.reindex(cols)
    for setting, offset in offsets.items():
        height = part.loc[setting].astype(float).to_numpy()
        low, high = ci[f"{setting}_ci_low"].to_numpy(float), ci[f"{setting}_ci_high"].to_numpy(float)
        shown = ~(np.isnan(low) | np.isnan(high) | np.isnan(height))
        err = np.vstack([np.clip(height - low, 0, None), np.clip(high - height, 0, None)])[:, shown]
        xs = np.arange(len(cols))[shown] + offset * width
        if shown.any():
            ax.errorbar(xs, height[shown], yerr=err, fmt="none", ecolor="#333333", elinewidth=1, capsize=3)
    return [f"Δ {d:+.3f}\n[{lo:+.3f}, {hi:+.3f}]" if not (pd.isna(lo) or pd.isna(hi))
            else ("" if pd.isna(d) else f"Δ {d:+.3f}\n(no CI)")
            for d, lo, hi in zip(ci["diff"], ci["ci_low"], ci["ci_high"])]


def plot_oracle_gap(beside: pd.DataFrame, *, metric: str = "F1", title: str = "",
                    intervals: Mapping[str, pd.DataFrame] | None = None):
    """Table 1 as bars: one panel per source (ours, paper 3B, ...), standard vs oracle for the
    single-hop, multi-hop and overall averages, relative gain written over each pair.

    ``beside``: :func:`eval.paper_reference.oracle_gap_beside_paper` (index levels source, row). ``intervals``:
    {source: :func:`eval.tables.oracle_gap_intervals`} for the sources with records (ours; the paper's
    rows have none): error bars show each setting's own bootstrap interval, and the paired
    oracle - standard difference with its interval is written under the gain. Overlapping error
    bars do not mean "no difference": the paired interval (Δ) is the one that says."""
    intervals = dict(intervals or {})
    unknown = sorted(set(intervals) - set(beside.index.get_level_values("source")))
    if unknown:
        raise ValueError(f"intervals for unknown source(s) {unknown}")
    sources = list(dict.fromkeys(beside.index.get_level_values("source")))
    fig, axes = plt.subplots(1, len(sources), figsize=(3.6 * len(sources), 4.2 if intervals else 3.8), sharey=True,
                             squeeze=False)
    colors = {"standard": "#8da0cb", "oracle": "#fc8d62"}
    offsets, width = {"standard": -0.5, "oracle": 0.5}, 0.38
    top_of = beside.drop(index="relative gain %", level="row")
    for ax, source in zip(axes[0], sources):
        part = beside.loc[source]
        cols = list(part.columns)
        for setting, offset in offsets.items():
            xs = [i + offset * width for i in range(len(cols))]
            ax.bar(xs, part.loc[setting], width=width, color=colors[setting], edgecolor="#555555", linewidth=1.0,
                   label=setting)
            mark_zero_bars(ax, xs, part.loc[setting].astype(float), width=width, color=colors[setting])
        ci = intervals.get(source)
        gaps = _gap_interval_marks(ax, part, ci, offsets, width) if ci is not None else [""] * len(cols)
        for i, col in enumerate(cols):
            gain = part.loc["relative gain %", col]
            top = pd.Series([part.loc[["standard", "oracle"], col].max(), *_ci_highs(ci, col)], dtype=float).max()
            text = "n/a" if pd.isna(gain) else f"{gain:+.0f}%"
            zero_bar = bool((part.loc[["standard", "oracle"], col].astype(float) == 0).any())
            ax.annotate("\n".join(filter(None, (text, gaps[i]))), (i, 0 if pd.isna(top) else top), ha="center", va="bottom",
                        xytext=(0, 12 if zero_bar and not top > 0.05 else 2), textcoords="offset points",
                        fontsize=8 if not gaps[i] else 7)  # above the "0" of a zero bar
        ax.set_xticks(range(len(cols)), [c.replace(" avg", "\navg") for c in cols])
        ax.set_title(source, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    highs = [h for ci in intervals.values() for col in ci.index for h in _ci_highs(ci, col)]
    ymax = pd.Series([top_of.max().max(), *highs], dtype=float).max()
    axes[0][0].set_ylabel(metric)
    axes[0][0].set_ylim(0, max(0.1, float(ymax) * (1.35 if intervals else 1.2)))
    axes[0][-1].legend(frameon=False, fontsize=8)
    fig.suptitle(title or f"Oracle gap: {metric} with the retriever's top-K vs answer-containing passages first")
    bars_with_intervals = any(type(c).__name__ == "ErrorbarContainer" for ax in axes[0] for c in ax.containers)
    if intervals and bars_with_intervals:
        level = next(iter(intervals.values())).attrs.get("level", 0.95)
        fig.text(0.5, 0.01, f"error bars: {level * 100:g}% bootstrap interval of each setting; Δ: paired oracle - standard "
                 f"with its {level * 100:g}% interval (same questions, stratified by family)", ha="center", fontsize=7,
                 color="#555555")
    elif intervals:
        fig.text(0.5, 0.01, "no interval could be computed (too few questions): no error bars", ha="center", fontsize=7,
                 color="#555555")
    fig.tight_layout(rect=(0, 0.04 if intervals else 0, 1, 1))
    return fig


def _ci_highs(ci: pd.DataFrame | None, col: str) -> list[float]:
    if ci is None or col not in ci.index:
        return []
    return [float(ci.loc[col, c]) for c in ("standard_ci_high", "oracle_ci_high")]


def plot_turn_distribution(beside: pd.DataFrame, *, title: str = ""):
    """Table 7 as stacked bars: % of questions answered after 0, 1, ... searches per method, then
    the rows that never answered (grey, hatched), one panel per source. ``beside``:
    :func:`eval.paper_reference.turns_beside_paper` (index levels source, method)."""
    sources = list(dict.fromkeys(beside.index.get_level_values("source")))
    if not sources:
        fig, ax = plt.subplots(figsize=(5, 2.5))
        no_data(ax, "no evaluated agent method")
        fig.suptitle(title or "Search turns per question")
        return fig
    fig, axes = plt.subplots(1, len(sources), figsize=(5 * len(sources), 0.5 + 0.55 * beside.index.size / len(sources) + 1.5),
                             sharex=True, squeeze=False)
    counts = [c for c in beside.columns if c != "mean"]
    numbered = [c for c in counts if isinstance(c, int)]
    colors = dict(zip(numbered, sns.color_palette("crest", len(numbered))))
    drawn = [c for c in counts if (beside[c].fillna(0) > 0).any()]  # a share that is 0 everywhere: no bar, no legend entry
    for ax, source in zip(axes[0], sources):
        part = beside.loc[source].fillna(dict.fromkeys(counts, 0.0))  # the paper has no "no answer" column
        left = pd.Series(0.0, index=part.index)
        for c in drawn:
            ax.barh(range(len(part)), part[c], left=left, color=colors.get(c, "#bdbdbd"), label=str(c),
                    hatch=None if c in colors else "//")
            left += part[c]
        ax.set_yticks(range(len(part)), [f"{m}  (mean {part.loc[m, 'mean']:.2f})" for m in part.index], fontsize=8)
        ax.invert_yaxis()
        ax.set(xlim=(0, 100), xlabel="% of questions", title=source)
    axes[0][-1].legend(title="searches", fontsize=7, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(title or "Search turns per question")
    fig.tight_layout()
    return fig


#: Fig. 2 panels: (record column, axis label). Validation has its own figure, with intervals
#: (:func:`plot_validation_curves`); a panel given for ``val_f1`` is drawn only at the steps that have it.
TRAINING_PANELS = (("rollout/agent_reward", "agent reward (Eq. 4)"), ("ranker/hit@K", "ranker Hit@K (the K passages shown)"),
                   ("rollout/searches_per_traj", "searches per trajectory"))


def plot_training_curves(steps: pd.DataFrame, *, panels: tuple[tuple[str, str], ...] = TRAINING_PANELS, title: str = ""):
    """The Fig. 2 analogue: one panel per metric over training steps, one line per method.

    ``steps``: :func:`cosearch_lib.records.training_runs.read_steps` (columns step, method and the panel metrics).
    Panels whose column is missing or all-NaN say so instead of drawing an empty axis."""
    methods = list(dict.fromkeys(steps["method"])) if "method" in steps else []
    palette = method_palette(methods)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), squeeze=False)
    xs = []
    for ax, (column, label) in zip(axes[0], panels):
        ax.set(xlabel="training steps completed", title=label)
        ax.grid(alpha=0.3)
        if steps.empty or column not in steps or not has_numbers(steps[column]):
            no_data(ax, "no step records" if steps.empty else "not logged in these step records")
            continue
        for method in methods:
            part = steps[(steps["method"] == method) & steps[column].notna()]
            if len(part):
                ax.plot(part["step"] + 1, part[column], marker="o", ms=4, lw=1.6, color=palette[method], label=method)
                xs += list(part["step"] + 1)
    whole_steps(axes[0], xs)
    drawn = [ax for ax in axes[0] if ax.get_lines()]
    if drawn:
        drawn[0].legend(fontsize=8, frameon=False)
    fig.suptitle(title or "Training curves (x = steps completed)")
    fig.tight_layout()
    return fig


#: Fig. 2's panels after (a) the validation F1: per-step columns of the step records.
FIG2_STEP_PANELS = (("ranker/hit@K", "(b) ranker Hit@K per step (the K passages shown)"),
                    ("rollout/searches_per_traj", "(c) searches per trajectory"))


def plot_fig2(val_f1: pd.DataFrame, steps: pd.DataFrame, *, title: str = ""):
    """The paper's Fig. 2 for the methods of one run: (a) validation avg F1 with 95% intervals
    (``training_runs.validation_curves(kind="agent")``), (b) Hit@5 of the passages the agent read
    and (c) searches per trajectory, per training step (the step records). One colour per method
    across the panels; x = steps completed."""
    methods = list(dict.fromkeys([*val_f1.get("method", []), *steps.get("method", [])]))
    palette = method_palette(methods)
    fig, axes = plt.subplots(1, 1 + len(FIG2_STEP_PANELS), figsize=(4.4 * (1 + len(FIG2_STEP_PANELS)), 3.6), squeeze=False)
    ax = axes[0][0]
    ax.set(xlabel="training steps completed", title="(a) validation avg F1 (95% CI)")
    if val_f1.empty:
        no_data(ax, "no validation records\n(training.eval_every 0)")
    else:
        width = 0.06 * max(1.0, float(val_f1["x"].max() - val_f1["x"].min()))
        for i, method in enumerate(methods):
            part = val_f1[val_f1["method"] == method].sort_values("x")
            if part.empty:
                continue
            err = np.vstack([part["estimate"] - part["ci_low"], part["ci_high"] - part["estimate"]])
            ax.errorbar(part["x"] + (i - (len(methods) - 1) / 2) * width, part["estimate"], yerr=np.nan_to_num(err),
                        marker="o", ms=4, lw=1.6, capsize=3, color=palette[method], label=method)
    for ax, (column, label) in zip(axes[0][1:], FIG2_STEP_PANELS):
        ax.set(xlabel="training steps completed", title=label)
        if steps.empty or column not in steps or not has_numbers(steps[column]):
            no_data(ax, "no step records" if steps.empty else "not logged in these step records")
            continue
        for method in methods:
            part = steps[(steps["method"] == method) & (steps["step"] >= 0) & steps[column].notna()]
            if len(part):
                ax.plot(part["step"] + 1, part[column], marker="o", ms=3, lw=1.4, color=palette[method], label=method)
    xs = [*val_f1.get("x", []), *(steps.loc[steps["step"] >= 0, "step"] + 1 if "step" in steps else [])]
    whole_steps(axes[0], xs)  # whole steps, one shared range (a single point would get fractional ticks)
    for ax, low_high in zip(axes[0], ((-0.02, 1.02), (-0.02, 1.02), None)):
        if not ax.has_data():
            continue
        if low_high:
            ax.set_ylim(*low_high)
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), frameon=False, fontsize=8)
    fig.suptitle(title or "Fig. 2 analogue: validation F1, ranker Hit@5 and searches over training")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


#: From this many validation points on, a curve is drawn with a shaded interval band in a panel of at most
#: :data:`BAND_MAX_METHODS` methods; fewer points, or more methods (bands would cover each other), keep error bars.
BAND_MIN_POINTS = 3
BAND_MAX_METHODS = 2


def _score_limits(values, pad: float = 0.06) -> tuple[float, float]:
    """y-limits holding every score and interval with a margin (at least 0.25 wide), within [-0.02, 1.02]."""
    v = np.concatenate([np.asarray(x, dtype=float).ravel() for x in values if x is not None and len(x)] or [np.array([])])
    v = v[np.isfinite(v)]
    mid, half = ((v.min() + v.max()) / 2, max((v.max() - v.min()) / 2 + pad, 0.125)) if len(v) else (0.5, 0.52)
    return max(-0.02, float(mid - half)), min(1.02, float(mid + half))


def plot_validation_curves(curves: Mapping[str, pd.DataFrame], *, title: str = "",
                           references: Mapping[str, Mapping[str, float]] | None = None):
    """Validation with 95% intervals: a panel per ``{title: records.training_runs.validation_curves table}``, a line
    per method, its interval as (nudged) error bars or, from :data:`BAND_MIN_POINTS` points in a panel of at most
    :data:`BAND_MAX_METHODS` methods, a band; x = training questions when every curve has them, else steps completed.
    ``references`` ({panel title: {label: value}}) draws fixed levels as dashed lines (e.g. the retriever's order)."""
    methods = list(dict.fromkeys(m for c in curves.values() for m in c.get("method", [])))
    palette = method_palette(methods)
    fig, axes = plt.subplots(1, max(len(curves), 1), figsize=(4.6 * max(len(curves), 1), 3.6), squeeze=False)
    if not curves:
        no_data(axes[0][0], "no validation records")
    xs, by = [], "questions" if curves and all(c.get("questions", pd.Series([np.nan])).notna().all() for c in curves.values()) else "x"
    for ax, (label, curve) in zip(axes[0], curves.items()):
        ax.set(xlabel="training questions rolled out" if by == "questions" else "training steps completed", title=label)
        ax.grid(alpha=0.3)
        if curve.empty or not has_numbers(curve["estimate"]):
            no_data(ax, "no validation records")
            continue
        curve = curve.assign(x=curve[by])
        xs += list(curve["x"])
        width = 0.08 * max(1.0, float(curve["x"].max() - curve["x"].min()))
        for i, method in enumerate(methods):
            part = curve[curve["method"] == method].sort_values("x")
            if part.empty:
                continue
            if len(part) >= BAND_MIN_POINTS and len(methods) <= BAND_MAX_METHODS:  # a learning curve: the interval as a band
                ax.plot(part["x"], part["estimate"], marker="o", ms=3, lw=1.6, color=palette[method], label=method)
                ax.fill_between(part["x"], part["ci_low"], part["ci_high"], color=palette[method], alpha=0.18, lw=0)
                continue
            x = part["x"] + (i - (len(methods) - 1) / 2) * width
            xs += list(x)  # the nudged points inside the panel's range too
            err = np.vstack([part["estimate"] - part["ci_low"], part["ci_high"] - part["estimate"]])
            ax.errorbar(x, part["estimate"], yerr=np.nan_to_num(err), marker="o", ms=4, lw=1.6, capsize=3,
                        color=palette[method], label=method)
        for j, (ref_label, value) in enumerate((refs := (references or {}).get(label, {})).items()):
            ax.axhline(value, ls="--", lw=1.2, color=f"C{7 + j}", label=f"{ref_label} ({value:.2f})")
        ax.set_ylim(*_score_limits([curve["estimate"], curve.get("ci_low"), curve.get("ci_high"), list(refs.values())]))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, frameon=False)
    whole_steps(axes[0], xs)
    intervals = any(c["ci_low"].notna().any() and c["ci_high"].notna().any() for c in curves.values()
                    if {"ci_low", "ci_high"} <= set(c.columns))
    fig.suptitle(title or ("Validation during training (95% bootstrap intervals)" if intervals or not xs else
                           "Validation during training (no interval could be computed: too few items per family)"))
    fig.tight_layout()
    return fig


def plot_warmstart_losses(losses: pd.DataFrame, *, title: str = ""):
    """Supervised warm-start loss per optimizer step, one line per role
    (``losses``: :func:`cosearch_lib.records.training_runs.warmstart_losses`)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.set(xlabel="optimizer step", ylabel="cross-entropy on the policy's tokens", title=title or "Warm start (SFT)")
    ax.grid(alpha=0.3)
    if losses.empty or not has_numbers(losses["loss"]):
        no_data(ax, "no warm-start losses (warm start off, or no log)")
        fig.tight_layout()
        return fig
    for role, part in losses.groupby("role", sort=False):
        ax.plot(part["step"], part["loss"], marker="o", ms=4, lw=1.6, label=role)
    whole_steps([ax], losses["step"])
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


#: One colour per method in every figure that names methods (training ids and harness ids alike).
METHOD_COLORS = {
    "search_r1": "#7f7f7f", "agent_retrieval": "#7f7f7f",
    "fixed_ranker": "#1f77b4", "agent_fixed_ranker": "#1f77b4",
    "cosearch": "#d62728", "agent_trained_ranker": "#d62728",
    "oracle": "#2ca02c", "agent_oracle": "#2ca02c",
}


def method_palette(methods) -> dict:
    """A colour per method: :data:`METHOD_COLORS` where the method has one, else tab10 colours."""
    spare = iter(sns.color_palette("tab10", 10)[4:])
    return {m: METHOD_COLORS.get(m) or next(spare, "#7f7f7f") for m in methods}


def plot_ablations(table: pd.DataFrame, *, title: str = ""):
    """Table 3 as a forest plot: each ablation's avg F1 minus full CoSearch's (a dot) with its paired
    95% interval (a line; a dot alone when every resample agrees), and the paper's difference as a
    black diamond where the cell names a paper row. The x axis is centred on 0 and wide enough for
    both. ``table``: :func:`cosearch_lib.records.ablations.ablation_table`."""
    rows = table[table["diff"].notna()] if "diff" in table else table.iloc[:0]
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.45 * max(len(rows), 2)))
    if rows.empty:
        no_data(ax, "no finished ablation cell next to a finished 'full' cell:\nrun the grid (notebook text)")
    else:
        y = np.arange(len(rows))
        err = np.vstack([rows["diff"] - rows["ci_low"], rows["ci_high"] - rows["diff"]])
        intervals = (rows["ci_low"].notna() & rows["ci_high"].notna()).any()
        ax.errorbar(rows["diff"], y, xerr=np.nan_to_num(err), fmt="o", color=METHOD_COLORS["cosearch"], capsize=3,
                    label="ours, 95% paired interval" if intervals else "ours (no interval could be computed)")
        reach = [rows["ci_low"].abs().max(), rows["ci_high"].abs().max(), rows["diff"].abs().max()]
        if "paper diff" in rows and rows["paper diff"].notna().any():
            ax.scatter(rows["paper diff"], y, marker="D", color="black", zorder=3, label="paper")
            reach.append(rows["paper diff"].abs().max())
        half = max([0.05, *[float(r) for r in reach if pd.notna(r)]]) * 1.15
        ax.set_xlim(-half, half)
        ax.xaxis.set_major_locator(plt.MaxNLocator(7, symmetric=True))
        ax.axvline(0, color="black", lw=0.8)
        paper = rows["paper row"] if "paper row" in rows else pd.Series(index=rows.index, dtype=object)
        ax.set_yticks(y, [f"{cell} ({row})" if isinstance(row, str) else str(cell) for cell, row in paper.items()])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.grid(axis="x", alpha=0.3)
        ax.set(xlabel="avg F1 minus full CoSearch (test questions)")
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "Table 3: ablations against full CoSearch")
    fig.tight_layout()
    return fig


def plot_topk(table: pd.DataFrame, *, title: str = ""):
    """Table 4 as lines: avg F1 of each trained method against K with 95% intervals (solid), the
    paper's numbers dashed. ``table``: :func:`cosearch_lib.records.ablations.topk_table`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if table.empty:
        no_data(ax, "no finished K cell: run the grid (notebook text)")
    else:
        groups = list(table.groupby("method", sort=False))
        # each method a little to the side of K, so equal values (common on small runs) stay visible
        dodge = np.linspace(-0.12, 0.12, len(groups)) if len(groups) > 1 else [0.0]
        for (method, part), dx in zip(groups, dodge):
            part = part.sort_values("K")
            color = METHOD_COLORS.get(method)
            err = np.vstack([part["avg"] - part["ci_low"], part["ci_high"] - part["avg"]])
            ax.errorbar(part["K"] + dx, part["avg"], yerr=np.nan_to_num(err), marker="o", capsize=3, color=color, label=method)
            if part["paper avg"].notna().any():
                ax.plot(part["K"] + dx, part["paper avg"], ls="--", marker="x", color=color, alpha=0.6)
        ks = sorted(table["K"].unique())
        ax.set(xlabel="K (passages shown to the agent)", ylabel="avg F1 (test)", ylim=(-0.02, 1.02),
               xlim=(min(ks) - 0.5, max(ks) + 0.5))
        ax.set_xticks(ks)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, frameon=False, title="ours (solid) / paper (dashed)", title_fontsize=8)
    ax.set_title(title or "Table 4: avg F1 against K")
    fig.tight_layout()
    return fig


def house_style() -> None:
    """The one look of the report's figures (notebook 05): seaborn's white grid, notebook sizes."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.85, rc={"figure.dpi": 110, "savefig.dpi": 150})
