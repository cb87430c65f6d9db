"""Facts behind the rope contract (z3).

z3 has no trigonometry: cos and sin are uninterpreted functions, constrained by ground
instances of the identities a proof needs (cos² + sin² = 1, the angle-difference formulas) at
the specific symbolic angles involved. Integer facts run the kernel's own `launch_config` on
unsigned bit-vectors.
"""

import z3

from falsify.kernels.triton.rope import GROUP, launch_config
from falsify.proofs.bitvec import U


def _rot(x1, x2, c, s):
    """The kernel's per-pair expression: (x1·c − x2·s, x2·c + x1·s)."""
    return x1 * c - x2 * s, x2 * c + x1 * s


def rotation_claims():
    """For one pair (x1, x2) and angle a with cos(a)² + sin(a)² = 1:
    (1) the pair norm is preserved; (2) applying the backward (sin negated) to the forward
    output returns x — the backward is the inverse, hence the transpose, of the forward;
    (3) relative position: with cos/sin of a − b given by the difference formulas,
    ⟨R_a q, R_b k⟩ = ⟨q, R_{b−a} k⟩ for every pair q, k — it depends on b − a only."""
    cos = z3.Function("cos", z3.RealSort(), z3.RealSort())
    sin = z3.Function("sin", z3.RealSort(), z3.RealSort())
    x1, x2, q1, q2, k1, k2, a, b = z3.Reals("x1 x2 q1 q2 k1 k2 a b")
    lemmas = [cos(t) * cos(t) + sin(t) * sin(t) == 1 for t in (a, b, b - a)]
    lemmas += [cos(b - a) == cos(b) * cos(a) + sin(b) * sin(a),
               sin(b - a) == sin(b) * cos(a) - cos(b) * sin(a)]
    y1, y2 = _rot(x1, x2, cos(a), sin(a))
    norm = y1 * y1 + y2 * y2 == x1 * x1 + x2 * x2
    z1, z2 = _rot(y1, y2, cos(a), -sin(a))
    inverse = z3.And(z1 == x1, z2 == x2)
    qa1, qa2 = _rot(q1, q2, cos(a), sin(a))
    kb1, kb2 = _rot(k1, k2, cos(b), sin(b))
    kd1, kd2 = _rot(k1, k2, cos(b - a), sin(b - a))
    relative = qa1 * kb1 + qa2 * kb2 == q1 * kd1 + q2 * kd2
    return z3.Implies(z3.And(lemmas), z3.And(norm, inverse, relative))


def launch_claims():
    """For 1 ≤ B·S ≤ 2^24, 1 ≤ H ≤ 2^10, 1 ≤ half ≤ 2^12 (32-bit vectors): every head h < H is
    handled by program column h // GROUP < grid[1] at unrolled index h % GROUP < GROUP, no
    program column starts past the last head, and BLOCK is a power of two with half ≤ BLOCK
    < 2·half, so the lane mask `offs < half` covers each half-row exactly."""
    bs, h, half, hh = (z3.BitVec(n, 32) for n in ("bs", "h", "half", "hh"))
    cfg = launch_config(U(bs), U(1), U(h), U(half) * 2)
    cols, block = cfg["grid"][1].e, cfg["BLOCK"].e
    dom = z3.And(z3.UGE(bs, 1), z3.ULE(bs, 2 ** 24), z3.UGE(h, 1), z3.ULE(h, 2 ** 10),
                 z3.UGE(half, 1), z3.ULE(half, 2 ** 12))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == bs,
        z3.Implies(z3.ULT(hh, h), z3.And(z3.ULT(z3.UDiv(hh, GROUP), cols),
                                          z3.ULT(z3.URem(hh, GROUP), GROUP))),
        z3.ULT((cols - 1) * GROUP, h),
        z3.UGE(block, half), z3.ULT(block, 2 * half), block & (block - 1) == 0))
