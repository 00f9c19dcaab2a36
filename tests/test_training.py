"""The joint trainer: roles per method, micro-batched GRPO updates equal one big batch, a full joint
step changes exactly the trained adapters, and resuming after a kill gives the same records.

Rollouts come from a scripted backend (a real untrained model fails the protocol on every turn,
so all rewards would tie and no gradient would flow); the updates run on a real transformers model:
a tiny random Llama with SmolLM2's tokenizer (fast)."""

from __future__ import annotations

import math

import pytest
import torch

import cosearch_lib.rl.trainer as trainer_mod
from cosearch_lib.config import GRPOConfig, TrainConfig, UpdateSettings
from cosearch_lib.models.adapter_weights import adapter_change
from cosearch_lib.models.generation.teacher_forced import reference_logprobs
from cosearch_lib.models.lora_policies import PolicySet, adapter_parameters, lora_model
from cosearch_lib.rl.policy_sequences import PolicySequence, policy_token_logprobs, shared_prefix_length
from cosearch_lib.rl.policy_update import UpdateJob, grpo_update, micro_batches, update_checkpointing
from cosearch_lib.run_schema import latest_checkpoint
from cosearch_lib.seeding import step_order as question_order

from tests.doubles import LORA, peaked_model, tiny_model, trainer


def snapshot(model, adapter=None):
    if adapter is None:
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    return {n: p.detach().clone() for n, p in adapter_parameters(model, adapter).items()}


def changed(before, model):
    now = dict(model.named_parameters())
    return [n for n, p in before.items() if not torch.equal(p, now[n].detach())]


# ------------------------------------------------------------------------------ config and sampling


