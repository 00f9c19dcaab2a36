"""Browse rollout trajectories in a notebook: an ipywidgets explorer with a plain-text twin.

What one trajectory shows: the question and gold answers; per agent turn its reasoning, the
query it issued, the retriever's top-N candidates of that search (id, title when a corpus store
is given, has-answer mark), what the ranker picked (order, validity, raw LLM output), then the
answer, F1, the format flag f, the finish reason and the reward when one is given.

Rendering is pure (:func:`render_trajectory_html`, :func:`render_trajectory_text`: a trajectory
in, a string out) so it is tested without a browser; :class:`TrajectoryBrowser` only wires
filters and a selector to the HTML renderer. Every piece of model output is HTML-escaped: the
agent writes literal ``<reason>`` / ``<answer>`` tags, which must be *shown*, not interpreted.

:func:`show_trajectories` picks the right form for where it runs (see :func:`widgets_enabled`):
the browser in an interactive Jupyter session, the text of a few examples under papermill,
in a plain script, or when ``COSEARCH_NO_WIDGETS`` is set, so executed notebooks stay readable.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from cosearch_lib.agent.rollout import RankerCall, Trajectory, Turn
from cosearch_lib.metrics import shown_hits
from cosearch_lib.progress import NO_WIDGET_ENV_VARS, headless  # noqa: F401  (re-exported: the switch is documented here too)

#: A trajectory counts as "correct" in the filters and the example picker when F1 >= this
#: (the released code's binarisation threshold of r_main, docs/METHOD.md, released-code variant).
CORRECT_F1 = 0.8

_REASON = re.compile(r"<reason>(.*?)</reason>", re.DOTALL)


# ------------------------------------------------------------------------------ shared pieces


def _reasoning(turn: Turn) -> str | None:
    """The text inside the turn's first ``<reason>`` block, or None when it has none."""
    m = _REASON.search(turn.text)
    return m.group(1).strip() if m else None


def _title(corpus: Any, pid: str) -> str | None:
    """The passage's title from a CorpusStore-like object (``get(id) -> Passage``); None if unknown."""
    if corpus is None:
        return None
    try:
        passage = corpus.get(pid)
    except (KeyError, LookupError):
        return None
    return getattr(passage, "title", None) if passage is not None else None


def _who(traj: Trajectory, method: str | None) -> str:
    """``"<method>: <traj_id>"``, or the id alone when the method is not known."""
    return f"{method}: {traj.traj_id}" if method else traj.traj_id


def as_labelled(trajs: Sequence[Trajectory] | Mapping[str, Sequence[Trajectory]]
                ) -> tuple[list[Trajectory], list[str | None]]:
    """``(trajectories, their methods)`` from a flat sequence (methods unknown: None) or from
    ``{method: trajectories}`` (e.g. the ``trajectories`` dict the evaluation harness fills), in
    the mapping's order."""
    if isinstance(trajs, Mapping):
        pairs = [(t, method) for method, some in trajs.items() for t in some]
        return [t for t, _ in pairs], [m for _, m in pairs]
    flat = list(trajs)
    return flat, [None] * len(flat)


def _calls_by_turn(traj: Trajectory) -> dict[int, RankerCall]:
    return {c.turn: c for c in traj.ranker_calls}


def _is_llm(call: RankerCall) -> bool:
    """Rule-based rankers (retrieval, oracle) leave the LLM fields empty."""
    return bool(call.output_text or call.output_ids)


def _candidate_rows(call: RankerCall, max_candidates: int) -> list[int]:
    """Candidate indices to list: the first ``max_candidates``, plus any picked one beyond them."""
    shown = set(range(min(max_candidates, len(call.candidate_ids)))) | set(call.order)
    return sorted(shown)


def _hits(call: RankerCall) -> str:
    """Hit@1 and Hit@K of what the agent read (K: the passages shown)."""
    if not call.order:
        return "nothing shown"
    hits = shown_hits(call.shown_labels, (1,), len(call.order))
    return " ".join(f"{name.replace('hit', 'Hit').replace('@K', f'@{len(call.order)}')}={v:.0f}" for name, v in hits.items())


