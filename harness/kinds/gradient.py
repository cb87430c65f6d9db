"""gradient: backward passes against the float64 reference backward.

- reference backend: the reference backward (the contract's `backward` equation) is checked
  against central finite differences of the reference forward, in float64, on up to
  FD_COORDS coordinates per argument, with L(x) = Σ f(x)·dy for a random non-uniform dy.
  The tolerance is derived per coordinate, not a fixed ratio (contracts/FORMAT.md,
  "Finite differences", has the derivation):
    step        h = eps64^(1/3)·max(1, |x_i|), and the step actually taken divides;
    truncation  D(h) − L' = h²·L'''/6 + O(h^4), estimated (Richardson) as |D(2h) − D(h)|/3;
    rounding    each L is evaluated with error ≤ ρ = (⌈log2 N⌉ + 1 + FWD_ULPS)·u·Σ m_j·|dy_j|
                (u = eps64/2, m_j = max(|f_j|, max|input|, 1): outputs formed by cancellation
                carry their intermediates' rounding), so D(h) carries ≤ ρ/h, D(2h) ≤ ρ/(2h);
    backward    the reference gradient's own rounding, ≤ (⌈log2 N⌉ + FWD_ULPS)·u·max|g|;
    check       |D(h) − g_i| ≤ 2·truncation + 3·ρ/h + backward.
  A wrong formula errs by O(|g|), orders of magnitude above every term for smooth functions;
  near a kink (relu, max) D(h) and D(2h) disagree and the check widens there, honestly.
  An output that is not finite at x (a mean over no counted token is NaN by definition) has
  no derivative: it is left out of L, so the reference backward must pass it no gradient
  (torch's rule too). A non-finite D(h), D(2h) or tolerance after that is a harness error
  (`FiniteDifferenceError`), never a pass or a failure of the implementation.
- torch/triton backends: autograd through the bound forward (which may be our own
  torch.autograd.Function) with the same dy, compared with the reference backward under the
  check's per-dtype tolerance. A `wrt` argument that receives no gradient fails the check.
"""

import math

import numpy as np

from falsify.harness import backends, cases
from falsify.harness.kinds.parity import compare, judge_for, tolerance_terms
from falsify.harness.runtime import CheckFailed

FD_COORDS = 24
EPS64 = float(np.finfo(np.float64).eps)
# h = eps^(1/3) minimises h²·|L'''|/6 + eps·|L|/h when L and its derivatives share a scale
H0 = EPS64 ** (1.0 / 3.0)
# Rounding budget, in units of u = eps64/2, of one float64 evaluation of the reference forward
# (or backward) per output element: a few dozen correctly rounded operations on the path to
# each output. The reduction L = Σ f·dy adds its own ⌈log2 N⌉ + 1 (pairwise summation).
FWD_ULPS = 64


class FiniteDifferenceError(RuntimeError):
    """The finite-difference estimate or its tolerance is not a finite number: the check
    cannot judge the backward at this point (not an AssertionError: an error, not a failure)."""


def _upstream(shape, seed, dtype):
    """A non-uniform upstream gradient, rounded to the case dtype so that the reference and
    the optimized backends differentiate against exactly the same dy."""
    rng = np.random.default_rng(seed)
    return cases.round_to(rng.standard_normal(shape), dtype).astype(np.float64)


def _ref_backward(ctx, case, dy):
    bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
    grads = backends.call(bwd, **ctx.ref_args(case), dy=dy)
    if not isinstance(grads, dict):
        raise CheckFailed("reference backward must return {arg: gradient}")
    missing = [w for w in ctx.spec["wrt"] if w not in grads]
    if missing:
        raise CheckFailed(f"reference backward returned no gradient for {missing}")
    return {k: np.asarray(v, np.float64) for k, v in grads.items()}


def central_difference(fwd, args: dict, w: str, idx: tuple, h: float, dy, keep=None) -> float:
    """(L(x + h·e_i) − L(x − h·e_i)) / (actual step): x ± h is rounded, and dividing by the
    step actually taken removes the eps·|x_i|/h error of dividing by 2h. `keep` masks the
    outputs in L (those finite at x)."""
    x0 = float(args[w][idx])
    hi, lo = x0 + h, x0 - h
    vals = []
    for xs in (hi, lo):
        a = dict(args)
        a[w] = args[w].copy()
        a[w][idx] = xs
        y_h = backends.outputs(backends.call(fwd, **a))[0]
        prod = np.asarray(y_h * dy)
        prod = prod if keep is None else prod[keep]
        vals.append(float(prod.sum()))
    return (vals[0] - vals[1]) / (hi - lo)


