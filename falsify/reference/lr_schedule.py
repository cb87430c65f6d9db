"""Learning-rate schedule: linear warmup to the peak, cosine decay to lr_min, then lr_min.

For integer steps s ≥ 0, warmup W and total T with 0 ≤ W < T:

    lr(s) = lr_max · s / W                                          s < W   (warmup)
    lr(s) = lr_min + (lr_max − lr_min) · ½(1 + cos(π (s − W)/(T − W)))  W ≤ s < T  (decay)
    lr(s) = lr_min                                                  s ≥ T   (floor)

so lr(0) = 0 (with W = 2000: lr(43) = 3e-4·43/2000 = 6.45e-6), lr(W) = lr_max exactly (the warmup
ends at the peak, not one step later), lr(T) = lr_min, and lr never leaves [lr_min, lr_max]
after the warmup. W < T is required: a warmup longer than the run never reaches the peak
(warmup 2000 of 43 steps peaks at 6.45e-6 instead of 3e-4).

`schedule_phase` is the integer part: which phase a step is in and the exact fraction
(num/den) of it that has elapsed. It is pure integer Python with PEP 316 conditions, proved by
CrossHair for all integers (falsify/proofs/lr_schedule.py); the torch path calls it for every
step. `lr_at` below is an independent float64 formulation of the same math (numpy piecewise),
used as the reference.
"""


import numpy as np

from falsify.arguments import check_schedule_args

WARMUP, DECAY, FLOOR = 0, 1, 2


def schedule_phase(step: int, warmup: int, total: int) -> tuple:
    """(phase, num, den): the phase of `step` and the elapsed fraction num/den within it.

    pre: 0 <= warmup < total
    pre: step >= 0
    post: __return__[0] in (0, 1, 2)
    post: __return__[2] >= 1
    post: 0 <= __return__[1] <= __return__[2]
    post: (__return__[0] == 0) == (step < warmup)
    post: (__return__[0] == 2) == (step >= total)
    post: step != warmup or __return__[:2] == (1, 0)
    post: __return__[0] != 0 or (__return__[1] == step and __return__[2] == warmup)
    post: __return__[0] != 1 or (__return__[1] + warmup == step and __return__[2] == total - warmup)
    post: __return__[0] != 1 or __return__[1] < __return__[2]
    """
    if step < warmup:
        return (WARMUP, step, warmup)
    if step < total:
        return (DECAY, step - warmup, total - warmup)
    return (FLOOR, 1, 1)


def lr_at(step, warmup, total, lr_max, lr_min):
    """float64 learning rate for an array of integer steps ≥ 0."""
    check_schedule_args(warmup, total, lr_max, lr_min)
    s = np.asarray(step)
    if s.dtype.kind not in "iu":
        raise ValueError(f"step must be integers, got dtype {s.dtype}")
    if (s < 0).any():
        raise ValueError("step must be ≥ 0")
    s = s.astype(np.float64)
    up = lr_max * s / warmup if warmup > 0 else np.full_like(s, lr_max)
    progress = np.clip((s - warmup) / (total - warmup), 0.0, 1.0)
    down = lr_min + (lr_max - lr_min) * 0.5 * (1.0 + np.cos(np.pi * progress))
    down = np.clip(down, lr_min, lr_max)  # the math stays in range; rounding may not
    lr = np.where(s < warmup, up, np.where(s < total, down, lr_min))
    # ½(1 + cos 0) = 1 exactly, but lr_min + (lr_max − lr_min) can miss lr_max by an ulp
    lr = np.where(s == warmup, lr_max, lr)
    return lr
