"""mergekit: the TIES merge of float16 tensors is computed in float16.

GeneralizedTaskArithmeticMerge.merge_group works in base.dtype: the task vectors θ − base,
the weighted vectors w·τ, the masked sums, the division by the summed weights and base + λ·δ
are each rounded to fp16, where fp32 arithmetic with one final rounding to fp16 is within
half an ulp. A single model merged with itself returns a value 2 ulps off θ; a zero task
vector (a model equal to the base) perturbs the result far beyond rounding where θ − base
cancels.

Backs FALSIFY-MRG-011/float16 (TIES parity) and FALSIFY-MRG-013/float16 (a zero task vector
does not dilute the disjoint mean) of merging-kernel-v1, binding ties.
Run: python mergekit_ties_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from mergekit.merge_methods import registry
from mergekit.merge_methods.base import TensorGroup

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("mergekit")
EPS16, EPS32, TINY16 = 2.0 ** -10, 2.0 ** -23, 2.0 ** -14
f16 = torch.float16


def ties(base, models, weights, density, lam):
    group = TensorGroup.from_tensors([base, *models], base_index=0)
    ids = [e.id for e in group.non_base]
    return registry.get("ties").merge_group(
        group, weight=dict(zip(ids, weights)), density=dict.fromkeys(ids, density),
        int8_mask=False, normalize=True, rescale=False, **{"lambda": lam})


def bound_of(k, lam, ref):
    """FALSIFY-MRG-011/013 float16 (merging-kernel-v1): atol (4λ(k + 3) + 1 + 2λ)·eps32 +
    tiny16·eps16/2, rtol eps16/2: the float32 evaluation and ONE rounding to fp16."""
    return (4 * lam * (k + 3) + 1 + 2 * lam) * EPS32 + TINY16 * EPS16 / 2 + EPS16 / 2 * abs(ref)


bad = []
# FALSIFY-MRG-011/float16: k = 1 model: the elected sign is τ's own, δ = w·τ / w = τ, and
# θ_merged = base + λ·τ = θ exactly for λ = 1
base, theta, w = 0.42333984375, -0.4423828125, 0.362548828125
y = ties(torch.tensor([[base]], dtype=f16), [torch.tensor([[theta]], dtype=f16)], [w], 0.25, 1.0)
true = mpmath.mpf(base) + 1 * (mpmath.mpf(theta) - base)
err = abs(mpmath.mpf(y.item()) - true)
b = bound_of(1, 1.0, true)
print("case FALSIFY-MRG-011/float16: one model")
print(f"input:   base = [[{base}]], model = [[{theta}]] (float16), weight {w}, density 0.25, "
      "lambda 1, normalize True, rescale False")
print(f"library: mergekit {VERSION}: ties merge_group -> {y.item()!r}")
print(f"true:    base + lambda·(theta - base) = {mpmath.nstr(true, 12)}")
print(f"bound:   {mpmath.nstr(mpmath.mpf(b), 6)}")
print(f"error:   {mpmath.nstr(err, 6)}")
bad.append(err > b)
print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
print()

# FALSIFY-MRG-013/float16: k = 2, model 0 = base (τ_0 = 0), model 1 = θ*, density 1, λ = 1:
# the result is base + λ(θ* − base) = θ* exactly
B = [[-0.990234375, 0.5234375, 0.253662109375, 0.89599609375, 0.86083984375, -0.1563720703125]]
T = [[-0.77783203125, -0.1610107421875, -0.2064208984375, 4.4226646423339844e-05,
      -0.50146484375, -0.34765625]]
W = [0.337646484375, 0.60302734375]
bt, tt = torch.tensor(B, dtype=f16), torch.tensor(T, dtype=f16)
y = ties(bt, [bt.clone(), tt], W, 1.0, 1.0).flatten().tolist()
true = [mpmath.mpf(b0) + (mpmath.mpf(t0) - b0) for b0, t0 in zip(B[0], T[0])]
errs = [abs(mpmath.mpf(a) - t) for a, t in zip(y, true)]
bounds = [bound_of(2, 1.0, t) for t in true]
j = max(range(len(y)), key=lambda i: errs[i] / bounds[i])
print("case FALSIFY-MRG-013/float16: model 0 = base, model 1 = theta*")
print(f"input:   base = {B}, models = [base, theta*], theta* = {T} (float16), weights {W}, "
      "density 1, lambda 1")
print(f"library: mergekit {VERSION}: {y}; element {j} = {y[j]!r}")
print(f"true:    base + lambda·(theta* - base) = theta*: element {j} = {mpmath.nstr(true[j], 12)}")
print(f"bound:   element {j}: {mpmath.nstr(mpmath.mpf(bounds[j]), 6)}")
print(f"error:   element {j}: {mpmath.nstr(errs[j], 6)} "
      f"({sum(e > b for e, b in zip(errs, bounds))} of {len(y)} elements beyond)")
bad.append(errs[j] > bounds[j])
print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
