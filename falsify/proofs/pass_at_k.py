"""Symbolic facts behind the pass-at-k contract (z3, nonlinear real arithmetic)."""

from __future__ import annotations

import z3


def monotone_product_claims():
    """Why pass@k = 1 − Π_{i=n−c+1}^{n} (1 − k/i) is non-decreasing in k and in c:
    each factor lies in [0, 1) and does not grow with k (1 ≤ k ≤ k′ ≤ i); a product of
    non-negative factors is monotone in each (0 ≤ a ≤ a′, 0 ≤ b ≤ b′ ⇒ ab ≤ a′b′: the
    induction step over the factors, so the whole product does not grow with k); one more
    factor f ∈ [0, 1] (c → c + 1 adds i = n − c) keeps a product P ∈ [0, 1] in [0, P]."""
    i, k, k2, a, a2, b, b2, f, P = z3.Reals("i k k2 a a2 b b2 f P")
    factor = z3.Implies(z3.And(1 <= k, k <= k2, k2 <= i),
                        z3.And(0 <= 1 - k2 / i, 1 - k2 / i <= 1 - k / i, 1 - k / i < 1))
    product = z3.Implies(z3.And(0 <= a, a <= a2, 0 <= b, b <= b2), a * b <= a2 * b2)
    extra = z3.Implies(z3.And(0 <= P, P <= 1, 0 <= f, f <= 1),
                       z3.And(0 <= P * f, P * f <= P))
    return [factor, product, extra]


def pass_at_1_claims():
    """pass@1 = c/n: the product telescopes. With P_c = (n − c)/n (true for c = 0), the next
    factor at i = m = n − c ≥ 1 gives P_c·(1 − 1/m) = (m − 1)/n = P_{c+1}; and the step of the
    general identity, C(m − 1, k)/C(m, k) = (m − k)/m = 1 − k/m for m ≥ 1, written with
    B = C(m, k) > 0 and C(m − 1, k) = B·(m − k)/m."""
    n, m, k, B = z3.Reals("n m k B")
    telescope = z3.Implies(z3.And(m >= 1, n >= m),
                           (m / n) * (1 - 1 / m) == (m - 1) / n)
    step = z3.Implies(z3.And(m >= 1, B > 0), (B * (m - k) / m) / B == 1 - k / m)
    return [telescope, step]
