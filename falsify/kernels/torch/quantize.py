"""Weight-only integer quantization (int8 per output channel, int4 per column group) in torch;
the rules, storage and rounding are falsify/reference/quantize.py's.

Precision: every decision is taken in float64 from the exact input values, as in the
reference — the range statistics (|w| max, min and max, exact), the quotient before the
float32 scale is stored, the quotient w / s and its rounding (torch.round: half to even) — so
codes, zero points and scales equal the reference's bit for bit. Only the dequantized values
are computed in float32, (q − zero)·s rounded once, and rounded once more to the input dtype
(fp16). Quantization runs on frozen weights under no_grad: nothing here has a backward.

Storage: codes and zero points are float32 tensors holding integers (|q| ≤ 127 is exact), the
scale is float32. A caller that packs them converts q.to(torch.int8) losslessly; the float
form keeps a non-integer code (an unrounded zero point) visible instead of truncating it.
"""

import numbers

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = [
    "dequantize",  # called by int8_roundtrip and int4_roundtrip (bound)
    "int4_groupwise",
    "int4_roundtrip",
    "int8_per_channel",
    "int8_roundtrip",
]

INT8_MAX = 127
INT4_SYM = (-8, 7)
INT4_ASYM = (0, 15)


def _check_w(w, name):
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name}: w must be a tensor, got {type(w).__name__}")
    require(name, CHECKED, w=w)
    if w.dim() != 2:
        raise ValueError(f"{name}: w must be [o, i], got shape {tuple(w.shape)}")


def _check_group(i, group, name):
    if not isinstance(group, numbers.Integral) or isinstance(group, bool) or group < 1:
        raise ValueError(f"{name}: group = {group!r} must be a positive integer")
    if i % group:
        raise ValueError(f"{name}: i = {i} is not a multiple of group = {group}")


def _codes(w64, s64, lo, hi, zero=None):
    """clamp(round(w / s) + zero, lo, hi) in float64; 0 where s = 0; float32 result."""
    positive = s64 > 0
    x = torch.round(w64 / torch.where(positive, s64, torch.ones_like(s64)))
    if zero is not None:
        x = x + zero
    q = torch.where(positive, x.clamp(lo, hi), torch.zeros_like(x)) + 0.0
    return q.float()


@torch.no_grad()
def int8_per_channel(w: torch.Tensor):
    """(q, scale): q [o, i] float32 integer codes in [−127, 127], scale [o] float32."""
    _check_w(w, "int8_per_channel")
    w64 = w.double()
    if w.shape[1] == 0:
        amax = w64.new_zeros(w.shape[0])
    else:
        amax = w64.abs().amax(dim=1)
    scale = (amax / INT8_MAX).float()
    return _codes(w64, scale.double()[:, None], -INT8_MAX, INT8_MAX), scale


@torch.no_grad()
def int4_groupwise(w: torch.Tensor, group: int, symmetric: bool):
    """(q, scale, zero): q [o, i] float32 integer codes (symmetric [−8, 7], asymmetric
    [0, 15]), scale and zero [o, i / group] float32 (zero = 0 when symmetric)."""
    _check_w(w, "int4_groupwise")
    o, i = w.shape
    _check_group(i, group, "int4_groupwise")
    g = w.double().reshape(o, i // group, group)
    if symmetric:
        scale = (g.abs().amax(dim=-1) / 7).float()
        zero = torch.zeros_like(scale)
        q = _codes(g, scale.double()[..., None], *INT4_SYM)
    else:
        lo = g.amin(dim=-1).clamp(max=0.0)  # min(min w, 0): 0.0 is representable
        hi = g.amax(dim=-1).clamp(min=0.0)  # max(max w, 0)
        scale = ((hi - lo) / 15).float()
        s = scale.double()
        positive = s > 0
        z = torch.round(-lo / torch.where(positive, s, torch.ones_like(s))).clamp(*INT4_ASYM)
        z = torch.where(positive, z, torch.zeros_like(z)) + 0.0
        q = _codes(g, s[..., None], *INT4_ASYM, zero=z[..., None])
        zero = z.float()
    return q.reshape(o, i), scale, zero


@torch.no_grad()
def dequantize(q: torch.Tensor, scale: torch.Tensor, zero, group: int,
               dtype: torch.dtype = torch.float32):
    """(q − zero)·scale per group of `group` consecutive columns, in float32 (q − zero is an
    exact small integer, the product rounds once), then rounded once to `dtype`. q [o, i],
    scale and zero [o, i / group] (zero None: 0)."""
    for label, t in (("q", q), ("scale", scale), ("zero", zero)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"dequantize: {label} must be a tensor, got {type(t).__name__}")
    if dtype not in CHECKED:
        raise TypeError(f"dequantize: unsupported output dtype {str(dtype).removeprefix('torch.')}")
    if q.dim() != 2:
        raise ValueError(f"dequantize: q must be [o, i], got shape {tuple(q.shape)}")
    o, i = q.shape
    _check_group(i, group, "dequantize")
    if zero is None:
        zero = torch.zeros_like(scale)
    if tuple(scale.shape) != (o, i // group) or tuple(zero.shape) != tuple(scale.shape):
        raise ValueError(f"dequantize: scale and zero must be [o, i / group] = "
                         f"[{o}, {i // group}], got {tuple(scale.shape)} and "
                         f"{tuple(zero.shape)}")
    y = ((q.float().reshape(o, i // group, group) - zero.float()[..., None])
         * scale.float()[..., None])
    return y.reshape(o, i).to(dtype)


@torch.no_grad()
def int8_roundtrip(w: torch.Tensor):
    """dequantize(int8_per_channel(w)) in w's dtype."""
    _check_w(w, "int8_roundtrip")
    q, scale = int8_per_channel(w)
    if w.shape[1] == 0:  # no columns: nothing to dequantize
        return torch.zeros(w.shape, dtype=w.dtype, device=w.device)
    return dequantize(q, scale[:, None], None, w.shape[1], w.dtype)


@torch.no_grad()
def int4_roundtrip(w: torch.Tensor, group: int, symmetric: bool):
    """dequantize(int4_groupwise(w, group, symmetric)) in w's dtype."""
    q, scale, zero = int4_groupwise(w, group, symmetric)
    return dequantize(q, scale, zero, group, w.dtype)
