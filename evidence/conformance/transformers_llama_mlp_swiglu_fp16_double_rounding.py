"""transformers: LlamaMLP's `act_fn(gate_proj(x)) * up_proj(x)` rounds twice in float16.

ACT2FN["silu"] (nn.functional.silu) returns silu(gate) rounded to fp16 and the product with
up is rounded again: two roundings where a fused SwiGLU (one fp32 evaluation) leaves one. Its
autograd backward rounds dy·up to fp16 before silu's backward, which rounds again. silu alone
and every fp32 case are within the contract's bounds.

The projections here are 1×1 with weights chosen so that gate_proj(x), up_proj(x) and
down_proj(y) are exact (x = 1, down weight 1): the error is the activation-and-product line.

Backs FALSIFY-SWG-001/float16, FALSIFY-SWG-002/float16 and FALSIFY-SWG-003/float16 of
swiglu-kernel-v1 (binding ACT2FN["silu"], LlamaMLP's product).
Run: python transformers_llama_mlp_swiglu_fp16_double_rounding.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32 = 2.0 ** -10, 1.2e-7  # fp16 machine epsilon; the contract's fp32 unit (≈ 2^-23)


def mlp(gate_w, up_w):
    config = LlamaConfig(hidden_size=1, intermediate_size=1, num_attention_heads=1,
                         num_key_value_heads=1, hidden_act="silu")
    m = LlamaMLP(config).half()
    with torch.no_grad():
        m.gate_proj.weight.fill_(gate_w)
        m.up_proj.weight.fill_(up_w)
        m.down_proj.weight.fill_(1.0)
    return m


def sigma(g):
    return 1 / (1 + mpmath.exp(-g))


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true)
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: transformers {VERSION}: {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 17)}")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)} ({mpmath.nstr(err / abs(true), 3)} relative)")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


x = torch.ones(1, 1, dtype=torch.float16)
bad = []
# FALSIFY-SWG-001/002 float16 tolerance (swiglu-kernel-v1.yaml): atol 6e-8,
# rtol eps16/2 + (4 + min(gmax, 104)/2)·1.2e-7 (fp32 σ and products, ONE fp16 rounding);
# gmax = 20 for the `rows` input (SWG-001), 1e4 for `large` (SWG-002)
for name, g, u, gmax in (("FALSIFY-SWG-001/float16 (parity)", 4.234375, -0.884765625, 20),
                         ("FALSIFY-SWG-002/float16 (parity at large |gate|)", -9.015625,
                          1.599609375, 1e4)):
    y = mlp(g, u)(x).item()
    G, U = mpmath.mpf(g), mpmath.mpf(u)
    true = G * sigma(G) * U
    bound = 6.0e-8 + (EPS16 / 2 + (4 + min(gmax, 104) / 2) * U32) * abs(true)
    bad.append(report(name, f"x = [[1.0]], gate_proj.weight = {g}, up_proj.weight = {u}, "
                            "down_proj.weight = 1 (float16): gate = "
                            f"{g}, up = {u}", "LlamaMLP(x) = act_fn(gate) * up", y, true, bound))

# FALSIFY-SWG-003/float16: d/dgate (= the gate_proj weight's gradient, x = 1) for upstream dy.
# Tolerance: atol (gmax + 8)·1.2e-7·ref_max + 24·1.2e-7 + 6e-8, rtol eps16/2 + (4 + gmax/2)·1.2e-7,
# gmax = 20; ref_max (max|d_gate| over the contract's case, 6.74) gives atol 2.56e-5.
g, u, dy = 0.06365966796875, 2.94140625, -0.1995849609375
m = mlp(g, u)
m(x).backward(torch.tensor([[dy]], dtype=torch.float16))
G, U, Dy = mpmath.mpf(g), mpmath.mpf(u), mpmath.mpf(dy)
s = sigma(G)
true = Dy * U * s * (1 + G * (1 - s))
bound = 2.56e-5 + (EPS16 / 2 + (4 + 20 / 2) * U32) * abs(true)
bad.append(report("FALSIFY-SWG-003/float16 (backward)",
                  f"x = [[1.0]], gate = {g}, up = {u}, dy = {dy} (float16)",
                  "autograd d/dgate (gate_proj.weight.grad)", m.gate_proj.weight.grad.item(),
                  true, bound))
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
