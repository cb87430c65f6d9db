"""Loop-level runs behind the gradient-accumulation contract.

The runs look the accumulation step up through the harness's binding resolution, so a mutant
(or `falsify run --bind`) of `accumulation_step` is what they exercise; the expectation is the
float64 full-batch gradient from falsify/reference/grad_accumulation.py, computed independently.
"""

from __future__ import annotations

import numpy as np
import torch

from falsify.probes import device
from falsify.reference.grad_accumulation import full_batch_grad, micro_batch_slices

F32_EPS = float(np.finfo(np.float32).eps)
IGNORE = -100


def _bound_step(backend: str):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract("grad-accumulation-kernel-v1"),
                             "accumulation_step", backend)


class _RecordingSGD(torch.optim.Optimizer):
    """SGD that records every gradient it is stepped with: the step count is the number of
    optimizer steps the loop actually took."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.seen = []

    @torch.no_grad()
    def step(self, closure=None):
        self.seen.append([p.grad.detach().double().clone() for g in self.param_groups
                          for p in g["params"]])
        for g in self.param_groups:
            for p in g["params"]:
                p.add_(p.grad, alpha=-g["lr"])


def _cycle_data(gen, cycles, B, H, V):
    data = []
    for k in range(cycles):
        x = torch.randn(B, H, generator=gen)
        y = torch.randint(0, V, (B,), generator=gen)
        y[torch.rand(B, generator=gen) < 0.25] = IGNORE
        if k == 1:
            y[: B // 4] = IGNORE  # cycle 2: its first micro-batch has no valid token at all
        data.append((x, y))
    return data


def cycles_vs_full_batch(backend, dtype, cycles, n_micro, max_norm, lr, seed):
    """`cycles` accumulation steps of n_micro uneven micro-batches (29 tokens: 8/7/7/7 for
    N = 4) of a linear LM head, with ignored tokens and an all-ignored micro-batch. Each
    gradient the optimizer is stepped with must equal the clipped full-batch gradient of that
    cycle's data at the current weights (float64 reference), and the optimizer must step
    exactly once per cycle."""
    if dtype != "float32":
        raise ValueError("this run compares fp32 parameters")
    step_fn = _bound_step(backend)
    dev = device(backend)  # the loop runs there; x, y stay on the CPU for the numpy reference
    B, H, V = 29, 7, 11
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(V, H, generator=gen).to(dev).requires_grad_(True)
    opt = _RecordingSGD([w], lr)
    max_err = max_loss_err = scale = w_max = x_max = 0.0
    clipped = 0
    for x, y in _cycle_data(gen, cycles, B, H, V):
        w_before = w.detach().double().cpu().numpy().copy()
        w_max = max(w_max, float(np.abs(w_before).max()))
        x_max = max(x_max, float(x.abs().max()))
        xd, yd = x.to(dev), y.to(dev)
        mbs = [(xd[sl], yd[sl]) for sl in micro_batch_slices(B, n_micro)]
        n_seen = len(opt.seen)

        def loss_fn(mb):
            logits = mb[0] @ w.t()
            s = torch.nn.functional.cross_entropy(logits, mb[1], ignore_index=IGNORE,
                                                  reduction="sum")
            return s, (mb[1] != IGNORE).sum()

        stats = step_fn([w], mbs, loss_fn, opt, max_norm, 1e-6)
        g_ref, loss_ref, n = full_batch_grad(x.double().numpy(), w_before, y.numpy(), IGNORE)
        norm = float(np.sqrt((g_ref ** 2).sum()))
        coef = min(1.0, max_norm / (norm + 1e-6))
        clipped += int(coef < 1.0)
        if len(opt.seen) > n_seen:
            got = opt.seen[n_seen][0].cpu().numpy()
            max_err = max(max_err, float(np.abs(got - g_ref * coef).max()))
        else:
            max_err = float("inf")  # the loop did not step at all
        max_loss_err = max(max_loss_err, abs(stats["loss"] - loss_ref))
        valid = y.numpy() != IGNORE
        # Σ_t |∂CE_t/∂W| ≤ Σ_t 2·max|x_t| over valid tokens, divided by n: the magnitude the
        # rounding errors scale with
        scale = max(scale, float(2 * np.abs(x.numpy()[valid]).max(axis=1).sum() / max(n, 1)))
    return {"steps": len(opt.seen), "cycles": cycles, "max_grad_err": max_err,
            "max_loss_err": max_loss_err, "grad_scale": scale, "w_max": w_max, "x_max": x_max,
            "clipped": clipped,
            "B": B, "H": H, "f32_eps": F32_EPS}


def fp16_params_fp32_buffer(backend, dtype):
    """With fp16 parameters and inputs, the accumulation buffer is fp32 and the gradient
    handed to the optimizer is within fp16 rounding of the float64 full-batch gradient."""
    step_fn = _bound_step(backend)
    dev = device(backend)  # the loop runs there; x, y stay on the CPU for the numpy reference
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(5)
    B, H, V = 64, 16, 9
    x = torch.randn(B, H, generator=gen).to(tdt)
    y = torch.randint(0, V, (B,), generator=gen)
    w = torch.randn(V, H, generator=gen).to(tdt).to(dev).requires_grad_(True)
    opt = _RecordingSGD([w], 0.0)
    xd, yd = x.to(dev), y.to(dev)
    mbs = [(xd[sl], yd[sl]) for sl in micro_batch_slices(B, 16)]

    def loss_fn(mb):
        s = torch.nn.functional.cross_entropy((mb[0] @ w.t()).float(), mb[1],
                                              ignore_index=IGNORE, reduction="sum")
        return s, (mb[1] != IGNORE).sum()

    stats = step_fn([w], mbs, loss_fn, opt, 1.0e9, 1e-6)
    g_ref, _, _ = full_batch_grad(x.double().numpy(), w.detach().double().cpu().numpy(),
                                  y.numpy(), IGNORE)
    got = opt.seen[0][0].cpu().numpy() if opt.seen else np.full_like(g_ref, np.inf)
    return {"buffer_dtype": stats.get("buffer_dtype"), "grad_dtype": str(w.grad.dtype),
            "rel_err": float(np.abs(got - g_ref).max() / np.abs(g_ref).max()),
            "eps": float(torch.finfo(tdt).eps), "steps": len(opt.seen)}
