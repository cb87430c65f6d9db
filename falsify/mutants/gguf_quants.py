"""GGUF block-format mutants: real unpacking / sign / rounding bugs the gguf_quants contract's
checks must catch. Each has the signature of the function it replaces."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (interpreter switch: must run before `import triton`)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch import gguf_quants as _t
from falsify.kernels.triton import gguf_quants as _x
from falsify.reference.gguf_quants import Q4_K_BYTES, Q6_K_BYTES, Q8_0_BYTES, QK8_0, QK_K


def _q4_k_torch(blocks, out, scale_min, nibbles_swapped=False):
    """torch q4_k dequantize with a replaceable scale unpacker and nibble order."""
    b = _t.check_blocks(blocks, Q4_K_BYTES, "q4_k_dequantize")
    m, nb = b.shape[0], b.shape[1] // Q4_K_BYTES
    blk = b.reshape(m, nb, Q4_K_BYTES)
    d = _t.fp16_field(blk[..., 0], blk[..., 1])
    dmin = _t.fp16_field(blk[..., 2], blk[..., 3])
    sc, mn = scale_min(blk[..., 4:16])
    qs = blk[..., 16:].to(torch.int32).reshape(m, nb, 4, 1, 32)
    halves = [qs >> 4, qs & 15] if nibbles_swapped else [qs & 15, qs >> 4]
    q = torch.cat(halves, dim=3).reshape(m, nb, 8, 32).float()
    y = (d[..., None] * sc.float())[..., None] * q - (dmin[..., None] * mn.float())[..., None]
    y = y.flatten(1)
    return y if out is None else out.copy_(y)


def _scale_min_top_bits_at_bit_3(s):
    """Sub-blocks 4..7 put the two high bits of their 6-bit scale and min at bits 3..4 instead
    of 4..5 (the shift off by one bit)."""
    s = s.to(torch.int32)
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 3)], dim=-1)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 3)], dim=-1)
    return sc, mn


def q4_k_scale_bit_off_by_one(blocks, out=None):
    """q4_k 6-bit scale/min unpacking with the top two bits one bit too low (sub-blocks 4..7)."""
    return _q4_k_torch(blocks, out, _scale_min_top_bits_at_bit_3)


def q4_k_nibbles_swapped(blocks, out=None):
    """q4_k with the nibble order swapped: sub-block 2c reads the HIGH nibbles of chunk c."""
    return _q4_k_torch(blocks, out, _t.q4_k_scale_min, nibbles_swapped=True)


@triton.jit
def _q4_k_min_added_kernel(b_ptr, out_ptr, nblocks, nb, stride_b0, stride_b1, stride_o0,
                           stride_o1, G: tl.constexpr):
    live, row, k, base = _x._block_rows(nblocks, nb, stride_b0, stride_b1, 144, G)
    d = _x._fp16_field(tl.load(b_ptr + base, mask=live, other=0).to(tl.int32),
                       tl.load(b_ptr + base + stride_b1, mask=live, other=0).to(tl.int32))
    dmin = _x._fp16_field(
        tl.load(b_ptr + base + 2 * stride_b1, mask=live, other=0).to(tl.int32),
        tl.load(b_ptr + base + 3 * stride_b1, mask=live, other=0).to(tl.int32))
    e = tl.arange(0, 256)
    j = e // 32
    m2 = live[:, None]
    at = base[:, None]
    sa = tl.load(b_ptr + at + (4 + j % 4)[None, :] * stride_b1, mask=m2, other=0).to(tl.int32)
    sb = tl.load(b_ptr + at + (8 + j % 4)[None, :] * stride_b1, mask=m2, other=0).to(tl.int32)
    sc_ = tl.load(b_ptr + at + (12 + j % 4)[None, :] * stride_b1, mask=m2, other=0).to(tl.int32)
    first = (j < 4)[None, :]
    sc = tl.where(first, sa & 63, (sc_ & 15) | ((sa >> 6) << 4))
    mn = tl.where(first, sb & 63, (sc_ >> 4) | ((sb >> 6) << 4))
    qb = tl.load(b_ptr + at + (16 + 32 * (e // 64) + e % 32)[None, :] * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    q = (qb >> (4 * (j % 2))[None, :]) & 15
    # BUG: the min term added (the sign of dmin·m flipped)
    y = d[:, None] * sc.to(tl.float32) * q.to(tl.float32) + dmin[:, None] * mn.to(tl.float32)
    o = row[:, None].to(tl.int64) * stride_o0 + (k[:, None] * 256 + e[None, :]) * stride_o1
    tl.store(out_ptr + o, y, mask=m2)


def q4_k_min_added(blocks, out=None):
    """Triton q4_k dequantize computing d·sc·q + dmin·m (the min's sign flipped)."""
    return _x._dequantize(_q4_k_min_added_kernel, blocks, out, Q4_K_BYTES, QK_K,
                          "q4_k_dequantize")


@triton.jit
def _q6_k_high_bits_reversed_kernel(b_ptr, out_ptr, nblocks, nb, stride_b0, stride_b1,
                                    stride_o0, stride_o1, G: tl.constexpr):
    live, row, k, base = _x._block_rows(nblocks, nb, stride_b0, stride_b1, 210, G)
    d = _x._fp16_field(
        tl.load(b_ptr + base + 208 * stride_b1, mask=live, other=0).to(tl.int32),
        tl.load(b_ptr + base + 209 * stride_b1, mask=live, other=0).to(tl.int32))
    e = tl.arange(0, 256)
    n = e // 128
    g = (e % 128) // 32
    lane = e % 32
    m2 = live[:, None]
    at = base[:, None]
    lb = tl.load(b_ptr + at + (64 * n + 32 * (g % 2) + lane)[None, :] * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    hb = tl.load(b_ptr + at + (128 + 32 * n + lane)[None, :] * stride_b1, mask=m2,
                 other=0).to(tl.int32)
    scb = tl.load(b_ptr + at + (192 + e // 16)[None, :] * stride_b1, mask=m2,
                  other=0).to(tl.int32)
    low = (lb >> (4 * (g // 2))[None, :]) & 15
    high = (hb >> (6 - 2 * g)[None, :]) & 3  # BUG: group g reads bit pair 3 − g
    q = (low | (high << 4)) - 32
    sc = tl.where(scb >= 128, scb - 256, scb)
    y = (d[:, None] * sc.to(tl.float32)) * q.to(tl.float32)
    o = row[:, None].to(tl.int64) * stride_o0 + (k[:, None] * 256 + e[None, :]) * stride_o1
    tl.store(out_ptr + o, y, mask=m2)


def q6_k_high_bits_reversed(blocks, out=None):
    """Triton q6_k dequantize reading the qh bit pairs in reverse order (group g ← pair 3 − g)."""
    return _x._dequantize(_q6_k_high_bits_reversed_kernel, blocks, out, Q6_K_BYTES, QK_K,
                          "q6_k_dequantize")


def q8_0_scale_big_endian(blocks, out=None):
    """q8_0 dequantize reading the fp16 scale's two bytes in big-endian order."""
    b = _t.check_blocks(blocks, Q8_0_BYTES, "q8_0_dequantize")
    m, nb = b.shape[0], b.shape[1] // Q8_0_BYTES
    blk = b.reshape(m, nb, Q8_0_BYTES)
    d = _t.fp16_field(blk[..., 1], blk[..., 0])  # BUG: (hi, lo)
    y = (d[..., None] * _t.int8_field(blk[..., 2:]).float()).flatten(1)
    return y if out is None else out.copy_(y)


def _q8_0_quantize_with(x, out, rounding, scale_for_quants):
    x = _t.check_x(x, "q8_0_quantize")
    m, nb = x.shape[0], x.shape[1] // QK8_0
    blk = x.reshape(m, nb, QK8_0)
    d = blk.abs().amax(dim=-1) / 127
    dq = scale_for_quants(d)
    inv = torch.where(dq == 0, torch.zeros_like(dq), 1 / torch.where(dq == 0, 1, dq))
    v = blk * inv[..., None]
    q = torch.where(torch.isfinite(v), rounding(v), 0).to(torch.int8).view(torch.uint8)
    bits = d.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    res = torch.cat([(bits & 255).to(torch.uint8)[..., None],
                     (bits >> 8).to(torch.uint8)[..., None], q], dim=-1).flatten(1)
    return res if out is None else out.copy_(res)


def q8_0_round_half_even(x, out=None):
    """q8_0 quantize with torch.round (ties to even) instead of C's roundf (ties away)."""
    return _q8_0_quantize_with(x, out, torch.round, lambda d: d)


def q8_0_quants_from_fp16_scale(x, out=None):
    """q8_0 quantize dividing by the fp16-rounded scale instead of ggml's fp32 amax/127."""
    return _q8_0_quantize_with(x, out, _t.roundf, lambda d: d.half().float())


def q8_0_truncating(x, out=None):
    """q8_0 quantize that truncates toward zero instead of rounding to the nearest integer."""
    return _q8_0_quantize_with(x, out, torch.trunc, lambda d: d)


# --- dequant_matmul -------------------------------------------------------------------------


@triton.jit
def _q4_k_tile_bug(b_ptr, row, col, mask, stride_b0, stride_b1, SUB_OFF: tl.constexpr,
                   MIN_SIGN: tl.constexpr):
    """The fused q4_k tile with the scale/min of sub-block (j + SUB_OFF) mod 8 and the min
    term multiplied by MIN_SIGN (1, 1: the correct decode)."""
    e = col % 256
    j = e // 32
    js = (j + SUB_OFF) % 8
    base = row * stride_b0 + (col // 256) * 144 * stride_b1
    d = _x._fp16_field(tl.load(b_ptr + base, mask=mask, other=0).to(tl.int32),
                       tl.load(b_ptr + base + stride_b1, mask=mask, other=0).to(tl.int32))
    dmin = _x._fp16_field(
        tl.load(b_ptr + base + 2 * stride_b1, mask=mask, other=0).to(tl.int32),
        tl.load(b_ptr + base + 3 * stride_b1, mask=mask, other=0).to(tl.int32))
    sa = tl.load(b_ptr + base + (4 + js % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
    sb = tl.load(b_ptr + base + (8 + js % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
    sc_ = tl.load(b_ptr + base + (12 + js % 4) * stride_b1, mask=mask, other=0).to(tl.int32)
    sc = tl.where(js < 4, sa & 63, (sc_ & 15) | ((sa >> 6) << 4))
    mn = tl.where(js < 4, sb & 63, (sc_ >> 4) | ((sb >> 6) << 4))
    qb = tl.load(b_ptr + base + (16 + 32 * (e // 64) + e % 32) * stride_b1, mask=mask,
                 other=0).to(tl.int32)
    q = (qb >> (4 * (j % 2))) & 15
    return (d * sc.to(tl.float32)) * q.to(tl.float32) - MIN_SIGN * (dmin * mn.to(tl.float32))


@triton.jit
def _mm_bug_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, stride_b0, stride_b1, s_cm, s_cn,
                   W_ROWS, W_COLS, TRANS_W: tl.constexpr, QTYPE: tl.constexpr,
                   DOT_F32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, SUB_OFF: tl.constexpr, MIN_SIGN: tl.constexpr):
    """_dequant_mm_kernel with the q4_k tile replaced by _q4_k_tile_bug; every lane is masked
    to W's real [W_ROWS, W_COLS] so an orientation bug reads wrong values, never out of bounds."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
    m_ok = rm[:, None] < M
    n_ok = rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK).to(tl.int64)
        a = tl.load(a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak,
                    mask=m_ok & (rk[None, :] < K), other=0.0)
        if TRANS_W:
            row = rn[None, :] + 0 * rk[:, None]
            col = rk[:, None] + 0 * rn[None, :]
        else:
            row = rk[:, None] + 0 * rn[None, :]
            col = rn[None, :] + 0 * rk[:, None]
        ok = (rk[:, None] < K) & n_ok & (row < W_ROWS) & (col < W_COLS)
        if QTYPE == 1:
            w = _q4_k_tile_bug(b_ptr, row, col, ok, stride_b0, stride_b1, SUB_OFF, MIN_SIGN)
        else:
            w = _x._w_tile(b_ptr, row, col, ok, stride_b0, stride_b1, QTYPE)
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w.to(a_ptr.dtype.element_ty), acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty),
             mask=m_ok & n_ok)


def _mm_bug(a, b, qtype, trans_w, c, n, k, sub_off=0, min_sign=1):
    m, kk = a.shape
    nn = c.shape[1]
    cfg = _x.mm_launch_config(m, nn, kk)
    if m and nn:
        _mm_bug_kernel[cfg["grid"]](
            a, b, c, m, nn, kk, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), n, k, TRANS_W=trans_w, QTYPE=_x._QTYPE_CODE[qtype],
            DOT_F32=a.dtype != torch.float16, BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"],
            SUB_OFF=sub_off, MIN_SIGN=min_sign)
    return c


def _mm_forward_bug(x, blocks, qtype, n, k, out, **bug):
    b = _t.check_matmul_args(x, blocks, qtype, n, k, "dequant_matmul")
    x2 = x.reshape(-1, k) if x.dim() != 2 else x
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    _mm_bug(x2.detach(), b, qtype, True, y, n, k, **bug)
    y = y.reshape(*x.shape[:-1], n)
    return y if out is None else out.copy_(y)


def mm_q4_k_wrong_sub_block(x, blocks, qtype, n, k, out=None):
    """Triton dequant_matmul whose q4_k tile uses sub-block (j + 1) mod 8's scale and min."""
    return _mm_forward_bug(x, blocks, qtype, n, k, out, sub_off=1)


def mm_q4_k_min_sign(x, blocks, qtype, n, k, out=None):
    """Triton dequant_matmul whose q4_k tile adds dmin·m instead of subtracting it."""
    return _mm_forward_bug(x, blocks, qtype, n, k, out, min_sign=-1)


class _BackwardTransposed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b, qtype, n, k):
        x2 = x.reshape(-1, k) if x.dim() != 2 else x
        y = _x._mm(x2, b, qtype, True, torch.empty(x2.shape[0], n, dtype=x.dtype))
        ctx.save_for_backward(b)
        ctx.meta = (qtype, n, k, x.shape)
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, gy):
        (b,) = ctx.saved_tensors
        qtype, n, k, shape = ctx.meta
        g2 = gy.reshape(-1, n)
        dx = torch.empty(g2.shape[0], k, dtype=gy.dtype)
        _mm_bug(g2, b, qtype, True, dx, n, k)  # BUG: the forward's Wᵀ orientation
        return dx.reshape(shape), None, None, None, None


def mm_backward_transposed(x, blocks, qtype, n, k, out=None):
    """Triton dequant_matmul whose backward computes dy·Wᵀ (read as far as W's shape allows)
    instead of dy·W."""
    b = _t.check_matmul_args(x, blocks, qtype, n, k, "dequant_matmul")
    return _BackwardTransposed.apply(x, b, qtype, n, k)


def _decode_q4_k_next_super_block(b, w):
    """torch q4_k rows decoded with each super-block's d and dmin taken from the next one."""
    r, nb = b.shape[0], b.shape[1] // Q4_K_BYTES
    blk = b.reshape(r, nb, Q4_K_BYTES)
    d = _t.fp16_field(blk[..., 0], blk[..., 1]).roll(-1, dims=1)  # BUG: super-block + 1
    dmin = _t.fp16_field(blk[..., 2], blk[..., 3]).roll(-1, dims=1)
    sc, mn = _t.q4_k_scale_min(blk[..., 4:16])
    qs = blk[..., 16:].to(torch.int32).reshape(r, nb, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(r, nb, 8, 32).float()
    v = (d[..., None] * sc.float())[..., None] * q - (dmin[..., None] * mn.float())[..., None]
    return w.copy_(v.reshape(r, nb * QK_K))


def mm_q4_k_wrong_super_block(x, blocks, qtype, n, k, out=None):
    """torch dequant_matmul (chunked) whose q4_k decode uses the next super-block's d, dmin."""
    b = _t.check_matmul_args(x, blocks, qtype, n, k, "dequant_matmul")
    decode = _decode_q4_k_next_super_block if qtype == "q4_k" else _t._DECODE[qtype]
    x2 = x.reshape(-1, k).float()
    rows = _t.chunk_rows(n, k)
    y = torch.empty(x2.shape[0], n)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        y[:, r0:r1] = x2 @ decode(b[r0:r1], torch.empty(r1 - r0, k)).T
    y = y.to(x.dtype).reshape(*x.shape[:-1], n)
    return y if out is None else out.copy_(y)
