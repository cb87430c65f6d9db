"""GRPO mutants: batch-wide reward scaling, a sign-blind clip, a reversed KL estimator and
padding counted in the token mean."""

from __future__ import annotations

import torch

from falsify.kernels.torch.grpo_loss import check_advantage_args, check_grpo_args


def batch_std_advantages(rewards, group_size, eps):
    """Centred per group but scaled by the whole batch's std (TRL's scale_rewards="batch"
    where the contract says per group)."""
    check_advantage_args(rewards, group_size, eps)
    r = rewards.float().reshape(-1, group_size)
    dev = r - r.mean(dim=1, keepdim=True)
    return (dev / (rewards.float().std() + eps)).reshape(-1).to(rewards.dtype)


def _loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta, *, policy_fn=None,
          reverse_kl=False, count_padding=False):
    check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    keep = mask != 0
    zero = torch.zeros((), dtype=torch.float32)
    lp = torch.where(keep, logp.float(), zero)
    old = torch.where(keep, old_logp.detach().float(), zero)
    ref = torch.where(keep, ref_logp.detach().float(), zero)
    a = advantages.detach().float()[:, None]
    ratio = torch.exp(lp - old)
    if policy_fn is None:
        policy = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    else:
        policy = policy_fn(ratio, a, clip_eps)
    d = lp - ref if reverse_kl else ref - lp
    kl = torch.expm1(d) - d
    per_token = torch.where(keep, -(policy - beta * kl), zero)
    n = torch.tensor(float(keep.numel())) if count_padding else keep.sum().float()
    return (per_token.sum() / n).to(logp.dtype)


def symmetric_clip(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    """clip(ρ, 1 − ε, 1 + ε)·A without the min: the ratio is clipped on both sides whatever
    A's sign, so a token the policy has made less likely despite A > 0 gets no gradient."""
    return _loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta,
                 policy_fn=lambda r, a, e: torch.clamp(r, 1 - e, 1 + e) * a)


def kl_wrong_sign(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    """k3 on logp − ref instead of ref − logp: still ≥ 0 and 0 at equal policies, but it
    estimates KL(ref‖π) with the wrong weights and pulls with exp(logp − ref)."""
    return _loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta, reverse_kl=True)


def padding_counted(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    """Pads excluded from the sum but counted in the divisor: B·T instead of Σ mask."""
    return _loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta,
                 count_padding=True)