def test_roles_and_trainable_adapters_per_method():
    assert TrainConfig(method="cosearch").roles() == {"agent": "agent", "ranker": "ranker"}
    assert TrainConfig(method="cosearch").trainable() == {"agent", "ranker"}
    assert TrainConfig(method="fixed_ranker").trainable() == {"agent"}
    assert TrainConfig(method="search_r1").roles() == {"agent": "agent", "ranker": None}
    assert TrainConfig(method="oracle").ranking == "oracle"
    shared = TrainConfig(method="cosearch", shared_backbone=True)
    assert shared.roles() == {"agent": "shared", "ranker": "shared"} and shared.trainable() == {"shared"}
    for bad in ({"method": "ppo"}, {"group_size": 1}, {"steps": 0},
                {"grpo": GRPOConfig(aggregation="seq-mean-token-sum-norm")}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_question_order_is_a_fresh_permutation_each_epoch_and_depends_only_on_seed_and_step():
    n, per = 5, 2
    order = [i for step in range(5) for i in question_order(n, step, per, seed=3)]  # 10 = two epochs
    assert sorted(order[:5]) == list(range(5)) and sorted(order[5:]) == list(range(5))
    assert question_order(n, 3, per, seed=3) == order[6:8]
    assert question_order(n, 0, per, seed=4) != question_order(n, 0, per, seed=3) or \
        question_order(n, 1, per, seed=4) != question_order(n, 1, per, seed=3)


def test_a_step_never_holds_a_question_twice_when_the_epoch_wraps():
    """Issue 36, suspected bug 1: a step that spans two epochs took the end of one permutation and
    the start of the next, so it could hold a question twice; both copies then had the same row keys
    (identical samples) and merged into one group of 2G."""
    wrapped = 0
    for n, per in ((3, 2), (5, 3), (7, 4), (4, 4)):
        for seed in range(20):
            for step in range(12):
                items = question_order(n, step, per, seed=seed)
                assert len(set(items)) == per, (n, per, seed, step, items)
                wrapped += (step * per) // n != ((step + 1) * per - 1) // n
    assert wrapped > 100  # the cases that span two epochs were exercised
    order = [i for step in range(10) for i in question_order(7, step, 4, seed=1)]  # still a permutation per epoch
    assert all(sorted(order[e * 7:(e + 1) * 7]) == list(range(7)) for e in range(5))
    with pytest.raises(ValueError, match="more items per step"):
        question_order(3, 0, 4, seed=0)


def test_the_trainers_step_gives_every_trajectory_its_own_id_and_row_keys_when_the_epoch_wraps(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, steps=2)  # 3 questions, 2 per step: step 1 spans two epochs
    batch = t._rollouts(1)
    ids = [tr.traj_id for tr in batch.trajectories]
    assert len(set(ids)) == len(ids) == 2 * t.cfg.group_size
    assert len({tr.question_id for tr in batch.trajectories}) == 2
    assert batch.local == tuple(range(len(ids)))  # one process: every row is its own


# ------------------------------------------------------------------------------ the update


def _sequences(tok, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        length = 6 + i
        ids = torch.randint(10, 500, (length,), generator=g).tolist()
        mask = [0] * 3 + [1] * (length - 3)
        old = [0.0] * 3 + (-torch.rand(length - 3, generator=g) * 3).tolist()
        seqs.append(PolicySequence(ids, mask, old))
    return seqs


def test_head_only_at_scored_positions_equals_the_full_forward(tok):
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    seqs = _sequences(tok, n=3)
    from cosearch_lib.rl.policy_sequences import padded_batch

    ids, attn, mask, _ = padded_batch(seqs, 0, "cpu")
    full = policy_token_logprobs(model, ids, attn, temperature=0.7)
    sparse = policy_token_logprobs(model, ids, attn, temperature=0.7, mask=mask)
    assert torch.allclose(sparse, full * mask, atol=1e-5)
    assert (sparse[mask == 0] == 0).all() and (sparse[mask == 1] < 0).all()


def _prefixed_sequences(tok, prefix, n=4, seed=0):
    """Sequences that start with ``prefix`` (unscored, like an agent's instructions) and go on with
    distinct scored tokens of different lengths."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        tail = [20 + i] + torch.randint(10, 500, (5 + 2 * i,), generator=g).tolist()  # distinct first token
        old = (-torch.rand(len(tail), generator=g) * 3).tolist()
        seqs.append(PolicySequence(prefix + tail, [0] * len(prefix) + [1] * len(tail), [0.0] * len(prefix) + old))
    return seqs


@pytest.mark.parametrize("grouped", [False, True])
def test_a_shared_prefix_run_once_gives_the_same_log_probs_and_gradient(tok, grouped):
    """The prefix runs once; two micro-batches read it and leave their gradient on it; one backward
    through the prefix then gives every LoRA weight the gradient of running it in every row."""
    from cosearch_lib.models.generation.grouped_attention import use_grouped_attention
    from cosearch_lib.rl.policy_sequences import SharedPrefix, padded_batch

    model = lora_model(peaked_model(tok, seed=2), {"agent": None}, LORA)  # 4 query heads on 2 key/value heads
    assert use_grouped_attention(model) if grouped else True
    torch.manual_seed(3)
    params = adapter_parameters(model, "agent")
    for p in params.values():  # non-zero B, so the prefix's keys and values depend on the LoRA weights
        torch.nn.init.normal_(p, std=0.05)
    prefix_ids = tok.encode("You are a search agent. Think inside reason tags, then search or answer, and keep it short.")
    seqs = _prefixed_sequences(tok, prefix_ids)
    assert shared_prefix_length(seqs) == len(prefix_ids) >= 16
    ids, attn, mask, _ = padded_batch(seqs, 0, "cpu")
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(4))
    runs = {}
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        prefix = SharedPrefix.run(model, prefix_ids, "cpu") if shared else None
        lps = []
        for rows in (slice(0, 2), slice(2, 4)):  # two micro-batches
            lp = policy_token_logprobs(model, ids[rows], attn[rows], temperature=0.7, mask=mask[rows], prefix=prefix)
            (lp * weights[rows]).sum().backward()
            lps.append(lp.detach())
        if prefix is not None:
            prefix.backward()
        runs[shared] = (torch.cat(lps), {n: p.grad.clone() for n, p in params.items()})
    (lp0, g0), (lp1, g1) = runs[False], runs[True]
    assert torch.allclose(lp0, lp1, atol=1e-5)
    assert all(float((g0[n] - g1[n]).norm()) <= 1e-5 * float(g0[n].norm()) + 1e-7 for n in g0)  # float rounding only
    assert sum(float(g.abs().sum()) for n, g in g0.items() if "lora_A" in n) > 0  # the prefix really carried gradient
    # without the prefix's own backward, the gradient would be missing its share: the test can tell
    model.zero_grad(set_to_none=True)
    prefix = SharedPrefix.run(model, prefix_ids, "cpu")
    (policy_token_logprobs(model, ids, attn, temperature=0.7, mask=mask, prefix=prefix) * weights).sum().backward()
    assert any(float((p.grad - g0[n]).norm()) > 1e-3 * float(g0[n].norm()) for n, p in params.items())
    # through grpo_update (micro-batches of 2 and 1, KL on): the same gradient norm either way
    for micro in (2, 1):
        norms = []
        for shared in (False, True):
            policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})
            stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, [1.0, -0.5, 2.0, -1.5], 1.0)],
                                UpdateSettings(GRPOConfig(kl_coef=0.05), micro_batch=micro, max_grad_norm=0.0,
                                               shared_prefix=shared), pad_id=0)
            norms.append(stats["grad_norm"])
        assert norms[0] > 0 and math.isclose(norms[0], norms[1], rel_tol=1e-4)


def test_prompt_groups_run_each_prompt_once_per_micro_batch_with_the_same_gradient(tok, monkeypatch):
    """G samples of two different prompts (the relevance training's groups): micro-batches stay in a
    group, each runs its group's whole prompt once, and the gradient is the plain update's."""
    from cosearch_lib.rl import policy_update
    from cosearch_lib.rl.policy_update import grouped_micro_batches

    assert grouped_micro_batches([0, 1, 2, 3, 4, 5], [7, 7, 7, 9, 9, 9], 2) == [[0, 1], [2], [3, 4], [5]]
    assert grouped_micro_batches([1, 4, 0], [1, 0, 0, 1, 0], 4) == [[1, 4], [0]]
    model = lora_model(peaked_model(tok, seed=2), {"ranker": None}, LORA)
    torch.manual_seed(5)
    for p in adapter_parameters(model, "ranker").values():
        torch.nn.init.normal_(p, std=0.05)
    prompts = [tok.encode("Rank the passages for the sub-query about the old mill and its builder, best first."),
               tok.encode("Rank the passages for the sub-query about the harbour town and its river, best first.")]
    seqs = [s for k, prompt in enumerate(prompts) for s in _prefixed_sequences(tok, prompt, n=3, seed=k)]
    advantages = [1.0, -0.5, -0.5, 0.8, 0.0, -0.8]
    real_run = policy_update.SharedPrefix.run.__func__
    prefix_lengths = []
    monkeypatch.setattr(policy_update.SharedPrefix, "run", classmethod(
        lambda cls, model_, ids, device: prefix_lengths.append(len(ids)) or real_run(cls, model_, ids, device)))
    norms = {}
    for groups in (None, [0, 0, 0, 1, 1, 1]):
        prefix_lengths.clear()
        policies = PolicySet(model, {"ranker": "ranker"}, ["ranker"], {"ranker": 0.0})
        stats = grpo_update(policies, "ranker", [UpdateJob("ranker", seqs, advantages, 1.0, prompt_groups=groups)],
                            UpdateSettings(GRPOConfig(kl_coef=0.0), micro_batch=2, max_grad_norm=0.0), pad_id=0)
        norms[groups is None] = stats["grad_norm"]
        assert stats["ranker_n_forwarded"] == 5  # the zero-advantage sample is not forwarded
    assert norms[True] > 0 and math.isclose(norms[True], norms[False], rel_tol=1e-4)
    # grouped: micro-batches [0, 1], [2], [3, 5]: a prompt run for each of the two with 2 rows, all of its tokens
    assert len(prefix_lengths) == 2 and all(n >= len(prompts[0]) for n in prefix_lengths)


def test_shared_prefix_length_leaves_a_token_and_skips_short_or_lone_prefixes(tok):
    from cosearch_lib.rl.policy_sequences import SharedPrefix

    a = PolicySequence(list(range(40)), [0] * 40, [0.0] * 40)
    b = PolicySequence(list(range(30)) + [99] * 5, [0] * 35, [0.0] * 35)
    assert shared_prefix_length([a, b]) == 30
    assert shared_prefix_length([a, a]) == 39  # identical sequences: all but the last token
    assert shared_prefix_length([a]) == 0 and shared_prefix_length([a, b], minimum=31) == 0
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    prefix = SharedPrefix.run(model, [5, 6, 7], "cpu")
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 8]])
    with pytest.raises(ValueError, match="must start with the shared prefix"):
        policy_token_logprobs(model, ids, torch.ones_like(ids), temperature=1.0, mask=torch.ones((2, 3)), prefix=prefix)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_gradient_of_one_big_batch(tok, aggregation):
    seqs, advs = _sequences(tok), [1.0, -0.5, 0.0, 2.0, -1.5]
    grads = {}
    for micro in (5, 2, 1):
        model = lora_model(tiny_model(tok), {"agent": None}, LORA)
        torch.manual_seed(1)
        for p in adapter_parameters(model, "agent").values():  # non-zero B so every LoRA tensor gets gradient
            torch.nn.init.normal_(p, std=0.05)
        policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})
        stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, 1.0)],
                            UpdateSettings(GRPOConfig(aggregation=aggregation, kl_coef=0.0), micro_batch=micro,
                                           max_grad_norm=0.0), pad_id=0)
        grads[micro] = stats["grad_norm"]
        assert stats["agent_n_forwarded"] == 4  # the zero-advantage sequence is never forwarded
    assert grads[5] > 0 and math.isclose(grads[2], grads[5], rel_tol=1e-5) and math.isclose(grads[1], grads[5], rel_tol=1e-5)


def test_update_changes_only_the_trained_adapter(tok):
    model = lora_model(tiny_model(tok), {"agent": None, "ranker": None}, LORA)
    policies = PolicySet(model, {"agent": "agent", "ranker": "ranker"}, ["agent"], {"agent": 1e-2})
    base, agent, ranker = snapshot(model), snapshot(model, "agent"), snapshot(model, "ranker")
    stats = grpo_update(policies, "agent", [UpdateJob("agent", _sequences(tok), [1.0, -1.0, 0.5, -0.5, 0.0], 1.0)],
                        UpdateSettings(GRPOConfig(), micro_batch=2, max_grad_norm=1.0), pad_id=0)
    assert changed(agent, model) and not changed(ranker, model) and not changed(base, model)
    assert stats["agent_kl"] == pytest.approx(0.0, abs=1e-6)  # fresh LoRA (B = 0) equals the reference
    assert "ranker" not in policies.optimizers


def _warm_policies(tok, *, lr=0.0, seed=1):
    """One "agent" adapter with non-zero weights (as a warm start leaves it), in a PolicySet."""
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    torch.manual_seed(seed)
    for p in adapter_parameters(model, "agent").values():
        torch.nn.init.normal_(p, std=0.05)
    return PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": lr})


def test_the_kl_reference_start_is_a_frozen_copy_of_the_adapter_as_grpo_began_it(tok, tmp_path):
    """kl_reference: start (issue 48): the KL term reads the trained adapter's start, not the base model.
    At the start the policy is its reference, so the KL is 0 and adds no gradient (the base model's
    reference pulls a warm start back); after steps the adapter moves and its copy does not."""
    seqs, advs = _sequences(tok), [1.0, -0.5, 0.0, 2.0, -1.5]

    def first_gradient(cfg, freeze):
        policies = _warm_policies(tok)
        if freeze:
            policies.freeze_start_references()
        recorder = policies.optimizers["agent"] = GradientRecorder(policies.params["agent"])
        stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, 1.0)],
                            UpdateSettings(cfg, micro_batch=2, max_grad_norm=0.0), pad_id=0)
        return stats, recorder.steps[0]

    no_kl, g_no_kl = first_gradient(GRPOConfig(kl_coef=0.0), False)
    start, g_start = first_gradient(GRPOConfig(kl_coef=0.5, kl_reference="start"), True)
    base, g_base = first_gradient(GRPOConfig(kl_coef=0.5, kl_reference="base"), True)  # a copy exists, unused
    assert start["agent_kl"] == 0.0 and base["agent_kl"] > 1e-4
    _assert_same_gradients(g_start, g_no_kl)
    assert any(not torch.allclose(g_base[n], g_no_kl[n], rtol=1e-3, atol=1e-6) for n in g_base)
    # the copy: frozen, outside the optimizer, the checkpoint and the saved adapters
    policies = _warm_policies(tok, lr=5e-2)
    started = snapshot(policies.model, "agent")
    policies.freeze_start_references()
    policies.freeze_start_references()  # again: nothing changes
    copy = policies.reference_adapter("agent")
    assert copy == "agent_reference" and sorted(policies.model.peft_config) == ["agent", "agent_reference"]
    frozen = adapter_parameters(policies.model, copy)
    assert frozen and not any(p.requires_grad for p in frozen.values())
    assert all(p.requires_grad for p in policies.params["agent"].values()) and policies.model.active_adapter == "agent"
    assert {id(p) for g in policies.optimizers["agent"].param_groups for p in g["params"]}.isdisjoint(map(id, frozen.values()))
    assert list(policies.state_dict()["adapters"]) == ["agent"] and list(policies.save_adapters(tmp_path)) == ["agent"]
    cfg = UpdateSettings(GRPOConfig(kl_coef=0.5, kl_reference="start"), micro_batch=2, max_grad_norm=0.0)
    for _ in range(2):
        stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, 1.0)], cfg, pad_id=0)
    assert stats["agent_kl"] > 0 and changed(started, policies.model)
    assert all(torch.equal(started[n], frozen[n.replace(".agent.", f".{copy}.")]) for n in started)
    with pytest.raises(ValueError, match="have moved from their start"):  # too late: an optimizer stepped
        _fresh = PolicySet(policies.model, {"agent": "agent"}, ["agent"], {"agent": 0.0})
        _fresh.optimizers["agent"] = policies.optimizers["agent"]
        _fresh.freeze_start_references()
    loaded = _warm_policies(tok)
    loaded.load_state_dict(_warm_policies(tok).state_dict())
    with pytest.raises(ValueError, match="a checkpoint was loaded"):
        loaded.freeze_start_references()
    with pytest.raises(ValueError, match="has no frozen start copy"):
        grpo_update(_warm_policies(tok), "agent", [UpdateJob("agent", seqs, advs, 1.0)], cfg, pad_id=0)


@pytest.mark.parametrize("groups", [None, [0, 0, 0, 0]])
def test_a_shared_prefix_reads_the_start_reference_as_the_rows_do(tok, groups):
    """With kl_reference: start the shared prompt prefix runs under the start copy for the KL term too:
    with and without prefix sharing, a KL of 0 at the start and the same gradient; after a step the
    KL is the same either way (a prefix run under the base model would give it a different value)."""
    prefix_ids = tok.encode("You are a search agent. Think inside reason tags, then search or answer, and keep it short.")
    seqs = _prefixed_sequences(tok, prefix_ids)
    assert shared_prefix_length(seqs) >= 16
    advs, cfg = [1.0, -0.5, 2.0, -1.5], GRPOConfig(kl_coef=0.5, kl_reference="start")
    runs = {}
    for shared in (False, True):
        policies = _warm_policies(tok, lr=5e-2)
        policies.freeze_start_references()
        settings = UpdateSettings(cfg, micro_batch=2, max_grad_norm=0.0, shared_prefix=shared)
        job = UpdateJob("agent", seqs, advs, 1.0, prompt_groups=groups)  # groups: a prefix per micro-batch
        runs[shared] = [grpo_update(policies, "agent", [job], settings, pad_id=0) for _ in range(2)]
    for plain, sharing in zip(runs[False], runs[True]):
        assert math.isclose(plain["grad_norm"], sharing["grad_norm"], rel_tol=1e-4)
        assert plain["agent_kl"] == pytest.approx(sharing["agent_kl"], rel=1e-4, abs=1e-9)
    assert runs[True][0]["agent_kl"] == 0.0 and runs[True][1]["agent_kl"] > 1e-6


def test_a_checkpoint_names_its_kl_reference_and_a_resume_with_another_start_is_refused(tok):
    trained = _warm_policies(tok, lr=5e-2)
    trained.freeze_start_references()
    state = trained.state_dict()
    assert set(state["references"]) == {"agent"} and len(state["references"]["agent"]) == 64
    same = _warm_policies(tok)
    same.freeze_start_references()
    same.load_state_dict(state)  # the same start: accepted
    other = _warm_policies(tok, seed=2)  # a rebuilt warm start with other weights
    other.freeze_start_references()
    with pytest.raises(ValueError, match="KL reference of adapters \\['agent'\\] is not this run's"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved: start copies; here: the base model"):
        _warm_policies(tok).load_state_dict(state)
    base_state = _warm_policies(tok).state_dict()
    assert base_state["references"] == {}
    with pytest.raises(ValueError, match="saved: the base model; here: start copies"):
        same.load_state_dict(base_state)
    del state["references"]  # a checkpoint older than the digests: not checked
    other.load_state_dict(state)


class GradientRecorder:
    """Stands in for an adapter's optimizer: keeps the gradient each step would apply, changes no weight."""

    def __init__(self, params):
        self.params, self.steps = params, []

    def step(self):
        self.steps.append({n: p.grad.detach().clone() for n, p in self.params.items()})

    def zero_grad(self, set_to_none=True):
        for p in self.params.values():
            p.grad = None


def _recorded_update(tok, seqs, advs, *, kl_coef=0.0, temperature=1.0, trained=None, **kw):
    """One update of a fresh non-zero "agent" adapter (same seed every call): (stats, gradients, model)."""
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    torch.manual_seed(1)
    for p in adapter_parameters(model, "agent").values():
        torch.nn.init.normal_(p, std=0.05)
    policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})
    recorder = policies.optimizers["agent"] = GradientRecorder(policies.params["agent"])
    stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, temperature, trained=trained)],
                        UpdateSettings(GRPOConfig(kl_coef=kl_coef), max_grad_norm=0.0, **kw), pad_id=0)
    (grads,) = recorder.steps
    return stats, grads, model


