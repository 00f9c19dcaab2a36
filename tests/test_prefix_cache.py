"""Prefix caching and the device-side decode loop of TransformersBackend.

What must hold: cached prompt prefixes (shared instructions, a trajectory's earlier turns) change
nothing but the cost: greedy ids identical to a run without the cache and to ``model.generate``;
sampled ids identical and log-probs within 1e-4 (float32) of the uncached run and of teacher
forcing; results independent of how often the host looks at the sampled ids (``sync_every``);
the counter-based uniforms depend only on (row seed, token index) and are uniform."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from cosearch_lib.agent.chat_tokens import ChatTokens
from cosearch_lib.agent.rankers import RetrievalOnlyRanker
from cosearch_lib.agent.rollout import RolloutEngine
from cosearch_lib.config import ProtocolConfig, RolloutConfig, SamplingConfig, SearchBudget
from cosearch_lib.models.generation.adapters import merged_adapter
from cosearch_lib.models.generation.contract import prefix_scope
from cosearch_lib.models.generation.counter_rng import counter_uniforms, pcg_hash, seed_halves
from cosearch_lib.models.generation.prefix_cache import KVPrefix, PrefixStore, common_prefix_length
from cosearch_lib.models.generation.teacher_forced import reference_logprobs
from cosearch_lib.models.generation.transformers_backend import TransformersBackend

from tests.doubles import CORPUS, QUESTIONS, FixedRetriever, peaked_model

LOGPROB_TOL = 1e-4  # float32 on the CPU: cached vs uncached vs teacher-forced log-probs

INSTRUCTIONS = ("You are a search agent. Think inside reason tags, then either search with a tool call or "
                "answer inside answer tags. Keep every turn short and follow the protocol exactly.")
QUESTION_TEXTS = ["Who founded the city of Varn?", "Which river crosses Olden?", "When was the Tarsk bridge built?",
                  "Who wrote the Book of Ash?"]


@pytest.fixture(scope="module")
def model(tok):
    return peaked_model(tok)


@pytest.fixture(scope="module")
def prompts(tok):
    head = tok.encode(INSTRUCTIONS)
    return [head + tok.encode(" " + q) for q in QUESTION_TEXTS]


def graph_counter():
    """A torch.compile backend that records each graph it is handed (its node count) and runs it as traced."""
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    return graphs, counting_backend


def backend(model, tok, **kw):
    return TransformersBackend(model, tok, batch_size=kw.pop("batch_size", 4), **kw)


# ------------------------------------------------------------------------------ counter-based uniforms


def test_counter_uniforms_depend_only_on_seed_and_index():
    seeds = [0, 1, 2**40 + 7, 2**63 - 1]
    u = torch.stack([counter_uniforms(seed_halves(seeds), t) for t in range(5)])  # (5, 4)
    again = torch.stack([counter_uniforms(seed_halves(seeds[::-1]), t) for t in range(5)]).flip(1)
    assert torch.equal(u, again)  # the row's position in the batch plays no part
    alone = counter_uniforms(seed_halves([seeds[2]]), 3)
    assert alone.item() == u[3, 2].item()
    assert len(set(u.flatten().tolist())) == u.numel()  # distinct seeds and indices: distinct numbers
    assert ((u >= 0) & (u < 1)).all() and u.dtype == torch.float64
    # a per-row counter (tensor) gives each row its own index
    per_row = counter_uniforms(seed_halves(seeds), torch.tensor([0, 1, 2, 3]))
    assert per_row.tolist() == [u[i, i].item() for i in range(4)]
    with pytest.raises(ValueError, match="2\\*\\*63"):
        seed_halves([-1])


def test_counter_uniforms_are_uniform_and_uncorrelated():
    halves = seed_halves(list(range(20000)))
    u0, u1 = counter_uniforms(halves, 0), counter_uniforms(halves, 1)
    counts = torch.histc(u0.float(), bins=20, min=0, max=1)
    chi2 = float(((counts - 1000) ** 2 / 1000).sum())
    assert chi2 < 43.8  # chi-square, 19 degrees of freedom, p = 0.001
    assert abs(float(u0.mean()) - 0.5) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([u0, u1]))[0, 1])) < 0.03  # neighbouring indices
    # consecutive seeds do not give neighbouring numbers
    assert abs(float(torch.corrcoef(torch.stack([u0[:-1], u0[1:]]))[0, 1])) < 0.03


def test_pcg_hash_stays_in_32_bits_and_mixes():
    x = torch.tensor([0, 1, 2, 0xFFFFFFFF], dtype=torch.long)
    h = pcg_hash(x)
    assert ((h >= 0) & (h <= 0xFFFFFFFF)).all()
    assert len(set(h.tolist())) == 4
    # one flipped input bit flips about half of the output bits
    flips = [bin(int(a) ^ int(b)).count("1") for a, b in zip(pcg_hash(torch.arange(1000)), pcg_hash(torch.arange(1000) ^ 1))]
    assert 12 < sum(flips) / len(flips) < 20


# ------------------------------------------------------------------------------ the store


def _prefix(ids, shared, width=4):
    t = torch.zeros((1, len(ids), width))
    return KVPrefix(tuple(ids), [t], [t.clone()], shared=shared)


def test_store_finds_longest_prefix_consumes_rows_and_evicts_by_bytes():
    store = PrefixStore()
    store.add(None, _prefix([1, 2], shared=True))
    store.add(None, _prefix([1, 2, 3, 4], shared=False))
    store.add("ranker", _prefix([1, 2, 3], shared=True))
    assert store.longest(None, [1, 2, 3, 4, 5]).ids == (1, 2, 3, 4)
    assert store.longest(None, [1, 2, 3, 4, 5]).ids == (1, 2)  # the row prefix was used up
    assert store.longest(None, [1, 2]) is None  # a prefix must leave a token to run
    assert store.longest(None, [9, 1, 2]) is None
    assert store.longest("ranker", [1, 2, 3, 7]).ids == (1, 2, 3)  # adapters do not mix
    assert store.longest(None, [1, 2, 3, 7], consume=False).ids == (1, 2)
    assert (store.hits, store.misses) == (3, 2)
    one = _prefix([5, 6], shared=True).nbytes
    small = PrefixStore(max_bytes=2 * one)
    for start in (10, 20, 30):
        small.add(None, _prefix([start, start + 1], shared=True))
    assert len(small) == 2 and small.nbytes == 2 * one
    assert small.longest(None, [10, 11, 12]) is None  # the least recently used went first
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1], [2]]) == 0


# ------------------------------------------------------------------------------ cached generation


def test_shared_prefix_runs_once_and_changes_nothing(model, tok, prompts):
    assert common_prefix_length(prompts) >= 30
    greedy = SamplingConfig(temperature=0, max_new_tokens=10)
    cached_be = backend(model, tok)
    cached = cached_be.generate(prompts, greedy)
    assert cached_be.last_stats["hit_tokens"] >= 4 * 30  # every row started from the shared prefix
    plain = backend(model, tok, share_prefixes=False).generate(prompts, greedy)
    for p, c, u in zip(prompts, cached, plain):
        assert c.token_ids == u.token_ids
        assert c.logprobs == pytest.approx(u.logprobs, abs=LOGPROB_TOL)
        ids = torch.tensor([p])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                            pad_token_id=2, eos_token_id=2)[0, len(p):].tolist()
        assert c.token_ids == hf
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=5)
    a = backend(model, tok).generate(prompts, sampled)
    b = backend(model, tok, share_prefixes=False).generate(prompts, sampled)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    ref = reference_logprobs(model, [p + g.token_ids for p, g in zip(prompts, a)], [len(p) for p in prompts])
    for g, r, u in zip(a, ref, b):
        assert g.logprobs == pytest.approx(r, abs=LOGPROB_TOL)
        assert g.logprobs == pytest.approx(u.logprobs, abs=LOGPROB_TOL)


def test_prefixes_shared_by_some_rows_only_run_once_and_change_nothing(model, tok, prompts):
    """G samples of one question repeat its prompt; two ranker calls list the same candidates: the
    rows that go on alike share a prefix beyond the instructions, computed once for them."""
    tail = tok.encode(" Passages: [1] The archive of Varn records its founding by three families of weavers.")
    repeated = prompts[0] + tok.encode(" Answer with the shortest span; the first founder's name is enough here.")
    rows = [repeated] * 3 + [prompts[1] + tail, prompts[1] + tail + tok.encode(" More."), prompts[2]]
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=9)
    keys = list(range(len(rows)))
    be = backend(model, tok, batch_size=8)
    with prefix_scope(be) as store:
        shared = be.generate(rows, sampled, row_keys=keys)
        prefix_lengths = sorted(len(ids) for _, ids in store._entries)
    common = common_prefix_length(rows)
    # the instructions, the repeated prompt (all but its last token), the two rows' shared prompt
    assert prefix_lengths == sorted([common, len(prompts[1] + tail) - 1, len(repeated) - 1])
    expected_hits = 3 * (len(repeated) - 1) + 2 * (len(prompts[1] + tail) - 1) + common
    assert be.last_stats["hit_tokens"] == expected_hits
    plain = backend(model, tok, batch_size=8, share_prefixes=False).generate(rows, sampled, row_keys=keys)
    for s, p in zip(shared, plain):
        assert s.token_ids == p.token_ids
        assert s.logprobs == pytest.approx(p.logprobs, abs=LOGPROB_TOL)
    # below min_shared_prefix tokens beyond what is cached, a shared stretch is not worth its own pass
    lazy = backend(model, tok, batch_size=8, min_shared_prefix=len(tail) + 8)
    with prefix_scope(lazy) as store:
        lazy.generate(rows, sampled, row_keys=keys)
        assert len(prompts[1] + tail) - 1 not in {len(ids) for _, ids in store._entries}


def test_next_turn_reads_only_new_tokens_inside_a_scope(model, tok, prompts):
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=2)
    observation = tok.encode(" Observation: the Varn archive lists three founders.")
    be = backend(model, tok)
    with prefix_scope(be, keep_rows_for=(None,)) as store:
        turn0 = be.generate(prompts, sampled, row_keys=[("t0", i) for i in range(4)])
        second = [p + g.token_ids + observation for p, g in zip(prompts, turn0)]
        turn1 = be.generate(second, sampled, row_keys=[("t1", i) for i in range(4)])
        # each row continued from its own previous turn: everything but its last sampled token was cached
        assert be.last_stats["hit_tokens"] == sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, turn0))
        assert len(store) >= 1
    assert be._scope is None  # closed: later calls start fresh
    fresh = backend(model, tok, share_prefixes=False).generate(second, sampled, row_keys=[("t1", i) for i in range(4)])
    for c, f in zip(turn1, fresh):
        assert c.token_ids == f.token_ids
        assert c.logprobs == pytest.approx(f.logprobs, abs=LOGPROB_TOL)
    # a mixed batch: rows with a cached previous turn next to rows without one (holes in the cache)
    with prefix_scope(be, keep_rows_for=(None,)):
        be.generate(prompts[:2], sampled, row_keys=[("t0", i) for i in range(2)])
        mixed = be.generate(second[:2] + prompts[2:], sampled, row_keys=[("t1", 0), ("t1", 1), ("t0", 2), ("t0", 3)])
    assert [g.token_ids for g in mixed] == [g.token_ids for g in fresh[:2]] + [g.token_ids for g in turn0[2:]]


def test_rows_are_kept_only_for_the_named_adapter(model, tok, prompts):
    be = backend(model, tok)
    with prefix_scope(be, keep_rows_for=("agent",)) as store:
        be.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=4))
        assert len(store) == 1  # only the shared prefix: adapter None is not kept row by row
        with prefix_scope(be, keep_rows_for=(None,)) as inner:
            assert inner is store and store.keeps_rows(None)
        assert not store.keeps_rows(None) and store.keeps_rows("agent")


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.9, max_new_tokens=12, seed=4, stop=("e",)),
                                      SamplingConfig(temperature=0, max_new_tokens=12, stop=("a",))])
def test_results_do_not_depend_on_sync_interval(model, tok, prompts, sampling):
    runs = [backend(model, tok, sync_every=k).generate(prompts, sampling) for k in (1, 3, 64)]
    for other in runs[1:]:
        assert [(g.token_ids, g.text, g.finish_reason) for g in other] == \
               [(g.token_ids, g.text, g.finish_reason) for g in runs[0]]
    assert any(g.finish_reason == "stop" for g in runs[0])  # the stop rule was exercised


def test_stop_tokens_are_those_that_can_end_a_stop(model, tok):
    be = backend(model, tok)
    cand = be.stop_tokens(("</answer>", "</tool_call>"))
    gt = tok.convert_tokens_to_ids(">")
    assert gt in cand and tok.encode("hello")[0] not in cand
    texts = {i: tok.decode([i]) for i in range(0, len(tok), 97)}
    assert all((i in cand) == (">" in t or not t or "\ufffd" in t) for i, t in texts.items())
    assert be.stop_tokens(("</answer>", "</tool_call>")) is cand  # computed once per stop set


def test_bad_settings_are_named(model, tok):
    with pytest.raises(ValueError, match="sync_every"):
        TransformersBackend(model, tok, sync_every=0)
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixStore(max_bytes=-1)


def test_rollout_with_cached_prefixes_equals_rollout_without(model, tok):
    """A multi-turn rollout (corrective notes keep trajectories going) gives the same records with
    and without the prefix cache, and later turns are served from the trajectory's earlier ones."""
    budget = SearchBudget(topn=4, topk=2, max_searches=2)
    cfg = RolloutConfig(search=budget, agent_max_new_tokens=6, temperature=1.0, stop_on_invalid=False,
                        max_context_tokens=900)
    chat = ChatTokens(tok)
    runs = {}
    for cached in (True, False):
        be = backend(model, tok, share_prefixes=cached)
        calls = []
        generate = be.generate

        def counting(prompts, sampling, adapter=None, row_keys=None, _be=be, _calls=calls, _gen=generate):
            out = _gen(prompts, sampling, adapter=adapter, row_keys=row_keys)
            _calls.append(dict(_be.last_stats))
            return out

        be.generate = counting
        engine = RolloutEngine(be, chat, FixedRetriever(CORPUS), RetrievalOnlyRanker(), cfg, ProtocolConfig(search=budget))
        runs[cached] = (engine.run(QUESTIONS[:2], n_samples=2, seed=7), calls)
    (cached, calls), (plain, _) = runs[True], runs[False]
    assert max(len(t.turns) for t in cached) >= 3  # several turns happened
    for a, b in zip(cached, plain):
        assert a.token_ids == b.token_ids
        assert a.old_logprobs == pytest.approx(b.old_logprobs, abs=LOGPROB_TOL)
    # turn 0 starts from the shared instructions; every later turn from the trajectory's previous one
    assert calls[0]["hit_tokens"] >= 4 * 30 and all(c["misses"] == 0 for c in calls[1:])


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, max_new_tokens=10),
                                      SamplingConfig(temperature=1.0, max_new_tokens=10, seed=9)])
