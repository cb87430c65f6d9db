"""Symbolic fact behind the gradient-accumulation contract: a z3 claim on the token
weighting. (The loop-level runs are in falsify/probes/grad_accumulation.py.)"""

from __future__ import annotations

import z3


def token_weighting_claims():
    """Over the reals, for two micro-batches with sums S₁, S₂ over n₁, n₂ > 0 valid tokens:
    S₁/n + S₂/n = (S₁ + S₂)/n with n = n₁ + n₂ (accumulating token-normalised sums is the
    full-batch mean), while the mean of means ½(S₁/n₁ + S₂/n₂) equals it for all S iff
    n₁ = n₂. The same linearity carries the gradients (∂ is linear)."""
    s1, s2, n1, n2 = z3.Reals("s1 s2 n1 n2")
    n = n1 + n2
    pos = z3.And(n1 > 0, n2 > 0)
    exact = z3.Implies(pos, s1 / n + s2 / n == (s1 + s2) / n)
    # mean of means equals the token mean exactly when (S₁/n₁ − S₂/n₂)(n₁ − n₂) = 0
    mom = (s1 / n1 + s2 / n2) / 2
    mom_iff = z3.Implies(pos, (mom == (s1 + s2) / n) == ((s1 / n1 - s2 / n2) * (n1 - n2) == 0))
    return z3.And(exact, mom_iff)
