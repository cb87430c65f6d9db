"""Symbolic facts behind the DPO contract (z3, exp uninterpreted with ground lemmas)."""

from __future__ import annotations

import z3


def sigmoid_claims():
    """With E(x) standing for exp(x) (E > 0, E(x)·E(−x) = 1) and σ(x) = 1/(1 + E(−x)):
    σ(h)/σ(−h) = E(h), i.e. log σ(h) − log σ(−h) = h (swapping chosen and rejected changes
    the loss by exactly the mean margin); 1 − σ(h) = σ(−h); σ(0) = ½ (so at π = ref the loss
    is log 2); and with β > 0 the chosen gradient −β·σ(−h) is < 0 and the rejected one > 0."""
    E = z3.Function("E", z3.RealSort(), z3.RealSort())
    h, beta = z3.Reals("h beta")

    def sig(x):
        return 1 / (1 + E(-x))

    lem = z3.And(E(h) > 0, E(-h) > 0, E(h) * E(-h) == 1, E(z3.RealVal(0)) == 1)
    return z3.Implies(lem, z3.And(
        sig(h) / sig(-h) == E(h), 1 - sig(h) == sig(-h),
        sig(z3.RealVal(0)) == z3.RealVal(1) / 2,
        z3.Implies(beta > 0, z3.And(-beta * sig(-h) < 0, beta * sig(-h) > 0))))
