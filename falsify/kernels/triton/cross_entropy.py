"""Cross-entropy in Triton: forward and backward kernels, one program per token row, each
looping over the vocabulary in BLOCK_V chunks (so any V fits, and [T, V] probabilities are
never stored).

Forward (`_ce_fwd_kernel`), per row, in fp32: the online logsumexp
    m' = max(m, max_chunk z),   d' = d·exp(m − m') + Σ_chunk exp(z − m')
(exact: falsify/proofs/cross_entropy.py), Σ z for label smoothing, z_y by one gather; then
    loss = (1 − ε)(lse − z_y) + ε(lse − Σz/V) + ζ·lse²    (0 for ignored rows), lse saved.
Backward (`_ce_bwd_kernel`), per row and chunk:
    dz = scale_t · (exp(z − lse)·(1 + 2ζ·lse) − ε/V − (1 − ε)·[j = y])
with scale_t read as dy_ptr[t·dy_stride]: stride 1 for reduction "none" (a per-row upstream
gradient), stride 0 for "sum"/"mean" (one device scalar dy or dy/n — no host sync), and 0 for
ignored rows. Derivation: falsify/reference/cross_entropy.py.

The wrapper is a torch.autograd.Function; strided 2-D logits (and a strided `out` for the
"none" loss) are addressed through explicit strides.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import next_power_of_2_capped
from falsify.kernels.torch.cross_entropy import check_ce_args, reduce_rows
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["cross_entropy", "cross_entropy_grad"]

MAX_BLOCK_V = 1024  # vocabulary chunk per loop iteration: a power of two


def launch_config(T, V):
    """(grid, BLOCK_V): one program per row; the vocabulary loop `range(0, V, BLOCK_V)` with
    the mask `offs < V` covers [0, V) once (z3: falsify/proofs/cross_entropy.py)."""
    return T, next_power_of_2_capped(V, MAX_BLOCK_V)


@triton.jit
def _ce_fwd_kernel(z_ptr, y_ptr, loss_ptr, lse_ptr, V, s_zr, s_zc, s_y, ignore_index,
                   z_loss, smoothing, BLOCK_V: tl.constexpr):
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
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
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


@triton.jit
def _ce_bwd_kernel(z_ptr, y_ptr, lse_ptr, dy_ptr, dz_ptr, V, s_zr, s_zc, s_y, s_dy,
                   s_dzr, s_dzc, ignore_index, z_loss, smoothing, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(y_ptr + row * s_y)
    valid = y != ignore_index
    scale = tl.where(valid, tl.load(dy_ptr + row * s_dy), 0.0)
    lse = tl.load(lse_ptr + row)
    factor = 1.0 + 2.0 * z_loss * lse
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_ptr + row * s_zr + offs * s_zc, mask=mask, other=0.0).to(tl.float32)
        g = tl.exp(z - lse) * factor - smoothing / V
        g = tl.where(offs == y, g - (1.0 - smoothing), g)
        tl.store(dz_ptr + row * s_dzr + offs * s_dzc, (g * scale).to(dz_ptr.dtype.element_ty),
                 mask=mask)


def _check_offsets(t: torch.Tensor, name: str) -> None:
    # column offsets `offs * stride` are int32 in the kernels (rows are int64)
    V = t.shape[1]
    if V > 2 ** 31 - 2 * MAX_BLOCK_V or (V + MAX_BLOCK_V) * abs(t.stride(1)) >= 2 ** 31:
        raise ValueError(f"{name}: vocabulary {V} × column stride {t.stride(1)} exceeds the "
                         "kernel's int32 column offsets")


def forward_rows(logits, labels, ignore_index, z_loss, label_smoothing, kernel=None):
    """(loss [T] fp32, lse [T] fp32)."""
    T, V = logits.shape
    _check_offsets(logits, "logits")
    loss = torch.empty(T, dtype=torch.float32, device=logits.device)
    lse = torch.empty(T, dtype=torch.float32, device=logits.device)
    if T:
        grid, block = launch_config(T, V)
        (kernel or _ce_fwd_kernel)[(grid,)](
            logits, labels, loss, lse, V, logits.stride(0), logits.stride(1), labels.stride(0),
            ignore_index, float(z_loss), float(label_smoothing), BLOCK_V=block)
    return loss, lse


def backward_rows(logits, labels, lse, dy_vec, dy_stride, ignore_index, z_loss,
                  label_smoothing, dz=None, kernel=None):
    T, V = logits.shape
    dz = torch.empty_like(logits) if dz is None else dz
    _check_offsets(logits, "logits")
    _check_offsets(dz, "dlogits")
    if T:
        grid, block = launch_config(T, V)
        (kernel or _ce_bwd_kernel)[(grid,)](
            logits, labels, lse, dy_vec, dz, V, logits.stride(0), logits.stride(1),
            labels.stride(0), dy_stride, dz.stride(0), dz.stride(1), ignore_index,
            float(z_loss), float(label_smoothing), BLOCK_V=block)
    return dz


def _device_upstream(dy, reduction, labels, ignore_index, T):
    """(dy vector or 1-element tensor, stride): per-row dy for "none", one scalar otherwise."""
    dy = dy.float()
    if reduction == "none":
        if dy.shape != (T,):
            raise ValueError(f"upstream gradient for reduction='none' must have shape ({T},)")
        return dy, dy.stride(0)
    if reduction == "sum":
        return dy.reshape(1).contiguous(), 0
    n = (labels != ignore_index).sum().float()
    return (dy.reshape(1) / n).contiguous(), 0


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, ignore_index, reduction, z_loss, label_smoothing):
        loss, lse = forward_rows(logits, labels, ignore_index, z_loss, label_smoothing)
        ctx.save_for_backward(logits, labels, lse)
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing)
        return reduce_rows(loss, labels, ignore_index, reduction).to(logits.dtype)

    @staticmethod
    @once_differentiable("cross_entropy (Triton)")
    def backward(ctx, dy):
        logits, labels, lse = ctx.saved_tensors
        ignore_index, reduction, z_loss, label_smoothing = ctx.cfg
        dy_vec, stride = _device_upstream(dy, reduction, labels, ignore_index, logits.shape[0])
        dz = backward_rows(logits, labels, lse, dy_vec, stride, ignore_index, z_loss,
                           label_smoothing)
        return dz, None, None, None, None, None


def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                  label_smoothing=0.0, out=None):
    """Loss in the logits dtype ([T] for "none", 0-d otherwise). `out` (inference only)
    receives the loss values; with autograd, leave it None."""
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing,
                  triton_dtypes())
    if out is not None and logits.requires_grad:
        raise ValueError("out= is for inference: autograd needs out=None")
    res = _CrossEntropy.apply(logits, labels, ignore_index, reduction, float(z_loss),
                              float(label_smoothing))
    if out is None:
        return res
    if out.shape != res.shape or out.dtype != res.dtype:
        raise ValueError(f"out: expected shape {tuple(res.shape)} and dtype {res.dtype}, got "
                         f"{tuple(out.shape)}, {out.dtype}")
    with torch.no_grad():
        out.copy_(res)
    return out


def cross_entropy_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0):
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing,
                  triton_dtypes())
    z = logits.detach().clone().requires_grad_(True)
    loss = cross_entropy(z, labels, ignore_index, reduction, z_loss, label_smoothing)
    (g,) = torch.autograd.grad(loss, [z], grad_outputs=torch.ones_like(loss))
    return g
