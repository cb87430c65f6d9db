"""Symbolic facts behind the KD-loss contract: Gibbs' inequality with a ground log lemma (z3)
and the α limits."""

from __future__ import annotations

import z3


def kl_nonnegative_claims():
    """KL(p ‖ q) = Σ p_i (log p_i − log q_i) ≥ 0 for V = 3, and ≥ 0 for the top-k form where
    the student's probabilities on the k indices sum to ≤ 1. z3 has no logarithm: log is an
    uninterpreted function constrained by ground instances of log(a) − log(b) ≤ a/b − 1
    (a, b > 0; i.e. log x ≤ x − 1 at x = a/b, with log(a/b) = log a − log b). Then
    −KL = Σ p_i (log q_i − log p_i) ≤ Σ p_i (q_i/p_i − 1) = Σ q_i − Σ p_i ≤ 0."""
    log = z3.Function("log", z3.RealSort(), z3.RealSort())
    p = z3.Reals("p0 p1 p2")
    q = z3.Reals("q0 q1 q2")
    dom = z3.And(*[x > 0 for x in p + q], sum(p) == 1, sum(q) <= 1)
    lemmas = [log(qi) - log(pi) <= qi / pi - 1 for pi, qi in zip(p, q)]
    kl = sum(pi * (log(pi) - log(qi)) for pi, qi in zip(p, q))
    return z3.Implies(z3.And(dom, *lemmas), kl >= 0)


def alpha_limit_claims():
    """L = α·T²·KL + (1 − α)·CE: α = 0 gives CE exactly, α = 1 gives T²·KL exactly, and for
    α ∈ [0, 1] L lies between the two (a convex combination of CE and T²·KL)."""
    a, t, kl, ce = z3.Reals("alpha T kl ce")
    loss = a * t * t * kl + (1 - a) * ce
    lo = z3.If(t * t * kl <= ce, t * t * kl, ce)
    hi = z3.If(t * t * kl <= ce, ce, t * t * kl)
    return z3.And(z3.substitute(loss, (a, z3.RealVal(0))) == ce,
                  z3.substitute(loss, (a, z3.RealVal(1))) == t * t * kl,
                  z3.Implies(z3.And(a >= 0, a <= 1), z3.And(lo <= loss, loss <= hi)))
