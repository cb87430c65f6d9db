"""pass@k, the unbiased estimator of Chen et al. (2021), exactly (pure Python integers and
fractions: no floats until the one final, correctly rounded conversion).

With n samples of a problem of which c pass, the probability that a draw of k of the n
samples without replacement contains at least one passing sample is

    pass@k(n, c, k) = 1 − C(n − c, k) / C(n, k),      0 ≤ c ≤ n, 1 ≤ k ≤ n,

(C(m, k) = 0 for m < k, so pass@k = 1 once n − c < k). It is unbiased: if each of the n
samples passes independently with probability p, then c ~ Binomial(n, p) and
E_c[pass@k(n, c, k)] = 1 − (1 − p)^k, the probability that k fresh samples contain a pass
(`expected_pass_at_k` computes the left side exactly). The plug-in estimate
1 − (1 − c/n)^k is biased low for k ≥ 2 (Jensen: (1 − x)^k is convex).

Two identities the contract relies on: C(n − c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i) (the
product falsify eval computes: adding the factor at i = n − c is the step
C(m − 1, k)/C(m, k) = (m − k)/m with m = n − c), and the ratio is symmetric in c and k
(both sides are (n − c)!(n − k)! / (n!(n − c − k)!)), so swapping c and k changes nothing
inside 1 ≤ c, k: only the domain edges (c = 0 is valid, k = 0 is not) tell them apart.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction


def check_args(n, c, k) -> tuple[int, int, int]:
    """Integers (bool refused: True is no sample count) with 0 ≤ c ≤ n and 1 ≤ k ≤ n."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"pass_at_k: {name} must be an integer, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n")
    return n, c, k


def pass_at_k_exact(n, c, k) -> Fraction:
    """1 − C(n − c, k)/C(n, k) as an exact fraction (math.comb is 0 for n − c < k)."""
    n, c, k = check_args(n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_at_k(n, c, k) -> float:
    """The exact value rounded once to the nearest float64 (≤ ½ ulp ≤ 2⁻⁵³ from the truth)."""
    return float(pass_at_k_exact(n, c, k))


def expected_pass_at_k(n: int, k: int, p: Fraction, estimate=pass_at_k_exact) -> Fraction:
    """E_c[estimate(n, c, k)] for c ~ Binomial(n, p), exactly (estimate's floats are exact
    rationals): Σ_c C(n, c)·p^c·(1 − p)^(n − c)·estimate(n, c, k)."""
    p = Fraction(p)
    return sum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * Fraction(estimate(n, c, k))
               for c in range(n + 1))


def true_pass_at_k(k: int, p: Fraction) -> Fraction:
    """1 − (1 − p)^k: the probability that k independent samples contain a pass."""
    return 1 - (1 - Fraction(p)) ** k


def product_rounding_bound(n: int, c: int, k: int) -> float:
    """A bound on |fl(1 − Π_{i=n−c+1}^{n} fl(1 − fl(k/i))) − pass@k| in float64 (the
    contract's parity tolerance, derived there; this is its tighter per-(n, c, k) form): with
    u = 2⁻⁵³, fl(k/i) errs by u·k/i, which 1 − k/i = (i − k)/i turns into a relative error
    u·k/(i − k) of the factor; the subtraction and the multiply add u each. The product P has
    relative error ≤ Σ_i (k/(i − k) + 2)·u, i.e. absolute error ≤ Σ_i (P·k/(i − k) + 2P)·u,
    and P ≤ (i − k)/i for every one of its factors, so P·k/(i − k) ≤ k/i: absolute error
    ≤ Σ_i (k/i + 2)·u; 1 − P adds u. Doubled for the higher-order terms (e^x − 1 ≤ 2x for
    x ≤ 1) and the reference's own ½ ulp: (Σ_i (k/i + 2) + 1)·eps64."""
    n, c, k = check_args(n, c, k)
    if n - c < k:
        return 0.0
    return (sum(k / i + 2 for i in range(n - c + 1, n + 1)) + 1) * 2.0**-52