def _assert_same_gradients(a, b):
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-7, msg=name)
    assert any(g.abs().sum() > 0 for g in a.values())


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_a_kl_term_forwards_the_zero_advantage_sequences_for_it_as_a_whole_batch_loss_does(tok, kl_coef):
    """The update's gradient equals that of rl.grpo_loss.policy_loss over the whole batch in one call
    (verl's and the release's loss). Without a KL term a zero-advantage sequence has no gradient and is
    not forwarded; with one its KL term to the reference (here the base model, adapters off) pulls too."""
    from cosearch_lib.rl.grpo_loss import policy_loss
    from cosearch_lib.rl.policy_sequences import padded_batch

    seqs, advs = _sequences(tok), [1.0, 0.0, -0.5, 0.0, 2.0]
    stats, grads, model = _recorded_update(tok, seqs, advs, kl_coef=kl_coef, micro_batch=2)  # lr 0: unchanged
    assert stats["agent_n_forwarded"] == (5 if kl_coef else 3)
    ids, attn, mask, old = padded_batch(seqs, 0, "cpu")
    params = adapter_parameters(model, "agent")
    for p in params.values():
        p.grad = None
    with torch.no_grad(), model.disable_adapter():
        ref = policy_token_logprobs(model, ids, attn, temperature=1.0, mask=mask)
    lp = policy_token_logprobs(model, ids, attn, temperature=1.0, mask=mask)
    loss, whole = policy_loss(lp, old, torch.tensor(advs), mask, GRPOConfig(kl_coef=kl_coef), ref_logprobs=ref)
    loss.backward()
    _assert_same_gradients(grads, {n: p.grad for n, p in params.items()})
    if kl_coef:  # the zero-advantage sequences' KL term is part of it: their gradient alone is not zero
        for p in params.values():
            p.grad = None
        zero = [i for i, a in enumerate(advs) if a == 0.0]
        lp = policy_token_logprobs(model, ids[zero], attn[zero], temperature=1.0, mask=mask[zero])
        alone, alone_stats = policy_loss(lp, old[zero], torch.zeros(len(zero)), mask[zero], GRPOConfig(kl_coef=kl_coef),
                               ref_logprobs=ref[zero])
        alone.backward()
        assert alone_stats["kl"] > 1e-4 and any(p.grad.abs().sum() > 0 for p in params.values())
        # a sequence not trained on (a ranker call the grouping dropped) is not forwarded, KL term or not
        dropped, _, _ = _recorded_update(tok, seqs, advs, kl_coef=kl_coef, micro_batch=2, trained=[True, False] + [True] * 3)
        assert dropped["agent_n_forwarded"] == 4


