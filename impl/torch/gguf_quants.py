"""GGUF q8_0 / q4_k / q6_k dequantization and q8_0 quantization in PyTorch, bit-identical to
ggml (and to `falsify.reference.gguf_quants`, which documents the layouts and the arithmetic).

Blocks are uint8 [m, nb·block_bytes] (a row is a sequence of whole blocks); results are float32
[m, nb·values_per_block]. The reference gathers each value's byte by index formulas; this file
reshapes the block bytes into the layout's fields instead, so the two are independent ways of
reading the same struct. Products are formed in fp32 in ggml's order, (d·sc)·q and then − dmin·m
for q4_k: every product is exact and the subtraction rounds once, so any order that keeps the
subtraction last gives the same bits (see the reference).

Quantization codes are integers and nothing here builds an autograd graph.
"""

from __future__ import annotations

import torch

from falsify.impl.dtypes import FP32, require
from falsify.reference.gguf_quants import (
    FP16_OVERFLOW,
    Q4_K_BYTES,
    Q6_K_BYTES,
    Q8_0_BYTES,
    QK8_0,
    QK_K,
)

__all__ = ["q8_0_dequantize", "q4_k_dequantize", "q6_k_dequantize", "q8_0_quantize"]


def check_blocks(blocks, block_bytes: int, fn: str) -> torch.Tensor:
    """Validate raw block bytes: a 2-D uint8 tensor whose rows are whole blocks."""
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"{fn}: blocks must be a tensor, got {type(blocks).__name__}")
    if blocks.dtype != torch.uint8:
        raise TypeError(f"{fn}: blocks must be uint8 bytes, got dtype "
                        f"{str(blocks.dtype).removeprefix('torch.')}")
    if blocks.dim() != 2:
        raise ValueError(f"{fn}: blocks must be 2-D [rows, bytes], got shape "
                         f"{tuple(blocks.shape)}")
    if blocks.shape[1] % block_bytes:
        raise ValueError(f"{fn}: a row has {blocks.shape[1]} bytes, not a multiple of the "
                         f"{block_bytes}-byte block")
    return blocks


def check_out(out, shape: tuple, fn: str):
    """`out` (optional) must be a float32 tensor of the result's shape (any strides)."""
    if out is not None and (out.dtype != torch.float32 or tuple(out.shape) != shape):
        raise ValueError(f"{fn}: out must be float32 {shape}, got {out.dtype} "
                         f"{tuple(out.shape)}")


