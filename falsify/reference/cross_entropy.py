"""Token cross-entropy over a vocabulary, with ignore_index, reductions, z-loss and label
smoothing (float64 reference).

Per row t with logits z ∈ ℝ^V, label y, lse = log Σ_j exp(z_j):

    target  q = (1 − ε)·e_y + ε/V·1                      (label smoothing ε; ε = 0: one-hot)
    loss_t  = −Σ_j q_j log softmax(z)_j + ζ·lse²
            = (1 − ε)(lse − z_y) + ε(lse − mean_j z_j) + ζ·lse²     (z-loss ζ, PaLM)
    ∂loss_t/∂z = softmax(z)·(1 + 2ζ·lse) − q

Rows with y = ignore_index have loss 0 and gradient 0. Reductions: "none" → [T]; "sum" → Σ_t;
"mean" → Σ_t / n with n the number of non-ignored rows (NaN when n = 0, as torch). With an
upstream gradient dy: none scales row t by dy[t] (a vector, never dy[0]), sum by dy, mean by
dy/n. Without z-loss every gradient row sums to 0 (Σ softmax = Σ q = 1).
"""

import math

import numpy as np

REDUCTIONS = ("none", "sum", "mean")


def _real(x) -> bool:
    """A real scalar: a Python or numpy number, or the arbiter's high-precision value (which
    compares with floats but refuses to become one)."""
    return not isinstance(x, (str, bytes, np.ndarray)) and hasattr(x, "__lt__") and hasattr(
        x, "__truediv__")


def check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing):
    if np.ndim(logits) != 2 or np.ndim(labels) != 1 or np.shape(logits)[0] != np.shape(labels)[0]:
        raise ValueError(f"expected logits [T, V] and labels [T]; got {np.shape(logits)}, "
                         f"{np.shape(labels)}")
    V = np.shape(logits)[1]
    if V < 1:
        raise ValueError(f"vocabulary size V = {V}: must be ≥ 1")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: must be one of {REDUCTIONS}")
    if not (_real(z_loss) and 0 <= z_loss < math.inf):
        raise ValueError(f"z_loss={z_loss!r}: must be finite and ≥ 0")
    if not (_real(label_smoothing) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"label_smoothing={label_smoothing!r}: must lie in [0, 1]")
    lab = np.asarray(labels)
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= V))
    if bad.any():
        raise ValueError(f"labels outside [0, {V}) that are not ignore_index={ignore_index}")


def logsumexp(z):
    """Row logsumexp, max-subtracted: log Σ exp(z) = m + log Σ exp(z − m)."""
    m = z.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[..., 0]


def _rows(logits, labels, ignore_index, z_loss, label_smoothing):
    z = np.asarray(logits)  # float64 (or the arbiter's high-precision values): never narrowed
    y = np.asarray(labels)
    valid = y != ignore_index
    safe_y = np.where(valid, y, 0)
    lse = logsumexp(z)
    zy = z[np.arange(z.shape[0]), safe_y]
    eps = label_smoothing
    loss = (1 - eps) * (lse - zy) + eps * (lse - z.mean(axis=1)) + z_loss * lse * lse
    return np.where(valid, loss, 0.0), valid, safe_y, lse, z


def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                  label_smoothing=0.0):
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    loss, valid, _, _, _ = _rows(logits, labels, ignore_index, z_loss, label_smoothing)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    n = int(valid.sum())
    return loss.sum() / n if n else np.float64(np.nan)


def cross_entropy_backward(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                           label_smoothing=0.0, dy=None):
    """{"logits": ∂(Σ dy·loss)/∂logits} for upstream gradient dy of the reduced loss."""
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    _, valid, safe_y, lse, z = _rows(logits, labels, ignore_index, z_loss, label_smoothing)
    T, V = z.shape
    p = np.exp(z - lse[:, None])
    q = np.full((T, V), label_smoothing / V)
    q[np.arange(T), safe_y] += 1.0 - label_smoothing
    g = p * (1.0 + 2.0 * z_loss * lse)[:, None] - q
    dy = np.asarray(1.0 if dy is None else dy)
    if reduction == "none":
        scale = dy.reshape(T)
    elif reduction == "sum":
        scale = np.full(T, dy[()])
    else:
        n = int(valid.sum())
        scale = np.full(T, dy[()] / n if n else np.nan)
    return {"logits": np.where(valid[:, None], g * scale[:, None], 0.0)}


def cross_entropy_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0):
    """∂(reduced loss)/∂logits with dy = 1 (or ones for "none"): the array form, for
    properties of the gradient itself (rows sum to 0, ignored rows 0, |g| ≤ 1)."""
    dy = np.ones(np.shape(labels)) if reduction == "none" else 1.0
    return cross_entropy_backward(logits, labels, ignore_index, reduction, z_loss,
                                  label_smoothing, dy)["logits"]
