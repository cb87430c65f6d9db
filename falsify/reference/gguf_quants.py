"""GGUF block quantization formats q8_0, q4_k and q6_k (pure numpy reference).

The layouts are ggml's block structs (`block_q8_0`, `block_q4_K`, `block_q6_K` in llama.cpp's
ggml/src/ggml-common.h) and their decoders `dequantize_row_q8_0`, `dequantize_row_q4_K`,
`dequantize_row_q6_K` (ggml/src/ggml-quants.c); the quantizer is `quantize_row_q8_0_ref`.
Written from those definitions, restated here; every multi-byte field is little-endian and
every fp16 field is IEEE binary16. A row of a tensor is a sequence of whole blocks.

q8_0, 32 values in 34 bytes:
    bytes 0..1   d (fp16)
    bytes 2..33  q_0..q_31 (int8)
    y_i = d · q_i

q4_k, a super-block of 256 values in 144 bytes, 8 sub-blocks of 32:
    bytes 0..1     d (fp16), the super-block scale of the sub-block scales
    bytes 2..3     dmin (fp16), the super-block scale of the sub-block mins
    bytes 4..15    s_0..s_11: eight 6-bit scales sc_j and eight 6-bit mins m_j, packed
                     j < 4:  sc_j = s_j & 63,            m_j = s_{j+4} & 63
                     j ≥ 4:  sc_j = (s_{j+4} & 15) | (s_{j-4} >> 6) << 4,
                             m_j  = (s_{j+4} >> 4) | (s_j >> 6) << 4
    bytes 16..143  128 bytes of 4-bit quants. Values 64c .. 64c+63 (c = 0..3) use bytes
                   16 + 32c .. 16 + 32c + 31: value 64c + l is the LOW nibble of byte l,
                   value 64c + 32 + l its HIGH nibble.
    y_e = (d · sc_j) · q_e − dmin · m_j,   j = ⌊e / 32⌋

q6_k, a super-block of 256 values in 210 bytes, 16 sub-blocks of 16:
    bytes 0..127    ql: low 4 bits of the quants
    bytes 128..191  qh: high 2 bits of the quants
    bytes 192..207  sc_0..sc_15 (int8)
    bytes 208..209  d (fp16)
    value e = 128n + 32g + l (n ∈ {0, 1}, g ∈ 0..3, l ∈ 0..31):
        low  = (ql[64n + 32·(g mod 2) + l] >> 4·⌊g/2⌋) & 15
        high = (qh[32n + l] >> 2g) & 3
        q_e  = (low | high << 4) − 32   ∈ [−32, 31]
    y_e = (d · sc_{⌊e/16⌋}) · q_e

Arithmetic: ggml converts each fp16 field to fp32 and computes the products and the difference
above in fp32. Every product is exact in fp32 (24-bit significand): an fp16 significand is an
integer ≤ 2047, so d·sc·q is that integer times ≤ 63·15 (q4_k: < 2^21), times |sc·q| ≤ 128·32
= 2^12 (q6_k: ≤ 2047·2^12 < 2^23), times |q| ≤ 128 (q8_0: < 2^18), scaled by a power of two;
none can overflow (≤ 65504·128·32 < 2^28). The one rounded operation is q4_k's
subtraction, fl32(A − B) with A = d·sc·q and B = dmin·m both exact. The reference computes A and
B, and A − B, in float64 — exact: both are integer multiples of 2^-24 (fp16's smallest step)
below 2^26, so A − B needs at most 50 significant bits — and rounds once to float32, which is
fl32(A − B) exactly. Outputs are therefore the bits ggml produces, in any evaluation order
that keeps the subtraction last (an FMA d1·q − m1 rounds the same exact product once: the same
bits). An fp16 subnormal (2^-24 .. 2^-14) is a normal fp32 number and every non-zero result is
a multiple of 2^-24, so no fp32 result is subnormal and flush-to-zero arithmetic cannot change
one; only a conversion from fp16 that flushed subnormal scales would (it is a bug here).
Non-finite fp16 scales follow IEEE arithmetic (inf·0 = NaN, inf − inf = NaN, ±inf otherwise),
the same on every backend; NaN payloads are not specified.

q8_0 quantization (`quantize_row_q8_0_ref`), per block of 32 float32 values x, all in fp32:
    amax = max |x_i|;  d = amax / 127;  id = 1/d if d ≠ 0 else 0
    q_i = roundf(x_i · id)   (round half away from zero)
    (0 < d below about 2^-128, max|x| below about 3.7e-37: id = inf and C leaves the int8
    conversion of ±inf / NaN undefined; the quants are 0 here, what x86 yields)
    stored scale: fp16(d) (round to nearest even); the quants use the unrounded fp32 d.
"""

