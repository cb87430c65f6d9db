"""bitsandbytes: dequantize_4bit of a weight with no columns fails at blocksizes >= 2048.

A [m, 0] NF4 weight holds no elements: its decode is the empty [m, 0] tensor. On the CPU,
dequantize_4bit returns that at blocksizes below 2048 (the native CPU kernel) and raises at
2048 and above (the pure-torch fallback): RuntimeError "cannot reshape tensor of 0 elements
into shape [-1, 0]" (a reshape with -1 against a 0-sized last dim). nf4-kernel-v1's size-0
rule (FALSIFY-NF4-026) is the empty [m, 0] result at every blocksize.

Backs FALSIFY-NF4-026 of nf4-kernel-v1 (found with fresh seeds), for
functional.dequantize_4bit(nf4).
Run: python bitsandbytes_dequantize_4bit_zero_columns.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import numpy as np
import torch

VERSION = importlib.metadata.version("bitsandbytes")
bad = []
for m, bs in ((1, 64), (7, 64), (1, 4096), (7, 4096)):
    state = F.QuantState(absmax=torch.zeros(0), shape=torch.Size((m, 0)), blocksize=bs,
                         quant_type="nf4", dtype=torch.float32,
                         code=F.get_4bit_type("nf4", device="cpu"))
    try:
        got = tuple(F.dequantize_4bit(torch.zeros(0, 1, dtype=torch.uint8), state,
                                      quant_type="nf4").shape)
    except RuntimeError as e:
        got = f"RuntimeError: {' '.join(str(e).split())[:80]}"
    want = np.zeros((m, 0), np.float32).shape
    print(f"input:   packed [0, 1] uint8, absmax [0], shape ({m}, 0), blocksize {bs}, nf4")
    print(f"library: bitsandbytes {VERSION}: dequantize_4bit(...) -> {got}")
    print(f"true:    an empty float32 tensor of shape {want}")
    print("bound:   the shape exactly (no element to compare)")
    if got != want:
        bad.append((m, bs))
reproduces = bool(bad)
print("error:  ", f"(m, blocksize) = {bad} do not decode to [m, 0]" if bad else "none")
print("verdict:", "REPRODUCES: the result differs" if reproduces else "does not reproduce")
sys.exit(1 if reproduces else 0)
