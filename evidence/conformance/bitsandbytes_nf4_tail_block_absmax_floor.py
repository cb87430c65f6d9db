"""bitsandbytes: quantize_4bit stores 1e-38 as the absmax of an all-zero last (tail) block.

The default (pure torch) backend's quantize_4bit (backends/default/ops.py) keeps the full
blocks' absmax = max|x| unclamped and clamps only their reciprocal, but for a partial last
block it stores `A_flat[full:].abs().max().clamp(min=1e-38)` itself: an all-zero tail block
reports absmax 1e-38 (9.99999935e-39 in fp32), an all-zero full block 0. The NF4 format's
absmax is max|x| of the block; the packed codes (0x77) and the decoded zeros are right.

Backs FALSIFY-NF4-003 (nf4-kernel-v1: absmax bit-exact), binding
functional.quantize_4bit(nf4).
Run: python bitsandbytes_nf4_tail_block_absmax_floor.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import bitsandbytes.functional as F
import torch

VERSION = importlib.metadata.version("bitsandbytes")
bad = []
for name, shape in (("FALSIFY-NF4-003: one tail block, w zeros [1, 1], blocksize 32", (1, 1)),
                    ("control: one full block, w zeros [1, 32], blocksize 32", (1, 32))):
    w = torch.zeros(shape)
    packed, state = F.quantize_4bit(w, blocksize=32, quant_type="nf4")
    got = state.absmax.tolist()
    true = [0.0] * len(got)  # a_b = max over the block of |x| = 0
    print(f"case {name}")
    print(f"input:   w = torch.zeros({list(shape)}) (float32), blocksize 32, quant_type 'nf4'")
    print(f"library: bitsandbytes {VERSION}: absmax = {got!r}, packed = "
          f"{[hex(v) for v in packed.flatten().tolist()[:2]]}")
    print(f"true:    absmax = {true} (max |x| of each block)")
    # FALSIFY-NF4-003: rtol 9.09e-13 (2^-40): absmax is an input value, no arithmetic, so
    # bit equality; with a true value of 0 the bound is 0
    print("bound:   0 (bit-exact: rtol 2^-40 of 0)")
    err = max(abs(a - b) for a, b in zip(got, true))
    print(f"error:   {err!r}")
    bad.append(err > 0)
    print("verdict:", "REPRODUCES: the 1e-38 floor stored as absmax" if bad[-1]
          else "does not reproduce")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
