"""Symbolic facts behind the softmax contract (z3)."""

import z3

from falsify.kernels.triton.softmax import launch_config


def online_merge_claims():
    """Online softmax merge over the reals, with exp as an uninterpreted function constrained
    by ground instances of exp(a)·exp(b) = exp(a + b) (z3 has no exp theory).

    Two chunks with states (m1, d1), (m2, d2) where d_k = Σ_{j∈k} exp(x_j − m_k); the merged
    state is m = max(m1, m2), d = d1·exp(m1 − m) + d2·exp(m2 − m). Claim: d equals the one-pass
    Σ_j exp(x_j − m) (two elements per chunk are enough to exercise the rescale)."""
    exp = z3.Function("exp", z3.RealSort(), z3.RealSort())
    x1, x2, x3, x4 = z3.Reals("x1 x2 x3 x4")
    m1 = z3.If(x1 >= x2, x1, x2)
    m2 = z3.If(x3 >= x4, x3, x4)
    m = z3.If(m1 >= m2, m1, m2)
    d1 = exp(x1 - m1) + exp(x2 - m1)
    d2 = exp(x3 - m2) + exp(x4 - m2)
    merged = d1 * exp(m1 - m) + d2 * exp(m2 - m)
    onepass = sum(exp(x - m) for x in (x1, x2, x3, x4))
    lemmas = [exp(x - mk) * exp(mk - m) == exp(x - m)
              for x, mk in ((x1, m1), (x2, m1), (x3, m2), (x4, m2))]
    return z3.Implies(z3.And(lemmas), merged == onepass)


def launch_claims():
    """The Triton softmax launch uses one program per row with BLOCK = next_power_of_2(n)
    lanes and the mask `offs < n`. For every 1 ≤ n ≤ 2^16 the block covers the row
    (BLOCK ≥ n), wastes less than half (BLOCK < 2n) and is a power of two (tl.arange needs it).
    Proved on 32-bit vectors, running the kernel's own launch_config on symbolic input."""
    n = z3.BitVec("n", 32)
    block = launch_config(1, n)["BLOCK"]
    in_range = z3.And(z3.UGE(n, 1), z3.ULE(n, 2 ** 16))
    return z3.Implies(in_range, z3.And(z3.UGE(block, n), z3.ULT(block, 2 * n),
                                       block & (block - 1) == 0))
