"""bitsandbytes: dequantize_4bit returns a transposed tensor when the packed data has one row.

functional.dequantize_4bit ends with `if A.shape[0] == 1: return out.t()` (a shim for
callers passing the packed weight as [1, (N·K + 1)//2]); quantize_4bit's own layout is a
[⌈n/2⌉, 1] column, so any weight of n ≤ 2 elements (one packed byte) comes back transposed:
a (1, 2) weight decodes to a (2, 1) tensor. The values are right; the shape is not the
QuantState's.

Backs FALSIFY-NF4-010 (dequantize_4bit), FALSIFY-NF4-006/float16 and FALSIFY-NF4-011 (the
quantize_4bit → dequantize_4bit round trip) of nf4-kernel-v1.
Run: python bitsandbytes_dequantize_4bit_single_row_transpose.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import mpmath
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("bitsandbytes")
# the NF4 code book (QLoRA, Dettmers et al. 2023: the 16 normal-float levels)
NF4 = [mpmath.mpf(v) for v in (
    "-1", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
    "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0",
    "0.07958029955625534", "0.16093020141124725", "0.24611230194568634",
    "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
    "0.7229568362236023", "1")]
MIDS = [(a + b) / 2 for a, b in zip(NF4, NF4[1:])]

bad = []
for dtype in (torch.float32, torch.float16):
    W = [[0.3, -0.7]]
    w = torch.tensor(W, dtype=dtype)
    packed, state = F.quantize_4bit(w, blocksize=32, quant_type="nf4")
    out = F.dequantize_4bit(packed, state, quant_type="nf4")
    # NF4: a = max|x| of the block, code = nearest c_k to x/a, value c_k·a
    xs = [mpmath.mpf(v) for v in w.flatten().tolist()]
    a = max(abs(v) for v in xs)
    true = [NF4[sum(1 for m in MIDS if m < v / a)] * a for v in xs]
    print(f"case FALSIFY-NF4-010 / FALSIFY-NF4-006 / FALSIFY-NF4-011 ({str(dtype)[6:]})")
    print(f"input:   w = {W} ({str(dtype)[6:]}, shape (1, 2)), blocksize 32, quant_type 'nf4'")
    print(f"library: bitsandbytes {VERSION}: packed shape {tuple(packed.shape)}, state.shape "
          f"{tuple(state.shape)}; dequantize_4bit -> shape {tuple(out.shape)}, values "
          f"{out.flatten().tolist()}")
    print(f"true:    shape (1, 2), values {[mpmath.nstr(v, 8) for v in true]}")
    print("bound:   the weight's own shape (the round-trip bound |w - w~| <= 0.1519·absmax is "
          "stated elementwise on it)")
    ok = tuple(out.shape) == tuple(w.shape)
    print("error:  ", "none" if ok else f"shape {tuple(out.shape)} for {tuple(w.shape)}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: the result is transposed'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