def _mixed_length_sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [PolicySequence(torch.randint(10, 500, (n,), generator=g).tolist(), [0] * 3 + [1] * (n - 3),
                           [0.0] * 3 + (-torch.rand(n - 3, generator=g) * 3).tolist()) for n in lengths]


def test_an_update_reads_its_statistics_back_at_its_end_whatever_its_micro_batches(tok, monkeypatch):
    """Issue 49, item 9: the update's statistics stay tensors until it ends. The GRPO code
    (rl.grpo_loss, rl.policy_update, rl.update_stats) reads back as many times with six micro-batches
    as with one, and the numbers agree."""
    import sys

    rl_code = ("grpo_loss.py", "policy_update.py", "update_stats.py")
    seqs, advs = _mixed_length_sequences([20, 6, 19, 7, 18, 5]), [1.0, -0.5, 0.7, 2.0, -1.5, -0.3]
    reads, stats = {}, {}
    for micro_batch in (1, 6):
        reads[micro_batch] = []
        with monkeypatch.context() as patched:
            for name in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu"):
                real = getattr(torch.Tensor, name)

                def read(self, *a, _real=real, _name=name, _log=reads[micro_batch], **k):
                    caller = sys._getframe(1).f_code.co_filename
                    if caller.endswith(rl_code):
                        _log.append((_name, caller.rsplit("/", 1)[-1]))
                    return _real(self, *a, **k)
                patched.setattr(torch.Tensor, name, read)
            stats[micro_batch], _, _ = _recorded_update(tok, seqs, advs, micro_batch=micro_batch, length_grouped=False,
                                                        kl_coef=0.05)
    assert len(reads[1]) == len(reads[6]) and len(reads[1]) <= 3, reads  # the tally's one read, the grad norms'
    assert stats[1]["agent_n_forwarded"] == stats[6]["agent_n_forwarded"] == 6
    for key in ("agent_loss", "agent_kl", "agent_ratio_mean", "agent_logp_drift_mean"):
        assert stats[1][key] == pytest.approx(stats[6][key], rel=1e-5, abs=1e-7), key


