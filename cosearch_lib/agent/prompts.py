"""Prompts of the tag protocol (docs/METHOD.md, "Tag protocol"), as chat messages.

The agent prompt (``agent_messages``), the ranker prompt (``ranker_messages``) and the prompts of
the one-generation baselines (``direct_messages``, ``cot_messages``, ``rag_messages``) are chat
messages, so the tokenizer's own template renders them and any instruct model works; the wording is
ours. ``format_observation`` renders the K passages the agent reads, numbered and capped
(``ProtocolConfig``: released code caps 2,000 characters per passage, 4,096 per observation). K and
the search cap stated in the prompts come from the profile's one ``SearchBudget``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from cosearch_lib.config import OBSERVATION_CLOSE, OBSERVATION_OPEN, ProtocolConfig
from cosearch_lib.data.passage import Passage

#: Marks a truncated passage or observation (one character, so caps stay exact).
ELLIPSIS = "…"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when anything was cut.

    Python strings index code points, so no cut lands inside a multi-byte UTF-8 sequence; the cut
    also steps back over combining marks and joiners, so an accent is never split from its letter.
    """
    if len(text) <= limit:
        return text
    cut = max(limit - len(ELLIPSIS), 0)
    while cut > 0 and _continues_cluster(text[cut]):
        cut -= 1
    return text[:cut].rstrip() + ELLIPSIS


def _continues_cluster(ch: str) -> bool:
    """Whether ``ch`` attaches to the character before it (combining mark, joiner, variation selector)."""
    return unicodedata.category(ch) in {"Mn", "Mc", "Me"} or ch in "\u200d\u200c" or 0xFE00 <= ord(ch) <= 0xFE0F


def _passage_block(i: int, passage: Passage, cap: int) -> str:
    """``[i] title`` on one line, then the text; the text is what gets capped (the title is short)."""
    return f"[{i}] {passage.title}\n{truncate(passage.text.strip(), cap)}"


def format_observation(passages: Sequence[Passage], cfg: ProtocolConfig | None = None) -> str:
    """The K passages the agent reads, numbered, each capped, the whole capped, in ``<information>``.

    ``len(result) <= cfg.max_observation_chars`` including the tags, so the closing tag always
    survives the cap (the released code caps at 2,000 + "..." per passage and truncates the tool
    response; our per-passage cap includes the ellipsis, so both caps are exact upper bounds).
    """
    cfg = cfg or ProtocolConfig()
    if not passages:
        body = "No passages found."
    else:
        body = "\n\n".join(_passage_block(i, p, cfg.max_passage_chars) for i, p in enumerate(passages, 1))
    room = cfg.max_observation_chars - len(OBSERVATION_OPEN) - len(OBSERVATION_CLOSE)
    return OBSERVATION_OPEN + truncate(body, room) + OBSERVATION_CLOSE


def observation_message(text: str) -> dict[str, str]:
    """The observation as a chat message.

    Role ``user`` rather than ``tool``: not every chat template has a tool role (SmolLM2's renders
    any role name verbatim, Gemma's and Mistral's raise on unknown roles), and a user turn is what
    Search-R1-style agents see in their prompts.
    """
    return {"role": "user", "content": text}


# --------------------------------------------------------------------------- prompts

_AGENT_RULES = """\
You answer questions by searching a document collection. You work in turns. In every turn, first \
think inside <reason> and </reason>, then take exactly one action:
- search: <tool_call>{{"name": "search", "arguments": {{"query": "your search query"}}}}</tool_call>
  The top {k} passages come back in the next message, numbered, inside <information> and </information>.
- answer: <answer>the answer</answer>
  The answer is a short span: a name, a date, a number or a few words, never a sentence.

Rules:
- Write nothing outside the tags, and only one action per turn.
- Search for one fact at a time; you may search at most {max_searches} times.
- Trust the passages, not your memory: the collection may describe things you have never heard of.
- Answer as soon as the passages tell you the answer."""

_EXAMPLE_QUESTION = "In which year was the Harrowgate Lighthouse first lit?"
_EXAMPLE_PASSAGE = Passage(
    id="example",
    contents='"Harrowgate Lighthouse"\nThe Harrowgate Lighthouse stands on the northern cape of Veldin Island. '
    "It was first lit in 1874 and was automated a century later.",
)
_EXAMPLE_TURN_1 = (
    "<reason>I do not know when this lighthouse was first lit, so I search for it.</reason>\n"
    '<tool_call>{"name": "search", "arguments": {"query": "Harrowgate Lighthouse first lit"}}</tool_call>'
)
_EXAMPLE_TURN_2 = "<reason>Passage [1] says it was first lit in 1874.</reason>\n<answer>1874</answer>"


def _agent_example(cfg: ProtocolConfig) -> str:
    """One worked search turn and answer turn, with the observation exactly as the agent will see it."""
    observation = format_observation([_EXAMPLE_PASSAGE], cfg)
    return (
        f"Example (a made-up question):\nQuestion: {_EXAMPLE_QUESTION}\n"
        f"Your turn:\n{_EXAMPLE_TURN_1}\nNext message:\n{observation}\nYour turn:\n{_EXAMPLE_TURN_2}"
    )


