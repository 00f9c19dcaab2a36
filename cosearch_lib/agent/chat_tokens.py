"""Token-level chat assembly: the ids between two generations, taken from the chat template itself.

The rollout engine appends generated ids and observation ids without ever re-tokenising generated
text, so the ids it trains on are exactly the ids the policy sampled. :class:`ChatTokens` renders
probe conversations through the tokenizer's chat template to find the ids that close a turn and
open the next, and refuses (:class:`TemplateError`) a template for which this is not exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cosearch_lib.agent.prompts import observation_message

# --------------------------------------------------------------------------- token-level chat assembly

# messages of the probe conversations that locate each role's token spans in a chat template
_PROBE_USER, _PROBE_ASSISTANT, _PROBE_OBS = "probe question", "probe answer one", "probe observation one"
_PROBE_ASSISTANT_2, _PROBE_OBS_2 = "probe answer two", "probe observation two"


class TemplateError(ValueError):
    """A chat template that token-level assembly cannot follow exactly."""


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
