"""One step's work and the seconds of its rollout stages: what ``planning.job_plan`` multiplies by the ranks.

A step of a method is first counted in tokens and calls (:func:`workload`: the agent's generated,
prefilled and trained tokens; the ranker's calls, prompts and replies; a scoring ranker's judged
prompts), from the profile's settings and the policies' :class:`Behaviour`. Then the rollout's
stages are timed on a device's measured rates (:func:`rollout_stages`, :func:`ranker_validation_s`):
batched lock-step decoding (:func:`lockstep_decode`), prefill, retrieval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cosearch_lib.config import ProfileConfig
from cosearch_lib.config.methods import method_spec
from cosearch_lib.config.ranker_kinds import ranker_kind

#: Paper Table 7: mean search calls per trajectory of each method (the default behaviour).
PAPER_SEARCHES = {"search_r1": 2.05, "fixed_ranker": 2.62, "cosearch": 1.67, "oracle": 1.66}
#: Tokens around each numbered candidate of a ranker prompt ("[3] ", title line, blank line; measured: a
#: 100-character candidate is 28.4 tokens of SmolLM2's tokenizer, a 560-character one 137).
CANDIDATE_FRAME_TOKENS = 4.0
#: Tokens of a question (or sub-query) past the instructions its prompt shares with the others.
QUESTION_TOKENS = 30.0
#: The longest row of a batched generation call against the mean row: the call runs until it ends.
LONGEST_ROW = 1.5
#: The transformers backend reads the sampled tokens every this many decode steps (TransformersBackend.sync_every).
TRANSFORMERS_SYNC_EVERY = 8
#: Rows an engine (vLLM, Unsloth's fast generation) decodes at once: vLLM's default max_num_seqs.
ENGINE_MAX_ROWS = 256.0


@dataclass(frozen=True)
class Behaviour:
    """What the settings do not fix: how the policies behave. Defaults: paper Table 7's searches per
    trajectory per method; turns and replies as long as half their token budgets; passages of
    ``passage_chars`` characters cut at the profile's caps, ``chars_per_token`` characters a token."""

    searches: float | None = None  # search calls per trajectory (None: PAPER_SEARCHES[method])
    agent_turn_tokens: float | None = None  # tokens of one agent turn (None: half of rollout.agent_max_new_tokens)
    ranker_reply_tokens: float | None = None  # tokens of one ranker reply (None: half of rollout.ranker_max_new_tokens)
    prompt_tokens: float = 400.0  # the agent's instructions and question
    ranker_overhead_tokens: float = 200.0  # the ranker prompt without its N candidates (its instructions: ~195 tokens, SmolLM2's and Qwen's templates)
    ranker_shared_tokens: float = 110.0  # of those, the part before the question and candidates: what a step's ranker prompts share
    passage_chars: float = 600.0  # a passage before the caps (wiki-18: 100 words)
    chars_per_token: float = 4.0
    signal_share: float = 1.0  # share of the agent's sequences the update forwards (reward variance; all with a KL term); 1: an upper bound
    ranker_calls_trained: float = 1.0  # share of ranker calls in trained groups; 1: an upper bound
    judge_overhead_tokens: float = 25.0  # a scoring ranker's prompt without its one candidate (the query and the question to it)
    agent_generated_tokens: float | None = None  # tokens the agent generates per trajectory, all turns (None: turns x agent_turn_tokens)
    agent_context_tokens: float | None = None  # a trajectory's final length (None: prompt + passages read + turns, capped)
    hops: float = 2.0  # gold sub-queries per validation question: the ranker validation's items (the paper's multi-hop mix)
    rounds: float | None = None  # turns of a step's longest trajectory: the rollout's batched rounds (None: search.max_searches + 1)
    trained_context_tokens: float | None = None  # mean length of the trajectories the update trains (None: agent_context_tokens)
    scored_lists_share: float = 1.0  # distinct candidate lists among the ranker calls trained (a scoring ranker scores a repeated list once)


def decode_batching(cfg: ProfileConfig, on_gpu: bool) -> tuple[float, int]:
    """Rows per forward pass and the decode steps between looks at the sampled tokens, for ``cfg``'s
    backend: an engine (vLLM, Unsloth's fast generation) takes :data:`ENGINE_MAX_ROWS` rows and checks
    every step; the transformers backend takes ``models.batch_size`` and syncs every :data:`TRANSFORMERS_SYNC_EVERY`."""
    transformers = cfg.models.backend == "transformers"
    chunk = ENGINE_MAX_ROWS if on_gpu and not transformers else float(cfg.models.batch_size)
    return chunk, (TRANSFORMERS_SYNC_EVERY if transformers else 1)


