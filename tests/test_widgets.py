"""The trajectory browser: both renderers show every part of a trajectory and escape model output,
the widget re-renders when its selection or filters change, and the papermill fallback prints text
without building a widget. Trajectories come from the scripted backend (as in test_rollout.py)."""

from __future__ import annotations

import pytest

from cosearch_lib.agent.rankers import LLMRanker, OracleRanker
from cosearch_lib.agent.rollout import RolloutEngine
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SamplingConfig, SearchBudget
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample
from cosearch_lib.viz import trajectory_browser as widgets
from cosearch_lib.viz.trajectory_browser import (
    pick_examples,
    render_trajectory_html,
    render_trajectory_text,
    show_trajectories,
    trajectory_browser,
    widgets_enabled,
)

from tests.doubles import FixedRetriever, ScriptedBackend, answer_turn, search_turn

CORPUS = [Passage(f"p{i}", f'"Doc {i}"\n{text}') for i, text in enumerate([
    "Drask is a river town.", "The mill was built in 1843.", "Orvane Tellis was born in Kessmere.",
    "Kessmere lies on the coast.", "Tellis wrote atlases.", "Unrelated passage about bells."])]
Q1 = QAExample(id="q1", question="Where was Orvane Tellis born?", golden_answers=["Kessmere"], data_source="syn_nq")
Q2 = QAExample(id="q2", question="What did Tellis write?", golden_answers=["atlases"], data_source="syn_hotpotqa")




def html_search(q):
    """A search turn whose reasoning holds HTML-like text, to test escaping."""
    return search_turn(q, reason="I need to <b>look</b> this up.")


class Store:
    """A CorpusStore stand-in: ``get(id) -> Passage``, KeyError when unknown."""

    def __init__(self):
        self.rows = {p.id: p for p in CORPUS}

    def get(self, pid):
        return self.rows[pid]








@pytest.fixture(scope="module")
def trajs(chat):
    """q1 (oracle ranker) and q3 (LLM ranker): search, then the right answer; q2: search, then a wrong
    answer holding a tag-like string. Queries and reasoning carry HTML-like text on purpose."""
    def respond(prompt, key):
        if key[0] == "ranker":
            return "<reason>[3] names it.</reason><rerank>[3] > [4]</rerank>"
        question, turn = key[2], key[-1]
        if turn == 0:
            return html_search("tellis <script>alert(1)</script> birthplace" if question != "q2" else "tellis books")
        return answer_turn("Kessmere") if question != "q2" else answer_turn("maps <i>and</i> charts")

    backend = ScriptedBackend(chat.tokenizer, respond)
    engine = RolloutEngine(backend, chat, FixedRetriever(CORPUS), OracleRanker(), RolloutConfig(search=SearchBudget(topn=5, topk=2)),
                           ProtocolConfig(search=SearchBudget(topk=2)))
    out = engine.run([Q1, Q2], n_samples=1)
    llm = LLMRanker(backend, chat, ProtocolConfig(search=SearchBudget(topk=2)), SamplingConfig(max_new_tokens=64, stop=("</rerank>",)))
    engine = RolloutEngine(backend, chat, FixedRetriever(CORPUS), llm, RolloutConfig(search=SearchBudget(topn=5, topk=2)), ProtocolConfig(search=SearchBudget(topk=2)))
    (with_llm,) = engine.run([QAExample(id="q3", question=Q1.question, golden_answers=["Kessmere"],
                                        data_source="syn_nq")], n_samples=1)
    return [*out, with_llm]


def test_fixture_shapes(trajs):
    good, bad, llm = trajs
    assert good.f1 == 1.0 and good.format_ok and bad.f1 == 0.0 and bad.format_ok
    assert good.ranker_calls[0].order == [2, 3] and llm.ranker_calls[0].order == [2, 3] and llm.ranker_calls[0].valid


@pytest.mark.parametrize("render", [render_trajectory_html, render_trajectory_text])
def test_renderers_show_every_part(trajs, render):
    good = trajs[0]
    out = render(good, corpus=Store(), reward=0.75)
    for piece in (good.question, "Kessmere", "I need to", "p2", "p3", "Doc 2", "Doc 3", "1.000", "0.750", "answer"):
        assert piece in out, piece
    # the queries of both trajectories appear (escaped in HTML)
    assert "tellis books" in render(trajs[1])
    assert "alert(1)" in out


def test_html_escapes_model_output(trajs):
    good, bad, llm = trajs
    page = render_trajectory_html(good)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # the agent's literal protocol tags are shown, not interpreted
    assert "&lt;reason&gt;" in page and "&lt;tool_call&gt;" in page and "&lt;answer&gt;" in page
    assert "<reason>" not in page and "<b>look</b>" not in page and "&lt;b&gt;look&lt;/b&gt;" in page
    wrong = render_trajectory_html(bad)
    assert "maps &lt;i&gt;and&lt;/i&gt; charts" in wrong and "<i>and</i>" not in wrong
    ranked = render_trajectory_html(llm)
    assert "&lt;rerank&gt;[3] &gt; [4]&lt;/rerank&gt;" in ranked and "LLM ranker" in ranked


