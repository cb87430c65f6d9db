"""LoRA linear layer in PyTorch with an explicit backward (torch.autograd.Function).

y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, s = α/r (rsLoRA: α/√r); W [out, in] is frozen, A [r, in] and B [out, r]
train. Backward (derivation in falsify.reference.lora), t = x·Aᵀ, u = g·B:
    dx = g·W + s·u·A,   dB = s·gᵀ·t,   dA = s·uᵀ·x,   dW = none.
Products are computed in float32 and rounded once to the output dtype, so low-precision inputs
never accumulate in half precision; t = x·Aᵀ is kept in float32 between the two adapter products
(PEFT rounds it to the adapter dtype; ours is the more accurate of the two).
"""

from __future__ import annotations

import math

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["lora_linear", "lora_merge", "lora_init"]


def lora_scale(alpha, r, rslora=False):
    """s = α / r, or α / √r for rsLoRA. The backends' own: the scale is part of the result, so
    the reference (falsify/reference/lora.py) computes its own and the checks compare the two."""
    r = int(r)
    if r < 1:
        raise ValueError(f"LoRA rank r = {r}: must be ≥ 1")
    return float(alpha) / (math.sqrt(r) if rslora else r)


def check_args(x, w, a, b, r, dtypes: tuple = CHECKED):
    """Shapes and dtypes, checked before any arithmetic; returns (out, in)."""
    for name, v in (("x", x), ("w", w), ("a", a), ("b", b)):
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(v).__name__}")
        require("lora", dtypes, **{name: v})
    r = int(r)
    if w.dim() != 2 or a.dim() != 2 or b.dim() != 2 or x.dim() < 1:
        raise ValueError(f"expected x [..., in], w [out, in], a [r, in], b [out, r]; got "
                         f"{tuple(x.shape)}, {tuple(w.shape)}, {tuple(a.shape)}, "
                         f"{tuple(b.shape)}")
    out_f, in_f = w.shape
    if x.shape[-1] != in_f:
        raise ValueError(f"x has {x.shape[-1]} features, w expects {in_f}")
    if tuple(a.shape) != (r, in_f):
        raise ValueError(f"a must be [r={r}, in={in_f}], got {tuple(a.shape)}")
    if tuple(b.shape) != (out_f, r):
        raise ValueError(f"b must be [out={out_f}, r={r}], got {tuple(b.shape)}")
    if x.dtype != w.dtype:
        raise TypeError(f"x ({x.dtype}) and the base weight w ({w.dtype}) must share a dtype")
    if a.dtype != b.dtype:
        raise TypeError(f"adapter weights a ({a.dtype}) and b ({b.dtype}) must share a dtype")
    return out_f, in_f


def check_out(out, shape, dtype, needs_grad):
    if out is None:
        return
    if needs_grad:
        raise ValueError("out= is for inference only: it cannot carry an autograd graph")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must be {dtype} {tuple(shape)}, got {out.dtype} "
                         f"{tuple(out.shape)}")


class _LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, a, b, s):
        out_f, in_f = w.shape
        x2 = x.reshape(math.prod(x.shape[:-1]), in_f).float()  # -1 is ambiguous for in_f = 0
        t = x2 @ a.float().T
        # y = x·Wᵀ, then y += s·t·Bᵀ inside the GEMM (alpha = s, beta = 1): no separate
        # multiply and add over the [rows, out] result (the same two roundings per element)
        y = (x2 @ w.float().T).addmm_(t, b.float().T, alpha=s)
        ctx.save_for_backward(x, w, a, b, t)
        ctx.s = s
        return y.reshape(*x.shape[:-1], out_f).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        x, w, a, b, t = ctx.saved_tensors
        s = ctx.s
        if torch.is_grad_enabled():
            # create_graph=True: this backward will be differentiated. The saved t = x·Aᵀ is an
            # intermediate of the forward, a constant to autograd: db = s·gᵀ·t built on it
            # would silently lose ∂db/∂x and ∂db/∂A. Recompute it (the same matmul).
            t = x.reshape(-1, w.shape[1]).float() @ a.float().T
        out_f, in_f = w.shape
        g = gy.reshape(math.prod(gy.shape[:-1]), out_f).float()
        u = g @ b.float()
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            # g·W, then += s·u·A in the GEMM (in place on a fresh product: autograd's mm
            # saves its inputs, not its result, so create_graph stays correct)
            dx = (g @ w.float()).addmm_(u, a.float(), alpha=s).reshape(x.shape).to(x.dtype)
        if ctx.needs_input_grad[2]:
            da = (s * (u.T @ x.reshape(math.prod(x.shape[:-1]), in_f).float())).to(a.dtype)
        if ctx.needs_input_grad[3]:
            db = (s * (g.T @ t)).to(b.dtype)
        # W is frozen by contract: no gradient even if someone left requires_grad on.
        return dx, None, da, db, None


def lora_linear(x, w, a, b, alpha, r, rslora=False, out=None):
    out_f, _ = check_args(x, w, a, b, r)
    s = lora_scale(alpha, r, rslora)
    needs_grad = torch.is_grad_enabled() and any(v.requires_grad for v in (x, a, b))
    check_out(out, (*x.shape[:-1], out_f), x.dtype, needs_grad)
    y = _LoraLinear.apply(x, w, a, b, s)
    return y if out is None else out.copy_(y)


def lora_merge(w, a, b, alpha, r, rslora=False):
    """W + s·B·A in float32, rounded once to W's dtype."""
    check_args(torch.zeros(1, w.shape[1], dtype=w.dtype), w, a, b, r)
    return (w.float() + lora_scale(alpha, r, rslora) * (b.float() @ a.float())).to(w.dtype)


def lora_init(in_features, out_features, r, seed, dtype=torch.float32):
    """PEFT's default adapter init: A = kaiming_uniform_(a=√5) (U(−1/√in, 1/√in)), B = 0."""
    in_features, out_features, r = int(in_features), int(out_features), int(r)
    if min(in_features, out_features, r) < 1:
        raise ValueError("in_features, out_features and r must be ≥ 1")
    g = torch.Generator().manual_seed(int(seed))
    a = torch.empty(r, in_features, dtype=torch.float32)
    torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=g)
    return a.to(dtype), torch.zeros(out_features, r, dtype=dtype)
