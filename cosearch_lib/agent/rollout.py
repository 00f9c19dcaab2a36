"""The batched multi-turn rollout engine: agent -> retriever -> ranker -> agent ..., turn by turn.

Each turn, across all active trajectories at once:

1. one batched agent generation (stops after ``</tool_call>`` / ``</answer>`` / end of turn);
2. parse each turn (strict tag protocol); answers and protocol failures retire their trajectory;
3. one batched retriever call (top-N) for every search of the turn;
4. one batched ranker call for those searches; the K passages it picks become the observation;
5. observation tokens appended with loss mask 0.

Token ids are never re-tokenised: a trajectory is the prompt ids, then each generated segment
exactly as sampled (mask 1, with its old-policy log-probs), then each observation segment
rendered by the chat template (mask 0). Records are plain dataclasses; ``trajectories_frame`` and ``ranker_calls_frame`` give
tidy tables. Training (GRPO) consumes :class:`Trajectory` and :class:`RankerCall` directly.

``run_together`` rolls several engines out on the same questions in lockstep (the evaluation's agent
methods: one agent, a different ranker each): step 1 is then one batch over all their rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from cosearch_lib.agent.parsers import AgentAction, parse_agent_turn, released_answer
from cosearch_lib.agent.prompts import agent_messages, format_observation
from cosearch_lib.agent.rankers import Ranker, RankRequest
from cosearch_lib.config import ProtocolConfig, RolloutConfig
from cosearch_lib.metrics import answer_f1, exact_match, has_answer
from cosearch_lib.models.generation.contract import prefix_scope
from cosearch_lib.progress import tqdm


@dataclass
class RankerCall:
    """One search call and what the ranker made of it (what ranker GRPO trains on)."""

    traj_id: str  # the trajectory that made the call
    question_id: str
    sample: int  # which of the G rollouts of the question
    turn: int  # 0-based agent turn that issued the search
    q0: str  # the original question
    sub_query: str
    candidate_ids: list[str]  # the retriever's top-N, best first
    relevant: list[int]  # has_answer(candidate, golds) per candidate (pseudo-relevance)
    order: list[int]  # what the agent was shown: 0-based candidate indices
    valid: bool  # the ranker output followed the protocol (invalid -> retriever top-K shown)
    error: str | None
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_text: str
    i_ans: int = 0  # 1 if any of the N candidates contains an answer
    shown_texts: list[str] = field(default_factory=list)  # contents of the shown passages, in order (the judge reads them)
    judged: list[int] | None = None  # LLM-as-judge relevance of the shown passages (rl.judge); None: not judged
    candidate_texts: list[str] = field(default_factory=list)  # cross-encoder policy only: the N texts it scored

    @property
    def shown_labels(self) -> list[int]:
        """``relevant`` of the passages shown to the agent, in the order shown (what Hit@k and the
        ranker's ``r_rel``, ``rl.rewards.relevance_reward``, are computed on)."""
        return [self.relevant[i] for i in self.order]

    @property
    def shown_hit(self) -> float:
        """Hit@K of the ranking: 1.0 when a passage shown to the agent holds an answer (0.0 when none was shown)."""
        return float(any(self.relevant[i] for i in self.order))


@dataclass
class Turn:
    """One agent turn as parsed."""

    text: str
    kind: str  # "search" | "answer" | "invalid"
    format_ok: bool
    error: str | None
    query: str | None = None
    answer: str | None = None


@dataclass
class Trajectory:
    traj_id: str
    question_id: str
    sample: int
    data_source: str
    question: str
    golds: list[str]
    prompt_len: int  # tokens of the initial prompt
    token_ids: list[int] = field(default_factory=list)  # prompt + generated + observations
    loss_mask: list[int] = field(default_factory=list)  # 1 exactly on agent-generated tokens
    old_logprobs: list[float] = field(default_factory=list)  # sampling log-prob per token (0.0 where mask is 0)
    turns: list[Turn] = field(default_factory=list)
    ranker_calls: list[RankerCall] = field(default_factory=list)
    answer: str | None = None
    finish: str = "running"  # "answer" | "invalid" | "max_searches" | "max_tokens"
    last_eos: bool = False  # whether the last generated segment ended with end-of-turn

    @property
    def format_ok(self) -> bool:
        """f of Eq. 4: every turn followed the protocol and the trajectory ended with an answer."""
        return self.finish == "answer" and all(t.format_ok for t in self.turns)

    @property
    def n_searches(self) -> int:
        """Searches actually run (one ranker call each); a search refused at the cap is not one."""
        return len(self.ranker_calls)

    @property
    def n_search_turns(self) -> int:
        """Turns that asked to search, the refused one at the cap included."""
        return sum(t.kind == "search" for t in self.turns)

    @property
    def f1(self) -> float:
        """The answer's F1 by the paper's metric (``metrics.answer_f1``, "plain"); 0 without an answer."""
        return answer_f1(self.answer, self.golds)

    @property
    def em(self) -> float:
        return exact_match(self.answer, self.golds) if self.answer is not None else 0.0

    def append(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.old_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


def _row_key(step: int, traj: Trajectory, turn: int) -> tuple:
    return (step, traj.question_id, traj.sample, turn)


def _ranker_call(traj: Trajectory, turn: int, req: RankRequest, ranking, trivial: str = "drop_each") -> RankerCall:
    relevant = [int(has_answer(p.contents, traj.golds, trivial=trivial)) for p in req.candidates]
    return RankerCall(
        traj_id=traj.traj_id, question_id=traj.question_id, sample=traj.sample, turn=turn, q0=req.q0,
        sub_query=req.sub_query, candidate_ids=[p.id for p in req.candidates], relevant=relevant,
        order=list(ranking.order), valid=ranking.valid, error=ranking.error, prompt_ids=ranking.prompt_ids,
        output_ids=ranking.output_ids, output_logprobs=ranking.output_logprobs, output_text=ranking.output_text,
        i_ans=int(any(relevant)),
        shown_texts=[req.candidates[i].contents for i in ranking.order], candidate_texts=list(ranking.candidate_texts))


class RolloutEngine:
    """Rolls out G trajectories per question with one agent backend, a retriever and a ranker."""

    def __init__(self, agent_backend, chat, retriever, ranker: Ranker, cfg: RolloutConfig,
                 protocol_cfg: ProtocolConfig | None = None, *, agent_adapter: str | None = None):
        self.agent, self.chat, self.retriever, self.ranker = agent_backend, chat, retriever, ranker
        self.cfg = cfg
        self.protocol_cfg = protocol_cfg or ProtocolConfig(search=cfg.search)
        self.agent_adapter = agent_adapter

    def new_trajectories(self, questions, n_samples: int, rows: Sequence[int] | None = None) -> list[Trajectory]:
        """The empty trajectories of ``rows``: positions in the question-major order of ``n_samples``
        rollouts per question (row ``q * n_samples + s`` is sample ``s`` of question ``q``); None: all."""
        wanted = None if rows is None else set(rows)
        if wanted is not None and not wanted <= set(range(len(questions) * n_samples)):
            raise ValueError(f"rows {sorted(wanted)} outside {len(questions)} question(s) x {n_samples} sample(s)")
        out = []
        for q, ex in enumerate(questions):
            samples = [s for s in range(n_samples) if wanted is None or q * n_samples + s in wanted]
            if not samples:
                continue
            prompt = self.chat.prompt_ids(agent_messages(ex.question, self.protocol_cfg))
            for s in samples:
                t = Trajectory(traj_id=f"{ex.id}/{s}", question_id=ex.id, sample=s, data_source=ex.data_source,
                               question=ex.question, golds=list(ex.golden_answers), prompt_len=len(prompt))
                t.append(prompt, 0)
                out.append(t)
        return out

    def run(self, questions, *, n_samples: int = 1, seed: int = 0, step: int = 0, progress: bool = False,
            desc: str | None = None, rows: Sequence[int] | None = None) -> list[Trajectory]:
        """G (``n_samples``) trajectories per question, turn by turn, all rows batched; ``rows`` keeps
        some of them (:meth:`new_trajectories`: a data-parallel rank's block of a step), each the
        trajectory it is among all; ``desc`` names the progress bar (default "rollout step <step>")."""
        return run_together([self], questions, n_samples=n_samples, seed=seed, step=step, progress=progress,
                            desc=desc, rows=rows)[0]

    def _take_turn(self, active: list[Trajectory], gens: list[Any], turn: int) -> list[tuple[Trajectory, str]]:
        """Append one generation per active trajectory and act on it; returns the (trajectory,
        query) pairs that searched."""
        searching = []
        for t, gen in zip(active, gens):
            t.append(list(gen.token_ids), 1, list(gen.logprobs))
            # the chat template closes the turn itself unless the sampled ids already end with end-of-turn
            t.last_eos = bool(gen.token_ids) and gen.token_ids[-1] == self.chat.end_of_turn_id
            released = self.cfg.rules.agent_format == "released"
            action: AgentAction = parse_agent_turn(gen.text, protocol=self.cfg.rules.agent_format)
            t.turns.append(Turn(gen.text, action.kind, action.format_ok, action.error, action.query, action.answer))
            if released and action.kind == "search":  # the release runs any one valid call; its format is judged at the end
                if t.n_search_turns <= self.cfg.search.max_searches:
                    searching.append((t, action.query))
                else:
                    t.finish = "max_searches"
            elif released:  # no single valid call: the episode ends, with the last answer block of any turn
                t.answer = released_answer([turn.text for turn in t.turns])
                t.finish = "answer" if action.kind == "answer" else "invalid"
            elif action.kind == "answer" and action.format_ok:
                t.answer, t.finish = action.answer, "answer"
            elif action.kind == "search" and action.format_ok and t.n_search_turns <= self.cfg.search.max_searches:
                searching.append((t, action.query))
            elif action.kind == "search" and action.format_ok:
                t.finish = "max_searches"
            elif self.cfg.stop_on_invalid:
                t.finish = "invalid"
            else:
                self._append_observation(t, f"Your last turn did not follow the protocol ({action.error}). "
                                            "Reply with <reason>...</reason> and one tool_call or answer.")
            if t.finish == "running" and len(t.token_ids) >= self.cfg.max_context_tokens:
                t.finish = "max_tokens"
        return [(t, q) for t, q in searching if t.finish == "running"]

    def _search_and_observe(self, searching: list[tuple[Trajectory, str]], turn: int, seed: int, step: int) -> None:
        queries = [q for _, q in searching]
        candidates = self.retriever.search(queries, self.cfg.search.topn)
        requests = [RankRequest(q0=t.question, sub_query=q, candidates=c, k=self.cfg.search.topk, golds=t.golds,
                                row_key=_row_key(step, t, turn)) for (t, q), c in zip(searching, candidates)]
        rankings = self.ranker.rank(requests)
        for (t, _), req, ranking in zip(searching, requests, rankings):
            t.ranker_calls.append(_ranker_call(t, turn, req, ranking, self.cfg.rules.trivial_golds))
            self._append_observation(t, format_observation(ranking.shown(req.candidates), self.protocol_cfg))
            if len(t.token_ids) >= self.cfg.max_context_tokens:
                t.finish = "max_tokens"

    def _append_observation(self, t: Trajectory, text: str) -> None:
        t.append(self.chat.observation_ids(text, generated_ended_with_eos=t.last_eos), 0)


def run_together(engines: list[RolloutEngine], questions, *, n_samples: int = 1, seed: int = 0, step: int = 0,
                 progress: bool = False, desc: str | None = None,
                 rows: Sequence[int] | None = None) -> list[list[Trajectory]]:
    """Each engine's rollouts of the same ``questions`` (:meth:`RolloutEngine.run`), in lockstep: every
    turn, the active rows of the engines that share an agent backend, adapter and sampling settings
    go to the backend in one batched generation, then each engine searches and ranks for its own
    rows. Engines that differ only in their ranker (the evaluation's agent methods) thus decode
    together, at about the cost of the longest row of any of them rather than the sum of their
    runs. A row's sampling seed depends on its own key, not on the rows beside it, so each engine's
    trajectories are those it rolls out alone (up to the backend's batch numerics). Returns the
    trajectories per engine, in ``engines`` order; ``rows`` as :meth:`RolloutEngine.run`."""
    trajs = [engine.new_trajectories(questions, n_samples, rows) for engine in engines]
    active = [list(rows) for rows in trajs]
    bar = tqdm(total=sum(map(len, trajs)), desc=desc or f"rollout step {step}", unit="traj", disable=not progress)
    turn = 0
    # Weights are fixed during a rollout: backends that cache prompt prefixes keep them until it
    # ends, so the instructions run once and each turn runs only the observation and new tokens.
    with ExitStack() as scopes:
        for engine in engines:
            scopes.enter_context(prefix_scope(engine.agent, keep_rows_for=(engine.agent_adapter,)))
            ranker_backend = getattr(engine.ranker, "backend", None)
            if ranker_backend is not None and ranker_backend is not engine.agent:
                scopes.enter_context(prefix_scope(ranker_backend))
        while any(active):
            gens = _generate_turn(engines, active, turn, seed, step)
            for engine, rows, generated in zip(engines, active, gens):
                if rows:
                    searching = engine._take_turn(rows, generated, turn)
                    if searching:
                        engine._search_and_observe(searching, turn, seed, step)
            still = [[t for t in rows if t.finish == "running"] for rows in active]
            bar.update(sum(map(len, active)) - sum(map(len, still)))
            active, turn = still, turn + 1
    bar.close()
    return trajs


def _generate_turn(engines: list[RolloutEngine], active: list[list[Trajectory]], turn: int, seed: int,
                   step: int) -> list[list[Any]]:
    """One agent generation per active row of every engine: one batched call per (backend, adapter,
    sampling) that the engines share. Returns the generations per engine, in row order."""
    calls: dict[tuple, tuple[Any, list[tuple[int, int]]]] = {}  # call -> (sampling, its (engine, row) positions)
    for e, (engine, rows) in enumerate(zip(engines, active)):
        if not rows:  # this engine's rollouts have all ended
            continue
        sampling = engine.cfg.agent_sampling(seed)  # a dataclass: its repr tells settings apart
        key = (id(engine.agent), engine.agent_adapter, repr(sampling))
        calls.setdefault(key, (sampling, []))[1].extend((e, r) for r in range(len(rows)))
    out: list[list[Any]] = [[None] * len(rows) for rows in active]
    for sampling, positions in calls.values():
        engine = engines[positions[0][0]]
        rows = [active[e][r] for e, r in positions]
        gens = engine.agent.generate([t.token_ids for t in rows], sampling, adapter=engine.agent_adapter,
                                     row_keys=[("agent", *_row_key(step, t, turn)) for t in rows])
        for (e, r), gen in zip(positions, gens):
            out[e][r] = gen
    return out


def trajectories_frame(trajs: list[Trajectory]) -> pd.DataFrame:
    """One row per trajectory: tidy, for tables and plots."""
    rows: list[dict[str, Any]] = []
    for t in trajs:
        calls = t.ranker_calls
        rows.append({
            "traj_id": t.traj_id, "question_id": t.question_id, "sample": t.sample, "data_source": t.data_source,
            "question": t.question, "golds": t.golds, "answer": t.answer, "f1": t.f1, "em": t.em,
            "format_ok": t.format_ok, "finish": t.finish, "n_searches": t.n_searches, "n_turns": len(t.turns),
            "n_tokens": len(t.token_ids), "n_generated": int(sum(t.loss_mask)),
            "ranker_valid_rate": (sum(c.valid for c in calls) / len(calls)) if calls else float("nan"),
            "hit@K": (sum(c.shown_hit for c in calls) / len(calls)) if calls else float("nan"),
        })
    return pd.DataFrame(rows)


def ranker_calls_frame(trajs: list[Trajectory]) -> pd.DataFrame:
    """One row per ranker call."""
    rows = []
    for t in trajs:
        for c in t.ranker_calls:
            rows.append({"traj_id": c.traj_id, "question_id": c.question_id, "sample": c.sample, "turn": c.turn,
                         "sub_query": c.sub_query, "valid": c.valid, "error": c.error, "i_ans": c.i_ans,
                         "hit@K": c.shown_hit, "shown_ids": [c.candidate_ids[i] for i in c.order]})
    return pd.DataFrame(rows)