def test_text_marks_picks_relevance_and_llm_output(trajs):
    good, _, llm = trajs
    text = render_trajectory_text(good)
    assert "picked ['p2', 'p3']" in text and "I_ans=1" in text and "rule-based ranker, valid" in text
    assert "ranker output" not in text  # rule-based: no LLM text to show
    assert "<rerank>[3] > [4]</rerank>" in render_trajectory_text(llm)
    # candidates: ids only without a corpus, titles with one; max_candidates trims the list
    assert "Doc 2" not in text and "Doc 2" in render_trajectory_text(good, corpus=Store())
    short = render_trajectory_text(good, max_candidates=1)
    assert "p0" in short and "p2" in short and "p4" not in short and "more candidates not listed" in short


def test_unknown_ids_and_missing_reward_render(trajs):
    class Empty:
        def get(self, pid):
            raise KeyError(pid)

    assert "(not in corpus)" in render_trajectory_text(trajs[0], corpus=Empty())
    assert "reward=n/a" in render_trajectory_text(trajs[0])


def test_browser_switches_and_filters(trajs):
    rewards = {t.traj_id: float(i) for i, t in enumerate(trajs)}
    browser = trajectory_browser(trajs, rewards=rewards, corpus=Store())
    assert browser.current is trajs[0] and trajs[0].question in browser.pane.value
    first = browser.pane.value
    browser.selector.value = 1
    assert browser.pane.value != first and "tellis books" in browser.pane.value and "+1.000" in browser.pane.value
    browser.step(+1)
    assert browser.current is trajs[2]
    browser.correct_filter.value = "wrong"
    assert browser.matching() == [1] and browser.current is trajs[1]
    browser.correct_filter.value = "all"
    browser.source_filter.value = "syn_nq"
    assert browser.matching() == [0, 2] and "2 of 3" in browser.match_label.value
    browser.finish_filter.value = "answer"
    browser.correct_filter.value = "wrong"
    assert browser.matching() == [] and browser.current is None and "no trajectory" in browser.pane.value
    with pytest.raises(ValueError, match="at least one"):
        trajectory_browser([])


def test_pick_examples_one_correct_one_wrong(trajs):
    good, bad, llm = trajs
    assert pick_examples([good, llm, bad], 2) == [good, bad]
    assert pick_examples([good, llm], 2) == [good, llm]  # no wrong one: fill in order
    assert pick_examples(trajs, 1) == [good] and pick_examples(trajs, 5) == [good, bad, llm]


def test_detection(monkeypatch):
    monkeypatch.delenv("COSEARCH_NO_WIDGETS", raising=False)
    monkeypatch.delenv("PAPERMILL_EXECUTION", raising=False)
    assert not widgets_enabled()  # pytest: no IPython kernel

    class Kernel:
        kernel = object()

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: Kernel())
    assert widgets_enabled()
    monkeypatch.setenv("COSEARCH_NO_WIDGETS", "0")
    assert widgets_enabled()  # "0" means not disabled
    monkeypatch.setenv("PAPERMILL_EXECUTION", "1")
    assert not widgets_enabled()


def test_papermill_fallback_prints_text_without_widgets(trajs, monkeypatch, capsys):
    monkeypatch.setenv("PAPERMILL_EXECUTION", "1")

    def no_widgets(*a, **k):
        raise AssertionError("a widget was built under papermill")

    monkeypatch.setattr(widgets, "trajectory_browser", no_widgets)
    monkeypatch.setattr(widgets.TrajectoryBrowser, "__init__", no_widgets)
    assert show_trajectories(trajs, rewards={trajs[1].traj_id: -0.2}) is None
    out = capsys.readouterr().out
    assert "showing 2" in out and trajs[0].question in out and "tellis books" in out and "reward=-0.200" in out
    assert out.count("=== ") == 2


def test_interactive_session_displays_the_browser(trajs, monkeypatch):
    shown = []
    monkeypatch.setattr(widgets, "widgets_enabled", lambda: True)
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", shown.append)
    assert show_trajectories(trajs) is None  # None: a cell ending with the call shows the browser once
    assert len(shown) == 1 and isinstance(shown[0], widgets.TrajectoryBrowser)


def test_browser_names_the_method_of_every_trajectory_and_filters_by_it(trajs):
    good, bad, llm = trajs
    browser = trajectory_browser({"agent_retrieval": [good, bad], "agent_oracle": [llm]})
    labels = [label for label, _ in browser.selector.options]
    assert [label.split(" | ")[0] for label in labels] == [f"agent_retrieval: {good.traj_id}",
                                                           f"agent_retrieval: {bad.traj_id}", f"agent_oracle: {llm.traj_id}"]
    assert list(browser.method_filter.options) == ["all", "agent_retrieval", "agent_oracle"]
    assert not browser.method_filter.disabled
    browser.method_filter.value = "agent_oracle"
    assert browser.matching() == [2] and browser.current is llm and "agent_oracle: " in browser.pane.value
    plain = trajectory_browser([good, bad])  # a flat list: no method to name or filter by
    assert plain.method_filter.disabled and list(plain.method_filter.options) == ["all"]
    assert plain.selector.options[0][0].startswith(f"{good.traj_id} | ")


def test_papermill_text_names_the_method(trajs, monkeypatch, capsys):
    monkeypatch.setenv("PAPERMILL_EXECUTION", "1")
    good, bad, llm = trajs
    show_trajectories({"agent_retrieval": [good], "agent_fixed_ranker": [bad, llm]}, n_examples=2)
    out = capsys.readouterr().out
    assert out.startswith("3 trajectories of 2 methods; showing 2")
    assert f"=== agent_retrieval: {good.traj_id}" in out and f"=== agent_fixed_ranker: {bad.traj_id}" in out
