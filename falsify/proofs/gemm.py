"""Symbolic facts behind the gemm contract: z3 claims over the kernel's own launch arithmetic.

The z3 claims run `launch_config` and `span` from falsify/kernels/triton/gemm.py on 64-bit vectors
(unsigned: `//` is UDiv, `>>` a logical shift), for every M, N, K, stride below 2^31, so they are
facts about the functions the wrapper calls, not about a re-statement of them.
"""

from __future__ import annotations

import z3

from falsify.kernels.triton.gemm import MAX_EXTENT, launch_config, span
from falsify.proofs.bitvec import U

W = 64  # bit width: products of two values < 2^31 fit, so no claim is an overflow artefact
LIM = 2**31


def bv(name):
    return z3.BitVec(name, W)


def pow2_in(x, lo, hi):
    return z3.And(x & (x - 1) == 0, z3.UGE(x, lo), z3.ULE(x, hi))


def tiles_cover(n, block, tiles):
    """tiles·block ≥ n (every index has a tile) and (tiles − 1)·block < n (no empty tile)."""
    return z3.And(z3.UGE(tiles * block, n), z3.ULT((tiles - 1) * block, n))


def launch_claims():
    """For all 1 ≤ M, N, K < 2^31:
    - BLOCK_M, BLOCK_N are powers of two in [16, 64], BLOCK_K in [16, 32] (tl.dot needs ≥ 16);
    - the grid covers every output row and column and launches no program past the last one;
    - the K loop's cdiv(K, BLOCK_K) tiles cover [0, K) with no empty tile, so the `ks < K` mask
      drops exactly the lanes past K (a floor-division loop would drop K mod BLOCK_K terms);
    - every (m, n) < (M, N) lies in program (m // BLOCK_M, n // BLOCK_N) inside the grid."""
    m, n, k, i, j = (bv(s) for s in "mnkij")
    cfg = {key: v.e for key, v in launch_config(U(m), U(n), U(k)).items()}
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    dom = z3.And(*[z3.And(z3.UGE(x, 1), z3.ULT(x, LIM)) for x in (m, n, k)])
    return z3.Implies(dom, z3.And(
        pow2_in(bm, 16, 64), pow2_in(bn, 16, 64), pow2_in(bk, 16, 32),
        tiles_cover(m, bm, cfg["grid_m"]), tiles_cover(n, bn, cfg["grid_n"]),
        tiles_cover(k, bk, cfg["k_tiles"]),
        z3.Implies(z3.And(z3.ULT(i, m), z3.ULT(j, n)),
                   z3.And(z3.ULT(z3.UDiv(i, bm), cfg["grid_m"]),
                          z3.ULT(z3.UDiv(j, bn), cfg["grid_n"])))))


def buffer_claims():
    """The buffer-size contract (out holds M·N elements), over unbounded integers (the tile and
    mask facts that bound the lanes come from `launch_claims`): for a [R, C] view with strides
    s0, s1 ≥ 0, every lane that passes the kernel's mask (r < R, c < C) has offset
    r·s0 + c·s1 < span(R, C, s0, s1), the extent the wrapper checks against MAX_EXTENT; so with
    extent ≤ MAX_EXTENT every dereferenced offset fits int32. For the contiguous [M, N] output
    the extent is exactly M·N elements: a buffer of M·N − 1 elements is undersized, which is why
    the wrapper demands out.shape == (M, N) before launch."""
    rows, cols, s0, s1, r, c = z3.Ints("R C s0 s1 r c")
    ext = span(rows, cols, s0, s1)
    dom = z3.And(rows >= 1, cols >= 1, s0 >= 0, s1 >= 0, r >= 0, c >= 0)
    masked_in = z3.And(r < rows, c < cols)
    off = r * s0 + c * s1
    return z3.Implies(dom, z3.And(
        z3.Implies(masked_in, off < ext),
        z3.Implies(z3.And(masked_in, ext <= MAX_EXTENT), off < 2**31),
        span(rows, cols, cols, 1) == rows * cols))