@dataclass(frozen=True)
class Workload:
    """One step of one method on one rank, in tokens and calls."""

    questions: float
    trajectories: float
    searches: float
    agent_generated: float  # tokens the agent generates per trajectory, all turns
    rounds: float  # batched generation rounds: the longest trajectory's turns
    agent_context: float  # a trajectory's final length (what its KV cache holds; what the update forwards)
    agent_prefill: float  # tokens the agent's forward passes read besides decoding, all trajectories
    agent_prompt: float  # a trajectory's first prompt (instructions and question)
    ranker_prompt: float  # one ranker prompt, instructions included
    ranker_calls: float  # calls of a generative ranker (decoding a reply each)
    ranker_reply: float
    ranker_prefill: float  # tokens of those calls' prompts the ranker reads (instructions once)
    judged_prompts: float  # a scoring ranker's prompts (one per candidate): llm_judge
    judge_prompt: float  # tokens of one such prompt
    trained_agent: float  # tokens the update trains (agent), all passes of one
    trained_ranker: float


def _ranker_prompt_tokens(cfg: ProfileConfig, b: Behaviour) -> tuple[float, float, float]:
    """A ranker call's tokens under ``b``: its prompt past the part the step's prompts share (question,
    sub-query, N candidates, the reply's form), its reply, and one prompt of a scoring ranker (one candidate)."""
    candidate = min(b.passage_chars, cfg.protocol.ranker_passage_chars) / b.chars_per_token + CANDIDATE_FRAME_TOKENS
    listed = cfg.search.topn * candidate + QUESTION_TOKENS + b.ranker_overhead_tokens - b.ranker_shared_tokens
    reply = b.ranker_reply_tokens if b.ranker_reply_tokens is not None else cfg.rollout.ranker_max_new_tokens / 2
    judge_prompt = b.judge_overhead_tokens + min(b.passage_chars, cfg.training.llm_judge.max_chars) / b.chars_per_token
    return listed, reply, judge_prompt


def workload(cfg: ProfileConfig, method: str, b: Behaviour, questions: float, samples: int | None = None) -> Workload:
    """The work of ``questions`` x ``samples`` (default G) trajectories of ``method`` under ``b``.

    Prompt prefixes are read once where the backends share them (``TransformersBackend`` and vLLM's
    prefix caching): the instructions once per step, a question once for its G samples, a
    trajectory's earlier turns never again (its cache is carried across turns). So the agent reads
    each question and each observation once, and decodes its own tokens; the update reads a group's
    prompt once per optimizer step (``training.shared_prefix_update``)."""
    t, r, p = cfg.training, cfg.rollout, cfg.protocol
    spec = method_spec(method)
    g = t.group_size if samples is None else samples
    searches = b.searches if b.searches is not None else PAPER_SEARCHES[method]
    turn = b.agent_turn_tokens if b.agent_turn_tokens is not None else r.agent_max_new_tokens / 2
    generated = b.agent_generated_tokens if b.agent_generated_tokens is not None else (searches + 1) * turn
    listed, reply, judge_prompt = _ranker_prompt_tokens(cfg, b)
    passage = min(b.passage_chars, p.max_passage_chars) / b.chars_per_token
    trajectories = questions * g
    context = (b.agent_context_tokens if b.agent_context_tokens is not None
               else min(b.prompt_tokens + searches * cfg.search.topk * passage + generated, r.max_context_tokens))
    observations = max(context - b.prompt_tokens - generated, 0.0)
    agent_prefill = b.prompt_tokens + questions * QUESTION_TOKENS + trajectories * observations
    kind = ranker_kind(t.ranker_kind)
    calls = trajectories * searches if spec.has_ranker_policy else 0.0
    generative = calls if not kind.scoring else 0.0
    judged = calls * cfg.search.topn if kind.scoring else 0.0
    trained_ranker = 0.0
    if spec.trains_ranker and not kind.scoring:
        trained_ranker = calls * b.ranker_calls_trained * (listed + reply) + b.ranker_shared_tokens * max(t.minibatches, 1)
    if spec.trains_ranker and kind.scoring:  # a scoring ranker trains on its candidates' prompts
        trained_ranker = judged * b.ranker_calls_trained * b.scored_lists_share * judge_prompt
    trained = b.trained_context_tokens if b.trained_context_tokens is not None else context
    if t.shared_prefix_update and not t.gradient_checkpointing:  # a group's prompt runs once per optimizer step
        trained_agent = questions * b.signal_share * (b.prompt_tokens + g * (trained - b.prompt_tokens))
    else:
        trained_agent = trajectories * b.signal_share * trained
    rounds = b.rounds if b.rounds is not None else (cfg.search.max_searches + 1 if trajectories > 1 else searches + 1)
    return Workload(questions, trajectories, searches, generated, max(rounds, 1.0), context, agent_prefill, b.prompt_tokens,
                     b.ranker_shared_tokens + listed, generative, reply,
                     b.ranker_shared_tokens + generative * listed, judged, judge_prompt, trained_agent, trained_ranker)


