"""Knowledge-distillation loss (Hinton et al. 2015), per token row, float64 reference.

    p_t = softmax(z_t / T),  p_s = softmax(z_s / T)           (temperature T > 0)
    KL  = Σ_j p_t,j (log p_t,j − log p_s,j)  ≥ 0             (teacher ‖ student)
    CE  = logsumexp(z_s) − z_s,y                              (hard labels, temperature 1)
    L   = α·T²·KL + (1 − α)·CE,   α ∈ [0, 1]

averaged over the n non-ignored rows (rows with y = ignore_index contribute to neither term).
T² keeps the soft-target gradient on the scale of the hard one: ∂(T²·KL)/∂z_s = T·(p_s − p_t),
which tends to (z_s − z_t)/V (times 1/T⁰) for large T instead of vanishing like 1/T.

Top-k variant (teacher logits cached sparsely, as for offline distillation): the teacher gives
its k largest logits and their indices; p̃_t = softmax over those k values / T, and
KL_k = Σ_{i∈K} p̃_t,i (log p̃_t,i − log p_s,i) with p_s the student's full-vocabulary softmax.
KL_k ≥ −log Σ_{i∈K} p_s,i ≥ 0 (Gibbs), and k = V gives the full KL.

Gradient w.r.t. the student logits (teacher is constant), per valid row, divided by n:
    α·T·(p_s − p_t) + (1 − α)·(softmax(z_s) − e_y)          (full)
    α·T·(p_s·Σ_K p̃_t − scatter_K(p̃_t)) + (1 − α)(…)       (top-k; Σ_K p̃_t = 1)
"""

import math

import numpy as np

from falsify.reference.cross_entropy import logsumexp


def check_kd_args(student_logits, labels, temperature, alpha):
    if np.ndim(student_logits) != 2 or np.ndim(labels) != 1 or \
            np.shape(labels)[0] != np.shape(student_logits)[0]:
        raise ValueError("expected student logits [T, V] and labels [T]")
    if np.shape(student_logits)[1] == 0:  # a softmax over no logits
        raise ValueError("kd_loss: vocabulary size V = 0")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: must be finite and > 0")
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha={alpha!r}: must lie in [0, 1]")


def _log_softmax(z):
    return z - logsumexp(z)[:, None]


def _terms(zs, log_pt_full_or_k, idx, labels, temperature, ignore_index):
    """Per-row KL and CE (float64) given teacher log-probs over index set idx (None = all)."""
    log_ps = _log_softmax(zs / temperature)
    if idx is None:
        log_ps_k = log_ps
    else:
        log_ps_k = np.take_along_axis(log_ps, idx, axis=1)
    pt = np.exp(log_pt_full_or_k)
    kl = np.sum(pt * (log_pt_full_or_k - log_ps_k), axis=1)
    valid = labels != ignore_index
    safe_y = np.where(valid, labels, 0)
    ce = logsumexp(zs) - zs[np.arange(zs.shape[0]), safe_y]
    return kl, ce, valid


def _reduce(kl, ce, valid, temperature, alpha):
    n = int(valid.sum())
    if n == 0:
        return np.float64(np.nan), np.float64(np.nan), np.float64(np.nan)
    kl_m = kl[valid].sum() / n
    ce_m = ce[valid].sum() / n
    loss = alpha * temperature ** 2 * kl_m + (1 - alpha) * ce_m
    return np.float64(loss), np.float64(kl_m), np.float64(ce_m)


def kd_loss(student_logits, teacher_logits, labels, temperature, alpha, ignore_index=-100):
    """(loss, mean KL, mean CE) over non-ignored rows; NaN for all three when none is valid."""
    check_kd_args(student_logits, labels, temperature, alpha)
    zs = np.asarray(student_logits, np.float64)
    zt = np.asarray(teacher_logits, np.float64)
    if zt.shape != zs.shape:
        raise ValueError(f"teacher logits {zt.shape} must match student logits {zs.shape}")
    kl, ce, valid = _terms(zs, _log_softmax(zt / temperature), None, np.asarray(labels),
                           temperature, ignore_index)
    return _reduce(kl, ce, valid, temperature, alpha)


def kd_loss_backward(student_logits, teacher_logits, labels, temperature, alpha,
                     ignore_index=-100, dy=None):
    check_kd_args(student_logits, labels, temperature, alpha)
    zs = np.asarray(student_logits, np.float64)
    zt = np.asarray(teacher_logits, np.float64)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    n = int(valid.sum())
    ps_T = np.exp(_log_softmax(zs / temperature))
    pt_T = np.exp(_log_softmax(zt / temperature))
    ps = np.exp(_log_softmax(zs))
    onehot = np.zeros_like(zs)
    onehot[np.arange(zs.shape[0]), np.where(valid, labels, 0)] = 1.0
    g = alpha * temperature * (ps_T - pt_T) + (1 - alpha) * (ps - onehot)
    scale = (1.0 if dy is None else float(dy)) / n if n else np.nan
    return {"student_logits": np.where(valid[:, None], g * scale, 0.0)}


def kd_loss_topk(student_logits, teacher_topk_values, teacher_topk_indices, labels,
                 temperature, alpha, ignore_index=-100):
    """Top-k teacher: (loss, mean KL_k, mean CE)."""
    check_kd_args(student_logits, labels, temperature, alpha)
    zs = np.asarray(student_logits, np.float64)
    vals = np.asarray(teacher_topk_values, np.float64)
    idx = np.asarray(teacher_topk_indices).astype(np.int64)
    if vals.shape != idx.shape or vals.shape[0] != zs.shape[0]:
        raise ValueError("teacher top-k values and indices must both be [T, k]")
    if idx.size and (idx.min() < 0 or idx.max() >= zs.shape[1]):
        raise ValueError("teacher top-k indices outside the vocabulary")
    kl, ce, valid = _terms(zs, _log_softmax(vals / temperature), idx, np.asarray(labels),
                           temperature, ignore_index)
    return _reduce(kl, ce, valid, temperature, alpha)


def topk_stable(z, k):
    """The k largest entries per row, ties broken by the lower index (a stable descending
    sort), so every backend selects the same set."""
    z = np.asarray(z, np.float64)
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= z.shape[1]):
        raise ValueError(f"k={k!r}: must lie in [1, V={z.shape[1]}]")
    idx = np.argsort(-z, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(z, idx, axis=1), idx


def kd_loss_from_topk(student_logits, teacher_logits, labels, temperature, alpha, k,
                      ignore_index=-100):
    """The offline-distillation pipeline in one call: cache the teacher's top-k (stable),
    then kd_loss_topk. The contract's binding for the top-k variant."""
    vals, idx = topk_stable(teacher_logits, k)
    return kd_loss_topk(student_logits, vals, idx, labels, temperature, alpha, ignore_index)
