"""GGUF q8_0 / q4_k / q6_k dequantization and q8_0 quantization as Triton kernels, bit-identical
to ggml (the layouts and the arithmetic are documented in `falsify.reference.gguf_quants`).

One program handles G whole blocks as a [G, values-per-block] tile: every value gathers its
byte(s) through the layout's index formulas (the same formulas as the reference), and each fp16
field is assembled from its two little-endian bytes and bitcast. G is chosen so that a program
covers 2048 values: under the interpreter every program runs as Python, so the grid stays at
cdiv(blocks, G) programs. Products are formed in fp32 in ggml's order; the GPU compiler may
contract q4_k's d1·q − m1 into an FMA, which rounds the same exact product once (same bits).

Every tensor is addressed through explicit strides and every load/store is masked, so blocks and
`out` may be strided views into larger buffers (the contract's poisoned-margin checks).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import falsify.kernels.triton  # noqa: F401  (interpreter switch: must run before kernels launch)
from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_clamped
from falsify.kernels.torch import gguf_quants as _t
from falsify.kernels.triton.autograd import once_differentiable
from falsify.reference.gguf_quants import (
    FP16_OVERFLOW,
    Q4_K_BYTES,
    Q6_K_BYTES,
    Q8_0_BYTES,
    QK8_0,
    QK_K,
)

__all__ = ["q8_0_dequantize", "q4_k_dequantize", "q6_k_dequantize", "q8_0_quantize",
           "dequant_matmul"]

TILE_VALUES = 2048  # values per program, every format


def launch_config(nblocks: int, values_per_block: int) -> dict:
    """Pure function of the shapes: G blocks per program and the grid (0 programs: no launch)."""
    g = TILE_VALUES // values_per_block
    return {"G": g, "grid": cdiv(nblocks, g)}


@triton.jit
def _fp16_field(lo, hi):
    """Little-endian fp16 bytes (int32 0..255 each) → float32, exactly."""
    bits = (lo | (hi << 8)).to(tl.uint16)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _block_rows(nblocks, nb, stride0, stride1, BYTES: tl.constexpr, G: tl.constexpr):
    """This program's G block indices: (live mask, row, block-in-row, byte offset of the block)."""
    blk = tl.program_id(0) * G + tl.arange(0, G)
    live = blk < nblocks
    row = blk // nb
    k = blk % nb
    base = row.to(tl.int64) * stride0 + k.to(tl.int64) * BYTES * stride1
    return live, row, k, base


@triton.jit
def _value_offsets(row, k, lane, VALUES: tl.constexpr, stride0, stride1):
    """[G, VALUES] memory offsets of the values of blocks (row, k) in a [m, nb·VALUES] tensor,
    in int64 (k·VALUES + lane overflows int32 past 2^31 values in a row)."""
    col = k[:, None].to(tl.int64) * VALUES + lane[None, :]
    return row[:, None].to(tl.int64) * stride0 + col * stride1


