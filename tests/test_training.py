"""The joint trainer: roles per method, micro-batched GRPO updates equal one big batch, a full joint
step changes exactly the trained adapters, and resuming after a kill gives the same records.

Rollouts come from a scripted backend (a real untrained model fails the protocol on every turn,
so all rewards would tie and no gradient would flow); the updates run on a real transformers model:
a tiny random Llama with SmolLM2's tokenizer (fast), and SmolLM2 itself in one slow test."""

from __future__ import annotations

import math

import pytest
import torch

from cosearch_lib.config import GRPOConfig, TrainConfig
from cosearch_lib.models.lora_policies import PolicySet, adapter_parameters, lora_model
from cosearch_lib.rl.policy_update import PolicySequence, UpdateJob, grpo_update, policy_token_logprobs
from cosearch_lib.rl.trainer import latest_checkpoint, question_order

from tests.doubles import LORA, tiny_model, trainer


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
    from cosearch_lib.rl.policy_update import _padded

    ids, attn, mask, _ = _padded(seqs, 0, "cpu")
    full = policy_token_logprobs(model, ids, attn, temperature=0.7)
    sparse = policy_token_logprobs(model, ids, attn, temperature=0.7, mask=mask)
    assert torch.allclose(sparse, full * mask, atol=1e-5)
    assert (sparse[mask == 0] == 0).all() and (sparse[mask == 1] < 0).all()


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
                            GRPOConfig(aggregation=aggregation, kl_coef=0.0), micro_batch=micro,
                            max_grad_norm=0.0, pad_id=0)
        grads[micro] = stats["grad_norm"]
        assert stats["agent_n_forwarded"] == 4  # the zero-advantage sequence is never forwarded
    assert grads[5] > 0 and math.isclose(grads[2], grads[5], rel_tol=1e-5) and math.isclose(grads[1], grads[5], rel_tol=1e-5)


def test_update_changes_only_the_trained_adapter(tok):
    model = lora_model(tiny_model(tok), {"agent": None, "ranker": None}, LORA)
    policies = PolicySet(model, {"agent": "agent", "ranker": "ranker"}, ["agent"], {"agent": 1e-2})
    base, agent, ranker = snapshot(model), snapshot(model, "agent"), snapshot(model, "ranker")
    stats = grpo_update(policies, "agent", [UpdateJob("agent", _sequences(tok), [1.0, -1.0, 0.5, -0.5, 0.0], 1.0)],
                        GRPOConfig(), micro_batch=2, max_grad_norm=1.0, pad_id=0)
    assert changed(agent, model) and not changed(ranker, model) and not changed(base, model)
    assert stats["agent_kl"] == pytest.approx(0.0, abs=1e-6)  # fresh LoRA (B = 0) equals the reference
    assert "ranker" not in policies.optimizers


# ------------------------------------------------------------------------------ joint steps


def test_a_joint_step_updates_both_adapters_and_not_the_base(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path)
    model = t.policies.model
    base, agent, ranker = snapshot(model), snapshot(model, "agent"), snapshot(model, "ranker")
    rec = t.train_step()
    assert changed(agent, model) and changed(ranker, model) and not changed(base, model)
    assert rec["n_trajectories"] == 8 and rec["n_ranker_calls"] == 8
    assert rec["agent_reward"] == pytest.approx(0.5)  # half the samples answer right (F1 1), half wrong (0)
    assert rec["hit@5"] == pytest.approx(0.5) and rec["agent_format_ok"] == 1.0
    assert rec["agent_n_forwarded"] == 8 and rec["ranker_n_forwarded"] > 0
    assert rec["grouping_n_groups_post"] >= 1 and not math.isnan(rec["ranker_reward_post"])
    assert t.calls_frame()["group"].ge(0).any()
    from cosearch_lib.rl.semantic_grouping import GROUPING_GLOSSARY
    from cosearch_lib.rl.trainer import describe_step_metric

    for key in rec:  # every logged metric has a glossary entry
        assert describe_step_metric(key)
    assert {k[len("grouping_"):] for k in rec if k.startswith("grouping_")} <= set(GROUPING_GLOSSARY)
    with pytest.raises(KeyError):
        describe_step_metric("agent_mystery")


@pytest.mark.parametrize("method", ["search_r1", "fixed_ranker", "oracle"])
def test_other_methods_train_the_agent_only(tok, tmp_path, method):
    t = trainer(tok, tiny_model(tok), tmp_path, method=method)
    model = t.policies.model
    frozen = snapshot(model, "ranker") if method == "fixed_ranker" else None
    agent = snapshot(model, "agent")
    rec = t.train_step()
    assert changed(agent, model)
    if frozen is not None:
        assert not changed(frozen, model) and "ranker_n_forwarded" not in rec
    if method == "oracle":
        assert rec["hit@5"] == 1.0  # the oracle always shows the answer passage when one is among the N


def test_shared_backbone_trains_one_adapter_on_both_roles(tok, tmp_path):
    t = trainer(tok, tiny_model(tok), tmp_path, shared=True)
    shared = snapshot(t.policies.model, "shared")
    rec = t.train_step()
    assert changed(shared, t.policies.model)
    assert rec["agent_n_forwarded"] > 0 and rec["ranker_n_forwarded"] > 0 and "shared_grad_norm" in rec


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records]


def test_resume_after_kill_gives_the_records_of_an_uninterrupted_run(tok, tmp_path):
    full = trainer(tok, tiny_model(tok), tmp_path / "full", steps=3)
    full.run()
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
    assert (tmp_path / "killed" / "checkpoints" / "step_000003" / "adapters" / "ranker" / "adapter_config.json").exists()
    with pytest.raises(ValueError, match="method"):
        trainer(tok, tiny_model(tok), tmp_path / "killed", method="oracle").load_checkpoint()
