"""AdamW (Loshchilov & Hutter 2019), in the exact order torch.optim.AdamW applies it.

One step t ≥ 1 with gradient g, learning rate η, weight decay λ:

    θ ← θ·(1 − η·λ)                         decoupled decay: acts on θ, never enters m or v
    m ← β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    m̂ = m / (1 − β1^t),   v̂ = v / (1 − β2^t)   bias correction (m and v start at 0)
    θ ← θ − η · m̂ / (√v̂ + ε)

torch writes the last line as θ − (η/(1−β1^t)) · m / (√v / √(1−β2^t) + ε), which is the same
real number; we follow that grouping so float64 here and fp32 there round at the same places.

Adam with L2 regularisation instead adds λ·θ to g before the moments, so the decay is divided
by √v̂ and vanishes for parameters with large gradients; AdamW keeps it at η·λ·θ for every
parameter. The contract checks the two differ.

Every hyperparameter is a required argument: no defaults, so a configured β2 = 0.95 can never
be silently replaced by a library's 0.999.
"""

import math

import numpy as np

from falsify.arguments import check_hyperparameters


def adamw_step(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """One AdamW update; returns new (param, m, v). Inputs are not modified."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    theta = np.asarray(param, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if not (theta.shape == g.shape == m.shape == v.shape):
        raise ValueError(f"shape mismatch: param {theta.shape}, grad {g.shape}, m {m.shape}, "
                         f"v {v.shape}")
    theta = theta * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    step_size = lr / bias_correction1
    denom = np.sqrt(v) / math.sqrt(bias_correction2) + eps
    theta = theta - step_size * m / denom
    return theta, m, v


def adamw_run(param, grads, lr, beta1, beta2, eps, weight_decay):
    """len(grads) AdamW steps from zero state (m = v = 0, t = 1, 2, ...); returns the final
    (param, m, v). grads has shape [steps, *param.shape]."""
    check_hyperparameters(1, lr, beta1, beta2, eps, weight_decay)
    theta = np.asarray(param, dtype=np.float64)
    grads = np.asarray(grads, dtype=np.float64)
    if grads.ndim != theta.ndim + 1 or grads.shape[1:] != theta.shape:
        raise ValueError(f"grads must have shape [steps, *{theta.shape}], got {grads.shape}")
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    for t in range(1, grads.shape[0] + 1):
        theta, m, v = adamw_step(theta, grads[t - 1], m, v, t, lr, beta1, beta2, eps,
                                 weight_decay)
    return theta, m, v
