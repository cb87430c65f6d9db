"""gguf: quants.dequantize / quantize crash on rows of zero blocks.

_apply_over_grouped_rows (gguf/quants.py) starts with `rows = arr.reshape((-1,
arr.shape[-1]))`; for rows of 0 bytes (or 0 values) the -1 is ambiguous and numpy raises
ValueError 'cannot reshape array of size 0 into shape (0)'. ggml's layout gives m rows of
nb blocks each; with nb = 0 the result is an empty [m, 0] array (float32 when
dequantizing, uint8 bytes when quantizing). m = 0 rows work.

Backs FALSIFY-GQ-017 (q8_0 dequantize, size 0) and FALSIFY-GQ-020 (q8_0 quantize, size 0)
of gguf-quants-kernel-v1, binding gguf.quants.dequantize/quantize.
Run: python gguf_zero_blocks_per_row.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

VERSION = importlib.metadata.version("gguf")
bad = []
for check, what, arr, want in (
        ("FALSIFY-GQ-017", "dequantize(blocks, Q8_0)", np.zeros((2, 0), np.uint8),
         ((2, 0), np.float32)),
        ("FALSIFY-GQ-020", "quantize(x, Q8_0)", np.zeros((2, 0), np.float32),
         ((2, 0), np.uint8))):
    print(f"case {check}: nb = 0 ({what})")
    print(f"input:   np.zeros((2, 0), {arr.dtype}) (m = 2 rows of no blocks)")
    fn = quants.dequantize if what.startswith("de") else quants.quantize
    try:
        out = fn(arr, GGMLQuantizationType.Q8_0)
        outcome = f"array of shape {out.shape}, {out.dtype}"
        ok = out.shape == want[0] and out.dtype == want[1]
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: gguf {VERSION}: quants.{what}: {outcome}")
    print(f"true:    an empty array of shape {want[0]}, {np.dtype(want[1])}")
    print("bound:   that empty result (the contract's size-0 rule), no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: nb = 0 crashes'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