def test_static_and_dynamic_caches_agree(model, tok, prompts, sampling):
    ragged = [p[: len(p) - 3 * i] for i, p in enumerate(prompts)]  # rows of different lengths: padding
    static = backend(model, tok, static_cache=True).generate(ragged, sampling)
    dynamic = backend(model, tok, static_cache=False).generate(ragged, sampling)
    for a, b in zip(static, dynamic):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
    assert backend(model, tok).static_cache is (model.device.type == "cuda")  # default: static on a GPU only


def test_a_compiled_decode_step_keeps_finished_rows_and_samples_what_the_eager_loop_samples(model, tok, prompts):
    """With compile_decode the batch keeps its finished rows (fixed shapes for a compiled step and
    CUDA graphs): the live rows' samples must not change, and the step must be traced as one whole
    graph per shape, not retraced every token. The trace is checked with a counting backend (what
    torch.compile would hand to inductor); the CUDA-graph mode itself needs a GPU."""
    graphs, counting_backend = graph_counter()
    ragged = [p[: len(p) - 3 * i] for i, p in enumerate(prompts)]
    compiled = backend(model, tok, static_cache=True, compile_decode=True,
                       compile_options={"backend": counting_backend, "fullgraph": True})
    assert compiled.compile_decode
    lengths = []
    for sampling in (SamplingConfig(temperature=0.9, max_new_tokens=14, seed=4, stop=("e",)),
                     SamplingConfig(temperature=0, max_new_tokens=14, stop=("a",))):
        for rows in (ragged, ragged[:3], ragged[1:3]):  # three batch sizes, three cache widths
            got = compiled.generate(rows, sampling)
            eager = backend(model, tok).generate(rows, sampling)  # dynamic cache, finished rows dropped
            assert [(g.token_ids, g.finish_reason) for g in got] == [(g.token_ids, g.finish_reason) for g in eager]
            for a, b in zip(got, eager):
                assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
            lengths.append(len({len(g.token_ids) for g in got}))
    assert max(lengths) > 1  # rows ended at different tokens: finished rows rode along in the batch
    assert 1 <= len(graphs) <= 3  # one graph, then at most a re-trace with dynamic shapes: not one per token
    assert not backend(model, tok).compile_decode  # default: compiled on a GPU only
    with pytest.raises(ValueError, match="static_cache"):
        backend(model, tok, static_cache=False, compile_decode=True)