def test_micro_batches_longest_first_ties_in_given_order():
    lengths = {0: 5, 1: 9, 2: 5, 3: 12, 4: 9}
    assert micro_batches([0, 1, 2, 3, 4], lengths, 2, by_length=True) == [[3, 1], [4, 0], [2]]
    assert micro_batches([0, 1, 2, 3, 4], lengths, 2, by_length=False) == [[0, 1], [2, 3], [4]]
    assert micro_batches([4, 0, 3], lengths, 1, by_length=True) == [[4], [0], [3]]  # size 1: nothing to group
    with pytest.raises(ValueError, match="micro-batch size"):
        micro_batches([0], lengths, 0, by_length=True)


def test_length_grouped_micro_batches_give_the_same_gradient_with_less_padding(tok):
    lengths = [20, 6, 19, 7, 18, 5]
    seqs, advs = _mixed_length_sequences(lengths), [1.0, -0.5, 0.7, 2.0, -1.5, -0.3]
    grouped, grouped_grads, _ = _recorded_update(tok, seqs, advs, micro_batch=2, length_grouped=True)
    in_order, in_order_grads, _ = _recorded_update(tok, seqs, advs, micro_batch=2, length_grouped=False)
    _assert_same_gradients(grouped_grads, in_order_grads)
    # in order: (20, 6) (19, 7) (18, 5) -> 2 * (20 + 19 + 18) = 114 positions for 75 tokens
    # grouped:  (20, 19) (18, 7) (6, 5) -> 2 * (20 + 18 + 6) = 88 positions for 75 tokens
    assert in_order["agent_pad_frac"] == pytest.approx(39 / 114)
    assert grouped["agent_pad_frac"] == pytest.approx(13 / 88)
    assert grouped["agent_n_forwarded"] == in_order["agent_n_forwarded"] == 6
    assert grouped["agent_loss"] == pytest.approx(in_order["agent_loss"], rel=1e-5)


def _decoder_forward_counter(model):
    """Counts the calls of the first decoder layer (a checkpointed layer runs again in backward). A
    pre-hook: torch's non-reentrant recompute stops early, before the layer's forward hooks would run."""
    calls = [0]
    layer = model.get_base_model().model.layers[0]
    layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_gradient_checkpointing_gives_the_same_gradients_and_is_switched_off_after(tok):
    seqs, advs = _mixed_length_sequences([14, 9, 11, 6]), [1.0, -1.0, 0.5, -0.25]
    _, plain, plain_model = _recorded_update(tok, seqs, advs, micro_batch=2, kl_coef=0.1)
    _, checkpointed, model = _recorded_update(tok, seqs, advs, micro_batch=2, kl_coef=0.1, gradient_checkpointing=True)
    _assert_same_gradients(checkpointed, plain)
    base = model.get_base_model()
    assert not base.is_gradient_checkpointing and not getattr(base, "_require_grads_hooks", None)
    modes = {n: m.training for n, m in model.named_modules()}
    assert modes == {n: m.training for n, m in plain_model.named_modules()}  # every module's mode as before
    assert not any(layer.training for layer in base.model.layers)

    # checkpointing really ran: per micro-batch the layer runs for logp, for the KL reference and,
    # with checkpointing, once more in the backward pass
    n_micro = 2
    for m, want in ((plain_model, 2 * n_micro), (model, 3 * n_micro)):
        calls = _decoder_forward_counter(m)
        policies = PolicySet(m, {"agent": "agent"}, ["agent"], {"agent": 0.0})
        grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, 1.0)],
                    UpdateSettings(GRPOConfig(kl_coef=0.1), micro_batch=2, max_grad_norm=0.0,
                                   gradient_checkpointing=m is model), pad_id=0)
        assert calls[0] == want


