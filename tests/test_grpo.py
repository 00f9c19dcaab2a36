"""Hand-worked checks of cosearch_lib.grpo, plus comparisons with TRL's helpers on random data."""

from __future__ import annotations

import math

import pytest
import torch

from cosearch_lib.config import AGGREGATIONS, GRPOConfig
from cosearch_lib.rl import grpo_loss as G

EPS = 1e-6


# --------------------------------------------------------------------------- GRPOConfig


def test_config_defaults_and_validation():
    cfg = GRPOConfig()
    assert (cfg.clip_eps, cfg.clip_eps_high, cfg.kl_coef) == (0.2, None, 0.001)
    assert cfg.eps_high == 0.2 and GRPOConfig(clip_eps_high=0.28).eps_high == 0.28
    assert cfg.scale_std and cfg.aggregation == "token-mean"
    for kwargs, word in [
        ({"clip_eps": 0.0}, "clip_eps"),
        ({"clip_eps": 1.5}, "clip_eps"),
        ({"clip_eps_high": -0.1}, "clip_eps_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"kl_coef": float("nan")}, "kl_coef"),
        ({"std_eps": -1e-6}, "std_eps"),
        ({"aggregation": "mean"}, "aggregation"),
        ({"kl_reference": "warm_start"}, "kl_reference"),
    ]:
        with pytest.raises(ValueError, match=word):
            GRPOConfig(**kwargs)


def test_the_kl_reference_setting_keys_runs_only_when_set_to_the_start():
    import dataclasses

    from cosearch_lib.config import load_profile

    assert GRPOConfig().kl_reference is None and GRPOConfig(kl_reference="base").kl_reference is None  # one key
    assert GRPOConfig(kl_reference="start").start_reference
    assert GRPOConfig(kl_coef=0.0, kl_reference="start").kl_reference is None  # no KL term: nothing to refer to
    cfg = load_profile("ci")

    def keyed(reference):
        grpo = dataclasses.replace(cfg.training.grpo, kl_reference=reference)
        return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, grpo=grpo)).fingerprint("training")

    assert keyed(None) == keyed("base") == cfg.fingerprint("training") != keyed("start")
    from cosearch_lib.paths import params_dir

    probe = load_profile(str(params_dir() / "probes" / "laptop_curve_wide_kl.yaml"))  # issue 48's KL probe
    wide = load_profile("laptop_curve_wide")
    assert probe.training.grpo.start_reference and probe.training.grpo.kl_coef == 0.04 and wide.training.grpo.kl_coef == 0
    assert dataclasses.replace(probe.training, grpo=wide.training.grpo, steps=wide.training.steps) == wide.training
    stronger = load_profile(str(params_dir() / "probes" / "laptop_curve_wide_kl05.yaml"))
    assert stronger.training.grpo == dataclasses.replace(probe.training.grpo, kl_coef=0.5)
    lr = load_profile(str(params_dir() / "probes" / "laptop_curve_wide_lr3e4.yaml"))  # the learning-rate probe
    assert lr.training == dataclasses.replace(wide.training, agent_lr=3e-4, steps=6) and lr.rollout == wide.rollout
    seqmean = load_profile(str(params_dir() / "probes" / "laptop_curve_wide_seqmean.yaml"))  # the aggregation probe
    grpo = dataclasses.replace(wide.training.grpo, aggregation="seq-mean-token-mean")
    assert seqmean.training == dataclasses.replace(wide.training, grpo=grpo, steps=6) and seqmean.rollout == wide.rollout
    multi = load_profile(str(params_dir() / "probes" / "laptop_curve_wide_multi.yaml"))  # multi-hop questions alone
    assert multi.training == dataclasses.replace(wide.training, families=("multi",), steps=6) and multi.rollout == wide.rollout


# --------------------------------------------------------------------------- group_advantages


