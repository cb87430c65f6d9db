"""Warmup + cosine learning-rate schedule: `set_lr`, the training loop's per-step call (through
falsify/llm/ops.py), which writes the scheduled rate into the optimizer, and a tensor form over
many steps (the contract's binding) that runs `set_lr` on a stand-in optimizer and reads back
what it wrote, so the contract checks the loop's call itself, not a sibling of it.

Both are built on `schedule_phase` below, the integer step logic that CrossHair proves for
every integer input (the contract's symbolic checks): phase boundaries, the exact peak at
step = warmup, and a denominator that is never 0. The float part is written so that the phase
endpoints are exact: lr(warmup) = lr_max, lr(total) = lr_min, and the result is clamped into
[lr_min, lr_max], which the real-valued formula never leaves but rounding could by one ulp.
The LR is computed in Python float64, as torch.optim.lr_scheduler does.
"""

from __future__ import annotations

import math

import torch

from falsify.arguments import check_schedule_args

# set_lr is the training loop's per-step call (falsify/llm/ops.py) and lr_at_step the rate
# falsify/llm/trainer.py reads: the bound lr_at runs set_lr for every step it returns, and
# set_lr computes each rate with lr_at_step, so every check of the binding runs both.
__all__ = ["lr_at", "set_lr", "lr_at_step", "schedule_phase"]

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


def lr_at_step(step: int, warmup: int, total: int, lr_max: float, lr_min: float) -> float:
    """The learning rate at integer step ≥ 0 (0-based: step 0 is the first update)."""
    check_schedule_args(warmup, total, lr_max, lr_min)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r}: must be an integer ≥ 0")
    phase, num, den = schedule_phase(step, warmup, total)
    if phase == WARMUP:
        return lr_max * num / den
    if phase == FLOOR:
        return float(lr_min)
    assert phase == DECAY
    if num == 0:
        return float(lr_max)
    # lr_max − (lr_max − lr_min)·(1 − cos(πx))/2: exact at x = 0, decreasing in x
    drop = (lr_max - lr_min) * (1.0 - math.cos(math.pi * num / den)) / 2.0
    return min(lr_max, max(lr_min, lr_max - drop))


def lr_at(step, warmup, total, lr_max, lr_min) -> torch.Tensor:
    """float64 tensor of learning rates for a tensor of integer steps."""
    if not isinstance(step, torch.Tensor) or step.is_floating_point() or step.is_complex():
        raise ValueError("step must be an integer torch.Tensor")
    check_schedule_args(warmup, total, lr_max, lr_min)
    groups = _ParamGroups()
    vals = []
    for s in step.reshape(-1).tolist():
        set_lr(groups, int(s), warmup, total, lr_max, lr_min)
        vals.append(groups.param_groups[0]["lr"])
    return torch.tensor(vals, dtype=torch.float64).reshape(step.shape)


class _ParamGroups:
    """The part of an optimizer `set_lr` writes to."""

    def __init__(self):
        self.param_groups = [{}]


def set_lr(optimizer: torch.optim.Optimizer, step: int, warmup: int, total: int,
           lr_max: float, lr_min: float) -> float:
    """Write the scheduled LR into every param group (the training loop's per-step call) and
    return it, so the loop can log and assert what the optimizer actually uses (a
    scheduler parsed but never applied is a known bug)."""
    lr = lr_at_step(step, warmup, total, lr_max, lr_min)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
