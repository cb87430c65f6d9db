"""Pruning mutants: the bugs the pruning contract's checks must catch.

Each has the signature of the torch function it replaces (`wanda`, `n_m`) and differs from
falsify.kernels.torch.pruning in one decision only: the set the threshold is taken over, the
score or its precision, the tie rule, the grouping, the rounding of k, or the sign of the
pruned zeros.
"""

import math

import torch

from falsify.kernels.torch.pruning import _check, _prune_lowest
from falsify.kernels.torch.pruning import n_m as torch_n_m
from falsify.reference.pruning import n_pruned


@torch.no_grad()
def per_tensor(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """One global threshold over the whole matrix: the o·k lowest scores of all rows pruned
    together (stable, lower flat index first). The total count is right; a row whose scores
    are low loses more than k entries and a high row fewer."""
    _check(w, xnorm, "wanda")
    o, i = w.shape
    score = (w.double().abs() * xnorm.double()).reshape(1, o * i)
    y, keep = _prune_lowest(w.reshape(1, o * i), score, o * n_pruned(sparsity, i))
    return y.reshape(o, i), keep.reshape(o, i)


@torch.no_grad()
def squared_norm(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """WANDA with the squared activation norm, score = |w|·‖x‖²: the same order only where the
    norms are equal; two entries with |w₀|x₀ ≤ |w₁|x₁ and x₀ > x₁ can swap."""
    _check(w, xnorm, "wanda")
    score = w.double().abs() * xnorm.double() ** 2
    return _prune_lowest(w, score, n_pruned(sparsity, w.shape[1]))


@torch.no_grad()
def ties_high_index_first(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """Of equal scores the higher column index is pruned first (a stable sort of the reversed
    row, or a descending sort read backwards): a different mask wherever a tie straddles the
    threshold."""
    _check(w, xnorm, "wanda")
    i = w.shape[1]
    score = (w.double().abs() * xnorm.double()).flip(-1)
    k = n_pruned(sparsity, i)
    order = (i - 1) - torch.argsort(score, dim=-1, stable=True)[..., :k]
    keep = torch.ones_like(w, dtype=torch.bool).scatter(-1, order, False)
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype)), keep.to(w.dtype)


@torch.no_grad()
def groups_strided(w: torch.Tensor, xnorm: torch.Tensor, n: int, m: int):
    """N:M groups taken along the wrong axis of the reshape: (o, m, in/m) instead of
    (o, in/m, m), pruning the n lowest along the size-m axis. Every 'group' is m columns
    in/m apart, not m consecutive columns: the row count is right, a block of m consecutive
    columns may keep anything from 0 to m. Identical to n_m when in = m."""
    _check(w, xnorm, "n_m")
    if not 0 <= n <= m or m < 1:
        raise ValueError(f"n_m: n = {n}, m = {m}: need 0 <= n <= m, m >= 1")
    o, i = w.shape
    if i % m:
        raise ValueError(f"n_m: in = {i} is not a multiple of m = {m}")
    g = w.reshape(o, m, i // m).transpose(1, 2)
    score = g.double().abs() * xnorm.double().reshape(m, i // m).T
    y, keep = _prune_lowest(g, score, n)
    return y.transpose(1, 2).reshape(o, i), keep.transpose(1, 2).reshape(o, i)


@torch.no_grad()
def groups_of_rows(w: torch.Tensor, xnorm: torch.Tensor, n: int, m: int):
    """N:M groups of m consecutive rows (output channels) of one column instead of m
    consecutive columns of one row, where the row count allows it (o % m == 0); other shapes
    fall back to the honest kernel, as a kernel tested only on square tiles would."""
    _check(w, xnorm, "n_m")
    o, i = w.shape
    if o % m or o == 0:
        return torch_n_m(w, xnorm, n, m)
    g = w.T.reshape(i, o // m, m)
    score = g.double().abs() * xnorm.double().reshape(i, 1, 1)
    y, keep = _prune_lowest(g, score, n)
    return y.reshape(i, o).T.contiguous(), keep.reshape(i, o).T.contiguous()


@torch.no_grad()
def k_ceil(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """k = ⌈sparsity·in⌉ instead of ⌊sparsity·in⌋: one entry too many pruned per row
    wherever sparsity·in is not an integer (sparsity 0.7, or 0.25 and 0.5 at odd widths)."""
    _check(w, xnorm, "wanda")
    n_pruned(sparsity, w.shape[1])  # the same range check
    score = w.double().abs() * xnorm.double()
    return _prune_lowest(w, score, math.ceil(sparsity * w.shape[1]))


@torch.no_grad()
def negative_zeros(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """Pruned entries written as w·keep: a pruned negative weight becomes −0.0, not +0.0. Equal
    under ==, so no parity check at atol 0 sees it; a later 1/w or a bitwise checkpoint
    comparison does."""
    _check(w, xnorm, "wanda")
    score = w.double().abs() * xnorm.double()
    _, keep = _prune_lowest(w, score, n_pruned(sparsity, w.shape[1]))
    return w * keep, keep


@torch.no_grad()
def score_in_input_dtype(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    """Scores |w|·xnorm computed in the input dtype instead of float64: rounding the product
    to fp16 (11 bits) or fp32 (24 bits) merges close scores into false ties, which the column
    rule then breaks, and flushes tiny products to zero."""
    _check(w, xnorm, "wanda")
    score = w.abs() * xnorm
    return _prune_lowest(w, score, n_pruned(sparsity, w.shape[1]))
