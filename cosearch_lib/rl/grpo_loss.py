"""GRPO as pure tensor functions: group advantages, token log-probs, k3 KL, clipped surrogate.

No model, no optimiser, no trainer: the training loop (``rl/trainer.py`` through ``rl/policy_update.py``) runs the policy, hands the
tensors here and calls ``.backward()`` on what comes back. The same functions serve both CoSearch
policies (the search agent and the document ranker), docs/METHOD.md, GRPO objective.

* :class:`cosearch_lib.config.GRPOConfig` (defined in config, read here): the loss hyper-parameters.
* :func:`group_advantages`: ``A_i = (r_i - mean_g) / (std_g + eps)`` per group, vectorised.
* :func:`token_logprobs`: ``log softmax(logits / temperature)`` gathered at the sampled ids.
* :func:`kl_k3`: the low-variance per-token estimator of ``KL(pi || ref)``.
* :func:`masked_aggregate`: per-token values -> one scalar ("token-mean" and friends).
* :func:`policy_loss`: the clipped surrogate plus the k3 penalty, with detached float stats.

Shapes: ``B`` sequences (completions; every sample of every group), ``T`` completion tokens
(right-padded), ``V`` vocabulary. ``mask`` marks the tokens the policy generated (1) as opposed to
prompt, padding and tool observations (0).

Departures from the paper (and why):

1. **Unbiased group std** (Bessel, ``n - 1``), as TRL (``nanstd``) and verl (``torch.std``) use;
   the paper just writes ``std``. A group of one sample gets advantage 0 (no baseline to compare
   against), and a group whose rewards are all equal gets exactly 0 (no float residue).
2. **Token-mean over the whole batch** ("token-mean": sum of masked values / number of masked
   tokens in the batch), as the paper's text and the released code do. Original DeepSeekMath GRPO
   averages per sequence first ("seq-mean-token-mean"); Dr.GRPO sums per sequence and divides by
   a constant ("seq-mean-token-sum-norm", here ``B * T``). All three are selectable.
3. **KL coefficient 0.001 with the k3 estimator** comes from the released code (the paper names
   the KL term but not its value). The penalty is added to the loss, aggregated like the
   surrogate; it is not folded into the reward. Unlike verl's ``low_var_kl`` the estimate is not
   clamped (verl clips it to [-10, 10]); it is only floored at 0 to absorb round-off.
4. **Asymmetric clipping is optional** (``clip_eps_high``, DAPO's clip-higher); the default
   ``None`` is the paper's symmetric ``[1 - 0.2, 1 + 0.2]``.
5. **Std scaling is optional** (``scale_std=False`` gives Dr.GRPO's mean-centred advantages).
6. **The reference policy is the caller's business.** With LoRA the reference is the base model
   with the adapter disabled; this module only sees its per-token log-probs, which it detaches.
7. **Old log-probs and advantages are detached here** as well, so a caller who forgets cannot
   leak gradient through the behaviour policy.
8. **Masked positions are sanitised before any exp**, so garbage there (``inf``, ``nan``, huge
   values from padding) changes neither the loss nor the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from cosearch_lib.config import GRPOConfig

# --------------------------------------------------------------------------- advantages


def group_advantages(rewards: Tensor, group_ids: Tensor, *, scale_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_g) / (std_g + eps)``.

    ``rewards`` (B,) float; ``group_ids`` (B,) integer labels, any values in any order (samples of
    one question share a label). ``std_g`` is the unbiased (n - 1) std. A size-1 group and a group
    of equal rewards both get exactly 0. Returns (B,) in the dtype of ``rewards``; the arithmetic
    runs in float64 because B is small and the groups' sums then cancel cleanly.
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, got rewards {tuple(rewards.shape)} "
            f"and group_ids {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor, got {rewards.dtype}")
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf")
    if rewards.numel() == 0:
        return rewards.clone()

    r = rewards.detach().to(torch.float64)  # (B,)
    _, inv = torch.unique(group_ids, return_inverse=True)  # inv (B,): dense group index 0..G-1
    G = int(inv.max()) + 1
    count = torch.bincount(inv, minlength=G).to(r.dtype)  # (G,)
    mean = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inv, r) / count  # (G,)
    centred = r - mean[inv]  # (B,)
    sq = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inv, centred * centred)  # (G,)
    std = (sq / (count - 1).clamp_min(1.0)).sqrt()  # (G,) unbiased; 0 for size-1 groups
    # Equal rewards must give exactly 0, but mean = sum / n can be off by an ulp (3 * 0.1 / 3 != 0.1),
    # which divided by a tiny std would be a large advantage. Detect constancy exactly with max == min.
    gmax = torch.full((G,), -math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inv, r, "amax")
    gmin = torch.full((G,), math.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inv, r, "amin")
    constant = (gmax == gmin)[inv]  # (B,) also true for size-1 groups
    adv = centred / (std[inv] + eps) if scale_std else centred  # (B,)
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype)


# --------------------------------------------------------------------------- log-probs and KL


def token_logprobs(logits: Tensor, ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[b, t, ids[b, t]]``: logits (B, T, V), ids (B, T) -> (B, T).

    Pass the sampling temperature, since the rollout's (old) log-probs came from the tempered
    distribution. Works one sequence at a time as ``gathered logit - logsumexp`` so that only one
    (T, V) row is ever upcast; low-precision logits (bf16/fp16) are upcast to float32 first, where
    the logsumexp form is stable. Returns float32 (float64 for float64 logits); differentiable.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    if ids.shape != logits.shape[:2]:
        raise ValueError(f"ids must be (B, T) = {tuple(logits.shape[:2])} to match logits, got {tuple(ids.shape)}")
    if ids.dtype != torch.long:
        raise ValueError(f"ids must be torch.long (int64), got {ids.dtype}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")

    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    rows = []
    for row_logits, row_ids in zip(logits, ids):  # (T, V), (T,): one row at a time bounds peak memory
        row = row_logits.to(out_dtype)
        if temperature != 1.0:
            row = row / temperature
        picked = row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)  # (T,)
        rows.append(picked - torch.logsumexp(row, dim=-1))  # (T,)
    if not rows:  # B == 0
        return logits.new_zeros(ids.shape, dtype=out_dtype)
    return torch.stack(rows)  # (B, T)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(pi || ref)``: ``exp(d) - d - 1`` with ``d = ref - logprobs``.

    Elementwise, any shape, >= 0, exactly 0 where the two agree, and unbiased when the tokens are
    sampled from ``pi`` (``sum_x p (q/p - log(q/p) - 1) = KL(p || q)``). Computed as
    ``expm1(d) - d``, which keeps its precision for small ``d``; the floor at 0 only absorbs
    round-off (the gradient there is O(d) anyway).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} must have the same shape"
        )
    d = ref_logprobs - logprobs
    return (torch.expm1(d) - d).clamp_min(0.0)


# --------------------------------------------------------------------------- aggregation and loss


@dataclass(frozen=True)
class LossAggregation:
    """One way to reduce per-token values to a scalar: ``reduce(values, mask)`` on (B, T) values that
    are already 0 outside the (bool, non-empty) mask, and whether the joint trainer's update can
    reproduce it from micro-batches, each weighted by its share (``splits_into_micro_batches``)."""

    reduce: Callable[[Tensor, Tensor], Tensor]
    splits_into_micro_batches: bool


def _seq_mean_token_mean(v: Tensor, m: Tensor) -> Tensor:
    per_seq_n = m.sum(dim=1)  # (B,)
    per_seq = v.sum(dim=1) / per_seq_n.clamp_min(1)  # (B,)
    has = per_seq_n > 0  # (B,) the mean over sequences with a token, without a data-dependent index (no sync)
    return (per_seq * has).sum() / has.sum().clamp_min(1)


#: The loss aggregations by name (``config.AGGREGATIONS`` holds the same names; a test checks it):
#: * ``"token-mean"``: sum over every masked token of the batch / number of masked tokens (paper, release);
#: * ``"seq-mean-token-mean"``: masked mean per sequence, then the mean over sequences that have at
#:   least one masked token (DeepSeekMath GRPO);
#: * ``"seq-mean-token-sum-norm"``: sum over masked tokens / (B * T), T the padded length (Dr.GRPO's
#:   constant normaliser). Its normaliser depends on the padded shape of the whole batch, so the
#:   trainer's micro-batched update cannot reproduce it: ``TrainConfig`` refuses it, the function here
#:   (and any caller that reduces a whole batch at once) can use it.
LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    "token-mean": LossAggregation(lambda v, m: v.sum() / m.sum().clamp_min(1), splits_into_micro_batches=True),
    "seq-mean-token-mean": LossAggregation(_seq_mean_token_mean, splits_into_micro_batches=True),
    "seq-mean-token-sum-norm": LossAggregation(lambda v, m: v.sum() / v.numel(), splits_into_micro_batches=False),
}


def masked_aggregate(values: Tensor, mask: Tensor, aggregation: str = "token-mean") -> Tensor:
    """Reduce per-token ``values`` (B, T) over the tokens where ``mask`` (B, T) is nonzero -> scalar,
    the way :data:`LOSS_AGGREGATIONS` names. Masked-out positions are selected away, never
    multiplied, so ``inf``/``nan`` there cannot leak in. An empty mask gives 0 that is still
    connected to the graph (``backward`` works): every aggregation's denominator is at least 1, so
    nothing here reads a value back from the device."""
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {tuple(LOSS_AGGREGATIONS)}, got {aggregation!r}")
    if values.ndim != 2 or mask.shape != values.shape:
        raise ValueError(
            f"values and mask must both be (B, T) of the same shape, got values {tuple(values.shape)} "
            f"and mask {tuple(mask.shape)}"
        )
    m = mask.bool()  # (B, T)
    v = torch.where(m, values, torch.zeros_like(values))  # (B, T)
    return LOSS_AGGREGATIONS[aggregation].reduce(v, m)


class LossStats(Mapping[str, float]):
    """The statistics of one :func:`policy_loss` call: one float64 tensor on the loss's device
    (:attr:`tensor`, in :data:`NAMES` order), read back to the host in one transfer the first time
    a statistic is looked up. ``rl.update_stats.RoleTally`` adds :attr:`tensor` up over an update's
    micro-batches without reading them, so an update reads its statistics back once, at its end."""

    NAMES = ("loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "ratio_max", "adv_mean", "n_tokens")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor  # (len(NAMES),) float64
        self._read: dict[str, float] | None = None

    def _host(self) -> dict[str, float]:
        if self._read is None:
            self._read = dict(zip(self.NAMES, self.tensor.tolist()))
        return self._read

    def __getitem__(self, name: str) -> float:
        return self._host()[name]

    def __iter__(self):
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig | None = None,
    ref_logprobs: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """GRPO loss: ``-agg(w * min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)) + kl_coef * agg(k3)``.

    ``logprobs`` (B, T) are the current policy's (with grad), ``old_logprobs`` (B, T) the rollout
    policy's, ``advantages`` (B,) one per sequence, ``mask`` (B, T) the generated tokens,
    ``ref_logprobs`` (B, T) the reference policy's or None. ``rho = exp(logprobs - old_logprobs)``.
    The KL term is added only when ``ref_logprobs`` is given and ``cfg.kl_coef > 0``.
    ``token_weights`` (B, T), detached, scale each token's surrogate (truncated importance sampling
    of a rollout engine's distribution, ``rl.policy_update``); None = 1.

    Stats (a :class:`LossStats`: detached tensors on the loss's device, read back to the host only
    when asked, so an update's micro-batches add them up without a sync each; means run over
    masked tokens):

    * ``loss``, ``pg_loss`` (the surrogate part, sign included), ``n_tokens``;
    * ``kl``: token-mean of k3, measured whenever ``ref_logprobs`` is given (even with
      ``kl_coef == 0``); NaN when it is not, so "not measured" never reads as "no drift";
    * ``clip_frac``: share of tokens whose gradient the clip zeroed,
      ``(rho > 1 + eps_high and A > 0) or (rho < 1 - eps and A < 0)``;
    * ``ratio_mean``, ``ratio_max``; ``adv_mean``: mean advantage over sequences with >= 1 token.

    With an empty mask the loss is a graph-connected 0, ``clip_frac`` is 0 and the other means NaN.
    """
    cfg = GRPOConfig() if cfg is None else cfg
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = tuple(logprobs.shape)
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    if token_weights is not None:
        named["token_weights"] = token_weights
    for name, t in named.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but logprobs has {shape}; they must match")
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(
            f"advantages must be (B,) = {shape[:1]} to match logprobs {shape}, got {tuple(advantages.shape)}"
        )

    m = mask.bool()  # (B, T)
    zero = torch.zeros_like(logprobs)
    # Sanitise masked slots before any exp: where() routes zero gradient there, but exp(inf) * 0 = nan would not.
    lp = torch.where(m, logprobs, zero)  # (B, T)
    old = torch.where(m, old_logprobs.detach().to(lp.dtype), zero)  # (B, T)
    adv = torch.where(m, advantages.detach().to(lp.dtype).unsqueeze(1).expand(shape), zero)  # (B, T)

    ratio = torch.exp(lp - old)  # (B, T) rho; 1 on masked slots
    lo, hi = 1.0 - cfg.clip_eps, 1.0 + cfg.eps_high
    surrogate = torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv)  # (B, T)
    if token_weights is not None:
        surrogate = surrogate * torch.where(m, token_weights.detach().to(lp.dtype), zero)  # (B, T)
    pg_loss = -masked_aggregate(surrogate, m, cfg.aggregation)

    loss = pg_loss
    k3 = None
    if ref_logprobs is not None:
        ref = torch.where(m, ref_logprobs.detach().to(lp.dtype), zero)  # (B, T)
        k3 = kl_k3(lp, ref)  # (B, T)
        if cfg.kl_coef > 0:
            loss = pg_loss + cfg.kl_coef * masked_aggregate(k3, m, cfg.aggregation)

    with torch.no_grad():  # every statistic as a tensor, left on the device (LossStats reads them when asked)
        n = m.sum()
        count = n.clamp(min=1).double()
        empty = n == 0
        nan = torch.full((), math.nan, dtype=torch.float64, device=lp.device)
        clipped = ((ratio > hi) & (adv > 0)) | ((ratio < lo) & (adv < 0))  # (B, T)
        has_tokens = m.any(dim=1)  # (B,)
        row_adv = advantages.detach().double()
        kl = torch.where(empty, nan, masked_aggregate(k3, m).double()) if k3 is not None else nan
        values = torch.stack([
            loss.detach().double(), pg_loss.detach().double(), kl,
            (clipped & m).sum().double() / count,  # clip_frac: 0 with an empty mask
            torch.where(empty, nan, torch.where(m, ratio, zero).sum().double() / count),  # ratio_mean
            torch.where(empty, nan, torch.where(m, ratio, torch.full_like(ratio, -math.inf)).max().double()),  # ratio_max
            torch.where(empty, nan, torch.where(has_tokens, row_adv, torch.zeros_like(row_adv)).sum()
                        / has_tokens.sum().clamp(min=1).double()),  # adv_mean
            n.double(),
        ])
    stats = LossStats(values)
    return loss, stats
