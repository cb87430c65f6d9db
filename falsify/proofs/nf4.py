"""Symbolic facts behind the nf4 contract (z3), proved about the functions the kernels use.

The packing helpers (`nf4_byte_of`, `nf4_shift_of`, `nf4_block_of`, `cdiv` in
falsify/kernels/launch.py)
and the Triton `launch_config` are plain Python integer code. `U` below wraps a z3 bit-vector so
that this very code runs symbolically: `//`, `%` and `>>` become unsigned division, remainder
and logical shift, comparisons become unsigned. Sizes are 48-bit vectors with n < 2^31: every
intermediate (n + bs − 1, 2·byte, grid·G·HALF) stays below 2^34, so nothing wraps and
bit-vector results equal integer results (48 rather than 64 bits keeps the multiplications cheap
for the solver).
"""

from __future__ import annotations

import z3

from falsify.kernels.launch import cdiv, nf4_block_of, nf4_byte_of, nf4_shift_of
from falsify.reference.nf4 import BLOCKSIZES, DQ_BLOCKSIZE

WIDTH = 48
N_MAX = 2**31 - 1  # elements: the kernels index with int32 element offsets


class U:
    """An unsigned z3 bit-vector that behaves like a non-negative Python int (constants take
    the width of the vector they meet)."""

    def __init__(self, v, width=WIDTH):
        self.v = v if isinstance(v, z3.BitVecRef) else z3.BitVecVal(int(v), width)

    def _(self, x):
        return x.v if isinstance(x, U) else z3.BitVecVal(int(x), self.v.size())

    def __add__(self, o):
        return U(self.v + self._(o))

    __radd__ = __add__

    def __sub__(self, o):
        return U(self.v - self._(o))

    def __rsub__(self, o):
        return U(self._(o) - self.v)

    def __mul__(self, o):
        return U(self.v * self._(o))

    __rmul__ = __mul__

    def __floordiv__(self, o):
        return U(z3.UDiv(self.v, self._(o)))

    def __mod__(self, o):
        return U(z3.URem(self.v, self._(o)))

    def __rshift__(self, o):
        return U(z3.LShR(self.v, self._(o)))

    def __lshift__(self, o):
        return U(self.v << self._(o))

    def __rlshift__(self, o):
        return U(self._(o) << self.v)

    def __and__(self, o):
        return U(self.v & self._(o))

    def __or__(self, o):
        return U(self.v | self._(o))

    def __lt__(self, o):
        return z3.ULT(self.v, self._(o))

    def __le__(self, o):
        return z3.ULE(self.v, self._(o))

    def __gt__(self, o):
        return z3.UGT(self.v, self._(o))

    def __ge__(self, o):
        return z3.UGE(self.v, self._(o))

    def eq(self, o):
        return self.v == self._(o)


def var(name, width=WIDTH):
    return U(z3.BitVec(name, width))


def in_range(n):
    return z3.And(n >= 1, n <= N_MAX)


