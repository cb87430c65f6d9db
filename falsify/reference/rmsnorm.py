"""RMSNorm over the last dimension: y = x · rsqrt(mean(x²) + eps) · w.

Backward (r = inv_rms = (mean(x²) + eps)^(-1/2), x̂ = x·r, g = dy ⊙ w, n = row length):
    ∂r/∂x_j = −r³·x_j / n
    dx_j    = r·g_j + Σ_i g_i·x_i·∂r/∂x_j = r·(g_j − x̂_j · mean_i(g_i·x̂_i))
    dw      = Σ_rows dy ⊙ x̂
The mean is a per-row scalar over the hidden dimension — not the column sum dw (a published
backward writes `normed * d_weight_sum`, which is wrong).
"""

import numpy as np


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def rmsnorm_forward(x, w, eps):
    """(y, inv_rms): inv_rms has shape x.shape[:-1], the only tensor the backward needs
    besides the inputs."""
    x, w = _f64(x), _f64(w)
    if x.ndim < 1 or x.shape[-1] == 0:  # the mean square of no elements is 0/0
        raise ValueError(f"rmsnorm: the last dimension n = 0 (x {x.shape}): no mean square")
    inv_rms = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    return x * inv_rms[..., None] * w, inv_rms


def rmsnorm(x, w, eps):
    return rmsnorm_forward(x, w, eps)[0]


def rmsnorm_backward(x, w, eps, dy):
    """Gradients of sum(dy ⊙ rmsnorm(x, w, eps)) with respect to x and w."""
    x, w, dy = _f64(x), _f64(w), _f64(dy)
    r = (1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps))[..., None]
    xhat = x * r
    g = dy * w
    dx = r * (g - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(axis=0)
    return {"x": dx, "w": dw}


# The `one-plus-w` variant (Gemma): the weight is an offset from 1, y = x̂ ⊙ (1 + w). Since
# ∂(1 + w)/∂w = 1 its gradients are the plain ones at weight 1 + w.
def rmsnorm_one_plus_w(x, w, eps):
    return rmsnorm(x, 1.0 + _f64(w), eps)


def rmsnorm_one_plus_w_backward(x, w, eps, dy):
    return rmsnorm_backward(x, 1.0 + _f64(w), eps, dy)
