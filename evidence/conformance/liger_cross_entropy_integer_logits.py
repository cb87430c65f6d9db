"""Liger-Kernel: liger_cross_entropy accepts integer logits and returns an integer loss.

LigerCrossEntropyFunction allocates its loss buffer in the logits' dtype and the Triton
kernel stores the fp32 loss into it: int64 logits give an int64, truncated loss with no
error, where torch.nn.functional.cross_entropy refuses integer logits.

Backs FALSIFY-CE-022 (cross-entropy-kernel-v1: every undeclared dtype is refused with a
TypeError or ValueError naming it), binding LigerCrossEntropyFunction. Runs the Triton kernel
under the Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_cross_entropy_integer_logits.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
Z, Y = [[3, -1, 2, 0]], [1]
true = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in Z[0])) - Z[0][Y[0]]
print("case FALSIFY-CE-022: int64 logits")
print(f"input:   logits = {Z} (int64), labels = {Y}, reduction 'none'")
try:
    y = liger_cross_entropy(torch.tensor(Z), torch.tensor(Y), reduction="none")
except (TypeError, ValueError) as e:
    named = "int64" in str(e) or "Long" in str(e)
    print(f"library: liger-kernel {VERSION}: refused: {type(e).__name__}: {e}")
    print(f"true:    {mpmath.nstr(true, 10)}")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
print(f"library: liger-kernel {VERSION}: liger_cross_entropy(...) = {y.tolist()} ({y.dtype}), "
      "no error")
print(f"true:    lse(z) - z_y = {mpmath.nstr(true, 10)}")
print("bound:   a TypeError or ValueError naming int64 (the contract declares float32 and "
      "float16 logits; torch.nn.functional.cross_entropy refuses Long)")
err = abs(mpmath.mpf(y.tolist()[0]) - true)
print(f"error:   accepted; |loss - true| = {mpmath.nstr(err, 6)}")
bad = y.dtype in (torch.int64, torch.int32) or err > 1e-5
print("verdict:", "REPRODUCES: integer logits accepted, integer loss returned" if bad
      else "does not reproduce")
sys.exit(1 if bad else 0)
