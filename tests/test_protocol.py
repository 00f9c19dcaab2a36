"""The tag protocol: strict parsers (every invalid class has its own error code), observation caps,
prompt contents, and token-level chat assembly checked against two different chat templates."""

from __future__ import annotations

import json

import pytest

from cosearch_lib.agent.chat_tokens import ChatTokens, TemplateError
from cosearch_lib.agent.parsers import AgentAction, parse_agent_turn, parse_ranking
from cosearch_lib.agent.prompts import (
    ELLIPSIS,
    agent_messages,
    format_observation,
    observation_message,
    ranker_messages,
    truncate,
)
from cosearch_lib.config import ProtocolConfig, SearchBudget
from cosearch_lib.data.passage import Passage, make_contents
from cosearch_lib.models.registry import load_tokenizer, resolve_model

REASON = "<reason>I need the founder.</reason>"


def call(query: str = "Brindlewick Press founder", name: str = "search") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"query": query}}) + "</tool_call>"


def passage(i: int, title: str, text: str) -> Passage:
    return Passage(id=str(i), contents=make_contents(title, text))


# --------------------------------------------------------------------------- parse_agent_turn: valid


@pytest.mark.parametrize(
    "text, kind, query, answer",
    [
        (REASON + call(), "search", "Brindlewick Press founder", None),
        (REASON + "<answer>Ada Quill</answer>", "answer", None, "Ada Quill"),
        # whitespace: around, between tags, inside tags and inside the JSON
        (f"\n  {REASON}\n\n{call()}  \n", "search", "Brindlewick Press founder", None),
        ('<reason>\nx\n</reason>\n<tool_call>\n{ "name" : "search",\n "arguments" : { "query" : "  a b  " } }\n</tool_call>',
         "search", "a b", None),
        (REASON + "<answer>  1874 \n</answer>", "answer", None, "1874"),
        # a trailing end-of-turn marker the caller did not strip
        (REASON + "<answer>Ada Quill</answer><|im_end|>", "answer", None, "Ada Quill"),
        (REASON + call() + "\n<|im_end|>\n", "search", "Brindlewick Press founder", None),
        # angle brackets that are not protocol tags are ordinary text
        ("<reason>is 3 < 4? <b>yes</b></reason><answer>a <i>b</i></answer>", "answer", None, "a <i>b</i>"),
    ],
)
def test_valid_agent_turns(text, kind, query, answer):
    action = parse_agent_turn(text)
    assert action == AgentAction(kind, reason=action.reason, query=query, answer=answer, format_ok=True, error=None)
    assert action.reason and action.reason == action.reason.strip()


def test_custom_strip_suffix_only_strips_what_is_given():
    text = REASON + "<answer>x</answer><|eot_id|>"
    assert parse_agent_turn(text, strip_suffixes=("<|eot_id|>",)).format_ok
    assert parse_agent_turn(text, strip_suffixes=("<|im_end|>",)).error == "extra_text"


# --------------------------------------------------------------------------- parse_agent_turn: every invalid class


@pytest.mark.parametrize(
    "text, error",
    [
        ("Ada Quill", "no_tags"),
        ("", "no_tags"),
        (call(), "missing_reason"),
        ("<answer>Ada Quill</answer>", "missing_reason"),
        (REASON, "no_action"),
        ("The answer is: " + REASON + "<answer>x</answer>", "extra_text"),
        (REASON + "so I search " + call(), "extra_text"),
        (REASON + "<answer>x</answer> Done.", "extra_text"),
        (REASON + '<tool_call>{"name": "search", "arguments": {"query": "x"}</tool_call>', "bad_json"),
        (REASON + "<tool_call>search(Brindlewick)</tool_call>", "bad_json"),
        (REASON + '<tool_call>["search", "x"]</tool_call>', "bad_json"),
        (REASON + call(name="lookup"), "wrong_tool"),
        (REASON + '<tool_call>{"arguments": {"query": "x"}}</tool_call>', "wrong_tool"),
        (REASON + '<tool_call>{"name": "search"}</tool_call>', "missing_query"),
        (REASON + '<tool_call>{"name": "search", "arguments": {}}</tool_call>', "missing_query"),
        (REASON + call(query="   "), "missing_query"),
        (REASON + '<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>', "missing_query"),
        (REASON + '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>', "bad_arguments"),
        (REASON + '<tool_call>{"name": "search", "arguments": {"query": "x", "topk": 3}}</tool_call>', "extra_arguments"),
        (REASON + '<tool_call>{"name": "search", "arguments": {"query": "x"}, "id": 1}</tool_call>', "extra_arguments"),
        (REASON + "<answer>  </answer>", "empty_answer"),
        (REASON + call() + "<answer>x</answer>", "multiple_actions"),
        (REASON + call() + call("second"), "multiple_actions"),
        (REASON + "<answer>x</answer><answer>y</answer>", "multiple_actions"),
        ("<reason>a</reason><reason>b</reason><answer>x</answer>", "multiple_reasons"),
        ("<answer>x</answer>" + REASON, "wrong_order"),
        ("<reason> \n </reason><answer>x</answer>", "empty_reason"),
        ("<reason>a <answer>x</answer></reason>", "nested_tags"),
        ("<reason>a" + call(), "nested_tags"),
        (REASON + "<answer>x", "unclosed_tag"),
        ("<reason>a</answer>", "mismatched_tag"),
        (REASON + "</answer>", "stray_close_tag"),
        (REASON + call() + "<information>[1] made-up result</information>", "information_tag"),
    ],
)
def test_invalid_agent_turns(text, error):
    action = parse_agent_turn(text)
    assert (action.kind, action.format_ok, action.error) == ("invalid", False, error)
    assert action.query is None and action.answer is None


