"""KD-loss contract: the comparison with torch.nn.functional.kl_div."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from falsify.probes import device

F32_EPS = float(np.finfo(np.float32).eps)


def vs_torch_kl_div(backend, dtype):
    """Our KD (bound through the harness) against an independent formulation with
    torch.nn.functional.kl_div(log_target=True) and F.cross_entropy, and the top-k variant at
    k = V against the full one: largest loss and gradient differences."""
    from falsify.harness import backends, runtime

    c = runtime.contract("kd-loss-kernel-v1")
    fn = backends.function(c, "kd_loss", backend)
    fn_k = backends.function(c, "kd_loss_from_topk", backend)
    dev = device(backend)  # the F.kl_div formulation runs on the same device as ours
    gen = torch.Generator().manual_seed(0)
    worst = worst_grad = worst_topk = 0.0
    for T, V in ((9, 17), (32, 300)):
        zs = torch.randn(T, V, generator=gen) * 3
        zt = torch.randn(T, V, generator=gen) * 3
        y = torch.randint(0, V, (T,), generator=gen)
        y[::4] = -100
        zs, zt, y = zs.to(dev), zt.to(dev), y.to(dev)
        valid = y != -100
        for temp in (1.0, 2.0, 4.0):
            for alpha in (0.0, 0.5, 1.0):
                a = zs.clone().requires_grad_(True)
                b = zs.clone().requires_grad_(True)
                ours = fn(a, zt, y, temp, alpha)[0]
                kl = F.kl_div(F.log_softmax(b[valid] / temp, -1), F.log_softmax(zt[valid] / temp,
                              -1), log_target=True, reduction="batchmean")
                ce = F.cross_entropy(b, y, ignore_index=-100)
                want = alpha * temp ** 2 * kl + (1 - alpha) * ce
                ours.backward()
                want.backward()
                worst = max(worst, abs(float(ours) - float(want)))
                worst_grad = max(worst_grad, float((a.grad - b.grad).abs().max()))
                full = fn_k(zs, zt, y, temp, alpha, V)[0]
                worst_topk = max(worst_topk, abs(float(full) - float(fn(zs, zt, y, temp,
                                                                          alpha)[0])))
    return {"max_loss_diff": worst, "max_grad_diff": worst_grad, "max_topk_full_diff": worst_topk,
            "f32_eps": F32_EPS}
