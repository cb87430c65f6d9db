"""Knowledge-distillation loss in PyTorch (math, gradient and the top-k variant:
falsify/reference/kd_loss.py). fp32 throughout, teacher logits detached, mean over non-ignored rows;
autograd provides ∂/∂student = α·T·(p_s − p_t) + (1 − α)(softmax(z_s) − e_y), per valid row
over n. Returns (loss, mean KL, mean CE) in the student dtype so callers can log both terms.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from falsify.kernels.dtypes import CHECKED, FP32, require

__all__ = ["kd_loss", "kd_loss_from_topk"]


def check_kd_args(student_logits, labels, temperature, alpha):
    if not isinstance(student_logits, torch.Tensor) or student_logits.dim() != 2:
        raise ValueError("student_logits must be a 2-D tensor [T, V]")
    require("kd_loss", CHECKED, student_logits=student_logits)
    if student_logits.shape[1] == 0:  # a softmax over no logits
        raise ValueError("kd_loss: vocabulary size V = 0")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or \
            labels.shape[0] != student_logits.shape[0]:
        raise ValueError(f"labels must be a 1-D tensor of length {student_logits.shape[0]}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
            and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: must be finite and > 0")
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha={alpha!r}: must lie in [0, 1]")


def _finish(kl_rows, zs, labels, temperature, alpha, ignore_index, dtype):
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels))
    ce_rows = F.cross_entropy(zs, safe_y, reduction="none")
    n = valid.sum()
    zero = torch.zeros_like(kl_rows)
    kl = torch.where(valid, kl_rows, zero).sum() / n
    ce = torch.where(valid, ce_rows, zero).sum() / n
    loss = alpha * temperature ** 2 * kl + (1.0 - alpha) * ce
    return loss.to(dtype), kl.to(dtype), ce.to(dtype)


def kd_loss(student_logits, teacher_logits, labels, temperature, alpha, ignore_index=-100):
    check_kd_args(student_logits, labels, temperature, alpha)
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher logits {tuple(teacher_logits.shape)} must match student "
                         f"logits {tuple(student_logits.shape)}")
    zs = student_logits.float()
    log_ps = F.log_softmax(zs / temperature, dim=-1)
    log_pt = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    kl_rows = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    return _finish(kl_rows, zs, labels, temperature, alpha, ignore_index, student_logits.dtype)


def _kd_loss_topk(student_logits, teacher_topk_values, teacher_topk_indices, labels,
                 temperature, alpha, ignore_index=-100):
    """KD against a cached top-k teacher: values [T, k] and vocabulary indices [T, k]."""
    check_kd_args(student_logits, labels, temperature, alpha)
    if teacher_topk_values.shape != teacher_topk_indices.shape or \
            teacher_topk_values.shape[0] != student_logits.shape[0]:
        raise ValueError("teacher top-k values and indices must both be [T, k]")
    idx = teacher_topk_indices.long()
    if torch.compiler.is_compiling():
        # reading the indices back is a graph break (Tensor.item()): compiled, Inductor's
        # indexing assert refuses them, negative ones moved past the end rather than wrapped
        idx = torch.where(idx < 0, torch.full_like(idx, student_logits.shape[1]), idx)
    elif idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= student_logits.shape[1]):
        raise ValueError("teacher top-k indices outside the vocabulary")
    zs = student_logits.float()
    log_ps = F.log_softmax(zs / temperature, dim=-1).gather(1, idx)
    log_pt = F.log_softmax(teacher_topk_values.detach().float() / temperature, dim=-1)
    kl_rows = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    return _finish(kl_rows, zs, labels, temperature, alpha, ignore_index, student_logits.dtype)


def _topk_stable(z, k):
    if not (isinstance(k, int) and 1 <= k <= z.shape[1]):
        raise ValueError(f"k={k!r}: must lie in [1, V={z.shape[1]}]")
    vals, idx = torch.sort(z, dim=1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]


def kd_loss_from_topk(student_logits, teacher_logits, labels, temperature, alpha, k,
                      ignore_index=-100):
    # its contract runs float32 only (the sparse path's tolerances are derived for it)
    require("kd_loss_from_topk", FP32, student_logits=student_logits,
            teacher_logits=teacher_logits)
    vals, idx = _topk_stable(teacher_logits.detach(), k)
    return _kd_loss_topk(student_logits, vals, idx, labels, temperature, alpha, ignore_index)
