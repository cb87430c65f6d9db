"""gguf: quants.dequantize crashes on zero rows of Q4_K / Q6_K blocks.

Q4_K.dequantize_blocks and Q6_K.dequantize_blocks (gguf/quants.py) reshape their per-block
fields to (n_blocks, -1, ...), e.g. `d = (d * sc).reshape((n_blocks, -1, 1))` and
`ql.reshape((n_blocks, -1, 1, 64))`; with no blocks (n_blocks = 0) the -1 is ambiguous and
numpy raises ValueError 'cannot reshape array of size 0 into shape (0,newaxis,1)'. Zero rows
of blocks decode to an empty [0, 256·nb] float32 array, as ggml does and as gguf's own
Q8_0 does.

Backs FALSIFY-GQ-018 (q4_k dequantize, size 0) and FALSIFY-GQ-019 (q6_k dequantize, size 0)
of gguf-quants-kernel-v1, binding gguf.quants.dequantize/quantize.
Run: python gguf_kquants_zero_rows.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants
from gguf.constants import GGML_QUANT_SIZES

VERSION = importlib.metadata.version("gguf")
bad = []
for check, name in (("FALSIFY-GQ-018", "Q4_K"), ("FALSIFY-GQ-019", "Q6_K")):
    qtype = GGMLQuantizationType[name]
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    arr = np.zeros((0, block_bytes), np.uint8)  # m = 0 rows of one block each
    print(f"case {check}: m = 0 ({name})")
    print(f"input:   np.zeros((0, {block_bytes}), uint8) (no rows of one {name} block of "
          f"{block_bytes} bytes)")
    try:
        out = quants.dequantize(arr, qtype)
        outcome = f"array of shape {out.shape}, {out.dtype}"
        ok = out.shape == (0, block_values)
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: gguf {VERSION}: quants.dequantize(blocks, {name}): {outcome}")
    print(f"true:    an empty array of shape (0, {block_values}), float32")
    print("bound:   that empty result (the contract's size-0 rule), no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: m = 0 crashes'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