@triton.jit
def _q8_0_dequantize_kernel(b_ptr, out_ptr, nblocks, nb, stride_b0, stride_b1, stride_o0,
                            stride_o1, G: tl.constexpr):
    live, row, k, base = _block_rows(nblocks, nb, stride_b0, stride_b1, 34, G)
    lo = tl.load(b_ptr + base, mask=live, other=0).to(tl.int32)
    hi = tl.load(b_ptr + base + stride_b1, mask=live, other=0).to(tl.int32)
    d = _fp16_field(lo, hi)
    i = tl.arange(0, 32)
    m2 = live[:, None]
    qb = tl.load(b_ptr + base[:, None] + (2 + i)[None, :].to(tl.int64) * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    q = tl.where(qb >= 128, qb - 256, qb).to(tl.float32)  # int8, two's complement
    o = _value_offsets(row, k, i, 32, stride_o0, stride_o1)
    tl.store(out_ptr + o, d[:, None] * q, mask=m2)


@triton.jit
def _q4_k_dequantize_kernel(b_ptr, out_ptr, nblocks, nb, stride_b0, stride_b1, stride_o0,
                            stride_o1, G: tl.constexpr):
    live, row, k, base = _block_rows(nblocks, nb, stride_b0, stride_b1, 144, G)
    d = _fp16_field(tl.load(b_ptr + base, mask=live, other=0).to(tl.int32),
                    tl.load(b_ptr + base + stride_b1, mask=live, other=0).to(tl.int32))
    dmin = _fp16_field(tl.load(b_ptr + base + 2 * stride_b1, mask=live, other=0).to(tl.int32),
                       tl.load(b_ptr + base + 3 * stride_b1, mask=live, other=0).to(tl.int32))
    e = tl.arange(0, 256)
    j = e // 32  # sub-block
    m2 = live[:, None]
    at = base[:, None]
    # the packed scale bytes sub-block j reads: s[j mod 4], s[4 + j mod 4], s[8 + j mod 4]
    sa = tl.load(b_ptr + at + (4 + j % 4)[None, :].to(tl.int64) * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    sb = tl.load(b_ptr + at + (8 + j % 4)[None, :].to(tl.int64) * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    sc_ = tl.load(b_ptr + at + (12 + j % 4)[None, :].to(tl.int64) * stride_b1, mask=m2,
                  other=0).to(tl.int32)
    first = (j < 4)[None, :]
    sc = tl.where(first, sa & 63, (sc_ & 15) | ((sa >> 6) << 4))
    mn = tl.where(first, sb & 63, (sc_ >> 4) | ((sb >> 6) << 4))
    byte = 16 + 32 * (e // 64) + e % 32
    qb = tl.load(b_ptr + at + byte[None, :].to(tl.int64) * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    q = (qb >> (4 * (j % 2))[None, :]) & 15  # even sub-blocks: low nibble
    d1 = d[:, None] * sc.to(tl.float32)  # exact
    m1 = dmin[:, None] * mn.to(tl.float32)  # exact
    y = d1 * q.to(tl.float32) - m1  # the one rounding
    o = _value_offsets(row, k, e, 256, stride_o0, stride_o1)
    tl.store(out_ptr + o, y, mask=m2)


@triton.jit
def _q6_k_dequantize_kernel(b_ptr, out_ptr, nblocks, nb, stride_b0, stride_b1, stride_o0,
                            stride_o1, G: tl.constexpr):
    live, row, k, base = _block_rows(nblocks, nb, stride_b0, stride_b1, 210, G)
    d = _fp16_field(tl.load(b_ptr + base + 208 * stride_b1, mask=live, other=0).to(tl.int32),
                    tl.load(b_ptr + base + 209 * stride_b1, mask=live, other=0).to(tl.int32))
    e = tl.arange(0, 256)
    n = e // 128
    g = (e % 128) // 32
    lane = e % 32
    m2 = live[:, None]
    at = base[:, None]
    lb = tl.load(b_ptr + at + (64 * n + 32 * (g % 2) + lane)[None, :].to(tl.int64) * stride_b1,
                 mask=m2, other=0).to(tl.int32)
    hb = tl.load(b_ptr + at + (128 + 32 * n + lane)[None, :].to(tl.int64) * stride_b1,
                 mask=m2, other=0).to(tl.int32)
    scb = tl.load(b_ptr + at + (192 + e // 16)[None, :].to(tl.int64) * stride_b1, mask=m2,
                  other=0).to(tl.int32)
    low = (lb >> (4 * (g // 2))[None, :]) & 15
    high = (hb >> (2 * g)[None, :]) & 3
    q = (low | (high << 4)) - 32
    sc = tl.where(scb >= 128, scb - 256, scb)  # int8
    y = (d[:, None] * sc.to(tl.float32)) * q.to(tl.float32)  # exact
    o = _value_offsets(row, k, e, 256, stride_o0, stride_o1)
    tl.store(out_ptr + o, y, mask=m2)


@triton.jit
def _q8_0_quantize_kernel(x_ptr, out_ptr, nblocks, nb, stride_x0, stride_x1, stride_o0,
                          stride_o1, G: tl.constexpr):
    live, row, k, base = _block_rows(nblocks, nb, stride_o0, stride_o1, 34, G)
    i = tl.arange(0, 32)
    m2 = live[:, None]
    xo = _value_offsets(row, k, i, 32, stride_x0, stride_x1)
    x = tl.load(x_ptr + xo, mask=m2, other=0.0)
    amax = tl.max(tl.abs(x), axis=1)
    # correctly rounded divisions (div_rn): Triton's default fp32 division is approximate on GPU
    d = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
    nz = d != 0
    inv = tl.where(nz, tl.math.div_rn(tl.full(d.shape, 1.0, tl.float32), tl.where(nz, d, 1.0)),
                   0.0)
    v = x * inv[:, None]
    a = tl.abs(v)
    f = tl.floor(a)
    r = f + tl.floor((a - f) * 2.0)  # roundf: half away from zero, every step exact
    # a block with max|x| below about 3.7e-37 has 1/d = inf: quants 0 there (see the reference)
    q = tl.where(a < float("inf"), tl.where(v < 0, -r, r), 0.0).to(tl.int32)
    bits = d.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    tl.store(out_ptr + base, (bits & 255).to(tl.uint8), mask=live)
    tl.store(out_ptr + base + stride_o1, (bits >> 8).to(tl.uint8), mask=live)
    tl.store(out_ptr + base[:, None] + (2 + i)[None, :].to(tl.int64) * stride_o1,
             (q & 255).to(tl.uint8), mask=m2)


def _dequantize(kernel, blocks, out, block_bytes: int, values: int, fn: str):
    b = _t.check_blocks(blocks, block_bytes, fn)
    m, nb = b.shape[0], b.shape[1] // block_bytes
    _t.check_out(out, (m, nb * values), fn)
    if out is None:
        out = torch.empty((m, nb * values), dtype=torch.float32, device=b.device)
    cfg = launch_config(m * nb, values)
    if cfg["grid"]:
        kernel[(cfg["grid"],)](b, out, m * nb, nb, b.stride(0), b.stride(1), out.stride(0),
                               out.stride(1), G=cfg["G"])
    return out


def q8_0_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q8_0_dequantize; `out`: optional float32 result."""
    return _dequantize(_q8_0_dequantize_kernel, blocks, out, Q8_0_BYTES, QK8_0,
                       "q8_0_dequantize")


def q4_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q4_k_dequantize; `out`: optional float32 result."""
    return _dequantize(_q4_k_dequantize_kernel, blocks, out, Q4_K_BYTES, QK_K,
                       "q4_k_dequantize")


def q6_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q6_k_dequantize; `out`: optional float32 result."""
    return _dequantize(_q6_k_dequantize_kernel, blocks, out, Q6_K_BYTES, QK_K,
                       "q6_k_dequantize")


def q8_0_quantize(x, out=None):
    """See falsify.reference.gguf_quants.q8_0_quantize; `out`: optional uint8 result."""
    x = _t.check_x(x, "q8_0_quantize")
    m, nb = x.shape[0], x.shape[1] // QK8_0
    shape = (m, nb * Q8_0_BYTES)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=x.device)
    elif out.dtype != torch.uint8 or tuple(out.shape) != shape:
        raise ValueError(f"q8_0_quantize: out must be uint8 {shape}, got {out.dtype} "
                         f"{tuple(out.shape)}")
    # checked before launch, like the other refusals (fp32 max|x| / 127, as the kernel forms it)
    if x.numel() and bool((x.abs().amax() / 127 >= FP16_OVERFLOW).item()):
        raise ValueError("q8_0_quantize: a block's scale max|x|/127 overflows fp16")
    cfg = launch_config(m * nb, QK8_0)
    if cfg["grid"]:
        _q8_0_quantize_kernel[(cfg["grid"],)](x, out, m * nb, nb, x.stride(0), x.stride(1),
                                              out.stride(0), out.stride(1), G=cfg["G"])
    return out


# ---------------------------------------------------------------------------------------------
# Dequantize-matmul: C = A · op(W), W [n, k] decoded tile by tile inside the tl.dot loop.
#
# The B operand's tile element (kk, nn) is W[nn, kk] for the forward (op = ᵀ: y = x·Wᵀ) and
# W[kk, nn] for the backward (dx = dy·W). Each element gathers its bytes through the layout's
# index formulas (those of the dequantize kernels above) and is decoded in registers:
#   q8_0: fp16 d · int8 q
#   q4_k: (d·sc_j)·q − dmin·m_j, the 6-bit (sc_j, m_j) of sub-block j = ⌊e/32⌋ unpacked from
#         the 12 packed bytes, q the low (even j) or high (odd j) nibble
#   q6_k: (d·sc_⌊e/16⌋)·(ql nibble | qh bit pair << 4 − 32), int8 sc
# — the same fp32 values, bit for bit, that the dequantize kernels write. fp32 activations use
# IEEE fp32 dots (the GPU default would be TF32); fp16 activations round the decoded tile to
# fp16 (as bitsandbytes dequantizes NF4 to the activation dtype) and run on tensor cores, with
# fp32 accumulation either way.

Q8_0, Q4_K, Q6_K = 0, 1, 2  # the kernels' QTYPE constexpr
_QTYPE_CODE = {"q8_0": Q8_0, "q4_k": Q4_K, "q6_k": Q6_K}
MM_MIN_TILE, MM_MAX_TILE = 16, 64  # tl.dot needs every block dimension ≥ 16
MM_BLOCK_K = 32  # one q8_0 block or one k-quant sub-block per step along a row of W


def mm_launch_config(m: int, n: int, k: int) -> dict:
    """Tiles and grid for C[m, n] = A[m, k] · B[k, n]: a pure function of the shapes
    (next power of 2 of m and n, clamped to [16, 64]; BK = 32)."""
    bm = next_power_of_2_clamped(m, MM_MIN_TILE, MM_MAX_TILE)
    bn = next_power_of_2_clamped(n, MM_MIN_TILE, MM_MAX_TILE)
    return {"BM": bm, "BN": bn, "BK": MM_BLOCK_K, "grid": (cdiv(m, bm), cdiv(n, bn))}


@triton.jit
def _w_tile(b_ptr, row, col, mask, stride_b0, stride_b1, QTYPE: tl.constexpr):
    """W[row, col] for int64 index tensors that broadcast to the tile (masked lanes: 0)."""
    if QTYPE == 0:  # q8_0: 34-byte blocks of 32
        i = col % 32
        base = row * stride_b0 + (col // 32) * 34 * stride_b1
        d = _fp16_field(tl.load(b_ptr + base, mask=mask, other=0).to(tl.int32),
                        tl.load(b_ptr + base + stride_b1, mask=mask, other=0).to(tl.int32))
        qb = tl.load(b_ptr + base + (2 + i) * stride_b1, mask=mask, other=0).to(tl.int32)
        w = d * tl.where(qb >= 128, qb - 256, qb).to(tl.float32)
    elif QTYPE == 1:  # q4_k: 144-byte super-blocks of 256
        e = col % 256
        j = e // 32
        base = row * stride_b0 + (col // 256) * 144 * stride_b1
        d = _fp16_field(tl.load(b_ptr + base, mask=mask, other=0).to(tl.int32),
                        tl.load(b_ptr + base + stride_b1, mask=mask, other=0).to(tl.int32))
        dmin = _fp16_field(
            tl.load(b_ptr + base + 2 * stride_b1, mask=mask, other=0).to(tl.int32),
            tl.load(b_ptr + base + 3 * stride_b1, mask=mask, other=0).to(tl.int32))
        sa = tl.load(b_ptr + base + (4 + j % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
        sb = tl.load(b_ptr + base + (8 + j % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
        sc_ = tl.load(b_ptr + base + (12 + j % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
        sc = tl.where(j < 4, sa & 63, (sc_ & 15) | ((sa >> 6) << 4))
        mn = tl.where(j < 4, sb & 63, (sc_ >> 4) | ((sb >> 6) << 4))
        qb = tl.load(b_ptr + base + (16 + 32 * (e // 64) + e % 32) * stride_b1, mask=mask,
                     other=0).to(tl.int32)
        q = (qb >> (4 * (j % 2))) & 15
        w = (d * sc.to(tl.float32)) * q.to(tl.float32) - dmin * mn.to(tl.float32)
    else:  # q6_k: 210-byte super-blocks of 256
        e = col % 256
        g = (e % 128) // 32
        n = e // 128
        lane = e % 32
        base = row * stride_b0 + (col // 256) * 210 * stride_b1
        d = _fp16_field(
            tl.load(b_ptr + base + 208 * stride_b1, mask=mask, other=0).to(tl.int32),
            tl.load(b_ptr + base + 209 * stride_b1, mask=mask, other=0).to(tl.int32))
        lb = tl.load(b_ptr + base + (64 * n + 32 * (g % 2) + lane) * stride_b1, mask=mask,
                     other=0).to(tl.int32)
        hb = tl.load(b_ptr + base + (128 + 32 * n + lane) * stride_b1, mask=mask,
                     other=0).to(tl.int32)
        scb = tl.load(b_ptr + base + (192 + e // 16) * stride_b1, mask=mask,
                      other=0).to(tl.int32)
        q = (((lb >> (4 * (g // 2))) & 15) | (((hb >> (2 * g)) & 3) << 4)) - 32
        sc = tl.where(scb >= 128, scb - 256, scb)
        w = (d * sc.to(tl.float32)) * q.to(tl.float32)
    return w


@triton.jit
def _dequant_mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, stride_b0, stride_b1,
                       s_cm, s_cn, TRANS_W: tl.constexpr, QTYPE: tl.constexpr,
                       DOT_F32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr):
    """C[M, N] = A[M, K] · op(W): op(W) = Wᵀ with W [N, K] (TRANS_W) or W [K, N]."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK).to(tl.int64)
        a = tl.load(a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak,
                    mask=m_ok & (rk[None, :] < K), other=0.0)
        b_ok = (rk[:, None] < K) & n_ok
        if TRANS_W:
            w = _w_tile(b_ptr, rn[None, :], rk[:, None], b_ok, stride_b0, stride_b1, QTYPE)
        else:
            w = _w_tile(b_ptr, rk[:, None], rn[None, :], b_ok, stride_b0, stride_b1, QTYPE)
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w.to(a_ptr.dtype.element_ty), acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty),
             mask=m_ok & n_ok)


def _mm(a, b, qtype: str, trans_w: bool, c, kernel=None):
    """c ← a · Wᵀ (trans_w: a [M, k], c [M, n]) or a · W (a [M, n], c [M, k]); b: [n, row]."""
    m, kk = a.shape
    nn = c.shape[1]
    cfg = mm_launch_config(m, nn, kk)
    if m and nn:
        (kernel or _dequant_mm_kernel)[cfg["grid"]](
            a, b, c, m, nn, kk, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), TRANS_W=trans_w, QTYPE=_QTYPE_CODE[qtype],
            DOT_F32=a.dtype != torch.float16, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"])
    return c


def _rows(x, k):
    return x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), k)


class _DequantMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b, qtype, n, k):
        x2 = _rows(x, k)
        y = _mm(x2, b, qtype, True, torch.empty(x2.shape[0], n, dtype=x.dtype,
                                                 device=x.device))
        ctx.save_for_backward(b)
        ctx.meta = (qtype, n, k, x.shape)
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    @once_differentiable("dequant_matmul (Triton)")
    def backward(ctx, gy):
        (b,) = ctx.saved_tensors
        qtype, n, k, shape = ctx.meta
        g2 = _rows(gy, n)
        dx = _mm(g2, b, qtype, False, torch.empty(g2.shape[0], k, dtype=gy.dtype,
                                                   device=gy.device))
        return dx.reshape(shape), None, None, None, None  # frozen bytes: no gradient


def dequant_matmul(x, blocks, qtype, n, k, out=None):
    """See falsify.kernels.torch.gguf_quants.dequant_matmul (same arguments and result): the
    blocks are decoded tile by tile inside the GEMM, forward (x·Wᵀ) and backward (dy·W)."""
    fn = "dequant_matmul"
    b = _t.check_matmul_args(x, blocks, qtype, n, k, fn, triton_dtypes())
    needs_grad = torch.is_grad_enabled() and x.requires_grad
    _t.check_mm_out(out, (*x.shape[:-1], n), x.dtype, needs_grad, fn)
    if out is None:
        return _DequantMatmul.apply(x, b, qtype, n, k)
    _mm(_rows(x, k), b, qtype, True, out if out.dim() == 2 else out.view(-1, n))
    return out
