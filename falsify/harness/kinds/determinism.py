"""determinism: the backend run repeatedly on identical inputs returns bit-identical outputs.

Bit-identical means the same bits, NaN for NaN and −0.0 for −0.0, not "close". A kernel that
is nondeterministic by design (atomics whose order depends on scheduling) declares it: the
check's `tolerance` (with its `why`) is then the run-to-run bound it enforces, measured
against the first run's outputs. Each run gets freshly built input tensors, so a kernel that
writes into its inputs is seen as nondeterministic too."""

import numpy as np

from falsify.harness import backends
from falsify.harness.runtime import CheckFailed

RUNS = 3  # a schedule-dependent order shows in one pair of runs out of a few, not every pair


def identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and the same bits (outputs arrive as float64, an exact widening)."""
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True)) and bool(
        np.array_equal(np.signbit(a), np.signbit(b)))


def compare(ctx, case, first: list, other: list, what: str) -> float:
    """Bit-identity (no tolerance declared) or the declared bound; returns the max |diff|."""
    idx = ctx.output_indices(range(len(first)))
    worst = 0.0
    for i in idx:
        a, b = first[i], other[i]
        if a.shape != b.shape:
            raise CheckFailed(f"output {i}: shape {b.shape} {what}, {a.shape} before")
        with np.errstate(all="ignore"):
            d = np.abs(a - b)
        d = np.where(np.isnan(a) & np.isnan(b), 0.0, d)
        worst = max(worst, float(np.nanmax(d, initial=0.0)) if d.size else 0.0)
        if "tolerance" not in ctx.spec:
            if not identical(a, b):
                diff = np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b))) |
                                   (np.signbit(a) != np.signbit(b)))
                at = tuple(int(v) for v in diff[0])
                raise CheckFailed(
                    f"output {i}: not bit-identical {what}: {len(diff)} element(s) differ, "
                    f"first at {at}: {a[at]!r} then {b[at]!r} (max |diff| {worst:.3g}); a "
                    f"kernel that does not hold this by design declares a `tolerance` with "
                    f"its why")
        else:
            finite = a[np.isfinite(a)]
            atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
            bad = ~(d <= atol + rtol * np.abs(a)) & ~(np.isnan(a) & np.isnan(b))
            if bad.any():
                at = tuple(int(v) for v in np.argwhere(bad)[0])
                raise CheckFailed(
                    f"output {i}: run-to-run difference {d[at]:.3g} at {at} {what} exceeds "
                    f"the declared bound atol={atol:.3g}, rtol={rtol:.3g}")
    return worst


def run(ctx, case):
    fn = ctx.fn()
    first = backends.outputs(backends.call(fn, **ctx.args(case)))
    worst = 0.0
    for k in range(1, RUNS):
        again = backends.outputs(backends.call(fn, **ctx.args(case)))
        worst = max(worst, compare(ctx, case, first, again, f"on run {k + 1} of {RUNS}"))
    return {"deterministic": "tolerance" not in ctx.spec, "max_run_to_run_diff": worst}
