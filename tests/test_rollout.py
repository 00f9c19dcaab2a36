"""The batched rollout engine's records: masks cover exactly the agent's tokens, observations are
masked out, logprobs align with tokens, ranker calls are complete, and each finish path works.
A scripted backend makes these deterministic; one test runs the real transformers backend (SmolLM2)."""

from __future__ import annotations

import pytest

from cosearch_lib.agent.prompts import agent_messages, observation_message
from cosearch_lib.agent.rankers import LLMRanker, OracleRanker, RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine, ranker_calls_frame, trajectories_frame
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SearchBudget
from cosearch_lib.data.passage import Passage
from cosearch_lib.data.qa_formats import QAExample

from tests.doubles import FixedRetriever, ScriptedBackend, answer_turn, search_turn, token_logprob

CORPUS = [Passage(str(i), f'"Doc {i}"\n{text}') for i, text in enumerate([
    "Drask is a river town.", "The mill was built in 1843.", "Orvane Tellis was born in Kessmere.",
    "Kessmere lies on the coast.", "Tellis wrote atlases.", "Unrelated passage about bells."])]












QUESTION = QAExample(id="q1", question="Where was Orvane Tellis born?", golden_answers=["Kessmere"], data_source="syn_nq")


def agent_script(per_turn):
    """Agent responses by turn; ranker keys are not expected here."""
    def respond(prompt, key):
        assert key[0] == "agent"
        turn = key[-1]
        return per_turn[turn] if not callable(per_turn) else per_turn(key)
    return respond


def _engine(tok, chat, agent_responses, ranker=None, **cfg):
    backend = ScriptedBackend(tok, agent_script(agent_responses))
    retriever = FixedRetriever(CORPUS)
    budget = SearchBudget(topn=5, topk=2, max_searches=cfg.pop("max_searches", 6))
    engine = RolloutEngine(backend, chat, retriever, ranker or RetrievalOnlyRanker(),
                           RolloutConfig(search=budget, **cfg), ProtocolConfig(search=SearchBudget(topk=2)))
    return engine, backend, retriever


def test_rows_roll_out_just_those_samples_each_the_trajectory_it_is_among_all(tok, chat):
    """A data-parallel rank's block of a step's rows (question-major, G per question) rolls out just
    those samples, each the trajectory it is in the whole step (its seeds are its own row's)."""
    def per_key(key):  # sample s searches s times, then answers
        sample, turn = key[-2], key[-1]
        return search_turn(f"tellis {sample}") if turn < sample else answer_turn("Kessmere")

    engine, _, _ = _engine(tok, chat, per_key)
    questions = [QUESTION, QAExample(id="q2", question="Who wrote atlases?", golden_answers=["Tellis"], data_source="syn_nq")]
    every = engine.run(questions, n_samples=3)
    some = engine.run(questions, n_samples=3, rows=[2, 3])  # the last sample of q1, the first of q2
    assert [(t.question_id, t.sample, t.n_searches) for t in some] == [("q1", 2, 2), ("q2", 0, 0)]
    assert [t.token_ids for t in some] == [every[2].token_ids, every[3].token_ids]
    with pytest.raises(ValueError, match=r"rows \[6\] outside 2 question\(s\) x 3 sample"):
        engine.run(questions, n_samples=3, rows=[6])


def test_masks_logprobs_and_template_equality(tok, chat):
    engine, backend, _ = _engine(tok, chat, [search_turn("tellis birthplace"), answer_turn("Kessmere")])
    (t,) = engine.run([QUESTION], n_samples=1)
    assert t.finish == "answer" and t.answer == "Kessmere" and t.format_ok and t.f1 == 1.0 and t.n_searches == 1
    assert len(t.token_ids) == len(t.loss_mask) == len(t.old_logprobs)
    # the masked-in tokens are exactly the generated ids, in order; their logprobs are the backend's
    # generation ends right after the stop string, so no end-of-turn token is sampled: the chat
    # template's observation segment closes the turn (and is masked out)
    generated = [tok.encode(search_turn("tellis birthplace"), add_special_tokens=False),
                 tok.encode(answer_turn("Kessmere"), add_special_tokens=False)]
    assert [i for i, m in zip(t.token_ids, t.loss_mask) if m] == generated[0] + generated[1]
    assert [lp for lp, m in zip(t.old_logprobs, t.loss_mask) if m] == [token_logprob(i) for i in generated[0] + generated[1]]
    assert all(lp == 0.0 for lp, m in zip(t.old_logprobs, t.loss_mask) if not m)
    # prompt and observation are masked out; the observation holds the K shown passages
    assert sum(t.loss_mask[: t.prompt_len]) == 0
    unmasked_after_prompt = tok.decode([i for i, m in zip(t.token_ids[t.prompt_len:], t.loss_mask[t.prompt_len:]) if not m])
    assert "<information>" in unmasked_after_prompt and "Drask is a river town." in unmasked_after_prompt
    assert "Orvane Tellis was born" not in unmasked_after_prompt  # rank 3 is beyond K=2
    # the whole sequence is what the chat template renders for the conversation
    msgs = agent_messages(QUESTION.question, ProtocolConfig(search=SearchBudget(topk=2))) + [
        {"role": "assistant", "content": search_turn("tellis birthplace")},
        observation_message(unmasked_after_prompt[unmasked_after_prompt.index("<information>"):].split("<|im_end|>")[0]),
        {"role": "assistant", "content": answer_turn("Kessmere")}]
    rendered = tok.apply_chat_template(msgs, tokenize=False)
    assert tok.decode(t.token_ids) == rendered.removesuffix("<|im_end|>\n")


