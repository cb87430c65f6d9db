"""Fused linear + knowledge distillation in PyTorch: kd_loss(x·Wᵀ, teacher, y) computed over
chunks of token rows so the [N, V] student logits never exist at once (the KD counterpart of
falsify/kernels/torch/fused_linear_cross_entropy.py).

For each chunk of C rows:  z_c = x_c·Wᵀ  [C, V]  →  per-row KL and CE from the chunk's logits
and the chunk's teacher rows (full logits [C, V], or a cached top-k: values and indices [C, k])
→  G_c = ∂L/∂z_c written *in place over z_c's fp32 buffer*  →
    dx_c = G_c·W,     dW += G_cᵀ·x_c   (fp32 accumulator)
The loss is a mean over the valid rows, so its upstream gradient is one scalar: the gradients
are finished in the forward with scale 1/n and the backward only multiplies them by dy
(Liger's trick; n, the count of non-ignored rows, is known before the first chunk).

Per valid row (falsify/reference/kd_loss.py has the derivation), with p_s = softmax(z/T),
p_t = softmax(z_t/T), p = softmax(z):
    KL = Σ_j p_t,j (log p_t,j − log p_s,j),   CE = lse(z) − z_y,
    G  = [α·T·(p_s − p_t) + (1 − α)(p − e_y)] / n
top-k: p_t is replaced by p̃_t = softmax(v/T) on the k cached indices (0 elsewhere), KL by
KL_k = Σ_K p̃_t (log p̃_t − log p_s,K) and p_t in G by scatter_K(p̃_t) (scatter-add: repeated
indices add up, as in the reference).

The returned KL and CE are the means the loss is built from, for logging: they are marked
non-differentiable (their gradients are not precomputed; only L's is). The teacher gets no
gradient (None).
"""

from __future__ import annotations

import math

import torch

from falsify.kernels.dtypes import CHECKED, require
from falsify.kernels.torch.fused_linear_cross_entropy import chunk_rows

__all__ = ["fused_linear_kd", "fused_linear_kd_topk", "fused_linear_kd_from_topk"]
# fused_linear_kd_topk is the application's entry point for a cached teacher; the contract
# reaches it through fused_linear_kd_from_topk (a stable top-k of full teacher logits, then
# this call), so every top-k check runs it.