def test_a_decode_step_that_cannot_be_compiled_runs_eagerly_with_a_warning(model, tok, prompts):
    """A GPU node without a C compiler (Triton needs one) or an unsupported operation: the first
    compilation fails; generation goes on eagerly with the same samples and says why, once."""
    attempts = []

    def broken_backend(gm, example_inputs):
        attempts.append(1)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    sampling = SamplingConfig(temperature=0.9, max_new_tokens=12, seed=4, stop=("e",))
    failing = backend(model, tok, compile_decode=True, compile_options={"backend": broken_backend})
    with pytest.warns(RuntimeWarning, match="compiling the decode step failed .*C compiler.*decoding eagerly"):
        got = failing.generate(prompts, sampling)
    assert not failing.compile_decode and attempts == [1]
    want = backend(model, tok).generate(prompts, sampling)
    assert [(g.token_ids, g.finish_reason) for g in got] == [(g.token_ids, g.finish_reason) for g in want]
    again = failing.generate(prompts, sampling)  # no second attempt
    assert attempts == [1] and [g.token_ids for g in again] == [g.token_ids for g in want]


def test_merged_lora_samples_like_the_adapter_and_restores_the_base(tok, prompts):
    model = peaked_model(tok, seed=3)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(model, lora, adapter_name="agent")
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # a non-zero update, so merging has something to fold in
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    base_weights = {n: p for n, p in peft_model.named_parameters() if "base_layer" in n}
    snapshot = {n: p.detach().clone() for n, p in base_weights.items()}
    grads = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    for sampling in (SamplingConfig(temperature=0, max_new_tokens=8), SamplingConfig(temperature=1.0, max_new_tokens=8, seed=1)):
        merged = backend(peft_model, tok, merge_lora=True).generate(prompts, sampling, adapter="agent")
        plain = backend(peft_model, tok, merge_lora=False).generate(prompts, sampling, adapter="agent")
        base = backend(peft_model, tok).generate(prompts, sampling, adapter=None)
        for a, b in zip(merged, plain):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
        assert any(a.token_ids != c.token_ids for a, c in zip(merged, base))  # the adapter really acted
    after = dict(peft_model.named_parameters())
    for n, p in base_weights.items():  # the very same tensors, unchanged bit for bit
        assert after[n] is p and torch.equal(p, snapshot[n])
    assert {n: p.requires_grad for n, p in peft_model.named_parameters()} == grads
    with pytest.raises(RuntimeError, match="inside"), merged_adapter(peft_model, "agent") as did_merge:
        assert did_merge
        raise RuntimeError("inside")
    assert all(dict(peft_model.named_parameters())[n] is p for n, p in base_weights.items())


