"""jvp: forward-mode AD (`torch.func.jvp`) of an optimized backend against the float64
reference backward.

For tangents t_w (one random array per `wrt` argument, rounded to the case dtype) the backend
returns the directional derivatives J_k·t of its selected outputs (`outputs`, default the
first). With the gradient kind's upstream gradients dy_k (same draw, same rounding) the
identity
    Σ_k ⟨dy_k, J_k·t⟩ = Σ_w ⟨(∂L/∂w), t_w⟩,   L = Σ_k Σ f_k·dy_k,
relates forward mode to the contract's reference backward, which the gradient kind checks
against finite differences of the forward. The check compares the two sides of the identity:

    |Σ_k ⟨dy_k, (J_k t)_torch⟩ − Σ_w ⟨g_w, t_w⟩_ref| ≤ atol + rtol·M + ρ,
    M = Σ_w Σ_i |g_w,i|·|t_w,i|,
    ρ = (⌈log2 N⌉ + W + 2·FWD_ULPS)·u·M + (⌈log2 N_out⌉ + K)·u·Σ_k Σ_j |dy_kj|·|(J_k t)_j|,

where `ref_max` in the tolerance's expressions is M: for the kernels whose forward mode is
claimed here the Jacobian is diagonal per element (elementwise kernels), so M equals
Σ_j |dy_j|·Σ_w |J_wj·t_wj|, the magnitude that each element's rounding scales with; ρ is the
float64 rounding of both dot products and of the reference backward itself (u = eps64/2).

Forward mode must be claimed to be used: a torch.autograd.Function supports it only with a
`jvp` staticmethod and `setup_context`. Where a backend does not claim it,
`expect: {error: <regular expression>}` makes the check confirm the clear error instead, and a
backend that then returns values fails it (a silent claim nobody checked).
"""

from __future__ import annotations

import math

import numpy as np

from falsify.harness import backends
from falsify.harness.kinds.gradgrad import _directions, confirm_error, expect_error
from falsify.harness.kinds.gradient import (
    EPS64,
    FWD_ULPS,
    _backward_kwargs,
    _ref_backward,
    _upstreams,
)
from falsify.harness.kinds.parity import tolerance_terms
from falsify.harness.runtime import CheckFailed


def _forward_mode(ctx, case, ts: dict, selected: list[int]) -> list[np.ndarray]:
    import torch
    from torch.func import jvp

    wrt = tuple(ctx.spec["wrt"])
    targs = ctx.args(case)
    fn = ctx.fn()
    primals = tuple(targs[w] for w in wrt)
    tangents = tuple(torch.from_numpy(ts[w]).to(device=p.device, dtype=p.dtype)
                     for w, p in zip(wrt, primals))

    def f(*p):
        return fn(**dict(targs, **dict(zip(wrt, p))))

    _, tangent_out = jvp(f, primals, tangents)
    outs = list(tangent_out) if isinstance(tangent_out, (tuple, list)) else [tangent_out]
    if len(outs) <= max(selected):
        raise CheckFailed(f"backend returned {len(outs)} tangent output(s); the check "
                          f"differentiates output {max(selected)}")
    return [backends.to_numpy(outs[k]) for k in selected]


def run(ctx, case):
    if ctx.backend == "reference":
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: jvp checks an optimized "
                         "backend's forward mode against the reference backward; the "
                         "reference backend is the oracle, not a subject")
    args64 = ctx.ref_args(case)
    outs = backends.outputs(backends.call(ctx.fn(backend="reference"), **args64))
    selected = ctx.output_indices([0])
    # an output element that is not finite at x (a mean over no counted token is NaN by
    # definition) has no derivative: left out of both sides, as the gradient kind leaves it
    # out of L (its tangent is NaN, its reference gradient contribution zero)
    defined = {k: np.isfinite(outs[k]) for k in selected}
    dys = {k: np.where(defined[k], dy, 0.0)
           for k, dy in _upstreams(outs, selected, case).items()}
    wrt = list(ctx.spec["wrt"])
    ts = _directions({w: np.shape(args64[w]) for w in wrt}, case)

    pattern = expect_error(ctx)
    if pattern is not None:
        return confirm_error(ctx, pattern, lambda: _forward_mode(ctx, case, ts, selected),
                             f"torch.func.jvp on {ctx.backend}")
    try:
        jts = _forward_mode(ctx, case, ts, selected)
    except CheckFailed:
        raise
    except Exception as e:
        raise backends.ImplementationRaised(
            f"torch.func.jvp on {ctx.backend} raised {type(e).__name__}: {e}") from e

    grads = _ref_backward(ctx, case, _backward_kwargs(ctx, outs, dys))
    u = EPS64 / 2
    lhs, lhs_abs, n_out = 0.0, 0.0, 0
    for k, jt in zip(selected, jts):
        if jt.shape != outs[k].shape:
            raise CheckFailed(f"tangent of output {k}: shape {jt.shape} != output "
                              f"{outs[k].shape}")
        jt = np.where(defined[k], jt, 0.0)
        lhs += float((dys[k] * jt).sum())
        lhs_abs += float(np.abs(dys[k] * jt).sum())
        n_out = max(n_out, int(jt.size))
    rhs = sum(float((grads[w] * ts[w]).sum()) for w in wrt)
    m = sum(float((np.abs(grads[w]) * np.abs(ts[w])).sum()) for w in wrt)
    n_in = max(int(ts[w].size) for w in wrt)
    rho = ((math.ceil(math.log2(max(n_in, 1))) + len(wrt) + 2 * FWD_ULPS) * u * m
           + (math.ceil(math.log2(max(n_out, 1))) + len(selected)) * u * lhs_abs)
    atol, rtol = ctx.tol(case, m)
    bound = atol + rtol * m + rho
    if not math.isfinite(lhs) or not abs(lhs - rhs) <= bound:
        raise CheckFailed(
            f"Σ⟨dy, J·t⟩ from torch.func.jvp on {ctx.backend} = {lhs!r}, but the reference "
            f"backward gives Σ⟨∂L/∂w, t⟩ = {rhs!r} (|diff| {abs(lhs - rhs):.3g} > bound "
            f"{bound:.3g} = atol {atol:.3g} + rtol·M {rtol * m:.3g} + float64 rounding "
            f"{rho:.3g}, M = Σ|g|·|t| = {m:.3g}; {tolerance_terms(ctx, case, atol, rtol)})")
    return {"forward_mode": "values", "identity_gap": abs(lhs - rhs), "bound": bound}