def test_group_advantages_hand_values():
    # Four groups, labels unordered and non-contiguous:
    #   7:  rewards 1.0, 0.0, 0.5 -> mean 0.5, unbiased var (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5
    #   3:  0.1, 0.1, 0.1 (float64 mean is 0.1 + 1 ulp) -> must be exactly 0
    #   42: size 1 -> 0
    #   -1: 1.0, 0.0 -> mean 0.5, unbiased var 0.5 / 1, std sqrt(0.5) (biased std would be 0.5)
    ids = torch.tensor([7, 3, 7, 42, 3, -1, 7, 3, -1])
    r = torch.tensor([1.0, 0.1, 0.0, 0.9, 0.1, 1.0, 0.5, 0.1, 0.0], dtype=torch.float64)
    s2 = math.sqrt(0.5)
    expected = [0.5 / (0.5 + EPS), 0, -0.5 / (0.5 + EPS), 0, 0, 0.5 / (s2 + EPS), 0, 0, -0.5 / (s2 + EPS)]
    adv = G.group_advantages(r, ids, eps=EPS)
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (adv[[1, 3, 4, 7]] == 0).all()  # exactly, not approximately
    # scale_std=False: mean-centring only
    centred = G.group_advantages(r, ids, scale_std=False)
    torch.testing.assert_close(centred, torch.tensor([0.5, 0, -0.5, 0, 0, 0.5, 0, 0, -0.5], dtype=torch.float64))
    # float32 in -> float32 out, same numbers
    adv32 = G.group_advantages(r.float(), ids, eps=EPS)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(adv32, adv.float())


