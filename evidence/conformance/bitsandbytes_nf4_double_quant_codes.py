"""bitsandbytes: quantize_4bit(compress_statistics=True) does not store the nearest 8-bit code.

With double quantization the block scales are centred (absmax − offset) and quantized per
256 values with the 8-bit dynamic map by the native CPU quantize_blockwise
(cquantize_blockwise_cpu_fp32). That kernel (a) writes code 0 (the map's −0.993) for a
256-block whose absmax2 = 0, where every scaled value is 0 and the nearest code is the map's
zero (index 127); both decode to the offset there, but the stored codes differ; and (b) at
other values stores a neighbour of the nearest code (one code off).

The nearest code follows the rule of the 4-bit codes: s = (a_b − offset)·fl32(1/max(a2,
1e-38)) clamped to [−1, 1], code = #{k : (c_k + c_{k+1})/2 < s} over the sorted map c
(bitsandbytes' own create_dynamic_map()).

Backs FALSIFY-NF4-008 (nf4-kernel-v1: double quantization codes bit-exact), binding
functional.quantize_4bit(nf4).
Run: python bitsandbytes_nf4_double_quant_codes.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import mpmath
import numpy as np
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("bitsandbytes")
CODE = [mpmath.mpf(v) for v in F.create_dynamic_map().tolist()]
MIDS = [(a + b) / 2 for a, b in zip(CODE, CODE[1:])]


def f32(v):
    return mpmath.mpf(float(np.float32(float(v))))


def nearest_codes(absmax):
    """The contract's codes for a list of block absmax values (one 256-block)."""
    offset = f32(mpmath.fsum(absmax) / len(absmax))  # the exact mean, rounded once
    x = [f32(mpmath.mpf(a) - offset) for a in absmax]
    a2 = max(abs(v) for v in x)
    inv = f32(1 / max(a2, mpmath.mpf("1e-38")))
    s = [min(max(v * inv, -1), 1) for v in x]
    return [sum(1 for m in MIDS if m < v) for v in s], s


bad = []
for name, blocks, n, bs in (
        ("one NF4 block (absmax2 = 0): w [1, 5], blocksize 64", None, 5, 64),
        ("three NF4 blocks of constant values: w [1, 96], blocksize 32",
         [7.396, 5.357, 6.376], 96, 32)):
    if blocks is None:
        w = torch.tensor([[0.5, -1.25, 0.75, 2.0, -0.1]])
        text = "w = [[0.5, -1.25, 0.75, 2.0, -0.1]]"
    else:
        w = torch.tensor(blocks).repeat_interleave(bs)[None]
        text = f"w = each of {blocks} repeated over a block of {bs} (shape [1, {n}])"
    packed, state = F.quantize_4bit(w, blocksize=bs, quant_type="nf4", compress_statistics=True)
    got = state.absmax.tolist()  # the 8-bit codes of the centred block scales
    absmax = [max(abs(v) for v in w.flatten().tolist()[b * bs:(b + 1) * bs])
              for b in range((n + bs - 1) // bs)]
    true, s = nearest_codes(absmax)
    print(f"case FALSIFY-NF4-008: {name}")
    print(f"input:   {text} (float32), quant_type 'nf4', compress_statistics=True")
    print(f"library: bitsandbytes {VERSION}: 8-bit codes {got} (offset {state.offset.item()!r}, "
          f"absmax2 {state.state2.absmax.tolist()})")
    print(f"true:    nearest codes {true} (scaled values {[mpmath.nstr(v, 8) for v in s]}; "
          f"map values {[mpmath.nstr(CODE[c], 8) for c in true]})")
    print("bound:   equal codes (uint8 outputs: atol 0.5)")
    diff = max(abs(a - b) for a, b in zip(got, true))
    print(f"error:   max code difference {diff}")
    bad.append(diff > 0.5)
    print("verdict:", "REPRODUCES: a stored code is not the nearest" if bad[-1]
          else "does not reproduce")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
