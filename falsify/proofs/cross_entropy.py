"""Symbolic facts behind the cross-entropy contract: z3 claims (online logsumexp merge, the
smoothed loss identity, gradient row sums, launch coverage)."""

from __future__ import annotations

import z3

from falsify.proofs.bitvec import U


def _max(a, b):
    return z3.If(a >= b, a, b)


def online_lse_claims():
    """One vocabulary chunk merged into a running state, exp uninterpreted (z3 has no exp
    theory) with ground instances of exp(a)·exp(b) = exp(a + b).

    State (m, d) over x1, x2 with d = Σ exp(x − m); chunk x3, x4 with max c;
    m' = max(m, c), d' = d·exp(m − m') + Σ_chunk exp(x − m'). Claim: d' = Σ_{all} exp(x − m'),
    so lse = m' + log d' is the one-pass logsumexp (log is monotone and applied once)."""
    exp = z3.Function("exp", z3.RealSort(), z3.RealSort())
    x1, x2, x3, x4 = z3.Reals("x1 x2 x3 x4")
    m = _max(x1, x2)
    c = _max(x3, x4)
    m2 = _max(m, c)
    d = exp(x1 - m) + exp(x2 - m)
    merged = d * exp(m - m2) + exp(x3 - m2) + exp(x4 - m2)
    onepass = exp(x1 - m2) + exp(x2 - m2) + exp(x3 - m2) + exp(x4 - m2)
    lemmas = [exp(x - m) * exp(m - m2) == exp(x - m2) for x in (x1, x2)]
    return z3.Implies(z3.And(lemmas), merged == onepass)


def loss_and_gradient_claims():
    """Over the reals for V = 3 (enough to separate target and non-target terms), target y = 0,
    smoothing ε ∈ [0, 1], z-loss ζ ≥ 0, lse with p_j = exp(z_j − lse) summing to 1:

    1. −Σ_j q_j (z_j − lse) = (1 − ε)(lse − z_y) + ε(lse − mean z)   for q = (1 − ε)e_y + ε/V;
    2. the gradient rows p·(1 + 2ζ·lse) − q sum to 2ζ·lse, hence to 0 without z-loss;
    3. without z-loss every gradient entry lies in [−1, 1]."""
    z0, z1, z2, lse, e, zeta = z3.Reals("z0 z1 z2 lse eps zeta")
    p = z3.Reals("p0 p1 p2")
    q = [(1 - e) + e / 3, e / 3, e / 3]
    dom = z3.And(e >= 0, e <= 1, zeta >= 0, *[pj >= 0 for pj in p], sum(p) == 1)
    smoothed = -sum(qj * (zj - lse) for qj, zj in zip(q, (z0, z1, z2)))
    identity = smoothed == (1 - e) * (lse - z0) + e * (lse - (z0 + z1 + z2) / 3)
    g = [pj * (1 + 2 * zeta * lse) - qj for pj, qj in zip(p, q)]
    g0 = [pj - qj for pj, qj in zip(p, q)]
    return z3.Implies(dom, z3.And(identity, sum(g) == 2 * zeta * lse, sum(g0) == 0,
                                  *[z3.And(gj >= -1, gj <= 1) for gj in g0]))


def launch_claims():
    """For 1 ≤ V ≤ 2^31 − 2·MAX_BLOCK_V on 64-bit vectors, the kernels' `launch_config`:
    BLOCK_V is a power of two ≤ MAX_BLOCK_V (≥ V when V fits in one chunk); the loop
    `for c0 in range(0, V, BLOCK_V)` with mask `offs < V` reaches every column j < V in
    iteration j // BLOCK_V, which exists (j // BLOCK_V · BLOCK_V < V), and no lane offset
    c0 + BLOCK_V − 1 reaches 2^31 (int32 `offs` never wraps)."""
    from falsify.kernels.triton.cross_entropy import MAX_BLOCK_V, launch_config

    T, V, j = z3.BitVec("T", 64), z3.BitVec("V", 64), z3.BitVec("j", 64)
    grid, block = launch_config(U(T), U(V))
    block = block.e
    sizes = [2 ** k for k in range(MAX_BLOCK_V.bit_length())]
    dom = z3.And(z3.UGE(V, 1), z3.ULE(V, 2 ** 31 - 2 * MAX_BLOCK_V))

    def covers(b):
        it = z3.UDiv(j, b)
        last = z3.UDiv(V - 1, b)
        return z3.And(z3.Implies(z3.ULT(j, V), z3.And(z3.ULT(it * b, V), z3.ULE(it, last))),
                      z3.ULT(last * b + b - 1, 2 ** 31))

    return z3.Implies(dom, z3.And(
        grid.e == T, z3.Or([block == b for b in sizes]),
        z3.Implies(z3.ULE(V, MAX_BLOCK_V), z3.UGE(block, V)),
        *[z3.Implies(block == b, covers(b)) for b in sizes]))
