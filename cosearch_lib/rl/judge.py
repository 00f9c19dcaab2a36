"""LLM-as-judge relevance labels for the ranker's reward (the paper's Table 3 ablation).

The default ``r_rel`` labels a shown passage relevant when it contains a gold answer string
(``has_answer``). The ablation asks a language model instead: for each passage the agent was shown,
"does this passage help answer this search query?", greedy, and reads yes or no. The labels go into
``RankerCall.judged`` (aligned with ``order``), and ``relevance_reward`` with ``relevance="judge"``
takes mean Hit@k over them. ``I_ans`` (whether any of the N candidates holds an answer) stays the
answer-string rule: the judge sees only the K shown passages.

The judge is the profile's model through the rollout backend, without an adapter (the base model,
prompted), so it does not move while the policies train. Only a reply whose first word is "yes"
counts as relevant; anything else, including an unreadable reply, as not relevant.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.config import SamplingConfig

JUDGE_INSTRUCTIONS = ("You judge search results. Given a search query, the question it serves and one passage, "
                      "answer with one word: yes if the passage contains information that answers the query, "
                      "no otherwise.")
#: Characters of a passage the judge reads (the ranker's own prompt caps candidates likewise).
JUDGE_PASSAGE_CHARS = 600
_FIRST_WORD = re.compile(r"[a-z]+")


def judge_messages(q0: str, sub_query: str, passage: str, max_chars: int = JUDGE_PASSAGE_CHARS) -> list[dict[str, str]]:
    text = passage if len(passage) <= max_chars else passage[:max_chars] + " ..."
    return [{"role": "system", "content": JUDGE_INSTRUCTIONS},
            {"role": "user", "content": f"Question: {q0}\nSearch query: {sub_query}\nPassage: {text}\n"
                                        "Does the passage answer the search query? Answer yes or no."}]


def parse_verdict(text: str) -> int:
    """1 when the reply's first word is "yes" (any case, punctuation ignored), else 0."""
    word = _FIRST_WORD.search(text.strip().lower())
    return int(word is not None and word.group(0) == "yes")


def judge_calls(calls: Sequence[Any], backend: Any, chat: ChatTokens, *, adapter: str | None = None,
                max_new_tokens: int = 4, seed: int = 0) -> int:
    """Set ``call.judged`` (one 0/1 label per shown passage) on every call not judged yet, with one
    batched greedy generation; returns the number of passages judged."""
    todo = [(c, i) for c in calls if c.judged is None for i in range(len(c.order))]
    for c in calls:
        if c.judged is None and not c.order:
            c.judged = []
    if not todo:
        return 0
    for c, _ in todo:
        if len(c.shown_texts) != len(c.order):
            raise ValueError(f"ranker call {c.traj_id} turn {c.turn} carries {len(c.shown_texts)} shown texts for "
                             f"{len(c.order)} shown passages: the judge needs them (agent.rollout records them)")
    prompts = [chat.prompt_ids(judge_messages(c.q0, c.sub_query, c.shown_texts[i])) for c, i in todo]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, seed=seed)
    gens = backend.generate(prompts, sampling, adapter=adapter,
                            row_keys=[("judge", c.traj_id, c.turn, i) for c, i in todo])
    labels: dict[int, list[int]] = {}
    for (c, i), gen in zip(todo, gens):
        labels.setdefault(id(c), [0] * len(c.order))[i] = parse_verdict(gen.text)
    for c in calls:
        if id(c) in labels:
            c.judged = labels[id(c)]
    return len(todo)