def _ranker_verdict(call: RankerCall) -> str:
    kind = "LLM ranker" if _is_llm(call) else "rule-based ranker"
    if call.valid:
        return f"{kind}, valid"
    return f"{kind}, INVALID ({call.error}): fell back to the retriever's top-{len(call.order)}"


def _fmt_reward(reward: float | None) -> str:
    return "n/a" if reward is None else f"{reward:+.3f}"


def is_correct(traj: Trajectory, threshold: float = CORRECT_F1) -> bool:
    return traj.f1 >= threshold


# ------------------------------------------------------------------------------ plain text


def render_trajectory_text(traj: Trajectory, *, corpus: Any = None, reward: float | None = None,
                           max_candidates: int = 10, method: str | None = None) -> str:
    """One trajectory as plain text (for logs, papermill output and terminals); ``method`` names the
    method that produced it in the header."""
    lines = [f"=== {_who(traj, method)}  [{traj.data_source}]  finish={traj.finish}  format_ok={traj.format_ok}  "
             f"F1={traj.f1:.3f}  reward={_fmt_reward(reward)}",
             f"question: {traj.question}",
             f"gold:     {' | '.join(traj.golds)}"]
    calls = _calls_by_turn(traj)
    for i, turn in enumerate(traj.turns):
        status = "ok" if turn.format_ok else f"FORMAT ERROR ({turn.error})"
        lines.append(f"--- turn {i + 1}: {turn.kind}, {status}")
        reason = _reasoning(turn)
        if reason is not None:
            lines.append(f"  reason: {reason}")
        if turn.query is not None:
            lines.append(f"  query:  {turn.query}")
        if turn.answer is not None:
            lines.append(f"  answer: {turn.answer}")
        if not turn.format_ok or reason is None:
            lines.append(f"  raw:    {turn.text!r}")
        call = calls.get(i)
        if call is not None:
            lines.extend(_call_text(call, corpus, max_candidates))
    lines.append(f"answer: {traj.answer!r}  F1={traj.f1:.3f}  EM={traj.em:.0f}  format_ok={traj.format_ok}  "
                 f"finish={traj.finish}  searches={traj.n_searches}  reward={_fmt_reward(reward)}")
    return "\n".join(lines)


def _call_text(call: RankerCall, corpus: Any, max_candidates: int) -> list[str]:
    picked = [call.candidate_ids[i] for i in call.order]
    out = [f"  search: {len(call.candidate_ids)} candidates, {sum(call.relevant)} contain an answer (I_ans={call.i_ans})",
           f"  ranker: {_ranker_verdict(call)}; picked {picked}; {_hits(call)}"]
    rank_of = {idx: pos + 1 for pos, idx in enumerate(call.order)}
    rows = _candidate_rows(call, max_candidates)
    out.append("     #  picked  ans  id" + ("  title" if corpus is not None else ""))
    for idx in rows:
        pid = call.candidate_ids[idx]
        pick = f"->{rank_of[idx]}" if idx in rank_of else ""
        title = _title(corpus, pid) if corpus is not None else None
        out.append(f"  {idx + 1:4d}  {pick:>6}  {'*' if call.relevant[idx] else ' ':>3}  {pid}"
                   + (f"  {title if title is not None else '(not in corpus)'}" if corpus is not None else ""))
    hidden = len(call.candidate_ids) - len(rows)
    if hidden > 0:
        out.append(f"        ... {hidden} more candidates not listed")
    if _is_llm(call):
        out.append(f"  ranker output: {call.output_text!r}")
    return out


# ------------------------------------------------------------------------------ HTML

_CSS = """<style>
.cs-traj {font-family: sans-serif; font-size: 13px; line-height: 1.35}
.cs-traj table {border-collapse: collapse; margin: 4px 0}
.cs-traj td, .cs-traj th {border: 1px solid #ccc; padding: 1px 6px; text-align: left}
.cs-traj tr.cs-picked {background: #e6f0ff}
.cs-traj .cs-turn {border-left: 3px solid #888; padding-left: 8px; margin: 8px 0}
.cs-traj .cs-bad {color: #b00020; font-weight: bold}
.cs-traj .cs-good {color: #1b5e20; font-weight: bold}
.cs-traj pre {white-space: pre-wrap; background: #f6f6f6; padding: 4px; margin: 2px 0}
</style>"""


