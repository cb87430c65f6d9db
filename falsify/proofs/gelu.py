"""Symbolic facts behind the gelu contract: z3 launch arithmetic."""

import z3

from falsify.kernels.triton.gelu import MAX_BLOCK, launch_config
from falsify.proofs.bitvec import U


def launch_claims():
    """For 1 ≤ rows, n ≤ 2^24 (32-bit vectors): BLOCK is a power of two ≤ 1024 (≥ n when
    n ≤ 1024), cols·BLOCK ≥ n and (cols − 1)·BLOCK < n: every element is in exactly one tile."""
    rows, n = z3.BitVec("rows", 32), z3.BitVec("n", 32)
    cfg = launch_config(U(rows), U(n))
    block, cols = cfg["BLOCK"].e, cfg["grid"][1].e
    dom = z3.And(z3.UGE(rows, 1), z3.ULE(rows, 2 ** 24), z3.UGE(n, 1), z3.ULE(n, 2 ** 24))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == rows, block & (block - 1) == 0, z3.ULE(block, MAX_BLOCK),
        z3.Implies(z3.ULE(n, MAX_BLOCK), z3.UGE(block, n)),
        z3.UGE(cols * block, n), z3.ULT((cols - 1) * block, n)))