def test_invalid_turn_keeps_reason_for_inspection():
    assert parse_agent_turn(REASON + call(name="lookup")).reason == "I need the founder."


# --------------------------------------------------------------------------- parse_ranking


@pytest.mark.parametrize(
    "text, order",
    [
        ("<reason>r</reason><rerank>[3] > [1] > [7]</rerank>", [2, 0, 6]),
        ("  <reason>\nr\n</reason>\n\n<rerank>\n[3]>[1]   >\n[ 7 ]\n</rerank>\n<|im_end|>", [2, 0, 6]),
        ("<reason>r</reason><rerank>[10] > [9] > [1]</rerank>", [9, 8, 0]),
    ],
)
def test_valid_rankings(text, order):
    out = parse_ranking(text, n_candidates=10, k=3)
    assert (out.order, out.valid, out.error, out.reason) == (order, True, None, "r")


@pytest.mark.parametrize(
    "text, error",
    [
        ("[3] > [1] > [7]", "no_tags"),
        ("<reason>r</reason>", "missing_rerank"),
        ("<rerank>[3] > [1] > [7]</rerank>", "missing_reason"),
        ("<reason>r</reason><rerank>[3] > [1] > [7]</rerank> hope this helps", "extra_text"),
        ("Ranking: <reason>r</reason><rerank>[3] > [1] > [7]</rerank>", "extra_text"),
        ("<reason>r</reason><rerank>[3] > [1] > [7]</rerank><rerank>[1] > [2] > [3]</rerank>", "multiple_rerank"),
        ("<rerank>[3] > [1] > [7]</rerank><reason>r</reason>", "wrong_order"),
        ("<reason></reason><rerank>[3] > [1] > [7]</rerank>", "empty_reason"),
        ("<reason>r</reason><rerank>[3], [1], [7]</rerank>", "bad_syntax"),
        ("<reason>r</reason><rerank>3 > 1 > 7</rerank>", "bad_syntax"),
        ("<reason>r</reason><rerank>[3] > [1] > [7] ></rerank>", "bad_syntax"),
        ("<reason>r</reason><rerank>[3] < [1] < [7]</rerank>", "bad_syntax"),
        ("<reason>r</reason><rerank>[3] > [a] > [7]</rerank>", "bad_syntax"),
        ("<reason>r</reason><rerank>[3] > [0] > [7]</rerank>", "out_of_range"),
        ("<reason>r</reason><rerank>[3] > [11] > [7]</rerank>", "out_of_range"),
        ("<reason>r</reason><rerank>[3] > [1] > [3]</rerank>", "duplicate_index"),
        ("<reason>r</reason><rerank>[3] > [1]</rerank>", "too_few"),
        ("<reason>r</reason><rerank></rerank>", "too_few"),
        ("<reason>r</reason><rerank>[3] > [1] > [7] > [2]</rerank>", "too_many"),
        ("<reason>r<rerank>[3] > [1] > [7]</rerank></reason>", "nested_tags"),
        ("<reason>r</reason><rerank>[3] > [1] > [7]", "unclosed_tag"),
    ],
)
def test_invalid_rankings(text, error):
    out = parse_ranking(text, n_candidates=10, k=3)
    assert (out.order, out.valid, out.error) == ([], False, error)


def test_parse_ranking_rejects_impossible_k():
    with pytest.raises(ValueError, match="k=6, n_candidates=5"):
        parse_ranking("<reason>r</reason><rerank>[1]</rerank>", n_candidates=5, k=6)


# --------------------------------------------------------------------------- observations and truncation


