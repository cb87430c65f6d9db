"""LoRA linear layer as Triton kernels, forward and backward.

One tl.dot-based kernel does every product of the layer:

    C = α₁·(A₁ @ B₁) [+ α₂·(A₂ @ B₂)]

with each operand addressed through explicit (row, column) strides, so transposes are free and
inputs may be strided views. The first product carries the big dimension (in or out features)
and runs on tensor cores for fp16 inputs (fp32 accumulation); the second, over the rank r, runs
in fp32 with IEEE precision (r ≤ 64: cheap, and it keeps t = x·Aᵀ unrounded).

Forward:   t  = x @ Aᵀ                     (fp32 [M, r])
           y  = x @ Wᵀ + s·(t @ Bᵀ)
Backward:  u  = g @ B                      (fp32 [M, r])
           dx = g @ W  + s·(u @ A)          base path + adapter path
           dB = s·(gᵀ @ t),  dA = s·(uᵀ @ x),  dW = none (frozen)
Derivation (falsify.reference.lora): with dy = dx·(Wᵀ + s·AᵀBᵀ) + s·x·dAᵀ·Bᵀ + s·t·dBᵀ,
⟨g, dy⟩ = ⟨g·W + s·g·B·A, dx⟩ + ⟨s·(g·B)ᵀ·x, dA⟩ + ⟨s·gᵀ·t, dB⟩.

fp32 inputs use IEEE fp32 dots (input_precision="ieee"): the GPU default would be TF32, whose
10-bit mantissa the contract's fp32 tolerances do not allow.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import falsify.kernels.triton
from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_clamped
from falsify.kernels.torch import lora as _t
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["lora_linear", "lora_merge"]

MIN_TILE = 16  # tl.dot needs every block dimension ≥ 16
MAX_TILE = 64
BLOCK_K = 32


def _tile(n):
    """next_power_of_2(n) clamped to [16, 64], branch-free (z3 runs it on bit-vectors)."""
    return next_power_of_2_clamped(n, MIN_TILE, MAX_TILE)


def launch_config(m, n, k1, k2=0):
    """Tiles and grid for C[m, n] = A₁[m, k1] @ B₁[k1, n] (+ A₂[m, k2] @ B₂[k2, n]): a pure
    function of the shapes."""
    bm, bn = _tile(m), _tile(n)
    return {"BM": bm, "BN": bn, "BK": BLOCK_K, "BK2": _tile(k2) if k2 else MIN_TILE,
            "grid": (cdiv(m, bm), cdiv(n, bn))}  # k2 = 0: no second product, BK2 unused


@triton.jit
def _lora_mm_kernel(a1_ptr, b1_ptr, a2_ptr, b2_ptr, c_ptr, M, N, K1, K2,
                    s_a1m, s_a1k, s_b1k, s_b1n, s_a2m, s_a2k, s_b2k, s_b2n, s_cm, s_cn,
                    alpha1, alpha2, HAS_SECOND: tl.constexpr, DOT1_F32: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BK2: tl.constexpr):
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K1, BK):
        rk = k0 + tl.arange(0, BK).to(tl.int64)
        a = tl.load(a1_ptr + rm[:, None] * s_a1m + rk[None, :] * s_a1k,
                    mask=m_ok & (rk[None, :] < K1), other=0.0)
        b = tl.load(b1_ptr + rk[:, None] * s_b1k + rn[None, :] * s_b1n,
                    mask=(rk[:, None] < K1) & n_ok, other=0.0)
        if DOT1_F32:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)  # fp16 × fp16 → fp32 accumulate: mma on sm_80 / sm_90
    acc = acc * alpha1
    if HAS_SECOND:
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K2, BK2):
            rk = k0 + tl.arange(0, BK2).to(tl.int64)
            a = tl.load(a2_ptr + rm[:, None] * s_a2m + rk[None, :] * s_a2k,
                        mask=m_ok & (rk[None, :] < K2), other=0.0)
            b = tl.load(b2_ptr + rk[:, None] * s_b2k + rn[None, :] * s_b2n,
                        mask=(rk[:, None] < K2) & n_ok, other=0.0)
            acc2 = tl.dot(a.to(tl.float32), b.to(tl.float32), acc2, input_precision="ieee")
        acc = acc + alpha2 * acc2
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn,
             acc.to(c_ptr.dtype.element_ty), mask=m_ok & n_ok)


def matmul2(a1, b1, c, alpha1=1.0, a2=None, b2=None, alpha2=0.0):
    """c ← α₁·a1 @ b1 (+ α₂·a2 @ b2). Operands are 2-D tensors or transposed views (.T); c is
    written in place (its dtype is the output dtype)."""
    m, k1 = a1.shape
    n = b1.shape[1]
    if b1.shape[0] != k1 or tuple(c.shape) != (m, n):
        raise ValueError(f"matmul2 shapes: {tuple(a1.shape)} @ {tuple(b1.shape)} -> "
                         f"{tuple(c.shape)}")
    has2 = a2 is not None
    k2 = a2.shape[1] if has2 else 0
    if has2 and (a2.shape[0] != m or tuple(b2.shape) != (k2, n)):
        raise ValueError(f"matmul2 second product: {tuple(a2.shape)} @ {tuple(b2.shape)}")
    cfg = launch_config(m, n, k1, k2)
    fp16_dot = a1.dtype == b1.dtype == torch.float16
    a2_, b2_ = (a2, b2) if has2 else (a1, b1)  # placeholders, never read when HAS_SECOND=0
    _lora_mm_kernel[cfg["grid"]](
        a1, b1, a2_, b2_, c, m, n, k1, k2, *a1.stride(), *b1.stride(), *a2_.stride(),
        *b2_.stride(), *c.stride(), float(alpha1), float(alpha2), HAS_SECOND=has2,
        DOT1_F32=not fp16_dot, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], BK2=cfg["BK2"])
    return c


def _as_rows(x, in_f):
    """x [..., in] as a 2-D [M, in] tensor (a view when the strides allow it)."""
    # not reshape(-1, in_f): -1 is ambiguous when in_f = 0
    return x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), in_f)


def _check_backend(*ts):
    if falsify.kernels.triton.INTERPRETED and any(t.dtype == torch.bfloat16 for t in ts):
        raise NotImplementedError("bf16 is broken in the Triton interpreter; run it on a GPU")


def _lora_forward(x2, w, a, b, s, out2=None):
    """(y [M, out], t [M, r] fp32) for 2-D x2."""
    m = x2.shape[0]
    t = torch.empty(m, a.shape[0], dtype=torch.float32, device=x2.device)
    matmul2(x2, a.T, t)
    y = out2 if out2 is not None else torch.empty(m, w.shape[0], dtype=x2.dtype,
                                                  device=x2.device)
    return matmul2(x2, w.T, y, 1.0, t, b.T, s), t


def lora_backward(g, x2, w, a, b, t, s, need_x=True, need_a=True, need_b=True, base=True):
    """(dx [M, in], dA, dB) for 2-D g, x2; `base=False` only exists for the mutant suite."""
    u = torch.empty(g.shape[0], a.shape[0], dtype=torch.float32, device=g.device)
    matmul2(g, b, u)
    dx = da = db = None
    if need_x:
        dx = torch.empty_like(x2)
        if base:
            matmul2(g, w, dx, 1.0, u, a, s)
        else:
            matmul2(u, a, dx, s)
    if need_a:
        da = matmul2(u.T, x2, torch.empty_like(a), s)
    if need_b:
        db = matmul2(g.T, t, torch.empty_like(b), s)
    return dx, da, db


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, a, b, s):
        out_f, in_f = w.shape
        x2 = _as_rows(x, in_f)
        y, t = _lora_forward(x2, w, a, b, s)
        ctx.save_for_backward(x2, w, a, b, t)
        ctx.s, ctx.x_shape = s, x.shape
        return y.reshape(*x.shape[:-1], out_f)

    @staticmethod
    @once_differentiable("lora_linear (Triton)")
    def backward(ctx, gy):
        x2, w, a, b, t = ctx.saved_tensors
        g = _as_rows(gy, w.shape[0]).to(x2.dtype)
        dx, da, db = lora_backward(g, x2, w, a, b, t, ctx.s, *(ctx.needs_input_grad[i]
                                                                for i in (0, 2, 3)))
        if dx is not None:
            dx = dx.reshape(ctx.x_shape)
        return dx, None, da, db, None  # W is frozen: never a gradient


def lora_linear(x, w, a, b, alpha, r, rslora=False, out=None):
    out_f, in_f = _t.check_args(x, w, a, b, r, triton_dtypes())
    _check_backend(x, w, a, b)
    s = _t.lora_scale(alpha, r, rslora)
    needs_grad = torch.is_grad_enabled() and any(v.requires_grad for v in (x, a, b))
    _t.check_out(out, (*x.shape[:-1], out_f), x.dtype, needs_grad)
    if out is None:
        return _LoraLinear.apply(x, w, a, b, s)
    x2 = _as_rows(x, in_f)
    out2 = out if out.dim() == 2 else out.view(-1, out_f)
    _lora_forward(x2, w, a, b, s, out2)
    return out


def lora_merge(w, a, b, alpha, r, rslora=False):
    """W + s·B·A with the same kernel (first product B @ A, W added as a second product
    W @ I would waste work, so W is added in fp32 here and rounded once)."""
    _t.check_args(torch.zeros(1, w.shape[1], dtype=w.dtype), w, a, b, r, triton_dtypes())
    delta = torch.empty(w.shape, dtype=torch.float32, device=w.device)
    matmul2(b, a, delta, _t.lora_scale(alpha, r, rslora))
    return (w.float() + delta).to(w.dtype)
