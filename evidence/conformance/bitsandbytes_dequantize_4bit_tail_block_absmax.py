"""bitsandbytes: CPU dequantize_4bit reads the wrong absmax for a 2-D weight's tail block.

A weight of m > 1 rows whose element count is not a multiple of the blocksize ends in a
partial block. Quantization indexes blocks over the flattened weight (block b holds elements
b·bs … b·bs + bs − 1, each with its own absmax[b]), but dequantize_4bit on the CPU scales the
tail block's elements by absmax[0]: for a [3, 64] weight at blocksize 128, elements 128 … 191
(row 2) come back scaled by the first block's absmax. A 1-D [192] or a one-row [1, 192]
weight decodes right; so does any shape whose size the blocksize divides.

Backs FALSIFY-NF4-004/float32 of nf4-kernel-v1 (found with fresh seeds: a [3, 64] case at
blocksize 128), for functional.dequantize_4bit(nf4).
Run: python bitsandbytes_dequantize_4bit_tail_block_absmax.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import mpmath
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("bitsandbytes")
EPS32 = 2.0 ** -23

SHAPE, BS = (3, 64), 128
N = SHAPE[0] * SHAPE[1]
packed = torch.zeros(N // 2, 1, dtype=torch.uint8)  # every code 0: NF4 value -1.0
absmax = torch.tensor([63.696167, 26.978672], dtype=torch.float32)  # one per block of 128
state = F.QuantState(absmax=absmax, shape=torch.Size(SHAPE), blocksize=BS, quant_type="nf4",
                     dtype=torch.float32, code=F.get_4bit_type("nf4", device="cpu"))
y = F.dequantize_4bit(packed, state, quant_type="nf4").reshape(-1).numpy()

code0 = float(F.get_4bit_type("nf4", device="cpu")[0])  # the NF4 table's first value
true = [mpmath.mpf(code0) * mpmath.mpf(float(absmax[i // BS])) for i in range(N)]
err = [abs(mpmath.mpf(float(v)) - t) for v, t in zip(y, true)]
worst = max(range(N), key=lambda i: err[i])
# FALSIFY-NF4-004 float32: one rounding of code·absmax, atol the smallest subnormal
bound = mpmath.mpf(1.5e-45) + mpmath.mpf(EPS32 / 2) * abs(true[worst])
bad = sum(e > mpmath.mpf(1.5e-45) + mpmath.mpf(EPS32 / 2) * abs(t) for e, t in zip(err, true))

print(f"input:   packed = {N // 2} zero bytes (codes 0), absmax = {absmax.tolist()}, "
      f"shape {SHAPE}, blocksize {BS}, quant_type nf4, float32")
print(f"library: bitsandbytes {VERSION}: dequantize_4bit(...)[flat {worst}] = {float(y[worst])!r}"
      f" ({bad} of {N} elements off)")
print(f"true:    code[0]·absmax[{worst} // {BS}] = {mpmath.nstr(true[worst], 17)}")
print(f"bound:   {mpmath.nstr(bound, 6)} (one fp32 rounding: eps/2·|true| + 1.5e-45)")
print(f"error:   {mpmath.nstr(err[worst], 6)}")
reproduces = bad > 0
print("verdict:", "REPRODUCES: error > bound" if reproduces
      else "does not reproduce: error <= bound")
sys.exit(1 if reproduces else 0)
