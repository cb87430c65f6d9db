"""GRPO loss in PyTorch (math and gradients: falsify/reference/grpo_loss.py).

group_advantages: A_i = (r_i − mean_g r) / (std_g r + eps) per contiguous group of G rewards,
std the sample (Bessel, G − 1) standard deviation, as TRL's GRPOTrainer computes it.
grpo_loss: clipped-surrogate policy term minus beta times the k3 KL estimate to the reference,
summed over counted tokens and divided by their number (token-level normalisation, TRL's
"dapo"/"bnpo" on one process). The KL term is the plain k3 estimate: TRL 1.16's default
use_bias_correction_kl=True multiplies it by the ratio, which this loss does not. fp32
throughout; old and reference log-probs, advantages and the mask are detached, so the loss is
differentiable w.r.t. logp only. Returns the loss in logp's dtype.
"""

from __future__ import annotations

import math

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["group_advantages", "grpo_loss"]


def check_advantage_args(rewards, group_size, eps, allowed=CHECKED):
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ValueError("group_advantages: rewards must be a 1-D tensor [N]")
    require("group_advantages", allowed, rewards=rewards)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        # the sample std of one reward is 0/0
        raise ValueError(f"group_advantages: group size G = {group_size!r}: must be an int "
                         ">= 2")
    if rewards.shape[0] % group_size:
        raise ValueError(f"group_advantages: N={rewards.shape[0]} rewards are not a whole "
                         f"number of groups of {group_size}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"group_advantages: eps={eps!r} must be finite and > 0")


def check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta,
                    allowed=CHECKED):
    named = {"logp": logp, "old_logp": old_logp, "ref_logp": ref_logp,
             "advantages": advantages, "mask": mask}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"grpo_loss: {name} must be a torch tensor")
    require("grpo_loss", allowed, logp=logp, old_logp=old_logp, ref_logp=ref_logp,
            advantages=advantages)
    if logp.dim() != 2:
        raise ValueError(f"grpo_loss: logp must be 2-D [B, T], got {tuple(logp.shape)}")
    for name in ("old_logp", "ref_logp", "mask"):
        if named[name].shape != logp.shape:
            raise ValueError(f"grpo_loss: {name} {tuple(named[name].shape)} must match logp "
                             f"{tuple(logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"grpo_loss: advantages {tuple(advantages.shape)} must be "
                         f"[B] = [{logp.shape[0]}]")
    if not (isinstance(clip_eps, (int, float)) and math.isfinite(clip_eps) and
            0 < clip_eps < 1):
        raise ValueError(f"grpo_loss: clip_eps={clip_eps!r} must lie in (0, 1)")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
        raise ValueError(f"grpo_loss: beta={beta!r} must be finite and >= 0")
    if not torch.compiler.is_compiling() and bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("grpo_loss: mask must hold only 0 and 1")


def group_advantages(rewards, group_size, eps):
    check_advantage_args(rewards, group_size, eps)
    r = rewards.detach().float().reshape(-1, group_size)
    # deviations from the group's first reward, then their mean: equal rewards give exactly 0
    # (a mean rounded away from the common value would divide a rounding residue by eps)
    c = r - r[:, :1]
    dev = c - c.mean(dim=1, keepdim=True)
    sd = torch.sqrt((dev * dev).sum(dim=1, keepdim=True) / (group_size - 1))
    return (dev / (sd + eps)).reshape(-1).to(rewards.dtype)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    keep = mask.detach() != 0
    # no counted token: the mean over nothing is NaN (0/0, as torch's cross-entropy), and
    # nothing flows back
    n = keep.sum().float()
    zero = torch.zeros((), dtype=torch.float32)
    # padded positions are replaced by 0 before any arithmetic, not multiplied by the mask
    # afterwards: a pad may hold any value (an inf log-prob included), and inf·0 or a NaN
    # reaching exp() would poison the sum and, through autograd, logp's gradient
    lp = torch.where(keep, logp.float(), zero)
    old = torch.where(keep, old_logp.detach().float(), zero)
    ref = torch.where(keep, ref_logp.detach().float(), zero)
    a = advantages.detach().float()[:, None]
    ratio = torch.exp(lp - old)
    policy = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = ref - lp
    # expm1(d) − d: ≥ 0 in floating point too (expm1(d) rounds to ≥ d), where exp(d) − d − 1
    # rounds to −d for |d| < eps
    kl = torch.expm1(d) - d
    per_token = torch.where(keep, -(policy - beta * kl), zero)
    return (per_token.sum() / n).to(logp.dtype)
