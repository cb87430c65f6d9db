"""GELU in PyTorch, exact (erf) and tanh forms; fp32 compute, one rounding, own backward.

    exact: ½·x·(1 + erf(x/√2))            d/dx = Φ(x) + x·φ(x)
    tanh:  x·σ(2u), u = √(2/π)(x + 0.044715x³)   (= ½·x·(1 + tanh u), without the cancellation
           of 1 + tanh u for negative u)      d/dx = σ + x·σ(1 − σ)·2√(2/π)(1 + 0.134145x²)

The two forms differ by ≤ 4.7324e-4 (|x| = 2.6989); see falsify/reference/gelu.py.
"""

from __future__ import annotations

import math

import torch

from falsify.kernels.dtypes import CHECKED, FP32, require

__all__ = ["gelu", "gelu_gap"]

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
COEF = 0.044715


def check_args(x, approximate, out=None, dtypes: tuple = CHECKED):
    if not isinstance(x, torch.Tensor):
        raise TypeError("gelu: x must be a tensor")
    require("gelu", dtypes, x=x)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ValueError(f"gelu: out must be {tuple(x.shape)} {x.dtype}, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("gelu: out= does not support autograd (x requires grad)")


def _forward(xf, approximate):
    if approximate == "none":
        return 0.5 * xf * (1.0 + torch.erf(xf * INV_SQRT_2))
    return xf * torch.sigmoid(2.0 * SQRT_2_OVER_PI * (xf + COEF * xf * xf * xf))


def _derivative(xf, approximate):
    if approximate == "none":
        return (0.5 * (1.0 + torch.erf(xf * INV_SQRT_2))
                + xf * torch.exp(-0.5 * xf * xf) * INV_SQRT_2PI)
    z = 2.0 * SQRT_2_OVER_PI * (xf + COEF * xf * xf * xf)
    # 1 − σ(z) as σ(−z): computing 1 − s cancels for large z, and x·z′ (≈ 120 at x = 8)
    # would amplify the lost bits.
    s, s_neg = torch.sigmoid(z), torch.sigmoid(-z)
    return s + xf * s * s_neg * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * COEF * xf * xf)


class _GELUReverse(torch.autograd.Function):
    """Reverse mode only (backward, itself differentiable: its ops are autograd ops on the
    saved input). What compiled code runs: Dynamo cannot trace a Function with a custom jvp
    and would break the graph at every call."""

    @staticmethod
    def forward(x, approximate):
        return _forward(x.float(), approximate).to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, approximate = inputs
        ctx.save_for_backward(x)
        ctx.approximate = approximate

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return (dy.float() * _derivative(x.float(), ctx.approximate)).to(x.dtype), None


class _GELUFunction(_GELUReverse):
    """Reverse and forward mode (jvp, for torch.func.jvp), both from the same derivative: what
    eager code runs."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        _GELUReverse.setup_context(ctx, inputs, output)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx, x_t, _approximate_t):
        (x,) = ctx.saved_tensors
        return (x_t.float() * _derivative(x.float(), ctx.approximate)).to(x.dtype)


def gelu(x: torch.Tensor, approximate: str, out=None) -> torch.Tensor:
    check_args(x, approximate, out)
    fn = _GELUReverse if torch.compiler.is_compiling() else _GELUFunction
    y = fn.apply(x, approximate)
    return out.copy_(y) if out is not None else y


def gelu_gap(x: torch.Tensor) -> torch.Tensor:
    """gelu(x, 'tanh') − gelu(x, 'none'), each rounded to x's dtype first (as a caller sees them),
    the difference in fp32."""
    require("gelu_gap", FP32, x=x)  # the contract measures the gap in float32 only
    with torch.no_grad():
        return gelu(x, "tanh").float() - gelu(x, "none").float()