def test_group_advantages_equal_loop_reference_and_trl_nanstd():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 12, (64,), generator=gen) * 5 - 20  # arbitrary labels, some groups of size 1
    r = torch.rand(64, generator=gen, dtype=torch.float64)
    adv = G.group_advantages(r, ids, eps=EPS)
    for g in ids.unique():  # straightforward python-loop reference with torch.std (unbiased)
        sel = ids == g
        want = torch.zeros(int(sel.sum()), dtype=r.dtype) if sel.sum() == 1 else (
            (r[sel] - r[sel].mean()) / (r[sel].std() + EPS)
        )
        torch.testing.assert_close(adv[sel], want)

    trl_utils = pytest.importorskip("trl.trainer.utils")
    if not hasattr(trl_utils, "nanstd"):
        pytest.skip("this TRL has no nanstd")
    # TRL's GRPO: contiguous groups of num_generations, nanstd (Bessel) per group
    grouped = torch.rand(6, 4, generator=gen, dtype=torch.float64)  # (n_groups, n_generations)
    want = (grouped - grouped.mean(1, keepdim=True)) / (trl_utils.nanstd(grouped, dim=1, keepdim=True) + EPS)
    got = G.group_advantages(grouped.flatten(), torch.arange(6).repeat_interleave(4), eps=EPS)
    torch.testing.assert_close(got, want.flatten())


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="same length"):
        G.group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        G.group_advantages(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="float"):
        G.group_advantages(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN"):
        G.group_advantages(torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------- token_logprobs


def _random_logits(seed=0, B=3, T=5, V=11):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, V, generator=gen) * 3, torch.randint(0, V, (B, T), generator=gen)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_token_logprobs_equals_log_softmax_gather(temperature):
    logits, ids = _random_logits()
    want = torch.log_softmax(logits / temperature, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    got = G.token_logprobs(logits, ids, temperature=temperature)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got, want)
    # bf16 logits are upcast: close to the float32 answer on the bf16-rounded logits
    got16 = G.token_logprobs(logits.bfloat16(), ids, temperature=temperature)
    want16 = torch.log_softmax(logits.bfloat16().float() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert got16.dtype == torch.float32
    torch.testing.assert_close(got16, want16)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_equals_trl_selective_log_softmax(temperature):
    trl_utils = pytest.importorskip("trl.trainer.utils")
    if not hasattr(trl_utils, "selective_log_softmax"):
        pytest.skip("this TRL has no selective_log_softmax")
    logits, ids = _random_logits(seed=1, B=4, T=7, V=50)
    want = trl_utils.selective_log_softmax(logits, ids, temperature=temperature)
    torch.testing.assert_close(G.token_logprobs(logits, ids, temperature=temperature), want)


def test_token_logprobs_gradient():
    logits, ids = _random_logits(seed=2, B=2, T=3, V=4)
    logits = logits.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: G.token_logprobs(x, ids, temperature=0.8), (logits,))


def test_token_logprobs_bad_input():
    logits, ids = _random_logits()
    with pytest.raises(ValueError, match="logits"):
        G.token_logprobs(logits[0], ids)
    with pytest.raises(ValueError, match="ids"):
        G.token_logprobs(logits, ids[:, :-1])
    with pytest.raises(ValueError, match="ids"):
        G.token_logprobs(logits, ids.int())
    with pytest.raises(ValueError, match="temperature"):
        G.token_logprobs(logits, ids, temperature=0.0)


# --------------------------------------------------------------------------- kl_k3


def test_kl_k3_nonnegative_zero_and_formula():
    gen = torch.Generator().manual_seed(3)
    lp, ref = -torch.rand(200, generator=gen) * 5, -torch.rand(200, generator=gen) * 5
    k3 = G.kl_k3(lp, ref)
    assert (k3 >= 0).all()
    torch.testing.assert_close(k3, torch.exp(ref - lp) - (ref - lp) - 1)  # the textbook (TRL/verl) form
    assert (G.kl_k3(lp, lp) == 0).all()
    tiny = G.kl_k3(torch.zeros(5), torch.tensor([1e-8, -1e-8, 1e-6, -1e-6, 1e-4]))
    assert (tiny >= 0).all()  # no negative round-off for tiny differences
    with pytest.raises(ValueError, match="ref_logprobs"):
        G.kl_k3(lp, ref[:-1])


def test_kl_k3_expectation_is_exact_kl():
    # sum_x p(x) k3(log p(x), log q(x)) = sum_x (q - p) - sum_x p log(q / p) = 0 + KL(p || q), exactly
    gen = torch.Generator().manual_seed(4)
    logp = torch.log_softmax(torch.randn(7, generator=gen, dtype=torch.float64), -1)
    logq = torch.log_softmax(torch.randn(7, generator=gen, dtype=torch.float64), -1)
    expected = (logp.exp() * (logp - logq)).sum()
    torch.testing.assert_close((logp.exp() * G.kl_k3(logp, logq)).sum(), expected)


# --------------------------------------------------------------------------- masked_aggregate


def test_masked_aggregate_modes_and_empty_mask():
    v = torch.tensor([[1.0, 2.0, 3.0], [10.0, float("inf"), float("nan")]], requires_grad=True)
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert G.masked_aggregate(v, m, "token-mean").item() == pytest.approx((1 + 2 + 3 + 10) / 4)  # 4.0
    assert G.masked_aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx((2.0 + 10.0) / 2)  # 6.0
    assert G.masked_aggregate(v, m, "seq-mean-token-sum-norm").item() == pytest.approx(16 / 6)
    # a row with no tokens does not count as a sequence in seq-mean-token-mean
    m2 = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert G.masked_aggregate(v, m2, "seq-mean-token-mean").item() == pytest.approx(1.5)
    for agg in AGGREGATIONS:
        out = G.masked_aggregate(v, torch.zeros_like(m), agg)
        assert out.item() == 0.0
        out.backward()  # still connected to the graph, and no nan sneaks into the gradient
        assert torch.equal(v.grad, torch.zeros_like(v))
    with pytest.raises(ValueError, match="aggregation"):
        G.masked_aggregate(v, m, "sum")
    with pytest.raises(ValueError, match="mask"):
        G.masked_aggregate(v, m[:, :2], "token-mean")


# --------------------------------------------------------------------------- policy_loss


def _hand_batch():
    """B=2, T=3, eps=0.2 (clip range [0.8, 1.2]); old log-probs 0, so ratio = exp(logprobs).

    row 0, A = +1, all three tokens:
      rho 1.1 inside  -> min(1.1, 1.1)        = 1.1   gradient flows
      rho 1.5 above   -> min(1.5, 1.2)        = 1.2   clipped (A > 0, rho > 1.2)
      rho 0.5 below   -> min(0.5, 0.8)        = 0.5   flows (clip only binds on the A side)
    row 1, A = -2, two tokens, third slot masked with garbage:
      rho 0.5 below   -> min(-1.0, 0.8 * -2)  = -1.6  clipped (A < 0, rho < 0.8)
      rho 1.5 above   -> min(-3.0, 1.2 * -2)  = -3.0  flows
    """
    lp = torch.log(torch.tensor([[1.1, 1.5, 0.5], [0.5, 1.5, 1.0]]))
    lp[1, 2] = 1e4  # garbage: exp() would overflow to inf
    old = torch.zeros(2, 3)
    old[1, 2] = -float("inf")
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return lp.requires_grad_(), old, adv, mask


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        ("token-mean", -(1.1 + 1.2 + 0.5 - 1.6 - 3.0) / 5),  # -(-1.8) / 5 = 0.36
        ("seq-mean-token-mean", -((1.1 + 1.2 + 0.5) / 3 + (-1.6 - 3.0) / 2) / 2),  # -(0.9333 - 2.3) / 2 = 0.68333
        ("seq-mean-token-sum-norm", 1.8 / 6),  # -(-1.8) / (B * T = 6) = 0.3
    ],
)
def test_policy_loss_hand_values(aggregation, expected):
    lp, old, adv, mask = _hand_batch()
    loss, stats = G.policy_loss(lp, old, adv, mask, GRPOConfig(aggregation=aggregation))
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(expected, abs=1e-6) and stats["loss"] == stats["pg_loss"]
    assert stats["clip_frac"] == pytest.approx(2 / 5)  # row 0 token 1 and row 1 token 0
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 0.5 + 1.5) / 5)  # 1.02
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["adv_mean"] == pytest.approx(-0.5)  # (1 - 2) / 2
    assert stats["n_tokens"] == 5.0
    assert math.isnan(stats["kl"])  # no reference given: not measured
    assert all(isinstance(x, float) for x in stats.values())


