"""gradient: backward passes against the float64 reference backward.

- reference backend: the reference backward (the contract's `backward` equation) is checked
  against central finite differences of the reference forward, in float64, on up to
  FD_COORDS coordinates per argument. L(x) = Σ f(x)·dy with a random non-uniform dy.
  Step h = 1e-6·max(1, |x_i|): truncation error O(h²·f''') ≈ 1e-12 and rounding error
  O(eps64·|L|/h) ≈ 2e-10·|L|, so 1e-6·(1 + max|g|) leaves four orders of margin while a wrong
  formula (an O(1) error) cannot pass.
- torch/triton backends: autograd through the bound forward (which may be our own
  torch.autograd.Function) with the same dy, compared with the reference backward under the
  check's per-dtype tolerance. A `wrt` argument that receives no gradient fails the check.
"""

import numpy as np

from falsify.harness import backends, cases
from falsify.harness.kinds.parity import compare
from falsify.harness.runtime import CheckFailed

FD_COORDS = 24
FD_RTOL = 1e-6


def _upstream(shape, seed, dtype):
    """A non-uniform upstream gradient, rounded to the case dtype so that the reference and
    the optimized backends differentiate against exactly the same dy."""
    rng = np.random.default_rng(seed)
    return cases.round_to(rng.standard_normal(shape), dtype).astype(np.float64)


def _ref_backward(ctx, case, dy):
    bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
    grads = backends.call(bwd, **backends.reference_args(case), **ctx.call_kwargs(case), dy=dy)
    if not isinstance(grads, dict):
        raise CheckFailed("reference backward must return {arg: gradient}")
    missing = [w for w in ctx.spec["wrt"] if w not in grads]
    if missing:
        raise CheckFailed(f"reference backward returned no gradient for {missing}")
    return {k: np.asarray(v, np.float64) for k, v in grads.items()}


def run(ctx, case):
    ref_fwd = ctx.fn(backend="reference")
    args64 = backends.reference_args(case)
    kw = ctx.call_kwargs(case)
    y0 = backends.outputs(backends.call(ref_fwd, **args64, **kw))[0]
    dy = _upstream(y0.shape, case.seed, case.dtype if case.dtype in cases.FLOAT_DTYPES
                   else "float64")
    ref_grads = _ref_backward(ctx, case, dy)
    if ctx.backend == "reference":
        rng = np.random.default_rng(case.seed ^ 0x5EED)
        for w in ctx.spec["wrt"]:
            x = args64[w]
            flat_idx = rng.choice(x.size, size=min(FD_COORDS, x.size), replace=False)
            g = ref_grads[w].reshape(-1)
            scale = 1.0 + float(np.abs(g).max()) if g.size else 1.0
            for fi in flat_idx:
                idx = np.unravel_index(fi, x.shape)
                h = 1e-6 * max(1.0, abs(float(x[idx])))
                vals = []
                for sgn in (1.0, -1.0):
                    a = dict(args64)
                    a[w] = x.copy()
                    a[w][idx] += sgn * h
                    y_h = backends.outputs(backends.call(ref_fwd, **a, **kw))[0]
                    vals.append(float((y_h * dy).sum()))
                fd = (vals[0] - vals[1]) / (2 * h)
                if abs(fd - g[fi]) > FD_RTOL * scale:
                    raise CheckFailed(
                        f"d/d{w}{tuple(int(i) for i in idx)}: reference backward {g[fi]!r} vs "
                        f"central difference {fd!r} (tolerance {FD_RTOL * scale:.3g})")
        return
    import torch

    wrt = tuple(ctx.spec["wrt"])
    targs = ctx.args(case, requires_grad=wrt)
    out = backends.call(ctx.fn(), **targs)
    y = out[0] if isinstance(out, (tuple, list)) else out
    dy_t = torch.from_numpy(dy).to(y.dtype if y.is_floating_point() else torch.float32)
    leaves = [targs[w] for w in wrt]
    grads = backends.call(torch.autograd.grad, y, leaves, grad_outputs=dy_t,
                          allow_unused=True)
    for w, g in zip(wrt, grads):
        if g is None:
            raise CheckFailed(f"no gradient reached {w!r}")
        ref = ref_grads[w]
        finite = ref[np.isfinite(ref)]
        atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        compare(backends.to_numpy(g), ref, atol, rtol, f"d/d{w}")
