"""QLoRA linear layer as Triton kernels: the NF4 base is dequantized on the fly inside the GEMM.

`_qlora_mm_kernel` computes C = α₁·(A₁ @ op(W̃)) [+ α₂·(A₂ @ B₂)] where W̃ [out, in] is never
materialised: the B₁ tile element (k, n) is the flat weight index f = k·sbk + n·sbn (sbk = 1,
sbn = in reads W̃ᵀ for the forward; sbk = in, sbn = 1 reads W̃ for dx), decoded as

    byte = f >> 1,  nibble = (packed[byte] >> 4·(1 − f mod 2)) & 15,
    W̃_f  = fl32(code[nibble] · absmax[f >> log2(blocksize)])  → x's dtype

— the same value, bit for bit, that falsify/kernels/triton/nf4.py's dequantize kernel writes, so
qlora_linear equals lora_linear on the dequantized weight. Double-quantized absmax is decoded
first (one small kernel from falsify/kernels/triton/nf4.py), not per tile.

Forward:   t = x @ Aᵀ (fp32),          y  = x @ W̃ᵀ + s·(t @ Bᵀ)
Backward:  u = g @ B (fp32),           dx = g @ W̃  + s·(u @ A)      (base path through W̃)
           dA = s·(uᵀ @ x),  dB = s·(gᵀ @ t),  no gradient for packed / absmax (frozen).
Derivation: the LoRA layer's (falsify/kernels/triton/lora.py, falsify/reference/lora.py) with W = W̃.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import log2_exact
from falsify.kernels.torch import qlora as _t
from falsify.kernels.torch.lora import lora_scale
from falsify.kernels.triton import lora as _lora
from falsify.kernels.triton import nf4 as _nf4
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["qlora_linear"]

launch_config = _lora.launch_config  # same tiles and grid as the dense LoRA GEMM


@triton.jit
def _nf4_tile(packed_ptr, absmax_ptr, code_ptr, f, mask, stride_p, stride_a,
              LOG2_BS: tl.constexpr):
    """Decode the NF4 weights at flat indices f (masked lanes read nothing, give 0)."""
    byte = tl.load(packed_ptr + (f >> 1) * stride_p, mask=mask, other=0).to(tl.int32)
    nib = (byte >> ((1 - (f & 1)) << 2)) & 15  # even element: high nibble
    code = tl.load(code_ptr + nib)  # nib ∈ [0, 15]: inside the table even for masked lanes
    scale = tl.load(absmax_ptr + (f >> LOG2_BS) * stride_a, mask=mask, other=0.0)
    return code * scale


@triton.jit
def _qlora_mm_kernel(a1_ptr, packed_ptr, absmax_ptr, code_ptr, a2_ptr, b2_ptr, c_ptr,
                     M, N, K1, K2, s_a1m, s_a1k, sbk, sbn, stride_p, stride_a,
                     s_a2m, s_a2k, s_b2k, s_b2n, s_cm, s_cn, alpha1, alpha2,
                     LOG2_BS: tl.constexpr, HAS_SECOND: tl.constexpr, DOT1_F32: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     BK2: tl.constexpr):
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K1, BK):
        rk = k0 + tl.arange(0, BK).to(tl.int64)
        a = tl.load(a1_ptr + rm[:, None] * s_a1m + rk[None, :] * s_a1k,
                    mask=m_ok & (rk[None, :] < K1), other=0.0)
        b_ok = (rk[:, None] < K1) & n_ok
        w = _nf4_tile(packed_ptr, absmax_ptr, code_ptr, rk[:, None] * sbk + rn[None, :] * sbn,
                      b_ok, stride_p, stride_a, LOG2_BS)
        if DOT1_F32:
            acc = tl.dot(a.to(tl.float32), w, acc, input_precision="ieee")
        else:
            # W̃ rounded to the activation dtype, as bitsandbytes dequantizes to it: fp16 mma
            acc = tl.dot(a, w.to(a1_ptr.dtype.element_ty), acc)
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


class NF4Weight:
    """The frozen base as the kernels see it: packed bytes, float32 absmax (double-quantized
    absmax decoded once), blocksize, [out, in]."""

    def __init__(self, packed, absmax, shape, blocksize, absmax2=None, offset=None):
        self.packed = packed if packed.dim() == 1 else packed.reshape(-1)
        nested = absmax2 is not None
        scale = _nf4.decode_absmax(absmax, absmax2, offset) if nested else absmax
        self.absmax = scale if scale.dim() == 1 else scale.reshape(-1)
        if self.absmax.dtype != torch.float32:
            raise TypeError(f"absmax must be float32, got {self.absmax.dtype}")
        self.out_f, self.in_f = shape
        self.log2_bs = log2_exact(blocksize)


def _nf4_matmul2(a1, wq: NF4Weight, transpose_w, c, alpha1=1.0, a2=None, b2=None, alpha2=0.0):
    """c ← α₁·a1 @ op(W̃) (+ α₂·a2 @ b2); op(W̃) = W̃ᵀ [in, out] or W̃ [out, in]."""
    m, k1 = a1.shape
    sbk, sbn = (1, wq.in_f) if transpose_w else (wq.in_f, 1)
    n = wq.out_f if transpose_w else wq.in_f
    if (wq.in_f if transpose_w else wq.out_f) != k1 or tuple(c.shape) != (m, n):
        raise ValueError(f"nf4_matmul2 shapes: {tuple(a1.shape)} @ W̃{'ᵀ' if transpose_w else ''}"
                         f" [{wq.out_f}, {wq.in_f}] -> {tuple(c.shape)}")
    has2 = a2 is not None
    k2 = a2.shape[1] if has2 else 0
    cfg = launch_config(m, n, k1, k2)
    code, _, _, _ = _nf4._tables(a1.device)
    a2_, b2_ = (a2, b2) if has2 else (a1, a1)  # placeholders, never read when HAS_SECOND=0
    _qlora_mm_kernel[cfg["grid"]](
        a1, wq.packed, wq.absmax, code, a2_, b2_, c, m, n, k1, k2, *a1.stride(), sbk, sbn,
        wq.packed.stride(0), wq.absmax.stride(0), *a2_.stride(), *b2_.stride(), *c.stride(),
        float(alpha1), float(alpha2), LOG2_BS=wq.log2_bs, HAS_SECOND=has2,
        DOT1_F32=a1.dtype != torch.float16, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
        BK2=cfg["BK2"])
    return c


def _qlora_forward(x2, wq, a, b, s, out2=None):
    t = torch.empty(x2.shape[0], a.shape[0], dtype=torch.float32, device=x2.device)
    _lora.matmul2(x2, a.T, t)
    y = out2 if out2 is not None else torch.empty(x2.shape[0], wq.out_f, dtype=x2.dtype,
                                                  device=x2.device)
    return _nf4_matmul2(x2, wq, True, y, 1.0, t, b.T, s), t


def qlora_backward(g, x2, wq, a, b, t, s, need_x=True, need_a=True, need_b=True, base=True):
    u = torch.empty(g.shape[0], a.shape[0], dtype=torch.float32, device=g.device)
    _lora.matmul2(g, b, u)
    dx = da = db = None
    if need_x:
        dx = torch.empty_like(x2)
        if base:
            _nf4_matmul2(g, wq, False, dx, 1.0, u, a, s)
        else:  # only for the mutant suite
            _lora.matmul2(u, a, dx, s)
    if need_a:
        da = _lora.matmul2(u.T, x2, torch.empty_like(a), s)
    if need_b:
        db = _lora.matmul2(g.T, t, torch.empty_like(b), s)
    return dx, da, db


class _QLoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, s, wq):
        x2 = _lora._as_rows(x, wq.in_f)
        y, t = _qlora_forward(x2, wq, a, b, s)
        ctx.save_for_backward(x2, a, b, t)
        ctx.s, ctx.wq, ctx.x_shape = s, wq, x.shape
        return y.reshape(*x.shape[:-1], wq.out_f)

    @staticmethod
    @once_differentiable("qlora_linear (Triton)")
    def backward(ctx, gy):
        x2, a, b, t = ctx.saved_tensors
        g = _lora._as_rows(gy, ctx.wq.out_f).to(x2.dtype)
        dx, da, db = qlora_backward(g, x2, ctx.wq, a, b, t, ctx.s,
                                    *(ctx.needs_input_grad[i] for i in (0, 1, 2)))
        if dx is not None:
            dx = dx.reshape(ctx.x_shape)
        return dx, da, db, None, None  # the NF4 state is not an input: it cannot get one


def qlora_linear(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                 absmax2=None, offset=None, out=None):
    shape, blocksize, out_f, in_f = _t.check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                                  absmax2, offset, triton_dtypes())
    _lora._check_backend(x, a, b)
    s = lora_scale(alpha, r, rslora)
    needs_grad = torch.is_grad_enabled() and any(v.requires_grad for v in (x, a, b))
    _lora._t.check_out(out, (*x.shape[:-1], out_f), x.dtype, needs_grad)
    with torch.no_grad():
        wq = NF4Weight(packed, absmax.detach(), shape, blocksize,
                       None if absmax2 is None else absmax2.detach(),
                       None if offset is None else offset.detach())
    if out is None:
        return _QLoraLinear.apply(x, a, b, s, wq)
    _qlora_forward(_lora._as_rows(x, in_f), wq, a, b, s,
                  out if out.dim() == 2 else out.view(-1, out_f))
    return out
