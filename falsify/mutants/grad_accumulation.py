"""Gradient-accumulation mutants: loss normalisation, clip placement and step-count bugs."""

from __future__ import annotations

import torch

from falsify.arguments import check_accumulation_args
from falsify.kernels.torch.grad_accumulation import head_loss_sum
from falsify.kernels.torch.grad_clip import clip_grad_norm_, total_norm
from falsify.reference.grad_accumulation import micro_batch_slices


def _micro_grads(x, weight, labels, n_micro, ignore_index):
    w = weight.detach().clone().requires_grad_(True)
    out = []
    for sl in micro_batch_slices(x.shape[0], n_micro):
        s, n = head_loss_sum(x[sl], w, labels[sl], ignore_index)
        g = torch.autograd.grad(s, [w])[0] if int(n) else torch.zeros_like(w)
        out.append((g.float(), s.detach().double(), int(n)))
    return out


def _result(g, loss, n, norm):
    return (g, torch.tensor(float(loss), dtype=torch.float64), torch.tensor(n),
            torch.tensor(float(norm)))


def mean_of_means(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps):
    """Each micro-batch normalised by its own token count, then averaged over micro-batches:
    (1/N)·Σ_i S_i/n_i instead of Σ_i S_i / Σ_i n_i."""
    check_accumulation_args(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps)
    parts = [p for p in _micro_grads(x, weight, labels, n_micro, ignore_index) if p[2]]
    n = sum(p[2] for p in parts)
    if not parts:
        return _result(torch.zeros_like(weight, dtype=torch.float32), 0.0, 0, 0.0)
    g = sum(p[0] / p[2] for p in parts) / len(parts)
    loss = sum(float(p[1]) / p[2] for p in parts) / len(parts)
    norm = clip_grad_norm_([g], max_norm, clip_eps, False)
    return _result(g, loss, n, norm)


def clip_before_accumulation(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps):
    """Each micro-batch's contribution S_i/n clipped on its own, then summed: the total can
    exceed max_norm by up to N× and the direction changes."""
    check_accumulation_args(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps)
    parts = _micro_grads(x, weight, labels, n_micro, ignore_index)
    n = sum(p[2] for p in parts)
    if n == 0:
        return _result(torch.zeros_like(weight, dtype=torch.float32), 0.0, 0, 0.0)
    acc = torch.zeros_like(parts[0][0])
    for g, _, _ in parts:
        gi = g / n
        clip_grad_norm_([gi], max_norm, clip_eps, False)
        acc += gi
    return _result(acc, sum(float(p[1]) for p in parts) / n, n, total_norm([acc]))


def step_every_micro_batch(params, micro_batches, loss_sum_fn, optimizer, max_norm, clip_eps):
    """optimizer.step() inside the micro-batch loop: N steps per accumulation cycle."""
    params = list(params)
    n_total, loss = 0, 0.0
    for mb in micro_batches:
        s, n = loss_sum_fn(mb)
        n_total += int(n)
        loss += float(s)
        if int(n) == 0:
            continue
        grads = torch.autograd.grad(s / int(n), params)
        for p, g in zip(params, grads):
            p.grad = g.float()
        clip_grad_norm_([p.grad for p in params], max_norm, clip_eps, False)
        optimizer.step()
    return {"loss": loss / max(n_total, 1), "n_tokens": n_total, "grad_norm": 0.0,
            "stepped": True, "buffer_dtype": "float32"}


def stale_gradients(params, micro_batches, loss_sum_fn, optimizer, max_norm, clip_eps):
    """Accumulates into p.grad without zeroing it first (a missing optimizer.zero_grad()):
    the previous step's gradient leaks into this one."""
    params = list(params)
    n_total, loss = 0, 0.0
    new = [torch.zeros(p.shape, dtype=torch.float32) for p in params]
    for mb in micro_batches:
        s, n = loss_sum_fn(mb)
        n_total += int(n)
        loss += float(s)
        if int(n):
            for b, g in zip(new, torch.autograd.grad(s, params)):
                b.add_(g.float())
    for p, b in zip(params, new):
        b.div_(max(n_total, 1))
        p.grad = b if p.grad is None else p.grad + b
    norm = clip_grad_norm_([p.grad for p in params], max_norm, clip_eps, False)
    optimizer.step()
    return {"loss": loss / max(n_total, 1), "n_tokens": n_total, "grad_norm": float(norm),
            "stepped": True, "buffer_dtype": "float32"}


def clip_each_micro_batch_in_loop(params, micro_batches, loss_sum_fn, optimizer, max_norm,
                                  clip_eps):
    """The loop form of clip-before-accumulation: each micro-batch's gradient (as a mean over
    its own tokens) is clipped, then the clipped means are averaged and stepped once."""
    params = list(params)
    n_total, loss, k = 0, 0.0, 0
    acc = [torch.zeros(p.shape, dtype=torch.float32) for p in params]
    for mb in micro_batches:
        s, n = loss_sum_fn(mb)
        n_total += int(n)
        loss += float(s)
        if int(n) == 0:
            continue
        gs = [g.float() / int(n) for g in torch.autograd.grad(s, params)]
        clip_grad_norm_(gs, max_norm, clip_eps, False)
        for a, g in zip(acc, gs):
            a.add_(g)
        k += 1
    for p, a in zip(params, acc):
        p.grad = a / max(k, 1)
    optimizer.step()
    return {"loss": loss / max(n_total, 1), "n_tokens": n_total, "grad_norm": 0.0,
            "stepped": True, "buffer_dtype": "float32"}


__all__ = ["mean_of_means", "clip_before_accumulation", "step_every_micro_batch",
           "stale_gradients", "clip_each_micro_batch_in_loop"]
