"""Embedding in Triton: gather forward, atomic scatter-add backward.

Forward: grid (tokens, cdiv(D, BLOCK)); each program reads its token's id once and copies a
BLOCK-wide slice of that table row (bit-exact: a gather does no arithmetic).
Backward: same grid; each program atomically adds its dy slice into an fp32 [V, D] accumulator
at row id, so repeated ids accumulate; the accumulator is rounded once to the table dtype.
(fp32 atomics commute only up to rounding: on a GPU the summation order of a repeated id varies
between runs within the contract's (k − 1)·eps bound.)

Every id is checked against [0, V) on the host before launch: the kernels use the id as a raw
row offset, and an out-of-range id would read or write outside the table.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_capped
from falsify.kernels.torch.embedding import check_args
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["embedding"]

MAX_BLOCK = 1024


def launch_config(tokens, d):
    """Grid (tokens, cdiv(D, BLOCK)), BLOCK = min(next_power_of_2(D), 1024)."""
    block = next_power_of_2_capped(d, MAX_BLOCK)
    return {"grid": (tokens, cdiv(d, block)), "BLOCK": block}


@triton.jit
def embedding_fwd_kernel(ids_ptr, table_ptr, out_ptr, D, s_id, s_v, s_d, so_t, so_d,
                         BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    row = tl.load(ids_ptr + tok * s_id).to(tl.int64)
    vals = tl.load(table_ptr + row * s_v + offs * s_d, mask=mask)
    tl.store(out_ptr + tok * so_t + offs * so_d, vals, mask=mask)


@triton.jit
def embedding_bwd_kernel(ids_ptr, dy_ptr, acc_ptr, D, s_id, sdy_t, sdy_d,
                         BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    row = tl.load(ids_ptr + tok * s_id).to(tl.int64)
    g = tl.load(dy_ptr + tok * sdy_t + offs * sdy_d, mask=mask, other=0.0).to(tl.float32)
    tl.atomic_add(acc_ptr + row * D + offs, g, mask=mask)  # acc is contiguous [V, D] fp32


def launch_forward(ids, table, out=None):
    d = table.shape[1]
    flat = ids.reshape(-1)
    y = out if out is not None else torch.empty(tuple(ids.shape) + (d,), dtype=table.dtype,
                                                device=table.device)
    try:
        y2, copy_back = y.view(-1, d), False
    except RuntimeError:  # a strided `out` that cannot be flattened
        y2, copy_back = torch.empty((flat.numel(), d), dtype=table.dtype,
                                    device=table.device), True
    if flat.numel() and d:
        cfg = launch_config(flat.numel(), d)
        embedding_fwd_kernel[cfg["grid"]](flat, table, y2, d, flat.stride(0), *table.stride(),
                                          *y2.stride(), BLOCK=cfg["BLOCK"])
    if copy_back:
        y.copy_(y2.view(y.shape))
    return y


def launch_backward(ids, dy, vocab, kernel=None):
    d = dy.shape[-1]
    flat, dy2 = ids.reshape(-1), dy.reshape(-1, d)
    acc = torch.zeros((vocab, d), dtype=torch.float32, device=dy.device)
    if flat.numel() and d:
        cfg = launch_config(flat.numel(), d)
        (kernel or embedding_bwd_kernel)[cfg["grid"]](flat, dy2, acc, d, flat.stride(0),
                                                      *dy2.stride(), BLOCK=cfg["BLOCK"])
    return acc


class _EmbeddingTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, table):
        ctx.save_for_backward(ids)
        ctx.vocab, ctx.dtype = table.shape[0], table.dtype
        return launch_forward(ids, table)

    @staticmethod
    @once_differentiable("embedding (Triton)")
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        return None, launch_backward(ids, dy, ctx.vocab).to(ctx.dtype)


def embedding(ids: torch.Tensor, table: torch.Tensor, out=None) -> torch.Tensor:
    check_args(ids, table, out, triton_dtypes())  # range-checks every id before any launch
    if out is not None:
        return launch_forward(ids, table, out)
    return _EmbeddingTriton.apply(ids, table)
