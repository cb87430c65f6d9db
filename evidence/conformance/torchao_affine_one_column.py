"""torchao: the affine quantization primitives cannot quantize a weight of one column.

With block_size (1, 1) (per channel on a [o, 1] weight, or groups of one column)
_get_reduction_params finds no dimension to reduce, torch.amin/amax over dim=[] reduce the
whole tensor, choose_qparams_affine returns a single scale for all o rows, and
_quantize_affine_no_dtype_cast's `scale.view(...)` raises RuntimeError: shape '[2, 1]' is
invalid for input of size 1. A one-column weight has o blocks of one element each.

Backs, of quantize-kernel-v1 (binding quant_primitives (affine)), every check whose cases
include a one-column weight: FALSIFY-QNT-003/float32, -005, -007, -009, -011, -013, -015,
-019, -020, -022, -024 and -026.
Run: python torchao_affine_one_column.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import numpy as np
import torch
from torchao.quantization import quant_primitives as qp

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torchao")
W = [[0.5], [-0.25]]  # o = 2 rows, i = 1 column


def f32(v):
    return float(np.float32(float(v)))


bad = []
for name, mapping, qrange, levels in (("int8 per channel, SYMMETRIC [-127, 127]",
                                       qp.MappingType.SYMMETRIC, (-127, 127), 127),
                                      ("int4 groups of 1 column, ASYMMETRIC [0, 15]",
                                       qp.MappingType.ASYMMETRIC, (0, 15), 15)):
    w = torch.tensor(W)
    # the format: each row is its own block; symmetric s = fl32(|w|/127), q = ±127;
    # asymmetric lo = min(w, 0), hi = max(w, 0), s = fl32((hi − lo)/15), z = round(−lo/s)
    if levels == 127:
        true = [(round(r[0] / f32(abs(r[0]) / 127)), f32(abs(r[0]) / 127)) for r in W]
    else:
        true = []
        for (v,) in W:
            lo, hi = min(v, 0.0), max(v, 0.0)
            s = f32((mpmath.mpf(hi) - lo) / 15)
            z = round(-lo / s)
            true.append((min(max(round(v / s) + z, 0), 15), s))
    print(f"case {name}: w [2, 1], block_size (1, 1)")
    print(f"input:   w = {W} (float32), choose_qparams_affine + quantize_affine, block_size "
          f"(1, 1), quant range {qrange}, scale_dtype float32, zero_point_dtype int32")
    try:
        s, z = qp.choose_qparams_affine(w, mapping, (1, 1), torch.int8, *qrange,
                                        scale_dtype=torch.float32, zero_point_dtype=torch.int32)
        q = qp.quantize_affine(w, (1, 1), s, z, torch.int8, *qrange)
        outcome = f"codes {q.flatten().tolist()}, scales {s.flatten().tolist()}"
        ok = [c for c, _ in true] == q.flatten().tolist() and \
            [t for _, t in true] == s.flatten().tolist()
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: torchao {VERSION}: {outcome}")
    print(f"true:    codes {[c for c, _ in true]}, scales {[t for _, t in true]} "
          "(one block per row)")
    print("bound:   equal codes and scales (FALSIFY-QNT-001/002: no tolerance)")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print("verdict:", "does not reproduce" if ok
          else "REPRODUCES: a one-column weight cannot be quantized")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
