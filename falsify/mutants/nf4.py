"""NF4 mutants: real packing / indexing / rounding bugs the nf4 contract's checks must catch.
Each has the signature of the function it replaces."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (interpreter switch: must run before `import triton`)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.launch import cdiv, log2_exact, nf4_block_of, nf4_byte_of
from falsify.kernels.torch import nf4 as _t
from falsify.kernels.triton import nf4 as _x


def nibble_order_swapped(w, blocksize=64, double_quant=False, out=None):
    """Element 2i packed into the LOW nibble (the layout of some other 4-bit formats): every
    byte is the bitsandbytes byte with its nibbles exchanged."""
    packed, *rest = _t.nf4_quantize(w, blocksize, double_quant)
    swapped = ((packed & 15) << 4) | (packed >> 4)
    if out is not None:
        swapped = out.copy_(swapped)
    return (swapped, *rest)


def absmax_off_by_one_block(packed, absmax, shape, blocksize=64, absmax2=None, offset=None,
                            dtype=None, out=None):
    """Scale element i with the absmax of the NEXT block (clamped at the last one)."""
    shape = _t.check_shape(shape)
    n, nested = _t.check_state(packed, absmax, shape, blocksize, absmax2, offset)
    code, _, _, _ = _t.tables()
    scale = _t.decode_absmax(absmax, absmax2, offset) if nested else absmax.reshape(-1).float()
    i = torch.arange(n)
    nib = (packed.reshape(-1)[nf4_byte_of(i)].int() >> ((1 - (i & 1)) << 2)) & 15
    blk = (nf4_block_of(i, log2_exact(blocksize)) + 1).clamp_max(scale.numel() - 1)
    values = (code[nib.long()] * scale[blk]).to(_t.output_dtype(dtype)).view(shape)
    return values if out is None else out.copy_(values)


def round_down_not_nearest(w, blocksize=64, double_quant=False, out=None):
    """Truncating quantizer: the largest code ≤ scaled value instead of the nearest code."""
    blocksize = _t.check_blocksize(blocksize)
    x = _t.check_input(w).reshape(-1).float()
    n = x.numel()
    code, _, _, _ = _t.tables()
    nb = cdiv(n, blocksize)
    padded = x.new_zeros(nb * blocksize)
    padded[:n] = x.abs()
    absmax = padded.view(nb, blocksize).amax(1)
    scaled = (x / absmax.clamp_min(1e-38)[torch.arange(n) // blocksize]).clamp(-1, 1)
    idx = (torch.bucketize(scaled, code, right=True) - 1).clamp(0, 15)
    if n % 2:
        idx = torch.cat([idx, idx.new_tensor([_t.ZERO_CODE])])
    packed = ((idx[0::2] << 4) | idx[1::2]).to(torch.uint8)
    if out is not None:
        packed = out.copy_(packed)
    if not double_quant:
        return packed, absmax
    return (packed, *_t.quantize_absmax(absmax))


def offset_dropped(packed, absmax, shape, blocksize=64, absmax2=None, offset=None, dtype=None,
                   out=None):
    """Double-quantized absmax decoded without adding the offset back."""
    if offset is not None:
        offset = torch.zeros_like(offset)
    return _t.nf4_dequantize(packed, absmax, shape, blocksize, absmax2, offset, dtype, out)


@triton.jit
def _dequantize_lo_hi_kernel(packed_ptr, absmax_ptr, code_ptr, out_ptr, n, ncols, stride_p,
                             stride_a, stride_o0, stride_o1, LOG2_BS: tl.constexpr,
                             BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    byte = pid * BLOCK + tl.arange(0, BLOCK)
    even = 2 * byte
    odd = even + 1
    b = tl.load(packed_ptr + byte * stride_p, mask=even < n, other=0).to(tl.int32)
    c_even = tl.load(code_ptr + (b & 15))  # BUG: even element read from the low nibble
    c_odd = tl.load(code_ptr + ((b >> 4) & 15))
    a = tl.load(absmax_ptr + (even >> LOG2_BS) * stride_a, mask=even < n, other=0.0)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + (even // ncols) * stride_o0 + (even % ncols) * stride_o1,
             (c_even * a).to(ty), mask=even < n)
    tl.store(out_ptr + (odd // ncols) * stride_o0 + (odd % ncols) * stride_o1,
             (c_odd * a).to(ty), mask=odd < n)


@triton.jit
def _dequantize_unmasked_tail_kernel(packed_ptr, absmax_ptr, code_ptr, out_ptr, n, ncols,
                                     stride_p, stride_a, stride_o0, stride_o1,
                                     LOG2_BS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    byte = pid * BLOCK + tl.arange(0, BLOCK)
    even = 2 * byte
    odd = even + 1
    live = byte < (n + 1) // 2
    b = tl.load(packed_ptr + byte * stride_p, mask=live, other=0).to(tl.int32)
    a = tl.load(absmax_ptr + (even >> LOG2_BS) * stride_a, mask=live, other=0.0)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + (even // ncols) * stride_o0 + (even % ncols) * stride_o1,
             (tl.load(code_ptr + ((b >> 4) & 15)) * a).to(ty), mask=live)
    # BUG: the odd element of the last byte is written even when n is odd (one past the end)
    tl.store(out_ptr + (odd // ncols) * stride_o0 + (odd % ncols) * stride_o1,
             (tl.load(code_ptr + (b & 15)) * a).to(ty), mask=live)


def _launch_dequant_mutant(kernel, packed, absmax, shape, blocksize, absmax2, offset, dtype,
                           out):
    blocksize = _t.check_blocksize(blocksize)
    shape = _t.check_shape(shape)
    n, nested = _t.check_state(packed, absmax, shape, blocksize, absmax2, offset)
    dt = _t.output_dtype(dtype)
    scale = _x.decode_absmax(absmax, absmax2, offset) if nested else absmax.reshape(-1)
    packed = packed.reshape(-1)
    if out is None:
        out = torch.empty(shape, dtype=dt)
    _, ncols, so0, so1 = _x._as_2d(out, "out")
    cfg = _x.launch_config(n, blocksize)
    code, _, _, _ = _t.tables()
    kernel[(cfg["dequant_grid"],)](packed, scale, code, out, n, ncols, packed.stride(0),
                                   scale.stride(0), so0, so1, LOG2_BS=cfg["LOG2_BS"],
                                   BLOCK=cfg["dequant_block"])
    return out


def triton_nibble_order_swapped(packed, absmax, shape, blocksize=64, absmax2=None, offset=None,
                                dtype=None, out=None):
    """Triton dequantize that reads element 2i from the low nibble."""
    return _launch_dequant_mutant(_dequantize_lo_hi_kernel, packed, absmax, shape, blocksize,
                                  absmax2, offset, dtype, out)


def triton_unmasked_tail(packed, absmax, shape, blocksize=64, absmax2=None, offset=None,
                         dtype=None, out=None):
    """Triton dequantize whose odd-lane store is masked by the byte count, not the element
    count: for odd n it writes one element past the end of `out`."""
    return _launch_dequant_mutant(_dequantize_unmasked_tail_kernel, packed, absmax, shape,
                                  blocksize, absmax2, offset, dtype, out)


def roundtrip_round_down(w, blocksize=64, double_quant=False):
    """Round trip through the truncating quantizer (largest code ≤ value)."""
    state = round_down_not_nearest(w, blocksize, double_quant)
    extra = {"absmax2": state[2], "offset": state[3]} if double_quant else {}
    return _t.nf4_dequantize(state[0], state[1], w.shape, blocksize, dtype=w.dtype, **extra)


def roundtrip_absmax_off_by_one(w, blocksize=64, double_quant=False):
    """Round trip whose decoder scales with the next block's absmax."""
    state = _t.nf4_quantize(w, blocksize, double_quant)
    extra = {"absmax2": state[2], "offset": state[3]} if double_quant else {}
    return absmax_off_by_one_block(state[0], state[1], w.shape, blocksize, dtype=w.dtype,
                                   **extra)
