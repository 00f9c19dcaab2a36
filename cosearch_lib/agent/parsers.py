"""Parsers of the tag protocol (docs/METHOD.md, "Tag protocol").

``parse_agent_turn`` and ``parse_ranking`` return the parsed action and a format flag with a short
machine-readable error code. By default (``protocol="strict"``, the paper rule set) they forgive
whitespace but never a wrong protocol, because the format flag *is* the reward's f (paper Eq. 4):
a lenient parser would pay the policy for malformed turns. ``protocol="released"`` applies the
authors' released checks instead (the ``released`` rule set, config.RuleSet): the ranker's output
needs exactly one reason block, and only what follows the last ``</reason>`` is checked; an agent
turn's format is the count and order of its tags, and its action is whatever one valid search call
or answer block it holds. The strict protocol ignores one trailing end-of-turn marker
(``DEFAULT_END_MARKERS``); the released one reads the decoded text exactly as given, as the release
does, so a literal ``</s>`` after ``</rerank>`` makes a released ranking invalid.
``parse_answer_only`` reads the one-generation baselines (direct, CoT, RAG).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cosearch_lib.config import RULE_OPTIONS

#: The two protocols (config.RULE_OPTIONS "agent_format" and "ranker_output").
PROTOCOLS = RULE_OPTIONS["agent_format"]

#: End-of-turn strings a caller may leave on generated text; the strict parsers ignore one trailing
#: copy (a model that writes the marker as plain text has still finished its turn). The released
#: parsers strip nothing: the authors' code validates the decoded text as it is.
DEFAULT_END_MARKERS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>")


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


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")


def parse_agent_turn(text: str, strip_suffixes: Sequence[str] = DEFAULT_END_MARKERS, *,
                     protocol: str = "strict") -> AgentAction:
    """Parse one agent turn: ``<reason>..</reason>`` then one ``<tool_call>`` or one ``<answer>``.

    ``protocol="released"``: :func:`parse_agent_turn_released` on ``text`` as given
    (``strip_suffixes`` is not used). Otherwise:

    Whitespace around and between tags, and inside the JSON, is fine; anything else is an invalid
    turn with an error code: no_tags, nested_tags, mismatched_tag, stray_close_tag, unclosed_tag,
    information_tag (the model wrote search results itself), extra_text, missing_reason,
    multiple_reasons, wrong_order, empty_reason, no_action, multiple_actions, bad_json, wrong_tool,
    extra_arguments, bad_arguments, missing_query, empty_answer.
    """
    _check_protocol(protocol)
    if protocol == "released":
        return parse_agent_turn_released(text)
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


_REASON_BLOCK = re.compile(r"<reason>(.*?)</reason>", re.S)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.S)


def _released_tags_error(body: str, action: str) -> str | None:
    """The release's format check of one turn: ``<reason>``, ``</reason>``, ``<action>``, ``</action>``
    each exactly once, in that order, with non-empty (stripped) reason and action contents."""
    tags = ("<reason>", "</reason>", f"<{action}>", f"</{action}>")
    for tag in tags:
        if body.count(tag) != 1:
            return "tag_count"
    at = [body.index(tag) for tag in tags]
    if at != sorted(at):
        return "tag_order"
    if not body[at[0] + len(tags[0]) : at[1]].strip():
        return "empty_reason"
    if not body[at[2] + len(tags[2]) : at[3]].strip():
        return "empty_answer" if action == "answer" else "missing_query"
    return None


def released_answer(texts: Sequence[str]) -> str | None:
    """The release's answer of a trajectory: the last ``<answer>`` block anywhere in its turns, stripped."""
    found = [m for text in texts for m in _ANSWER_BLOCK.findall(text)]
    return found[-1].strip() if found else None


