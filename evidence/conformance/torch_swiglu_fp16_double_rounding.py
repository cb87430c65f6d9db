"""torch: SwiGLU written as F.silu(gate) * up rounds twice in float16.

F.silu returns its result in the input dtype, so in float16 silu(gate) is rounded to fp16
and the product with `up` is rounded again; the backward of the same expression rounds
dy·up to fp16 before silu_backward. A fused SwiGLU (one fp32 evaluation, one rounding) stays
within half an fp16 ulp; the two-op form is off by up to about one ulp.

Backs FALSIFY-SWG-001/float16, FALSIFY-SWG-002/float16 and FALSIFY-SWG-003/float16 of
swiglu-kernel-v1. Run: python torch_swiglu_fp16_double_rounding.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
import torch.nn.functional as F

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS16, U32 = 2.0 ** -10, 1.2e-7  # fp16 machine epsilon; the contract's fp32 unit (≈ 2^-23)


def sigma(g):
    return 1 / (1 + mpmath.exp(-g))


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


def forward_case(name, gate, up, gmax):
    g = torch.tensor([gate], dtype=torch.float16)
    u = torch.tensor([up], dtype=torch.float16)
    y = (F.silu(g) * u).item()
    G, Uv = mpmath.mpf(g.item()), mpmath.mpf(u.item())
    true = G * sigma(G) * Uv
    # FALSIFY-SWG-001/002 float16 tolerance (swiglu-kernel-v1.yaml):
    #   atol 6.0e-8, rtol eps/2 + (4 + min(gmax, 104)/2)·1.2e-7: the fp32 error of σ, the two
    #   products, plus ONE final rounding to fp16 (eps/2). gmax is the input range's bound:
    #   20 for the `rows` input (SWG-001), 1e4 for `large` (SWG-002).
    rtol = EPS16 / 2 + (4 + min(gmax, 104) / 2) * U32
    bound = 6.0e-8 + rtol * abs(true)
    return report(name, f"gate = {g.item()!r}, up = {u.item()!r} (float16, shape [1])",
                  "F.silu(gate) * up", y, true, bound)


def backward_case(name, gate, up, dy):
    g = torch.tensor([gate], dtype=torch.float16, requires_grad=True)
    u = torch.tensor([up], dtype=torch.float16)
    d = torch.tensor([dy], dtype=torch.float16)
    (F.silu(g) * u).backward(d)
    lib = g.grad.item()
    G, Uv, D = mpmath.mpf(g.item()), mpmath.mpf(u.item()), mpmath.mpf(d.item())
    s = sigma(G)
    true = D * Uv * s * (1 + G * (1 - s))  # d/dgate of silu(g)·u, exactly
    # FALSIFY-SWG-003 float16 tolerance: atol (gmax + 8)·1.2e-7·ref_max + 24·1.2e-7 + 6e-8,
    # rtol eps/2 + (4 + gmax/2)·1.2e-7 with gmax = 20. ref_max is max|d_gate| over the
    # contract's case ([3, 67], ref_max 6.74): atol 2.56e-5, the value the finding states;
    # it is looser than this one element's own (|d_gate| = 0.31) would give.
    rtol = EPS16 / 2 + (4 + 20 / 2) * U32
    bound = 2.56e-5 + rtol * abs(true)
    return report(name, f"gate = {g.item()!r}, up = {u.item()!r}, dy = {d.item()!r} (float16)",
                  "autograd d/dgate of F.silu(gate) * up", lib, true, bound)


bad = [
    forward_case("FALSIFY-SWG-001/float16 (parity, gate in [-20, 20])", 4.234375, -0.884765625,
                 gmax=20),
    forward_case("FALSIFY-SWG-002/float16 (parity at large |gate|)", -9.015625, 1.599609375,
                 gmax=1e4),
    backward_case("FALSIFY-SWG-003/float16 (backward)", 0.06365966796875, 2.94140625,
                  -0.1995849609375),
]
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
