"""Facts behind the LR-schedule contract: CrossHair proofs of the integer step logic, and a
configuration-validation run.

CrossHair explores every path of these pure integer functions symbolically (no float code:
DESIGN.md §3), and the harness counts a check as passed only when every PEP 316 condition is
CONFIRMED, i.e. all paths were exhausted.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from falsify.reference.lr_schedule import DECAY, FLOOR, WARMUP, schedule_phase


def consecutive_steps(step: int, warmup: int, total: int) -> bool:
    """Step s → s + 1 never goes back a phase; within warmup or decay the elapsed fraction
    num/den strictly increases (compared by cross-multiplication, exact in integers); the
    warmup hands over to the decay exactly at s + 1 = warmup, at fraction 0 (the peak), and
    the decay hands over to the floor exactly at s + 1 = total.

    pre: 0 <= warmup < total
    pre: step >= 0
    post: __return__
    """
    p1, n1, d1 = schedule_phase(step, warmup, total)
    p2, n2, d2 = schedule_phase(step + 1, warmup, total)
    if p2 < p1:
        return False
    if p1 == p2:
        return p1 == FLOOR or n1 * d2 < n2 * d1
    if p1 == WARMUP:
        return p2 == DECAY and step + 1 == warmup and n2 == 0
    return p1 == DECAY and p2 == FLOOR and step + 1 == total


def config_validation(backend, dtype):
    """Configurations the schedule must refuse, with the reason they are wrong; returns how
    many raised ValueError (all must), and that a valid one does not."""
    mod = importlib.import_module(f"falsify.impl.{backend}.lr_schedule"
                                  if backend != "reference" else "falsify.reference.lr_schedule")
    bad = [
        dict(warmup=2000, total=43),   # ALB-060: warmup never completes
        dict(warmup=100, total=100),   # peak and floor at the same step
        dict(warmup=-1, total=10),
        dict(warmup=10, total=100, lr_max=1e-3, lr_min=1e-2),  # min above max
        dict(warmup=10, total=100, lr_max=float("nan")),
        dict(warmup=10.5, total=100),
        dict(warmup=10, total=100, lr_min=-1e-5),
    ]
    steps = np.arange(5) if backend == "reference" else torch.arange(5)
    raised = 0
    for b in bad:
        kw = {"lr_max": 3e-4, "lr_min": 3e-5, **b}
        try:
            mod.lr_at(steps, kw["warmup"], kw["total"], kw["lr_max"], kw["lr_min"])
        except ValueError:
            raised += 1
    ok = mod.lr_at(steps, 2, 10, 3e-4, 3e-5)
    return {"tried": len(bad), "raised": raised, "valid_runs": bool(len(ok) == 5)}
