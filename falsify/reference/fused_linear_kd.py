"""Fused linear + knowledge distillation, stated plainly (float64): the student logits
z_s = x·Wᵀ are materialised and handed to the kd-loss reference (falsify/reference/kd_loss.py). The
optimized backends compute the same numbers without ever holding [N, V] student logits
(falsify/kernels/torch/fused_linear_kd.py).

    z_s = x·Wᵀ,  (L, KL, CE) = kd_loss(z_s, z_t, y; T, α)   (full teacher logits)
                 (L, KL, CE) = kd_loss_topk(z_s, v, i, y; T, α) (cached teacher top-k)
    with G = ∂L/∂z_s (times the scalar upstream dy):
    ∂L/∂x = G·W,   ∂L/∂W = Gᵀ·x,   the teacher gets no gradient.

Per valid row, over the n valid rows (falsify/reference/kd_loss.py has the derivation):
    G = [α·T·(p_s − p_t) + (1 − α)(softmax(z_s) − e_y)] / n           (full)
    G = [α·T·(p_s − scatter_K(p̃_t)) + (1 − α)(softmax(z_s) − e_y)] / n (top-k, Σ_K p̃_t = 1)

Top-k renormalisation error (topk_renorm_bound): with ε = 1 − Σ_{i∈K} p_t,i the teacher's mass
outside its top k and Δ = (max_j z_s,j − min_j z_s,j)/T the spread of the student's tempered
logits, per row
    |KL_k − KL| ≤ H(ε) + ε·(log V + 2Δ) ≤ ε·(1 + log(1/ε) + log V + 2Δ),
H(ε) = −ε·log ε − (1 − ε)·log(1 − ε). Derivation (chain rule of KL over the partition K, K^c,
s = Σ_K p_s, p̃_s = p_s/s on K, p_t^c and p_s^c the normalised tails):
    KL   = KL₂((1 − ε, ε) ‖ (s, 1 − s)) + (1 − ε)·KL(p̃_t ‖ p̃_s) + ε·KL(p_t^c ‖ p_s^c)
    KL_k = Σ_K p̃_t·(log p̃_t − log p_s) = KL(p̃_t ‖ p̃_s) − log s
    KL_k − KL = H(ε) + ε·[KL(p̃_t ‖ p̃_s) − KL(p_t^c ‖ p_s^c) + log((1 − s)/s)].
Every student probability ratio within a row is at most e^Δ, so KL(p̃_t ‖ p̃_s) ∈ [0, log k + Δ],
KL(p_t^c ‖ p_s^c) ∈ [0, log(V − k) + Δ] and log((1 − s)/s) ∈ log((V − k)/k) ± Δ: the bracket lies
in [−log k − 2Δ, log(V − k) + 2Δ] ⊂ [−log V − 2Δ, log V + 2Δ]. (−(1 − ε)·log(1 − ε) ≤ ε gives the
second form.) The mean over valid rows inherits the mean of the per-row bounds.
"""

import numpy as np

from falsify.reference.kd_loss import (
    _log_softmax,
    kd_loss,
    kd_loss_backward,
    kd_loss_topk,
    topk_stable,
)


def _check(x, weight, labels, teacher=None, what="teacher_logits"):
    if np.ndim(x) != 2 or np.ndim(weight) != 2 or np.shape(x)[1] != np.shape(weight)[1]:
        raise ValueError(f"expected x [N, d] and weight [V, d]; got {np.shape(x)}, "
                         f"{np.shape(weight)}")
    if np.ndim(labels) != 1 or np.shape(labels)[0] != np.shape(x)[0]:
        raise ValueError(f"labels must have shape [{np.shape(x)[0]}]")
    if teacher is not None and np.ndim(teacher) != 2:
        raise ValueError(f"{what} must be 2-D")
    if teacher is not None and what == "teacher_logits" and \
            np.shape(teacher) != (np.shape(x)[0], np.shape(weight)[0]):
        raise ValueError(f"teacher_logits {np.shape(teacher)} must be [N, V] = "
                         f"{(np.shape(x)[0], np.shape(weight)[0])}")


def _logits(x, weight):
    return np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T


def fused_linear_kd(x, weight, teacher_logits, labels, temperature, alpha, ignore_index=-100,
                    chunk_size=None):
    """(L, KL, CE) of kd_loss(x·Wᵀ, teacher_logits, labels). chunk_size is accepted for
    signature parity with the optimized backends and ignored: the reference has no chunks."""
    _check(x, weight, labels, teacher_logits)
    return kd_loss(_logits(x, weight), teacher_logits, labels, temperature, alpha, ignore_index)


