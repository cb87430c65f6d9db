"""LR-schedule mutants: the schedule bugs the contract's checks must catch."""

from __future__ import annotations

import math

import torch

from falsify.arguments import check_schedule_args


def _tensor(step, fn):
    vals = [fn(int(s)) for s in step.reshape(-1).tolist()]
    return torch.tensor(vals, dtype=torch.float64).reshape(step.shape)


def warmup_off_by_one(step, warmup, total, lr_max, lr_min):
    """Warmup divides by warmup + 1 (a 1-based count mixed with a 0-based step): the peak is
    reached at step warmup + 1, one step late, and the decay starts late too."""
    check_schedule_args(warmup, total, lr_max, lr_min)

    def f(s):
        if s <= warmup:
            return lr_max * s / (warmup + 1)
        if s < total:
            x = (s - warmup - 1) / (total - warmup - 1)
            return lr_min + (lr_max - lr_min) * 0.5 * (1 + math.cos(math.pi * x))
        return lr_min

    return _tensor(step, f)


def cosine_not_floored(step, warmup, total, lr_max, lr_min):
    """Cosine written without lr_min, lr_max·½(1 + cos(πx)), and not stopped at total: it
    decays to 0 (below lr_min) and rises again after the last step."""
    check_schedule_args(warmup, total, lr_max, lr_min)

    def f(s):
        if s < warmup:
            return lr_max * s / warmup
        x = (s - warmup) / (total - warmup)
        return lr_max * 0.5 * (1 + math.cos(math.pi * x))

    return _tensor(step, f)


def constant_after_warmup(step, warmup, total, lr_max, lr_min):
    """The configured scheduler is never applied after the warmup: lr stays at the peak
    (2.99e-4 vs 3.00e-4: invisible in the loss for 10K steps)."""
    check_schedule_args(warmup, total, lr_max, lr_min)
    return _tensor(step, lambda s: lr_max * s / warmup if s < warmup else float(lr_max))
