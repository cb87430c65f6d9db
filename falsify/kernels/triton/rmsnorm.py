"""RMSNorm in Triton: forward and backward kernels, autograd-aware wrapper.

Forward: one program per row, BLOCK = next_power_of_2(n) lanes, masked. Everything is computed in
fp32 and rounded once to the output dtype; the program also stores inv_rms (fp32, one per row),
the only tensor saved for the backward besides x and w.

Backward (r = inv_rms, x̂ = x·r, g = dy ⊙ w, n = row length), from ∂r/∂x_j = −r³·x_j/n:
    dx_j = r·g_j − r³·x_j/n · Σ_i g_i·x_i = r·(g_j − x̂_j·mean_i(g_i·x̂_i))
    dw   = Σ_rows dy ⊙ x̂
x̂ is recomputed as x·r with the forward's own fp32 multiply, so it is bit-identical to the
forward's `normed`. The dw row-sum is split over `programs` programs, each owning a contiguous
block of rows and writing one fp32 partial row; the partials are summed in a fixed order, so the
result is deterministic (no atomics).
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2
from falsify.kernels.torch.rmsnorm import check_args
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["rmsnorm", "rmsnorm_forward"]

# Upper bound on backward programs: each writes one fp32 partial dw row (programs × n × 4 bytes).
MAX_BWD_PROGRAMS = 64


def launch_config(m, n):
    """Pure integer launch arithmetic (also run on z3 bit-vectors in falsify/proofs/rmsnorm.py).
    m rows of length n. Forward: m programs × BLOCK lanes. Backward: `programs` programs, each
    owning `rows_per_program` consecutive rows (the last one possibly fewer)."""
    rows_per_program = cdiv(m, MAX_BWD_PROGRAMS)
    return {"BLOCK": next_power_of_2(n), "rows_per_program": rows_per_program,
            "programs": cdiv(m, rows_per_program)}


@triton.jit
def rmsnorm_fwd_kernel(x_ptr, w_ptr, y_ptr, inv_ptr, n, eps,
                       sx_row, sx_col, sw, sy_row, sy_col,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_row + offs * sx_col, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs * sw, mask=mask, other=0.0).to(tl.float32)
    # Masked lanes load 0, so they add nothing to the sum of squares; divide by the true n.
    # sqrt_rn/div_rn: correctly rounded, like torch (plain `/` and tl.sqrt are approximate PTX).
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=0) / n + eps))
    normed = x * inv
    tl.store(y_ptr + row * sy_row + offs * sy_col, (normed * w).to(y_ptr.dtype.element_ty),
             mask=mask)
    tl.store(inv_ptr + row, inv)


@triton.jit
def rmsnorm_bwd_kernel(x_ptr, w_ptr, inv_ptr, dy_ptr, dx_ptr, dwp_ptr, m, n,
                       sx_row, sx_col, sw, sdy_row, sdy_col, sdx_row, sdx_col,
                       rows_per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs * sw, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], dtype=tl.float32)
    # int64 row indices: row × stride can pass 2^31 elements on large activations.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, m)
    for r64 in range(row_start, row_end):
        x = tl.load(x_ptr + r64 * sx_row + offs * sx_col, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r64 * sdy_row + offs * sdy_col, mask=mask,
                     other=0.0).to(tl.float32)
        inv = tl.load(inv_ptr + r64)
        xhat = x * inv  # bit-identical to the forward's normed
        g = dy * w
        c = tl.sum(g * xhat, axis=0) / n
        dx = inv * (g - xhat * c)
        tl.store(dx_ptr + r64 * sdx_row + offs * sdx_col, dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)
        dw_acc += dy * xhat
    tl.store(dwp_ptr + pid.to(tl.int64) * n + offs, dw_acc, mask=mask)


def _as_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """An input as [rows, n] (a view when the strides allow it, else a copy)."""
    return t if t.dim() == 2 else t.reshape(-1, n)


def _as_rows_view(t: torch.Tensor, n: int) -> torch.Tensor:
    """An output as [rows, n]: always a view (raises RuntimeError when impossible)."""
    return t if t.dim() == 2 else t.view(-1, n)


def launch_forward(x, w, eps, out=None, kernel=None):
    """Run the forward kernel; returns (y, inv_rms). `kernel` lets mutants swap the kernel."""
    n = x.shape[-1]
    x2 = _as_rows(x, n)
    m = x2.shape[0]
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    try:
        y2 = _as_rows_view(y, n)
        copy_back = False
    except RuntimeError:  # a strided `out` that cannot be flattened: write a temporary, copy
        y2, copy_back = torch.empty((m, n), dtype=x.dtype, device=x.device), True
    inv = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    if m > 0:
        cfg = launch_config(m, n)
        (kernel or rmsnorm_fwd_kernel)[(m,)](
            x2, w, y2, inv, n, float(eps), x2.stride(0), x2.stride(1), w.stride(0),
            y2.stride(0), y2.stride(1), BLOCK=cfg["BLOCK"])
    if copy_back:
        y.copy_(y2.view(y.shape))
    return y, inv


def launch_backward(x, w, inv_rms, dy, kernel=None):
    n = x.shape[-1]
    x2, dy2 = _as_rows(x, n), _as_rows(dy, n)
    m = x2.shape[0]
    dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    cfg = launch_config(m, n)
    partial = torch.empty((max(cfg["programs"], 1), n), dtype=torch.float32, device=x.device)
    if m == 0:
        partial.zero_()
    else:
        (kernel or rmsnorm_bwd_kernel)[(cfg["programs"],)](
            x2, w, inv_rms.reshape(-1), dy2, dx, partial, m, n,
            x2.stride(0), x2.stride(1), w.stride(0), dy2.stride(0), dy2.stride(1),
            dx.stride(0), dx.stride(1), cfg["rows_per_program"], BLOCK=cfg["BLOCK"])
    return dx.view(x.shape), partial.sum(dim=0).to(w.dtype)


class _RMSNormTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, inv = launch_forward(x, w, eps)
        ctx.save_for_backward(x, w, inv)
        ctx.mark_non_differentiable(inv)
        return y, inv

    @staticmethod
    @once_differentiable("rmsnorm (Triton)")
    def backward(ctx, dy, _d_inv):
        x, w, inv = ctx.saved_tensors
        dx, dw = launch_backward(x, w, inv, dy)
        return (dx if ctx.needs_input_grad[0] else None,
                dw if ctx.needs_input_grad[1] else None, None)


def rmsnorm_forward(x: torch.Tensor, w: torch.Tensor, eps: float, out=None):
    """(y, inv_rms). With `out` (any strided view of x's shape and dtype) y is written there."""
    check_args(x, w, eps, out, dtypes=triton_dtypes())
    if out is not None:
        return launch_forward(x, w, float(eps), out)
    return _RMSNormTriton.apply(x, w, float(eps))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out=None) -> torch.Tensor:
    return rmsnorm_forward(x, w, eps, out)[0]
