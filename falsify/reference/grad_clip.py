"""Global-norm gradient clipping (as torch.nn.utils.clip_grad_norm_, with a non-finite rule).

    ‖g‖ = sqrt(Σ_tensors Σ_elements g²)         one norm over *all* tensors, not one per tensor
    coef = min(1, max_norm / (‖g‖ + eps))
    g ← coef · g

After clipping ‖coef·g‖ = min(‖g‖, max_norm·‖g‖/(‖g‖ + eps)) < max_norm, and below the threshold
(‖g‖ + eps ≤ max_norm) coef is exactly 1: the gradients are returned unchanged, bit for bit.

Non-finite rule: if any element is NaN or ±inf the norm is reported as NaN (any NaN) or +inf
(otherwise) and the gradients are returned *unchanged*: multiplying by coef = max/(inf + eps)
= 0 or NaN would silently zero or poison every gradient. The caller skips the step, or asks
for an exception with error_if_nonfinite=True.
"""

import math

import numpy as np

from falsify.arguments import check_clip_args
from falsify.errors import NonFiniteGradNorm


def clip_coefficient(norm, max_norm, eps):
    """min(1, max_norm/(norm + eps)) for a finite norm ≥ 0; 1 (leave untouched) otherwise."""
    if not math.isfinite(norm):
        return 1.0
    return min(1.0, max_norm / (norm + eps))


def clip_grad_norm_list(grads, max_norm, eps, error_if_nonfinite):
    """Returns (clipped copies of grads, total norm before clipping)."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [np.asarray(g, dtype=np.float64) for g in grads]
    if any(np.isnan(g).any() for g in gs):
        norm = math.nan
    elif any(np.isinf(g).any() for g in gs):
        norm = math.inf
    else:
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in gs))
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise NonFiniteGradNorm(f"total gradient norm is {norm}; gradients left unchanged")
        return [g.copy() for g in gs], norm
    coef = clip_coefficient(norm, max_norm, eps)
    return [g * coef for g in gs], norm


def clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """The contract's binding: three tensors of different shapes (so a per-tensor clip is
    distinguishable from the global one); returns (g0', g1', g2', norm)."""
    (c0, c1, c2), norm = clip_grad_norm_list([g0, g1, g2], max_norm, eps, error_if_nonfinite)
    return c0, c1, c2, np.float64(norm)
