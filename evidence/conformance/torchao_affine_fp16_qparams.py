"""torchao: choose_qparams_affine computes float16 weights' statistics in float16.

For fp16 weights choose_qparams_affine forms max|w| / ((qmax − qmin)/2) (symmetric) or
(max(max w, 0) − min(min w, 0)) / (qmax − qmin) (asymmetric) in the input dtype: the scale is
rounded to fp16 before `scale_dtype=torch.float32` casts it, so it differs from
fl32(max|w|/127) by up to 2^-11 relative; quantize_affine and dequantize_affine then use that
scale (codes at rounding boundaries move, dequantized values by up to one fp16 ulp and more).
torch.compile (Inductor) upcasts the fp16 arithmetic to fp32 and so computes other scales than
eager torchao, which is what the compile checks see.

Backs FALSIFY-QNT-001/float16, -002/float16, -003/float16, -004/float16 and -014/float16 of
quantize-kernel-v1, and FALSIFY-QNT-040/float16 .. -043/float16 (compiled vs eager): the cases
below show eager's scale and results against the float32-computed values the contract
defines, which Inductor's fp32 arithmetic reproduces; torch.compile itself is not run here
(Inductor's C++ build alone takes longer than the 10 s this script is allowed).
Run: python torchao_affine_fp16_qparams.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import numpy as np
import torch
from torchao.quantization import quant_primitives as qp

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torchao")
EPS16, EPS32, TINY16 = 2.0 ** -10, 2.0 ** -23, 2.0 ** -14


def f32(v):
    return float(np.float32(float(v)))


def torchao(w, group, symmetric, qmin, qmax):
    """choose_qparams_affine + quantize_affine + dequantize_affine, block (1, group)."""
    mapping = qp.MappingType.SYMMETRIC if symmetric else qp.MappingType.ASYMMETRIC
    block = (1, group)
    s, z = qp.choose_qparams_affine(w, mapping, block, torch.int8, qmin, qmax,
                                    scale_dtype=torch.float32, zero_point_dtype=torch.int32)
    q = qp.quantize_affine(w, block, s, z, torch.int8, qmin, qmax)
    y = qp.dequantize_affine(q, block, s, z, torch.int8, qmin, qmax, output_dtype=w.dtype)
    return q.flatten().tolist(), s.flatten().tolist(), z.flatten().tolist(), y.flatten().tolist()


def contract(W, symmetric, levels):
    """The format's (q, s, z) for one group: s = fl32(max|w| / levels) symmetric, or
    fl32((hi − lo)/15) with lo = min(min w, 0), hi = max(max w, 0); z = round(−lo/s);
    q = clamp(round(w/s) + z) (round half to even); the exact dequantized (q − z)·s."""
    X = [mpmath.mpf(v) for v in W]
    if symmetric:
        s = f32(max(abs(v) for v in X) / levels)
        z, lo_q, hi_q = 0, -levels - (1 if levels == 7 else 0), levels
    else:
        lo, hi = min(min(X), 0), max(max(X), 0)
        s = f32((hi - lo) / 15)
        z, lo_q, hi_q = int(min(max(round(-lo / s), 0), 15)), 0, 15
    q = [int(min(max(round(float(v / s)) + z, lo_q), hi_q)) for v in X]
    return q, s, z, [(c - z) * mpmath.mpf(s) for c in q]


def show(name, inp, lib, true, bound_txt, err_txt, bad):
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: torchao {VERSION}: {lib}")
    print(f"true:    {true}")
    print(f"bound:   {bound_txt}")
    print(f"error:   {err_txt}")
    print(f"verdict: {'REPRODUCES: beyond the bound' if bad else 'does not reproduce'}")
    print()
    return bad


bad = []
# FALSIFY-QNT-001/002 (and their compile twins 040/041): codes, scales and zero points are
# compared exactly (the checks declare no tolerance)
for name, W, group, sym, qrange, levels in (
        ("FALSIFY-QNT-001/float16, -040/float16 (int8 per channel, one element)",
         [0.8466796875], 1, True, (-127, 127), 127),
        ("FALSIFY-QNT-002/float16, -041/float16 (int4 symmetric, one group of 2)",
         [3.4140625, -1.0], 2, True, (-7, 7), 7)):
    w = torch.tensor([W], dtype=torch.float16)
    q, s, z, _ = torchao(w, group if group > 1 else len(W), sym, *qrange)
    tq, ts, tz, _ = contract(W, sym, levels)
    bad.append(show(name, f"w = [{W}] (float16), block (1, {max(group, len(W))}), "
                          f"{'SYMMETRIC' if sym else 'ASYMMETRIC'}, range {qrange}, "
                          "scale_dtype float32",
                    f"scale {s}, codes {q}", f"scale [{ts!r}] = fl32(max|w|/{levels}), "
                                             f"codes {tq}",
                    "equal scales and codes (no tolerance)",
                    f"scale off by {abs(s[0] - ts):.3g} ({abs(s[0] - ts) / ts:.2g} relative)",
                    s[0] != ts or q != tq))

# FALSIFY-QNT-003/004 (and 042/043): the dequantized weights within fl16(fl32(x)) of the exact
# x = (q − z)·s: atol tiny16·eps16/2, rtol eps16/2 + eps32
for name, W, sym, qrange, levels in (
        ("FALSIFY-QNT-003/float16, -042/float16 (int8 round trip)",
         [-1.0498046875, 0.60595703125], True, (-127, 127), 127),
        ("FALSIFY-QNT-004/float16, -043/float16 (int4 asymmetric round trip, group 4)",
         [0.4462890625, 2.677734375, 0.88330078125, 2.021484375], False, (0, 15), 15)):
    w = torch.tensor([W], dtype=torch.float16)
    q, s, z, y = torchao(w, len(W), sym, *qrange)
    tq, ts, tz, tx = contract(W, sym, levels)
    errs = [abs(mpmath.mpf(a) - b) for a, b in zip(y, tx)]
    bounds = [TINY16 * EPS16 / 2 + (EPS16 / 2 + EPS32) * abs(b) for b in tx]
    j = max(range(len(W)), key=lambda k: errs[k] / bounds[k])
    bad.append(show(name, f"w = [{W}] (float16), block (1, {len(W)}), "
                          f"{'SYMMETRIC' if sym else 'ASYMMETRIC'}, range {qrange}",
                    f"dequantized {y} (scale {s}, codes {q}, zero {z})",
                    f"(q - z)·s = {[mpmath.nstr(v, 9) for v in tx]} (scale {ts!r}, codes {tq}, "
                    f"zero {tz})", f"element {j}: {mpmath.nstr(bounds[j], 4)}",
                    f"element {j}: {mpmath.nstr(errs[j], 4)}", errs[j] > bounds[j]))

# FALSIFY-QNT-014/float16: |w − w̃| ≤ (1/2 + 2^-20)·s + rtol·(|w| + s) + atol, s recomputed in
# float32 from w, with FALSIFY-QNT-004's (atol, rtol)
W = [-1.93359375, -2.75, 1.693359375, 2.751953125]
w = torch.tensor([W], dtype=torch.float16)
q, s, z, y = torchao(w, 4, False, 0, 15)
_, ts, _, _ = contract(W, False, 15)
errs = [abs(mpmath.mpf(a) - b) for a, b in zip(y, W)]
bounds = [(0.5 + 2 ** -20) * ts + (EPS16 / 2 + EPS32) * (abs(v) + ts) + TINY16 * EPS16 / 2
          for v in W]
j = max(range(4), key=lambda k: errs[k] / bounds[k])
bad.append(show("FALSIFY-QNT-014/float16 (int4 dequantization error bound)",
                f"w = [{W}] (float16), block (1, 4), ASYMMETRIC, range (0, 15)",
                f"dequantized {y} (scale {s}, zero {z}, codes {q})",
                f"|w - w~| <= s/2 with s = fl32((hi - lo)/15) = {ts!r}",
                f"element {j}: {mpmath.nstr(mpmath.mpf(bounds[j]), 6)}",
                f"element {j}: {mpmath.nstr(errs[j], 6)}", errs[j] > bounds[j]))
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
