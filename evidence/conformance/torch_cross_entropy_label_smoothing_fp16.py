"""torch: F.cross_entropy(label_smoothing > 0) on float16 logits computes the smoothing term
in float16: it overflows to inf for a large vocabulary and rounds several times otherwise.

cross_entropy_loss_label_smoothing (aten/src/ATen/native/LossNLL.cpp) takes log_softmax in
the input dtype, forms smooth_loss = −Σ_j log p_j as an fp16 tensor and combines
(1 − ε)·nll + ε/V·smooth_loss in fp16. For V = 32000 and logits spread over [−30, 30],
Σ_j log p_j ≈ −9.6e5 is beyond fp16's 65504, so the loss is inf although the true loss is
about 63. Where it does not overflow, log p, the nll term, the sum and the combination are
each rounded to fp16 (and the mean again), where fp32 arithmetic with one final rounding is
within half an fp16 ulp. Without label smoothing the fp16 loss is within the bound.

Backs FALSIFY-CE-001/float16 (per-row loss parity), FALSIFY-CE-002/float16 (reduced loss
parity) and FALSIFY-CE-009/float16 (mean over the non-ignored tokens) of
cross-entropy-kernel-v1, F.cross_entropy binding.
Run: python torch_cross_entropy_label_smoothing_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import torch
import torch.nn.functional as F

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS16, U32 = 2.0 ** -10, 1.1920929e-07


def smoothed_ce(row, label, eps):
    """(1 − ε)(lse − z_y) + ε(lse − mean_j z_j): cross-entropy against (1 − ε)e_y + ε/V."""
    z = [mpmath.mpf(v) for v in row]
    m = max(z)
    lse = m + mpmath.log(mpmath.fsum(mpmath.exp(v - m) for v in z))
    return (1 - eps) * (lse - z[label]) + eps * (lse - mpmath.fsum(z) / len(z))


def tol(T, V):
    """FALSIFY-CE-002 / CE-009 float16 tolerance (cross-entropy-kernel-v1.yaml): atol
    T·68·(⌈V/1024⌉ + ⌈log2(V + 1)⌉ + 2)·eps32 (each row's fp32 logsumexp and combination),
    rtol eps16/2 + (T + 2)·eps32 (the reduction's sum and division, ONE rounding to fp16)."""
    return (T * 68 * (math.ceil(V / 1024) + math.ceil(math.log2(V + 1)) + 2) * U32,
            EPS16 / 2 + (T + 2) * U32)


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true) if math.isfinite(lib) else mpmath.inf
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: torch {VERSION}: {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 15)}")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


bad = []
# FALSIFY-CE-001/float16: one row, reduction 'none'. Tolerance (cross-entropy-kernel-v1.yaml):
# atol 68·(⌈V/1024⌉ + ⌈log2(V + 1)⌉ + 2)·eps32 (the row's fp32 logsumexp and combination),
# rtol eps16/2 (ONE rounding to fp16)
Z1 = [[-10.4453125, 14.0546875, 20.703125, -10.65625, -20.71875, 29.5, 25.15625, -12.609375]]
y = F.cross_entropy(torch.tensor(Z1, dtype=torch.float16), torch.tensor([3]),
                    label_smoothing=0.1, reduction="none")
true = smoothed_ce(Z1[0], 3, mpmath.mpf("0.1"))
atol = tol(1, 8)[0]
bad.append(report("FALSIFY-CE-001/float16 (one row with label smoothing)",
                  f"logits {Z1} (float16), label [3], label_smoothing 0.1, reduction 'none'",
                  "F.cross_entropy(...)", y.item(), true, atol + EPS16 / 2 * abs(true)))

# FALSIFY-CE-002/float16: one row of V = 32000 logits evenly spread over [−30, 30]
V = 32000
z = torch.linspace(-30.0, 30.0, V).to(torch.float16)[None]
label = torch.tensor([0])
y = F.cross_entropy(z, label, label_smoothing=0.1, reduction="none")
plain = F.cross_entropy(z, label, reduction="none")
true = smoothed_ce(z[0].tolist(), 0, mpmath.mpf("0.1"))
atol, rtol = tol(1, V)
bad.append(report(
    "FALSIFY-CE-002/float16 (label smoothing, large vocabulary)",
    f"logits [1, {V}] float16 = torch.linspace(-30, 30, {V}).half(), label [0], "
    "label_smoothing 0.1, reduction 'none'",
    "F.cross_entropy(...)", y.item(), true, atol + rtol * abs(true)))
print(f"         (the same call without label smoothing: {plain.item()!r}, finite)\n")

# FALSIFY-CE-009/float16: the contract's example {T 16, V 3}, 6 rows ignored (label −1)
Z = [[-24.015625, 12.0703125, -17.140625], [28.84375, 17.046875, 14.5859375],
     [13.3203125, 21.390625, 13.5390625], [-14.890625, -19.0, 19.4375],
     [25.296875, 14.6796875, -4.5], [-12.8046875, 9.8828125, -28.59375],
     [-26.546875, -5.6015625, -21.171875], [5.65234375, -18.203125, -4.421875],
     [-1.7890625, -26.078125, 26.71875], [-9.6015625, 25.1875, 3.681640625],
     [19.921875, 15.0, 26.703125], [-23.3125, 14.7890625, -23.15625],
     [-15.609375, -7.9140625, -1.0322265625], [-18.6875, -16.265625, 16.75],
     [25.390625, -9.34375, -22.890625], [-8.671875, 19.953125, 18.296875]]
Y = [-1, 1, 2, 2, 0, -1, 0, 0, 1, -1, 1, -1, 2, -1, 0, -1]
y = F.cross_entropy(torch.tensor(Z, dtype=torch.float16), torch.tensor(Y), ignore_index=-1,
                    label_smoothing=0.1, reduction="mean")
kept = [(r, l) for r, l in zip(Z, Y) if l != -1]
true = mpmath.fsum(smoothed_ce(r, l, mpmath.mpf("0.1")) for r, l in kept) / len(kept)
atol, rtol = tol(16, 3)
bad.append(report(
    "FALSIFY-CE-009/float16 (mean with label smoothing)",
    f"logits [16, 3] float16 = {Z}, labels = {Y}, ignore_index -1, label_smoothing 0.1, "
    "reduction 'mean'",
    "F.cross_entropy(...)", y.item(), true, atol + rtol * abs(true)))

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