def test_one_batched_call_per_turn_and_g_samples(tok, chat):
    qs = [QUESTION, QAExample(id="q2", question="What did Tellis write?", golden_answers=["atlases"], data_source="syn_nq")]
    engine, backend, retriever = _engine(tok, chat, lambda key: search_turn("x") if key[-1] == 0 else answer_turn("atlases"))
    trajs = engine.run(qs, n_samples=3, seed=7, step=2)
    assert len(trajs) == 6 and [t.sample for t in trajs] == [0, 1, 2, 0, 1, 2]
    assert len(backend.calls) == 2 and len(retriever.calls) == 1 and len(retriever.calls[0][0]) == 6
    keys = backend.calls[0][3]
    assert keys[0] == ("agent", 2, "q1", 0, 0) and backend.calls[0][1].seed == 7
    assert backend.calls[0][1].stop == ("</tool_call>", "</answer>")
    frame = trajectories_frame(trajs)
    assert list(frame["f1"]) == [0.0] * 3 + [1.0] * 3


def test_ranker_call_records(tok, chat):
    engine, _, _ = _engine(tok, chat, [search_turn("tellis birthplace"), answer_turn("Kessmere")], ranker=OracleRanker())
    (t,) = engine.run([QUESTION])
    (call,) = t.ranker_calls
    assert call.q0 == QUESTION.question and call.sub_query == "tellis birthplace" and call.turn == 0
    assert call.candidate_ids == ["0", "1", "2", "3", "4"] and call.relevant == [0, 0, 1, 1, 0]
    assert call.order == [2, 3] and call.valid and call.i_ans == 1  # Eq. 7 promoted the answer passages
    assert call.shown_labels == [1, 1] and call.shown_hit == 1.0
    calls = ranker_calls_frame([t])
    assert calls.loc[0, "shown_ids"] == ["2", "3"] and calls.loc[0, "hit@K"] == 1.0


def test_llm_ranker_in_the_loop_valid_and_invalid(tok, chat):
    def respond(prompt, key):
        if key[0] == "ranker":
            return "<reason>3 names the birthplace.</reason><rerank>[3] > [1]</rerank>" if key[3] == 0 else "[9] > [9]"
        return search_turn("birthplace") if key[-1] == 0 else answer_turn("Kessmere")

    backend = ScriptedBackend(tok, respond)
    from cosearch_lib.config import SamplingConfig
    ranker = LLMRanker(backend, chat, ProtocolConfig(search=SearchBudget(topk=2)), SamplingConfig(max_new_tokens=64, stop=("</rerank>",)), adapter="ranker")
    engine = RolloutEngine(backend, chat, FixedRetriever(CORPUS), ranker, RolloutConfig(search=SearchBudget(topn=5, topk=2)), ProtocolConfig(search=SearchBudget(topk=2)))
    good, bad = engine.run([QUESTION], n_samples=2)
    g, b = good.ranker_calls[0], bad.ranker_calls[0]
    assert g.valid and g.order == [2, 0] and g.shown_labels[0] == 1 and g.output_text.endswith("</rerank>")
    assert len(g.output_ids) == len(g.output_logprobs) > 0 and g.prompt_ids[: 3] == chat.prompt_ids([{"role": "user", "content": "x"}])[:3]
    assert not b.valid and b.error is not None and b.order == [0, 1]  # fallback: retriever top-K
    ranker_calls = [c for c in backend.calls if c[2] == "ranker"]
    assert len(ranker_calls) == 1 and len(ranker_calls[0][0]) == 2  # both searches ranked in one batch


def test_invalid_turn_retires_and_max_searches_caps(tok, chat):
    engine, _, _ = _engine(tok, chat, ["I think it is Kessmere."])
    (t,) = engine.run([QUESTION])
    assert t.finish == "invalid" and not t.format_ok and t.answer is None and t.f1 == 0.0
    engine, _, retriever = _engine(tok, chat, lambda key: search_turn(f"try {key[-1]}"), max_searches=2)
    (t,) = engine.run([QUESTION])
    assert t.finish == "max_searches" and t.n_search_turns == 3 and t.n_searches == 2 and len(t.ranker_calls) == 2 and len(retriever.calls) == 2


def test_invalid_turn_can_continue_with_a_corrective_note(tok, chat):
    engine, _, _ = _engine(tok, chat, ["no tags at all", answer_turn("Kessmere")], stop_on_invalid=False)
    (t,) = engine.run([QUESTION])
    assert t.finish == "answer" and t.answer == "Kessmere" and not t.format_ok  # f = 0: one turn broke the protocol
    assert "did not follow the protocol" in tok.decode(t.token_ids)


