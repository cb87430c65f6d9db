"""torch: stepped LinearLR and CosineAnnealingLR compute each rate from the previous one, and
the rounding of every step accumulates.

LinearLR.get_lr multiplies the current rate by 1 + (end − start)/(total·start + (t − 1)·(end −
start)) at every step, and CosineAnnealingLR.get_lr by (1 + cos(πt/T))/(1 + cos(π(t − 1)/T))
(the chainable form; the closed forms `_get_closed_form_lr` are used only by the deprecated
step(epoch)). Each step adds up to a few ulps of error, so after thousands of steps the rate
is off by tens of ulps: lr(43) of a 2000-step warmup misses 3e-4·43/2000 by 21 relative eps
(lr-schedule-kernel-v1 FALSIFY-LRS-004 allows 2), and the cosine decay of W = 375, T = 7500
by > 100·eps·lr_max (FALSIFY-LRS-001/-002 allow 8·eps·lr_max, the error of one closed-form
evaluation).

Backs FALSIFY-LRS-001, -002 and -004 of lr-schedule-kernel-v1 for
SequentialLR(LinearLR, CosineAnnealingLR) (and -004 for SequentialLR(LinearLR,
CosineAnnealingWarmRestarts), which shares the LinearLR warmup).
Run: python torch_sequentiallr_drift.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
import warnings

import mpmath
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS = 2.0 ** -52
START = 1e-16  # LinearLR refuses start_factor = 0


def rates(warmup, total, lr_max, lr_min, n):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr_max)
    sched = SequentialLR(opt, [LinearLR(opt, start_factor=START, end_factor=1.0,
                                        total_iters=warmup),
                               CosineAnnealingLR(opt, T_max=total - warmup, eta_min=lr_min)],
                         milestones=[warmup])
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    return out


def true_lr(s, warmup, total, lr_max, lr_min):
    lr_max, lr_min = mpmath.mpf(lr_max), mpmath.mpf(lr_min)
    if s < warmup:
        return lr_max * s / warmup
    if s < total:
        x = mpmath.mpf(s - warmup) / (total - warmup)
        return lr_min + (lr_max - lr_min) * (1 + mpmath.cos(mpmath.pi * x)) / 2
    return lr_min


bad = False
# FALSIFY-LRS-004: W = 2000, T = 5000, lr_max = 3e-4, lr_min = 3e-5, step 43; rtol 2·eps
got = rates(2000, 5000, 3e-4, 3e-5, 44)[43]
true = true_lr(43, 2000, 5000, 3e-4, 3e-5)
err = abs(mpmath.mpf(got) - true) / true
print("case FALSIFY-LRS-004: linear warmup, W = 2000, T = 5000, lr_max = 3e-4, step 43")
print(f"library: torch {VERSION}: SequentialLR(LinearLR(start_factor={START}), "
      f"CosineAnnealingLR) lr(43) = {got!r}")
print(f"true:    {mpmath.nstr(true, 20)}")
print(f"bound:   relative 2·eps = {2 * EPS:.3g}")
print(f"error:   relative {mpmath.nstr(err, 4)} = {mpmath.nstr(err / EPS, 4)} eps")
bad |= err > 2 * EPS

# FALSIFY-LRS-001/-002: the cosine phase of W = 375, T = 7500 (a seed config of the contract)
W, T, LR_MAX, LR_MIN = 375, 7500, 3e-4, 3e-5
ys = rates(W, T, LR_MAX, LR_MIN, T + 1)
errs = [abs(mpmath.mpf(ys[s]) - true_lr(s, W, T, LR_MAX, LR_MIN)) for s in range(T + 1)]
s = max(range(T + 1), key=lambda i: errs[i])
bound = 8 * EPS * LR_MAX
print(f"case FALSIFY-LRS-001/-002: W = {W}, T = {T}, lr_max = {LR_MAX}, lr_min = {LR_MIN}, "
      f"steps 0 … {T}")
print(f"input:   steps 0 … {T}; worst step {s}")
print(f"library: torch {VERSION}: lr({s}) = {ys[s]!r}")
print(f"true:    {mpmath.nstr(true_lr(s, W, T, LR_MAX, LR_MIN), 20)}")
print(f"bound:   8·eps·lr_max = {bound:.3g}")
print(f"error:   {mpmath.nstr(errs[s], 4)} = {mpmath.nstr(errs[s] / (EPS * LR_MAX), 4)} "
      f"eps·lr_max")
bad |= errs[s] > bound

print("verdict: " + ("REPRODUCES: the chained schedule drifts beyond the bound" if bad
                     else "does not reproduce"))
sys.exit(1 if bad else 0)
