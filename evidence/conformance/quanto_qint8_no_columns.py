"""optimum-quanto: qint8 weight quantization crashes on a weight with no columns.

AbsmaxOptimizer computes the per-output-channel scale with torch.amax over the input
dimension, which raises IndexError (amax(): Expected reduction dim 1 to have non-zero size)
for a weight of shape [o, 0]. The quantization of no columns is an [o, 0] int8 tensor with a
zero scale per row (the max over no entries is 0). Rows of size 0 (o = 0) and
noncontiguous views quantize.

Backs FALSIFY-QNT-036 (layouts and size 0 of int8_per_channel) and FALSIFY-QNT-038 (of
int8_roundtrip) of quantize-kernel-v1, binding qint8 weights (absmax, axis 0).
Run: python quanto_qint8_no_columns.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
import warnings

import torch
from optimum.quanto import freeze, qint8, quantize

VERSION = importlib.metadata.version("optimum-quanto")
with warnings.catch_warnings():  # torch warns that initialising a zero-element weight is a no-op
    warnings.simplefilter("ignore")
    model = torch.nn.Sequential(torch.nn.Linear(0, 2, bias=False))
print("case FALSIFY-QNT-036 / FALSIFY-QNT-038: i = 0")
print("input:   torch.nn.Sequential(torch.nn.Linear(0, 2, bias=False)) (weight [2, 0], "
      "float32); quantize(model, weights=qint8); freeze(model)")
try:
    with warnings.catch_warnings():  # quantize() builds a zero-element weight too
        warnings.simplefilter("ignore")
        quantize(model, weights=qint8)
        freeze(model)
    wq = model[0].weight
    outcome = f"quantized weight of shape {tuple(wq.shape)}"
    ok = tuple(wq.shape) == (2, 0)
except Exception as e:  # noqa: BLE001 - the finding is this exception
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: optimum-quanto {VERSION}: {outcome}")
print("true:    int8 codes of shape [2, 0] and a zero scale per row")
print("bound:   that empty result (the contract's size-0 rule for i = 0), no error")
print(f"error:   {'none' if ok else outcome}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: a weight with no columns crashes'}")
sys.exit(0 if ok else 1)
