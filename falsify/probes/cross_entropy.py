"""Cross-entropy contract: the comparison with torch.nn.functional.cross_entropy."""

from __future__ import annotations

import numpy as np
import torch

from falsify.probes import device

F32_EPS = float(np.finfo(np.float32).eps)


def vs_torch_functional(backend, dtype):
    """Our CE (default ignore_index = −100) against torch.nn.functional.cross_entropy on
    every reduction, with and without label smoothing, ignored rows included, fp32: largest
    loss and gradient differences, and the magnitudes they are measured against."""
    if dtype != "float32":
        raise ValueError("the torch.nn.functional comparison runs in float32")
    import importlib

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract("cross-entropy-kernel-v1"), "cross_entropy", backend)
    importlib.import_module(f"falsify.kernels.{backend}.cross_entropy")
    dev = device(backend)  # F.cross_entropy runs on the same device as ours
    gen = torch.Generator().manual_seed(0)
    worst_loss = worst_grad = 0.0
    cases = 0
    for T, V in ((7, 13), (16, 1000), (3, 4099)):
        z = torch.randn(T, V, generator=gen) * 4
        y = torch.randint(0, V, (T,), generator=gen)
        y[::3] = -100
        z, y = z.to(dev), y.to(dev)
        for reduction in ("none", "sum", "mean"):
            for ls in (0.0, 0.1):
                a = z.clone().requires_grad_(True)
                b = z.clone().requires_grad_(True)
                la = fn(a, y, reduction=reduction, label_smoothing=ls)
                lb = torch.nn.functional.cross_entropy(b, y, reduction=reduction,
                                                       label_smoothing=ls)
                dy = torch.randn(la.shape, generator=gen).to(dev)
                la.backward(dy)
                lb.backward(dy)
                worst_loss = max(worst_loss, float((la - lb).abs().max()))
                worst_grad = max(worst_grad, float((a.grad - b.grad).abs().max()))
                cases += 1
    return {"max_loss_diff": worst_loss, "max_grad_diff": worst_grad, "cases": cases,
            "f32_eps": F32_EPS}
