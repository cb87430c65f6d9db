"""NF4 quantize / dequantize as Triton kernels, in bitsandbytes' format: packed data and absmax
are bit-identical to bitsandbytes' quantize_4bit; double-quantization statistics agree only
within one 8-bit code and two fp32 steps of the offset (see `falsify.reference.nf4`).

The algorithm and its rounding rules are documented in `falsify.reference.nf4`. Kernels:

* `_nf4_quantize_kernel`: one program quantizes G whole blocks. Each block is loaded as two
  [G, blocksize/2] tiles, the even and the odd elements, so the pair that shares a byte sits in
  the same lane: byte = (even code << 4) | odd code (element 2i in the HIGH nibble). Masked-off
  odd lanes load 0.0, which is exactly bitsandbytes' padding value for odd n (code 7).
* `_nf4_dequantize_kernel`: one program decodes BLOCK bytes = 2*BLOCK elements.
* `_blockwise8_quantize_kernel` / `_absmax_decode_kernel`: the double-quantization pair
  (8-bit dynamic code over absmax − offset, blocksize 256).

Nearest code = number of float32 midpoints strictly below the scaled value, found with a
branchless binary search over the sorted midpoint table (`_bucketize`): ties go to the lower
code, as torch.bucketize(right=False) and bitsandbytes' CUDA decision tree (strict `>`) do.
The reciprocal 1/absmax uses `div_rn` (correctly rounded) because Triton's default fp32 division
on GPU is approximate and would move values across bucket edges.

Every tensor is addressed through explicit strides and every load/store is masked, so inputs and
outputs may be strided views into larger buffers (the contract's poisoned-margin checks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import falsify.kernels.triton
from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, log2_exact
from falsify.kernels.torch import nf4 as _t

__all__ = ["nf4_quantize", "nf4_dequantize", "nf4_roundtrip"]

QUANT_TILE = 4096  # elements per quantize program (G blocks of `blocksize`)
DEQUANT_BYTES = 2048  # bytes per dequantize program (4096 elements)
ABSMAX_TILE = 256  # absmax values per decode program (= the double-quant blocksize)


def launch_config(n, blocksize):
    """Pure function of the shapes (no driver queries). For n elements and a power-of-two
    blocksize: G blocks per quantize program, the grids of the four kernels."""
    nblocks = cdiv(n, blocksize)
    g = max(1, QUANT_TILE // blocksize)
    return {
        "G": g,
        "HALF": blocksize // 2,
        "LOG2_BS": log2_exact(blocksize),
        "quant_grid": cdiv(nblocks, g),
        "dequant_block": DEQUANT_BYTES,
        "dequant_grid": cdiv(cdiv(n, 2), DEQUANT_BYTES),
        "absmax_grid": cdiv(nblocks, ABSMAX_TILE),
    }


@triton.jit
def _bucketize(s, mid_ptr, LOG2_NCODES: tl.constexpr):
    """Count of midpoints < s (table of 2^LOG2_NCODES − 1 sorted values). Each probe index is
    at most 2^LOG2_NCODES − 2, so the table is never read out of bounds."""
    lo = tl.zeros(s.shape, tl.int32)
    for k in tl.static_range(LOG2_NCODES):
        # probe step 2^(LOG2_NCODES-1-k), a compile-time constant of the unrolled loop
        m = tl.load(mid_ptr + lo + ((1 << (LOG2_NCODES - 1 - k)) - 1))
        lo = tl.where(m < s, lo + (1 << (LOG2_NCODES - 1 - k)), lo)
    return lo


@triton.jit
def _flat_offset(e, ncols, stride0, stride1):
    """Memory offset of flat (row-major) element e of a 2-D view."""
    return (e // ncols).to(tl.int64) * stride0 + (e % ncols).to(tl.int64) * stride1


@triton.jit
def _nf4_quantize_kernel(w_ptr, packed_ptr, absmax_ptr, mid_ptr, n, ncols, nblocks,
                         stride_w0, stride_w1, stride_p, stride_a,
                         G: tl.constexpr, HALF: tl.constexpr):
    pid = tl.program_id(0)
    blk = pid * G + tl.arange(0, G)
    pair = blk[:, None] * HALF + tl.arange(0, HALF)[None, :]  # byte index = element // 2
    even = 2 * pair
    odd = even + 1
    xe = tl.load(w_ptr + _flat_offset(even, ncols, stride_w0, stride_w1), mask=even < n,
                 other=0.0).to(tl.float32)
    xo = tl.load(w_ptr + _flat_offset(odd, ncols, stride_w0, stride_w1), mask=odd < n,
                 other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(xe), axis=1), tl.max(tl.abs(xo), axis=1))
    # bitsandbytes clamps absmax to 1e-38 first: an all-zero block scales to 0 (code 7)
    # 1e-38 is below fp32's smallest normal, so a bare literal is typed fp64 and Triton 3.6
    # refuses the mixed max: the floor is built as the fp32 value (the subnormal 1e-38f)
    inv = tl.math.div_rn(tl.full([G], 1.0, tl.float32),
                         tl.maximum(amax, tl.full([G], 1e-38, tl.float32)))
    se = tl.minimum(tl.maximum(xe * inv[:, None], -1.0), 1.0)
    so = tl.minimum(tl.maximum(xo * inv[:, None], -1.0), 1.0)
    qe = _bucketize(se, mid_ptr, 4)
    qo = _bucketize(so, mid_ptr, 4)
    tl.store(packed_ptr + pair.to(tl.int64) * stride_p, ((qe << 4) | qo).to(tl.uint8),
             mask=even < n)
    tl.store(absmax_ptr + blk.to(tl.int64) * stride_a, amax, mask=blk < nblocks)


@triton.jit
def _nf4_dequantize_kernel(packed_ptr, absmax_ptr, code_ptr, out_ptr, n, ncols, stride_p,
                           stride_a, stride_o0, stride_o1, LOG2_BS: tl.constexpr,
                           BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    byte = pid * BLOCK + tl.arange(0, BLOCK)
    even = 2 * byte
    odd = even + 1
    b = tl.load(packed_ptr + byte.to(tl.int64) * stride_p, mask=even < n, other=0).to(tl.int32)
    c_hi = tl.load(code_ptr + ((b >> 4) & 15))  # nibble ∈ [0, 15]: always inside the table
    c_lo = tl.load(code_ptr + (b & 15))
    # blocksize is even, so both elements of a byte share one absmax
    a = tl.load(absmax_ptr + (even >> LOG2_BS).to(tl.int64) * stride_a, mask=even < n,
                other=0.0)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + _flat_offset(even, ncols, stride_o0, stride_o1), (c_hi * a).to(ty),
             mask=even < n)
    tl.store(out_ptr + _flat_offset(odd, ncols, stride_o0, stride_o1), (c_lo * a).to(ty),
             mask=odd < n)


@triton.jit
def _blockwise8_quantize_kernel(absmax_ptr, offset_ptr, q_ptr, absmax2_ptr, mid_ptr, nb,
                                stride_a, BS: tl.constexpr):
    """Double quantization: (absmax − offset) per block of BS=256 to the 8-bit dynamic code."""
    pid = tl.program_id(0)
    offs = pid * BS + tl.arange(0, BS)
    m = offs < nb
    x = tl.load(absmax_ptr + offs.to(tl.int64) * stride_a, mask=m, other=0.0)
    x = tl.where(m, x - tl.load(offset_ptr), 0.0)
    amax = tl.max(tl.abs(x), axis=0)
    inv = tl.math.div_rn(tl.full([], 1.0, tl.float32),
                         tl.maximum(amax, tl.full([], 1e-38, tl.float32)))  # fp32 floor, as above
    s = tl.minimum(tl.maximum(x * inv, -1.0), 1.0)
    q = _bucketize(s, mid_ptr, 8)
    tl.store(q_ptr + offs, q.to(tl.uint8), mask=m)
    tl.store(absmax2_ptr + pid, amax)


@triton.jit
def _absmax_decode_kernel(q_ptr, absmax2_ptr, offset_ptr, code2_ptr, out_ptr, nb, stride_q,
                          stride_a2, BLOCK: tl.constexpr):
    """absmax[b] = code2[q[b]] * absmax2[b // 256] + offset (float32)."""
    pid = tl.program_id(0)
    b = pid * BLOCK + tl.arange(0, BLOCK)
    m = b < nb
    q = tl.load(q_ptr + b.to(tl.int64) * stride_q, mask=m, other=0).to(tl.int32)
    a2 = tl.load(absmax2_ptr + (b >> 8).to(tl.int64) * stride_a2, mask=m, other=0.0)
    # On a GPU this multiply-add may contract to one FMA (one rounding instead of two); the
    # contract's dequantize tolerance allows that ulp.
    tl.store(out_ptr + b, tl.load(code2_ptr + q) * a2 + tl.load(offset_ptr), mask=m)


def _as_2d(t: torch.Tensor, name: str):
    """(rows, cols, stride0, stride1) of a tensor seen as row-major [rows, cols]."""
    if t.dim() == 1:
        return 1, t.shape[0], 0, t.stride(0)
    if t.dim() == 2:
        return t.shape[0], t.shape[1], t.stride(0), t.stride(1)
    try:
        v = t.view(-1, t.shape[-1])
    except RuntimeError as e:
        raise ValueError(f"{name}: a {t.dim()}-D tensor must be viewable as 2-D") from e
    return v.shape[0], v.shape[1], v.stride(0), v.stride(1)


def _tables(device):
    return _t.tables(device)


def _nf4_code():
    """The NF4 code table the kernels gather from (pinned by value in the contract)."""
    return _tables("cpu")[0]


def _quantize_absmax(absmax: torch.Tensor):
    """Double quantization: (qabsmax uint8 [nb], absmax2 float32 [cdiv(nb, 256)], offset[1])."""
    nb = absmax.numel()
    _, _, _, dyn_mid = _tables(absmax.device)
    offset = absmax.double().mean().float().reshape(1)  # exact mean, rounded once
    q = torch.empty(nb, dtype=torch.uint8, device=absmax.device)
    absmax2 = torch.empty(cdiv(nb, ABSMAX_TILE), dtype=torch.float32, device=absmax.device)
    _blockwise8_quantize_kernel[(cdiv(nb, ABSMAX_TILE),)](
        absmax, offset, q, absmax2, dyn_mid, nb, absmax.stride(0), BS=ABSMAX_TILE)
    return q, absmax2, offset


def decode_absmax(qabsmax, absmax2, offset) -> torch.Tensor:
    nb = qabsmax.numel()
    _, _, dyn, _ = _tables(qabsmax.device)
    q = qabsmax.reshape(-1) if qabsmax.dim() != 1 else qabsmax
    a2 = absmax2.reshape(-1).float() if absmax2.dim() != 1 else absmax2.float()
    out = torch.empty(nb, dtype=torch.float32, device=qabsmax.device)
    _absmax_decode_kernel[(cdiv(nb, ABSMAX_TILE),)](
        q, a2, offset.reshape(-1).float(), dyn, out, nb, q.stride(0), a2.stride(0),
        BLOCK=ABSMAX_TILE)
    return out


def nf4_quantize(w, blocksize=64, double_quant=False, out=None):
    """See falsify.reference.nf4.nf4_quantize; `out` is an optional uint8 [cdiv(n, 2)] (any
    stride) for the packed bytes."""
    blocksize = _t.check_blocksize(blocksize)
    _t.check_input(w, triton_dtypes())
    n = w.numel()
    if w.dtype == torch.bfloat16 and falsify.kernels.triton.INTERPRETED:
        raise NotImplementedError("bf16 loads are broken in the Triton interpreter; use a GPU")
    cfg = launch_config(n, blocksize)
    _, ncols, s0, s1 = _as_2d(w, "w")
    nbytes, nblocks = cdiv(n, 2), cdiv(n, blocksize)
    if out is None:
        out = torch.empty(nbytes, dtype=torch.uint8, device=w.device)
    elif out.dtype != torch.uint8 or out.dim() != 1 or out.numel() != nbytes:
        raise ValueError(f"out must be a 1-D uint8 tensor of {nbytes} bytes, got {out.dtype} "
                         f"{tuple(out.shape)}")
    absmax = torch.empty(nblocks, dtype=torch.float32, device=w.device)
    _, mid, _, _ = _tables(w.device)
    _nf4_quantize_kernel[(cfg["quant_grid"],)](
        w, out, absmax, mid, n, ncols, nblocks, s0, s1, out.stride(0), absmax.stride(0),
        G=cfg["G"], HALF=cfg["HALF"])
    if not double_quant:
        return out, absmax
    return (out, *_quantize_absmax(absmax))


def nf4_dequantize(packed, absmax, shape, blocksize=64, absmax2=None, offset=None, dtype=None,
                   out=None):
    """See falsify.reference.nf4.nf4_dequantize. `out`: optional preallocated tensor of
    `shape` and `dtype` (any strides)."""
    blocksize = _t.check_blocksize(blocksize)
    shape = _t.check_shape(shape)
    n, nested = _t.check_state(packed, absmax, shape, blocksize, absmax2, offset)
    # no dtype: the preallocated `out` decides, else float32
    dt = _t.output_dtype(dtype if dtype is not None or out is None else out.dtype,
                         triton_dtypes())
    if dt == torch.bfloat16 and falsify.kernels.triton.INTERPRETED:
        raise NotImplementedError("bf16 stores are broken in the Triton interpreter; use a GPU")
    if packed.dim() != 1:
        packed = packed.reshape(-1)
    scale = decode_absmax(absmax, absmax2, offset) if nested else absmax
    if scale.dim() != 1:
        scale = scale.reshape(-1)
    if scale.dtype != torch.float32:
        raise TypeError(f"absmax must be float32, got {scale.dtype}")
    if out is None:
        out = torch.empty(shape, dtype=dt, device=packed.device)
    elif tuple(out.shape) != shape or out.dtype != dt:
        raise ValueError(f"out must be {dt} {shape}, got {out.dtype} {tuple(out.shape)}")
    _, ncols, so0, so1 = _as_2d(out, "out")
    cfg = launch_config(n, blocksize)
    code, _, _, _ = _tables(packed.device)
    _nf4_dequantize_kernel[(cfg["dequant_grid"],)](
        packed, scale, code, out, n, ncols, packed.stride(0), scale.stride(0), so0, so1,
        LOG2_BS=cfg["LOG2_BS"], BLOCK=cfg["dequant_block"])
    return out


def nf4_roundtrip(w, blocksize=64, double_quant=False):
    """dequantize(quantize(w)) in w's dtype and shape, both steps as Triton kernels."""
    state = nf4_quantize(w, blocksize, double_quant)
    extra = {"absmax2": state[2], "offset": state[3]} if double_quant else {}
    return nf4_dequantize(state[0], state[1], w.shape, blocksize, dtype=w.dtype, **extra)
