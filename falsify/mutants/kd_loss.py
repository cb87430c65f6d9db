"""KD-loss mutants: the temperature, direction and weighting bugs the contract must catch."""

from __future__ import annotations

import torch.nn.functional as F

from falsify.kernels.torch.kd_loss import _finish, check_kd_args


def _kd(student_logits, teacher_logits, labels, temperature, alpha, ignore_index, *,
        t2=True, reverse=False, temper_student=True, swap_alpha=False):
    check_kd_args(student_logits, labels, temperature, alpha)
    zs = student_logits.float()
    log_ps = F.log_softmax(zs / temperature if temper_student else zs, dim=-1)
    log_pt = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    if reverse:
        kl_rows = (log_ps.exp() * (log_ps - log_pt)).sum(-1)
    else:
        kl_rows = (log_pt.exp() * (log_pt - log_ps)).sum(-1)
    a = 1.0 - alpha if swap_alpha else alpha
    t = temperature if t2 else 1.0
    return _finish(kl_rows, zs, labels, t, a, ignore_index, student_logits.dtype)


def no_temperature_squared(student_logits, teacher_logits, labels, temperature, alpha,
                           ignore_index=-100):
    """α·KL + (1 − α)·CE: the soft term's gradient shrinks like 1/T."""
    return _kd(student_logits, teacher_logits, labels, temperature, alpha, ignore_index,
               t2=False)


def reversed_kl(student_logits, teacher_logits, labels, temperature, alpha, ignore_index=-100):
    """KL(student ‖ teacher) instead of KL(teacher ‖ student): mode-seeking, not the
    distillation objective (still ≥ 0, so only the value checks see it)."""
    return _kd(student_logits, teacher_logits, labels, temperature, alpha, ignore_index,
               reverse=True)


def student_not_tempered(student_logits, teacher_logits, labels, temperature, alpha,
                         ignore_index=-100):
    """softmax(z_t/T) compared with softmax(z_s) at temperature 1."""
    return _kd(student_logits, teacher_logits, labels, temperature, alpha, ignore_index,
               temper_student=False)


def alpha_swapped(student_logits, teacher_logits, labels, temperature, alpha,
                  ignore_index=-100):
    """(1 − α)·T²·KL + α·CE: α weights the wrong term."""
    return _kd(student_logits, teacher_logits, labels, temperature, alpha, ignore_index,
               swap_alpha=True)