def test_update_checkpointing_leaves_a_model_that_already_checkpoints_as_it_was(tok):
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    base = model.get_base_model()
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with update_checkpointing(model, True):
        assert base.is_gradient_checkpointing
    assert base.is_gradient_checkpointing  # not switched off: it was on before
    base.gradient_checkpointing_disable()
    with update_checkpointing(model, False):
        assert not base.is_gradient_checkpointing


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_drift_is_zero_for_the_same_model_and_measures_a_shift(tok, temperature):
    seqs = _mixed_length_sequences([12, 8, 10])
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    torch.manual_seed(1)
    for p in adapter_parameters(model, "agent").values():  # the adapter the update will use
        torch.nn.init.normal_(p, std=0.05)
    teacher = reference_logprobs(model, [s.ids for s in seqs], [3] * len(seqs), temperature=temperature)
    same = [PolicySequence(s.ids, s.mask, [0.0] * 3 + lp) for s, lp in zip(seqs, teacher)]
    shifted = [PolicySequence(s.ids, s.mask, [0.0] * 3 + [x - 0.25 for x in lp]) for s, lp in zip(seqs, teacher)]
    advs = [1.0, -1.0, 0.5]
    exact, _, _ = _recorded_update(tok, same, advs, micro_batch=2, temperature=temperature)
    off, _, _ = _recorded_update(tok, shifted, advs, micro_batch=2, temperature=temperature)
    assert exact["agent_logp_drift_mean"] < 1e-4
    assert off["agent_logp_drift_mean"] == pytest.approx(0.25, abs=1e-4)
    assert exact["agent_ratio_mean"] == pytest.approx(1.0, abs=1e-4)


# ------------------------------------------------------------------------------ joint steps


def test_a_joint_step_updates_both_adapters_and_not_the_base(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path)
    model = t.policies.model
    base, agent, ranker = snapshot(model), snapshot(model, "agent"), snapshot(model, "ranker")
    rec = t.train_step()
    assert changed(agent, model) and changed(ranker, model) and not changed(base, model)
    assert rec["rollout/n_trajectories"] == 8 and rec["ranker/n_calls"] == 8
    assert rec["rollout/agent_reward"] == pytest.approx(0.5)  # half the samples answer right (F1 1), half wrong (0)
    assert rec["ranker/hit@K"] == pytest.approx(0.5) and rec["rollout/agent_format_ok"] == 1.0
    assert rec["loss/agent_n_forwarded"] == 8 and rec["loss/ranker_n_forwarded"] > 0
    assert rec["loss/agent_pad_frac"] == 0.0 and rec["loss/ranker_pad_frac"] == 0.0  # micro_batch 1: nothing to pad
    # the scripted rollout reports the model's own log-probs: the drift is measured, and ~0
    assert 0 <= rec["loss/agent_logp_drift_mean"] < 1e-4 and 0 <= rec["loss/ranker_logp_drift_mean"] < 1e-4
    assert rec["ranker/grouping_n_groups_post"] >= 1 and not math.isnan(rec["ranker/reward_post"])
    assert t.calls_frame()["group"].ge(0).any()
    # the KL term is on (kl_coef 0.001): every call the grouping kept is forwarded, none it dropped
    assert t.cfg.grpo.kl_coef > 0 and rec["loss/ranker_n_forwarded"] == t.calls_frame()["group"].ge(0).sum()
    from cosearch_lib.rl.semantic_grouping import GROUPING_GLOSSARY
    from cosearch_lib.run_schema import describe_step_metric

    for key in rec:  # every logged metric has a glossary entry
        assert describe_step_metric(key)
    assert {k[len("grouping_"):] for k in rec if k.startswith("grouping_")} <= set(GROUPING_GLOSSARY)
    with pytest.raises(KeyError):
        describe_step_metric("agent_mystery")


def test_trainer_hands_the_update_options_to_grpo_update(tok, tmp_path, monkeypatch):
    seen = []

    def recording_update(policies, adapter, jobs, settings, **kw):
        seen.append((settings.length_grouped, settings.gradient_checkpointing, settings.micro_batch))
        return grpo_update(policies, adapter, jobs, settings, **kw)

    monkeypatch.setattr(trainer_mod, "grpo_update", recording_update)
    t = trainer(tok, tiny_model(tok), tmp_path, method="search_r1", length_grouped_micro_batches=False,
                gradient_checkpointing=True)
    t.train_step()
    assert seen == [(False, True, 1)]
    assert not t.policies.model.get_base_model().is_gradient_checkpointing
    with pytest.raises(ValueError, match="gradient_checkpointing must be a bool"):
        TrainConfig(gradient_checkpointing="yes")


@pytest.mark.parametrize("method", ["search_r1", "fixed_ranker", "oracle"])
def test_other_methods_train_the_agent_only(tok, tmp_path, method):
    t = trainer(tok, tiny_model(tok), tmp_path, method=method)
    model = t.policies.model
    frozen = snapshot(model, "ranker") if method == "fixed_ranker" else None
    agent = snapshot(model, "agent")
    rec = t.train_step()
    assert changed(agent, model)
    if frozen is not None:
        assert not changed(frozen, model) and "loss/ranker_n_forwarded" not in rec
    if method == "oracle":
        assert rec["ranker/hit@K"] == 1.0  # the oracle always shows the answer passage when one is among the N


def test_shared_backbone_trains_one_adapter_on_both_roles(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, shared=True)
    shared = snapshot(t.policies.model, "shared")
    rec = t.train_step()
    assert changed(shared, t.policies.model)
    assert rec["loss/agent_n_forwarded"] > 0 and rec["loss/ranker_n_forwarded"] > 0 and "loss/shared_grad_norm" in rec


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]