from __future__ import annotations

import numpy as np

from falsify.arguments import check_qtype

QK8_0 = 32  # values per q8_0 block
Q8_0_BYTES = 34  # 2 (fp16 d) + 32 int8
QK_K = 256  # values per k-quant super-block
Q4_K_BYTES = 144  # 2 (d) + 2 (dmin) + 12 (packed scales and mins) + 128 (4-bit quants)
Q6_K_BYTES = 210  # 128 (ql) + 64 (qh) + 16 (int8 scales) + 2 (d)
# the largest |x| whose block scale amax/127 rounds to a finite fp16: fp16(d) overflows to inf
# from 65520 (half-way to the next binade's first value) on
FP16_OVERFLOW = 65520.0


def _rows_of_blocks(blocks, block_bytes: int, fn: str) -> np.ndarray:
    """`blocks` as uint8 [m, nb·block_bytes]: a 2-D array of byte values 0..255."""
    a = np.asarray(blocks)
    if a.ndim != 2:
        raise ValueError(f"{fn}: blocks must be 2-D [rows, bytes], got shape {a.shape}")
    if a.shape[1] % block_bytes:
        raise ValueError(f"{fn}: a row has {a.shape[1]} bytes, not a multiple of the "
                         f"{block_bytes}-byte block")
    if a.size and (np.any(a != np.round(a)) or a.min() < 0 or a.max() > 255):
        raise ValueError(f"{fn}: blocks must hold byte values 0..255")
    return a.astype(np.uint8)