def test_truncate_is_exact_and_marks_the_cut():
    assert truncate("abcdef", 6) == "abcdef"
    assert truncate("abcdefg", 6) == "abcde" + ELLIPSIS
    assert len(truncate("x" * 5000, 2000)) == 2000
    # never separates a combining accent from its letter: "e" + U+0301 stays whole or goes whole
    assert truncate("abcde\u0301fgh", 6) == "abcd" + ELLIPSIS
    assert truncate("ab cd   efgh", 9) == "ab cd" + ELLIPSIS  # no dangling spaces before the ellipsis
    cut = truncate("日本の首都🎉" * 10, 7)
    assert len(cut) == 7 and cut.encode("utf-8").decode("utf-8") == cut


def test_observation_layout_numbers_title_then_text():
    obs = format_observation([passage(1, "Zürich", "Größte Stadt."), passage(2, "Plain", "Text two.")])
    assert obs == "<information>\n[1] Zürich\nGrößte Stadt.\n\n[2] Plain\nText two.\n</information>"


def test_observation_caps_each_passage_exactly():
    cfg = ProtocolConfig(max_passage_chars=100, max_observation_chars=10_000)
    obs = format_observation([passage(1, "Long", "y" * 500), passage(2, "Short", "z" * 100)], cfg)
    first, second = obs.removeprefix("<information>\n").removesuffix("\n</information>").split("\n\n")
    assert first == "[1] Long\n" + "y" * 99 + ELLIPSIS
    assert second == "[2] Short\n" + "z" * 100  # exactly at the cap: untouched


def test_observation_caps_the_whole_exactly_and_keeps_closing_tag():
    cfg = ProtocolConfig(max_passage_chars=2000, max_observation_chars=4096)
    obs = format_observation([passage(i, f"T{i}", "w" * 1990) for i in range(5)], cfg)
    assert len(obs) == 4096
    assert obs.startswith("<information>\n[1] T0\n") and obs.endswith(ELLIPSIS + "\n</information>")


def test_empty_observation_says_so():
    assert format_observation([]) == "<information>\nNo passages found.\n</information>"


def test_observation_message_is_a_user_turn():
    assert observation_message("<information>x</information>") == {"role": "user", "content": "<information>x</information>"}


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="topk"):
        ProtocolConfig(search=SearchBudget(topk=0))
    with pytest.raises(ValueError, match="max_observation_chars"):
        ProtocolConfig(max_observation_chars=10)


# --------------------------------------------------------------------------- prompts


def test_ranker_prompt_lists_every_candidate_capped_and_states_k():
    cands = [passage(i, f"Title {i}", f"text of passage {i} " + "q" * 1000) for i in range(1, 13)]
    cfg = ProtocolConfig(ranker_passage_chars=80)
    [msg] = ranker_messages("Who founded X?", "X founder", cands, k=4, cfg=cfg)
    content = msg["content"]
    assert msg["role"] == "user"
    for i in range(1, 13):
        assert f"[{i}] Title {i}\ntext of passage {i} " in content
    assert "[13]" not in content and "q" * 80 not in content  # capped at 80 characters per candidate
    assert "Who founded X?" in content and "X founder" in content
    assert "exactly 4 different passage numbers between 1 and 12" in content
    example = content.split("<rerank>")[1].split("</rerank>")[0]  # the shown example itself parses
    assert parse_ranking(f"<reason>r</reason><rerank>{example}</rerank>", 12, 4).valid


def test_ranker_prompt_example_fits_few_candidates():
    [msg] = ranker_messages("q", "s", [passage(i, "t", "x") for i in range(2)], k=2)
    assert "<rerank>[1] > [2]</rerank>" in msg["content"]
    with pytest.raises(ValueError, match="k=3 with 2 candidates"):
        ranker_messages("q", "s", [passage(i, "t", "x") for i in range(2)], k=3)


def test_agent_prompt_states_protocol_and_limits_and_its_example_parses():
    cfg = ProtocolConfig(search=SearchBudget(max_searches=3, topk=4))
    [msg] = agent_messages("  Who founded Brindlewick Press? ", cfg)
    content = msg["content"]
    assert msg["role"] == "user" and content.endswith("Question: Who founded Brindlewick Press?")
    assert "at most 3 times" in content and "top 4 passages" in content
    assert '<tool_call>{"name": "search", "arguments": {"query": "your search query"}}</tool_call>' in content
    turns = content.split("Your turn:\n")[1:]
    first = turns[0].split("\nNext message:")[0]
    second = turns[1].split("\n\nNow the real question.")[0]
    assert parse_agent_turn(first).kind == "search" and parse_agent_turn(second).answer == "1874"


def test_agent_prompt_without_worked_example_is_shorter_and_keeps_the_rules():
    full = agent_messages("Q?", ProtocolConfig())[0]["content"]
    bare = agent_messages("Q?", ProtocolConfig(worked_example=False))[0]["content"]
    assert "Harrowgate" in full and "Harrowgate" not in bare and "Now the real question" not in bare
    assert bare.endswith("Answer as soon as the passages tell you the answer.\n\nQuestion: Q?")
    assert len(bare) < len(full) - 300