def fp16_field(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """The little-endian fp16 field (lo, hi) as float32 (exact). The bit pattern is assembled
    explicitly, so the host's byte order does not matter."""
    bits = lo.to(torch.int32) | (hi.to(torch.int32) << 8)
    bits = torch.where(bits >= 32768, bits - 65536, bits)  # two's complement for int16
    return bits.to(torch.int16).view(torch.float16).float()


def int8_field(b: torch.Tensor) -> torch.Tensor:
    """Bytes read as two's-complement int8 (int32)."""
    b = b.to(torch.int32)
    return torch.where(b >= 128, b - 256, b)


def _finish(values: torch.Tensor, m: int, out):
    values = values.flatten(1)  # [m, nb·values]; reshape(m, -1) is ambiguous when m = 0
    return values if out is None else out.copy_(values)


def q8_0_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q8_0_dequantize; `out`: optional float32 result."""
    b = check_blocks(blocks, Q8_0_BYTES, "q8_0_dequantize")
    m, nb = b.shape[0], b.shape[1] // Q8_0_BYTES
    check_out(out, (m, nb * QK8_0), "q8_0_dequantize")
    blk = b.reshape(m, nb, Q8_0_BYTES)
    d = fp16_field(blk[..., 0], blk[..., 1])
    return _finish(d[..., None] * int8_field(blk[..., 2:]).float(), m, out)


def q4_k_scale_min(s: torch.Tensor):
    """(sc, m), int32 [..., 8], from the 12 packed bytes s[..., 0:12] of a q4_k super-block:
    sub-blocks 0..3 keep their 6 bits in the low bits of bytes 0..7; sub-blocks 4..7 take their
    low 4 bits from bytes 8..11 and their top 2 bits from the top of bytes 0..7."""
    s = s.to(torch.int32)
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1)
    return sc, mn


def q4_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q4_k_dequantize; `out`: optional float32 result."""
    b = check_blocks(blocks, Q4_K_BYTES, "q4_k_dequantize")
    m, nb = b.shape[0], b.shape[1] // Q4_K_BYTES
    check_out(out, (m, nb * QK_K), "q4_k_dequantize")
    blk = b.reshape(m, nb, Q4_K_BYTES)
    d = fp16_field(blk[..., 0], blk[..., 1])
    dmin = fp16_field(blk[..., 2], blk[..., 3])
    sc, mn = q4_k_scale_min(blk[..., 4:16])
    qs = blk[..., 16:].to(torch.int32).reshape(m, nb, 4, 1, 32)  # [chunk c, -, lane]
    # sub-block 2c: the low nibbles of chunk c; sub-block 2c + 1: its high nibbles
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(m, nb, 8, 32).float()
    d1 = (d[..., None] * sc.float())[..., None]  # [m, nb, 8, 1], exact
    m1 = (dmin[..., None] * mn.float())[..., None]  # exact
    return _finish(d1 * q - m1, m, out)


def q6_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q6_k_dequantize; `out`: optional float32 result."""
    b = check_blocks(blocks, Q6_K_BYTES, "q6_k_dequantize")
    m, nb = b.shape[0], b.shape[1] // Q6_K_BYTES
    check_out(out, (m, nb * QK_K), "q6_k_dequantize")
    blk = b.reshape(m, nb, Q6_K_BYTES)
    ql = blk[..., 0:128].to(torch.int32).reshape(m, nb, 2, 2, 32)  # [half n, g mod 2, lane]
    qh = blk[..., 128:192].to(torch.int32).reshape(m, nb, 2, 1, 32)  # [half n, -, lane]
    sc = int8_field(blk[..., 192:208]).float()  # [m, nb, 16]
    d = fp16_field(blk[..., 208], blk[..., 209])
    low = torch.cat([ql & 15, ql >> 4], dim=3)  # groups g = 0, 1 (low nibbles), 2, 3 (high)
    high = torch.cat([(qh >> (2 * g)) & 3 for g in range(4)], dim=3)
    q = ((low | (high << 4)) - 32).reshape(m, nb, 16, 16).float()  # 16 values per scale
    return _finish((d[..., None] * sc)[..., None] * q, m, out)


def roundf(v: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), exactly (see falsify.reference.gguf_quants.roundf):
    torch.round rounds half to even, which is not ggml's rule."""
    a = v.abs()
    f = a.floor()
    return torch.copysign(f + ((a - f) * 2).floor(), v)


def check_x(x, fn: str, dtypes: tuple = FP32) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a tensor, got {type(x).__name__}")
    require(fn, dtypes, x=x)
    if x.dim() != 2:
        raise ValueError(f"{fn}: x must be 2-D [rows, values], got shape {tuple(x.shape)}")
    if x.shape[1] % QK8_0:
        raise ValueError(f"{fn}: a row has {x.shape[1]} values, not a multiple of 32")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{fn}: input has non-finite values")
    return x


def q8_0_quantize(x, out=None):
    """See falsify.reference.gguf_quants.q8_0_quantize; `out`: optional uint8 result."""
    x = check_x(x, "q8_0_quantize")
    m, nb = x.shape[0], x.shape[1] // QK8_0
    if out is not None and (out.dtype != torch.uint8 or tuple(out.shape) != (m, nb * Q8_0_BYTES)):
        raise ValueError(f"q8_0_quantize: out must be uint8 {(m, nb * Q8_0_BYTES)}, got "
                         f"{out.dtype} {tuple(out.shape)}")
    blk = x.reshape(m, nb, QK8_0)
    amax = blk.abs().amax(dim=-1) if nb else blk.new_zeros(m, 0)
    d = amax / 127  # fp32, correctly rounded
    if bool((d >= FP16_OVERFLOW).any()):
        raise ValueError("q8_0_quantize: a block's scale max|x|/127 overflows fp16")
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, 1, d))
    v = blk * inv[..., None]
    # a block with max|x| below about 3.7e-37 has 1/d = inf: quants 0 there (see the reference)
    q = torch.where(torch.isfinite(v), roundf(v), 0).to(torch.int8).view(torch.uint8)
    bits = d.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    res = torch.cat([(bits & 255).to(torch.uint8)[..., None],
                     (bits >> 8).to(torch.uint8)[..., None], q], dim=-1).flatten(1)
    return res if out is None else out.copy_(res)
