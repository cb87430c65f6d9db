"""Gradient accumulation, stated as what it must equal: the full-batch gradient.

Model used by the contract: a linear LM head, logits z = x·Wᵀ (x ∈ ℝ^{B×H}, W ∈ ℝ^{V×H}),
token cross-entropy with an ignore_index. Over one optimizer step the loss is

    L = (1/n) Σ_{t valid} CE_t,      n = #{t : label_t ≠ ignore_index}  (over ALL micro-batches)

so the gradient of N micro-batches, each contributing Σ_{t ∈ i} CE_t / n, adds up to exactly
the full-batch gradient. The mean of per-micro-batch means, (1/N) Σ_i (Σ_{t∈i} CE_t / n_i),
weights a token in a micro-batch with few valid tokens more than one in a full micro-batch:
it is a different loss whenever the n_i differ.

Clipping happens once, on the accumulated gradient: G ← min(1, max_norm/(‖G‖ + eps))·G.
No valid token at all: L = 0 (an empty sum), G = 0, and n = 0 is returned so the caller can
skip the step; nothing is divided by zero.

This reference computes the full-batch gradient in closed form (no micro-batches at all):
∂L/∂W = Σ_{t valid} (softmax(z_t) − e_{y_t}) x_tᵀ / n.
"""


import numpy as np

from falsify.arguments import check_accumulation_args


def micro_batch_slices(B, n_micro):
    """N contiguous chunks whose sizes differ by at most one (np.array_split's rule)."""
    base, extra = divmod(B, n_micro)
    out, start = [], 0
    for i in range(n_micro):
        size = base + (1 if i < extra else 0)
        out.append(slice(start, start + size))
        start += size
    return out


def full_batch_grad(x, weight, labels, ignore_index):
    """(∂L/∂W, L, n) for the token-mean CE of the whole batch, float64, closed form."""
    x = np.asarray(x, np.float64)
    w = np.asarray(weight, np.float64)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    n = int(valid.sum())
    z = x @ w.T
    zmax = z.max(axis=1, keepdims=True) if z.size else z
    lse = (zmax + np.log(np.exp(z - zmax).sum(axis=1, keepdims=True)))[:, 0] if z.size else \
        np.zeros(x.shape[0])
    p = np.exp(z - lse[:, None])
    safe_y = np.where(valid, labels, 0)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(labels)), safe_y] = 1.0
    dz = (p - onehot) * valid[:, None]
    if n == 0:
        return np.zeros_like(w), 0.0, 0
    ce = lse - z[np.arange(len(labels)), safe_y]
    return dz.T @ x / n, float(ce[valid].sum() / n), n


def accumulate_grad(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps):
    """Returns (clipped accumulated ∂L/∂W, L, n_tokens, ‖∂L/∂W‖ before clipping)."""
    check_accumulation_args(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps)
    g, loss, n = full_batch_grad(x, weight, labels, ignore_index)
    norm = float(np.sqrt(np.sum(g * g)))
    coef = min(1.0, max_norm / (norm + clip_eps)) if norm + clip_eps > 0 else 1.0
    return g * coef, np.float64(loss), np.int64(n), np.float64(norm)
