"""Row-wise pruning (magnitude, WANDA, N:M) in torch; the semantics and tie rule are
falsify/reference/pruning.py's. Scores are computed in float64, where |w|·‖x‖ of fp32 or fp16 inputs
is
exact, so the mask equals the reference's bit for bit on every device."""

import math

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["magnitude", "n_m", "wanda"]


def n_pruned(sparsity: float, n_in: int) -> int:
    """k = ⌊sparsity·in⌋ of the decimal sparsity, the float64 product rounded to 9 decimals
    first (0.7 of 90 columns prunes 63, not 62). The backend's own count: the reference
    (falsify/reference/pruning.py) computes its own, so a wrong count shows up as a mask that
    disagrees."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity = {sparsity}: must be in [0, 1]")
    return math.floor(round(sparsity * n_in, 9))


def _check(w, xnorm, name):
    for label, t in (("w", w), ("xnorm", xnorm)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {label} must be a tensor, got {type(t).__name__}")
    require(name, CHECKED, w=w, xnorm=xnorm)
    if w.dim() != 2:
        raise ValueError(f"{name}: w must be [out, in], got shape {tuple(w.shape)}")
    if tuple(xnorm.shape) != (w.shape[1],):
        raise ValueError(f"{name}: xnorm must be [in] = [{w.shape[1]}], got "
                         f"{tuple(xnorm.shape)}")


def _prune_lowest(w, score, k):
    order = torch.argsort(score, dim=-1, stable=True)[..., :k]
    keep = torch.ones_like(score, dtype=torch.bool).scatter(-1, order, False)
    return torch.where(keep, w, torch.zeros((), dtype=w.dtype, device=w.device)), \
        keep.to(w.dtype)


def _scored(w, xnorm, sparsity, name):
    _check(w, xnorm, name)
    score = w.double().abs() * xnorm.double()
    return _prune_lowest(w, score, n_pruned(sparsity, w.shape[1]))


@torch.no_grad()
def wanda(w: torch.Tensor, xnorm: torch.Tensor, sparsity: float):
    return _scored(w, xnorm, sparsity, "wanda")


@torch.no_grad()
def magnitude(w: torch.Tensor, sparsity: float):
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        ones = torch.ones(w.shape[1], dtype=w.dtype, device=w.device)
    else:
        ones = torch.ones(0)
    return _scored(w, ones, sparsity, "magnitude")


@torch.no_grad()
def n_m(w: torch.Tensor, xnorm: torch.Tensor, n: int, m: int):
    _check(w, xnorm, "n_m")
    if not 0 <= n <= m or m < 1:
        raise ValueError(f"n_m: n = {n}, m = {m}: need 0 <= n <= m, m >= 1")
    o, i = w.shape
    if i % m:
        raise ValueError(f"n_m: in = {i} is not a multiple of m = {m}")
    g = w.reshape(o, i // m, m)
    score = g.double().abs() * xnorm.double().reshape(i // m, m)
    y, keep = _prune_lowest(g, score, n)
    return y.reshape(o, i), keep.reshape(o, i)
