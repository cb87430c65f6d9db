"""Fused linear cross-entropy mutants: chunking, accumulation and upstream-gradient bugs, and
one that is numerically right but materialises the logits (only the memory check sees it)."""

from __future__ import annotations

import torch

from falsify.kernels.torch import cross_entropy as ce
from falsify.kernels.torch.fused_linear_cross_entropy import (
    _FLCE,
    _block,
    _check_labels,
    check_flce_args,
    chunk_rows,
)


def materialized_logits(x, weight, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                        label_smoothing=0.0, chunk_size=None):
    """CE(x @ W.T) with the full [T, V] logits: right values, the memory the kernel exists to
    avoid."""
    check_flce_args(x, weight, labels, chunk_size)
    return ce.cross_entropy(x @ weight.t(), labels, ignore_index, reduction, z_loss,
                            label_smoothing)


def _apply(x, weight, labels, ignore_index, reduction, z_loss, label_smoothing, chunk_size,
           block):
    check_flce_args(x, weight, labels, chunk_size)
    _check_labels(labels, weight.shape[0], x.shape[0], ignore_index, reduction, z_loss,
                  label_smoothing)
    chunk = chunk_size or chunk_rows(x.shape[0], weight.shape[0])
    return _FLCE.apply(x, weight, labels, ignore_index, reduction, float(z_loss),
                       float(label_smoothing), chunk, block)


def last_chunk_dropped(x, weight, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0, chunk_size=None):
    """The chunk loop stops at the last *full* chunk: the T mod C tail rows get loss 0 and no
    gradient."""
    chunk = chunk_size or chunk_rows(x.shape[0], weight.shape[0])
    T = x.shape[0]
    cut = T - T % chunk if T >= chunk else T

    keep = labels.clone()
    keep[cut:] = ignore_index  # rows past the last full chunk are silently skipped
    return _apply(x, weight, keep, ignore_index, reduction, z_loss, label_smoothing, chunk,
                  _block)


def dw_overwritten_per_chunk(x, weight, labels, ignore_index=-100, reduction="mean",
                             z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    """dW = G_cᵀx_c assigned per chunk instead of accumulated: only the last chunk's
    contribution survives."""
    return _DwOverwrite.apply(x, weight, labels, ignore_index, reduction, float(z_loss),
                              float(label_smoothing),
                              chunk_size or chunk_rows(x.shape[0], weight.shape[0]))


class _DwOverwrite(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, labels, ignore_index, reduction, z_loss, label_smoothing, chunk):
        T = x.shape[0]
        loss = torch.empty(T, dtype=torch.float32)
        lse = torch.empty(T, dtype=torch.float32)
        for r0 in range(0, T, chunk):
            sl = slice(r0, min(T, r0 + chunk))
            loss[sl], lse[sl] = ce.rows_forward(x[sl] @ weight.t(), labels[sl], ignore_index,
                                                z_loss, label_smoothing)
        ctx.save_for_backward(x, weight, labels, lse)
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing, chunk)
        return ce.reduce_rows(loss, labels, ignore_index, reduction).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, labels, lse = ctx.saved_tensors
        ignore_index, reduction, z_loss, label_smoothing, chunk = ctx.cfg
        T = x.shape[0]
        scale = ce.upstream_scale(dy, reduction, labels, ignore_index, T)
        dx = torch.empty_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32)
        for r0 in range(0, T, chunk):
            sl = slice(r0, min(T, r0 + chunk))
            g = ce.rows_grad(x[sl] @ weight.t(), labels[sl], lse[sl], scale[sl], ignore_index,
                             z_loss, label_smoothing)
            dx[sl] = g @ weight
            dw = g.t().float() @ x[sl].float()  # the bug: = instead of +=
        return dx, dw.to(weight.dtype), None, None, None, None, None, None


def none_dw_scaled_by_mean_dy(x, weight, labels, ignore_index=-100, reduction="mean",
                              z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    """Liger-style precompute used for reduction 'none' too: gradients computed in the forward
    with dy = 1, then dx rows scaled by dy[t] (right) but dW by mean(dy) (it cannot be
    rescaled per row after the sum over t)."""
    return _NonePrecompute.apply(x, weight, labels, ignore_index, reduction, float(z_loss),
                                 float(label_smoothing),
                                 chunk_size or chunk_rows(x.shape[0], weight.shape[0]))


class _NonePrecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, labels, ignore_index, reduction, z_loss, label_smoothing, chunk):
        T = x.shape[0]
        loss = torch.empty(T, dtype=torch.float32)
        n = (labels != ignore_index).sum().float()
        unit = torch.ones(()) if reduction in ("sum", "none") else 1.0 / n
        dx = torch.empty_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32)
        for r0 in range(0, T, chunk):
            sl = slice(r0, min(T, r0 + chunk))
            z = x[sl] @ weight.t()
            loss[sl], lse = ce.rows_forward(z, labels[sl], ignore_index, z_loss, label_smoothing)
            g = ce.rows_grad(z, labels[sl], lse, unit.expand(z.shape[0]), ignore_index, z_loss,
                             label_smoothing)
            dx[sl] = g @ weight
            dw += g.t().float() @ x[sl].float()
        ctx.save_for_backward(dx, dw)
        ctx.reduction = reduction
        return ce.reduce_rows(loss, labels, ignore_index, reduction).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        dx, dw = ctx.saved_tensors
        dy = dy.float()
        if ctx.reduction == "none":
            return (dx * dy[:, None]).to(dx.dtype), (dw * dy.mean()).to(dx.dtype), *(None,) * 6
        return (dx * dy).to(dx.dtype), (dw * dy).to(dx.dtype), *(None,) * 6