def parse_agent_turn_released(text: str) -> AgentAction:
    """An agent turn as the authors' released loop and reward read it, from the text exactly as given.

    Action: the turn searches when exactly one ``<tool_call>`` block holds valid JSON naming the
    ``search`` tool with a non-empty string query; otherwise the episode ends, and it is an answer
    when an ``<answer>`` block is there (the last one). Format (Eq. 4's f): a searching turn needs
    ``<reason>``, ``</reason>``, ``<tool_call>``, ``</tool_call>`` once each, in that order, with
    non-empty contents; an ending turn the same with ``<answer>``. Text outside the tags, the
    call's JSON and its tool name are not part of the verdict (a bad call simply is not run).
    Error codes: tag_count, tag_order, empty_reason, missing_query, empty_answer, no_action.
    Nothing is stripped first: the verdict counts tags, so a trailing end-of-turn marker changes
    nothing here, but the text is judged as the release judges it.
    """
    reason_match = _REASON_BLOCK.search(text)
    reason = reason_match.group(1).strip() if reason_match else None
    queries = []
    for payload in _TOOL_CALL_BLOCK.findall(text):
        query, error = _parse_tool_call(payload)
        if error is None:
            queries.append(query)
    if len(queries) == 1:
        error = _released_tags_error(text, "tool_call")
        return AgentAction("search", reason=reason, query=queries[0], format_ok=error is None, error=error)
    answers = _ANSWER_BLOCK.findall(text)
    if not answers:
        return AgentAction("invalid", reason=reason, error="no_action")
    error = _released_tags_error(text, "answer")
    return AgentAction("answer", reason=reason, answer=answers[-1].strip(), format_ok=error is None, error=error)


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
    text: str, n_candidates: int, k: int, strip_suffixes: Sequence[str] = DEFAULT_END_MARKERS, *,
    protocol: str = "strict",
) -> RankerOutput:
    """Parse ``<reason>..</reason><rerank>[i1] > ... > [ik]</rerank>`` against N candidates.

    ``protocol="released"``: :func:`parse_ranking_released` on ``text`` as given
    (``strip_suffixes`` is not used). Otherwise:

    Error codes: no_tags, nested_tags, mismatched_tag, stray_close_tag, unclosed_tag, extra_text,
    missing_reason, multiple_reasons, wrong_order, empty_reason, missing_rerank, multiple_rerank,
    bad_syntax, out_of_range, duplicate_index, too_few, too_many (checked in that order).
    """
    _check_protocol(protocol)
    if not 1 <= k <= n_candidates:
        raise ValueError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
    if protocol == "released":
        return parse_ranking_released(text, n_candidates, k)
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


_RELEASED_TAIL = re.compile(r"^\s*<rerank>(?P<rank>.*?)</rerank>\s*$", re.S)
_RELEASED_INDEX = re.compile(r"\[(\d+)\]")


def parse_ranking_released(text: str, n_candidates: int, k: int) -> RankerOutput:
    """A ranking as the authors' released validator reads it, from the text exactly as given.

    Valid when: the text holds exactly one ``<reason>...</reason>`` match (non-greedy, so a nested
    ``<reason>`` inside it counts once; its content may be empty; text before it is fine); what
    follows the last ``</reason>`` is, after stripping, one ``<rerank>...</rerank>`` block and
    nothing else; the block's stripped content is ``[i]`` then exactly k-1 ``> [j]``, brackets
    tight around the digits (``[ 1 ]`` is refused, ``[1]>[2]`` is fine); the k indices are in
    1..N and distinct. Error codes: missing_reason, multiple_reasons, bad_tail, bad_syntax,
    too_few, too_many, out_of_range, duplicate_index. No end-of-turn marker is stripped first, so
    ``...</rerank></s>`` has a bad tail (the release's validator sees the same text).
    """
    if not 1 <= k <= n_candidates:
        raise ValueError(f"need 1 <= k <= n_candidates, got k={k}, n_candidates={n_candidates}")
    reasons = _REASON_BLOCK.findall(text)
    reason = reasons[0].strip() if reasons else None
    error = None if len(reasons) == 1 else ("missing_reason" if not reasons else "multiple_reasons")
    last = text.rfind("</reason>")
    tail = (text[last + len("</reason>"):] if last != -1 else text).strip()
    match = _RELEASED_TAIL.match(tail)
    if match is None:
        return RankerOutput([], reason=reason, error=error or "bad_tail")
    chain = match.group("rank").strip()
    picks = [int(i) for i in _RELEASED_INDEX.findall(chain)]
    if error is None and not re.match(r"^\s*\[\d+\](\s*>\s*\[\d+\]){" + str(k - 1) + r"}\s*$", chain):
        error = "bad_syntax"
    if error is None and len(picks) != k:
        error = "too_few" if len(picks) < k else "too_many"
    if error is None and not all(1 <= i <= n_candidates for i in picks):
        error = "out_of_range"
    if error is None and len(set(picks)) != len(picks):
        error = "duplicate_index"
    if error is not None:
        return RankerOutput([], reason=reason, error=error)
    return RankerOutput([i - 1 for i in picks], reason=reason, valid=True)


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
