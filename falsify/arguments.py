"""Argument checks a kernel shares with its reference: shape, type and domain validation only,
no math.

A leaf module (it imports nothing of ours), so the reference and every backend may import it
without an upward edge. Sharing these is safe because none of them computes any part of a
result: each either raises ValueError or returns its input normalised (an integral step as an
int, a format's block geometry looked up in the table the caller passes). Sharing them makes
every backend reject the same inputs with the same message, which the contracts' error checks
compare; the numbers themselves stay computed on each side separately, so the reference
remains an independent judge of them. Anything that computes a count, a scale, a mask or a
phase belongs to each side on its own, not here.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay):
    """AdamW: raise ValueError for values outside its domain; returns step as an int."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) and not (
            isinstance(step, numbers.Real) and float(step).is_integer()):
        raise ValueError(f"step={step!r}: must be an integer ≥ 1 (the 1-based update index)")
    if int(step) < 1:
        raise ValueError(f"step={step!r}: must be ≥ 1; bias correction divides by 1 − β^step")
    for name, val in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps),
                      ("weight_decay", weight_decay)):
        if isinstance(val, bool) or not isinstance(val, numbers.Real) or not math.isfinite(val):
            raise ValueError(f"{name}={val!r}: must be a finite real number")
    if lr < 0:
        raise ValueError(f"lr={lr!r}: must be ≥ 0")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"beta1={beta1!r}: must lie in [0, 1)")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"beta2={beta2!r}: must lie in [0, 1)")
    if not eps > 0:
        raise ValueError(f"eps={eps!r}: must be > 0 (it keeps the denominator away from 0)")
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay!r}: must be ≥ 0")
    return int(step)


def check_clip_args(max_norm, eps, error_if_nonfinite):
    """Global-norm gradient clipping's settings."""
    for name, val in (("max_norm", max_norm), ("eps", eps)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise ValueError(f"{name}={val!r}: must be a finite real number")
    if max_norm <= 0:
        raise ValueError(f"max_norm={max_norm!r}: must be > 0 (0 would zero every gradient)")
    if eps < 0:
        raise ValueError(f"eps={eps!r}: must be ≥ 0")
    if not isinstance(error_if_nonfinite, bool):
        raise ValueError(f"error_if_nonfinite={error_if_nonfinite!r}: must be True or False")


def check_schedule_args(warmup, total, lr_max, lr_min):
    """The learning-rate schedule's settings: integer steps 0 ≤ warmup < total and
    0 ≤ lr_min ≤ lr_max, both finite."""
    for name, val in (("warmup", warmup), ("total", total)):
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise ValueError(f"{name}={val!r}: must be an integer number of steps")
    if warmup < 0:
        raise ValueError(f"warmup={warmup}: must be ≥ 0")
    if not warmup < total:
        raise ValueError(f"warmup={warmup} ≥ total={total}: the warmup would never reach the "
                         "peak; choose warmup < total")
    for name, val in (("lr_max", lr_max), ("lr_min", lr_min)):
        if isinstance(val, bool) or not isinstance(val, numbers.Real) or not math.isfinite(val):
            raise ValueError(f"{name}={val!r}: must be a finite real number")
    if not 0 <= lr_min <= lr_max:
        raise ValueError(f"need 0 ≤ lr_min ≤ lr_max, got lr_min={lr_min}, lr_max={lr_max}")


def check_accumulation_args(x, weight, labels, n_micro, ignore_index, max_norm, clip_eps):
    """Gradient accumulation over a linear LM head: x [B, H], weight [V, H], labels [B] (host
    memory: they are read with numpy), 1 ≤ n_micro ≤ B, labels in [0, V) or ignore_index."""
    if x.ndim != 2 or weight.ndim != 2 or labels.ndim != 1:
        raise ValueError(f"expected x [B, H], weight [V, H], labels [B]; got {x.shape}, "
                         f"{weight.shape}, {labels.shape}")
    if x.shape[1] != weight.shape[1] or x.shape[0] != labels.shape[0]:
        raise ValueError(f"shape mismatch: x {x.shape}, weight {weight.shape}, labels "
                         f"{labels.shape}")
    B, V = x.shape[0], weight.shape[0]
    if V == 0:  # the logsumexp of no logits is −∞ and no label is valid
        raise ValueError(f"vocabulary size V = 0 (weight {weight.shape})")
    if isinstance(n_micro, bool) or not isinstance(n_micro, (int, np.integer)):
        raise ValueError(f"n_micro={n_micro!r}: must be an integer")
    if B == 0:  # no micro-batch can hold a token, and the loss is a mean over none
        raise ValueError("no tokens: B = 0")
    if not 1 <= n_micro <= B:
        raise ValueError(f"n_micro={n_micro}: must lie in [1, B={B}]")
    lab = np.asarray(labels)
    bad = (lab != ignore_index) & ((lab < 0) | (lab >= V))
    if bad.any():
        raise ValueError(f"labels out of range [0, {V}) that are not ignore_index={ignore_index}")
    if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm={max_norm!r}: must be finite and > 0")
    if not (isinstance(clip_eps, (int, float)) and math.isfinite(clip_eps) and clip_eps >= 0):
        raise ValueError(f"clip_eps={clip_eps!r}: must be finite and ≥ 0")


def check_qtype(qtype, n, k, fn: str, formats: dict) -> tuple[int, int]:
    """(values per block, bytes per block) of block format `qtype`, looked up in `formats`
    (name -> that pair: the reference's QTYPES); n, k: non-negative ints, k whole blocks."""
    if qtype not in formats:
        raise ValueError(f"{fn}: qtype must be one of {', '.join(formats)}, got {qtype!r}")
    for name, v in (("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{fn}: {name} must be a non-negative int, got {v!r}")
    qk, nbytes = formats[qtype]
    if k % qk:
        raise ValueError(f"{fn}: k = {k} is not a multiple of {qtype}'s {qk}-value block")
    return qk, nbytes


def empty_weight(fn: str, shape, names=("m", "n")) -> ValueError:
    """The error for a weight with no elements (no blocks, so no absmax to scale by), naming
    its dims as the contracts do: (m, n) for a weight, (o, i) for a layer's base weight."""
    shape = tuple(int(s) for s in shape)
    dims = (", ".join(f"{k} = {s}" for k, s in zip(names, shape)) if len(shape) == len(names)
            else f"shape {shape}")
    return ValueError(f"{fn}: empty weight ({dims})")
