"""Symbolic facts behind the rmsnorm contract: z3 claims.

z3 has no sqrt: r = inv_rms is a real variable constrained by its defining equation
r² · (mean(x²) + eps) = 1, r > 0 (a ground lemma). Three elements per row are enough to exercise
every cross term. Integer facts run the kernel's own `launch_config` on bit-vectors.
"""

from __future__ import annotations

import z3

from falsify.kernels.triton.rmsnorm import MAX_BWD_PROGRAMS, launch_config
from falsify.proofs.bitvec import U

N = 3  # symbolic row length for the real-arithmetic claims


def launch_claims():
    """For 1 ≤ n ≤ 2^16 and 1 ≤ m ≤ 2^24 rows, on 32-bit vectors:
    forward: BLOCK is a power of two with n ≤ BLOCK < 2n (the mask `offs < n` keeps the row);
    backward: 1 ≤ programs ≤ MAX_BWD_PROGRAMS, programs·rows_per_program ≥ m (so every row
    r < m belongs to program r // rows_per_program < programs), and no program starts past the
    last row (so every partial dw row is written by a program that owns at least one row)."""
    m, n = z3.BitVec("m", 32), z3.BitVec("n", 32)
    cfg = launch_config(U(m), U(n))
    block, rpp, progs = cfg["BLOCK"].e, cfg["rows_per_program"].e, cfg["programs"].e
    dom = z3.And(z3.UGE(n, 1), z3.ULE(n, 2 ** 16), z3.UGE(m, 1), z3.ULE(m, 2 ** 24))
    return z3.Implies(dom, z3.And(
        z3.UGE(block, n), z3.ULT(block, 2 * n), block & (block - 1) == 0,
        z3.UGE(progs, 1), z3.ULE(progs, MAX_BWD_PROGRAMS),
        z3.UGE(progs * rpp, m),  # so every row r < m has r // rows_per_program < programs
        z3.ULT((progs - 1) * rpp, m)))


def _row(prefix):
    return [z3.Real(f"{prefix}{i}") for i in range(N)]


def backward_claims():
    """Over the reals, with r² · (mean(x²) + eps) = 1, r > 0:
    (1) the kernel's form r·(g_j − x̂_j·mean(g ⊙ x̂)) equals the chain rule
        r·g_j + (Σ_i g_i·x_i)·∂r/∂x_j with ∂r/∂x_j = −r³·x_j/n (implicit differentiation of
        r⁻² = mean(x²) + eps);
    (2) Σ_j x_j·dx_j = eps·r³·Σ_j g_j·x_j: the infinitesimal form of scale invariance — the
        gradient is orthogonal to x up to the eps term."""
    x, g = _row("x"), _row("g")
    r, eps = z3.Reals("r eps")
    ms = sum(xi * xi for xi in x) / N
    hyp = z3.And(eps > 0, r > 0, r * r * (ms + eps) == 1)
    xhat = [xi * r for xi in x]
    mean_gx = sum(gi * xh for gi, xh in zip(g, xhat)) / N
    kernel = [r * (g[j] - xhat[j] * mean_gx) for j in range(N)]
    sum_gx = sum(gi * xi for gi, xi in zip(g, x))
    chain = [r * g[j] + sum_gx * (-r * r * r * x[j] / N) for j in range(N)]
    ortho = sum(x[j] * kernel[j] for j in range(N)) == eps * r * r * r * sum_gx
    return z3.Implies(hyp, z3.And(*[kernel[j] == chain[j] for j in range(N)], ortho))


def scale_claims():
    """Over the reals: rmsnorm(c·x, w, c²·eps) = sign(c)·rmsnorm(x, w, eps) for every c ≠ 0
    (r1, r2 are the inv_rms of the two calls, pinned by their defining equations)."""
    x, w = _row("x"), _row("w")
    c, eps, r1, r2 = z3.Reals("c eps r1 r2")
    ms = sum(xi * xi for xi in x) / N
    ms_c = sum((c * xi) * (c * xi) for xi in x) / N
    hyp = z3.And(c != 0, eps > 0, r1 > 0, r1 * r1 * (ms + eps) == 1,
                 r2 > 0, r2 * r2 * (ms_c + c * c * eps) == 1)
    sign = z3.If(c > 0, z3.RealVal(1), z3.RealVal(-1))
    return z3.Implies(hyp, z3.And(*[(c * x[j]) * r2 * w[j] == sign * x[j] * r1 * w[j]
                                    for j in range(N)]))
