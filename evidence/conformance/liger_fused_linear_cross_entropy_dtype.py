"""Liger-Kernel: liger_fused_linear_cross_entropy returns a float32 loss for float64 inputs.

fused_linear_cross_entropy_forward allocates its per-token loss buffer as float32 whatever
the input dtype (and fp16 inputs likewise get an fp32 loss), so float64 x and W are neither
refused nor kept: the loss silently loses float64 precision and comes back in another dtype.

Backs FALSIFY-FLCE-008 (fused-linear-cross-entropy-kernel-v1: an undeclared dtype is refused
with a TypeError or ValueError naming it, before any work), binding
LigerFusedLinearCrossEntropyFunction. Runs under the Triton interpreter (TRITON_INTERPRET=1)
without a GPU.
Run: python liger_fused_linear_cross_entropy_dtype.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
X = [[0.1, -0.7, 1.3], [2.0, 0.25, -1.5]]
W = [[0.5, -1.25, 0.75], [-0.3, 0.9, 1.1], [1.7, 0.2, -0.6], [0.05, -0.45, 0.35]]
Y = [2, 0]
true = []
for row, lab in zip(X, Y):
    z = [mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(row, w)) for w in W]
    true.append(mpmath.log(mpmath.fsum(mpmath.exp(v) for v in z)) - z[lab])
print("case FALSIFY-FLCE-008: float64 x and weight")
print(f"input:   x = {X}, weight = {W} (float64), labels = {Y}, reduction 'none'")
try:
    out = liger_fused_linear_cross_entropy(torch.tensor(X, dtype=torch.float64),
                                           torch.tensor(W, dtype=torch.float64),
                                           torch.tensor(Y), reduction="none")
except (TypeError, ValueError) as e:
    named = "float64" in str(e) or "Double" in str(e)
    print(f"library: liger-kernel {VERSION}: refused: {type(e).__name__}: {e}")
    print(f"true:    {[mpmath.nstr(t, 17) for t in true]}")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
got = out.tolist()
err = max(abs(mpmath.mpf(a) - t) for a, t in zip(got, true))
print(f"library: liger-kernel {VERSION}: liger_fused_linear_cross_entropy(...) = {got} "
      f"({out.dtype}), no error")
print(f"true:    {[mpmath.nstr(t, 17) for t in true]}")
print("bound:   a TypeError or ValueError naming float64 (the contract declares float32 and "
      "float16), or a float64 loss")
print(f"error:   accepted, result dtype {out.dtype}; max |loss - true| = {mpmath.nstr(err, 6)} "
      "(float32 precision)")
bad = out.dtype != torch.float64
print("verdict:", "REPRODUCES: float64 in, float32 out" if bad
      else "does not reproduce: float64 kept")
sys.exit(1 if bad else 0)
