"""Embedding mutants: the bugs the embedding contract's checks must catch (same signatures as
the bindings they replace)."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch import embedding as emb_torch
from falsify.kernels.triton import embedding as emb_triton


def off_by_one_id(ids, table, out=None):
    """1-based ids: table[ids − 1]. id 0 becomes −1, which torch (like Python) wraps to the
    last row instead of failing."""
    emb_torch.check_args(ids, table, out)
    y = table[ids - 1]
    return out.copy_(y) if out is not None else y


def clamps_out_of_range(ids, table, out=None):
    """Out-of-range ids silently clamped to [0, V − 1] (what XLA's gather does) instead of
    raising: a tokenizer/vocab mismatch trains on the wrong rows without a sound."""
    ids = ids.clamp(0, table.shape[0] - 1)
    return emb_torch.embedding(ids, table, out=out)


@triton.jit
def _bwd_overwrite_kernel(ids_ptr, dy_ptr, acc_ptr, D, s_id, sdy_t, sdy_d, BLOCK: tl.constexpr):
    """tl.store where tl.atomic_add belongs: for a repeated id only one token's gradient
    survives."""
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    row = tl.load(ids_ptr + tok * s_id).to(tl.int64)
    g = tl.load(dy_ptr + tok * sdy_t + offs * sdy_d, mask=mask, other=0.0).to(tl.float32)
    tl.store(acc_ptr + row * D + offs, g, mask=mask)


class _OverwriteBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, table):
        ctx.save_for_backward(ids)
        ctx.vocab, ctx.dtype = table.shape[0], table.dtype
        return emb_triton.launch_forward(ids, table)

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        acc = emb_triton.launch_backward(ids, dy, ctx.vocab, kernel=_bwd_overwrite_kernel)
        return None, acc.to(ctx.dtype)


def triton_backward_overwrites(ids, table, out=None):
    emb_triton.check_args(ids, table, out)
    if out is not None:
        return emb_triton.launch_forward(ids, table, out)
    return _OverwriteBackward.apply(ids, table)
