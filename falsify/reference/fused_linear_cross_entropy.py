"""Fused linear + cross-entropy, stated plainly: CE(x·Wᵀ, y) with the logits materialised
(float64). The optimized backends compute the same numbers without ever holding the
[T, V] logits (falsify/kernels/torch/fused_linear_cross_entropy.py).

    z = x·Wᵀ,  loss = CE(z, y) (falsify/reference/cross_entropy.py: ignore_index, reductions,
    z-loss,
    label smoothing);  with G = ∂loss/∂z (times the upstream gradient):
    ∂loss/∂x = G·W,   ∂loss/∂W = Gᵀ·x
"""

import numpy as np

from falsify.reference.cross_entropy import cross_entropy, cross_entropy_backward


def _check(x, weight, labels):
    if np.ndim(x) != 2 or np.ndim(weight) != 2 or np.shape(x)[1] != np.shape(weight)[1]:
        raise ValueError(f"expected x [T, H] and weight [V, H]; got {np.shape(x)}, "
                         f"{np.shape(weight)}")
    if np.ndim(labels) != 1 or np.shape(labels)[0] != np.shape(x)[0]:
        raise ValueError(f"labels must have shape [{np.shape(x)[0]}]")


def fused_linear_cross_entropy(x, weight, labels, ignore_index=-100, reduction="mean",
                               z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    """chunk_size is accepted for signature parity with the optimized backends and ignored:
    the reference has no chunks."""
    _check(x, weight, labels)
    z = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    return cross_entropy(z, labels, ignore_index, reduction, z_loss, label_smoothing)


def fused_linear_cross_entropy_backward(x, weight, labels, ignore_index=-100, reduction="mean",
                                        z_loss=0.0, label_smoothing=0.0, chunk_size=None,
                                        dy=None):
    _check(x, weight, labels)
    x = np.asarray(x, np.float64)
    w = np.asarray(weight, np.float64)
    g = cross_entropy_backward(x @ w.T, labels, ignore_index, reduction, z_loss,
                               label_smoothing, dy)["logits"]
    return {"x": g @ w, "weight": g.T @ x}