def _fp16(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The little-endian fp16 field (lo, hi), exactly, as float64."""
    bits = lo.astype(np.uint16) | (hi.astype(np.uint16) << 8)
    return bits.view(np.float16).astype(np.float64)


def _int8(b: np.ndarray) -> np.ndarray:
    """A byte read as two's-complement int8, as int64."""
    b = b.astype(np.int64)
    return np.where(b >= 128, b - 256, b)


def _finish(exact: np.ndarray, m: int, values: int) -> np.ndarray:
    """Round the exact float64 results [m, nb, ·] once to float32 (what ggml's fp32 arithmetic
    yields), as [m, nb·values]."""
    with np.errstate(invalid="ignore", over="ignore"):
        return exact.astype(np.float32).reshape(m, exact.shape[1] * values)


def q8_0_dequantize(blocks, out=None):
    """uint8 [m, 34·nb] → float32 [m, 32·nb]: y = d · q per block. `out` is accepted for the
    backends' signature and ignored (the reference allocates)."""
    b = _rows_of_blocks(blocks, Q8_0_BYTES, "q8_0_dequantize")
    m = b.shape[0]
    blk = b.reshape(m, b.shape[1] // Q8_0_BYTES, Q8_0_BYTES)
    d = _fp16(blk[..., 0], blk[..., 1])  # [m, nb]
    q = _int8(blk[..., 2:])  # [m, nb, 32]
    with np.errstate(invalid="ignore"):
        return _finish(d[..., None] * q, m, QK8_0)


def q4_k_scale_min(s: np.ndarray):
    """The eight 6-bit (scale, min) pairs of a q4_k super-block from its 12 packed bytes
    s[..., 0:12]: two int64 arrays [..., 8]."""
    s = s.astype(np.int64)
    sc = np.empty(s.shape[:-1] + (8,), np.int64)
    mn = np.empty_like(sc)
    for j in range(8):
        if j < 4:
            sc[..., j] = s[..., j] & 63
            mn[..., j] = s[..., j + 4] & 63
        else:
            sc[..., j] = (s[..., j + 4] & 15) | ((s[..., j - 4] >> 6) << 4)
            mn[..., j] = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
    return sc, mn


def q4_k_dequantize(blocks, out=None):
    """uint8 [m, 144·nb] → float32 [m, 256·nb]: y_e = (d·sc_j)·q_e − dmin·m_j, j = ⌊e/32⌋."""
    b = _rows_of_blocks(blocks, Q4_K_BYTES, "q4_k_dequantize")
    m = b.shape[0]
    blk = b.reshape(m, b.shape[1] // Q4_K_BYTES, Q4_K_BYTES)
    d = _fp16(blk[..., 0], blk[..., 1])
    dmin = _fp16(blk[..., 2], blk[..., 3])
    sc, mn = q4_k_scale_min(blk[..., 4:16])  # [m, nb, 8]
    e = np.arange(QK_K)
    j = e // 32  # sub-block of value e
    byte = 16 + 32 * (e // 64) + e % 32  # its byte within the super-block
    shift = 4 * (j % 2)  # even sub-blocks low nibble, odd sub-blocks high nibble
    q = (blk[..., byte].astype(np.int64) >> shift) & 15  # [m, nb, 256]
    with np.errstate(invalid="ignore"):
        a = d[..., None] * sc[..., j] * q  # exact
        c = dmin[..., None] * mn[..., j]  # exact
        return _finish(a - c, m, QK_K)  # exact in float64, rounded once


def q6_k_dequantize(blocks, out=None):
    """uint8 [m, 210·nb] → float32 [m, 256·nb]: y_e = (d·sc_{⌊e/16⌋})·q_e."""
    b = _rows_of_blocks(blocks, Q6_K_BYTES, "q6_k_dequantize")
    m = b.shape[0]
    blk = b.reshape(m, b.shape[1] // Q6_K_BYTES, Q6_K_BYTES)
    d = _fp16(blk[..., 208], blk[..., 209])
    sc = _int8(blk[..., 192:208])  # [m, nb, 16]
    e = np.arange(QK_K)
    n, g, lane = e // 128, (e % 128) // 32, e % 32
    low = (blk[..., 64 * n + 32 * (g % 2) + lane].astype(np.int64) >> (4 * (g // 2))) & 15
    high = (blk[..., 128 + 32 * n + lane].astype(np.int64) >> (2 * g)) & 3
    q = (low | (high << 4)) - 32
    with np.errstate(invalid="ignore"):
        return _finish(d[..., None] * sc[..., e // 16] * q, m, QK_K)


def roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf (half away from zero) on float32 values, exactly: floor(|v|) plus 1 when the
    fraction is ≥ 1/2. Every step is exact in float32, unlike floor(|v| + 0.5), which rounds
    0.49999997 + 0.5 up to 1."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + np.floor((a - f) * np.float32(2)), v)


def q8_0_quantize(x, out=None):
    """float32 [m, 32·nb] → uint8 [m, 34·nb] in ggml's q8_0 layout (see the module docstring).
    Raises ValueError for non-finite values and for a block whose scale overflows fp16."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"q8_0_quantize: x must be 2-D [rows, values], got shape {x.shape}")
    if x.shape[1] % QK8_0:
        raise ValueError(f"q8_0_quantize: a row has {x.shape[1]} values, not a multiple of 32")
    x32 = x.astype(np.float32)
    if not np.all(np.isfinite(x32)):
        raise ValueError("q8_0_quantize: input has non-finite values")
    m = x32.shape[0]
    blk = x32.reshape(m, x32.shape[1] // QK8_0, QK8_0)
    amax = np.abs(blk).max(axis=-1, initial=np.float32(0))  # [m, nb], exact
    if np.any(amax / np.float32(127) >= np.float32(FP16_OVERFLOW)):
        raise ValueError("q8_0_quantize: a block's scale max|x|/127 overflows fp16")
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (blk * inv[..., None]).astype(np.float32)
    # 0 < d below about 2^-128 (max|x| < 3.7e-37): 1/d overflows and v is ±inf or NaN, whose
    # conversion to int8 is undefined in C (x86 yields 0). Defined here as 0, which the block's
    # fp16 scale (0: d is far below fp16's range) decodes to anyway.
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.where(np.isfinite(v), roundf(v), 0).astype(np.int8)
    d16 = d.astype(np.float16).view(np.uint16)
    res = np.empty((m, blk.shape[1], Q8_0_BYTES), np.uint8)
    res[..., 0] = d16 & 255
    res[..., 1] = d16 >> 8
    res[..., 2:] = q.view(np.uint8)
    return res.reshape(m, blk.shape[1] * Q8_0_BYTES)


# ---------------------------------------------------------------------------------------------
# Dequantize-matmul: the frozen quantized base of a (Q)LoRA linear layer.
#
#     y = x · Wᵀ,   W = dequantize(blocks) as an [n, k] matrix,   x ∈ ℝ^{… × k},  y ∈ ℝ^{… × n}
#     ∂L/∂x = dy · W   (W is frozen: the bytes get no gradient)
#
# Row r of W is the r-th run of k/values_per_block blocks (GGUF stores a 2-D weight [n, k] as n
# rows of whole blocks, ggml's ne0 = k the fastest axis). `blocks` is uint8, either the raw flat
# tensor data (n·k/QK·BYTES bytes) or [n, k/QK·BYTES]; `qtype` names the format.

QTYPES = {  # name -> (values per block, bytes per block)
    "q8_0": (QK8_0, Q8_0_BYTES),
    "q4_k": (QK_K, Q4_K_BYTES),
    "q6_k": (QK_K, Q6_K_BYTES),
}
GGML_TYPE_NAMES = {8: "q8_0", 12: "q4_k", 14: "q6_k"}  # ggml_type ids in a GGUF tensor header


def weight(blocks, qtype, n, k, fn="dequant_matmul") -> np.ndarray:
    """The dequantized weight W [n, k] (float32 values, exactly ggml's), as float64."""
    qk, nbytes = check_qtype(qtype, n, k, fn, QTYPES)
    b = np.asarray(blocks)
    row = k // qk * nbytes
    if b.shape not in ((n * row,), (n, row)):
        raise ValueError(f"{fn}: blocks must hold {n} rows of {row} bytes ({qtype}, k = {k}): "
                         f"shape ({n * row},) or ({n}, {row}), got {b.shape}")
    dequant = {"q8_0": q8_0_dequantize, "q4_k": q4_k_dequantize, "q6_k": q6_k_dequantize}
    return dequant[qtype](b.reshape(n, row)).astype(np.float64)


def _check_x(x, k, fn):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"{fn}: x must be [..., k = {k}], got shape {x.shape}")
    return x


def dequant_matmul(x, blocks, qtype, n, k, out=None):
    """y = x · Wᵀ [..., n] in float64 with W = dequantize(blocks) [n, k]. `out` is accepted for
    the backends' signature and ignored (the reference allocates)."""
    w = weight(blocks, qtype, n, k)
    return _check_x(x, k, "dequant_matmul") @ w.T


def dequant_matmul_backward(x, blocks, qtype, n, k, dy, out=None):
    """{x: dy · W}: the only gradient (the blocks are frozen bytes)."""
    w = weight(blocks, qtype, n, k, "dequant_matmul_backward")
    x = _check_x(x, k, "dequant_matmul_backward")
    dy = np.asarray(dy, dtype=np.float64)
    if dy.shape != x.shape[:-1] + (n,):
        raise ValueError(f"dequant_matmul_backward: dy must be {x.shape[:-1] + (n,)}, got "
                         f"{dy.shape}")
    return {"x": dy @ w}


# Test-input builders (the contract's `build:`): raw random bytes with every fp16 scale field
# rewritten to a finite value of magnitude below 2^(emax − 14), keeping the drawn sign and
# mantissa and folding the drawn exponent into 0..emax (0: zero and subnormal scales). A field
# whose drawn bits are all ones (a 0xFF fill) becomes the largest such value: the max scale.
# emax bounds every weight by |W| < 2 (q8_0: 128·2^-6; q4_k: (63·15 + 63)·2^-9; q6_k:
# 128·32·2^-11), which the contract's tolerances assume; every other byte (quants, 6-bit
# scales and mins, int8 scales) keeps its drawn value, so all of their patterns occur.
W_BOUND = 2.0


def _bounded(blocks, nbytes: int, fields: tuple, emax: int) -> np.ndarray:
    a = np.asarray(blocks)
    b = a.astype(np.int64).reshape(a.shape[:-1] + (a.shape[-1] // nbytes, nbytes)).copy()
    for off in fields:
        bits = b[..., off] | (b[..., off + 1] << 8)
        mag = np.where((bits & 0x7FFF) == 0x7FFF, (emax << 10) | 1023,
                       (((bits >> 10) & 31) % (emax + 1)) << 10 | (bits & 1023))
        bits = (bits & 0x8000) | mag
        b[..., off], b[..., off + 1] = bits & 255, bits >> 8
    return b.reshape(a.shape).astype(a.dtype)


def bounded_q8_0(blocks):
    """Raw q8_0 bytes [..., 34·nb] → the same with |d| < 2^-6 (|W| < 2); see `_bounded`."""
    return _bounded(blocks, Q8_0_BYTES, (0,), 8)


def bounded_q4_k(blocks):
    """Raw q4_k bytes [..., 144·nb] → the same with |d|, |dmin| < 2^-9 (|W| < 2), either sign
    (a negative dmin adds its min)."""
    return _bounded(blocks, Q4_K_BYTES, (0, 2), 5)


def bounded_q6_k(blocks):
    """Raw q6_k bytes [..., 210·nb] → the same with |d| < 2^-11 (|W| < 2)."""
    return _bounded(blocks, Q6_K_BYTES, (208,), 3)
