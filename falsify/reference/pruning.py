"""Row-wise pruning masks: magnitude, WANDA (Sun et al. 2023) and N:M semi-structured.

score_ij = |W_ij| · ‖X_j‖₂ (WANDA; magnitude is xnorm = 1), per output row i. Unstructured:
the k = ⌊sparsity · in⌋ lowest scores of each row are pruned; N:M: in every group of M
consecutive columns of a row, the N lowest. Ties go by column: of equal scores the lower index
is pruned first (a stable ascending sort), so the mask is a function of the scores alone.
Scores are exact here (float64 holds the product of two fp32 numbers exactly) and so in every
backend that computes them at least that wide: masks agree bit for bit.

Each function returns (W with the pruned entries set to +0.0, keep), keep ∈ {0, 1}.
"""

import math

import numpy as np


def _check(w, xnorm, name):
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"{name}: w must be [out, in], got shape {w.shape}")
    xnorm = np.asarray(xnorm, dtype=np.float64)
    if xnorm.shape != (w.shape[1],):
        raise ValueError(f"{name}: xnorm must be [in] = [{w.shape[1]}], got {xnorm.shape}")
    return w, xnorm


def n_pruned(sparsity: float, n_in: int) -> int:
    """k = ⌊sparsity·in⌋ of the decimal sparsity: the float64 product is rounded to 9 decimals
    first, so 0.7 of 90 columns prunes 63 (0.7·90 is 62.99999999999999 in float64)."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity = {sparsity}: must be in [0, 1]")
    return math.floor(round(sparsity * n_in, 9))


def _prune_lowest(w, score, k):
    order = np.argsort(score, axis=-1, kind="stable")[..., :k]
    keep = np.ones_like(w)
    np.put_along_axis(keep, order, 0.0, axis=-1)
    return np.where(keep > 0, w, 0.0), keep


def _scored(w, xnorm, sparsity, name):
    w, xnorm = _check(w, xnorm, name)
    return _prune_lowest(w, np.abs(w) * xnorm, n_pruned(sparsity, w.shape[1]))


def wanda(w, xnorm, sparsity):
    return _scored(w, xnorm, sparsity, "wanda")


def magnitude(w, sparsity):
    w = np.asarray(w, dtype=np.float64)
    return _scored(w, np.ones(w.shape[1] if w.ndim == 2 else 0), sparsity, "magnitude")


def n_m(w, xnorm, n, m):
    w, xnorm = _check(w, xnorm, "n_m")
    if not 0 <= n <= m or m < 1:
        raise ValueError(f"n_m: n = {n}, m = {m}: need 0 <= n <= m, m >= 1")
    o, i = w.shape
    if i % m:
        raise ValueError(f"n_m: in = {i} is not a multiple of m = {m}")
    g = w.reshape(o, i // m, m)
    y, keep = _prune_lowest(g, np.abs(g) * xnorm.reshape(i // m, m), n)
    return y.reshape(o, i), keep.reshape(o, i)
