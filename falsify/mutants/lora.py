"""LoRA mutants: the scaling, initialisation and gradient bugs the lora contract must catch.
Each keeps the signature of the function it replaces."""

from __future__ import annotations

import math

import torch

from falsify.kernels.torch import lora as _t
from falsify.kernels.triton import lora as _x
from falsify.reference.lora import lora_scale


def scale_by_r(x, w, a, b, alpha, r, rslora=False, out=None):
    """Adapter scaled by r instead of α/r (a known LoRA scaling bug)."""
    _t.check_args(x, w, a, b, r)
    y = _t._LoraLinear.apply(x, w, a, b, float(r))
    return y if out is None else out.copy_(y)


def b_init_nonzero(in_features, out_features, r, seed, dtype=torch.float32):
    """B initialised like an nn.Linear weight (U(−1/√r, 1/√r)) instead of zeros: the adapted
    model no longer equals the base model at step 0."""
    g = torch.Generator().manual_seed(int(seed))
    a = torch.empty(int(r), int(in_features))
    torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=g)
    b = (torch.rand(int(out_features), int(r), generator=g) * 2 - 1) / math.sqrt(int(r))
    return a.to(dtype), b.to(dtype)


def kaiming_default_gain(in_features, out_features, r, seed, dtype=torch.float32):
    """kaiming_uniform_ with its default a = 0 (bound √(6/in)) instead of PEFT's a = √5
    (bound 1/√in): a 2.4× larger initial adapter."""
    g = torch.Generator().manual_seed(int(seed))
    a = torch.empty(int(r), int(in_features))
    torch.nn.init.kaiming_uniform_(a, generator=g)
    return a.to(dtype), torch.zeros(int(out_features), int(r), dtype=dtype)


class _MissingBase(torch.autograd.Function):
    """Correct forward; backward drops the frozen base path g·W from dx (only the adapter
    path s·(g·B)·A reaches the input)."""

    @staticmethod
    def forward(ctx, x, w, a, b, s):
        return _t._LoraLinear.forward(ctx, x, w, a, b, s)

    @staticmethod
    def backward(ctx, gy):
        x, w, a, b, t = ctx.saved_tensors
        s = ctx.s
        out_f, in_f = w.shape
        g = gy.reshape(-1, out_f).float()
        u = g @ b.float()
        dx = (s * (u @ a.float())).reshape(x.shape).to(x.dtype)
        da = (s * (u.T @ x.reshape(-1, in_f).float())).to(a.dtype)
        db = (s * (g.T @ t)).to(b.dtype)
        return dx, None, da, db, None


def dx_missing_base(x, w, a, b, alpha, r, rslora=False, out=None):
    """dx = s·(g·B)·A only: the gradient through the frozen base weight is lost."""
    _t.check_args(x, w, a, b, r)
    y = _MissingBase.apply(x, w, a, b, lora_scale(alpha, r, rslora))
    return y if out is None else out.copy_(y)


class _Unscaled(torch.autograd.Function):
    """Correct forward; backward forgets the scale s on dA or dB (flag)."""

    @staticmethod
    def forward(ctx, x, w, a, b, s, which):
        ctx.which = which
        return _t._LoraLinear.forward(ctx, x, w, a, b, s)

    @staticmethod
    def backward(ctx, gy):
        dx, _, da, db, _ = _t._LoraLinear.backward(ctx, gy)
        if ctx.which == "a":
            da = da / ctx.s
        else:
            db = db / ctx.s
        return dx, None, da, db, None, None


def da_unscaled(x, w, a, b, alpha, r, rslora=False, out=None):
    """dA = (g·B)ᵀ·x without the factor s."""
    _t.check_args(x, w, a, b, r)
    return _Unscaled.apply(x, w, a, b, lora_scale(alpha, r, rslora), "a")


def db_unscaled(x, w, a, b, alpha, r, rslora=False, out=None):
    """dB = gᵀ·(x·Aᵀ) without the factor s."""
    _t.check_args(x, w, a, b, r)
    return _Unscaled.apply(x, w, a, b, lora_scale(alpha, r, rslora), "b")


def frozen_w_gets_gradient(x, w, a, b, alpha, r, rslora=False, out=None):
    """Plain autograd through x·Wᵀ: W receives a gradient whenever requires_grad is on, so
    an optimizer that was handed W moves the 'frozen' base."""
    _t.check_args(x, w, a, b, r)
    s = lora_scale(alpha, r, rslora)
    y = x.float() @ w.float().T + s * ((x.float() @ a.float().T) @ b.float().T)
    return y.to(x.dtype)


class _TritonMissingBase(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, a, b, s):
        return _x._LoraLinear.forward(ctx, x, w, a, b, s)

    @staticmethod
    def backward(ctx, gy):
        x2, w, a, b, t = ctx.saved_tensors
        g = _x._as_rows(gy, w.shape[0]).to(x2.dtype)
        dx, da, db = _x.lora_backward(g, x2, w, a, b, t, ctx.s, base=False)
        return dx.reshape(ctx.x_shape), None, da, db, None


def triton_dx_missing_base(x, w, a, b, alpha, r, rslora=False, out=None):
    """Triton backward whose dx kernel launch omits the g·W product."""
    _t.check_args(x, w, a, b, r)
    return _TritonMissingBase.apply(x, w, a, b, lora_scale(alpha, r, rslora))


def triton_scale_alpha(x, w, a, b, alpha, r, rslora=False, out=None):
    """Triton forward with s = α (the division by r forgotten)."""
    _t.check_args(x, w, a, b, r)
    y = _x._LoraLinear.apply(x, w, a, b, float(alpha))
    return y if out is None else out.copy_(y)