def test_policy_loss_gradient_hand_values_and_masked_garbage():
    # token-mean: d loss / d lp = -(1/5) * d surr / d lp, with d(rho A)/d lp = rho A unclipped, 0 clipped
    #   row 0: -(1.1 * 1) / 5 = -0.22,  0 (clipped),  -(0.5 * 1) / 5 = -0.1
    #   row 1: 0 (clipped),  -(1.5 * -2) / 5 = 0.6,  0 (masked, despite the garbage)
    lp, old, adv, mask = _hand_batch()
    loss, _ = G.policy_loss(lp, old, adv, mask)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.22, 0.0, -0.1], [0.0, 0.6, 0.0]]))
    # changing the masked slot's values (even to nan) changes neither loss nor gradient
    lp2, old2, _, _ = _hand_batch()
    with torch.no_grad():
        lp2[1, 2], old2[1, 2] = float("nan"), 123.0
    loss2, _ = G.policy_loss(lp2, old2, adv, mask)
    loss2.backward()
    assert loss2.item() == loss.item()
    assert torch.equal(lp2.grad, lp.grad)


def test_policy_loss_kl_term_hand_values():
    # ref = lp + ln 2 on every token: d = ln 2, k3 = 2 - ln 2 - 1 = 1 - ln 2 per token,
    # d k3 / d lp = 1 - exp(d) = -1, so each token's gradient gains kl_coef * (-1) / 5 = -0.02
    lp, old, adv, mask = _hand_batch()
    ref = lp.detach() + math.log(2)
    ref[1, 2] = float("nan")  # masked garbage in the reference too
    cfg = GRPOConfig(kl_coef=0.1)
    loss, stats = G.policy_loss(lp, old, adv, mask, cfg, ref_logprobs=ref)
    assert stats["kl"] == pytest.approx(1 - math.log(2))
    assert stats["pg_loss"] == pytest.approx(0.36, abs=1e-6)
    assert loss.item() == pytest.approx(0.36 + 0.1 * (1 - math.log(2)), abs=1e-6)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.24, -0.02, -0.12], [-0.02, 0.58, 0.0]]))
    # kl_coef = 0: KL still measured for the logs, but not in the loss
    lp0, _, _, _ = _hand_batch()
    loss0, stats0 = G.policy_loss(lp0, old, adv, mask, GRPOConfig(kl_coef=0.0), ref_logprobs=ref)
    assert loss0.item() == pytest.approx(0.36, abs=1e-6)
    assert stats0["kl"] == pytest.approx(1 - math.log(2))