def check_args(kernel, x, weight, labels, temperature, alpha, ignore_index, chunk_size,
               dtypes: tuple = CHECKED):
    """The argument rules shared by every entry point and backend; errors name the argument."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{kernel}: x must be a 2-D tensor [N, d]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or \
            weight.shape[1] != x.shape[1]:
        raise ValueError(f"{kernel}: weight must be [V, d={x.shape[1]}], got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else weight!r}")
    require(kernel, dtypes, x=x, weight=weight)
    if x.dtype != weight.dtype:
        raise TypeError(f"{kernel}: x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    if weight.shape[0] == 0:  # a softmax over no logits
        raise ValueError(f"{kernel}: vocabulary size V = 0")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or \
            labels.shape[0] != x.shape[0]:
        raise ValueError(f"{kernel}: labels must be a 1-D tensor of length N={x.shape[0]}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{kernel}: labels dtype {labels.dtype}: must be int64 or int32")
    if isinstance(temperature, bool) or not (isinstance(temperature, (int, float))
                                             and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{kernel}: temperature={temperature!r}: must be finite and > 0")
    if isinstance(alpha, bool) or not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"{kernel}: alpha={alpha!r}: must lie in [0, 1]")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(
            chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{kernel}: chunk_size={chunk_size!r}: must be a positive integer "
                         "or None")
    if torch.compiler.is_compiling():  # reading `bad` back is a graph break
        return
    V = weight.shape[0]
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    if bool(bad.any()):
        raise ValueError(f"{kernel}: labels outside [0, {V}) that are not "
                         f"ignore_index={ignore_index}")


def check_teacher(kernel, x, weight, teacher_logits, dtypes: tuple = CHECKED):
    if not isinstance(teacher_logits, torch.Tensor) or \
            tuple(teacher_logits.shape) != (x.shape[0], weight.shape[0]):
        got = tuple(teacher_logits.shape) if isinstance(teacher_logits, torch.Tensor) else \
            type(teacher_logits).__name__
        raise ValueError(f"{kernel}: teacher_logits must be [N, V] = "
                         f"{(x.shape[0], weight.shape[0])}, got {got}")
    require(kernel, dtypes, teacher_logits=teacher_logits)


def check_topk(kernel, x, weight, topk_values, topk_indices, dtypes: tuple = CHECKED):
    N, V = x.shape[0], weight.shape[0]
    for name, t in (("topk_values", topk_values), ("topk_indices", topk_indices)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != N:
            raise ValueError(f"{kernel}: {name} must be a 2-D tensor [N={N}, k]")
    if topk_values.shape != topk_indices.shape or topk_values.shape[1] < 1:
        raise ValueError(f"{kernel}: topk_values {tuple(topk_values.shape)} and topk_indices "
                         f"{tuple(topk_indices.shape)} must both be [N, k] with k ≥ 1")
    require(kernel, dtypes, topk_values=topk_values)
    if topk_indices.dtype != torch.int64:
        raise TypeError(f"{kernel}: topk_indices dtype {topk_indices.dtype}: must be int64")
    if torch.compiler.is_compiling():
        return
    if topk_indices.numel() and (int(topk_indices.min()) < 0 or int(topk_indices.max()) >= V):
        raise ValueError(f"{kernel}: topk_indices outside the vocabulary [0, {V})")


class _FLKD(torch.autograd.Function):
    """block(z, teacher_rows, labels, scale, temperature, alpha, ignore_index) -> (kl, ce) is
    the per-chunk KD: the rows' KL and CE, with G = scale·∂(α·T²·KL + (1 − α)·CE)/∂z left in
    z's buffer (fp32). `teacher_rows(sl)` gives the chunk's teacher: logits [C, V] or
    (values, indices) [C, k]. torch: _block_full / _block_topk below; Triton: its kernels."""

    @staticmethod
    def forward(ctx, x, weight, teacher, labels, temperature, alpha, ignore_index, chunk, block,
                rows):
        N = x.shape[0]
        kl = torch.zeros(N, dtype=torch.float32, device=x.device)
        ce = torch.zeros(N, dtype=torch.float32, device=x.device)
        valid = labels != ignore_index
        n = valid.sum().float()
        # 1/n for every row: ignored rows are zeroed by the block; n = 0 gives inf·0 = no
        # gradient anywhere, and the NaN mean below (a mean over no token)
        unit = (1.0 / n).reshape(1)
        dx = torch.empty_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        for r0 in range(0, N, chunk):
            sl = slice(r0, min(N, r0 + chunk))
            z = (x[sl] @ weight.t()).float()  # fp32 block: G is built in it
            kl[sl], ce[sl] = block(z, rows(teacher, sl), labels[sl],
                                   unit.expand(z.shape[0]), temperature, alpha, ignore_index)
            # z now holds G_c
            torch.mm(z.to(x.dtype), weight, out=dx[sl])
            dw.addmm_(z.t(), x[sl].float())
            del z  # free this block before the next matmul allocates the next one
        kl_m = kl.sum() / n
        ce_m = ce.sum() / n
        loss = alpha * temperature ** 2 * kl_m + (1.0 - alpha) * ce_m
        ctx.grads = (dx, dw)
        ctx.wdt = weight.dtype
        kl_out, ce_out = kl_m.to(x.dtype), ce_m.to(x.dtype)
        ctx.mark_non_differentiable(kl_out, ce_out)
        return loss.to(x.dtype), kl_out, ce_out

    @staticmethod
    def backward(ctx, dy, _dkl, _dce):
        if torch.is_grad_enabled():
            # the gradients were computed in the forward: constants to autograd, so every
            # second derivative through them would silently be zero
            raise RuntimeError("fused_linear_kd: the backward is not differentiable (double "
                               "backward is not supported; its gradients are computed in the "
                               "forward): call it without create_graph=True")
        if ctx.grads is None:
            raise RuntimeError("fused_linear_kd: the gradients computed in the forward were "
                               "already handed out; backward runs once")
        dx, dw = ctx.grads
        ctx.grads = None
        s = dy.float()
        if dx.dtype == torch.float32:
            dx.mul_(s)
        else:
            dx = (dx.float() * s).to(dx.dtype)
        dw.mul_(s)
        return (dx, dw if ctx.wdt == torch.float32 else dw.to(ctx.wdt),
                None, None, None, None, None, None, None, None)


def _rows_full(teacher, sl):
    return teacher[sl]


def _rows_topk(teacher, sl):
    return teacher[0][sl], teacher[1][sl]


def _student(z, e1, labels, temperature, ignore_index):
    """The student's two softmaxes from the fp32 block z, one exp pass each: e1 (a [C, V]
    buffer) becomes softmax(z) and z becomes softmax(z/T), both shifted by the row max m.
    Returns (valid, safe_y, CE rows, lse(z/T)); reads z_y first."""
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    zy = z.gather(1, safe_y[:, None])[:, 0]
    m = z.amax(dim=1, keepdim=True)
    torch.sub(z, m, out=e1).exp_()
    s1 = e1.sum(dim=1, keepdim=True)
    e1.div_(s1)
    z.sub_(m).div_(temperature).exp_()
    st = z.sum(dim=1, keepdim=True)
    z.div_(st)
    m, s1, st = m[:, 0], s1[:, 0], st[:, 0]
    ce = m + torch.log(s1) - zy
    return valid, safe_y, ce, m / temperature + torch.log(st)


def _finish_grad(ps, p1, valid, safe_y, scale, temperature, alpha):
    """ps = softmax(z/T) becomes G = s·[α·T·ps + (1 − α)(p1 − e_y)] in place (s = scale on
    valid rows, 0 elsewhere); the caller subtracts the teacher's α·T·s·p_t."""
    s = torch.where(valid, scale, torch.zeros_like(scale))[:, None]
    ps.mul_(alpha * temperature).add_(p1.mul_(1.0 - alpha))
    ps[torch.arange(ps.shape[0], device=ps.device), safe_y] -= 1.0 - alpha
    ps.mul_(s)
    return s


