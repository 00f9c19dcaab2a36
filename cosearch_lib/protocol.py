"""The tag protocol between the agent, the ranker and the search tool (PAPER_NOTES section 2).

Four parts, each usable on its own:

* **Prompts** as chat messages (``agent_messages``, ``ranker_messages``), so the tokenizer's own
  chat template renders them and any instruct model works. The wording is ours.
* **Observations** (``format_observation``): the K passages the agent reads, numbered, capped.
* **Strict parsers** (``parse_agent_turn``, ``parse_ranking``): they return the parsed action and a
  format flag with a short machine-readable error. They forgive whitespace but never a wrong
  protocol, because the format flag *is* the reward's f (paper Eq. 4): a lenient parser would
  pay the policy for malformed turns.
* **Token-level assembly** (``ChatTokens``): the rollout engine appends generated ids and
  observation ids without ever re-tokenising generated text, so the ids it trains on are exactly
  the ids the policy sampled; ``ChatTokens`` derives the ids between two generations from the
  chat template itself and checks that the template allows this.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .retrieval.base import Passage

#: End-of-turn strings a caller may leave on generated text; the parsers ignore one trailing copy.
DEFAULT_END_MARKERS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>")
#: Marks a truncated passage or observation (one character, so caps stay exact).
ELLIPSIS = "…"


@dataclass
class ProtocolConfig:
    topk: int = 5  # K: passages in each observation / indices in each ranking (paper: 5)
    max_passage_chars: int = 2000  # cap on one passage the agent reads (released code: 2,000)
    max_observation_chars: int = 4096  # cap on a whole observation, tags included (released code: 4,096)
    ranker_passage_chars: int = 600  # cap on one candidate in the ranker prompt; CPU budget: the paper shows whole passages
    max_search_turns: int = 6  # searches allowed per trajectory, stated in the agent prompt (paper: 6)
    instructions_in_system: bool = False  # put the instructions in a system message (some templates, e.g. Gemma's, reject one)
    worked_example: bool = True  # show one worked search/answer example in the agent prompt (~150 tokens; a warm-started agent needs none)

    def __post_init__(self) -> None:
        for name in ("topk", "max_passage_chars", "max_observation_chars", "ranker_passage_chars", "max_search_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProtocolConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_observation_chars < len(_OBS_OPEN) + len(_OBS_CLOSE) + 1:
            raise ValueError(f"ProtocolConfig.max_observation_chars={self.max_observation_chars} cannot hold the <information> tags")


# --------------------------------------------------------------------------- truncation and observations

_OBS_OPEN, _OBS_CLOSE = "<information>\n", "\n</information>"


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
    room = cfg.max_observation_chars - len(_OBS_OPEN) - len(_OBS_CLOSE)
    return _OBS_OPEN + truncate(body, room) + _OBS_CLOSE


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
    rules = _AGENT_RULES.format(k=cfg.topk, max_searches=cfg.max_search_turns)
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


# --------------------------------------------------------------------------- tag scanning

@dataclass(frozen=True)
class _Block:
    tag: str
    content: str


def _strip_end_marker(text: str, strip_suffixes: Sequence[str]) -> str:
    """Whitespace-trimmed text without one trailing end-of-turn marker (the caller may leave it on)."""
    text = text.strip()
    for suffix in strip_suffixes:
        if suffix and text.endswith(suffix):
            return text[: -len(suffix)].rstrip()
    return text


def _scan(text: str, tags: Sequence[str]) -> tuple[list[_Block], str, str | None]:
    """Split ``text`` into top-level ``<tag>...</tag>`` blocks and the text outside them.

    Returns ``(blocks, outside, error)``; error is "nested_tags", "mismatched_tag",
    "stray_close_tag" or "unclosed_tag" when the tags do not pair up flatly.
    """
    pattern = re.compile(r"<(/?)(" + "|".join(map(re.escape, tags)) + r")>")
    blocks: list[_Block] = []
    outside: list[str] = []
    open_tag, open_end, pos = None, 0, 0
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if not closing:
            if open_tag is not None:
                return blocks, "".join(outside), "nested_tags"
            outside.append(text[pos : m.start()])
            open_tag, open_end = tag, m.end()
        elif open_tag is None:
            return blocks, "".join(outside), "stray_close_tag"
        elif tag != open_tag:
            return blocks, "".join(outside), "mismatched_tag"
        else:
            blocks.append(_Block(tag, text[open_end : m.start()]))
            open_tag, pos = None, m.end()
    if open_tag is not None:
        return blocks, "".join(outside), "unclosed_tag"
    outside.append(text[pos:])
    return blocks, "".join(outside), None


def _reason_first(blocks: list[_Block]) -> str | None:
    """The shared rule of both protocols: exactly one non-empty reason block, and it comes first."""
    reasons = [b for b in blocks if b.tag == "reason"]
    if not reasons:
        return "missing_reason"
    if len(reasons) > 1:
        return "multiple_reasons"
    if blocks[0].tag != "reason":
        return "wrong_order"
    if not reasons[0].content.strip():
        return "empty_reason"
    return None


# --------------------------------------------------------------------------- agent turns

@dataclass(frozen=True)
class AgentAction:
    """One parsed agent turn. ``kind`` is "invalid" exactly when ``format_ok`` is False."""

    kind: str  # "search", "answer" or "invalid"
    reason: str | None = None  # the reasoning text, stripped, when a reason block was found
    query: str | None = None  # the search query (kind "search")
    answer: str | None = None  # the answer span (kind "answer")
    format_ok: bool = False  # the turn follows the protocol exactly (the reward's f)
    error: str | None = None  # short machine-readable reason when format_ok is False

    @property
    def is_search(self) -> bool:
        return self.kind == "search"

    @property
    def is_answer(self) -> bool:
        return self.kind == "answer"


_AGENT_TAGS = ("reason", "tool_call", "answer", "information")


def parse_agent_turn(text: str, strip_suffixes: Sequence[str] = DEFAULT_END_MARKERS) -> AgentAction:
    """Parse one agent turn: ``<reason>..</reason>`` then one ``<tool_call>`` or one ``<answer>``.

    Whitespace around and between tags, and inside the JSON, is fine; anything else is an invalid
    turn with an error code: no_tags, nested_tags, mismatched_tag, stray_close_tag, unclosed_tag,
    information_tag (the model wrote search results itself), extra_text, missing_reason,
    multiple_reasons, wrong_order, empty_reason, no_action, multiple_actions, bad_json, wrong_tool,
    extra_arguments, bad_arguments, missing_query, empty_answer.
    """
    body = _strip_end_marker(text, strip_suffixes)
    blocks, outside, error = _scan(body, _AGENT_TAGS)
    if error is None and not blocks:
        error = "no_tags"
    if error is None and any(b.tag == "information" for b in blocks):
        error = "information_tag"
    if error is None and outside.strip():
        error = "extra_text"
    reason = next((b.content.strip() for b in blocks if b.tag == "reason"), None)
    if error is None:
        error = _reason_first(blocks)
    actions = [b for b in blocks if b.tag in ("tool_call", "answer")]
    if error is None and not actions:
        error = "no_action"
    if error is None and len(actions) > 1:
        error = "multiple_actions"
    if error is not None:
        return AgentAction("invalid", reason=reason, error=error)
    action = actions[0]
    if action.tag == "answer":
        answer = action.content.strip()
        if not answer:
            return AgentAction("invalid", reason=reason, error="empty_answer")
        return AgentAction("answer", reason=reason, answer=answer, format_ok=True)
    query, error = _parse_tool_call(action.content)
    if error is not None:
        return AgentAction("invalid", reason=reason, query=query, error=error)
    return AgentAction("search", reason=reason, query=query, format_ok=True)


def _parse_tool_call(payload: str) -> tuple[str | None, str | None]:
    """``{"name": "search", "arguments": {"query": "..."}}`` -> (query, None), else (None, error)."""
    try:
        call = json.loads(payload)
    except json.JSONDecodeError:
        return None, "bad_json"
    if not isinstance(call, dict):
        return None, "bad_json"
    if call.get("name") != "search":
        return None, "wrong_tool"
    if set(call) - {"name", "arguments"}:
        return None, "extra_arguments"
    arguments = call.get("arguments")
    if arguments is None:
        return None, "missing_query"
    if not isinstance(arguments, dict):  # e.g. OpenAI-style arguments given as a JSON string
        return None, "bad_arguments"
    if set(arguments) - {"query"}:
        return None, "extra_arguments"
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return None, "missing_query"
    return query.strip(), None


# --------------------------------------------------------------------------- ranker output

@dataclass(frozen=True)
class RankerOutput:
    """One parsed ranking. ``order`` holds 0-based candidate indices, most useful first."""

    order: list[int]  # length k when valid, empty otherwise
    reason: str | None = None  # the reasoning text, stripped, when a reason block was found
    valid: bool = False  # the output follows the protocol exactly
    error: str | None = None  # short machine-readable reason when valid is False


_RANK_TAGS = ("reason", "rerank")
_CHAIN = re.compile(r"\[\s*(\d+)\s*\](?:\s*>\s*\[\s*(\d+)\s*\])*")
_INDEX = re.compile(r"\[\s*(\d+)\s*\]")


def parse_ranking(
    text: str, n_candidates: int, k: int, strip_suffixes: Sequence[str] = DEFAULT_END_MARKERS
) -> RankerOutput:
    """Parse ``<reason>..</reason><rerank>[i1] > ... > [ik]</rerank>`` against N candidates.

    Error codes: no_tags, nested_tags, mismatched_tag, stray_close_tag, unclosed_tag, extra_text,
    missing_reason, multiple_reasons, wrong_order, empty_reason, missing_rerank, multiple_rerank,
    bad_syntax, out_of_range, duplicate_index, too_few, too_many (checked in that order).
    """
    if not 1 <= k <= n_candidates:
        raise ValueError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
    body = _strip_end_marker(text, strip_suffixes)
    blocks, outside, error = _scan(body, _RANK_TAGS)
    reason = next((b.content.strip() for b in blocks if b.tag == "reason"), None)
    if error is None and not blocks:
        error = "no_tags"
    if error is None and outside.strip():
        error = "extra_text"
    if error is None:
        error = _reason_first(blocks)
    ranks = [b for b in blocks if b.tag == "rerank"]
    if error is None and len(ranks) != 1:
        error = "missing_rerank" if not ranks else "multiple_rerank"
    if error is None:
        order, error = _parse_chain(ranks[0].content, n_candidates, k)
        if error is None:
            return RankerOutput(order, reason=reason, valid=True)
    return RankerOutput([], reason=reason, error=error)


def _parse_chain(chain: str, n: int, k: int) -> tuple[list[int], str | None]:
    """``"[3] > [1]"`` -> ([2, 0], None) after the syntax, range, duplicate and length checks."""
    chain = chain.strip()
    if not chain:
        return [], "too_few"
    if not _CHAIN.fullmatch(chain):
        return [], "bad_syntax"
    picks = [int(i) for i in _INDEX.findall(chain)]
    if any(not 1 <= i <= n for i in picks):
        return [], "out_of_range"
    if len(set(picks)) != len(picks):
        return [], "duplicate_index"
    if len(picks) != k:
        return [], "too_few" if len(picks) < k else "too_many"
    return [i - 1 for i in picks], None


# --------------------------------------------------------------------------- token-level chat assembly

class TemplateError(ValueError):
    """A chat template that token-level assembly cannot follow exactly."""


# Probe strings: plain words no template rewrites, unlikely to merge with neighbouring tokens.
_PROBE_USER, _PROBE_ASSISTANT, _PROBE_OBS = "probe question", "probe answer one", "probe observation one"
_PROBE_ASSISTANT_2, _PROBE_OBS_2 = "probe answer two", "probe observation two"


@dataclass(frozen=True)
class _Segments:
    """The template text around an observation: ``close`` + observation + ``after``."""

    close: str  # from the end of the assistant's content to the start of the observation content
    after: str  # from the end of the observation content through the next assistant header
    strips_content: bool  # the template trims message content (Llama-3 style ``| trim``)


class ChatTokens:
    """Exact token ids of a multi-turn chat, built without re-tokenising generated text.

    The rollout engine keeps ``prompt_ids(messages)`` + generated ids + ``observation_ids(...)`` +
    generated ids + ...; that list equals the template's rendering of the whole conversation,
    tokenised in one go, whenever the generated text is what the template would have placed there
    (templates that trim message content would also trim trailing whitespace the model wrote).
    The constructor derives the observation segment from the template and checks on probe
    conversations that (a) later turns never rewrite earlier ones (prefix stability; templates that
    drop past reasoning, like Qwen3's, fail this) and (b) tokenising the pieces separately gives the
    same ids as tokenising the whole (BPE tokenizers with special tokens at turn boundaries pass).
    """

    def __init__(self, tokenizer: Any, *, end_of_turn_token: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"{type(tokenizer).__name__} has no chat_template; set tokenizer.chat_template first")
        self.tokenizer = tokenizer
        self._seg = self._derive_segments()
        self.end_of_turn_id = self._end_of_turn(end_of_turn_token)
        self._eot_text = tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        self._check_token_boundaries()

    # -- public API

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        """The chat template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text; special tokens come from the text itself, none are added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of ``messages`` rendered with the generation prompt (the assistant header) at the end."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_text(self, observation_text: str, *, generated_ended_with_eos: bool) -> str:
        """The template text to append after an assistant turn: close it, the observation, next header."""
        close = self._seg.close
        if generated_ended_with_eos:
            if not close.startswith(self._eot_text):
                raise TemplateError(
                    f"the template closes an assistant turn with {close!r}, not with the end-of-turn token "
                    f"{self._eot_text!r}; pass the right end_of_turn_token to ChatTokens"
                )
            close = close[len(self._eot_text) :]
        content = observation_text.strip() if self._seg.strips_content else observation_text
        return close + content + self._seg.after

    def observation_ids(self, observation_text: str, *, generated_ended_with_eos: bool) -> list[int]:
        """Ids to append after the generated ids of an agent turn (never trained on: loss mask 0)."""
        return self.encode(self.observation_text(observation_text, generated_ended_with_eos=generated_ended_with_eos))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept (so turn boundaries stay visible)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # -- derivation and checks

    def _derive_segments(self) -> _Segments:
        """Render probe conversations with and without observations and take the differences."""
        base = [{"role": "user", "content": _PROBE_USER}]
        prompt = self.render(base, add_generation_prompt=True)
        one = self.render(base + self._round(_PROBE_ASSISTANT, _PROBE_OBS), add_generation_prompt=True)
        close, after = self._split_round(prompt, one)
        two = self.render(
            base + self._round(_PROBE_ASSISTANT, _PROBE_OBS) + self._round(_PROBE_ASSISTANT_2, _PROBE_OBS_2),
            add_generation_prompt=True,
        )
        if two != one + _PROBE_ASSISTANT_2 + close + _PROBE_OBS_2 + after:
            raise TemplateError(
                "chat template is not prefix-stable: a second observation round does not render as the first "
                "round plus the same segment (the template rewrites earlier turns or treats rounds differently)"
            )
        padded = self.render(base + self._round(_PROBE_ASSISTANT, f"  {_PROBE_OBS}\n"), add_generation_prompt=True)
        if f"  {_PROBE_OBS}\n" in padded:
            strips = False
        elif padded == one:
            strips = True
        else:
            raise TemplateError("chat template transforms message content in a way other than trimming whitespace")
        return _Segments(close, after, strips)

    @staticmethod
    def _round(assistant: str, observation: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": assistant}, observation_message(observation)]

    @staticmethod
    def _split_round(prompt: str, rendered: str) -> tuple[str, str]:
        """``rendered`` = prompt + assistant probe + close + observation probe + after -> (close, after)."""
        head = prompt + _PROBE_ASSISTANT
        if not rendered.startswith(head):
            raise TemplateError(
                "chat template is not prefix-stable: adding an assistant turn and an observation changed the "
                f"rendered prompt or the assistant's content.\nprompt: {prompt!r}\nrendered: {rendered!r}"
            )
        rest = rendered[len(head) :]
        if rest.count(_PROBE_OBS) != 1:
            raise TemplateError(f"chat template does not render the observation verbatim once: {rest!r}")
        close, _, after = rest.partition(_PROBE_OBS)
        return close, after

    def _end_of_turn(self, token: str | None) -> int:
        """The id that ends an assistant turn: given, else the template's first closing token, else eos."""
        tok = self.tokenizer
        if token is not None:
            ids = self.encode(token)
            if len(ids) != 1:
                raise TemplateError(f"end_of_turn_token {token!r} is not a single token (ids {ids})")
            return ids[0]
        close_ids = self.encode(self._seg.close)
        if close_ids and close_ids[0] in set(tok.all_special_ids):
            return close_ids[0]
        if tok.eos_token_id is None:
            raise TemplateError("cannot tell the end-of-turn token; pass end_of_turn_token=")
        return tok.eos_token_id

    def _check_token_boundaries(self) -> None:
        """Pieces tokenised separately must equal the whole tokenised at once, in both eos cases."""
        messages = [{"role": "user", "content": _PROBE_USER}]
        full = self.encode(
            self.render(messages + self._round(_PROBE_ASSISTANT, _PROBE_OBS), add_generation_prompt=True)
        )
        generated = self.encode(_PROBE_ASSISTANT)
        for ended in (False, True):
            gen = generated + [self.end_of_turn_id] if ended else generated
            pieces = self.prompt_ids(messages) + gen + self.observation_ids(_PROBE_OBS, generated_ended_with_eos=ended)
            if pieces != full:
                raise TemplateError(
                    f"tokenising the chat in pieces differs from tokenising it whole (generated_ended_with_eos={ended}); "
                    "this tokenizer is not boundary-stable at turn edges"
                )


# --------------------------------------------------------------------------- baseline prompts (direct, CoT, RAG)

_SHORT_ANSWER = "The answer is a short span: a name, a date, a number or a few words, never a sentence."

_DIRECT_TASK = """\
Answer the question from what you know. {short}
Reply with the answer inside <answer> and </answer> and write nothing else, for example:
<answer>1874</answer>

Question: {question}"""

_COT_TASK = """\
Answer the question from what you know. First think it through step by step inside <reason> and \
</reason>, then give the answer inside <answer> and </answer>. {short} Write nothing outside the \
tags, for example:
<reason>The lighthouse was built in 1872 and first lit two years later, in 1874.</reason>
<answer>1874</answer>

Question: {question}"""

_RAG_TASK = """\
Answer the question with the help of the passages below; trust them over your memory. {short}
Reply with the answer inside <answer> and </answer> and write nothing else, for example:
<answer>1874</answer>

{observation}

Question: {question}"""


def direct_messages(question: str) -> list[dict[str, str]]:
    """Direct-inference baseline: the question alone, answer only."""
    return [{"role": "user", "content": _DIRECT_TASK.format(short=_SHORT_ANSWER, question=question.strip())}]


def cot_messages(question: str) -> list[dict[str, str]]:
    """Chain-of-thought baseline: one ``<reason>`` block, then the answer."""
    return [{"role": "user", "content": _COT_TASK.format(short=_SHORT_ANSWER, question=question.strip())}]


def rag_messages(question: str, passages: Sequence[Passage], cfg: ProtocolConfig | None = None) -> list[dict[str, str]]:
    """RAG baseline: the passages retrieved for the question, laid out (and capped) exactly as an
    agent observation, then the question; answer only."""
    observation = format_observation(passages, cfg)
    return [{"role": "user", "content": _RAG_TASK.format(short=_SHORT_ANSWER, observation=observation,
                                                         question=question.strip())}]


@dataclass(frozen=True)
class AnswerOnly:
    """One parsed baseline reply; unpacks as ``answer, format_ok, error``."""

    answer: str | None  # the answer span when format_ok, else None
    format_ok: bool
    error: str | None  # short machine-readable reason when format_ok is False

    def __iter__(self):
        return iter((self.answer, self.format_ok, self.error))


def parse_answer_only(text: str, strip_suffixes: Sequence[str] = DEFAULT_END_MARKERS) -> AnswerOnly:
    """Parse a baseline reply: an optional ``<reason>..</reason>`` first, then one ``<answer>..</answer>``.

    As strict as :func:`parse_agent_turn` (whitespace around tags is fine, nothing else outside
    them). Error codes: no_tags, nested_tags, mismatched_tag, stray_close_tag, unclosed_tag,
    extra_text, multiple_reasons, wrong_order, empty_reason, missing_answer, multiple_answers,
    empty_answer.
    """
    blocks, outside, error = _scan(_strip_end_marker(text, strip_suffixes), ("reason", "answer"))
    answers = [b for b in blocks if b.tag == "answer"]
    reasons = [b for b in blocks if b.tag == "reason"]
    if error is None and not blocks:
        error = "no_tags"
    if error is None and outside.strip():
        error = "extra_text"
    if error is None and len(reasons) > 1:
        error = "multiple_reasons"
    if error is None and reasons and blocks[0].tag != "reason":
        error = "wrong_order"
    if error is None and reasons and not reasons[0].content.strip():
        error = "empty_reason"
    if error is None and len(answers) != 1:
        error = "missing_answer" if not answers else "multiple_answers"
    if error is None and not answers[0].content.strip():
        error = "empty_answer"
    if error is not None:
        return AnswerOnly(None, False, error)
    return AnswerOnly(answers[0].content.strip(), True, None)