def _e(value: Any) -> str:
    """Escape anything for HTML text and attribute positions."""
    return html.escape(str(value), quote=True)


def _flag(ok: bool, yes: str, no: str) -> str:
    return f'<span class="cs-good">{_e(yes)}</span>' if ok else f'<span class="cs-bad">{_e(no)}</span>'


def render_trajectory_html(traj: Trajectory, *, corpus: Any = None, reward: float | None = None,
                           max_candidates: int = 10, method: str | None = None) -> str:
    """One trajectory as a self-contained HTML fragment (every model string escaped); ``method``
    names the method that produced it in the heading."""
    parts = [_CSS, '<div class="cs-traj">',
             f"<h4>{_e(_who(traj, method))} <small>[{_e(traj.data_source)}]</small></h4>",
             f"<p><b>Question:</b> {_e(traj.question)}<br><b>Gold:</b> {_e(' | '.join(traj.golds))}</p>"]
    calls = _calls_by_turn(traj)
    for i, turn in enumerate(traj.turns):
        status = _flag(turn.format_ok, "format ok", f"format error: {turn.error}")
        parts.append(f'<div class="cs-turn"><b>Turn {i + 1}: {_e(turn.kind)}</b> ({status})')
        reason = _reasoning(turn)
        if reason is not None:
            parts.append(f"<div><b>Reasoning:</b> {_e(reason)}</div>")
        if turn.query is not None:
            parts.append(f"<div><b>Query:</b> <code>{_e(turn.query)}</code></div>")
        if turn.answer is not None:
            parts.append(f"<div><b>Answer:</b> {_e(turn.answer)}</div>")
        parts.append(f"<details{' open' if not turn.format_ok else ''}><summary>raw turn text</summary>"
                     f"<pre>{_e(turn.text)}</pre></details>")
        call = calls.get(i)
        if call is not None:
            parts.append(_call_html(call, corpus, max_candidates))
        parts.append("</div>")
    parts.append(
        f"<p><b>Answer:</b> {_e(traj.answer) if traj.answer is not None else '<i>none</i>'} &nbsp; "
        f"<b>F1</b> {traj.f1:.3f} &nbsp; <b>EM</b> {traj.em:.0f} &nbsp; "
        f"{_flag(traj.format_ok, 'f = 1 (format ok)', 'f = 0 (format broken)')} &nbsp; "
        f"<b>finish</b> {_e(traj.finish)} &nbsp; <b>searches</b> {traj.n_searches} &nbsp; "
        f"<b>reward</b> {_e(_fmt_reward(reward))}</p></div>")
    return "\n".join(parts)


def _call_html(call: RankerCall, corpus: Any, max_candidates: int) -> str:
    picked = [call.candidate_ids[i] for i in call.order]
    rank_of = {idx: pos + 1 for pos, idx in enumerate(call.order)}
    verdict = _flag(call.valid, _ranker_verdict(call), _ranker_verdict(call))
    head = "<tr><th>#</th><th>picked</th><th>has answer</th><th>id</th>" + ("<th>title</th>" if corpus is not None else "") + "</tr>"
    rows = []
    for idx in _candidate_rows(call, max_candidates):
        pid = call.candidate_ids[idx]
        cls = ' class="cs-picked"' if idx in rank_of else ""
        title = ""
        if corpus is not None:
            t = _title(corpus, pid)
            title = f"<td>{_e(t) if t is not None else '<i>not in corpus</i>'}</td>"
        rows.append(f"<tr{cls}><td>{idx + 1}</td><td>{rank_of.get(idx, '')}</td>"
                    f"<td>{'&#10003;' if call.relevant[idx] else ''}</td><td>{_e(pid)}</td>{title}</tr>")
    hidden = len(call.candidate_ids) - len(rows)
    more = f"<div><i>... {hidden} more candidates not listed</i></div>" if hidden > 0 else ""
    output = (f"<details><summary>ranker output</summary><pre>{_e(call.output_text)}</pre></details>"
              if _is_llm(call) else "")
    return (f"<div><b>Search:</b> {len(call.candidate_ids)} candidates, {sum(call.relevant)} contain an answer "
            f"(I_ans = {call.i_ans})<br><b>Ranker:</b> {verdict}; picked <code>{_e(', '.join(picked))}</code>; "
            f"{_e(_hits(call))}</div><table>{head}{''.join(rows)}</table>{more}{output}")


