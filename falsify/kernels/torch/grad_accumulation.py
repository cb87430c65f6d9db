"""Gradient accumulation for the training loop: N micro-batches, one optimizer step.

    for each micro-batch i:   S_i = Σ_{t ∈ i, valid} CE_t       (a sum, not a mean)
                              G  += ∂S_i/∂θ                      (fp32 buffers, zeroed per step)
    n = Σ_i n_i;  G /= n                                          (token-weighted mean)
    clip_grad_norm_(G, max_norm)                                  (once, after accumulation)
    optimizer.step()                                              (exactly once)

Backpropagating sums and dividing the accumulated gradient by the total token count once is the
same as backpropagating S_i / n for every i (the n need not be known before the first
backward), and it is the full-batch gradient of the token-mean loss (falsify/reference/
grad_accumulation.py). Averaging per-micro-batch means instead over-weights tokens of sparse
micro-batches (the bug transformers fixed with num_items_in_batch).

The buffers are fp32 whatever the parameter dtype, so N fp16 micro-gradients are not summed
in fp16 (seed gradient-accumulation-kernel-v1, obligation 5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from falsify.arguments import check_accumulation_args
from falsify.kernels.dtypes import FP32, require
from falsify.kernels.torch.grad_clip import clip_grad_norm_

__all__ = ["accumulation_step", "accumulate_grad"]


def accumulation_step(params, micro_batches, loss_sum_fn, optimizer, max_norm, clip_eps):
    """One optimizer step over a list of micro-batches.

    loss_sum_fn(mb) -> (S, n): the *summed* loss over the micro-batch's valid tokens and how
    many there were. Leaves p.grad = the clipped token-mean gradient (in p's dtype) and
    returns {"loss", "n_tokens", "grad_norm", "stepped", "buffer_dtype"}. With no valid token
    in the whole step nothing is stepped (stepped=False) and the loss is reported as 0 of 0
    tokens."""
    params = [p for p in params]
    if not micro_batches:
        raise ValueError("an accumulation step needs at least one micro-batch")
    bufs = [torch.zeros(p.shape, dtype=torch.float32, device=p.device) for p in params]
    total_loss = torch.zeros((), dtype=torch.float64, device=bufs[0].device if bufs else None)
    n_total = 0
    for mb in micro_batches:
        s, n = loss_sum_fn(mb)
        n = int(n)
        n_total += n
        total_loss += s.detach().double()
        if n == 0:
            continue  # no valid token: S = 0 and so is its gradient
        grads = torch.autograd.grad(s, params, allow_unused=True)
        for b, g in zip(bufs, grads):
            if g is not None:
                b.add_(g.float())
    if n_total == 0:
        for p in params:
            p.grad = None
        return {"loss": 0.0, "n_tokens": 0, "grad_norm": 0.0, "stepped": False,
                "buffer_dtype": "float32"}
    for b in bufs:
        b.div_(n_total)
    norm = clip_grad_norm_(bufs, max_norm, clip_eps, error_if_nonfinite=False)
    for p, b in zip(params, bufs):
        p.grad = b if p.dtype == torch.float32 else b.to(p.dtype)
    if not bool(torch.isfinite(norm)):
        # non-finite gradient: reported, never stepped on (grad_clip contract CLIP-INV-002)
        return {"loss": float(total_loss / n_total), "n_tokens": n_total,
                "grad_norm": float(norm), "stepped": False, "buffer_dtype": "float32"}
    optimizer.step()
    return {"loss": float(total_loss / n_total), "n_tokens": n_total, "grad_norm": float(norm),
            "stepped": True, "buffer_dtype": str(bufs[0].dtype).removeprefix("torch.")}


def head_loss_sum(x, weight, labels, ignore_index):
    """Σ over valid tokens of CE(x·Wᵀ, labels), logits in fp32, and the valid count."""
    logits = (x @ weight.t()).float()
    s = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return s, (labels != ignore_index).sum()


def micro_batch_slices(B, n_micro):
    """n_micro contiguous chunks of B rows whose sizes differ by at most one, the larger first
    (np.array_split's rule)."""
    base, extra = divmod(B, n_micro)
    out, start = [], 0
    for i in range(n_micro):
        size = base + (1 if i < extra else 0)
        out.append(slice(start, start + size))
        start += size
    return out


class _NoStep:
    """Stands in for an optimizer when only the accumulated gradient is wanted."""

    def step(self):
        pass


def accumulate_grad(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps):
    """The contract's binding: accumulate over n_micro contiguous micro-batches (sizes
    differing by ≤ 1) of a linear LM head; returns (clipped ∂L/∂W, L, n_tokens, ‖∂L/∂W‖)."""
    # the shared argument check reads labels with numpy: hand it a host copy (CUDA labels
    # cannot be viewed as an array)
    host_labels = labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels
    check_accumulation_args(x, weight, host_labels, n_micro, ignore_index, max_norm, clip_eps)
    require("accumulate_grad", FP32, x=x, weight=weight)  # its contract runs float32 only
    w = weight.detach().clone().requires_grad_(True)
    mbs = [(x[sl], labels[sl]) for sl in micro_batch_slices(x.shape[0], n_micro)]
    stats = accumulation_step([w], mbs, lambda mb: head_loss_sum(mb[0], w, mb[1], ignore_index),
                              _NoStep(), max_norm, clip_eps)
    g = w.grad if w.grad is not None else torch.zeros_like(w)
    return (g, torch.tensor(stats["loss"], dtype=torch.float64),
            torch.tensor(stats["n_tokens"]), torch.tensor(stats["grad_norm"]))