def agent_messages(question: str, cfg: ProtocolConfig | None = None) -> list[dict[str, str]]:
    """The agent's opening messages for ``question``: protocol, one worked example (unless
    ``cfg.worked_example`` is off), the question."""
    cfg = cfg or ProtocolConfig()
    rules = _AGENT_RULES.format(k=cfg.search.topk, max_searches=cfg.search.max_searches)
    instructions = f"{rules}\n\n{_agent_example(cfg)}" if cfg.worked_example else rules
    ask = f"Question: {question.strip()}"
    if cfg.instructions_in_system:
        return [{"role": "system", "content": instructions}, {"role": "user", "content": ask}]
    lead = "\n\nNow the real question.\n" if cfg.worked_example else "\n\n"
    return [{"role": "user", "content": f"{instructions}{lead}{ask}"}]


_RANKER_TASK = """\
You help a search assistant that is answering a question step by step. It just searched, and the \
search engine returned {n} candidate passages. Choose the {k} passages that best help with the \
current search query, in service of the original question, and order them from most to least useful.

Original question: {q0}
Current search query: {sub_query}

Candidate passages:
{candidates}

Reply in exactly this form, with nothing outside the tags:
<reason>a short explanation of your choice</reason>
<rerank>{example}</rerank>
The <rerank> list must hold exactly {k} different passage numbers between 1 and {n}, separated by " > ", \
most useful first."""

#: Numbers used to show the ranking syntax; shuffled-looking so the example does not suggest "keep the order".
_EXAMPLE_ORDER = (3, 1, 7, 2, 5, 4, 9, 6, 10, 8)


def _ranking_example(k: int, n: int) -> str:
    """A syntactically valid ranking of length ``k`` over ``n`` candidates, to show the form."""
    picks = [i for i in _EXAMPLE_ORDER if i <= n][:k]
    picks += [i for i in range(1, n + 1) if i not in picks][: k - len(picks)]
    return " > ".join(f"[{i}]" for i in picks)


def ranker_messages(
    q0: str, sub_query: str, candidates: Sequence[Passage], k: int, cfg: ProtocolConfig | None = None
) -> list[dict[str, str]]:
    """The ranker's prompt: q0, the sub-query, the N numbered candidates, and the output form."""
    cfg = cfg or ProtocolConfig()
    n = len(candidates)
    if not 1 <= k <= n:
        raise ValueError(f"ranker needs 1 <= k <= number of candidates, got k={k} with {n} candidates")
    listing = "\n\n".join(_passage_block(i, p, cfg.ranker_passage_chars) for i, p in enumerate(candidates, 1))
    content = _RANKER_TASK.format(
        n=n, k=k, q0=q0.strip(), sub_query=sub_query.strip(), candidates=listing, example=_ranking_example(k, n)
    )
    return [{"role": "user", "content": content}]


# Probe strings: plain words no template rewrites, unlikely to merge with neighbouring tokens.


# --------------------------------------------------------------------------- baseline prompts (direct, CoT, RAG)

_SHORT_ANSWER = "The answer is a short span: a name, a date, a number or a few words, never a sentence."

# Each baseline prompt states the task, then the reply's form. With ``example=True`` the form shows
# a made-up reply (the model writes every tag itself); without, it only names the tags: the harness
# then starts the reply for the model (``eval.harness``, ``baseline_reply: prefilled``), and a small
# model shown an example answer copies it (measured: "1874" for most questions).
_DIRECT_TASK = "Answer the question from what you know. {short}"
_COT_TASK = "Answer the question from what you know. {short}"
_RAG_TASK = "Answer the question with the help of the passages below; trust them over your memory. {short}"
_ANSWER_FORM = ("Reply with the answer inside <answer> and </answer> and write nothing else, for example:\n"
                "<answer>1874</answer>")
_ANSWER_FORM_PLAIN = "Reply with the answer inside <answer> and </answer> and write nothing else."
_COT_FORM = ("First think it through step by step inside <reason> and </reason>, then give the answer inside "
             "<answer> and </answer>. Write nothing outside the tags, for example:\n"
             "<reason>The lighthouse was built in 1872 and first lit two years later, in 1874.</reason>\n"
             "<answer>1874</answer>")
_COT_FORM_PLAIN = ("First think it through step by step inside <reason> and </reason>, then give the answer inside "
                   "<answer> and </answer>. Write nothing outside the tags.")


def direct_messages(question: str, *, example: bool = True) -> list[dict[str, str]]:
    """Direct-inference baseline: the question alone, answer only (``example``: show a sample reply)."""
    form = _ANSWER_FORM if example else _ANSWER_FORM_PLAIN
    content = f"{_DIRECT_TASK.format(short=_SHORT_ANSWER)}\n{form}\n\nQuestion: {question.strip()}"
    return [{"role": "user", "content": content}]


def cot_messages(question: str, *, example: bool = True) -> list[dict[str, str]]:
    """Chain-of-thought baseline: one ``<reason>`` block, then the answer (``example``: show a sample reply)."""
    form = _COT_FORM if example else _COT_FORM_PLAIN
    content = f"{_COT_TASK.format(short=_SHORT_ANSWER)} {form}\n\nQuestion: {question.strip()}"
    return [{"role": "user", "content": content}]


def rag_messages(question: str, passages: Sequence[Passage], cfg: ProtocolConfig | None = None, *,
                 example: bool = True) -> list[dict[str, str]]:
    """RAG baseline: the passages retrieved for the question, laid out (and capped) exactly as an
    agent observation, then the question; answer only (``example``: show a sample reply)."""
    form = _ANSWER_FORM if example else _ANSWER_FORM_PLAIN
    content = (f"{_RAG_TASK.format(short=_SHORT_ANSWER)}\n{form}\n\n{format_observation(passages, cfg)}\n\n"
               f"Question: {question.strip()}")
    return [{"role": "user", "content": content}]