# ------------------------------------------------------------------------------ the browser


def _label(traj: Trajectory, method: str | None = None) -> str:
    return f"{_who(traj, method)} | {traj.data_source} | {traj.finish} | F1 {traj.f1:.2f}"


class TrajectoryBrowser(widgets.VBox):
    """Filters (method, data_source, finish, correct) above a trajectory selector and an HTML pane.

    ``trajs``: a sequence, or ``{method: trajectories}`` so that every label and heading names the
    method (the same question answered by several methods otherwise reads as identical entries).
    The sub-widgets are attributes, so a notebook (or a test) can drive them: set
    ``browser.selector.value`` to an index into ``trajs`` (flattened in the mapping's order);
    ``browser.pane.value`` is the HTML.
    """

    def __init__(self, trajs: Sequence[Trajectory] | Mapping[str, Sequence[Trajectory]], *,
                 rewards: Mapping[str, float] | None = None, corpus: Any = None, max_candidates: int = 10,
                 correct_f1: float = CORRECT_F1) -> None:
        self.trajs, self.methods = as_labelled(trajs)
        if not self.trajs:
            raise ValueError("trajectory_browser needs at least one trajectory, got none")
        self.rewards, self.corpus = dict(rewards or {}), corpus
        self.max_candidates, self.correct_f1 = max_candidates, correct_f1
        named = list(dict.fromkeys(m for m in self.methods if m))
        self.method_filter = widgets.Dropdown(options=["all", *named], description="method",
                                              disabled=not named)
        self.source_filter = widgets.Dropdown(options=["all", *sorted({t.data_source for t in self.trajs})],
                                              description="source")
        self.finish_filter = widgets.Dropdown(options=["all", *sorted({t.finish for t in self.trajs})],
                                              description="finish")
        self.correct_filter = widgets.Dropdown(options=["all", "correct", "wrong"], description="correct",
                                               tooltip=f"correct: F1 >= {correct_f1}")
        self.selector = widgets.Dropdown(description="trajectory", layout=widgets.Layout(width="480px"))
        self.prev_button = widgets.Button(description="<", layout=widgets.Layout(width="36px"))
        self.next_button = widgets.Button(description=">", layout=widgets.Layout(width="36px"))
        self.match_label = widgets.Label()
        self.pane = widgets.HTML()
        super().__init__([widgets.HBox([self.method_filter, self.source_filter, self.finish_filter,
                                        self.correct_filter]),
                          widgets.HBox([self.selector, self.prev_button, self.next_button, self.match_label]),
                          self.pane])
        for f in (self.method_filter, self.source_filter, self.finish_filter, self.correct_filter):
            f.observe(self._refilter, names="value")
        self.selector.observe(self._render, names="value")
        self.prev_button.on_click(lambda _: self.step(-1))
        self.next_button.on_click(lambda _: self.step(+1))
        self._refilter()

    def matching(self) -> list[int]:
        """Indices into ``trajs`` that pass the four filters."""
        met, src = self.method_filter.value, self.source_filter.value
        fin, cor = self.finish_filter.value, self.correct_filter.value
        return [i for i, t in enumerate(self.trajs)
                if (met == "all" or self.methods[i] == met) and (src == "all" or t.data_source == src) and (fin == "all" or t.finish == fin)
                and (cor == "all" or is_correct(t, self.correct_f1) == (cor == "correct"))]

    @property
    def current(self) -> Trajectory | None:
        return None if self.selector.value is None else self.trajs[self.selector.value]

    def step(self, delta: int) -> None:
        """Select the previous (-1) or next (+1) matching trajectory, wrapping around."""
        options = [v for _, v in self.selector.options]
        if options and self.selector.value is not None:
            self.selector.value = options[(options.index(self.selector.value) + delta) % len(options)]

    def _refilter(self, *_: Any) -> None:
        keep = self.matching()
        previous = self.selector.value
        self.selector.options = [(_label(self.trajs[i], self.methods[i]), i) for i in keep]
        self.selector.value = previous if previous in keep else (keep[0] if keep else None)
        self.match_label.value = f"{len(keep)} of {len(self.trajs)} trajectories match"
        self._render()

    def _render(self, *_: Any) -> None:
        t = self.current
        if t is None:
            self.pane.value = "<i>no trajectory matches the filters</i>"
            return
        self.pane.value = render_trajectory_html(t, corpus=self.corpus, reward=self.rewards.get(t.traj_id),
                                                 max_candidates=self.max_candidates,
                                                 method=self.methods[self.selector.value])


