"""torch: the float16 gradient of F.cross_entropy is exp of fp16-rounded log-probabilities.

log_softmax_backward computes g = dy − exp(out)·Σdy from `out`, the saved fp16 log_softmax.
Rounding log p to fp16 puts a relative error of up to |log p|·2^-11 on p = exp(log p), far
more than one rounding of p itself: for 27 equal logits log(1/27) = −3.2958 is stored as
−3.2949, every p_j becomes 0.037071 instead of 0.037037, and the gradient row, which sums to
exactly 0 (Σ softmax = 1), sums to 1.2e-3.

Backs FALSIFY-CE-010/float16 (cross-entropy-kernel-v1: gradient rows sum to zero and are
bounded), F.cross_entropy binding.
Run: python torch_cross_entropy_fp16_grad.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import torch
import torch.nn.functional as F

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS16, U32 = 2.0 ** -10, 1.1920929e-07

V = 27
z = torch.zeros(1, V, dtype=torch.float16, requires_grad=True)
label = torch.tensor([0])
loss = F.cross_entropy(z, label, reduction="sum")
(g,) = torch.autograd.grad(loss, z)
row = g[0].tolist()
got_sum = mpmath.fsum(mpmath.mpf(v) for v in row)  # summed exactly, as the contract's float64

# ∂loss/∂z_j = p_j − [j = 0], p_j = 1/27: the row sums to exactly 0
p = mpmath.mpf(1) / V
true_row = [p - (1 if j == 0 else 0) for j in range(V)]
# FALSIFY-CE-010 float16 tolerance (cross-entropy-kernel-v1.yaml, predicate
# |Σ_j g_j| ≤ tol and |g_j| ≤ 1 + tol): tol = eps16 + V·3e-8 +
# (72 + 69·(⌈V/1024⌉ + ⌈log2(V + 1)⌉ + 2))·eps32: one fp16 rounding per entry summed over the
# row, fp16 subnormal steps, and the fp32 softmax's error
tol = EPS16 + V * 3.0e-8 + (72 + 69 * (math.ceil(V / 1024) + math.ceil(math.log2(V + 1)) + 2)) * U32

print("case FALSIFY-CE-010/float16: the gradient row sums to zero")
print(f"input:   logits = zeros [1, {V}] (float16), label [0], reduction 'sum'")
print(f"library: torch {VERSION}: autograd of F.cross_entropy: g[0, 1:] = {row[1]!r} (each), "
      f"g[0, 0] = {row[0]!r}; row sum {mpmath.nstr(got_sum, 6)}")
print(f"true:    g[0, 1:] = {mpmath.nstr(true_row[1], 8)}, "
      f"g[0, 0] = {mpmath.nstr(true_row[0], 8)}; "
      "row sum 0")
print(f"bound:   |row sum| <= {tol:.6g}")
print(f"error:   |row sum| = {mpmath.nstr(abs(got_sum), 6)} "
      f"(log_softmax stored as {torch.log_softmax(z.detach(), -1)[0, 0].item()!r}, "
      f"log(1/{V}) = {mpmath.nstr(mpmath.log(p), 8)})")
bad = abs(got_sum) > tol
print(f"verdict: {'REPRODUCES: |row sum| > bound' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