def _rowdot(a, b):
    """Σ_j a_ij·b_ij per row without a [C, V] product temporary (a batched GEMV)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2))[:, 0, 0]


def _block_full(z, zt, labels, scale, temperature, alpha, ignore_index):
    """Three [C, V] fp32 buffers (z, the teacher's log-probabilities then softmax(z), p_t)
    and three exp passes; z ends as G."""
    lp = torch.empty_like(z)
    torch.div(zt, temperature, out=lp)  # a new buffer: the caller's teacher is never written
    lp.sub_(torch.logsumexp(lp, dim=1, keepdim=True))
    pt = torch.exp(lp)
    # KL = Σ p_t·(log p_t − z/T) + lse(z/T), with Σ p_t = 1
    kl_part = _rowdot(pt, lp) - _rowdot(pt, z) / temperature
    valid, safe_y, ce, lse_t = _student(z, lp, labels, temperature, ignore_index)
    zero = torch.zeros_like(ce)
    kl = torch.where(valid, kl_part + lse_t, zero)
    s = _finish_grad(z, lp, valid, safe_y, scale, temperature, alpha)
    z.sub_(pt.mul_(s).mul_(alpha * temperature))
    return kl, torch.where(valid, ce, zero)


def _block_topk(z, teacher, labels, scale, temperature, alpha, ignore_index):
    vals, idx = teacher
    log_pk = torch.log_softmax(vals.float() / temperature, dim=1)  # [C, k]
    pk = log_pk.exp()
    zk = z.gather(1, idx) / temperature
    kl_part = (pk * (log_pk - zk)).sum(1)
    e1 = torch.empty_like(z)
    valid, safe_y, ce, lse_t = _student(z, e1, labels, temperature, ignore_index)
    zero = torch.zeros_like(ce)
    kl = torch.where(valid, kl_part + lse_t, zero)
    s = _finish_grad(z, e1, valid, safe_y, scale, temperature, alpha)
    del e1
    # scatter-add: a repeated index receives the sum of its entries, as in the reference
    z.scatter_add_(1, idx, pk.mul_(s).mul_(-alpha * temperature))
    return kl, torch.where(valid, ce, zero)


# Rows per chunk: C·V ≤ 2^24 fp32 elements (a 64 MiB block; C = 512 rows at V = 32000), four
# times the fused CE's budget. Smaller chunks cost time, not memory: every chunk rewrites the
# whole [V, d] fp32 dW accumulator (dW += G_cᵀ·x_c). Measured at N = 4096, d = 512, V = 32000
# on a 2-core CPU, forward + backward against the naive path's 8.7-9.8 s: C = 131 (2^22)
# 12.0 s, C = 262 8.3 s, C = 512 7.0 s, C = 1024 6.1 s; at C = 512 the peak stays under 1/8 of
# the naive path's 3 GiB.
KD_CHUNK_ELEMENTS = 1 << 24


def _chunk(chunk_size, x, weight):
    return chunk_size or chunk_rows(x.shape[0], weight.shape[0], KD_CHUNK_ELEMENTS)


def fused_linear_kd(x, weight, teacher_logits, labels, temperature, alpha, ignore_index=-100,
                    chunk_size=None):
    """(L, KL, CE) = kd_loss(x·Wᵀ, teacher_logits, labels) without materialising the student
    logits; L differentiable for x and weight, KL and CE for logging only."""
    check_args("fused_linear_kd", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size)
    check_teacher("fused_linear_kd", x, weight, teacher_logits)
    return _FLKD.apply(x, weight, teacher_logits.detach(), labels, float(temperature),
                       float(alpha), ignore_index, _chunk(chunk_size, x, weight), _block_full,
                       _rows_full)


def fused_linear_kd_topk(x, weight, topk_values, topk_indices, labels, temperature, alpha,
                         ignore_index=-100, chunk_size=None):
    """(L, KL_k, CE) against a cached teacher top-k (values [N, k], int64 indices [N, k])."""
    check_args("fused_linear_kd_topk", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size)
    check_topk("fused_linear_kd_topk", x, weight, topk_values, topk_indices)
    return _FLKD.apply(x, weight, (topk_values.detach(), topk_indices), labels,
                       float(temperature), float(alpha), ignore_index,
                       _chunk(chunk_size, x, weight), _block_topk, _rows_topk)


def topk_stable(teacher_logits, k):
    """The k largest teacher logits per row, ties to the lower index (falsify/reference/kd_loss.py's
    topk_stable): every backend caches the same entries."""
    if isinstance(k, bool) or not (isinstance(k, int) and 1 <= k <= teacher_logits.shape[1]):
        raise ValueError(f"k={k!r}: must lie in [1, V={teacher_logits.shape[1]}]")
    vals, idx = torch.sort(teacher_logits.detach(), dim=1, descending=True, stable=True)
    return vals[:, :k], idx[:, :k]


def fused_linear_kd_from_topk(x, weight, teacher_logits, labels, temperature, alpha, k,
                              ignore_index=-100, chunk_size=None):
    """Offline distillation in one call: cache the teacher's stable top-k, then
    fused_linear_kd_topk (the contract's binding for the top-k equation)."""
    check_teacher("fused_linear_kd_topk", x, weight, teacher_logits)
    vals, idx = topk_stable(teacher_logits, k)
    return fused_linear_kd_topk(x, weight, vals, idx, labels, temperature, alpha, ignore_index,
                                chunk_size)
