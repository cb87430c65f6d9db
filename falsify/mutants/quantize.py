"""Quantization mutants: the bugs the quantize contract's checks must catch.

Each has the signature of the torch function it replaces (`int8_per_channel`,
`int4_groupwise`) and differs from falsify.kernels.torch.quantize in one decision only: the
rounding of the codes, the rounding of the zero point, the statistic the scale comes from,
the axis the groups run along, or the number of steps the asymmetric range is divided into.
"""

import torch

from falsify.kernels.torch.quantize import (
    INT4_ASYM,
    INT8_MAX,
    _check_group,
    _check_w,
    _codes,
)
from falsify.kernels.torch.quantize import int4_groupwise as torch_int4_groupwise


@torch.no_grad()
def truncating(w: torch.Tensor):
    """int8 codes rounded toward zero (trunc, what a float → int cast does) instead of to
    nearest: every code whose quotient has a fractional part ≥ ½ is one step short, an error
    up to a whole scale instead of half of one."""
    _check_w(w, "int8_per_channel")
    w64 = w.double()
    amax = w64.abs().amax(dim=1) if w.shape[1] else w64.new_zeros(w.shape[0])
    scale = (amax / INT8_MAX).float()
    s = scale.double()[:, None]
    q = torch.trunc(w64 / torch.where(s > 0, s, torch.ones_like(s))).clamp(-INT8_MAX, INT8_MAX)
    return (torch.where(s > 0, q, torch.zeros_like(q)) + 0.0).float(), scale


@torch.no_grad()
def mean_scale(w: torch.Tensor):
    """int8 scale from the mean of |w| over the row instead of its max: every entry above
    127.5/127 of the mean clamps at ±127, an unbounded error for outliers (the entries that
    matter most)."""
    _check_w(w, "int8_per_channel")
    w64 = w.double()
    amean = w64.abs().mean(dim=1) if w.shape[1] else w64.new_zeros(w.shape[0])
    scale = (amean / INT8_MAX).float()
    return _codes(w64, scale.double()[:, None], -INT8_MAX, INT8_MAX), scale


@torch.no_grad()
def unrounded_zero(w: torch.Tensor, group: int, symmetric: bool):
    """Asymmetric zero point kept as the real −lo/s, not rounded to an integer: codes are
    round(w/s + zero), and w = 0 dequantizes to (round(zero) − zero)·s ≠ 0 — a pruned or
    padded weight no longer reads back as 0.0. Symmetric groups are the honest kernel's."""
    if symmetric:
        return torch_int4_groupwise(w, group, symmetric)
    _check_w(w, "int4_groupwise")
    o, i = w.shape
    _check_group(i, group, "int4_groupwise")
    g = w.double().reshape(o, i // group, group)
    lo = g.amin(dim=-1).clamp(max=0.0)
    hi = g.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) / 15).float()
    s = scale.double()
    positive = s > 0
    z = torch.where(positive, (-lo / torch.where(positive, s, torch.ones_like(s))).clamp(
        *INT4_ASYM), torch.zeros_like(s))
    sd = torch.where(positive, s, torch.ones_like(s))[..., None]
    q = torch.round(g / sd + z[..., None]).clamp(*INT4_ASYM)
    q = torch.where(positive[..., None], q, torch.zeros_like(q)) + 0.0
    return q.float().reshape(o, i), scale, z.float()


@torch.no_grad()
def groups_of_rows(w: torch.Tensor, group: int, symmetric: bool):
    """Groups of `group` consecutive rows of one column (output channels) instead of `group`
    consecutive columns of one row, where the row count allows it (o % group == 0; other
    shapes fall back to the honest kernel, as a kernel tested only on square tiles would).
    The scales come back in the honest shape [o, i / group], holding the wrong groups."""
    _check_w(w, "int4_groupwise")
    o, i = w.shape
    if o == 0 or o % group:
        return torch_int4_groupwise(w, group, symmetric)
    q, scale, zero = torch_int4_groupwise(w.T.contiguous(), group, symmetric)
    return q.T.contiguous(), scale.T.reshape(o, i // group), zero.T.reshape(o, i // group)


@torch.no_grad()
def asym_sixteen_steps(w: torch.Tensor, group: int, symmetric: bool):
    """Asymmetric scale (hi − lo)/16 instead of (hi − lo)/15: 16 steps span the range, which
    needs 17 codes; the top of every group overflows code 15 and clamps, an error near a whole
    step. Symmetric groups are the honest kernel's."""
    if symmetric:
        return torch_int4_groupwise(w, group, symmetric)
    _check_w(w, "int4_groupwise")
    o, i = w.shape
    _check_group(i, group, "int4_groupwise")
    g = w.double().reshape(o, i // group, group)
    lo = g.amin(dim=-1).clamp(max=0.0)
    hi = g.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) / 16).float()
    s = scale.double()
    positive = s > 0
    z = torch.round(-lo / torch.where(positive, s, torch.ones_like(s))).clamp(*INT4_ASYM)
    z = torch.where(positive, z, torch.zeros_like(z)) + 0.0
    q = _codes(g, s[..., None], *INT4_ASYM, zero=z[..., None])
    return q.reshape(o, i), scale, z.float()
