"""Fused linear + cross-entropy (Liger-Kernel style) in PyTorch: CE(x·Wᵀ, y) computed over
chunks of tokens so the [T, V] logits never exist at once.

For each chunk of C rows:  z_c = x_c·Wᵀ  [C, V]  →  per-row loss and lse (one logsumexp over
the block: C·V is bounded by CHUNK_ELEMENTS)  →  G_c = ∂loss/∂z_c computed *in place in z_c's
buffer*  →
    dx_c = G_c·W,     dW += G_cᵀ·x_c   (fp32 accumulator)
so the live extra memory is one [C, V] block plus dx [T, H] and dW [V, H], instead of the
[T, V] logits, their softmax and their gradient.

When the upstream gradient is a scalar (reduction "sum" or "mean") the gradients are computed
in the forward with scale 1 or 1/n and the backward only multiplies them by dy (Liger's
trick: no second pass over the vocabulary). For reduction "none" the upstream gradient is a
vector dy[t] that exists only in the backward, and dW = Σ_t dy_t·G_tᵀx_t cannot be rescaled
afterwards, so the backward recomputes z_c chunk by chunk with the real dy (same memory bound,
one more GEMM per chunk).

Derivation of G (z-loss, smoothing, ignore_index, reductions): falsify/reference/cross_entropy.py.
"""

from __future__ import annotations

import torch

from falsify.kernels.dtypes import CHECKED, require
from falsify.kernels.launch import next_power_of_2
from falsify.kernels.torch import cross_entropy as ce

__all__ = ["fused_linear_cross_entropy"]

CHUNK_ELEMENTS = 1 << 22  # one [C, V] fp32 block ≤ 16 MiB (C = 128 rows at V = 32768)


def chunk_rows(T, V, budget=CHUNK_ELEMENTS):
    """Rows per chunk: the largest power of two with C·V ≤ budget (at least 1, at most
    next_power_of_2(T)). Pure integer arithmetic."""
    c = 1
    while c * 2 * V <= budget and c < T:
        c *= 2
    return max(1, min(c, next_power_of_2(max(T, 1))))


def check_flce_args(x, weight, labels, chunk_size, dtypes: tuple = CHECKED):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D tensor [T, H]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must be [V, H={x.shape[1]}], got {tuple(weight.shape)}")
    require("fused_linear_cross_entropy", dtypes, x=x, weight=weight)
    if x.dtype != weight.dtype:
        raise TypeError(f"x dtype {x.dtype} differs from weight dtype {weight.dtype}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(
            chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r}: must be a positive integer or None")


class _FLCE(torch.autograd.Function):
    """block(z, labels, scale, ignore_index, z_loss, label_smoothing) -> (loss, lse) is the
    per-chunk CE: it returns the rows' losses and, when `scale` [C] is given, leaves
    G = scale·∂loss/∂z in z's buffer (torch: _block below; Triton: the CE kernels)."""

    @staticmethod
    def forward(ctx, x, weight, labels, ignore_index, reduction, z_loss, label_smoothing,
                chunk, block):
        T = x.shape[0]
        loss = torch.empty(T, dtype=torch.float32, device=x.device)
        precompute = reduction != "none"
        dx = dw = unit = None
        if precompute:
            n = (labels != ignore_index).sum().float()
            unit = (torch.ones((), dtype=torch.float32, device=x.device) if reduction == "sum"
                    else 1.0 / n)
            dx = torch.empty_like(x)
            dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        for r0 in range(0, T, chunk):
            sl = slice(r0, min(T, r0 + chunk))
            z = x[sl] @ weight.t()
            scale = unit.expand(z.shape[0]) if precompute else None
            loss[sl], _ = block(z, labels[sl], scale, ignore_index, z_loss, label_smoothing)
            if precompute:  # z now holds G_c
                torch.mm(z, weight, out=dx[sl])
                dw.addmm_(z.t().float(), x[sl].float())
            del z  # free this block before the next matmul allocates the next one
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing, chunk, block, weight.dtype)
        if precompute:
            # kept on ctx, not save_for_backward: the backward scales them in place and hands
            # them out as the gradients (no second [V, H] buffer); a second backward through
            # the same graph is refused below
            ctx.grads = (dx, dw)
        else:
            ctx.save_for_backward(x, weight, labels)
        return ce.reduce_rows(loss, labels, ignore_index, reduction).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            # create_graph=True asks for a backward that can be differentiated again; this one
            # is computed in the forward (or by fused in-place blocks), constants to autograd,
            # so every second derivative through it would silently be zero
            raise RuntimeError("fused_linear_cross_entropy: the backward is not differentiable "
                               "(double backward is not supported; its gradients are computed "
                               "in the forward): call it without create_graph=True")
        ignore_index, reduction, z_loss, label_smoothing, chunk, block, wdt = ctx.cfg
        none = (None,) * 7
        if reduction != "none":
            if ctx.grads is None:
                raise RuntimeError("fused_linear_cross_entropy: the gradients computed in the "
                                   "forward were already handed out; backward runs once")
            dx, dw = ctx.grads
            ctx.grads = None
            s = dy.float()
            if dx.dtype == torch.float32:
                dx.mul_(s)
            else:
                dx = (dx.float() * s).to(dx.dtype)
            dw.mul_(s)
            return dx, dw if wdt == torch.float32 else dw.to(wdt), *none
        x, weight, labels = ctx.saved_tensors
        T = x.shape[0]
        dy = dy.float()
        dx = torch.empty_like(x)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        for r0 in range(0, T, chunk):
            sl = slice(r0, min(T, r0 + chunk))
            z = x[sl] @ weight.t()  # recomputed: the per-row dy exists only now
            block(z, labels[sl], dy[sl], ignore_index, z_loss, label_smoothing)
            torch.mm(z, weight, out=dx[sl])
            dw.addmm_(z.t().float(), x[sl].float())
            del z
        return dx, dw if wdt == torch.float32 else dw.to(wdt), *none


