"""Fused linear KD mutants: the distillation bugs (T² missing, KL direction, untempered top-k
teacher), the chunking bugs (tail chunk dropped, mean per chunk), a teacher left in the graph,
and one numerically right variant that materialises the [N, V] logits (only the memory check
sees it).

The chunked mutants share one honest skeleton (`_Chunked`): per chunk, the rows' KL and CE
come from plain torch ops on the chunk's logits and G_c = ∂(chunk's share of L)/∂z_c from
autograd on that chunk, then dx_c = G_c·W and dW += G_cᵀ·x_c in the forward, as the kernel
does. Each mutant changes exactly one thing in it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from falsify.kernels.torch.fused_linear_kd import (
    _chunk,
    check_args,
    check_teacher,
    check_topk,
    topk_stable,
)


def _rows(z, teacher, labels, temperature, ignore_index, *, reverse, tempered_teacher):
    """Per-row (KL, CE) of the chunk, 0 on ignored rows."""
    log_ps = F.log_softmax(z / temperature, dim=1)
    if isinstance(teacher, tuple):
        vals, idx = teacher
        tv = vals.float() / (temperature if tempered_teacher else 1.0)
        log_pk = F.log_softmax(tv, dim=1)
        kl = (log_pk.exp() * (log_pk - log_ps.gather(1, idx))).sum(1)
    else:
        log_pt = F.log_softmax(teacher.float() / temperature, dim=1)
        if reverse:
            kl = (log_ps.exp() * (log_ps - log_pt)).sum(1)
        else:
            kl = (log_pt.exp() * (log_pt - log_ps)).sum(1)
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    ce = F.cross_entropy(z, safe_y, reduction="none")
    zero = torch.zeros_like(kl)
    return torch.where(valid, kl, zero), torch.where(valid, ce, zero)


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, teacher, labels, temperature, alpha, ignore_index, chunk, bug):
        N = x.shape[0]
        t2 = 1.0 if bug == "no_t2" else temperature ** 2
        valid = labels != ignore_index
        n = valid.sum().float()
        stop = N - N % chunk if (bug == "tail" and N >= chunk) else N
        starts = list(range(0, stop, chunk))
        kl = torch.zeros(N)
        ce = torch.zeros(N)
        dx = torch.zeros_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32)
        loss = torch.zeros(())
        for r0 in starts:
            sl = slice(r0, min(N, r0 + chunk))
            with torch.enable_grad():
                z = (x[sl].detach() @ weight.detach().t()).float().requires_grad_(True)
                t = tuple(u[sl] for u in teacher) if isinstance(teacher, tuple) else teacher[sl]
                k_rows, c_rows = _rows(z, t, labels[sl], temperature, ignore_index,
                                       reverse=bug == "reverse",
                                       tempered_teacher=bug != "untempered_topk")
                # the chunk's share of L: Σ rows / n, or (bug) its own mean over chunks
                denom = (valid[sl].sum().float() * len(starts)) if bug == "per_chunk" else n
                part = (alpha * t2 * k_rows.sum() + (1 - alpha) * c_rows.sum()) / denom
                (g,) = torch.autograd.grad(part, [z])
            kl[sl], ce[sl] = k_rows.detach(), c_rows.detach()
            loss = loss + part.detach()
            dx[sl] = (g.to(x.dtype) @ weight).to(x.dtype)
            dw += g.t() @ x[sl].float()
        ctx.grads = (dx, dw, weight.dtype)
        kl_m, ce_m = (kl.sum() / n).to(x.dtype), (ce.sum() / n).to(x.dtype)
        ctx.mark_non_differentiable(kl_m, ce_m)
        return loss.to(x.dtype), kl_m, ce_m

    @staticmethod
    def backward(ctx, dy, _dkl, _dce):
        dx, dw, wdt = ctx.grads
        s = dy.float()
        return ((dx.float() * s).to(dx.dtype), (dw * s).to(wdt), None, None, None, None, None,
                None, None)


def _full(bug):
    def fn(x, weight, teacher_logits, labels, temperature, alpha, ignore_index=-100,
           chunk_size=None):
        check_args("fused_linear_kd", x, weight, labels, temperature, alpha, ignore_index,
                   chunk_size)
        check_teacher("fused_linear_kd", x, weight, teacher_logits)
        return _Chunked.apply(x, weight, teacher_logits.detach(), labels, float(temperature),
                              float(alpha), ignore_index, _chunk(chunk_size, x, weight), bug)
    return fn


no_temperature_squared = _full("no_t2")
no_temperature_squared.__doc__ = "α·KL + (1 − α)·CE: the soft term (and its gradient) lacks T²."
reversed_kl = _full("reverse")
reversed_kl.__doc__ = "KL(p_s ‖ p_t): mode-seeking, still ≥ 0, so only value checks see it."
last_chunk_dropped = _full("tail")
last_chunk_dropped.__doc__ = "The chunk loop stops at the last full chunk: N mod C rows skipped."
mean_per_chunk = _full("per_chunk")
mean_per_chunk.__doc__ = "Each chunk averaged over its own valid rows, then over the chunks."


def topk_not_tempered(x, weight, teacher_logits, labels, temperature, alpha, k,
                      ignore_index=-100, chunk_size=None):
    """Cached top-k values softmaxed at temperature 1 while the student is tempered."""
    check_args("fused_linear_kd_topk", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size)
    check_teacher("fused_linear_kd_topk", x, weight, teacher_logits)
    vals, idx = topk_stable(teacher_logits, k)
    check_topk("fused_linear_kd_topk", x, weight, vals, idx)
    return _Chunked.apply(x, weight, (vals, idx), labels, float(temperature), float(alpha),
                          ignore_index, _chunk(chunk_size, x, weight), "untempered_topk")


def _naive(x, weight, teacher, labels, temperature, alpha, ignore_index):
    z = (x @ weight.t()).float()
    log_ps = F.log_softmax(z / temperature, dim=1)
    log_pt = F.log_softmax(teacher.float() / temperature, dim=1)
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    zero = torch.zeros(x.shape[0])
    kl = torch.where(valid, (log_pt.exp() * (log_pt - log_ps)).sum(1), zero).sum()
    ce = torch.where(valid, F.cross_entropy(z, safe_y, reduction="none"), zero).sum()
    n = valid.sum()
    kl, ce = kl / n, ce / n
    loss = alpha * temperature ** 2 * kl + (1 - alpha) * ce
    return loss.to(x.dtype), kl.detach().to(x.dtype), ce.detach().to(x.dtype)


def materialized_logits(x, weight, teacher_logits, labels, temperature, alpha,
                        ignore_index=-100, chunk_size=None):
    """kd_loss(x @ W.T, …) through autograd: right values, the [N, V] logits (and their
    softmaxes and gradients) the kernel exists to avoid."""
    check_args("fused_linear_kd", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size)
    check_teacher("fused_linear_kd", x, weight, teacher_logits)
    return _naive(x, weight, teacher_logits.detach(), labels, float(temperature), float(alpha),
                  ignore_index)


def teacher_not_detached(x, weight, teacher_logits, labels, temperature, alpha,
                         ignore_index=-100, chunk_size=None):
    """As materialized_logits, but the teacher stays in the graph: a teacher that requires
    grad is trained by the distillation loss."""
    check_args("fused_linear_kd", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size)
    check_teacher("fused_linear_kd", x, weight, teacher_logits)
    return _naive(x, weight, teacher_logits, labels, float(temperature), float(alpha),
                  ignore_index)
