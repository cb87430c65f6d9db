"""GRPO loss (Shao et al. 2024, DeepSeekMath), float64 reference.

Advantages, per contiguous group g of G completions of one prompt (N = P·G rewards):

    A_i = (r_i − mean_g r) / (std_g r + eps),   std_g the sample standard deviation (G − 1)

as TRL's GRPOTrainer (scale_rewards="group"). Σ_{i∈g} A_i = 0; equal rewards give A = 0.

Loss over per-token log-probs of the sampled tokens, logp (policy), old (the policy that
sampled), ref (frozen reference), mask m ∈ {0, 1} (1 = completion token counted):

    ρ = exp(logp − old)
    policy_t = min(ρ·A_b, clip(ρ, 1 − ε, 1 + ε)·A_b)
    kl_t = exp(ref − logp) − (ref − logp) − 1          (k3: ≥ 0, = 0 at logp = ref)
    loss = Σ_t m_t·(−(policy_t − β·kl_t)) / Σ_t m_t    (token-level mean over the batch)

Only logp is differentiable. ∂policy_t/∂logp = ρ·A where the min takes the unclipped branch,
0 where the clip is active: A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε. ∂kl_t/∂logp =
1 − exp(ref − logp). So ∂loss/∂logp_t = m_t·(−ρ·A·[not clipped] + β·(1 − exp(ref − logp)))/n.
Padded positions never enter the arithmetic (their values may be anything, inf included). No
counted token: the mean over nothing is NaN, with gradient 0.
"""

import math

import numpy as np


def check_advantage_args(rewards, group_size, eps):
    r = np.asarray(rewards)
    if r.ndim != 1:
        raise ValueError(f"group_advantages: rewards must be 1-D [N], got shape {r.shape}")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or \
            group_size < 2:
        raise ValueError(f"group_advantages: group size G = {group_size!r}: must be an int "
                         ">= 2")
    if r.shape[0] % group_size:
        raise ValueError(f"group_advantages: N={r.shape[0]} rewards are not a whole number of "
                         f"groups of {group_size}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"group_advantages: eps={eps!r} must be finite and > 0")


def group_advantages(rewards, group_size, eps):
    check_advantage_args(rewards, group_size, eps)
    r = np.asarray(rewards, np.float64).reshape(-1, group_size)
    c = r - r[:, :1]  # equal rewards: exactly 0 deviations, whatever the mean rounds to
    dev = c - c.mean(axis=1, keepdims=True)
    sd = np.sqrt((dev ** 2).sum(axis=1, keepdims=True) / (group_size - 1))
    return (dev / (sd + eps)).reshape(-1)


def check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    shape = np.shape(logp)
    if len(shape) != 2:
        raise ValueError(f"grpo_loss: logp must be 2-D [B, T], got shape {shape}")
    for name, x in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if np.shape(x) != shape:
            raise ValueError(f"grpo_loss: {name} {np.shape(x)} must match logp {shape}")
    if np.shape(advantages) != shape[:1]:
        raise ValueError(f"grpo_loss: advantages {np.shape(advantages)} must be [B] = "
                         f"[{shape[0]}]")
    m = np.asarray(mask)
    if np.any((m != 0) & (m != 1)):
        raise ValueError("grpo_loss: mask must hold only 0 and 1")
    if not (isinstance(clip_eps, (int, float)) and math.isfinite(clip_eps) and
            0 < clip_eps < 1):
        raise ValueError(f"grpo_loss: clip_eps={clip_eps!r} must lie in (0, 1)")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta >= 0):
        raise ValueError(f"grpo_loss: beta={beta!r} must be finite and >= 0")


def _terms(logp, old_logp, ref_logp, advantages, mask):
    keep = np.asarray(mask) != 0
    lp, old, ref = (np.where(keep, np.asarray(x, np.float64), 0.0)
                    for x in (logp, old_logp, ref_logp))
    a = np.asarray(advantages, np.float64)[:, None]
    ratio = np.exp(lp - old)
    return keep, lp, ref, a, ratio


def clip_active(ratio, a, clip_eps):
    """Where min(ρA, clip(ρ)A) takes the clipped, constant branch."""
    return ((a > 0) & (ratio > 1 + clip_eps)) | ((a < 0) & (ratio < 1 - clip_eps))


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    keep, lp, ref, a, ratio = _terms(logp, old_logp, ref_logp, advantages, mask)
    policy = np.minimum(ratio * a, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    d = ref - lp
    kl = np.expm1(d) - d
    n = keep.sum()
    with np.errstate(invalid="ignore"):
        return np.float64(np.where(keep, -(policy - beta * kl), 0.0).sum() / n)


def grpo_loss_backward(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta, dy=None):
    check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    keep, lp, ref, a, ratio = _terms(logp, old_logp, ref_logp, advantages, mask)
    n = keep.sum()
    if n == 0:
        return {"logp": np.zeros(np.shape(logp))}
    dpolicy = np.where(clip_active(ratio, a, clip_eps), 0.0, ratio * a)
    dkl = -np.expm1(ref - lp)
    g = np.where(keep, -dpolicy + beta * dkl, 0.0) / n
    return {"logp": g * (1.0 if dy is None else float(dy))}


def kl_k3(logp, ref_logp):
    """The per-token k3 estimate exp(ref − logp) − (ref − logp) − 1, elementwise."""
    d = np.asarray(ref_logp, np.float64) - np.asarray(logp, np.float64)
    return np.expm1(d) - d
