"""transformers: LlamaRMSNorm silently truncates an integer input to integers.

LlamaRMSNorm.forward casts x to fp32, normalizes, casts the normalized row back with
`.to(input_dtype)` and multiplies by the weight. For int64 x the cast back truncates
x̂ = x/rms(x), whose entries are mostly below 1 in magnitude, to 0 or ±1: the result is
neither the RMS norm nor an error.

Backs FALSIFY-RN-015 (rmsnorm-kernel-v1: every undeclared dtype is refused with a TypeError
or ValueError naming it, before any work).
Run: python transformers_llama_rmsnorm_integer_input.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS32 = 2.0 ** -23

X = [[4, -3, 2, 0, -2]]
x = torch.tensor(X, dtype=torch.int64)
norm = LlamaRMSNorm(5, eps=1e-6)  # weight = ones (float32), as initialised
Xm = [mpmath.mpf(v) for v in X[0]]
r = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in Xm) / 5 + mpmath.mpf(1e-6))
true = [v * r for v in Xm]
print("case FALSIFY-RN-015: int64 input")
print(f"input:   x = {X} (int64), LlamaRMSNorm(5, eps=1e-6) with weight = ones")
try:
    y = norm(x)
except (TypeError, ValueError) as e:
    print(f"library: transformers {VERSION}: refused: {type(e).__name__}: {e}")
    named = "int64" in str(e) or "Long" in str(e)
    print(f"true:    {[mpmath.nstr(t, 10) for t in true]}")
    print("bound:   a TypeError or ValueError naming the dtype, before any work")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
got = y.detach().flatten().tolist()
# were it computed, the contract's float32 parity bound (FALSIFY-RN-001): rtol (n/2 + 6)·eps32
errs = [abs(mpmath.mpf(g) - t) for g, t in zip(got, true)]
print(f"library: transformers {VERSION}: LlamaRMSNorm(5)(x) = {got} ({y.dtype}), no error")
print(f"true:    x / rms(x) = {[mpmath.nstr(t, 10) for t in true]}")
print("bound:   a TypeError or ValueError naming int64, before any work (rmsnorm-kernel-v1 "
      "declares float32 and float16); a computed result would be within rtol "
      f"{(5 / 2 + 6) * EPS32:.3g}")
print(f"error:   accepted; max |result - x/rms(x)| = {mpmath.nstr(max(errs), 6)}")
bad = max(errs) > (5 / 2 + 6) * EPS32 * max(abs(t) for t in true)
print("verdict:", "REPRODUCES: integer input accepted and truncated" if bad
      else "does not reproduce: the result is the RMS norm")
sys.exit(1 if bad else 0)
