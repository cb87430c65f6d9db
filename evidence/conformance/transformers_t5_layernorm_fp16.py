"""transformers: T5LayerNorm in float16 rounds twice.

T5LayerNorm.forward computes the variance in fp32, scales x by the fp32 rsqrt (x promoted to
fp32), casts the normalized row to the fp16 weight's dtype (`hidden_states.to(self.weight.
dtype)`) and multiplies by the fp16 weight, which rounds again: two fp16 roundings where
rmsnorm-kernel-v1 allows one after fp32 arithmetic (FALSIFY-RN-001/-002, and -006 for the
gradient through the same ops). The compiled weight gradient: transformers_t5_layernorm_compile.py.

Backs FALSIFY-RN-001/float16, -002/float16 and -006/float16 of rmsnorm-kernel-v1 (binding
T5LayerNorm).
Run: python transformers_t5_layernorm_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.models.t5.modeling_t5 import T5LayerNorm

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32 = 2.0 ** -10, 1.2e-7
N, EPS = 4099, 1e-6

gen = torch.Generator().manual_seed(0)
x = (torch.rand(1, N, generator=gen) * 200 - 100).to(torch.float16)
w = (torch.rand(N, generator=gen) * 2 - 1).to(torch.float16)
norm = T5LayerNorm(N, eps=EPS).to(torch.float16)
with torch.no_grad():
    norm.weight.copy_(w)
    y = norm(x)[0].tolist()

xs = [mpmath.mpf(v) for v in x[0].tolist()]
inv = 1 / mpmath.sqrt(sum(v * v for v in xs) / N + EPS)
true = [mpmath.mpf(wi) * v * inv for wi, v in zip(w.tolist(), xs)]
# FALSIFY-RN-001 float16 tolerance: atol 6e-8, rtol eps16/2 + (n/2 + 8)·1.2e-7
rtol = EPS16 / 2 + (N / 2 + 8) * U32
ratio = [abs(mpmath.mpf(g) - t) / (6.0e-8 + rtol * abs(t)) for g, t in zip(y, true)]
i = max(range(N), key=lambda j: ratio[j])
over = sum(r > 1 for r in ratio)
bad = []
print("case FALSIFY-RN-001/float16 (forward, one row of n = 4099)")
print(f"input:   x ~ U(-100, 100), w ~ U(-1, 1) (float16, seed 0), eps {EPS}; worst element {i}: "
      f"x = {x[0, i].item()!r}, w = {w[i].item()!r}")
print(f"library: transformers {VERSION} (torch {torch.__version__}): T5LayerNorm(x)[{i}] = "
      f"{y[i]!r}")
print(f"true:    {mpmath.nstr(true[i], 17)}")
print(f"bound:   {mpmath.nstr(6.0e-8 + rtol * abs(true[i]), 6)} "
      f"(atol 6e-8 + rtol {rtol:.4g}·|true|)")
print(f"error:   {mpmath.nstr(abs(mpmath.mpf(y[i]) - true[i]), 6)}; {over} of {N} elements "
      "beyond the bound")
bad.append(over > 0)

print("verdict: " + ("REPRODUCES" if any(bad) else "does not reproduce")
      + f" ({sum(bad)} of {len(bad)} cases)")
sys.exit(1 if any(bad) else 0)
