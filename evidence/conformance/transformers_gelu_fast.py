"""transformers: ACT2FN["gelu_fast"] is off by up to 3 % in float16, and its fp32 derivatives
lose precision for x < -2.5.

FastGELUActivation.forward evaluates 0.5·x·(1 + tanh(x·0.7978845608·(1 + 0.044715·x²))) op by
op in x's dtype: in float16 every operation rounds to fp16, and 1 + tanh(u) cancels for
negative x (tanh(u) → −1), so the rounding error of tanh(u) becomes the result's; its gradient
is autograd through the same fp16 operations. In fp32 autograd differentiates the same
1 + tanh(u) (first and second derivatives, and torch.func.jvp), which cancels the same way,
where the σ(2u) form (½·(1 + tanh u) = σ(2u), σ(−2u) computed directly) is accurate to a few
eps. The constant 0.7978845608 (√(2/π) cut to 10 digits) moves the result by < 4e-12
relative, far below every bound here.

Backs FALSIFY-GELU-003/float16, -004/float16, -006/float16, FALSIFY-GELU-020 and
FALSIFY-GELU-023 of gelu-kernel-v1 (binding ACT2FN["gelu"/"gelu_fast"]).
Run: python transformers_gelu_fast.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.activations import ACT2FN

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32, EPS32 = 2.0 ** -10, 1.2e-7, 2.0 ** -23
C, K = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")


def gelu_tanh(x):
    """x·σ(z), z = 2√(2/π)(x + κx³), the contract's tanh form, and its two derivatives."""
    z = 2 * C * (x + K * x ** 3)
    z1, z2 = 2 * C * (1 + 3 * K * x ** 2), 2 * C * 6 * K * x
    s = 1 / (1 + mpmath.exp(-z))
    s1 = s * (1 - s) * z1
    s2 = s * (1 - s) * (1 - 2 * s) * z1 ** 2 + s * (1 - s) * z2
    return x * s, s + x * s1, 2 * s1 + x * s2


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true)
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: transformers {VERSION} (torch {torch.__version__}): {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 17)}")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)} ({mpmath.nstr(err / abs(true), 3)} relative)")
    print("verdict: " + ("REPRODUCES: error > bound" if bad
                         else "does not reproduce: error <= bound"))
    print()
    return bad


act = ACT2FN["gelu_fast"]
bad = []
# FALSIFY-GELU-003/004 float16 tolerance (gelu-kernel-v1.yaml): atol 2·1.2e-7 + 6e-8,
# rtol eps16/2 + 6·1.2e-7: the fp32 evaluation's error plus ONE rounding to fp16.
for name, xv in (("FALSIFY-GELU-003/float16 (tanh form parity)", -2.677734375),
                 ("FALSIFY-GELU-004/float16 (tanh form, wide range)", -2.578125)):
    x = torch.tensor([xv], dtype=torch.float16)
    true = gelu_tanh(mpmath.mpf(x.item()))[0]
    bound = 2 * U32 + 6.0e-8 + (EPS16 / 2 + 6 * U32) * abs(true)
    bad.append(report(name, f"x = {x.item()!r} (float16, shape [1])",
                      'ACT2FN["gelu_fast"](x)', act(x).item(), true, bound))

# FALSIFY-GELU-006/float16: autograd's d/dx with upstream dy; atol 4·1.2e-7·ref_max + 1e-6 +
# 6e-8, rtol eps16/2 (ref_max = |dx_ref| for the one element here).
x = torch.tensor([-2.677734375], dtype=torch.float16, requires_grad=True)
dy = torch.tensor([0.317138671875], dtype=torch.float16)
act(x).backward(dy)
true = mpmath.mpf(dy.item()) * gelu_tanh(mpmath.mpf(x.item()))[1]
bound = 4 * U32 * abs(true) + 1.0e-6 + 6.0e-8 + EPS16 / 2 * abs(true)
bad.append(report("FALSIFY-GELU-006/float16 (tanh form backward)",
                  f"x = {x.item()!r}, dy = {dy.item()!r} (float16, shape [1])",
                  'autograd d/dx of ACT2FN["gelu_fast"](x)', x.grad.item(), true, bound))

# FALSIFY-GELU-020: ∂S/∂x of S = Σ⟨dx, v⟩ (dy = v = 1) is gelu″(x); atol 64·eps32·ref_max
x = torch.tensor([-3.6534], dtype=torch.float32, requires_grad=True)
(dx,) = torch.autograd.grad(act(x), x, torch.ones(1), create_graph=True)
(d2,) = torch.autograd.grad(dx.sum(), x)
true2 = gelu_tanh(mpmath.mpf(x.item()))[2]
bad.append(report('FALSIFY-GELU-020, ACT2FN["gelu_fast"] (double backward)',
                  f"x = {x.item()!r} (float32, shape [1]), dy = v = 1",
                  'd/dx of autograd.grad(ACT2FN["gelu_fast"](x), x, create_graph=True)',
                  d2.item(), true2, 64 * EPS32 * abs(true2)))

# FALSIFY-GELU-023: Σ⟨dy, J·t⟩ from torch.func.jvp, one element: gelu′(x); atol 32·eps32·M
x = torch.tensor([-3.8678], dtype=torch.float32)
_, jt = torch.func.jvp(act, (x,), (torch.ones(1),))
true1 = gelu_tanh(mpmath.mpf(x.item()))[1]
bad.append(report('FALSIFY-GELU-023, ACT2FN["gelu_fast"] (forward mode)',
                  f"x = {x.item()!r} (float32, shape [1]), tangent t = 1, dy = 1",
                  'torch.func.jvp(ACT2FN["gelu_fast"], (x,), (t,))[1]', jt.item(), true1,
                  32 * EPS32 * abs(true1)))

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
