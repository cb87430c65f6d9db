"""GGUF block-format mutants: real unpacking / sign / rounding bugs the gguf_quants contract's
checks must catch. Each has the signature of the function it replaces."""

from __future__ import annotations

import falsify.impl.triton  # noqa: F401  (interpreter switch: must run before `import triton`)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.impl.torch import gguf_quants as _t
from falsify.impl.triton import gguf_quants as _x
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
