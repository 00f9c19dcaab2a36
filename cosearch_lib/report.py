"""Every table and figure of the paper from one profile's run records, beside the paper's numbers.

:func:`report_items` builds, from what notebooks 02-04 left under ``papermill_runs/<profile>/``:

* Table 1, the oracle gap (02's records), with its paired interval;
* Table 2, avg F1 per method and family (02), our avg beside the paper's 3B and 7B agents;
* Tables 3 and 4, the ablations and the K sweep (the grids' cells, ``records.ablations``);
* Table 7, search turns per question (02);
* Fig. 2, training curves and validation with intervals (03's step and validation records), the
  validation against training questions when the records say how many each step rolled out;
* the learning curves: each method's last validation minus its first, paired (:func:`training_metrics`
  saves them for RESULTS.md);
* Fig. 3, the ranker's reward dynamics before and after the semantic-group filter (03, CoSearch).

An item whose runs are missing carries no figure but a sentence naming the missing run and the
command that produces it; nothing raises. :func:`write_report` saves every figure as PNG and PDF and
every table as CSV under ``figures/<profile>/``, then one Markdown page, ``REPORT.md``, showing them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from cosearch_lib.atomic_io import atomic_path, save_figure, write_table
from cosearch_lib.config import load_profile
from cosearch_lib.config.methods import TRAINING_METHODS, RankedBy, method_spec
from cosearch_lib.data.qa_formats import qa_files, question_sources
from cosearch_lib.eval.paper_reference import PAPER_METHOD, oracle_gap_beside_paper, paper_table, turns_beside_paper
from cosearch_lib.eval.tables import load_records, oracle_gap_intervals, oracle_gap_table, summary_table, turn_distribution
from cosearch_lib.paths import figures_dir, project_relative, run_dir
from cosearch_lib.records.ablations import ablation_table, cell_topk, grid_records, missing_cells, topk_table
from cosearch_lib.records.docs import describe_f1_metric
from cosearch_lib.records.grid_cells import load_grid
from cosearch_lib.records.hop_signal import concat_hop_tables, run_hop_tables
from cosearch_lib.records.ranker_quality import RETRIEVER_ORDER
from cosearch_lib.records.run_comparison import findings_across_runs
from cosearch_lib.records.training_runs import (
    STEPS_FILE,
    grpo_signal_table,
    learning_curve_table,
    read_ranker_calls,
    read_runs,
    read_steps,
    training_root,
    validation_curves,
)
from cosearch_lib.retrieval.artifacts import corpus_paths
from cosearch_lib.run_schema import METRIC_DIGITS, RANKER_CALLS_FILE
from cosearch_lib.viz.hop_groups import plot_hop_signal
from cosearch_lib.viz.plots import (
    METHOD_COLORS,
    mark_zero_bars,
    plot_ablations,
    plot_oracle_gap,
    plot_topk,
    plot_training_curves,
    plot_turn_distribution,
    plot_validation_curves,
)
from cosearch_lib.viz.ranker_dynamics import plot_ranker_dynamics


@dataclass
class ReportItem:
    key: str  # file stem under figures/<profile>/ (e.g. "table1_oracle_gap")
    title: str
    figure: Any = None  # a matplotlib figure, or None when its runs are missing
    table: pd.DataFrame | None = None
    missing: str | None = None  # what is missing and the command that produces it


class MissingRun(FileNotFoundError):
    """A record a report item needs is not there; the message says which and how to produce it."""


def _eval_records(profile: str) -> pd.DataFrame:
    path = run_dir(load_profile(profile).profile) / "02_eval_records.parquet"
    if not path.exists():
        raise MissingRun(f"no {project_relative(path)}: run `cosearch run --profile {profile} --notebooks 02`")
    return _records(*_stamp(path)).copy()


def _stamp(path: Path) -> tuple[str, int, int]:
    """(path, mtime_ns, size) of a file, (path, -1, -1) where it is not there: the key of the caches below, so
    a rewrite reads again."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return str(path), -1, -1
    return str(path), st.st_mtime_ns, st.st_size


def _split_stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """:func:`_stamp` of each file ``load_qa`` reads for a split (``data.qa_formats.qa_files``): the file, or a
    folder's QA files, since a folder's own mtime stays when a shard in it is rewritten in place; the folder's
    own stamp when it holds none."""
    try:
        return tuple(_stamp(p) for p in qa_files(path))
    except FileNotFoundError:
        return (_stamp(path),)


