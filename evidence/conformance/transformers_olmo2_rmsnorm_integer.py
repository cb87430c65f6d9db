"""transformers: Olmo2RMSNorm accepts integer input and returns it truncated.

Olmo2RMSNorm.forward casts x to fp32, normalizes, multiplies by the weight and casts the
product back with `.to(input_dtype)`: for an int64 x the normalized values (|x̂·w| < 1 for most
entries) are truncated towards 0, and the result comes back as integers without an error.
rmsnorm-kernel-v1 (FALSIFY-RN-015) asks an undeclared dtype to be refused with a TypeError or
ValueError naming it.

Backs FALSIFY-RN-015 of rmsnorm-kernel-v1 (binding Olmo2RMSNorm).
Run: python transformers_olmo2_rmsnorm_integer.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
X, EPS = [4, -3, 2, 0, -2], 1e-6

norm = Olmo2RMSNorm(len(X), eps=EPS)  # weight = 1
x = torch.tensor([X], dtype=torch.int64)
try:
    with torch.no_grad():
        y = norm(x)
    got = f"{y.tolist()} ({y.dtype})"
    accepted = True
except (TypeError, ValueError) as e:
    got, accepted = f"refused: {type(e).__name__}: {e}", False
inv = 1 / mpmath.sqrt(mpmath.mpf(sum(v * v for v in X)) / len(X) + EPS)
true = [mpmath.nstr(v * inv, 8) for v in X]
err = max(abs(mpmath.mpf(a) - v * inv) for a, v in zip(y[0].tolist(), X)) if accepted else 0
print("case FALSIFY-RN-015 (undeclared dtype int64)")
print(f"input:   x = {X} (int64, shape [1, 5]), w = 1 (float32), eps = {EPS}")
print(f"library: transformers {VERSION} (torch {torch.__version__}): Olmo2RMSNorm(x) = {got}")
print(f"true:    x/rms(x) = {true}")
print("bound:   a TypeError or ValueError naming int64 (the contract refuses undeclared dtypes)")
print(f"error:   {mpmath.nstr(err, 6)} (max |result − x/rms(x)|)" if accepted else "error:   none")
print("verdict: " + ("REPRODUCES: int64 accepted and truncated" if accepted
                     else "does not reproduce: refused"))
sys.exit(1 if accepted else 0)