def trajectory_browser(trajs: Sequence[Trajectory] | Mapping[str, Sequence[Trajectory]], *, rewards: Mapping[str, float] | None = None, corpus: Any = None,
                       max_candidates: int = 10, correct_f1: float = CORRECT_F1) -> TrajectoryBrowser:
    """The interactive browser widget. ``rewards`` maps ``traj_id`` to a reward; ``corpus`` is a
    CorpusStore (or anything with ``get(id) -> Passage``) for candidate titles."""
    return TrajectoryBrowser(trajs, rewards=rewards, corpus=corpus, max_candidates=max_candidates,
                             correct_f1=correct_f1)


# ------------------------------------------------------------------------------ display


def widgets_enabled() -> bool:
    """Whether to show the browser (True) or print text (False).

    Text when any of these holds, checked in order:

    1. ``COSEARCH_NO_WIDGETS`` is set (to anything but "", "0", "false", "no");
    2. ``PAPERMILL_EXECUTION`` is set likewise. Papermill itself sets no variable; the kernel
       inherits the launching process's environment, so a runner sets it before calling
       ``papermill.execute_notebook`` (a widget there would only leave an unrendered widget-state
       blob in the executed notebook);
    3. no IPython kernel: ``get_ipython()`` is None (a plain script) or has no ``kernel``
       attribute (a terminal IPython shell cannot render widgets).
    """
    if headless():
        return False
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipykernel, a core dependency
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def pick_examples(trajs: Sequence[Trajectory], n: int = 2, *, correct_f1: float = CORRECT_F1) -> list[Trajectory]:
    """``n`` trajectories to print: the first correct one and the first wrong one when both exist,
    then the rest in order (deterministic, so re-executed notebooks show the same examples)."""
    if n < 0:
        raise ValueError(f"n_examples must be >= 0, got {n}")
    firsts = [next((t for t in trajs if is_correct(t, correct_f1) == want), None) for want in (True, False)]
    chosen = [t for t in firsts if t is not None][:n]
    chosen += [t for t in trajs if all(t is not c for c in chosen)][: n - len(chosen)]
    return chosen


def show_trajectories(trajs: Sequence[Trajectory] | Mapping[str, Sequence[Trajectory]], *,
                      rewards: Mapping[str, float] | None = None, corpus: Any = None, n_examples: int = 2,
                      max_candidates: int = 10, correct_f1: float = CORRECT_F1) -> None:
    """Display the browser when a widget frontend is there (:func:`widgets_enabled`), else print
    the text of ``n_examples`` trajectories (:func:`pick_examples`). ``trajs`` as for
    :class:`TrajectoryBrowser` (``{method: trajectories}`` names the methods). Returns None, so a
    notebook cell ending with this call shows the browser once; :func:`trajectory_browser` gives
    the widget itself."""
    if widgets_enabled():
        from IPython.display import display

        display(trajectory_browser(trajs, rewards=rewards, corpus=corpus, max_candidates=max_candidates,
                                   correct_f1=correct_f1))
        return None
    rewards = rewards or {}
    flat, methods = as_labelled(trajs)
    method_of = {id(t): m for t, m in zip(flat, methods)}
    examples = pick_examples(flat, n_examples, correct_f1=correct_f1)
    named = list(dict.fromkeys(m for m in methods if m))
    print(f"{len(flat)} trajectories{f' of {len(named)} methods' if named else ''}; showing {len(examples)} "
          "as text (no widget frontend)")
    for t in examples:
        print(render_trajectory_text(t, corpus=corpus, reward=rewards.get(t.traj_id), max_candidates=max_candidates,
                                     method=method_of[id(t)]))
        print()
    return None
