"""bitsandbytes: the double-quantization offset is a float32 mean, not the exact mean.

quantize_4bit(compress_statistics=True) centres the block scales by `offset =
_absmax.mean()`, a float32 reduction (a rounded sum, then a rounded division), and
absmax2 = max|absmax − offset| moves with it; the format's offset is the mean of the block
scales rounded once to float32. For a single all-zero tail block the offset is the 1e-38
floor that quantize_4bit stores as that block's absmax (see
bitsandbytes_nf4_tail_block_absmax_floor.py), where the mean of absmax = [0] is 0.

Backs FALSIFY-NF4-009 (nf4-kernel-v1: absmax2 and offset bit-exact), binding
functional.quantize_4bit(nf4).
Run: python bitsandbytes_nf4_double_quant_offset.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import mpmath
import numpy as np
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("bitsandbytes")


def f32(v):
    return float(np.float32(float(v)))


bad = []
for name, blocks, bs, shape in (("three constant blocks", [0.909, 3.13, 4.134], 32, (1, 96)),
                                ("one all-zero tail block", [0.0], 32, (1, 1))):
    w = torch.tensor(blocks).repeat_interleave(bs)[None][:, :shape[1]]
    _, state = F.quantize_4bit(w, blocksize=bs, quant_type="nf4", compress_statistics=True)
    absmax = [f32(v) for v in blocks]  # max|x| of each block: the block's constant value
    offset = f32(mpmath.fsum(mpmath.mpf(a) for a in absmax) / len(absmax))  # exact, rounded once
    absmax2 = max(abs(f32(mpmath.mpf(a) - mpmath.mpf(offset))) for a in absmax)
    got = (state.offset.item(), state.state2.absmax.item())
    print(f"case FALSIFY-NF4-009: {name}")
    print(f"input:   w = each of {blocks} (float32) repeated over a block of {bs}, shape "
          f"{list(shape)}; quant_type 'nf4', compress_statistics=True")
    print(f"library: bitsandbytes {VERSION}: offset = {got[0]!r}, absmax2 = {got[1]!r}")
    print(f"true:    offset = {offset!r} (mean of the block absmax, rounded once), "
          f"absmax2 = {absmax2!r}")
    # FALSIFY-NF4-009: rtol 9.09e-13 (2^-40): the exact mean rounded once and a max of float32
    # differences leave no free rounding, so bit equality
    bounds = [9.094947e-13 * abs(offset), 9.094947e-13 * abs(absmax2)]
    errs = [abs(got[0] - offset), abs(got[1] - absmax2)]
    print(f"bound:   {bounds[0]:.3g} (offset), {bounds[1]:.3g} (absmax2): bit-exact")
    print(f"error:   offset {errs[0]:.3g}, absmax2 {errs[1]:.3g}")
    bad.append(errs[0] > bounds[0] or errs[1] > bounds[1])
    print("verdict:", "REPRODUCES: offset / absmax2 not the exact values" if bad[-1]
          else "does not reproduce")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
