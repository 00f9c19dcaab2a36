"""How long a sequence the generation engine must hold: the profile's context budget, measured.

Two kinds of sequence reach the engine. An agent turn reads a trajectory of up to
``rollout.max_context_tokens`` and writes up to ``agent_max_new_tokens``. A ranker call reads q0,
the sub-query and N candidates, each cut at ``protocol.ranker_passage_chars``, and writes up to
``ranker_max_new_tokens``. The ranker's prompt has no cap of its own: at the paper's N = 50 passages
of ~100 words it is ~6,800 tokens, so the engine's ``max_model_len`` (vLLM) or ``max_seq_length``
(Unsloth) has to come from the longer of the two, not from a default.

The ranker prompt is measured, not guessed: :func:`context_budget` renders the real ranker prompt
(``agent.prompts.ranker_messages``) through the model's chat template with the N passages of a
corpus sample that take the most tokens once cut, and a question and sub-query of
``QUERY_CHARS`` characters each. A profile whose budget does not fit the engine or the model's
positions is refused at start (:func:`check_engine_fits`), with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cosearch_lib.agent.prompts import ranker_messages, truncate
from cosearch_lib.config import ConfigError, ProtocolConfig, RolloutConfig
from cosearch_lib.data.passage import Passage

#: Characters of the question and of the sub-query in the measured ranker prompt (long ones: a
#: multi-hop question runs to ~150 characters, a sub-query the agent writes seldom past 100).
QUERY_CHARS = 200


@dataclass(frozen=True)
class ContextBudget:
    """Token lengths of the longest sequences a profile sends to the engine."""

    agent_context: int  # rollout.max_context_tokens: a trajectory is cut there
    agent_turn: int  # rollout.agent_max_new_tokens
    ranker_prompt: int  # the longest ranker prompt, measured (N densest sample passages)
    ranker_reply: int  # rollout.ranker_max_new_tokens
    n_candidates: int  # N of the measured prompt

    @property
    def agent(self) -> int:
        return self.agent_context + self.agent_turn

    @property
    def ranker(self) -> int:
        return self.ranker_prompt + self.ranker_reply

    @property
    def engine_len(self) -> int:
        """The engine's length: prompt plus generated tokens of the longer kind of call."""
        return max(self.agent, self.ranker)

    def describe(self) -> str:
        return (f"agent: context {self.agent_context} + turn {self.agent_turn} = {self.agent} tokens; ranker: "
                f"prompt {self.ranker_prompt} (N={self.n_candidates} passages, measured) + reply "
                f"{self.ranker_reply} = {self.ranker} tokens")


def context_budget(tokenizer: Any, rollout: RolloutConfig, protocol: ProtocolConfig,
                   sample: Sequence[Passage]) -> ContextBudget:
    """The profile's context budget, the ranker prompt measured on ``sample`` (passages of the corpus;
    fewer than N are reused in turn). No model weights are read: only the tokenizer."""
    if not sample:
        raise ValueError("context_budget needs at least one sample passage to measure the ranker prompt")
    n, k = rollout.search.topn, rollout.search.topk
    cap = protocol.ranker_passage_chars
    weight = [len(tokenizer(f"{p.title}\n{truncate(p.text.strip(), cap)}", add_special_tokens=False)["input_ids"])
              for p in sample]
    densest = [p for _, p in sorted(zip(weight, sample, strict=True), key=lambda x: -x[0])]
    candidates = [densest[i % len(densest)] for i in range(n)]
    query = ("x " * QUERY_CHARS)[:QUERY_CHARS]
    messages = ranker_messages(query, query, candidates, k, protocol)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ContextBudget(agent_context=rollout.max_context_tokens, agent_turn=rollout.agent_max_new_tokens,
                         ranker_prompt=prompt, ranker_reply=rollout.ranker_max_new_tokens, n_candidates=n)


def check_engine_fits(budget: ContextBudget, *, model: str, model_positions: int | None,
                      engine_len: int | None, engine_key: str) -> int:
    """The engine length to start with (``budget.engine_len``), or a ConfigError with the numbers when
    the model's positions (``max_position_embeddings``) or a length the profile fixes (``engine_key``:
    ``models.vllm.max_model_len``) is shorter."""
    need = budget.engine_len
    if model_positions is not None and need > model_positions:
        raise ConfigError(
            f"the context budget does not fit {model!r}: {budget.describe()}; the engine needs {need} tokens but the "
            f"model has {model_positions} positions. Lower rollout.max_context_tokens (agent) or search.topn / "
            f"protocol.ranker_passage_chars / rollout.ranker_max_new_tokens (ranker)")
    if engine_len is not None and need > engine_len:
        raise ConfigError(
            f"{engine_key}={engine_len} is shorter than the profile's context budget: {budget.describe()}; set "
            f"{engine_key} to at least {need} (or null: the budget's own length), or shrink the budget")
    return engine_len if engine_len is not None else need
