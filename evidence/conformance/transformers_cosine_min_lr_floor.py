"""transformers: the cosine schedules with `min_lr` end one ulp below min_lr.

get_cosine_with_min_lr_schedule_with_warmup (and ..._lr_rate) turn `min_lr` into a ratio,
min_lr_rate = min_lr / lr, and the LambdaLR multiplies it back, lr·min_lr_rate, which is not
min_lr again in float64: for lr = 3e-4, min_lr = 3e-5 the schedule's floor is
2.9999999999999997e-05 < 3e-05, below the documented "minimum learning rate to reach".
lr-schedule-kernel-v1 asks lr ≥ lr_min from the peak on (FALSIFY-LRS-007, exact).

Backs FALSIFY-LRS-007 of lr-schedule-kernel-v1 for get_cosine_with_min_lr_schedule_with_warmup
and get_cosine_with_min_lr_schedule_with_warmup_lr_rate.
Run: python transformers_cosine_min_lr_floor.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
import warnings

import mpmath
import torch
from transformers.optimization import (
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
)

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
W, T, LR, MIN_LR = 59, 60, 3e-4, 3e-5  # the contract's example {W: 59, T: 60}

bad = False
for make in (get_cosine_with_min_lr_schedule_with_warmup,
             get_cosine_with_min_lr_schedule_with_warmup_lr_rate):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    sched = make(opt, W, T, min_lr=MIN_LR)
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(T + 6):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    low = min(rates[W:])
    s = rates.index(low, W)
    err = mpmath.mpf(MIN_LR) - mpmath.mpf(low)
    print(f"case FALSIFY-LRS-007, {make.__name__}")
    print(f"input:   num_warmup_steps {W}, num_training_steps {T}, lr {LR}, min_lr {MIN_LR}; "
          f"steps 0 … {T + 5}")
    print(f"library: transformers {VERSION}: min over steps ≥ W: lr({s}) = {low!r}")
    print(f"true:    lr ≥ min_lr = {mpmath.nstr(mpmath.mpf(MIN_LR), 20)} from step {W} on "
          f"(the real schedule's floor is min_lr)")
    print("bound:   0 (the check is exact: y[W:] >= lr_min)")
    print(f"error:   {mpmath.nstr(err, 4)} below min_lr "
          f"({mpmath.nstr(err / mpmath.mpf(MIN_LR) / mpmath.mpf(2) ** -52, 3)} eps relative)")
    print()
    bad |= low < MIN_LR

print("verdict: " + ("REPRODUCES: the floor is below min_lr" if bad else "does not reproduce"))
sys.exit(1 if bad else 0)
