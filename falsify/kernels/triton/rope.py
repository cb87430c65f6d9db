"""RoPE in Triton, rotate-half convention (HF LLaMA): x [B, S, H, D], pos int64 [S].

Grid (B·S, cdiv(H, G)): one program per token and group of G heads. The program loads the
token's fp32 cos/sin row once and applies it to all G heads of its group ([repo:unsloth]:
its ROPE_GROUP_SIZE = 4, sin/cos reused from registers). Every element is still computed
by the same expression as with G = 1, so grouped and per-head results are bit-identical — the
contract checks it.

    y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin        (fp32, rounded once to x's dtype)

The cos/sin table comes from float64 angles on the host (falsify/kernels/torch/rope.py:
rope_tables).
Backward: the rotation is orthogonal, so dx = R(−a)·dy: the same kernel with SIGN = −1 on sin.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2
from falsify.kernels.torch.rope import check_args, rope_tables
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["rope", "rope_grouped_and_per_head"]

GROUP = 4  # heads per program


def launch_config(b, s, h, d, group=GROUP):
    """Grid (B·S, cdiv(H, group)); BLOCK = next_power_of_2(D/2) lanes per half-row. Pure integer
    arithmetic (falsify/proofs/rope.py runs it on z3 bit-vectors)."""
    return {"grid": (b * s, cdiv(h, group)), "BLOCK": next_power_of_2(d // 2), "GROUP": group}


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, S, H, HALF,
                sxb, sxs, sxh, sxd, syb, sys, syh, syd,
                SIGN: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    h0 = tl.program_id(1) * GROUP
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    c = tl.load(cos_ptr + s * HALF + offs, mask=mask, other=0.0)
    sn = tl.load(sin_ptr + s * HALF + offs, mask=mask, other=0.0) * SIGN
    for i in tl.static_range(GROUP):
        h = h0 + i
        m = mask & ((offs * 0 + h) < H)  # a lane vector: scalar masks are not portable
        xb = x_ptr + b * sxb + s * sxs + h * sxh
        x1 = tl.load(xb + offs * sxd, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(xb + (offs + HALF) * sxd, mask=m, other=0.0).to(tl.float32)
        yb = y_ptr + b * syb + s * sys + h * syh
        tl.store(yb + offs * syd, (x1 * c - x2 * sn).to(y_ptr.dtype.element_ty), mask=m)
        tl.store(yb + (offs + HALF) * syd, (x2 * c + x1 * sn).to(y_ptr.dtype.element_ty), mask=m)


def launch(x, cos, sin, out=None, sign=1.0, group=GROUP):
    """y = R(sign·a)·x for every head; `out` may be any strided view of x's shape."""
    B, S, H, D = x.shape
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        cfg = launch_config(B, S, H, D, group)
        rope_kernel[cfg["grid"]](x, cos, sin, y, S, H, D // 2, *x.stride(), *y.stride(),
                                 SIGN=sign, GROUP=cfg["GROUP"], BLOCK=cfg["BLOCK"])
    return y


class RoPETriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return launch(x, cos, sin)

    @staticmethod
    @once_differentiable("rope (Triton)")
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return launch(dy, cos, sin, sign=-1.0), None, None


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float, out=None) -> torch.Tensor:
    check_args(x, pos, theta, out, dtypes=triton_dtypes())
    cos, sin = rope_tables(pos, x.shape[-1], theta)
    if out is not None:
        return launch(x, cos, sin, out=out)
    return RoPETriton.apply(x, cos, sin)


def rope_grouped_and_per_head(x: torch.Tensor, pos: torch.Tensor, theta: float):
    """(GROUP heads per program, one head per program): must be bit-identical."""
    check_args(x, pos, theta, dtypes=triton_dtypes())
    cos, sin = rope_tables(pos, x.shape[-1], theta)
    with torch.no_grad():
        return launch(x, cos, sin), launch(x, cos, sin, group=1)
