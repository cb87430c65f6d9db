"""SiLU / SwiGLU in Triton: elementwise forward and backward kernels, autograd-aware wrappers.

    y      = silu(g)·u,  silu(g) = g·σ(g),  σ(g) = 1/(1 + e^(−g))   (fp32, one final rounding)
    d_gate = dy·u·σ(g)·(1 + g·(1 − σ(g)))
    d_up   = dy·silu(g)

Every tensor is viewed as [rows, n] with explicit strides; grid (rows, cdiv(n, BLOCK)).
σ is evaluated from e^(−|g|) ≤ 1 (no overflow for any finite g); below g ≈ −103 it underflows
to 0 exactly, so y = −0 and both gradients are 0·finite = 0: no NaN for any finite input.

In-place backward: `swiglu_backward_inplace` launches the backward kernel with
d_gate aliased to gate and d_up to up. Each program loads g, u and dy for its lanes before it
stores anything, and no two programs touch the same element, so the in-place write is safe
exactly when the outputs are the inputs' own views and gate, up, dy are disjoint — the rule
check_inplace_args enforces before launch.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_capped
from falsify.kernels.torch.swiglu import _float_tensor, check_args, check_inplace_args, check_out
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["swiglu", "silu", "swiglu_backward_inplace"]

MAX_BLOCK = 1024


def launch_config(rows, n):
    """Grid (rows, cdiv(n, BLOCK)), BLOCK = min(next_power_of_2(n), 1024). Pure integer
    arithmetic (falsify/proofs/swiglu.py runs it on z3 bit-vectors)."""
    block = next_power_of_2_capped(n, MAX_BLOCK)
    return {"grid": (rows, cdiv(n, block)), "BLOCK": block}


@triton.jit
def _sigmoid(g):
    # e = e^(−|g|) ∈ (0, 1] never overflows; σ = 1/(1 + e) for g ≥ 0 and e/(1 + e) for g < 0
    # keeps full relative accuracy in the negative tail until e underflows (g < −103).
    e = tl.exp(-tl.abs(g))
    return tl.div_rn(tl.where(g >= 0, 1.0, e), 1.0 + e)


@triton.jit
def swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, n, sg_r, sg_c, su_r, su_c, sy_r, sy_c,
                      GATED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + row * sg_r + offs * sg_c, mask=mask, other=0.0).to(tl.float32)
    y = g * _sigmoid(g)
    if GATED:
        y = y * tl.load(u_ptr + row * su_r + offs * su_c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sy_r + offs * sy_c, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n,
                      sg_r, sg_c, su_r, su_c, sd_r, sd_c, sdg_r, sdg_c, sdu_r, sdu_c,
                      GATED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # All loads first: dg/du may alias g/u (in-place backward).
    g = tl.load(g_ptr + row * sg_r + offs * sg_c, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * sd_r + offs * sd_c, mask=mask, other=0.0).to(tl.float32)
    s = _sigmoid(g)
    dsilu = s * (1.0 + g * (1.0 - s))
    if GATED:
        u = tl.load(u_ptr + row * su_r + offs * su_c, mask=mask, other=0.0).to(tl.float32)
        tl.store(du_ptr + row * sdu_r + offs * sdu_c, (dy * g * s).to(du_ptr.dtype.element_ty),
                 mask=mask)
        dsilu = dsilu * u
    tl.store(dg_ptr + row * sdg_r + offs * sdg_c, (dy * dsilu).to(dg_ptr.dtype.element_ty),
             mask=mask)


def _rows(t: torch.Tensor, n: int, view: bool = False) -> torch.Tensor:
    """[rows, n]: inputs may be copied to get there, outputs must stay views."""
    if t.dim() == 2:
        return t
    return t.view(-1, n) if view else t.reshape(-1, n)


def _out_rows(out, like, n):
    """(2-D target, needs copy-back) for an output that may be any strided view."""
    try:
        return _rows(out, n, view=True), False
    except RuntimeError:
        return torch.empty((like.numel() // n, n), dtype=out.dtype, device=out.device), True


def _launch_forward(g, u, out=None):
    n = g.shape[-1]
    g2 = _rows(g, n)
    u2 = g2 if u is None else _rows(u, n)
    y = out if out is not None else torch.empty(g.shape, dtype=g.dtype, device=g.device)
    y2, copy_back = _out_rows(y, g2, n)
    if g2.numel():
        cfg = launch_config(g2.shape[0], n)
        swiglu_fwd_kernel[cfg["grid"]](g2, u2, y2, n, *g2.stride(), *u2.stride(), *y2.stride(),
                                       GATED=u is not None, BLOCK=cfg["BLOCK"])
    if copy_back:
        y.copy_(y2.view(y.shape))
    return y


def launch_backward(g, u, dy, d_g, d_u, kernel=None):
    """Gradients into d_g / d_u (which may be g / u themselves). u, d_u None for silu.
    `kernel` lets mutants swap the backward kernel."""
    n = g.shape[-1]
    g2, dy2 = _rows(g, n), _rows(dy, n)
    dg2, copy_g = _out_rows(d_g, g2, n)
    u2, du2, copy_u = g2, dg2, False
    if u is not None:
        u2 = _rows(u, n)
        du2, copy_u = _out_rows(d_u, g2, n)
    if g2.numel():
        cfg = launch_config(g2.shape[0], n)
        (kernel or swiglu_bwd_kernel)[cfg["grid"]](
            g2, u2, dy2, dg2, du2, n, *g2.stride(), *u2.stride(), *dy2.stride(), *dg2.stride(),
            *du2.stride(), GATED=u is not None, BLOCK=cfg["BLOCK"])
    if copy_g:
        d_g.copy_(dg2.view(d_g.shape))
    if copy_u:
        d_u.copy_(du2.view(d_u.shape))
    return d_g, d_u


class _SwiGLUTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _launch_forward(gate, up)

    @staticmethod
    @once_differentiable("swiglu (Triton)")
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return launch_backward(gate, up, dy, torch.empty_like(gate), torch.empty_like(up))


class _SiLUTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _launch_forward(x, None)

    @staticmethod
    @once_differentiable("silu (Triton)")
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return launch_backward(x, None, dy, torch.empty_like(x), None)[0]


def swiglu(gate: torch.Tensor, up: torch.Tensor, out=None) -> torch.Tensor:
    check_args(gate, up, out, dtypes=triton_dtypes())
    if out is not None:
        return _launch_forward(gate, up, out)
    return _SwiGLUTriton.apply(gate, up)


def silu(x: torch.Tensor, out=None) -> torch.Tensor:
    _float_tensor("x", x, triton_dtypes())
    check_out(x, out, (x,))
    if out is not None:
        return _launch_forward(x, None, out)
    return _SiLUTriton.apply(x)


def swiglu_backward_inplace(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    """Overwrite gate with d_gate and up with d_up (one kernel, loads before stores); returns
    (gate, up). Raises before launch unless gate, up and dy are disjoint."""
    check_inplace_args(gate, up, dy, dtypes=triton_dtypes())
    return launch_backward(gate, up, dy, gate, up)