def _block(z, labels, scale, ignore_index, z_loss, label_smoothing):
    """One [C, V] block, in place: e = exp(z − max) overwrites z, d = Σe, lse = max + log d;
    with `scale`, z then becomes G = scale·(e/d·(1 + 2ζ·lse) − q), e/d = softmax(z). No
    [C, V] temporary is allocated (fp32 logits). Same formulas as
    falsify/kernels/torch/cross_entropy.rows_forward / rows_grad, which chunk the vocabulary
    instead."""
    V = z.shape[1]
    zf = z if z.dtype == torch.float32 else z.float()
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    zy = zf.gather(1, safe_y[:, None])[:, 0]
    zsum = zf.sum(dim=1) if label_smoothing else None
    m = zf.amax(dim=1)
    e = zf.sub_(m[:, None]).exp_()
    d = e.sum(dim=1)
    lse = m + torch.log(d)
    loss = (1.0 - label_smoothing) * (lse - zy)
    if label_smoothing:
        loss = loss + label_smoothing * (lse - zsum / V)
    if z_loss:
        loss = loss + z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if scale is not None:
        s = torch.where(valid, scale, torch.zeros_like(scale))
        factor = (1.0 + 2.0 * z_loss * lse) / d if z_loss else 1.0 / d
        g = e.mul_(factor[:, None])
        if label_smoothing:
            g.sub_(label_smoothing / V)
        g[torch.arange(z.shape[0], device=z.device), safe_y] -= 1.0 - label_smoothing
        g.mul_(s[:, None])
        if zf is not z:  # fp16/bf16 logits: G was built in an fp32 copy (an identity test,
            z.copy_(g)   # which Dynamo traces; comparing data pointers breaks the graph)
    return loss, lse


def fused_linear_cross_entropy(x, weight, labels, ignore_index=-100, reduction="mean",
                               z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    """CE(x·Wᵀ, labels) without materialising the logits; gradients for x and weight."""
    check_flce_args(x, weight, labels, chunk_size)
    _check_labels(labels, weight.shape[0], x.shape[0], ignore_index, reduction, z_loss,
                  label_smoothing)
    labels = ce._bounded(labels, ignore_index, weight.shape[0])
    chunk = chunk_size or chunk_rows(x.shape[0], weight.shape[0])
    return _FLCE.apply(x, weight, labels, ignore_index, reduction, float(z_loss),
                       float(label_smoothing), chunk, _block)


def _check_labels(labels, V, T, ignore_index, reduction, z_loss, label_smoothing):
    """The CE argument rules (falsify/kernels/torch/cross_entropy.check_ce_args) without a logits
    tensor, which this kernel never builds."""
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != T:
        raise ValueError(f"labels must be a 1-D tensor of length T={T}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels dtype {labels.dtype}: must be int64 or int32")
    if V < 1:
        raise ValueError(f"vocabulary size V = {V}: must be ≥ 1")
    if reduction not in ce.REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: must be one of {ce.REDUCTIONS}")
    if not (isinstance(z_loss, (int, float)) and 0 <= z_loss < float("inf")):
        raise ValueError(f"z_loss={z_loss!r}: must be finite and ≥ 0")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"label_smoothing={label_smoothing!r}: must lie in [0, 1]")
    if torch.compiler.is_compiling():  # reading `bad` back is a graph break: see ce._bounded
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    if bool(bad.any()):
        raise ValueError(f"labels outside [0, {V}) that are not ignore_index={ignore_index}")
