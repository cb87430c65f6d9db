"""pass@k edge cases the contract (pass-at-k-kernel-v1) does not express: the reference's exact
identities in rationals, counts where the binomials overflow a float64, numpy integer counts,
and that falsify eval averages exactly this per-problem estimator."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from falsify.llm import evaluate as EV
from falsify.reference import pass_at_k as R


@pytest.mark.parametrize("n", [1, 2, 7, 30])
def test_reference_is_exactly_unbiased_and_symmetric(n):
    """E_c[pass@k] = 1 − (1 − p)^k with no rounding at all, and C(n − c, k)/C(n, k) is
    symmetric in c and k (why MUT-PAK-004/005 are killed only at the domain edges)."""
    for k in range(1, n + 1):
        for p in (Fraction(1, 7), Fraction(1, 2), Fraction(5, 6)):
            assert R.expected_pass_at_k(n, k, p) == R.true_pass_at_k(k, p)
        for c in range(1, n + 1):
            assert R.pass_at_k_exact(n, c, k) == R.pass_at_k_exact(n, k, c)


def test_plug_in_estimate_is_biased_in_exact_arithmetic():
    plug_in = lambda n, c, k: 1 - (1 - Fraction(c, n)) ** k  # noqa: E731
    p = Fraction(1, 3)
    assert R.expected_pass_at_k(10, 1, p, plug_in) == R.true_pass_at_k(1, p)  # k = 1: exact
    gap = R.true_pass_at_k(5, p) - R.expected_pass_at_k(10, 5, p, plug_in)
    assert gap > Fraction(1, 100)  # biased low (Jensen), by 0.037 here


@pytest.mark.parametrize("n, c, k", [(5000, 10, 100), (5000, 4900, 99), (2000, 1, 1999),
                                      (1031, 500, 500)])
def test_counts_whose_binomials_overflow_a_float64(n, c, k):
    """C(1031, 515) > 1.8e308: the product form never forms it."""
    assert math.comb(1031, 515) > 2**1024
    got = EV.pass_at_k(n, c, k)
    assert abs(Fraction(got) - R.pass_at_k_exact(n, c, k)) <= R.product_rounding_bound(n, c, k)


def test_numpy_integer_counts_are_counts():
    assert EV.pass_at_k(np.int64(10), np.int32(3), np.int64(1)) == EV.pass_at_k(10, 3, 1)
    with pytest.raises(TypeError, match="c must be an integer"):
        EV.pass_at_k(10, np.float64(3.0), 1)


def test_eval_averages_the_per_problem_estimator():
    counts = [(10, 0), (10, 3), (10, 10), (5, 4)]
    got = EV.pass_at_ks(counts, [1, 5])
    for k in (1, 5):
        want = sum(R.pass_at_k_exact(n, c, k) for n, c in counts) / len(counts)
        # the mean of the per-problem errors, plus one rounding per addition and the division
        tol = (max(R.product_rounding_bound(n, c, k) for n, c in counts)
               + (len(counts) + 1) * 2.0**-52)
        assert abs(Fraction(got[k]) - want) <= tol
