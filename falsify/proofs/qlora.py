"""Symbolic facts behind the qlora contract (the loop-level probes are in falsify/probes/qlora.py).

* `addressing_claims` (z3): the on-the-fly dequantization in falsify/kernels/triton/qlora.py
addresses the
  NF4 weight through virtual strides (sbk, sbn) = (1, in) for the forward (W̃ᵀ) and (in, 1) for
  dx (W̃). For every unmasked lane the flat index is the row-major index of the intended W̃
  element and stays inside the weight; its byte and absmax indices stay inside their buffers.
"""

from __future__ import annotations

import z3

from falsify.reference.nf4 import BLOCKSIZES

DIM_MAX = 2**15  # out, in < 2^15: out·in < 2^30 elements, far below int32 element offsets


def addressing_claims():
    """Over the integers (the kernel computes these offsets in int64 and out·in ≤ 2^30, so no
    wrap-around: integer semantics is the machine semantics here). Bit-vector multiplication of
    two symbolic sizes is too hard for z3's bit-blaster; nonlinear integer arithmetic is not."""
    o, i, k, n = z3.Ints("o i k n")
    sizes = z3.And(o >= 1, o <= DIM_MAX, i >= 1, i <= DIM_MAX)
    numel = o * i
    f_fwd = k * 1 + n * i  # forward: B₁[k, n] = W̃ᵀ[k, n] = W̃[n, k], k < in, n < out
    f_bwd = k * i + n * 1  # dx: B₁[k, n] = W̃[k, n], k < out, n < in
    lane_fwd = z3.And(k >= 0, n >= 0, k < i, n < o)
    lane_bwd = z3.And(k >= 0, n >= 0, k < o, n < i)
    claims = [
        z3.Implies(sizes, numel <= 2**30),
        z3.Implies(z3.And(sizes, lane_fwd), z3.And(f_fwd >= 0, f_fwd < numel)),
        z3.Implies(z3.And(sizes, lane_bwd), z3.And(f_bwd >= 0, f_bwd < numel)),
    ]
    for bs in BLOCKSIZES:
        for f, lane in ((f_fwd, lane_fwd), (f_bwd, lane_bwd)):
            # f >> 1 and f >> log2(bs) on non-negative f are f / 2 and f / bs
            claims.append(z3.Implies(z3.And(sizes, lane), z3.And(
                f / 2 < (numel + 1) / 2, f / bs < (numel + bs - 1) / bs)))
    return z3.And(claims)