def test_a_compiled_decode_step_follows_the_adapter_and_its_updates(tok, prompts):
    """The trainer's flow: agent and ranker adapters alternate, merged into the base weights for
    sampling, and an update changes the adapter weights in place between rollouts. One compiled
    model serves all of it: each call samples what the eager loop samples with the weights of
    that moment, and adapters do not multiply the graphs past a few."""
    graphs, counting_backend = graph_counter()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(peaked_model(tok, seed=5), lora, adapter_name="agent")
    peft_model.add_adapter("ranker", lora)
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for i, p in enumerate(lora_b):
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(i))
    compiled = backend(peft_model, tok, compile_decode=True, compile_options={"backend": counting_backend, "fullgraph": True})
    eager = backend(peft_model, tok)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=3)
    seen = []
    for adapter in ("agent", "ranker", "agent", "ranker"):
        if len(seen) == 2:  # an update between rollouts, in place, as the optimizer does
            with torch.no_grad():
                for p in lora_b:
                    p.mul_(-1.5)
        got = compiled.generate(prompts, sampling, adapter=adapter)
        want = eager.generate(prompts, sampling, adapter=adapter)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for a, b in zip(got, want):
            assert a.logprobs == pytest.approx(b.logprobs, abs=LOGPROB_TOL)
        seen.append([g.token_ids for g in got])
    assert seen[0] != seen[1] and seen[0] != seen[2]  # the adapters differ, and the update changed the agent
    assert 1 <= len(graphs) <= 4
