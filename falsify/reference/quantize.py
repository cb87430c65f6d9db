"""Weight-only integer quantization: int8 per output channel and int4 per column group.

w is a weight matrix [o, i], rows are output channels. Every rule is the real-number rule,
evaluated here in float64 with two roundings that belong to the format itself:

- the scale is stored in float32: s = fl32(fl64(amax / 127)) (int8), fl32(fl64(amax / 7))
  (int4 symmetric), fl32(fl64((max − min) / 15)) (int4 asymmetric, min ≤ 0 ≤ max). Double
  rounding through float64 is harmless for a quotient of float32 numbers (53 ≥ 2·24 + 2), so s
  is the correctly rounded float32 quotient wherever amax (or max − min) is exact in float64;
- codes are round(w / s) of the float64 quotient with the stored s, round half to even (IEEE
  roundTiesToEven: numpy's np.round and torch.round both do this), then clamped to the range.

A row (group) whose scale is 0 (all zeros, or amax below 127·2⁻¹⁵⁰ so fl32 flushes the scale)
gets codes 0 (and zero point 0): it dequantizes to zeros. Codes, zero points and scales are
returned as float64 arrays holding integers (codes) and float32 values (scales).

`dequantize` returns the exact value (q − zero)·s, which float64 holds exactly (a ≤ 8-bit
integer times a 24-bit scale), so the reference's dequantized weights are the real numbers
the codes stand for; an implementation that computes them in float32 rounds once (or twice,
through float32 into float16).
"""

import numpy as np

INT8_MAX = 127
INT4_SYM = (-8, 7)
INT4_ASYM = (0, 15)


def _check_w(w, name):
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"{name}: w must be [o, i], got shape {w.shape}")
    return w


def _check_group(i, group, name):
    if not isinstance(group, (int, np.integer)) or isinstance(group, bool) or group < 1:
        raise ValueError(f"{name}: group = {group!r} must be a positive integer")
    if i % group:
        raise ValueError(f"{name}: i = {i} is not a multiple of group = {group}")


def _fl32(x):
    """The float32 number nearest x (ties to even), as float64."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def _codes(w, s, lo, hi, zero=0.0):
    """clamp(round(w / s) + zero, lo, hi); 0 (= zero, which is then 0) where s = 0."""
    safe = np.where(s > 0, s, 1.0)
    q = np.clip(np.round(w / safe) + zero, lo, hi)
    return np.where(s > 0, q, 0.0) + 0.0  # + 0.0: −0.0 codes become +0.0


def int8_per_channel(w):
    """(q, scale): scale_r = fl32(max_j |w_rj| / 127), q = clamp(round(w / scale), −127, 127)."""
    w = _check_w(w, "int8_per_channel")
    amax = np.max(np.abs(w), axis=1, initial=0.0)
    scale = _fl32(amax / INT8_MAX)
    return _codes(w, scale[:, None], -INT8_MAX, INT8_MAX), scale


def int4_groupwise(w, group, symmetric):
    """(q, scale, zero) per group of `group` consecutive columns of a row; scale and zero are
    [o, i / group]. Symmetric: scale = fl32(max|w| / 7), q = clamp(round(w / scale), −8, 7),
    zero = 0. Asymmetric: lo = min(min w, 0), hi = max(max w, 0), scale = fl32((hi − lo) / 15),
    zero = clamp(round(−lo / scale), 0, 15), q = clamp(round(w / scale) + zero, 0, 15)."""
    w = _check_w(w, "int4_groupwise")
    o, i = w.shape
    _check_group(i, group, "int4_groupwise")
    g = w.reshape(o, i // group, group)
    if symmetric:
        scale = _fl32(np.max(np.abs(g), axis=-1, initial=0.0) / 7)
        zero = np.zeros_like(scale)
        q = _codes(g, scale[..., None], *INT4_SYM)
    else:
        lo = np.min(g, axis=-1, initial=0.0)   # min(min w, 0): 0.0 is representable
        hi = np.max(g, axis=-1, initial=0.0)   # max(max w, 0)
        scale = _fl32((hi - lo) / 15)
        safe = np.where(scale > 0, scale, 1.0)
        zero = np.where(scale > 0, np.clip(np.round(-lo / safe), *INT4_ASYM), 0.0) + 0.0
        q = _codes(g, scale[..., None], *INT4_ASYM, zero=zero[..., None])
    return q.reshape(o, i), scale, zero


def dequantize(q, scale, zero, group, dtype=None):
    """(q − zero)·scale per group of `group` consecutive columns, exact in float64. q [o, i],
    scale and zero [o, i / group] (zero None: 0). `dtype` is the implementations' output dtype
    and is ignored here: the reference returns the exact value."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 2:
        raise ValueError(f"dequantize: q must be [o, i], got shape {q.shape}")
    o, i = q.shape
    _check_group(i, group, "dequantize")
    scale = np.asarray(scale, dtype=np.float64)
    zero = np.zeros_like(scale) if zero is None else np.asarray(zero, dtype=np.float64)
    if scale.shape != (o, i // group) or zero.shape != scale.shape:
        raise ValueError(f"dequantize: scale and zero must be [o, i / group] = "
                         f"[{o}, {i // group}], got {scale.shape} and {zero.shape}")
    y = (q.reshape(o, i // group, group) - zero[..., None]) * scale[..., None]
    return y.reshape(o, i)


def int8_roundtrip(w):
    """dequantize(int8_per_channel(w)): the weights the int8 codes stand for."""
    w = _check_w(w, "int8_roundtrip")
    q, scale = int8_per_channel(w)
    if w.shape[1] == 0:  # one group per row needs a row: no columns, nothing to dequantize
        return np.zeros(w.shape)
    return dequantize(q, scale[:, None], None, w.shape[1])


def int4_roundtrip(w, group, symmetric):
    """dequantize(int4_groupwise(w, group, symmetric))."""
    q, scale, zero = int4_groupwise(w, group, symmetric)
    return dequantize(q, scale, zero, group)