def test_real_transformers_backend_records_match_teacher_forcing(tok, chat):
    """SmolLM2 rolls out for real; the recorded old logprobs equal a teacher-forced recomputation."""
    from cosearch_lib.models.generation.teacher_forced import reference_logprobs
    from cosearch_lib.models.generation.transformers_backend import TransformersBackend
    from cosearch_lib.models.registry import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2-135m-instruct", device="cpu")
    engine = RolloutEngine(TransformersBackend(model, tokenizer, batch_size=4), chat, FixedRetriever(CORPUS), RetrievalOnlyRanker(),
                           RolloutConfig(search=SearchBudget(topn=5, topk=2, max_searches=1), agent_max_new_tokens=32, temperature=1.0),
                           ProtocolConfig(search=SearchBudget(topk=2)))
    trajs = engine.run([QUESTION], n_samples=2, seed=3)
    for t in trajs:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.old_logprobs) and sum(t.loss_mask) > 0
        recomputed = reference_logprobs(model, [t.token_ids], [t.prompt_len])[0]
        gen = [(lp, rc) for lp, rc, m in zip(t.old_logprobs[t.prompt_len:], recomputed, t.loss_mask[t.prompt_len:]) if m]
        assert max(abs(a - b) for a, b in gen) < 1e-3
    again = engine.run([QUESTION], n_samples=2, seed=3)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs]  # same seed -> same records


def test_the_step_column_hit_at_k_reads_all_k_shown_passages_not_the_first_five():
    """Hit@K (the step column ``hit@K``) is 1 when any of the K passages shown holds an answer: with
    K = 6 and the answer shown sixth, Hit@5 is 0 and Hit@K is 1; with nothing shown, 0."""
    from cosearch_lib.agent.rollout import RankerCall
    from cosearch_lib.metrics import hit_at_k

    def call(order):
        return RankerCall(traj_id="t", question_id="q", sample=0, turn=0, q0="q", sub_query="s",
                          candidate_ids=[str(i) for i in range(8)], relevant=[0, 0, 0, 0, 0, 0, 1, 0], order=order,
                          valid=True, error=None, prompt_ids=[], output_ids=[], output_logprobs=[], output_text="")

    shown_sixth = call([0, 1, 2, 3, 4, 6])
    assert shown_sixth.shown_hit == 1.0 and hit_at_k([shown_sixth.relevant[i] for i in shown_sixth.order], 5) == 0.0
    assert call([0, 1, 2, 3, 4, 5]).shown_hit == 0.0 and call([]).shown_hit == 0.0


def test_engines_rolled_out_together_batch_what_they_share_and_each_gets_its_own_rollouts(tok, chat):
    """run_together: engines with one agent backend and adapter decode each turn in one call; an
    engine with another adapter gets calls of its own, and keeps going after the others ended
    (its rows answer a turn later). Every engine's trajectories are those it rolls out alone."""
    from cosearch_lib.agent.rollout import run_together

    def respond(prompt, key):
        searches_first = key[-1] == 0 and "search first" in tok.decode(prompt)
        return search_turn("Orvane Tellis birthplace") if searches_first else answer_turn("Kessmere")

    def engines(backend, adapters):
        budget = SearchBudget(topn=5, topk=2)
        return [RolloutEngine(backend, chat, FixedRetriever(CORPUS), ranker, RolloutConfig(search=budget),
                              ProtocolConfig(search=SearchBudget(topk=2)), agent_adapter=adapter)
                for ranker, adapter in zip((RetrievalOnlyRanker(), OracleRanker(), RetrievalOnlyRanker()), adapters)]

    questions = [QUESTION, QAExample(id="q2", question="search first: where was Orvane Tellis born?",
                                     golden_answers=["Kessmere"], data_source="syn_nq")]
    backend = ScriptedBackend(tok, respond)
    together = run_together(engines(backend, ["a", "a", "b"]), questions, n_samples=2)
    # turn 0: adapter a's 8 rows in one call, b's 4 in another; turn 1: only the q2 rows still run
    assert [(c[2], len(c[0])) for c in backend.calls] == [("a", 8), ("b", 4), ("a", 4), ("b", 2)]
    for engine, trajs in zip(engines(ScriptedBackend(tok, respond), ["a", "a", "b"]), together):
        alone = engine.run(questions, n_samples=2)
        assert [t.token_ids for t in trajs] == [t.token_ids for t in alone]
        assert [t.n_searches for t in trajs] == [0, 0, 1, 1] and {t.answer for t in trajs} == {"Kessmere"}
    # an engine whose rows have all ended sits out the turns another, with its own adapter, still takes
    from cosearch_lib.agent.rollout import _generate_turn

    backend = ScriptedBackend(tok, respond)
    pair = engines(backend, ["a", "b"])
    running = pair[1].new_trajectories(questions[1:], 1)
    gens = _generate_turn(pair, [[], running], turn=1, seed=0, step=0)
    assert gens[0] == [] and len(gens[1]) == 1 and [(c[2], len(c[0])) for c in backend.calls] == [("b", 1)]
