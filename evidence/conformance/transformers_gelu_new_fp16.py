"""transformers: ACT2FN["gelu_new"] in float16 is off by up to 3 %.

NewGELUActivation.forward evaluates 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) op by op in
x's dtype: in float16 each of its ~8 operations rounds to fp16, and 1 + tanh(u) cancels for
negative x (tanh(u) → −1), so the rounding error of tanh(u) becomes the result's. Its
gradient is autograd through the same fp16 operations. ACT2FN["gelu_pytorch_tanh"] (fp32
internally, one rounding) is within the contract's bound on the same inputs.

Backs FALSIFY-GELU-003/float16, FALSIFY-GELU-004/float16 and FALSIFY-GELU-006/float16 of
gelu-kernel-v1 (binding ACT2FN["gelu"/"gelu_new"]).
Run: python transformers_gelu_new_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.activations import ACT2FN

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32 = 2.0 ** -10, 1.2e-7  # fp16 machine epsilon; the contract's fp32 unit (≈ 2^-23)
C, K = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")


def gelu_tanh(x):
    """½·x·(1 + tanh u) = x·σ(2u), u = √(2/π)(x + κx³), and its derivative."""
    z = 2 * C * (x + K * x ** 3)
    s = 1 / (1 + mpmath.exp(-z))
    return x * s, s + x * s * (1 - s) * 2 * C * (1 + 3 * K * x ** 2)


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true)
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: transformers {VERSION} (torch {torch.__version__}): {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 17)}")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)} ({mpmath.nstr(err / abs(true), 3)} relative)")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


act = ACT2FN["gelu_new"]
bad = []
# FALSIFY-GELU-003/004 float16 tolerance (gelu-kernel-v1.yaml): atol 2·1.2e-7 + 6e-8,
# rtol eps16/2 + 6·1.2e-7: the fp32 evaluation's error plus ONE rounding to fp16.
for name, xv in (("FALSIFY-GELU-003/float16 (tanh form parity)", -2.677734375),
                 ("FALSIFY-GELU-004/float16 (tanh form, wide range)", -2.578125)):
    x = torch.tensor([xv], dtype=torch.float16)
    y = act(x).item()
    true = gelu_tanh(mpmath.mpf(x.item()))[0]
    bound = 2 * U32 + 6.0e-8 + (EPS16 / 2 + 6 * U32) * abs(true)
    bad.append(report(name, f"x = {x.item()!r} (float16, shape [1])",
                      'ACT2FN["gelu_new"](x)', y, true, bound))

# FALSIFY-GELU-006/float16: autograd's d/dx with upstream dy. Tolerance: atol
# 4·1.2e-7·ref_max + 1e-6 + 6e-8, rtol eps16/2; ref_max = max|dx_ref| over the input
# (the one element here).
x = torch.tensor([-2.677734375], dtype=torch.float16, requires_grad=True)
dy = torch.tensor([0.317138671875], dtype=torch.float16)
act(x).backward(dy)
true = mpmath.mpf(dy.item()) * gelu_tanh(mpmath.mpf(x.item()))[1]
bound = 4 * U32 * abs(true) + 1.0e-6 + 6.0e-8 + EPS16 / 2 * abs(true)
bad.append(report("FALSIFY-GELU-006/float16 (tanh form backward)",
                  f"x = {x.item()!r}, dy = {dy.item()!r} (float16, shape [1])",
                  'autograd d/dx of ACT2FN["gelu_new"](x)', x.grad.item(), true, bound))

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
