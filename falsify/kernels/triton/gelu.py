"""GELU in Triton, exact (erf) and tanh forms: elementwise forward and backward kernels.

    exact: ½·x·(1 + erf(x/√2))                  d/dx = Φ(x) + x·φ(x)
    tanh:  x·σ(2u), u = √(2/π)(x + 0.044715x³)  d/dx = σ + x·σ(1 − σ)·2√(2/π)(1 + 3·0.044715x²)

x·σ(2u) equals ½·x·(1 + tanh u) without the cancellation of 1 + tanh u for negative u; σ is
evaluated from e^(−|z|) ≤ 1, so nothing overflows. fp32 compute, one rounding to x's dtype.
Tensors are viewed as [rows, n] with explicit strides; grid (rows, cdiv(n, BLOCK)).
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import FP32, require, triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_capped
from falsify.kernels.torch.gelu import (
    COEF,
    INV_SQRT_2,
    INV_SQRT_2PI,
    SQRT_2_OVER_PI,
    check_args,
)
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["gelu", "gelu_gap"]

MAX_BLOCK = 1024


def launch_config(rows, n):
    """Grid (rows, cdiv(n, BLOCK)), BLOCK = min(next_power_of_2(n), 1024)."""
    block = next_power_of_2_capped(n, MAX_BLOCK)
    return {"grid": (rows, cdiv(n, block)), "BLOCK": block}


@triton.jit
def _sigmoid(z):
    e = tl.exp(-tl.abs(z))
    return tl.div_rn(tl.where(z >= 0, 1.0, e), 1.0 + e)


@triton.jit
def gelu_fwd_kernel(x_ptr, y_ptr, n, sx_r, sx_c, sy_r, sy_c, C0, C1, APPROX: tl.constexpr,
                    BLOCK: tl.constexpr):
    """C0, C1: √½ for the exact form; 2√(2/π) and 0.044715 for the tanh form."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_r + offs * sx_c, mask=mask, other=0.0).to(tl.float32)
    if APPROX:
        y = x * _sigmoid(C0 * (x + C1 * x * x * x))
    else:
        y = 0.5 * x * (1.0 + tl.erf(x * C0))
    tl.store(y_ptr + row * sy_r + offs * sy_c, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_bwd_kernel(x_ptr, dy_ptr, dx_ptr, n, sx_r, sx_c, sd_r, sd_c, sdx_r, sdx_c, C0, C1, C2,
                    APPROX: tl.constexpr, BLOCK: tl.constexpr):
    """C2: 1/√(2π) for the exact form (φ's constant); unused by the tanh form."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_r + offs * sx_c, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * sd_r + offs * sd_c, mask=mask, other=0.0).to(tl.float32)
    if APPROX:
        # σ(z) and 1 − σ(z) = σ(−z) from one e^(−|z|): 1 − s would cancel for large z, and
        # x·z′ (≈ 120 at x = 8) would amplify the lost bits.
        z = C0 * (x + C1 * x * x * x)
        e = tl.exp(-tl.abs(z))
        s = tl.div_rn(tl.where(z >= 0, 1.0, e), 1.0 + e)
        s_neg = tl.div_rn(tl.where(z >= 0, e, 1.0), 1.0 + e)
        d = s + x * s * s_neg * C0 * (1.0 + 3.0 * C1 * x * x)
    else:
        d = 0.5 * (1.0 + tl.erf(x * C0)) + x * tl.exp(-0.5 * x * x) * C2
    tl.store(dx_ptr + row * sdx_r + offs * sdx_c, (dy * d).to(dx_ptr.dtype.element_ty),
             mask=mask)


def _constants(approximate):
    if approximate == "tanh":
        return 2.0 * SQRT_2_OVER_PI, COEF, 0.0
    return INV_SQRT_2, 0.0, INV_SQRT_2PI


def _rows(t, n, view=False):
    if t.dim() == 2:
        return t
    return t.view(-1, n) if view else t.reshape(-1, n)


def _out_rows(out, rows, n):
    """(2-D target, needs copy-back): outputs stay views when their strides allow it."""
    try:
        return _rows(out, n, view=True), False
    except RuntimeError:
        return torch.empty((rows, n), dtype=out.dtype, device=out.device), True


def launch_forward(x, approximate, out=None, kernel=None, consts=None):
    n = x.shape[-1]
    x2 = _rows(x, n)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2, copy_back = _out_rows(y, x2.shape[0], n)
    if x2.numel():
        cfg = launch_config(x2.shape[0], n)
        c0, c1, _ = consts or _constants(approximate)
        (kernel or gelu_fwd_kernel)[cfg["grid"]](
            x2, y2, n, *x2.stride(), *y2.stride(), c0, c1, APPROX=approximate == "tanh",
            BLOCK=cfg["BLOCK"])
    if copy_back:
        y.copy_(y2.view(y.shape))
    return y


def _launch_backward(x, dy, approximate):
    n = x.shape[-1]
    x2, dy2 = _rows(x, n), _rows(dy, n)
    dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.numel():
        cfg = launch_config(x2.shape[0], n)
        gelu_bwd_kernel[cfg["grid"]](x2, dy2, dx, n, *x2.stride(), *dy2.stride(), *dx.stride(),
                                     *_constants(approximate), APPROX=approximate == "tanh",
                                     BLOCK=cfg["BLOCK"])
    return dx.view(x.shape)


class _GELUTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return launch_forward(x, approximate)

    @staticmethod
    @once_differentiable("gelu (Triton)")
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _launch_backward(x, dy, ctx.approximate), None


def gelu(x: torch.Tensor, approximate: str, out=None) -> torch.Tensor:
    check_args(x, approximate, out, dtypes=triton_dtypes())
    if x.dim() == 0:
        raise ValueError("gelu (triton): x must have at least one dimension")
    if out is not None:
        return launch_forward(x, approximate, out)
    return _GELUTriton.apply(x, approximate)


def gelu_gap(x: torch.Tensor) -> torch.Tensor:
    """gelu(x, 'tanh') − gelu(x, 'none'), each rounded to x's dtype, difference in fp32."""
    require("gelu_gap", FP32, x=x)  # the contract measures the gap in float32 only
    with torch.no_grad():
        return gelu(x, "tanh").float() - gelu(x, "none").float()
