"""torch: the derivatives of F.gelu(x, approximate="tanh") lose precision for x < -2.5.

GeluBackwardKernelImpl forms the tanh-form derivative from t = tanh(inner):
left_derivative = 0.5·(1 + t), right_derivative = 0.5·x·(1 − t²)·β·(1 + 3κx²), and
gelu_double_backward differentiates those. For negative x, 1 + t and 1 − t² cancel (t → −1),
so the fp32 result carries an absolute error of order eps·|x| on a value that is itself
small: relative errors of 1e-4 where the result is a few eps from exact if computed as
σ(2u) with σ(−2u) evaluated directly (½·(1 + tanh u) = σ(2u)).

Backs FALSIFY-GELU-020 (double backward) and FALSIFY-GELU-023 (forward-mode jvp, which
torch computes with gelu_backward) of gelu-kernel-v1.
Run: python torch_gelu_tanh_derivative_cancellation.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
import torch.nn.functional as F

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
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
    print(f"library: torch {VERSION}: {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 17)}")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)} ({mpmath.nstr(err / abs(true), 3)} relative)")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


# FALSIFY-GELU-020: S = Σ⟨dx, v⟩ with dx = autograd's gelu backward (create_graph), then
# ∂S/∂x = dy·v·gelu″(x). Contract bound: atol 64·eps32·ref_max, ref_max = max|∂S/∂x| over
# the coordinates compared (here the one element, dy = v = 1), i.e. 64·eps relative.
x = torch.tensor([-3.6534], dtype=torch.float32, requires_grad=True)
dy = torch.ones(1)
v = torch.ones(1)
(dx,) = torch.autograd.grad(gelu_tanh(x), x, dy, create_graph=True)
(d2,) = torch.autograd.grad((dx * v).sum(), x)
X = mpmath.mpf(x.item())
true2 = exact_derivatives(X)[1]
bad20 = report("FALSIFY-GELU-020 (double backward of the tanh form)",
               f"x = {x.item()!r} (float32, shape [1]), dy = v = 1",
               "d/dx <autograd.grad(F.gelu(x, 'tanh'), x, dy, create_graph=True), v>",
               d2.item(), true2, 64 * EPS32 * abs(true2))

# FALSIFY-GELU-023: Σ⟨dy, J·t⟩ from torch.func.jvp, = dy·t·gelu′(x) for one element.
# Contract bound: atol 32·eps32·M, M = Σ|dy|·|t|·|gelu′(x)| (= |gelu′(x)| here).
x = torch.tensor([-3.8678], dtype=torch.float32)
t = torch.ones(1)
_, jt = torch.func.jvp(gelu_tanh, (x,), (t,))
X = mpmath.mpf(x.item())
true1 = exact_derivatives(X)[0]
bad23 = report("FALSIFY-GELU-023 (forward mode of the tanh form)",
               f"x = {x.item()!r} (float32, shape [1]), tangent t = 1, dy = 1",
               "torch.func.jvp(F.gelu(., approximate='tanh'), (x,), (t,))[1]",
               jt.item(), true1, 32 * EPS32 * abs(true1))

print(f"summary: {bad20 + bad23} of 2 cases beyond the contract's bound")
sys.exit(1 if (bad20 or bad23) else 0)
