"""Row softmax in Triton: one program per row, the whole row in one block.

BLOCK = next_power_of_2(n) lanes; lanes ≥ n load −inf, so they contribute exp(−inf) = 0 to the
normalizer and never win the max. Loads are widened to fp32, the max, the exponentials and the
sum are fp32, and the result is rounded once to the output dtype. Inputs and `out` may be any
strided views (strides are passed explicitly; nothing outside the view is read or written).
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import require, triton_dtypes
from falsify.kernels.launch import next_power_of_2

__all__ = ["softmax"]


def launch_config(m, n):
    """m programs (one per row) × BLOCK lanes, BLOCK ≥ n a power of two (tl.arange needs one).
    Pure integer arithmetic: falsify/proofs/softmax.py proves BLOCK covers the row."""
    return {"grid": m, "BLOCK": next_power_of_2(n)}


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n, sx_row, sx_col, sy_row, sy_col, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row × stride may pass 2^31 elements
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_row + offs * sx_col, mask=mask,
                other=float("-inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)  # ≤ 0: exp cannot overflow for any finite row
    e = tl.exp(z)
    y = tl.div_rn(e, tl.sum(e, axis=0))  # correctly rounded, as torch divides
    tl.store(y_ptr + row * sy_row + offs * sy_col, y.to(y_ptr.dtype.element_ty), mask=mask)


def check_args(x: torch.Tensor, out: torch.Tensor | None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a tensor, got {type(x).__name__}")
    require("softmax (triton)", triton_dtypes(), x=x)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"softmax: the last dimension n = 0 (x {tuple(x.shape)}): no "
                         "distribution")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError(f"softmax: out must be {tuple(x.shape)} {x.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    if x.requires_grad and torch.is_grad_enabled():
        # No backward kernel here: refusing beats returning a tensor autograd cannot see.
        raise RuntimeError("softmax (triton): no backward; call it on tensors without grad")


def launch(x: torch.Tensor, out: torch.Tensor | None, block_of=None) -> torch.Tensor:
    """Run the kernel. `block_of(n)` overrides the block size (mutants only)."""
    n = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, n)
    m = x2.shape[0]
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    try:
        y2 = y if y.dim() == 2 else y.view(-1, n)
        copy_back = False
    except RuntimeError:  # a strided `out` that cannot be flattened: write a temporary, copy
        y2, copy_back = torch.empty((m, n), dtype=x.dtype, device=x.device), True
    if m > 0:
        cfg = launch_config(m, n)
        block = block_of(n) if block_of else cfg["BLOCK"]
        softmax_kernel[(cfg["grid"],)](x2, y2, n, x2.stride(0), x2.stride(1), y2.stride(0),
                                       y2.stride(1), BLOCK=block)
    if copy_back:
        y.copy_(y2.view(y.shape))
    return y


def softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over the last dimension; with `out` (any strided view of x's shape and dtype)
    the result is written there and returned."""
    check_args(x, out)
    return launch(x, out)
