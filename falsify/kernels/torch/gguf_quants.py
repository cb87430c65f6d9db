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

import math

import torch

from falsify.arguments import check_qtype
from falsify.kernels.dtypes import CHECKED, FP32, require
from falsify.reference.gguf_quants import (
    FP16_OVERFLOW,
    Q4_K_BYTES,
    Q6_K_BYTES,
    Q8_0_BYTES,
    QK8_0,
    QTYPES,
)

__all__ = ["q8_0_dequantize", "q4_k_dequantize", "q6_k_dequantize", "q8_0_quantize",
           "dequant_matmul"]


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


def _decode_q8_0(b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows of q8_0 blocks, uint8 [R, 34·nb] → float32 [R, 32·nb] written into w (any float32
    [R, 32·nb] tensor whose rows are contiguous): one pass, d·q exact."""
    r, nb = b.shape[0], b.shape[1] // Q8_0_BYTES
    blk = b.reshape(r, nb, Q8_0_BYTES)
    d = fp16_field(blk[..., 0], blk[..., 1])[..., None]
    torch.mul(blk[..., 2:].view(torch.int8), d, out=w.view(r, nb, QK8_0))
    return w


def q4_k_scale_min(s: torch.Tensor):
    """(sc, m), int32 [..., 8], from the 12 packed bytes s[..., 0:12] of a q4_k super-block:
    sub-blocks 0..3 keep their 6 bits in the low bits of bytes 0..7; sub-blocks 4..7 take their
    low 4 bits from bytes 8..11 and their top 2 bits from the top of bytes 0..7."""
    s = s.to(torch.int32)
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1)
    return sc, mn


def _decode_q4_k(b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows of q4_k super-blocks, uint8 [R, 144·nb] → float32 [R, 256·nb] into w. The quants
    stay uint8 nibbles until one fused pass per half writes (d·sc)·q + (−dmin·m): the product
    is exact and addcmul rounds the sum once, as ggml's d1·q − m1 does (the same bits)."""
    r, nb = b.shape[0], b.shape[1] // Q4_K_BYTES
    blk = b.reshape(r, nb, Q4_K_BYTES)
    d = fp16_field(blk[..., 0], blk[..., 1])
    dmin = fp16_field(blk[..., 2], blk[..., 3])
    sc, mn = q4_k_scale_min(blk[..., 4:16])
    # sub-block 2c + h (h = 0 low nibbles, 1 high nibbles of chunk c): its scale and −min
    d1 = (d[..., None] * sc.float()).view(r, nb, 4, 2, 1)  # exact
    m1 = (dmin[..., None] * mn.float()).neg_().view(r, nb, 4, 2, 1)  # exact
    qs = blk[..., 16:].reshape(r, nb, 4, 32)
    w4 = w.view(r, nb, 4, 2, 32)
    torch.addcmul(m1[:, :, :, 0], qs & 15, d1[:, :, :, 0], out=w4[:, :, :, 0])
    torch.addcmul(m1[:, :, :, 1], qs >> 4, d1[:, :, :, 1], out=w4[:, :, :, 1])
    return w


def _decode_q6_k(b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows of q6_k super-blocks, uint8 [R, 210·nb] → float32 [R, 256·nb] into w: the 6-bit
    quants are assembled in uint8 (ql nibble | qh bit pair << 4, then − 32 as int8), then one
    pass writes (d·sc)·q, exact."""
    r, nb = b.shape[0], b.shape[1] // Q6_K_BYTES
    blk = b.reshape(r, nb, Q6_K_BYTES)
    ql = blk[..., 0:128].reshape(r, nb, 2, 1, 2, 32)  # [half n, -, g mod 2, lane]
    qh = blk[..., 128:192].reshape(r, nb, 2, 1, 1, 32)  # [half n, -, -, lane]
    d = fp16_field(blk[..., 208], blk[..., 209])
    sc = blk[..., 192:208].view(torch.int8).float()  # [r, nb, 16]
    low = torch.cat([ql & 15, ql >> 4], dim=3)  # [r, nb, n, g // 2, g mod 2, lane]
    high = torch.cat([(qh >> (2 * g)) & 3 for g in range(4)], dim=3).view(r, nb, 2, 2, 2, 32)
    q = ((low | (high << 4)).view(torch.int8) - 32).view(r, nb, 16, 16)  # in [−32, 31]
    torch.mul(q, (d[..., None] * sc)[..., None], out=w.view(r, nb, 16, 16))
    return w


_DECODE = {"q8_0": _decode_q8_0, "q4_k": _decode_q4_k, "q6_k": _decode_q6_k}


def _dequantize(blocks, out, qtype: str, fn: str):
    qk, nbytes = QTYPES[qtype]
    b = check_blocks(blocks, nbytes, fn)
    m, nb = b.shape[0], b.shape[1] // nbytes
    check_out(out, (m, nb * qk), fn)
    w = torch.empty((m, nb * qk), dtype=torch.float32, device=b.device)
    _DECODE[qtype](b, w)
    return w if out is None else out.copy_(w)


def q8_0_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q8_0_dequantize; `out`: optional float32 result."""
    return _dequantize(blocks, out, "q8_0", "q8_0_dequantize")


def q4_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q4_k_dequantize; `out`: optional float32 result."""
    return _dequantize(blocks, out, "q4_k", "q4_k_dequantize")


def q6_k_dequantize(blocks, out=None):
    """See falsify.reference.gguf_quants.q6_k_dequantize; `out`: optional float32 result."""
    return _dequantize(blocks, out, "q6_k", "q6_k_dequantize")


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


# ---------------------------------------------------------------------------------------------
# Dequantize-matmul: y = x·Wᵀ with W = dequantize(blocks) [n, k], never materialised whole.

# A chunk of W decoded at a time is at most CHUNK_BYTES of fp32 (or one row / one block
# column, if that is larger). Each chunk is one BLAS call, which packs the activation operand
# (x forward, dy backward) again, so a chunk needs enough rows (columns) to amortise that, and
# it should still sit in the last-level cache beside x when the GEMM reads it. Measured with
# scripts/bench_dequant_matmul.py (q4_k 4096 × 4096, x [512, 4096], one thread, CPU time, on a
# shared 2-core AMD EPYC with 32 MiB L3, MKL): naive/fused time 1.13 (forward) and 1.00
# (forward + backward) with 1 MiB chunks, 1.26 and 1.04 with 4 MiB, 1.30 and 1.05 with 16 MiB;
# peak resident memory above the inputs 67 MiB at 1 and 4 MiB, 88 MiB at 16 MiB, 126 MiB for
# dequantize-then-F.linear. 4 MiB keeps nearly all of the speed at the small chunks' memory.
CHUNK_BYTES = 4 << 20


def chunk_rows(n: int, k: int) -> int:
    """Rows of W decoded per forward chunk: a pure function of the shape, in [1, max(n, 1)],
    with chunk_rows·k·4 ≤ CHUNK_BYTES unless one row alone is larger."""
    return max(1, min(max(n, 1), CHUNK_BYTES // (4 * max(k, 1))))


def chunk_cols(n: int, k: int, qk: int) -> int:
    """Columns of W decoded per backward chunk (dx[:, c] = dy·W[:, c] needs every row of those
    columns): whole blocks, in [qk, max(k, qk)], with n·chunk_cols·4 ≤ CHUNK_BYTES unless one
    block column alone is larger."""
    return max(qk, min(max(k, qk), CHUNK_BYTES // (4 * max(n, 1)) // qk * qk))


def _as_rows(blocks, qtype: str, n: int, k: int, fn: str) -> torch.Tensor:
    """`blocks` (uint8, flat n·row bytes or [n, row]) as a [n, row] tensor (a view if it can)."""
    qk, nbytes = QTYPES[qtype]
    row = k // qk * nbytes
    if not isinstance(blocks, torch.Tensor):
        raise TypeError(f"{fn}: blocks must be a tensor, got {type(blocks).__name__}")
    if blocks.dtype != torch.uint8:
        raise TypeError(f"{fn}: blocks must be uint8 bytes, got dtype "
                        f"{str(blocks.dtype).removeprefix('torch.')}")
    if tuple(blocks.shape) not in ((n * row,), (n, row)):
        raise ValueError(f"{fn}: blocks must hold {n} rows of {row} bytes ({qtype}, k = {k}): "
                         f"shape ({n * row},) or ({n}, {row}), got {tuple(blocks.shape)}")
    return blocks.reshape(n, row)


def check_matmul_args(x, blocks, qtype, n, k, fn: str, dtypes: tuple = CHECKED):
    """Validate dequant_matmul's arguments; returns blocks as [n, row bytes]."""
    check_qtype(qtype, n, k, fn, QTYPES)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a tensor, got {type(x).__name__}")
    require(fn, dtypes, x=x)
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must be [..., k = {k}], got shape {tuple(x.shape)}")
    b = _as_rows(blocks, qtype, n, k, fn)
    if b.device != x.device:
        raise ValueError(f"{fn}: x is on {x.device}, blocks on {b.device}")
    return b


def check_mm_out(out, shape: tuple, dtype, needs_grad: bool, fn: str):
    if out is None:
        return
    if needs_grad:
        raise ValueError(f"{fn}: out= is for inference only: it cannot carry an autograd graph")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != dtype:
        raise ValueError(f"{fn}: out must be {dtype} {shape}, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")


def _rows_of_x(x, k):
    return x.reshape(math.prod(x.shape[:-1]), k)  # not (-1, k): -1 is ambiguous when k = 0


def _forward(x2, b, qtype: str, n: int, k: int) -> torch.Tensor:
    """y = x·Wᵀ [M, n] in fp32, one chunk of W's rows at a time (x upcast once: exact). y is
    contiguous, as F.linear returns it, so the ops after the layer (the LoRA add, the head
    split) read it in order rather than through a transposed view."""
    xf = x2.float()
    y = torch.empty(x2.shape[0], n, dtype=torch.float32, device=x2.device)
    rows = chunk_rows(n, k)
    buf = torch.empty(min(rows, n), k, dtype=torch.float32, device=x2.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w = _DECODE[qtype](b[r0:r1], buf[: r1 - r0])
        if r1 - r0 == n:
            torch.mm(xf, w.t(), out=y)
        else:
            y[:, r0:r1] = xf @ w.t()  # columns r0..r1 of y
    return y


def _backward(g2, b, qtype: str, n: int, k: int) -> torch.Tensor:
    """dx = g·W [M, k] in fp32, a chunk of W's block columns at a time: dx[:, c0:c1] =
    g·W[:, c0:c1] reduces over all n rows at once, so each part of dx is written once."""
    qk, nbytes = QTYPES[qtype]
    gf = g2.float()
    dx = torch.empty(g2.shape[0], k, dtype=torch.float32, device=g2.device)
    cols = chunk_cols(n, k, qk)
    buf = torch.empty(n * min(cols, k), dtype=torch.float32, device=g2.device)
    for c0 in range(0, k, cols):
        c1 = min(k, c0 + cols)
        w = buf[: n * (c1 - c0)].view(n, c1 - c0)
        _DECODE[qtype](b[:, c0 // qk * nbytes: c1 // qk * nbytes], w)
        if c1 - c0 == k:
            torch.mm(gf, w, out=dx)
        else:
            dx[:, c0:c1] = gf @ w
    return dx


class _DequantMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b, qtype, n, k):
        y = _forward(_rows_of_x(x, k), b, qtype, n, k)
        ctx.save_for_backward(b)
        ctx.meta = (qtype, n, k, x.shape, x.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], n)

    @staticmethod
    def backward(ctx, gy):
        (b,) = ctx.saved_tensors
        qtype, n, k, shape, dtype = ctx.meta
        dx = _backward(_rows_of_x(gy, n), b, qtype, n, k)
        return dx.to(dtype).reshape(shape), None, None, None, None  # frozen bytes: no gradient


def dequant_matmul(x, blocks, qtype, n, k, out=None):
    """y = x · Wᵀ with W = dequantize(blocks) [n, k] the frozen base of a quantized linear.

    x: float32 or float16 [..., k]; blocks: uint8 GGUF tensor data of `qtype` ("q8_0", "q4_k",
    "q6_k"), flat (n·k/QK·BYTES bytes, as stored) or [n, k/QK·BYTES]; returns [..., n] in x's
    dtype, computed in fp32 (x upcast exactly, W decoded exactly, fp32 products and sums).
    Differentiable in x only: dx = dy · W. W is decoded chunk_rows(n, k) rows at a time in the
    forward and chunk_cols(n, k, QK) block columns at a time in the backward, so no more than
    one chunk of it (≤ CHUNK_BYTES of fp32) exists at once.
    `out`: optional result tensor (inference only)."""
    fn = "dequant_matmul"
    b = check_matmul_args(x, blocks, qtype, n, k, fn)
    needs_grad = torch.is_grad_enabled() and x.requires_grad
    check_mm_out(out, (*x.shape[:-1], n), x.dtype, needs_grad, fn)
    if out is None:
        return _DequantMatmul.apply(x, b, qtype, n, k)
    with torch.no_grad():
        return out.copy_(_forward(_rows_of_x(x, k), b, qtype, n, k).reshape(out.shape))
