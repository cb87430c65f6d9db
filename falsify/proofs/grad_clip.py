"""Symbolic facts behind the gradient-clipping contract: z3 claims on the scaled merge, the
clip coefficient and the launch arithmetic."""

from __future__ import annotations

import z3

from falsify.proofs.bitvec import U


def _max(a, b):
    return z3.If(a >= b, a, b)


def _abs(a):
    return z3.If(a >= 0, a, -a)


# --------------------------------------------------------------------------- z3: reals
def scaled_merge_claims():
    """The Triton partial/merge rule, with the kernels' zero guards, over the reals.

    Two partials of two elements each: m_k = max|x|, s_k = Σ (x/safe_k)², safe_k = m_k if
    m_k > 0 else 1. Merged M = max(m₁, m₂), S = s₁(m₁/safe_M)² + s₂(m₂/safe_M)². Claims:
    M²·S = Σ x² (so ‖g‖ = M·√S exactly), every scaled square (x/safe_k)² ≤ 1 (the fp32 sum
    cannot overflow: at most one per element), and the running merge of the norm kernel —
    S ← S·(M_old/M_new)² + chunk — is the same identity applied once more."""
    x = z3.Reals("x1 x2 x3 x4")
    m1 = _max(_abs(x[0]), _abs(x[1]))
    m2 = _max(_abs(x[2]), _abs(x[3]))
    safe1 = z3.If(m1 > 0, m1, 1)
    safe2 = z3.If(m2 > 0, m2, 1)
    s1 = (x[0] / safe1) ** 2 + (x[1] / safe1) ** 2
    s2 = (x[2] / safe2) ** 2 + (x[3] / safe2) ** 2
    big = _max(m1, m2)
    safe = z3.If(big > 0, big, 1)
    merged = s1 * (m1 / safe) ** 2 + s2 * (m2 / safe) ** 2
    total = sum(xi * xi for xi in x)
    exact = big * big * merged == total
    bounded = z3.And(*[(xi / safe1) ** 2 <= 1 for xi in x[:2]],
                     *[(xi / safe2) ** 2 <= 1 for xi in x[2:]])
    # running form: state (M_a, S_a) merged with a chunk (m_c, s_c), as in _norm_kernel
    ma, sa, mc, sc = z3.Reals("ma sa mc sc")
    new = _max(ma, mc)
    safe_n = z3.If(new > 0, new, 1)
    running = sa * (ma / safe_n) ** 2 + sc * (mc / safe_n) ** 2
    run_ok = z3.Implies(z3.And(ma >= 0, mc >= 0, sa >= 0, sc >= 0, z3.Or(ma > 0, sa == 0),
                               z3.Or(mc > 0, sc == 0)),
                        new * new * running == ma * ma * sa + mc * mc * sc)
    return z3.And(exact, bounded, run_ok)


def coefficient_claims():
    """coef = min(1, max_norm/(‖g‖ + eps)) for ‖g‖ ≥ 0, max_norm > 0, eps ≥ 0, ‖g‖ + eps > 0:
    0 < coef ≤ 1; the clipped norm coef·‖g‖ ≤ max_norm; below the threshold (‖g‖ + eps ≤
    max_norm) coef = 1 exactly (a no-op); above it coef·(‖g‖ + eps) = max_norm."""
    n, mx, e = z3.Reals("norm max_norm eps")
    ratio = mx / (n + e)
    coef = z3.If(ratio < 1, ratio, 1)
    dom = z3.And(n >= 0, mx > 0, e >= 0, n + e > 0)
    return z3.Implies(dom, z3.And(
        coef > 0, coef <= 1, coef * n <= mx,
        z3.Implies(n + e <= mx, coef == 1),
        z3.Implies(n + e > mx, coef * (n + e) == mx)))


def launch_claims():
    """For two tensors of 1 ≤ n₀, n₁ ≤ 2^31 − MAX_BLOCK elements, running the kernel's own
    `launch_config` on 64-bit vectors: each tensor's programs cover it (progs·BLOCK ≥ n >
    (progs − 1)·BLOCK, BLOCK a power of two ≤ MAX_BLOCK), lane offsets stay < 2^31, the second
    tensor's partials start right after the first's, and the total is progs₀ + progs₁ (so the
    partials buffer of 3·total floats is written exactly once per slot)."""
    from falsify.kernels.triton.grad_clip import MAX_BLOCK, launch_config

    n0, n1 = z3.BitVec("n0", 64), z3.BitVec("n1", 64)
    plan, total = launch_config([U(n0), U(n1)])
    (b0, p0, f0), (b1, p1, f1) = ((b.e, p.e, f if isinstance(f, int) else f.e)
                                  for b, p, f in plan)
    sizes = [2 ** k for k in range(MAX_BLOCK.bit_length())]
    lim = 2 ** 31 - MAX_BLOCK
    dom = z3.And(z3.UGE(n0, 1), z3.ULE(n0, lim), z3.UGE(n1, 1), z3.ULE(n1, lim))

    def covers(n, block, progs):
        cases = []
        for b in sizes:
            g = z3.UDiv(n + b - 1, b)
            cases.append(z3.Implies(block == b, z3.And(
                progs == g, z3.UGE(g * b, n), z3.ULT((g - 1) * b, n),
                z3.ULE(g * b, 2 ** 31 - 1))))
        return z3.And(z3.Or([block == b for b in sizes]), *cases)

    return z3.Implies(dom, z3.And(covers(n0, b0, p0), covers(n1, b1, p1), f0 == 0, f1 == p0,
                                  total.e == p0 + p1))
