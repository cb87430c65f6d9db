"""torchao: the asymmetric scale (max − min)/15 is rounded twice in float32.

_choose_qparams_affine computes `scale = (max_val_pos - min_val_neg) / float(quant_max -
quant_min)` on float32 tensors: the subtraction is rounded to float32, then the quotient is
rounded again, where fl32((hi − lo)/15) rounds the exact quotient once. The two differ by
an ulp for some groups, and the dequantized values (q − z)·s move with the scale.

Backs FALSIFY-QNT-002/float32 (int4 groupwise: scales exact) and FALSIFY-QNT-004/float32
(int4 round trip within one float32 rounding of the exact (q − z)·s) of quantize-kernel-v1,
binding quant_primitives (affine).
Run: python torchao_affine_asymmetric_scale_rounding.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import numpy as np
import torch
from torchao.quantization import quant_primitives as qp

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torchao")
EPS32, TINY32 = 2.0 ** -23, 2.0 ** -126
W = [5.71999979019165, -7.460000038146973, 3.6700000762939453, -5.190000057220459]  # fp32
block = (1, 4)
w = torch.tensor([W])
s, z = qp.choose_qparams_affine(w, qp.MappingType.ASYMMETRIC, block, torch.int8, 0, 15,
                                scale_dtype=torch.float32, zero_point_dtype=torch.int32)
q = qp.quantize_affine(w, block, s, z, torch.int8, 0, 15)
y = qp.dequantize_affine(q, block, s, z, torch.int8, 0, 15, output_dtype=torch.float32)

X = [mpmath.mpf(v) for v in W]
lo, hi = min(min(X), 0), max(max(X), 0)
ts = float(np.float32(float((hi - lo) / 15)))  # fl32 of the exact quotient
tz = int(min(max(round(float(-lo / ts)), 0), 15))
tq = [int(min(max(round(float(v / ts)) + tz, 0), 15)) for v in X]
tx = [(c - tz) * mpmath.mpf(ts) for c in tq]
bad = []
print("case FALSIFY-QNT-002/float32: the asymmetric scale of one group of 4")
print(f"input:   w = [{W}] (float32), block_size (1, 4), ASYMMETRIC, range [0, 15]")
print(f"library: torchao {VERSION}: scale {s.item()!r}, zero point {z.item()}, codes "
      f"{q.flatten().tolist()}")
print(f"true:    scale fl32((hi - lo)/15) = {ts!r} (hi {float(hi)}, lo {float(lo)}), zero point "
      f"{tz}, codes {tq}")
print("bound:   equal scales, codes and zero points (the check declares no tolerance)")
print(f"error:   scale off by {abs(s.item() - ts):.3g} (one float32 ulp: "
      f"{np.spacing(np.float32(ts)):.3g})")
bad.append(s.item() != ts or q.flatten().tolist() != tq or z.item() != tz)
print("verdict:", "REPRODUCES: the scale is not fl32((hi - lo)/15)" if bad[-1]
      else "does not reproduce")
print()
# FALSIFY-QNT-004/float32: atol tiny32·eps32/2, rtol eps32/2 of the exact (q − z)·s
got = y.flatten().tolist()
errs = [abs(mpmath.mpf(a) - b) for a, b in zip(got, tx)]
bounds = [TINY32 * EPS32 / 2 + EPS32 / 2 * abs(b) for b in tx]
j = max(range(4), key=lambda k: errs[k] / bounds[k])
print("case FALSIFY-QNT-004/float32: the dequantized group")
print("input:   as above, then dequantize_affine (output_dtype float32)")
print(f"library: torchao {VERSION}: {got}")
print(f"true:    (q - z)·s = {[mpmath.nstr(v, 12) for v in tx]}")
print(f"bound:   element {j}: {mpmath.nstr(bounds[j], 4)}")
print(f"error:   element {j}: {mpmath.nstr(errs[j], 4)}")
bad.append(errs[j] > bounds[j])
print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