def lockstep_decode(rates, rows: float, rounds: float, tokens_per_row: float, cap: float, chunk: float | None,
                     context: float = 0.0, turns: float | None = None, sync: int = 1) -> float:
    """Seconds to decode ``rounds`` turns of ``rows`` rows that generate ``tokens_per_row`` tokens each
    in all (the agent's turns; a ranker's replies), one batched call per round. A call runs until its
    longest row ends (:data:`LONGEST_ROW` x the mean turn, at most ``cap``); a finished row leaves the
    batch, so the rows cost their own tokens. ``chunk``: rows per forward pass (the transformers
    backend's ``models.batch_size``; an engine's :data:`ENGINE_MAX_ROWS`); ``context``: the rows' mean
    context while they decode; ``turns``: a row's mean turns (default ``rounds``); ``sync``: the
    backend looks at the sampled tokens every ``sync`` steps, so a call runs to the next multiple."""
    if rows <= 0 or rounds <= 0:
        return 0.0
    turn = tokens_per_row / (turns or rounds)
    longest = min(cap, LONGEST_ROW * turn) if rows > 1 else turn
    longest = math.ceil(longest / sync) * sync
    calls = math.ceil(rows / chunk) if chunk else 1
    return rounds * calls * longest * rates.decode_step_s.value + rows * tokens_per_row * rates.row_token_s(context)


def retrieval_query_s(encoder_tokens: float, encoder_tps: float, index_vectors: float, search_rate: float) -> float:
    """Seconds of one search's retrieval: its query encoded (``encoder_tokens`` at ``encoder_tps``) and a
    flat scan of ``index_vectors`` (768-d equivalents) at ``search_rate`` vectors per second."""
    return encoder_tokens / encoder_tps + index_vectors / search_rate


def rollout_stages(cfg: ProfileConfig, w: Workload, agent_rates, ranker_rates, on_gpu: bool,
                   query_s: float) -> dict[str, float]:
    """Seconds of one rank's rollout, by stage: the agent's generation (its turns decode in lock-step
    over the rank's rows, :func:`lockstep_decode`; the questions and observations read once), the
    ranker's calls (a generative ranker decodes its replies, the calls of one search turn together;
    a scoring ranker reads one prompt per candidate), retrieval (``query_s`` per search,
    :func:`retrieval_query_s`)."""
    r = cfg.rollout
    chunk, sync = decode_batching(cfg, on_gpu)
    agent = (lockstep_decode(agent_rates, w.trajectories, w.rounds, w.agent_generated, r.agent_max_new_tokens, chunk,
                              context=(w.agent_prompt + w.agent_context) / 2, turns=w.searches + 1, sync=sync)
             + w.agent_prefill / agent_rates.prefill_tps.value)
    ranker = 0.0
    if w.ranker_calls:
        search_rounds = max(w.rounds - 1, 1.0)  # every round but the last searches
        per_round = w.ranker_calls / search_rounds
        ranker = (lockstep_decode(ranker_rates, per_round, search_rounds, w.ranker_calls / per_round * w.ranker_reply,
                                   r.ranker_max_new_tokens, chunk, sync=sync,
                                   context=w.ranker_prompt)
                  + w.ranker_prefill / ranker_rates.prefill_tps.value)
    if w.judged_prompts:
        ranker = w.judged_prompts * w.judge_prompt / ranker_rates.scoring_tps.value
    return {"rollout": agent, "ranker calls": ranker, "retrieval": w.trajectories * w.searches * query_s}


def ranker_validation_s(cfg: ProfileConfig, method: str, b: Behaviour, items: float, ranker_rates, on_gpu: bool) -> float:
    """Seconds of the greedy ranker validation on ``items`` held-out gold sub-queries (a rule ranker: ~0)."""
    spec, kind = method_spec(method), ranker_kind(cfg.training.ranker_kind)
    if not spec.has_ranker_policy or items <= 0:
        return 0.0
    listed, reply, judge_prompt = _ranker_prompt_tokens(cfg, b)
    if kind.scoring:
        return items * cfg.search.topn * judge_prompt / ranker_rates.scoring_tps.value
    chunk, sync = decode_batching(cfg, on_gpu)
    prefill = b.ranker_shared_tokens + items * listed
    return (lockstep_decode(ranker_rates, items, 1, reply, cfg.rollout.ranker_max_new_tokens, chunk, sync=sync,
                            context=b.ranker_shared_tokens + listed)
            + prefill / ranker_rates.prefill_tps.value)
