"""pass-at-k contract: the runs behind the exhaustive checks (monotonicity, unbiasedness,
refusals). Each looks the estimator up through the contract's binding, so `falsify mutants`
and `--bind` reach it; the exact values that judge it come from falsify.reference.pass_at_k."""

from __future__ import annotations

from fractions import Fraction

from falsify.harness import backends, runtime
from falsify.reference import pass_at_k as R

CONTRACT = "pass-at-k-kernel-v1"


def _fn(backend):
    return backends.function(runtime.contract(CONTRACT), "pass_at_k", backend)


def monotone(backend, dtype, ns):
    """Every (c, k) of each n in `ns`: pass@k must not decrease when k or c grows. The float
    product is monotone exactly, not only within rounding: each factor fl(1 − fl(k/i)) is a
    composition of monotone roundings, and one more factor f ≤ 1 at the front of the same
    sequence of multiplications keeps every partial product ≤ the old one (rounding is
    monotone), so the check demands zero violations."""
    fn = _fn(backend)
    pairs = bad_k = bad_c = 0
    first = None
    for n in ns:
        t = [[fn(n, c, k) for k in range(1, n + 1)] for c in range(n + 1)]
        for c in range(n + 1):
            for k in range(1, n + 1):
                pairs += 1
                if k < n and t[c][k] < t[c][k - 1]:
                    bad_k += 1
                    first = first or f"n={n} c={c}: pass@{k + 1} < pass@{k}"
                if c < n and t[c + 1][k - 1] < t[c][k - 1]:
                    bad_c += 1
                    first = first or f"n={n} k={k}: c={c + 1} gives less than c={c}"
    return {"pairs": pairs, "violations_k": bad_k, "violations_c": bad_c,
            "first": first or ""}


def unbiased(backend, dtype, ns, ks, ps):
    """For c ~ Binomial(n, p): E_c[pass_at_k(n, c, k)] computed exactly over the n + 1 values
    of c (the estimator's floats are exact rationals) against 1 − (1 − p)^k. The expectation
    is a convex combination (the binomial weights sum to 1), so its error is at most the
    largest per-c error, which FALSIFY-PAK-001's bound covers: the returned `excess` is the
    largest |E − truth| minus that bound (≤ 0 passes). The plug-in estimate
    1 − (1 − c/n)^k misses by ~k(k − 1)p(1 − p)^(k−1)/(2n), far above it."""
    fn = _fn(backend)
    worst_err, worst_excess, cases = 0.0, -1.0, 0
    for n in ns:
        for k in ks:
            if k > n:
                continue
            bound = max(R.product_rounding_bound(n, c, k) for c in range(n + 1))
            for p in ps:
                p = Fraction(p)
                err = abs(float(R.expected_pass_at_k(n, k, p, lambda n_, c_, k_: fn(n_, c_, k_))
                                - R.true_pass_at_k(k, p)))
                worst_err = max(worst_err, err)
                worst_excess = max(worst_excess, err - bound)
                cases += 1
    return {"cases": cases, "max_err": worst_err, "excess": worst_excess}


# (arguments, the argument the error must name): each is outside 0 ≤ c ≤ n, 1 ≤ k ≤ n or
# not an integer
BAD = [
    ((5, 6, 1), "c="), ((5, 2, 6), "k="), ((5, -1, 1), "c="), ((5, 2, 0), "k="),
    ((5, 2, -1), "k="), ((-1, 0, 1), "n="), ((0, 0, 1), "k="), ((5.0, 2, 1), "n"),
    ((5, 2.0, 1), "c"), ((5, 2, 1.5), "k"), ((True, 1, 1), "n"), ((5, "2", 1), "c"),
]


def refusals(backend, dtype):
    """Bad arguments must raise ValueError/TypeError naming the offending argument, and never
    return a number; valid edge calls (c = 0, c = n, k = n) must not raise."""
    fn = _fn(backend)
    refused, returned, unnamed = 0, [], []
    for args, name in BAD:
        try:
            fn(*args)
            returned.append(repr(args))
        except (ValueError, TypeError) as e:
            refused += 1
            if name not in str(e):
                unnamed.append(f"{args}: {e}")
    valid_ok = True
    for args in ((5, 0, 1), (5, 5, 5), (1, 0, 1), (1, 1, 1), (200, 0, 200)):
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - any exception on a valid call is the finding
            valid_ok = False
    return {"tried": len(BAD), "refused": refused, "returned": returned, "unnamed": unnamed,
            "valid_ok": valid_ok}
