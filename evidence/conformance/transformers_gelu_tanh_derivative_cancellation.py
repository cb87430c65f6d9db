"""transformers: the derivatives of the tanh GELUs lose precision for x < -2.5.

ACT2FN["gelu_pytorch_tanh"] is torch's F.gelu(approximate="tanh"), whose backward
(GeluBackwardKernelImpl) forms 0.5·(1 + t) and 0.5·x·(1 − t²)·β·(1 + 3κx²) from
t = tanh(inner); ACT2FN["gelu_new"] (NewGELUActivation) writes
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) in torch ops, and autograd differentiates the same
1 + tanh(u). Both cancel as tanh(u) → −1: the fp32 first and second derivatives carry an
absolute error of order eps·|x| on small values (1e-4 relative), where the σ(2u) form,
½·(1 + tanh u) = σ(2u) with σ(−2u) computed directly, is accurate to a few eps.

Backs FALSIFY-GELU-020 (double backward) and FALSIFY-GELU-023 (forward-mode jvp) of
gelu-kernel-v1 for both ACT2FN bindings.
Run: python transformers_gelu_tanh_derivative_cancellation.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.activations import ACT2FN

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS32 = 2.0 ** -23
C, K = mpmath.sqrt(2 / mpmath.pi), mpmath.mpf("0.044715")


def exact_derivatives(x):
    """gelu_tanh(x) = x·σ(z), z = 2√(2/π)(x + κx³): its first and second derivatives."""
    z = 2 * C * (x + K * x ** 3)
    z1, z2 = 2 * C * (1 + 3 * K * x ** 2), 2 * C * 6 * K * x
    s = 1 / (1 + mpmath.exp(-z))
    s1 = s * (1 - s) * z1
    s2 = s * (1 - s) * (1 - 2 * s) * z1 ** 2 + s * (1 - s) * z2
    return s + x * s1, 2 * s1 + x * s2


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


bad = []
for name in ("gelu_pytorch_tanh", "gelu_new"):
    act = ACT2FN[name]
    # FALSIFY-GELU-020: S = Σ⟨dx, v⟩, dx = autograd's backward (create_graph); ∂S/∂x =
    # dy·v·gelu″(x). Contract bound: atol 64·eps32·ref_max, ref_max = max|∂S/∂x| over the
    # coordinates compared (the one element here, dy = v = 1): 64·eps relative.
    x = torch.tensor([-3.6534], dtype=torch.float32, requires_grad=True)
    (dx,) = torch.autograd.grad(act(x), x, torch.ones(1), create_graph=True)
    (d2,) = torch.autograd.grad(dx.sum(), x)
    true2 = exact_derivatives(mpmath.mpf(x.item()))[1]
    bad.append(report(f"FALSIFY-GELU-020, ACT2FN[{name!r}] (double backward)",
                      f"x = {x.item()!r} (float32, shape [1]), dy = v = 1",
                      f"d/dx of autograd.grad(ACT2FN[{name!r}](x), x, create_graph=True)",
                      d2.item(), true2, 64 * EPS32 * abs(true2)))
    # FALSIFY-GELU-023: Σ⟨dy, J·t⟩ from torch.func.jvp = dy·t·gelu′(x) for one element.
    # Contract bound: atol 32·eps32·M, M = Σ|dy|·|t|·|gelu′(x)| (= |gelu′(x)| here).
    x = torch.tensor([-3.8678], dtype=torch.float32)
    _, jt = torch.func.jvp(act, (x,), (torch.ones(1),))
    true1 = exact_derivatives(mpmath.mpf(x.item()))[0]
    bad.append(report(f"FALSIFY-GELU-023, ACT2FN[{name!r}] (forward mode)",
                      f"x = {x.item()!r} (float32, shape [1]), tangent t = 1, dy = 1",
                      f"torch.func.jvp(ACT2FN[{name!r}], (x,), (t,))[1]",
                      jt.item(), true1, 32 * EPS32 * abs(true1)))

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