def test_agent_prompt_can_use_a_system_message():
    msgs = agent_messages("Q?", ProtocolConfig(instructions_in_system=True))
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == "Question: Q?"


# --------------------------------------------------------------------------- token-level chat assembly

# A Llama-3-style template we wrote: header tokens, content trimmed, <|eot_id|> closes every turn.
LLAMA_STYLE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# A template that drops the reasoning of past assistant turns (like Qwen3's): not prefix-stable.
REWRITING = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'][:5] }}{% else %}{{ m['content'] }}{% endif %}"
    "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}"
)


@pytest.fixture(scope="module")
def smol() -> ChatTokens:
    return ChatTokens(load_tokenizer("smollm2-135m-instruct"))


def minilm_with_template(template: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model("all-minilm-l6-v2").path)
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def llama_style() -> ChatTokens:
    return ChatTokens(minilm_with_template(LLAMA_STYLE))


def test_smollm2_end_of_turn_and_agent_prompt_rendering(smol):
    assert smol.end_of_turn_id == smol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = smol.prompt_ids(agent_messages("Who founded Brindlewick Press?"))
    text = smol.decode(ids)
    assert text.count("<|im_start|>user\n") == 1
    assert text.endswith("Who founded Brindlewick Press?<|im_end|>\n<|im_start|>assistant\n")
    assert '"arguments": {"query": "your search query"}' in text


def test_smollm2_observation_segment_is_the_template_difference(smol):
    obs = "<information>\n[1] T\ntext\n</information>"
    tail = f"\n<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
    assert smol.observation_text(obs, generated_ended_with_eos=False) == "<|im_end|>" + tail
    assert smol.observation_text(obs, generated_ended_with_eos=True) == tail


def conversation_equality(ct: ChatTokens, ended: bool) -> tuple[list[int], list[int]]:
    """(pieces, whole): prompt + gen + observation + gen + observation + gen, and the template's one-go ids."""
    turn1 = REASON + "\n" + call()
    turn2 = "<reason>Now the place.</reason>\n" + call("Ada Quill birthplace")
    turn3 = "<reason>Passage [1] says Veldin.</reason>\n<answer>Veldin</answer>"
    obs1 = format_observation([passage(1, "Brindlewick Press", "Founded in 1901 by Ada Quill.")])
    obs2 = format_observation([passage(1, "Ada Quill", "Born in Veldin, 1870. Résumé: «printer».")])
    messages = agent_messages("Where was the founder of Brindlewick Press born?")
    eot = [ct.end_of_turn_id] if ended else []

    pieces = ct.prompt_ids(messages)
    for gen, obs in ((turn1, obs1), (turn2, obs2)):
        pieces += ct.encode(gen) + eot + ct.observation_ids(obs, generated_ended_with_eos=ended)
    pieces += ct.encode(turn3) + [ct.end_of_turn_id]

    full = messages + [
        {"role": "assistant", "content": turn1}, observation_message(obs1),
        {"role": "assistant", "content": turn2}, observation_message(obs2),
        {"role": "assistant", "content": turn3},
    ]
    return pieces, ct.encode(ct.render(full, add_generation_prompt=False))


@pytest.mark.parametrize("ended", [False, True])
@pytest.mark.parametrize("which", ["smol", "llama_style"])
def test_pieces_equal_template_rendering_in_one_go(which, ended, request):
    ct = request.getfixturevalue(which)
    pieces, whole = conversation_equality(ct, ended)
    assert whole[: len(pieces)] == pieces
    assert ct.decode(whole[len(pieces) :]).strip() == ""  # at most the template's trailing newline


def test_llama_style_template_is_understood(llama_style):
    assert llama_style.end_of_turn_id == llama_style.tokenizer.convert_tokens_to_ids("<|eot_id|>")
    seg = llama_style.observation_text("  <information>x</information>\n", generated_ended_with_eos=False)
    # content is trimmed by this template, and the segment follows its header layout
    user, assistant = "<|start_header_id|>user<|end_header_id|>\n\n", "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert seg == f"<|eot_id|>{user}<information>x</information><|eot_id|>{assistant}"


def test_prefix_unstable_template_is_refused():
    with pytest.raises(TemplateError, match="prefix-stable"):
        ChatTokens(minilm_with_template(REWRITING))


def test_tokenizer_without_template_is_refused():
    tok = minilm_with_template(LLAMA_STYLE)
    tok.chat_template = None
    with pytest.raises(TemplateError, match="no chat_template"):
        ChatTokens(tok)
