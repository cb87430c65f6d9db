"""QLoRA mutants: base decoding, scaling and frozen-base bugs the qlora contract must catch.
Each keeps qlora_linear's signature."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (interpreter switch: must run before `import triton`)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch import lora as _tl
from falsify.kernels.torch import nf4 as _n
from falsify.kernels.torch import qlora as _t
from falsify.kernels.triton import lora as _xl
from falsify.kernels.triton import qlora as _x
from falsify.reference.lora import lora_scale


def scale_by_r(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
               absmax2=None, offset=None, out=None):
    """Adapter scaled by r instead of α/r."""
    shape, blocksize, _, _ = _t.check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                           absmax2, offset)
    w = _t.dequantized_base(packed, absmax, shape, blocksize, absmax2, offset, x.dtype)
    return _tl._LoraLinear.apply(x, w, a, b, float(r))


def offset_ignored(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                   absmax2=None, offset=None, out=None):
    """Double-quantized base decoded without the absmax offset."""
    if offset is not None:
        offset = torch.zeros_like(offset)
    shape, blocksize, _, _ = _t.check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                           absmax2, offset)
    w = _t.dequantized_base(packed, absmax, shape, blocksize, absmax2, offset, x.dtype)
    return _tl._LoraLinear.apply(x, w, a, b, lora_scale(alpha, r, rslora))


def base_gradient_leaks(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                        absmax2=None, offset=None, out=None):
    """Plain autograd through the dequantization: absmax (and absmax2 / offset) receive a
    gradient whenever they require one, and an optimizer then moves the 'frozen' base."""
    shape, blocksize, _, _ = _t.check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                           absmax2, offset)
    w = _n.nf4_dequantize(packed, absmax, shape, blocksize, absmax2=absmax2, offset=offset)
    s = lora_scale(alpha, r, rslora)
    xf = x.float()
    return (xf @ w.T + s * ((xf @ a.float().T) @ b.float().T)).to(x.dtype)


@triton.jit
def _nf4_tile_lo_hi(packed_ptr, absmax_ptr, code_ptr, f, mask, stride_p, stride_a,
                    LOG2_BS: tl.constexpr):
    byte = tl.load(packed_ptr + (f >> 1) * stride_p, mask=mask, other=0).to(tl.int32)
    nib = (byte >> ((f & 1) << 2)) & 15  # BUG: even element read from the low nibble
    code = tl.load(code_ptr + nib)
    scale = tl.load(absmax_ptr + (f >> LOG2_BS) * stride_a, mask=mask, other=0.0)
    return code * scale


@triton.jit
def _qlora_mm_lo_hi_kernel(a1_ptr, packed_ptr, absmax_ptr, code_ptr, a2_ptr, b2_ptr, c_ptr,
                           M, N, K1, K2, s_a1m, s_a1k, sbk, sbn, stride_p, stride_a,
                           s_a2m, s_a2k, s_b2k, s_b2n, s_cm, s_cn, alpha1, alpha2,
                           LOG2_BS: tl.constexpr, HAS_SECOND: tl.constexpr,
                           DOT1_F32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                           BK: tl.constexpr, BK2: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K1, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a1_ptr + rm[:, None] * s_a1m + rk[None, :] * s_a1k,
                    mask=m_ok & (rk[None, :] < K1), other=0.0)
        w = _nf4_tile_lo_hi(packed_ptr, absmax_ptr, code_ptr,
                            rk[:, None] * sbk + rn[None, :] * sbn, (rk[:, None] < K1) & n_ok,
                            stride_p, stride_a, LOG2_BS)
        if DOT1_F32:
            acc = tl.dot(a.to(tl.float32), w, acc)
        else:
            acc = tl.dot(a, w.to(a1_ptr.dtype.element_ty), acc)
    acc = acc * alpha1
    if HAS_SECOND:
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K2, BK2):
            rk = k0 + tl.arange(0, BK2)
            a = tl.load(a2_ptr + rm[:, None] * s_a2m + rk[None, :] * s_a2k,
                        mask=m_ok & (rk[None, :] < K2), other=0.0)
            b = tl.load(b2_ptr + rk[:, None] * s_b2k + rn[None, :] * s_b2n,
                        mask=(rk[:, None] < K2) & n_ok, other=0.0)
            acc2 = tl.dot(a.to(tl.float32), b.to(tl.float32), acc2)
        acc = acc + alpha2 * acc2
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty),
             mask=m_ok & n_ok)


def triton_nibble_order_swapped(x, packed, absmax, shape, blocksize, a, b, alpha, r,
                                rslora=False, absmax2=None, offset=None, out=None):
    """Triton QLoRA whose on-the-fly dequantization reads element 2i from the low nibble."""
    original = _x._qlora_mm_kernel
    _x._qlora_mm_kernel = _qlora_mm_lo_hi_kernel
    try:
        with torch.no_grad():
            return _x.qlora_linear(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora,
                                   absmax2, offset, out)
    finally:
        _x._qlora_mm_kernel = original


class _TritonMissingBase(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, s, wq):
        return _x._QLoraLinear.forward(ctx, x, a, b, s, wq)

    @staticmethod
    def backward(ctx, gy):
        x2, a, b, t = ctx.saved_tensors
        g = _xl._as_rows(gy, ctx.wq.out_f).to(x2.dtype)
        dx, da, db = _x.qlora_backward(g, x2, ctx.wq, a, b, t, ctx.s, base=False)
        return dx.reshape(ctx.x_shape), da, db, None, None


def triton_dx_missing_base(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                           absmax2=None, offset=None, out=None):
    """Triton backward whose dx skips the dequantized base product g·W̃."""
    shape, blocksize, _, _ = _t.check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                           absmax2, offset)
    wq = _x.NF4Weight(packed, absmax.detach(), shape, blocksize,
                      None if absmax2 is None else absmax2.detach(),
                      None if offset is None else offset.detach())
    return _TritonMissingBase.apply(x, a, b, lora_scale(alpha, r, rslora), wq)
