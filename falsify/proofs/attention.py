"""Symbolic facts behind the attention contract: z3 claims (online softmax with and without the
accumulator rescale, the backward's Δ identity and softmax Jacobian, the launch and causal
tiling arithmetic). The executable probes (GQA, peak memory) are in falsify/probes/attention.py.

z3 has no exp: it is an uninterpreted function constrained by the ground instances of
exp(a)·exp(b) = exp(a + b) a claim needs, plus exp(0) = 1 and exp(x) ∈ (0, 1) for the one
negative argument the refutation uses: a quantified axiom sends z3's instantiation into
unbounded search, while the ground lemmas leave a quantifier-free problem it decides quickly.
"""

from __future__ import annotations

import z3

from falsify.kernels.triton.attention import MAX_HEAD_DIM, launch_config
from falsify.proofs.bitvec import U
from falsify.proofs.gemm import LIM, bv, pow2_in, tiles_cover


def online_softmax_claims():
    """Two key tiles of two keys each (scores x1..x4, values w1..w4 for one output column).
    Tile states: m_t = max of the tile, l_t = Σ exp(x − m_t), a_t = Σ exp(x − m_t)·w. The
    kernel's update after tile 2, starting from tile 1's state:
        m = max(m1, m2),  l = l1·exp(m1 − m) + Σ_{tile 2} exp(x − m),
        acc = a1·exp(m1 − m) + Σ_{tile 2} exp(x − m)·w
    Claim: (l, acc) equal the one-pass Σ_j exp(x_j − m) and Σ_j exp(x_j − m)·w_j, so
    o = acc / l is softmax(x)·w whatever order the maxima arrive in."""
    exp = z3.Function("exp", z3.RealSort(), z3.RealSort())
    x1, x2, x3, x4, w1, w2, w3, w4 = z3.Reals("x1 x2 x3 x4 w1 w2 w3 w4")
    m1 = z3.If(x1 >= x2, x1, x2)
    m2 = z3.If(x3 >= x4, x3, x4)
    m = z3.If(m1 >= m2, m1, m2)
    l1 = exp(x1 - m1) + exp(x2 - m1)
    a1 = exp(x1 - m1) * w1 + exp(x2 - m1) * w2
    l = l1 * exp(m1 - m) + exp(x3 - m) + exp(x4 - m)
    acc = a1 * exp(m1 - m) + exp(x3 - m) * w3 + exp(x4 - m) * w4
    l_one = sum(exp(x - m) for x in (x1, x2, x3, x4))
    acc_one = sum(exp(x - m) * w for x, w in ((x1, w1), (x2, w2), (x3, w3), (x4, w4)))
    lemmas = [exp(x - m1) * exp(m1 - m) == exp(x - m) for x in (x1, x2)]
    return z3.Implies(z3.And(lemmas), z3.And(l == l_one, acc == acc_one))


def seed_formula_refuted_claims():
    """A fused tiled attention update that omits the accumulator rescale: O += exp(s − m_new)·V
    while l is rescaled. One key per tile (score a, then b > a; values va, vb):
        correct: O = (exp(a − b)·va + vb) / (exp(a − b) + 1)
        seed:    O = (va + vb) / (exp(a − b) + 1)
    Claim: whenever the running max increases (b > a) and va ≠ 0, the seed's output differs
    from softmax·V — i.e. the formula as written is false, not merely imprecise."""
    exp = z3.Function("exp", z3.RealSort(), z3.RealSort())
    a, b, va, vb = z3.Reals("a b va vb")
    l = exp(a - b) * exp(z3.RealVal(0)) + exp(b - b)
    correct = (exp(a - b) * va + exp(b - b) * vb) / l
    seed = (va + exp(b - b) * vb) / l
    hyp = z3.And(b > a, va != 0, exp(z3.RealVal(0)) == 1, exp(b - b) == 1,
                 exp(a - b) > 0, exp(a - b) < 1)  # exp maps (−∞, 0) into (0, 1)
    return z3.Implies(hyp, seed != correct)


def backward_claims():
    """Over the reals, for one query row with 3 keys and head dim 2 (P symbolic, O = P·V,
    dP = dO·Vᵀ):
    (1) Δ = Σ_j P_j·dP_j equals Σ_d dO_d·O_d — why the kernels compute Δ from O and dO without
        ever forming a row of P;
    (2) the softmax vector-Jacobian product Σ_k (∂P_k/∂s_j)·dP_k with ∂P_k/∂s_j = P_k(δ_kj − P_j)
        equals P_j·(dP_j − Δ), the kernels' dS."""
    n, dd = 3, 2
    p = [z3.Real(f"p{j}") for j in range(n)]
    v = [[z3.Real(f"v{j}_{d}") for d in range(dd)] for j in range(n)]
    do = [z3.Real(f"do{d}") for d in range(dd)]
    o = [sum(p[j] * v[j][d] for j in range(n)) for d in range(dd)]
    dp = [sum(do[d] * v[j][d] for d in range(dd)) for j in range(n)]
    delta = sum(p[j] * dp[j] for j in range(n))
    claims = [delta == sum(do[d] * o[d] for d in range(dd))]
    for j in range(n):
        vjp = sum(p[k] * ((1 if k == j else 0) - p[j]) * dp[k] for k in range(n))
        claims.append(vjp == p[j] * (dp[j] - delta))
    return z3.And(claims)


def launch_claims():
    """For all 1 ≤ S < 2^31 and 1 ≤ D ≤ 256, running the real launch_config:
    - BLOCK_M = BLOCK_N is a power of two in [16, 64]; BLOCK_D a power of two ≥ max(D, 16);
    - q_tiles, k_tiles cover [0, S) with no empty tile; every row r < S is in tile r // BLOCK_M;
    - causal forward: the key loop of a query tile ends at hi = min((tile + 1)·BLOCK_M, S)
      (the kernel's expression), and every key j ≤ r of every row r of the tile is < hi: no
      visible key is skipped;
    - causal dK/dV: a key tile starts its query loop at lo = (tile·BLOCK_N) // BLOCK_M·BLOCK_M
      (the kernel's expression); every query row r ≥ j (which sees key j of the tile) is ≥ lo,
      and lo ≤ the tile's first key, so every row that sees a key is visited."""
    s, d, r, j = bv("S"), bv("D"), bv("r"), bv("j")
    cfg = {key: v.e for key, v in launch_config(U(s), U(d)).items()}
    bm, bn, bd = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"]
    dom = z3.And(z3.UGE(s, 1), z3.ULT(s, LIM), z3.UGE(d, 1), z3.ULE(d, MAX_HEAD_DIM))
    tile_m = z3.UDiv(r, bm)
    hi_end = (tile_m + 1) * bm
    hi = z3.If(z3.ULT(hi_end, s), hi_end, s)
    tile_n = z3.UDiv(j, bn)
    lo = z3.UDiv(tile_n * bn, bm) * bm
    return z3.Implies(dom, z3.And(
        pow2_in(bm, 16, 64), bn == bm, bd & (bd - 1) == 0, z3.UGE(bd, d), z3.UGE(bd, 16),
        tiles_cover(s, bm, cfg["q_tiles"]), tiles_cover(s, bn, cfg["k_tiles"]),
        z3.Implies(z3.ULT(r, s), z3.ULT(tile_m, cfg["q_tiles"])),
        z3.Implies(z3.And(z3.ULT(r, s), z3.ULE(j, r)), z3.ULT(j, hi)),
        z3.Implies(z3.And(z3.ULT(j, s), z3.UGE(r, j)), z3.And(z3.UGE(r, lo),
                                                                 z3.ULE(lo, tile_n * bn)))))
