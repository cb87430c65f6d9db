"""transformers: T5LayerNorm's float16 weight gradient depends on whether it is compiled.

Eager autograd of T5LayerNorm.forward forms d/dw from the fp16-rounded normalized rows
(`self.weight * hidden_states.to(self.weight.dtype)`) and reduces fp16 products; Inductor fuses
the cast and the reduction and keeps fp32, so d/dw differs between eager and torch.compile
beyond rmsnorm-kernel-v1's FALSIFY-RN-024 bound (the library's result depends on whether it is
compiled).

Backs FALSIFY-RN-024/float16 of rmsnorm-kernel-v1 (binding T5LayerNorm).
Run: python transformers_t5_layernorm_compile.py (exit 1 = reproduces; most of its time is
Inductor's compile).
"""
import importlib.metadata
import sys

import torch
from transformers.models.t5.modeling_t5 import T5LayerNorm

VERSION = importlib.metadata.version("transformers")
EPS = 1e-6
gen = torch.Generator().manual_seed(0)
bad = []
# FALSIFY-RN-024/float16: d/dw under torch.compile vs eager, the bound of the run's example
# (atol 4.74e-4 + rtol 9.77e-4·|eager|)
xg = (torch.rand(4, 64, generator=gen) * 4).to(torch.float16)
wg = (torch.rand(64, generator=gen) * 2).to(torch.float16)
dy = (torch.rand(4, 64, generator=gen) * 2 - 1).to(torch.float16)


def dw(fn):
    m = T5LayerNorm(64, eps=EPS).to(torch.float16)
    with torch.no_grad():
        m.weight.copy_(wg)
    (g,) = torch.autograd.grad((fn(m)(xg) * dy).sum(), [m.weight])
    return g


eager = dw(lambda m: m)
compiled = dw(lambda m: torch.compile(m, backend="inductor"))
diff = (compiled.float() - eager.float()).abs()
tol = 4.74e-4 + 9.77e-4 * eager.float().abs()
j = int((diff / tol).argmax())
print("case FALSIFY-RN-024/float16 (compiled vs eager d/dw, x [4, 64])")
print("input:   x ~ U(0, 4), w ~ U(0, 2), dy ~ U(-1, 1) (float16, seed 0)")
print(f"library: transformers {VERSION}: d/dw[{j}] compiled {compiled[j].item()!r}, eager "
      f"{eager[j].item()!r}")
print("true:    (the check compares the library with itself: eager is its reference)")
print(f"bound:   {tol[j].item():.6g} (atol 4.74e-4 + rtol 9.77e-4·|eager|)")
print(f"error:   {diff[j].item():.6g}; {int((diff > tol).sum())} of 64 beyond the bound")
bad.append(bool((diff > tol).any()))

print("verdict: " + ("REPRODUCES: compiled and eager d/dw differ beyond the bound" if any(bad)
                     else "does not reproduce"))
sys.exit(1 if any(bad) else 0)
