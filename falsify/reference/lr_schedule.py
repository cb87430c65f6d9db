"""Learning-rate schedule: linear warmup to the peak, cosine decay to lr_min, then lr_min.

For integer steps s ≥ 0, warmup W and total T with 0 ≤ W < T:

    lr(s) = lr_max · s / W                                          s < W   (warmup)
    lr(s) = lr_min + (lr_max − lr_min) · ½(1 + cos(π (s − W)/(T − W)))  W ≤ s < T  (decay)
    lr(s) = lr_min                                                  s ≥ T   (floor)

so lr(0) = 0 (with W = 2000: lr(43) = 3e-4·43/2000 = 6.45e-6), lr(W) = lr_max exactly (the warmup
ends at the peak, not one step later), lr(T) = lr_min, and lr never leaves [lr_min, lr_max]
after the warmup. W < T is required: a warmup longer than the run never reaches the peak
(warmup 2000 of 43 steps peaks at 6.45e-6 instead of 3e-4).

`lr_at` below is a float64 formulation of the math (numpy piecewise over all steps at once),
independent of the torch backend's integer step logic (`schedule_phase` in
falsify/kernels/torch/lr_schedule.py), which it judges.
"""


import numpy as np

from falsify.arguments import check_schedule_args


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
