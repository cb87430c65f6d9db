"""Cross-entropy mutants: the CE bugs public kernel libraries shipped (Liger #968/#1298)
and the online-logsumexp rescale bug."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch import cross_entropy as tce
from falsify.kernels.triton import cross_entropy as xce


class _Mutant(torch.autograd.Function):
    """Our chunked torch CE with one of three backward/reduction bugs switched on."""

    @staticmethod
    def forward(ctx, logits, labels, ignore_index, reduction, z_loss, label_smoothing, bug):
        T = logits.shape[0]
        loss, lse = tce.rows_forward(logits, labels, ignore_index, z_loss, label_smoothing)
        ctx.save_for_backward(logits, labels, lse)
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing, bug)
        if reduction == "mean" and bug == "mean_all":
            return (loss.sum() / T).to(logits.dtype)
        return tce.reduce_rows(loss, labels, ignore_index, reduction).to(logits.dtype)

    @staticmethod
    def backward(ctx, dy):
        logits, labels, lse = ctx.saved_tensors
        ignore_index, reduction, z_loss, label_smoothing, bug = ctx.cfg
        T = logits.shape[0]
        if bug == "dy_scalar" and reduction == "none":
            scale = dy.reshape(-1)[0].float().expand(T)  # the bug: one upstream value for all
        elif bug == "mean_all" and reduction == "mean":
            scale = (dy.float() / T).expand(T)
        else:
            scale = tce.upstream_scale(dy, reduction, labels, ignore_index, T)
        if bug == "ignored_grad":
            # the bug: ignored rows treated as label 0 and never masked
            labels = torch.where(labels == ignore_index, torch.zeros_like(labels), labels)
            ignore_index = -(2 ** 62)
        dz = tce.rows_grad(logits, labels, lse, scale, ignore_index, z_loss, label_smoothing)
        return dz, None, None, None, None, None, None


def _run(bug, logits, labels, ignore_index, reduction, z_loss, label_smoothing):
    tce.check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    return _Mutant.apply(logits, labels, ignore_index, reduction, float(z_loss),
                         float(label_smoothing), bug)


def upstream_scalar_for_none(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                             label_smoothing=0.0):
    """reduction='none' backward scales every row by grad_output[0] (Liger #968, PR #1298:
    "the failure is silent")."""
    return _run("dy_scalar", logits, labels, ignore_index, reduction, z_loss, label_smoothing)


def ignored_rows_get_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                          label_smoothing=0.0):
    """Loss masks ignore_index rows but the backward does not: they get softmax − e_0."""
    return _run("ignored_grad", logits, labels, ignore_index, reduction, z_loss,
                label_smoothing)


def mean_over_all_tokens(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                         label_smoothing=0.0):
    """reduction='mean' divides by T (all rows) instead of the non-ignored count."""
    return _run("mean_all", logits, labels, ignore_index, reduction, z_loss, label_smoothing)


@triton.jit
def _ce_fwd_no_rescale(z_ptr, y_ptr, loss_ptr, lse_ptr, V, s_zr, s_zc, s_y, ignore_index,
                       z_loss, smoothing, BLOCK_V: tl.constexpr):
    # The bug: d accumulates chunk sums taken against different running maxima without the
    # exp(m − m') rescale, so any row whose maximum moves after the first chunk is wrong.
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * s_zr
    m = tl.full((), float("-inf"), tl.float32)
    d = tl.zeros((), tl.float32)
    zsum = tl.zeros((), tl.float32)
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_row + offs * s_zc, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        d = d + tl.sum(tl.exp(z - m_new), axis=0)
        zsum += tl.sum(tl.where(mask, z, 0.0), axis=0)
        m = m_new
    lse = m + tl.log(d)
    y = tl.load(y_ptr + row * s_y)
    valid = y != ignore_index
    safe_y = tl.where(valid, y, 0)
    zy = tl.load(z_row + safe_y * s_zc).to(tl.float32)
    loss = (1.0 - smoothing) * (lse - zy) + smoothing * (lse - zsum / V) + z_loss * lse * lse
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(lse_ptr + row, lse)


def triton_online_lse_without_rescale(logits, labels, ignore_index=-100, reduction="mean",
                                      z_loss=0.0, label_smoothing=0.0, out=None):
    """The Triton forward with the online-logsumexp rescale dropped (visible when V spans
    more than one BLOCK_V chunk)."""
    tce.check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    with torch.no_grad():
        loss, _ = xce.forward_rows(logits, labels, ignore_index, z_loss, label_smoothing,
                                   kernel=_ce_fwd_no_rescale)
        res = tce.reduce_rows(loss, labels, ignore_index, reduction).to(logits.dtype)
    if out is not None:
        out.copy_(res)
        return out
    return res


# ---------------------------------------------------------------- second order
class _SecondOrderOnSavedLse(tce._CrossEntropy):
    """The real forward and first-order backward, with softmax always rebuilt from the saved
    lse: an intermediate of the forward, so a constant to autograd under create_graph."""

    @staticmethod
    def backward(ctx, dy):
        logits, labels, lse = ctx.saved_tensors
        ignore_index, reduction, z_loss, label_smoothing = ctx.cfg
        T = logits.shape[0]
        scale = tce.upstream_scale(dy, reduction, labels, ignore_index, T)
        dz = torch.empty_like(logits)
        for r0 in range(0, T, tce.TOKEN_CHUNK):
            sl = slice(r0, r0 + tce.TOKEN_CHUNK)
            tce.rows_grad(logits[sl], labels[sl], lse[sl], scale[sl], ignore_index, z_loss,
                          label_smoothing, out=dz[sl])
        return dz, None, None, None, None, None


def second_order_through_saved_lse(logits, labels, ignore_index=-100, reduction="mean",
                                   z_loss=0.0, label_smoothing=0.0):
    tce.check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    return _SecondOrderOnSavedLse.apply(logits, labels, ignore_index, reduction, float(z_loss),
                                        float(label_smoothing))


# ---------------------------------------------------------------- compiled shapes
class _ChunkLoopOverT(tce._CrossEntropy):
    """The real kernel, with its token-chunk loop a plain range(0, T, TOKEN_CHUNK) in every
    mode (the torch backend before `spans`): bit-identical eagerly, but Dynamo reads T as a
    number, so a compiled model recompiles for every new sequence length."""

    @staticmethod
    def forward(ctx, logits, labels, ignore_index, reduction, z_loss, label_smoothing):
        T = logits.shape[0]
        loss = torch.empty(T, dtype=torch.float32, device=logits.device)
        lse = torch.empty(T, dtype=torch.float32, device=logits.device)
        for r0 in range(0, T, tce.TOKEN_CHUNK):
            sl = slice(r0, r0 + tce.TOKEN_CHUNK)
            loss[sl], lse[sl] = tce.rows_forward(logits[sl], labels[sl], ignore_index, z_loss,
                                                 label_smoothing)
        ctx.save_for_backward(logits, labels, lse)
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing)
        return tce.reduce_rows(loss, labels, ignore_index, reduction).to(logits.dtype)


def chunk_loop_over_t(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                      label_smoothing=0.0):
    tce.check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    labels = tce._bounded(labels, ignore_index, logits.shape[1])
    return _ChunkLoopOverT.apply(logits, labels, ignore_index, reduction, float(z_loss),
                                 float(label_smoothing))