@lru_cache(maxsize=2)
def _records(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    """Notebook 02's records, read once for the three items built from them (a rewrite reads again)."""
    return load_records(path)


def _table1(profile: str, seed: int) -> ReportItem:
    records = _eval_records(profile)
    for needed in ("agent_retrieval", "agent_oracle"):
        if needed not in set(records["method"]):
            raise MissingRun(f"notebook 02 ran without {needed}: run `cosearch run --profile {profile} --notebooks 02`")
    label = f"ours ({profile})"
    beside = oracle_gap_beside_paper(oracle_gap_table(records), label=label)
    intervals = oracle_gap_intervals(records, seed=seed)
    return ReportItem("table1_oracle_gap", "Table 1: the oracle gap", plot_oracle_gap(beside, intervals={label: intervals}),
                      beside.reset_index())


def table2_beside_paper(records: pd.DataFrame) -> pd.DataFrame:
    """Our avg F1 per method and family (paper order) with the paper's avg for its 3B and 7B agents."""
    ours = summary_table(records, "f1")
    paper = paper_table("table2")
    for agent in ("3B", "7B"):
        avg = paper[paper["agent"] == agent].set_index("method")["avg"]
        ours[f"paper {agent} avg"] = [float(avg[PAPER_METHOD[m]]) if PAPER_METHOD.get(m) in avg.index else None
                                      for m in ours.index]
    return ours


def plot_table2(table: pd.DataFrame, *, title: str = ""):
    """Table 2 as bars: our avg F1 per method beside the paper's 3B and 7B agents (hatched)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = range(len(table))
    colors = [METHOD_COLORS.get(m, "#9467bd") for m in table.index]
    ax.bar([i - 0.27 for i in x], table["avg"], width=0.27, color=colors, edgecolor="#555555", linewidth=1.0,
           label="ours")
    mark_zero_bars(ax, [i - 0.27 for i in x], table["avg"].astype(float), width=0.27, color=colors)
    for offset, agent, hatch in ((0.0, "3B", "//"), (0.27, "7B", "xx")):
        ax.bar([i + offset for i in x], table[f"paper {agent} avg"].astype(float), width=0.27, color="white",
               edgecolor=colors, hatch=hatch, label=f"paper {agent}")
    ax.set_xticks(list(x), table.index, rotation=20, ha="right")
    ax.set(ylabel="avg F1", ylim=(0, 1), title=title or "Table 2: avg F1 per method, ours and the paper's")
    ax.legend(handles=[Patch(facecolor="grey", label="ours (colour: method)"),
                       Patch(facecolor="white", edgecolor="grey", hatch="//", label="paper 3B"),
                       Patch(facecolor="white", edgecolor="grey", hatch="xx", label="paper 7B")], fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _table2(profile: str, seed: int) -> ReportItem:
    table = table2_beside_paper(_eval_records(profile))
    return ReportItem("table2_main", "Table 2: answer F1 per method and family", plot_table2(table), table.reset_index())


def _grid_item(profile: str, seed: int, grid_name: str) -> ReportItem:
    grid = load_grid(grid_name)
    records = grid_records(profile, grid)
    missing = missing_cells(profile, grid)
    if grid_name == "table3":
        table = ablation_table(records, grid, seed=seed)
        item = ReportItem("table3_ablations", "Table 3: ablations", plot_ablations(table),
                          table.reset_index() if len(table) else table)
    else:
        table = topk_table(records, cell_topk(profile, grid), seed=seed)
        item = ReportItem("table4_topk", "Table 4: the number K of passages shown", plot_topk(table), table)
    if len(missing):
        item.missing = (f"{len(missing)} of {len(grid.cells)} cells have not finished ({', '.join(missing['cell'])}): "
                        f"run `cosearch grid {grid_name} --profile {profile}`")
    if table.empty:
        plt.close(item.figure)
        item.figure = None
    return item


def _table7(profile: str, seed: int) -> ReportItem:
    records = _eval_records(profile)
    agents = records[records["method"].str.startswith("agent_")]
    if agents.empty:
        raise MissingRun(f"notebook 02 ran no agent method: run `cosearch run --profile {profile} --notebooks 02`")
    cfg = load_profile(profile)
    table = turns_beside_paper(turn_distribution(agents, max_turns=cfg.search.max_searches), label=f"ours ({profile})")
    return ReportItem("table7_search_turns", "Table 7: searches per question", plot_turn_distribution(table),
                      table.reset_index())


def _runs(profiles: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The step and validation records of the methods trained under the profiles' run folders
    (``records.training_runs.read_runs``; the first is the report's profile)."""
    try:
        return read_runs([load_profile(p).profile for p in profiles])
    except FileNotFoundError as err:
        raise MissingRun(f"no training run under {project_relative(training_root(load_profile(profiles[0]).profile))}: "
                         f"run `cosearch run --profile {profiles[0]} --notebooks 03`") from err


def _steps(profiles: Sequence[str]) -> pd.DataFrame:
    return _runs(profiles)[0]


def _fig2(profiles: Sequence[str], seed: int) -> ReportItem:
    steps = _steps(profiles)
    return ReportItem("fig2_training_curves", "Fig. 2: training curves", plot_training_curves(steps),
                      steps[steps["step"] >= 0])


def _validation(profiles: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps, validation = _runs(profiles)
    if validation.empty:
        raise MissingRun(f"no validation records under {project_relative(training_root(load_profile(profiles[0]).profile))}: "
                         f"notebook 03 writes them when the profile validates (training.eval_every > 0, as in laptop): "
                         f"run `cosearch run --profile {profiles[0]} --notebooks 03`")
    return steps, validation


def _kinds(validation: pd.DataFrame) -> list[str]:
    """The kinds of validation rows present (``agent``, ``ranker``), in that order."""
    return [k for k in ("agent", "ranker") if (validation["kind"] == k).any()]


#: The validation panels of Fig. 2, per kind of validation row.
VALIDATION_PANELS = {"agent": "agent: validation avg F1", "ranker": "ranker: Hit@1 on held-out sub-queries"}


def _fig2_validation(profiles: Sequence[str], seed: int) -> ReportItem:
    """The validation curves per kind. In the ranker panel beside methods that rank, a method ranked by
    retrieval (Retrieval Only) has no ranker to train: its Hit@1 is the retriever's order's
    (``records.ranker_quality.RETRIEVER_ORDER``), drawn as a dashed level, not as a curve (alone, it stays
    a curve: there is nothing to set it beside)."""
    steps, validation = _validation(profiles)
    curves = {VALIDATION_PANELS[k]: validation_curves(validation, kind=k, seed=seed, steps=steps) for k in _kinds(validation)}
    table = pd.concat(curves, names=["panel"]).reset_index(level=0)
    references = {}
    ranker_panel = VALIDATION_PANELS["ranker"]
    if ranker_panel in curves:
        curve = curves[ranker_panel]
        by_retrieval = curve["method"].map(lambda m: method_spec(m).ranked_by is RankedBy.RETRIEVAL)
        if by_retrieval.any() and not by_retrieval.all():
            references[ranker_panel] = {RETRIEVER_ORDER: float(curve.loc[by_retrieval, "estimate"].iloc[0])}
            curves[ranker_panel] = curve[~by_retrieval]
    figure = plot_validation_curves(curves, references=references)
    return ReportItem("fig2_validation", "Fig. 2 (validation, with 95% intervals)", figure, table)


def _learning_curves(profiles: Sequence[str], seed: int) -> ReportItem:
    """Each method's last validation minus its first, paired, on every family and the multi-hop ones
    (``records.training_runs.learning_curve_table``), for the agent's F1 and the ranker's Hit@1."""
    steps, validation = _validation(profiles)
    methods = list(dict.fromkeys(steps["method"]))
    tables = {kind: learning_curve_table(validation, methods, kind=kind, seed=seed) for kind in _kinds(validation)}
    return ReportItem("learning_curves", "Learning curves: the last validation minus the first", None,
                      pd.concat(tables, names=["kind"]).reset_index(level=0))


def _findings_metrics(profiles: Sequence[str], seed: int) -> dict:
    """The paper's findings among the runs' trained policies (``records.run_comparison``), or why there are none."""
    try:
        table = findings_across_runs(profiles, seed=seed)
    except (FileNotFoundError, ValueError) as why:
        return {"findings_missing": str(why)}
    return {"findings_across_runs": table.round(METRIC_DIGITS).to_dict(orient="records"), "findings_skipped": table.attrs["skipped"]}


def _hop_tables(profiles: Sequence[str], seed: int) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """What the training rollouts paid per hop group (``records.hop_signal``), for every method whose ranker
    calls the profiles' run folders hold, read against each profile's training split at the run's own G;
    with what could not be read, named, and (``coverage``) the question-steps each method rolled out
    against those its calls hold. Built once for notebook 05's figure and its metrics (:func:`_hop_tables_read`):
    a rewrite of any file it reads builds them again."""
    tables, missing = _hop_tables_read(tuple(profiles), seed, _hop_stamps(profiles))
    return {key: table.copy() for key, table in tables.items()}, list(missing)


def _hop_stamps(profiles: Sequence[str]) -> tuple:
    """:func:`_stamp` of every file :func:`_hop_tables` reads: for each profile, each method's ranker calls and
    step records and the training split (the file, or a folder's QA files: ``data.qa_formats.qa_files``)."""
    stamps = []
    for name in profiles:
        cfg = load_profile(name)
        root = training_root(cfg.profile)
        qa = corpus_paths(cfg).qa.get(cfg.training.split)
        stamps += [_stamp(root / m / f) for m in TRAINING_METHODS for f in (RANKER_CALLS_FILE, STEPS_FILE)]
        stamps += _split_stamp(qa) if qa else ()
    return tuple(stamps)


@lru_cache(maxsize=2)
def _hop_tables_read(profiles: tuple[str, ...], seed: int, stamps: tuple) -> tuple[dict[str, pd.DataFrame], tuple[str, ...]]:
    """:func:`_hop_tables`, keyed on the stamps of what it reads (``stamps``, :func:`_hop_stamps`)."""
    runs: list[dict[str, pd.DataFrame]] = []
    missing = []
    for name in profiles:
        cfg = load_profile(name)
        root = training_root(cfg.profile)
        methods = [m for m in TRAINING_METHODS if (root / m / RANKER_CALLS_FILE).exists()]
        if not methods:
            continue
        qa = corpus_paths(cfg).qa.get(cfg.training.split)
        if qa is None or not qa.exists():
            missing.append(f"{name}: no {cfg.training.split!r} split file ({qa or 'data.qa_paths names none'})")
            continue
        data_source = question_sources(qa)
        for method in methods:
            try:
                runs.append(run_hop_tables(read_ranker_calls(root, method), read_steps(root, [method]), data_source,
                                           method=method, seed=seed))
            except (FileNotFoundError, ValueError) as why:
                missing.append(f"{name}, {method}: {why}")
    return concat_hop_tables(runs), tuple(missing)


def _hop_metrics(profiles: Sequence[str], seed: int) -> dict:
    """:func:`_hop_tables` as records for RESULTS.md (``hop_signal_missing``: the profiles without a split file)."""
    tables, missing = _hop_tables(profiles, seed)
    out: dict[str, Any] = {key: table.round(METRIC_DIGITS).to_dict(orient="records") for key, table in tables.items()}
    return out | ({"hop_signal_missing": missing} if missing else {})


def _hop_item(profiles: Sequence[str], seed: int) -> ReportItem:
    tables, missing = _hop_tables(profiles, seed)
    if "second_search" not in tables:
        why = "; ".join(missing) if missing else "no ranker calls of a training run"
        raise MissingRun(f"{why}: run `cosearch run --profile {profiles[0]} --notebooks 03`")
    figure = plot_hop_signal(tables["second_search"], tables["hop_signal"])
    return ReportItem("hop_signal", "What GRPO had to work with per hop group", figure, tables["second_search"])


def training_metrics(profile: str, *, seed: int = 0, with_runs: Sequence[str] = (),
                     compare_runs: Sequence[str] = ()) -> dict | None:
    """What notebook 05 saves for RESULTS.md (``05_figures.metrics.json``): the learning curves per kind and
    what GRPO had to work with per method, from the training records of the profile and ``with_runs``; with
    ``compare_runs``, the paper's findings among the trained policies that the notebook-03 evaluations of the
    profile and ``compare_runs`` hold, each method from its longest training (``records.run_comparison``).
    None when there is neither."""
    out = {"profiles": [profile, *with_runs], "seed": seed}
    if compare_runs:
        out |= {"compare_runs": [profile, *compare_runs], **_findings_metrics([profile, *compare_runs], seed)}
    try:
        steps, validation = _validation([profile, *with_runs])
    except MissingRun:
        return out if compare_runs else None
    methods = list(dict.fromkeys(steps["method"]))
    return {**out, "methods": methods,
            "learning_curves": {kind: learning_curve_table(validation, methods, kind=kind, seed=seed).round(METRIC_DIGITS).to_dict(orient="records")
                                for kind in _kinds(validation)},
            "grpo_signal": grpo_signal_table(steps, methods).round(METRIC_DIGITS).to_dict(orient="records"),
            **_hop_metrics([profile, *with_runs], seed),
            "questions_per_step": {m: float(steps.loc[(steps["method"] == m) & (steps["step"] >= 0), "rollout/n_questions"].mean())
                                   for m in methods}}


def _fig3(profiles: Sequence[str], seed: int) -> ReportItem:
    profile = profiles[0]
    steps = _steps(profiles)
    trains_ranker = [m for m in dict.fromkeys(steps["method"]) if method_spec(m).trains_ranker]
    if not trains_ranker:
        raise MissingRun(f"no run that trains the ranker: run `cosearch run --profile {profile} --notebooks 03 "
                         "-p methods=cosearch`")
    method = "cosearch" if "cosearch" in trains_ranker else trains_ranker[0]
    part = steps[(steps["method"] == method) & (steps["step"] >= 0)]
    return ReportItem("fig3_ranker_dynamics", f"Fig. 3: ranker dynamics ({method})", plot_ranker_dynamics(part), part)


#: (key, title, builder) of every report item, in the paper's order.
#: (key, title, builder) of every report item, in the paper's order; a builder takes the profiles
#: whose records it reads (the report's first, then ``with_runs``) and the seed.
REPORT_ITEMS: tuple[tuple[str, str, Callable[[Sequence[str], int], ReportItem]], ...] = (
    ("table1_oracle_gap", "Table 1: the oracle gap", lambda ps, s: _table1(ps[0], s)),
    ("table2_main", "Table 2: answer F1 per method and family", lambda ps, s: _table2(ps[0], s)),
    ("table3_ablations", "Table 3: ablations", lambda ps, s: _grid_item(ps[0], s, "table3")),
    ("table4_topk", "Table 4: the number K of passages shown", lambda ps, s: _grid_item(ps[0], s, "table4")),
    ("table7_search_turns", "Table 7: searches per question", lambda ps, s: _table7(ps[0], s)),
    ("fig2_training_curves", "Fig. 2: training curves", _fig2),
    ("fig2_validation", "Fig. 2 (validation, with 95% intervals)", _fig2_validation),
    ("learning_curves", "Learning curves: the last validation minus the first", _learning_curves),
    ("hop_signal", "What GRPO had to work with per hop group", _hop_item),
    ("fig3_ranker_dynamics", "Fig. 3: ranker dynamics", _fig3),
)


def report_items(profile: str, *, seed: int = 0, with_runs: Sequence[str] = ()) -> list[ReportItem]:
    """Every item of :data:`REPORT_ITEMS`; one whose runs are missing says so (``missing``). The
    training items (Figs. 2 and 3, the learning curves) also read the training records of the
    profiles ``with_runs`` (methods trained with another recipe, e.g. ``laptop_curve_wide``'s CoSearch
    beside ``laptop_curve``'s Retrieval Only). The figures are closed (pyplot forgets them), so a
    notebook shows each one where it displays it, not all of them again at the end of the cell that built them."""
    items = []
    for key, title, build in REPORT_ITEMS:
        try:
            items.append(build((profile, *with_runs), seed))
        except MissingRun as why:
            items.append(ReportItem(key, title, missing=str(why)))
        if items[-1].figure is not None:
            plt.close(items[-1].figure)
    return items


def recorded_f1_metric(profile: str) -> str | None:
    """The answer F1 notebook 02's records were scored with (its metrics' ``eval_config.f1``); None when
    they predate ``evaluation.f1`` (then: the yes/no rule) or do not exist (then: the profile's)."""
    cfg = load_profile(profile)
    path = run_dir(cfg.profile) / "02_oracle_gap_study.metrics.json"
    if not path.exists():
        return cfg.evaluation.f1
    return json.loads(path.read_text()).get("eval_config", {}).get("f1")


def write_report(items: list[ReportItem], profile: str) -> Path:
    """PNG + PDF per figure, CSV per table under ``figures/<profile>/``, and ``REPORT.md`` showing them."""
    out = figures_dir() / load_profile(profile).profile
    lines = [f"# Report: profile `{profile}`", "",
             "Every table and figure of the paper from this profile's run records, the paper's numbers beside "
             "ours (generated by notebook 05; regenerate with `cosearch run --profile "
             f"{profile} --notebooks 05`). Answer F1: {describe_f1_metric(recorded_f1_metric(profile))}.", ""]
    for item in items:
        lines += [f"## {item.title}", ""]
        if item.missing:
            lines += [f"*Missing:* {item.missing}", ""]
        if item.figure is not None:
            save_figure(item.figure, item.key, out)
            lines += [f"![{item.title}]({item.key}.png)", ""]
        if item.table is not None and len(item.table):
            write_table(item.table, out / f"{item.key}.csv")
            lines += [f"Table: [{item.key}.csv]({item.key}.csv)", ""]
    path = out / "REPORT.md"
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path
