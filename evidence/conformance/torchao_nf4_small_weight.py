"""torchao: NF4Tensor refuses weights smaller than block_size · scaler_block_size elements.

to_nf4 / NF4Tensor.from_tensor asserts that the element count is a multiple of block_size
('Input tensor must be divisible by block size') and, as it double-quantizes the block
scalers in groups of scaler_block_size, that the number of blocks is a multiple of
scaler_block_size ('Number of scalers must be divisible by scaler block size'): no tail
block, and no weight below 16384 elements at block_size 64 (scaler_block_size 256). A
[1, 5] weight (one partly filled NF4 block) and a [16, 64] weight (16 full blocks) are valid
NF4 inputs: the round trip is every element's nearest NF4 level times its block's absmax.

Backs FALSIFY-NF4-006 (round-trip error bound) and FALSIFY-NF4-011 (double-quantized
round-trip bound) of nf4-kernel-v1, binding NF4Tensor.
Run: python torchao_nf4_small_weight.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torchao")
# the NF4 code book (QLoRA, Dettmers et al. 2023: the 16 normal-float levels)
NF4 = [mpmath.mpf(v) for v in (
    "-1", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
    "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0",
    "0.07958029955625534", "0.16093020141124725", "0.24611230194568634",
    "0.33791524171829224", "0.44070982933044434", "0.5626170039176941",
    "0.7229568362236023", "1")]
MIDS = [(a + b) / 2 for a, b in zip(NF4, NF4[1:])]
def nf4_roundtrip_exact(row_values, bs):
    out = []
    for b in range(0, len(row_values), bs):
        xs = [mpmath.mpf(v) for v in row_values[b:b + bs]]
        a = max(abs(v) for v in xs)
        out += [NF4[sum(1 for m in MIDS if m < v / a)] * a if a else mpmath.mpf(0) for v in xs]
    return out


bad = []
for name, w, text in (
        ("one partly filled block", torch.tensor([[0.5, -1.25, 0.75, 2.0, -0.1]]),
         "w = [[0.5, -1.25, 0.75, 2.0, -0.1]] (float32, shape [1, 5])"),
        ("16 full blocks", torch.linspace(-2.0, 2.0, 1024).reshape(16, 64),
         "w = torch.linspace(-2, 2, 1024).reshape(16, 64) (float32)")):
    flat = w.flatten().tolist()
    true = nf4_roundtrip_exact(flat, 64)
    amax = [max(abs(v) for v in flat[b:b + 64]) for b in range(0, len(flat), 64)]
    print(f"case FALSIFY-NF4-006 / FALSIFY-NF4-011: {name}")
    print(f"input:   {text}, to_nf4(w, block_size=64, scaler_block_size=256)")
    try:
        got = to_nf4(w, 64, 256).get_original_weight().flatten().tolist()
        err = max(abs(mpmath.mpf(g) - t) for g, t in zip(got, true))
        outcome = f"round trip, max |w~ - exact round trip| = {mpmath.nstr(err, 4)}"
        ok = all(abs(g - v) <= 0.15190359950065613 * amax[k // 64] + 1e-6
                 for k, (g, v) in enumerate(zip(got, flat)))
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: torchao {VERSION}: {outcome}")
    print(f"true:    first values {[mpmath.nstr(t, 8) for t in true[:5]]} (nearest NF4 level "
          "times the block's absmax)")
    print("bound:   |w - w~| <= (0.1519 + delta)·absmax of the element's block "
          "(FALSIFY-NF4-006), no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: a small weight is refused'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
