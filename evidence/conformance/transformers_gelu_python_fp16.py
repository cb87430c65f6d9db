"""transformers: ACT2FN["gelu_python"] in float16 is off by up to 1.2 %.

GELUActivation(use_gelu_python=True)._gelu_python evaluates x·0.5·(1 + erf(x/√2)) op by op in
x's dtype: in float16 the division, erf, the sum and both products each round to fp16, and
1 + erf(x/√2) cancels for negative x (erf → −1), so the fp16 rounding of erf becomes the
result's. Its gradient is autograd through the same fp16 operations. ACT2FN["gelu"] (torch's
F.gelu, fp32 internally, one rounding) is within the contract's bound on the same inputs.

Backs FALSIFY-GELU-001/float16 and FALSIFY-GELU-005/float16 of gelu-kernel-v1 (binding
ACT2FN["gelu_python"/"gelu_pytorch_tanh"]).
Run: python transformers_gelu_python_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers.activations import ACT2FN

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32 = 2.0 ** -10, 1.2e-7  # fp16 machine epsilon; the contract's fp32 unit (≈ 2^-23)
XMAX = 8  # the `acts` input's range [-8, 8] (the example the run failed on)


def gelu(x):
    """x·Φ(x) and its derivative Φ(x) + x·φ(x)."""
    phi = mpmath.exp(-x * x / 2) / mpmath.sqrt(2 * mpmath.pi)
    cdf = (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2
    return x * cdf, cdf + x * phi


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


act = ACT2FN["gelu_python"]
bad = []
# FALSIFY-GELU-001/float16: atol xmax·1.2e-7 + 6e-8, rtol eps16/2 + 4·1.2e-7
x = torch.tensor([-2.677734375], dtype=torch.float16)
true = gelu(mpmath.mpf(x.item()))[0]
bound = XMAX * U32 + 6.0e-8 + (EPS16 / 2 + 4 * U32) * abs(true)
bad.append(report("FALSIFY-GELU-001/float16 (exact form parity)",
                  f"x = {x.item()!r} (float16, shape [1])", 'ACT2FN["gelu_python"](x)',
                  act(x).item(), true, bound))

# FALSIFY-GELU-005/float16: d/dx with dy = 1; atol 4·1.2e-7·ref_max + 1e-6 + 6e-8, rtol eps16/2
# (ref_max = |dx_ref| for the one element here)
x = torch.tensor([-2.677734375], dtype=torch.float16, requires_grad=True)
act(x).backward(torch.ones(1, dtype=torch.float16))
true = gelu(mpmath.mpf(x.item()))[1]
bound = 4 * U32 * abs(true) + 1.0e-6 + 6.0e-8 + EPS16 / 2 * abs(true)
bad.append(report("FALSIFY-GELU-005/float16 (exact form backward)",
                  f"x = {x.item()!r}, dy = 1 (float16, shape [1])",
                  'autograd d/dx of ACT2FN["gelu_python"](x)', x.grad.item(), true, bound))

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