def fused_linear_kd_backward(x, weight, teacher_logits, labels, temperature, alpha,
                             ignore_index=-100, chunk_size=None, dy=None):
    """{x: G·W, weight: Gᵀ·x, teacher_logits: 0} for the upstream gradient dy of L."""
    _check(x, weight, labels, teacher_logits)
    x64, w64 = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    g = kd_loss_backward(x64 @ w64.T, teacher_logits, labels, temperature, alpha, ignore_index,
                         dy)["student_logits"]
    return {"x": g @ w64, "weight": g.T @ x64,
            "teacher_logits": np.zeros(np.shape(teacher_logits))}


def fused_linear_kd_topk(x, weight, topk_values, topk_indices, labels, temperature, alpha,
                         ignore_index=-100, chunk_size=None):
    """(L, KL_k, CE) against a cached teacher top-k: values [N, k], vocabulary indices [N, k]."""
    _check(x, weight, labels, topk_values, "topk_values")
    return kd_loss_topk(_logits(x, weight), topk_values, topk_indices, labels, temperature,
                        alpha, ignore_index)


def fused_linear_kd_from_topk(x, weight, teacher_logits, labels, temperature, alpha, k,
                              ignore_index=-100, chunk_size=None):
    """The offline-distillation pipeline in one call: cache the teacher's stable top-k, then
    fused_linear_kd_topk. The contract's binding for the top-k equation."""
    _check(x, weight, labels, teacher_logits)
    vals, idx = topk_stable(teacher_logits, k)
    return fused_linear_kd_topk(x, weight, vals, idx, labels, temperature, alpha, ignore_index)


def fused_linear_kd_from_topk_backward(x, weight, teacher_logits, labels, temperature, alpha,
                                       k, ignore_index=-100, chunk_size=None, dy=None):
    """G = [α·T·(p_s − scatter_K(p̃_t)) + (1 − α)(softmax(z_s) − e_y)]/n per valid row;
    {x: G·W, weight: Gᵀ·x, teacher_logits: 0}."""
    _check(x, weight, labels, teacher_logits)
    x64, w64 = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    zs = x64 @ w64.T
    vals, idx = topk_stable(teacher_logits, k)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    n = int(valid.sum())
    ps_T = np.exp(_log_softmax(zs / temperature))
    ps = np.exp(_log_softmax(zs))
    pt_k = np.exp(_log_softmax(vals / temperature))
    target = np.zeros_like(zs)
    np.add.at(target, (np.arange(zs.shape[0])[:, None], idx), pt_k)
    onehot = np.zeros_like(zs)
    onehot[np.arange(zs.shape[0]), np.where(valid, labels, 0)] = 1.0
    g = alpha * temperature * (ps_T - target) + (1 - alpha) * (ps - onehot)
    scale = (1.0 if dy is None else float(dy)) / n if n else np.nan
    g = np.where(valid[:, None], g * scale, 0.0)
    return {"x": g @ w64, "weight": g.T @ x64,
            "teacher_logits": np.zeros(np.shape(teacher_logits))}


def topk_renorm_bound(x, weight, teacher_logits, labels, temperature, k, ignore_index=-100):
    """(|KL_k − KL| exact in float64, the derived bound): both means over the valid rows, the
    bound the mean of the per-row H(ε) + ε·(log V + 2Δ) (module docstring)."""
    _check(x, weight, labels, teacher_logits)
    zs = _logits(x, weight)
    zt = np.asarray(teacher_logits, np.float64)
    labels = np.asarray(labels)
    valid = labels != ignore_index
    _, idx = topk_stable(zt, k)
    log_pt = _log_softmax(zt / temperature)
    eps_out = np.clip(1.0 - np.take_along_axis(np.exp(log_pt), idx, 1).sum(1), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(eps_out > 0, eps_out * np.log(eps_out), 0.0) - np.where(
            eps_out < 1, (1 - eps_out) * np.log1p(-eps_out), 0.0)
    spread = (zs.max(1) - zs.min(1)) / temperature
    bound_rows = h + eps_out * (np.log(zs.shape[1]) + 2 * spread)
    full = fused_linear_kd(x, weight, zt, labels, temperature, 1.0, ignore_index)[1]
    part = fused_linear_kd_from_topk(x, weight, zt, labels, temperature, 1.0, k,
                                     ignore_index)[1]
    n = int(valid.sum())
    bound = float(bound_rows[valid].sum() / n) if n else float("nan")
    return abs(float(part) - float(full)), bound
