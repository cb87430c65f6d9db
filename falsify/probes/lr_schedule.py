"""LR-schedule contract: the configuration-validation run."""

from __future__ import annotations

import importlib

import numpy as np
import torch


def config_validation(backend, dtype):
    """Configurations the schedule must refuse, with the reason they are wrong; returns how
    many raised ValueError (all must), and that a valid one does not."""
    mod = importlib.import_module(f"falsify.kernels.{backend}.lr_schedule"
                                  if backend != "reference" else "falsify.reference.lr_schedule")
    bad = [
        dict(warmup=2000, total=43),   # warmup never completes
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