def nibble_claims():
    """Element i ↔ (byte, nibble) is a bijection onto the nibbles of cdiv(n, 2) bytes, even
    elements in the high nibble; packing two codes and unpacking with the same helpers gives
    the codes back (8-bit vectors: all 16 × 16 code pairs)."""
    n, i, j = var("n"), var("i"), var("j")
    valid_i = z3.And(in_range(n), i < n)
    valid_j = z3.And(valid_i, j < n)
    byte_in_bounds = z3.Implies(valid_i, nf4_byte_of(i) < cdiv(n, 2))
    even_high = z3.Implies(valid_i, (i & 1).eq(0) == nf4_shift_of(i).eq(4))
    shift_is_nibble = z3.Implies(valid_i, z3.Or(nf4_shift_of(i).eq(0), nf4_shift_of(i).eq(4)))
    injective = z3.Implies(
        z3.And(valid_j, z3.Not(i.eq(j))),
        z3.Not(z3.And(nf4_byte_of(i).eq(nf4_byte_of(j)), nf4_shift_of(i).eq(nf4_shift_of(j)))))
    # every byte below cdiv(n, 2) holds element 2b (high) and, when 2b + 1 < n, element 2b + 1
    b = var("b")
    surjective = z3.Implies(z3.And(in_range(n), b < cdiv(n, 2)),
                            z3.And(nf4_byte_of(2 * b).eq(b), nf4_shift_of(2 * b).eq(4),
                                   nf4_byte_of(2 * b + 1).eq(b), nf4_shift_of(2 * b + 1).eq(0),
                                   2 * b < n))
    # the byte of element pair (e, e + 1), e even, packs and unpacks both codes unchanged
    e, qe, qo = var("e"), var("qe"), var("qo")
    byte = (qe << nf4_shift_of(e)) | (qo << nf4_shift_of(e + 1))
    roundtrip = z3.Implies(
        z3.And((e & 1).eq(0), e < 2 * N_MAX, qe < 16, qo < 16),
        z3.And(((byte >> nf4_shift_of(e)) & 15).eq(qe), ((byte >> nf4_shift_of(e + 1)) & 15).eq(qo),
               byte < 256))
    return z3.And(byte_in_bounds, even_high, shift_is_nibble, injective, surjective, roundtrip)


def absmax_index_claims():
    """For every supported blocksize and every element i < n: absmax index
    nf4_block_of(i, log2 bs) = floor(i / bs) < cdiv(n, bs) (the absmax buffer size), the
    double-quantization index (i // bs) // 256 < cdiv(cdiv(n, bs), 256), and block b covers
    exactly the elements [b·bs, min((b+1)·bs, n))."""
    n, i = var("n"), var("i")
    claims = []
    for bs in BLOCKSIZES:
        log2_bs = bs.bit_length() - 1
        blk = nf4_block_of(i, log2_bs)
        nb = cdiv(n, bs)
        claims.append(z3.Implies(z3.And(in_range(n), i < n), z3.And(
            blk.eq(i // bs),
            blk < nb,
            (blk >> 8) < cdiv(nb, DQ_BLOCKSIZE),
            blk * bs <= i, i < (blk + 1) * bs)))
    return z3.And(claims)


def launch_claims():
    """`launch_config` (falsify/kernels/triton/nf4.py), run on symbolic n for each blocksize: the
    quantize
    grid covers every block exactly once with no idle program, the tile is a power of two, the
    store masks `2·pair < n` and `blk < nblocks` select exactly the cdiv(n, 2) bytes and
    cdiv(n, bs) blocks, and the dequantize and absmax-decode grids cover their buffers."""
    from falsify.kernels.triton.nf4 import launch_config

    n, p, g, pair = var("n"), var("p"), var("g"), var("pair")
    claims = []
    for bs in BLOCKSIZES:
        cfg = launch_config(n, bs)
        G, HALF = cfg["G"], cfg["HALF"]  # noqa: N806 - the kernel's constexpr names
        assert G & (G - 1) == 0 and HALF & (HALF - 1) == 0 and 2 * HALF == bs
        nb, grid = cdiv(n, bs), cfg["quant_grid"]
        blk = p * G + g
        claims.append(z3.Implies(in_range(n), z3.And(
            grid * G >= nb,
            (grid - 1) * G < nb,
            cfg["dequant_grid"] * cfg["dequant_block"] >= cdiv(n, 2),
            cfg["absmax_grid"] * 256 >= nb)))
        # lane (p, g, pair) of the quantize kernel stores byte blk*HALF + pair iff 2*byte < n
        byte = blk * HALF + pair
        claims.append(z3.Implies(
            z3.And(in_range(n), p < grid, g < G, pair < HALF),
            z3.And((2 * byte < n) == (byte < cdiv(n, 2)),
                   z3.Implies(2 * byte < n, blk < nb))))
    return z3.And(claims)
