"""pass@k mutants: estimator bugs the pass-at-k contract's checks must catch. Each has the
signature of falsify.llm.evaluate:pass_at_k."""

from __future__ import annotations

from falsify.llm.evaluate import pass_at_k as _pass_at_k
from falsify.reference.pass_at_k import check_args


def biased_plug_in(n, c, k):
    """1 − (1 − c/n)^k: the plug-in estimate, as if the k draws were with replacement. Exact
    for k = 1 and at c ∈ {0, n}, biased low for k ≥ 2 (Jensen)."""
    n, c, k = check_args(n, c, k)
    return 1.0 - (1.0 - c / n) ** k


def product_off_by_one(n, c, k):
    """The product over i = n − c + 1 … n − 1 (range's stop taken as inclusive): one factor,
    1 − k/n, is missing."""
    n, c, k = check_args(n, c, k)
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n):
        prod *= 1.0 - k / i
    return 1.0 - prod


def c_and_k_swapped(n, c, k):
    """pass_at_k(n, k, c): the counts passed in the wrong order. Since C(n − c, k)/C(n, k) is
    symmetric in c and k this returns the right value whenever both are ≥ 1; it refuses the
    valid c = 0 and accepts the invalid k = 0."""
    return _pass_at_k(n, k, c)