def test_resume_after_kill_gives_the_records_of_an_uninterrupted_run(tok, tmp_path):
    full = trainer(tok, tiny_model(tok), tmp_path / "full", steps=3)
    start = {a: snapshot(full.policies.model, a) for a in ("agent", "ranker")}
    full.run()
    for adapter in ("agent", "ranker"):  # an exact resume of a model that never moved would prove nothing
        assert changed(start[adapter], full.policies.model)
    killed = trainer(tok, tiny_model(tok), tmp_path / "killed", steps=3)
    killed.run(steps=2)  # checkpoints after each step, then "dies"
    (tmp_path / "killed" / "checkpoints" / "step_000003.tmp").mkdir()  # a half-written checkpoint is ignored
    resumed = trainer(tok, tiny_model(tok), tmp_path / "killed", steps=3)  # a fresh process: same base model
    with torch.no_grad():  # garbage adapter weights and a stale optimizer state: the checkpoint must replace both
        for p in resumed.policies.model.parameters():
            if p.requires_grad:
                p.normal_()
    assert resumed.load_checkpoint() == 2 and latest_checkpoint(tmp_path / "killed").name == "step_000002"
    resumed.run()
    assert _comparable(resumed.records) == _comparable(full.records)
    for adapter in ("agent", "ranker"):
        a, b = snapshot(full.policies.model, adapter), snapshot(resumed.policies.model, adapter)
        assert all(torch.equal(a[n], b[n]) for n in a)
    kept = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    assert kept == ["step_000002", "step_000003"]  # keep_checkpoints=2
    ckpts = tmp_path / "killed" / "checkpoints"
    for adapter in ("agent", "ranker"):  # the saved adapters moved between the checkpoints too
        moved = adapter_change(ckpts / "step_000002" / "adapters" / adapter, ckpts / "step_000003" / "adapters" / adapter)
        assert moved["changed"] > 0 and moved["max_abs_delta"] > 0 and moved["lora_B_max_abs"] > 0
    with pytest.raises(ValueError, match="of method 'cosearch', not 'oracle'"):
        trainer(tok, tiny_model(tok), tmp_path / "killed", method="oracle").load_checkpoint()
    with pytest.raises(ValueError, match="trained with seed 0, not 1"):
        trainer(tok, tiny_model(tok), tmp_path / "killed", seed=1).load_checkpoint()
    assert trainer(tok, tiny_model(tok), tmp_path / "new").load_checkpoint() == 0  # nothing to resume: step 0


def test_a_resume_rebuilds_the_kl_reference_from_the_start_not_from_the_checkpoint(tok, tmp_path):
    kl = GRPOConfig(kl_coef=0.2, kl_reference="start")
    full = trainer(tok, tiny_model(tok), tmp_path / "full", steps=3, grpo=kl)
    full.run()
    killed = trainer(tok, tiny_model(tok), tmp_path / "killed", steps=3, grpo=kl)
    start = {a: snapshot(killed.policies.model, a) for a in ("agent", "ranker")}
    killed.run(steps=2)
    resumed = trainer(tok, tiny_model(tok), tmp_path / "killed", steps=3, grpo=kl)
    assert resumed.load_checkpoint() == 2
    resumed.run()
    assert _comparable(resumed.records) == _comparable(full.records)
    assert any(r["loss/agent_kl"] > 0 for r in full.records)  # the policy left its reference
    for adapter in ("agent", "ranker"):
        copy = resumed.policies.reference_adapter(adapter)
        reference = snapshot(resumed.policies.model, copy)
        assert changed(start[adapter], resumed.policies.model)  # the adapter moved ...
        assert all(torch.equal(start[adapter][n], reference[n.replace(f".{adapter}.", f".{copy}.")])
                   for n in start[adapter])  # ... its reference is where it started


def test_a_stop_after_the_rollout_resumes_into_the_update_to_the_uninterrupted_records(tok, tmp_path):
    """SIGUSR1 during step 2's rollout (a cluster's warning): the run stops at the stage boundary with
    the step's scored rollouts saved, before its update. A fresh process resumes from step 1's
    checkpoint, takes those rollouts back instead of rolling out again, and ends with the records and
    adapters of a run that never stopped."""
    import os
    import signal

    from cosearch_lib.stop_signals import StopRequested

    full = trainer(tok, tiny_model(tok), tmp_path / "full", steps=3)
    start = {a: snapshot(full.policies.model, a) for a in ("agent", "ranker")}
    full.run()
    stopped = trainer(tok, tiny_model(tok), tmp_path / "stopped", steps=3)
    scored = stopped.scored_rollouts

    def scored_then_warned(step, clock=None):
        out = scored(step, clock)
        if step == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        return out
    stopped.scored_rollouts = scored_then_warned
    with pytest.raises(StopRequested, match="SIGUSR1"):
        stopped.run()
    ckpts = tmp_path / "stopped" / "checkpoints"
    assert latest_checkpoint(tmp_path / "stopped").name == "step_000001" and (ckpts / "rollouts_step_000001.pt").exists()
    assert trainer(tok, tiny_model(tok), tmp_path / "stopped", steps=3, seed=1).take_stage(1) is None  # not its run's
    resumed = trainer(tok, tiny_model(tok), tmp_path / "stopped", steps=3)
    rolled = []
    scored_again = resumed.scored_rollouts
    resumed.scored_rollouts = lambda step, clock=None: (rolled.append(step), scored_again(step, clock))[1]
    assert resumed.load_checkpoint() == 1
    resumed.run()
    assert rolled == [2]  # step 2 (index 1) went straight into its update
    assert _comparable(resumed.records) == _comparable(full.records)
    for adapter in ("agent", "ranker"):
        assert changed(start[adapter], full.policies.model)  # the adapters moved: equality proves the resume
        a, b = snapshot(full.policies.model, adapter), snapshot(resumed.policies.model, adapter)
        assert all(torch.equal(a[n], b[n]) for n in a)
    assert not list(ckpts.glob("rollouts_*"))  # dropped once the step's checkpoint holds what they led to


def test_a_truncated_or_corrupted_checkpoint_is_named_and_skipped_for_the_one_before_it(tok, tmp_path):
    from cosearch_lib.run_schema import checkpoint_problem

    full = trainer(tok, tiny_model(tok), tmp_path / "full", steps=3)
    full.run()
    run = trainer(tok, tiny_model(tok), tmp_path / "run", steps=3)
    run.run(steps=2)  # step_000001 and step_000002 kept
    ckpts = tmp_path / "run" / "checkpoints"
    assert checkpoint_problem(ckpts / "step_000002") is None and (ckpts / "step_000002" / "MANIFEST.json").exists()
    state = ckpts / "step_000002" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # killed mid-write, or a full disk
    assert "truncated" in checkpoint_problem(ckpts / "step_000002")
    with pytest.warns(RuntimeWarning, match=r"step_000002 skipped: state\.pt has .* bytes"):
        assert latest_checkpoint(tmp_path / "run").name == "step_000001"
    resumed = trainer(tok, tiny_model(tok), tmp_path / "run", steps=3)
    with pytest.warns(RuntimeWarning):
        assert resumed.load_checkpoint() == 1  # from the last good one: steps 2 and 3 run again
    resumed.run()
    assert _comparable(resumed.records) == _comparable(full.records)
    adapter = ckpts / "step_000003" / "adapters" / "agent" / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    adapter.write_bytes(bytes(data))
    assert "SHA-256" in checkpoint_problem(ckpts / "step_000003")


