"""Symbolic facts behind the embedding contract: z3 launch/address arithmetic."""

import z3

from falsify.kernels.triton.embedding import MAX_BLOCK, launch_config
from falsify.proofs.bitvec import U


def launch_claims():
    """On 32-bit vectors, for 1 ≤ tokens ≤ 2^30 and 1 ≤ D ≤ 2^20: the column tiles cover D
    exactly (cols·BLOCK ≥ D > (cols − 1)·BLOCK, BLOCK = 2^k ≤ 1024)."""
    tokens, d = z3.BitVec("tokens", 32), z3.BitVec("d", 32)
    cfg = launch_config(U(tokens), U(d))
    block, cols = cfg["BLOCK"].e, cfg["grid"][1].e
    dom = z3.And(z3.UGE(tokens, 1), z3.ULE(tokens, 2 ** 30), z3.UGE(d, 1), z3.ULE(d, 2 ** 20))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == tokens, block & (block - 1) == 0, z3.ULE(block, MAX_BLOCK),
        z3.UGE(cols * block, d), z3.ULT((cols - 1) * block, d)))


def address_claims():
    """Over the integers (the kernel computes offsets in int64, far from overflow for tables
    below 2^62 elements): for a table [V, D] with row stride s_v ≥ D·s_d and s_d ≥ 1, every id
    the host check admits (0 ≤ id < V) and every unmasked lane (0 ≤ col < D) addresses an element
    inside the table's extent: 0 ≤ id·s_v + col·s_d ≤ (V − 1)·s_v + (D − 1)·s_d. The
    accumulator is contiguous (s_v = D, s_d = 1), so its adds land in [0, V·D)."""
    row, col, v, d, sv, sd = z3.Ints("row col v d s_v s_d")
    dom = z3.And(v >= 1, d >= 1, sd >= 1, sv >= d * sd)
    admitted = z3.And(row >= 0, row < v, col >= 0, col < d)
    off = row * sv + col * sd
    return z3.Implies(z3.And(dom, admitted), z3.And(
        off >= 0, off <= (v - 1) * sv + (d - 1) * sd,
        z3.Implies(z3.And(sv == d, sd == 1), off < v * d)))
