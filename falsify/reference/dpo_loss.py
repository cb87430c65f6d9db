"""Direct Preference Optimization loss (Rafailov et al. 2023), float64 reference.

Inputs are *summed* response log-probabilities per pair i (chosen c, rejected r) under the
policy π and the frozen reference model:

    h_i = β·((π_c,i − ref_c,i) − (π_r,i − ref_r,i))        the implicit reward margin
    loss = mean_i −log σ(h_i) = mean_i softplus(−h_i)
    chosen_reward_i = β(π_c,i − ref_c,i),  rejected_reward_i = β(π_r,i − ref_r,i)

softplus(−h) = max(−h, 0) + log1p(exp(−|h|)) is finite for every finite h; −log(σ(h)) is not
(σ(h) underflows to 0 for h ≲ −745 in float64, −104 in float32).

Gradients (the reference log-probs are constants): with σ(−h) = 1 − σ(h),
    ∂loss/∂π_c,i = −β·σ(−h_i)/B < 0   (raising the chosen log-prob lowers the loss)
    ∂loss/∂π_r,i = +β·σ(−h_i)/B > 0   (raising the rejected log-prob raises it)
At π = ref every h_i = 0 and the loss is log 2.
"""

import math

import numpy as np


def check_dpo_args(*logps, beta):
    shapes = {np.shape(x) for x in logps}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(f"the four log-prob vectors must share one 1-D shape, got {shapes}")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta={beta!r}: must be finite and > 0")


def softplus(x):
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def sigmoid(x):
    x = np.asarray(x, np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """(mean loss, chosen rewards [B], rejected rewards [B])."""
    check_dpo_args(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                   ref_rejected_logps, beta=beta)
    pc, pr, rc, rr = (np.asarray(a, np.float64) for a in (
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps))
    chosen = beta * (pc - rc)
    rejected = beta * (pr - rr)
    h = chosen - rejected
    return np.float64(softplus(-h).mean()), chosen, rejected


def dpo_loss_backward(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                      ref_rejected_logps, beta, dy=None):
    check_dpo_args(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                   ref_rejected_logps, beta=beta)
    pc, pr, rc, rr = (np.asarray(a, np.float64) for a in (
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps))
    h = beta * ((pc - rc) - (pr - rr))
    g = beta * sigmoid(-h) / h.size * (1.0 if dy is None else float(dy))
    return {"policy_chosen_logps": -g, "policy_rejected_logps": g}


def dpo_grad(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """(∂loss/∂π_c, ∂loss/∂π_r) with dy = 1: the array form, for sign properties."""
    g = dpo_loss_backward(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                          ref_rejected_logps, beta)
    return g["policy_chosen_logps"], g["policy_rejected_logps"]