# ------------------------------------------------------------------------------ old log-probs: backend or recomputed


def _rollouts_as_reported(tok, *, noise, seed=0):
    """Sequences whose old log-probs are the trainer's own (what the transformers backend reports)
    plus N(0, noise) per token (what an engine in another dtype or with other kernels reports)."""
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    torch.manual_seed(1)
    for p in adapter_parameters(model, "agent").values():
        torch.nn.init.normal_(p, std=0.05)
    seqs = _sequences(tok, n=6, seed=seed)
    exact = reference_logprobs(model.eval(), [s.ids for s in seqs], [1] * len(seqs))
    g = torch.Generator().manual_seed(seed + 7)
    out = []
    for s, lp in zip(seqs, exact):
        old = [0.0] + [x + float(torch.randn(1, generator=g)) * noise if m else 0.0 for x, m in zip(lp, s.mask[1:])]
        out.append(PolicySequence(s.ids, s.mask, old))
    return out


@pytest.mark.parametrize("noise", [0.0, 0.1])  # the transformers backend; an engine that drifts (vLLM: ~0.04 mean)
def test_recomputed_old_logprobs_give_a_first_ratio_of_exactly_one_whatever_the_backend_reported(tok, noise):
    seqs, advs = _rollouts_as_reported(tok, noise=noise), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    stats, grads, _ = _recorded_update(tok, seqs, advs, micro_batch=2, recompute_old=True)
    assert stats["agent_ratio_mean"] == 1.0 and stats["agent_ratio_max"] == 1.0  # exactly: the same forward
    assert stats["agent_ratio_outside_clip"] == 0.0
    assert stats["agent_logp_drift_mean"] == pytest.approx(noise * math.sqrt(2 / math.pi), rel=0.35, abs=1e-5)
    backend, backend_grads, _ = _recorded_update(tok, seqs, advs, micro_batch=2)
    assert backend["agent_logp_drift_mean"] == stats["agent_logp_drift_mean"]  # recorded either way
    if noise:
        assert backend["agent_ratio_outside_clip"] > 0.0  # the engine's noise reaches the clip...
        assert backend_grads.keys() == grads.keys() and any(not torch.allclose(backend_grads[n], grads[n]) for n in grads)
    else:
        _assert_same_gradients(backend_grads, grads)  # ...and without noise the two settings agree


def test_recompute_and_tis_across_minibatches_take_the_pre_update_logprobs(tok):
    seqs, advs = _rollouts_as_reported(tok, noise=0.2), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    # minibatches=2: the second minibatch is forwarded after the first step; its old log-probs were
    # taken before it (a recorder stands in for the optimizer, so the weights do not move here)
    model = lora_model(tiny_model(tok), {"agent": None}, LORA)
    torch.manual_seed(1)
    for p in adapter_parameters(model, "agent").values():
        torch.nn.init.normal_(p, std=0.05)
    policies = PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0})
    policies.optimizers["agent"] = GradientRecorder(policies.params["agent"])
    stats = grpo_update(policies, "agent", [UpdateJob("agent", seqs, advs, 1.0)],
                        UpdateSettings(GRPOConfig(kl_coef=0.0, tis_cap=1.0), micro_batch=2, max_grad_norm=0.0,
                                       minibatches=2, recompute_old=True), pad_id=0)
    assert len(policies.optimizers["agent"].steps) == 2
    assert stats["agent_ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # pre-update = current weights here
    assert stats["agent_ratio_outside_clip"] == 0.0
    # TIS: min(pi_trainer / pi_rollout, 1) over every token of both minibatches, below 1 where the engine was likelier
    assert 0.5 < stats["agent_tis_weight_mean"] < 1.0
    untruncated = grpo_update(PolicySet(model, {"agent": "agent"}, ["agent"], {"agent": 0.0}), "agent",
                              [UpdateJob("agent", seqs, advs, 1.0)],
                              UpdateSettings(GRPOConfig(kl_coef=0.0, tis_cap=1e6), micro_batch=2, max_grad_norm=0.0,
                                             recompute_old=True), pad_id=0)
    assert untruncated["agent_tis_weight_mean"] > stats["agent_tis_weight_mean"]


def test_old_logprobs_setting_resolves_per_backend_and_refuses_bad_values():
    assert GRPOConfig().old_logprobs == "auto" and GRPOConfig().tis_cap is None
    assert GRPOConfig().recomputes_old_logprobs(generated_by_trainer=False)  # vLLM, Unsloth: recompute
    assert not GRPOConfig().recomputes_old_logprobs(generated_by_trainer=True)  # the trainer's own model sampled
    assert GRPOConfig(old_logprobs="recompute").recomputes_old_logprobs(generated_by_trainer=True)
    assert not GRPOConfig(old_logprobs="backend").recomputes_old_logprobs(generated_by_trainer=False)
    with pytest.raises(ValueError, match="old_logprobs"):
        GRPOConfig(old_logprobs="vllm")
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOConfig(tis_cap=0.5)


def test_the_doubles_first_update_compares_the_model_with_itself(tok, tmp_path):
    """Issue 36, suspected bug 2: the scripted backend reported a log-prob of -1.0 for every token,
    the tiny model gives them ~-10.8, and the doubles trainer took the backend's as the old ones: a
    ratio of ~e^-10 before any update, where the clipped surrogate gives negative-advantage tokens no
    gradient. The doubles' old log-probs must be those of the model they train: the scripted backend
    now reports the model's teacher-forced log-probs (issue 49), and the trainer takes them as they
    come (``old_logprobs: auto``, the CPU profiles' path: the backend is the trainer's own model)."""
    t = trainer(tok, tiny_model(tok), tmp_path, steps=1)
    assert not t.update_settings.recompute_old  # the old log-probs are the backend's: the model's own
    record = t.train_step()
    for role in ("agent", "ranker"):
        assert record[f"loss/{role}_logp_drift_mean"] < 1e-4  # the backend's log-probs are the trainer's, up to float sums
        assert abs(record[f"loss/{role}_ratio_mean"] - 1.0) < 1e-3, (role, record[f"loss/{role}_ratio_mean"])
        assert record[f"loss/{role}_clip_frac"] == 0.0
