"""Embedding in PyTorch: gather rows, scatter-add gradients (fp32 accumulation).

ids: integer tensor of any shape; table: [V, D]. Out-of-range ids raise ValueError before any
work — never clamped (as some gather kernels do) or wrapped (as negative Python indices do);
under torch.compile the generated kernel's bounds assert raises a RuntimeError instead.
Backward: d_table = zeros([V, D]).index_add_(0, ids, dy) in fp32, so repeated ids accumulate.
"""

from __future__ import annotations

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["embedding"]


def check_args(ids, table, out=None, dtypes: tuple = CHECKED):
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        raise TypeError("embedding: table must be a 2-D tensor [V, D]")
    require("embedding", dtypes, table=table)
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"embedding: ids must be an int64/int32 tensor, got "
                        f"{ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}")
    vocab = table.shape[0]
    if vocab == 0:  # a table of no rows: no id is valid, even in an empty lookup
        raise ValueError("embedding: the table has V = 0 rows")
    # Reading the ids' range back is a device sync and, under torch.compile, a graph break
    # (Tensor.item()); compiled code refuses an out-of-range id through Inductor's
    # indirect-indexing assert instead (see _bounded_ids)
    if ids.numel() and not torch.compiler.is_compiling():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"embedding: ids must lie in [0, {vocab}), got values in "
                             f"[{lo}, {hi}]")
    if out is not None:
        want = tuple(ids.shape) + (table.shape[1],)
        if tuple(out.shape) != want or out.dtype != table.dtype:
            raise ValueError(f"embedding: out must be {want} {table.dtype}, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if torch.is_grad_enabled() and table.requires_grad:
            raise RuntimeError("embedding: out= does not support autograd (table requires grad)")


class _EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, table):
        ctx.save_for_backward(ids)
        ctx.vocab, ctx.dtype = table.shape[0], table.dtype
        return table[ids]

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        d = dy.shape[-1]
        acc = torch.zeros((ctx.vocab, d), dtype=torch.float32, device=dy.device)
        acc.index_add_(0, ids.reshape(-1), dy.reshape(-1, d).float())
        return None, acc.to(ctx.dtype)


def _bounded_ids(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Under torch.compile: ids with every negative one moved to `vocab`, so that Inductor's
    indirect-indexing assert (on by default: "index out of bounds") refuses it as it refuses
    ids ≥ vocab, where indexing would otherwise wrap it to a row from the end."""
    if not torch.compiler.is_compiling():
        return ids
    return torch.where(ids < 0, torch.full_like(ids, vocab), ids)


def embedding(ids: torch.Tensor, table: torch.Tensor, out=None) -> torch.Tensor:
    check_args(ids, table, out)
    y = _EmbeddingFunction.apply(_bounded_ids(ids, table.shape[0]), table)
    return out.copy_(y) if out is not None else y