def fd_tolerance(d1: float, d2: float, h: float, rho: float, g_round: float) -> float:
    """Bound on |D(h) − L'| from D(h), D(2h), the step h and the evaluation rounding ρ.
    |D(2h) − D(h)|/3 estimates D(h)'s truncation error but also carries up to 1.5·ρ/h/3 of
    rounding noise that may cancel it; the factors 2 and 3 cover that and the O(h^4) rest."""
    return 2.0 * abs(d2 - d1) / 3.0 + 3.0 * rho / h + g_round


def _check_fd(ctx, case, args64, y0, dy, ref_grads) -> None:
    ref_fwd = ctx.fn(backend="reference")
    rng = np.random.default_rng(case.seed ^ 0x5EED)
    u = EPS64 / 2
    finite = np.isfinite(y0)
    levels = math.ceil(math.log2(max(int(y0.size), 1)))
    # An output computed by cancellation (KL ≈ 0, logsumexp − z_y, x − max x) carries the
    # rounding of its intermediates, not of its own value: those are of the inputs' magnitude,
    # or of unit scale (probabilities, log V) — all-zero logits give KL = 0 from O(1) terms.
    # Each output's scale is max(|f_j|, max |input|, 1), the unit scale the step h assumes too.
    xscale = max((float(np.abs(v).max()) for v in args64.values()
                  if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size), default=0.0)
    xscale = max(xscale, 1.0)
    mag = np.maximum(np.abs(y0[finite]), xscale)
    rho = (levels + 1 + FWD_ULPS) * u * float((mag * np.abs(dy[finite])).sum())
    for w in ctx.spec["wrt"]:
        x = args64[w]
        flat_idx = rng.choice(x.size, size=min(FD_COORDS, x.size), replace=False)
        g = ref_grads[w].reshape(-1)
        g_round = (levels + FWD_ULPS) * u * (float(np.abs(g).max()) if g.size else 0.0)
        for fi in flat_idx:
            idx = np.unravel_index(fi, x.shape)
            h = H0 * max(1.0, abs(float(x[idx])))
            d1 = central_difference(ref_fwd, args64, w, idx, h, dy, finite)
            d2 = central_difference(ref_fwd, args64, w, idx, 2 * h, dy, finite)
            tol = fd_tolerance(d1, d2, h, rho, g_round)
            if not all(map(math.isfinite, (d1, d2, tol))):
                raise FiniteDifferenceError(
                    f"d/d{w}{tuple(int(i) for i in idx)}: finite differences are not finite "
                    f"(D(h) = {d1!r}, D(2h) = {d2!r}, tolerance {tol!r}, step {h:.3g}): the "
                    "forward leaves the finite range within one step of x; no judgement")
            if not abs(d1 - g[fi]) <= tol:
                raise CheckFailed(
                    f"d/d{w}{tuple(int(i) for i in idx)}: reference backward {g[fi]!r} vs "
                    f"central difference {d1!r} (step {h:.3g}; tolerance {tol:.3g} = "
                    f"2·truncation {abs(d2 - d1) / 3:.3g} + 3·rounding {rho / h:.3g} + "
                    f"backward rounding {g_round:.3g})")


def run(ctx, case):
    ref_fwd = ctx.fn(backend="reference")
    args64 = ctx.ref_args(case)
    y0 = backends.outputs(backends.call(ref_fwd, **args64))[0]
    dy = _upstream(y0.shape, case.seed, case.dtype if case.dtype in cases.FLOAT_DTYPES
                   else "float64")
    ref_grads = _ref_backward(ctx, case, dy)
    if ctx.backend == "reference":
        _check_fd(ctx, case, args64, y0, dy, ref_grads)
        return
    import torch

    wrt = tuple(ctx.spec["wrt"])
    targs = ctx.args(case, requires_grad=wrt)
    out = backends.call(ctx.fn(), **targs)
    y = out[0] if isinstance(out, (tuple, list)) else out
    dy_t = torch.from_numpy(dy).to(device=y.device,
                                   dtype=y.dtype if y.is_floating_point() else torch.float32)
    leaves = [targs[w] for w in wrt]
    grads = backends.call(torch.autograd.grad, y, leaves, grad_outputs=dy_t,
                          allow_unused=True)
    for w, g in zip(wrt, grads):
        if g is None:
            raise CheckFailed(f"no gradient reached {w!r}")
        ref = ref_grads[w]
        finite = ref[np.isfinite(ref)]
        atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
        judge = judge_for(bwd, dict(ctx.ref_args(case), dy=dy),
                          lambda outs, idx, w=w: outs[w][idx], case.dtype)
        compare(backends.to_numpy(g), ref, atol, rtol, f"d/d{w}", judge,
                tolerance_terms(ctx, case, atol, rtol))