def test_policy_loss_asymmetric_clip():
    # clip_eps_high = 0.28: rho 1.25 (A > 0) now flows, rho 1.5 is clipped at 1.28; lower bound stays 0.8
    lp = torch.log(torch.tensor([[1.25, 1.5, 0.7]])).requires_grad_()
    loss, stats = G.policy_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3),
                                GRPOConfig(clip_eps_high=0.28))
    assert loss.item() == pytest.approx(-(1.25 + 1.28 + 0.7) / 3)
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    sym, sym_stats = G.policy_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    assert sym.item() == pytest.approx(-(1.2 + 1.2 + 0.7) / 3) and sym_stats["clip_frac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_policy_loss_gradient_at_ratio_one(aggregation):
    # old == current: rho = 1 inside the clip range, surrogate = A, d surr / d lp = A. Hence
    #   token-mean:          d loss / d lp[i, t] = -A_i / n_tokens
    #   seq-mean-token-mean: d loss / d lp[i, t] = -A_i / (n_i * n_sequences_with_tokens)
    gen = torch.Generator().manual_seed(5)
    lp = -torch.rand(4, 6, generator=gen)
    lengths = torch.tensor([6, 2, 0, 4])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()  # (4, 6) unequal lengths, one empty row
    adv = torch.randn(4, generator=gen)
    x = lp.clone().requires_grad_()
    loss, stats = G.policy_loss(x, lp.clone(), adv, mask, GRPOConfig(aggregation=aggregation))
    loss.backward()
    if aggregation == "token-mean":
        per_token = -adv / lengths.sum()
    else:
        per_token = -adv / (lengths.clamp_min(1) * 3)
    torch.testing.assert_close(x.grad, per_token[:, None] * mask)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["adv_mean"] == pytest.approx(adv[[0, 1, 3]].mean().item())


def test_policy_loss_empty_mask():
    lp = torch.randn(2, 3, requires_grad=True)
    loss, stats = G.policy_loss(lp, lp.detach(), torch.ones(2), torch.zeros(2, 3), ref_logprobs=lp.detach())
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3))
    assert stats["n_tokens"] == 0.0 and stats["clip_frac"] == 0.0 and math.isnan(stats["ratio_mean"])


def test_policy_loss_leaves_its_statistics_on_the_device_until_they_are_read(monkeypatch):
    """Issue 49, item 9: the statistics of a micro-batch stay tensors: policy_loss reads nothing
    back (no sync on a GPU); the first look-up reads them all in one transfer; an empty mask still
    gives NaN for what it cannot measure."""
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, _name=name, **k: reads.append(_name) or _real(self, *a, **k))
    lp, old, adv, mask = _hand_batch()
    _, stats = G.policy_loss(lp, old, adv, mask, ref_logprobs=old)
    assert reads == [], reads
    assert stats["n_tokens"] == 5.0 and not math.isnan(stats["kl"]) and reads == ["tolist"]
    reads.clear()
    _, stats = G.policy_loss(lp, old, adv, torch.zeros_like(mask))
    assert reads == []
    assert all(math.isnan(stats[k]) for k in ("kl", "ratio_mean", "ratio_max", "adv_mean")) and reads == ["tolist"]
    assert stats["clip_frac"] == 0.0 and stats["n_tokens"] == 0.0


def test_policy_loss_shape_errors_name_the_tensor():
    lp, old, adv, mask = _hand_batch()
    with pytest.raises(ValueError, match="old_logprobs"):
        G.policy_loss(lp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="mask"):
        G.policy_loss(lp, old, adv, mask[:1])
    with pytest.raises(ValueError, match="advantages"):
        G.policy_loss(lp, old, adv[:, None].expand(2, 3), mask)
    with pytest.raises(ValueError, match="ref_logprobs"):
        G.policy_loss(lp, old, adv, mask, ref_logprobs=old.T)
    with pytest.raises(ValueError, match="logprobs"):
        G.policy_loss(lp[0], old[0], adv, mask[0])


def test_the_aggregation_registry_and_the_configs_names_agree():
    from cosearch_lib.config import MICRO_BATCHED_AGGREGATIONS, ConfigError, TrainConfig
    from cosearch_lib.rl.grpo_loss import LOSS_AGGREGATIONS

    assert tuple(LOSS_AGGREGATIONS) == AGGREGATIONS
    assert tuple(n for n, a in LOSS_AGGREGATIONS.items() if a.splits_into_micro_batches) == MICRO_BATCHED_AGGREGATIONS
    for name in AGGREGATIONS:  # every name is a valid GRPOConfig; the trainer takes the micro-batchable ones only
        grpo = GRPOConfig(aggregation=name)
        if name in MICRO_BATCHED_AGGREGATIONS:
            assert TrainConfig(grpo=grpo).grpo.aggregation == name
        else:
            with pytest.raises(ConfigError, match="micro-batches"):
                TrainConfig(grpo=grpo)
