"""gradgrad: the double backward of an optimized backend against finite differences of the
float64 reference backward.

The torch side: L = Σ_k Σ f_k(x)·dy_k as in the gradient kind (same upstream gradients dy_k,
drawn and rounded to the case dtype in the same way), then the first-order gradients
g_w = ∂L/∂w with `create_graph=True`, then S = Σ_w ⟨g_w, v_w⟩ for a random direction v_w per
`wrt` argument (rounded to the case dtype; the sum is taken in float64 so it adds no rounding
of its own), and finally ∂S/∂w for every `wrt` argument and ∂S/∂dy_k for every selected
output's upstream gradient. ∂S/∂w is the Hessian of L applied to v; ∂S/∂dy_k = J_k·v is the
forward's directional derivative, so both halves of the backward's own derivative are
exercised: its dependence on the inputs and its (linear) dependence on dy.

The oracle: S as a function of (x, dy) is the contract's reference backward (numpy, float64)
contracted with v, and its partial derivatives are estimated by central differences on up to
GG_COORDS coordinates of each differentiated variable, with exactly the step, truncation and
rounding bound of the gradient kind (falsify/contracts/FORMAT.md, "Finite differences") applied to
the reference backward as the function differentiated:
    step        h = eps64^(1/3)·max(1, |x_i|); the step actually taken divides;
    truncation  |D(2h) − D(h)|/3 (Richardson);
    rounding    S evaluated with error ≤ ρ = Σ_w (⌈log2 N_w⌉ + W + FWD_ULPS)·u·Σ_j m_wj·|v_wj|,
                m_wj = max(|g_wj|, max|input|, 1), the inputs now including every dy_k: a
                backward's intermediates are products of dy with the forward's local
                derivatives, of the inputs' or unit scale, even where g_wj cancels to ~0;
    bound       |D(h) − ∂S/∂z| ≤ 2·truncation + 3·ρ/h.
There is no reference-value rounding term: the finite difference *is* the reference here.
The torch result must lie within that bound plus the check's own per-dtype tolerance
(`atol + rtol·|D(h)|`, `ref_max` = max |D(h)| over the sampled coordinates of that variable),
which covers the torch side's rounding in the case dtype.

A backend that does not support double backward must say so: with
`expect: {error: <regular expression>}` the check passes only when the double backward raises
an exception whose message matches the pattern. Returning numbers is then a failure, and so
is a first-order gradient with no autograd graph under create_graph=True (a backward that
silently detaches: every second derivative would be zero), in either mode.
"""

from __future__ import annotations

import math
import re

import numpy as np

from falsify.harness import backends, cases
from falsify.harness.kinds.gradient import (
    EPS64,
    FWD_ULPS,
    H0,
    FiniteDifferenceError,
    _backward_kwargs,
    _upstreams,
    central_difference,
    fd_tolerance,
)
from falsify.harness.kinds.parity import tolerance_terms
from falsify.harness.runtime import CheckFailed

GG_COORDS = 6  # per differentiated variable: a wrong second-order term errs by O(|H·v|)
DIRECTION_SEED = 0x6767


class ExpectedError(Exception):
    """What `expect: error` waits for, carried out of the autograd calls."""


def _directions(shapes: dict, case) -> dict[str, np.ndarray]:
    """One random direction per `wrt` argument, rounded to the case dtype (both sides use
    exactly these values)."""
    dtype = case.dtype if case.dtype in cases.FLOAT_DTYPES else "float64"
    out = {}
    for i, (w, shape) in enumerate(shapes.items()):
        rng = np.random.default_rng([case.seed, DIRECTION_SEED, i])
        out[w] = cases.round_to(rng.standard_normal(shape), dtype).astype(np.float64)
    return out


def expect_error(ctx) -> re.Pattern | None:
    """The `match` pattern when the check expects the backend to refuse, else None."""
    want = (ctx.spec.get("expect") or {}).get("error")
    return re.compile(want) if want else None


def confirm_error(ctx, pattern: re.Pattern, attempt, what: str) -> dict:
    """Run `attempt()`; pass when it raises an exception matching `pattern`, fail otherwise."""
    try:
        attempt()
    except CheckFailed:
        raise
    except Exception as e:  # noqa: BLE001 - the refusal is the result under test
        msg = f"{type(e).__name__}: {e}"
        if not pattern.search(msg):
            raise CheckFailed(f"{what} raised, but not the declared error: {msg[:400]!r} does "
                              f"not match {pattern.pattern!r}") from e
        return {"refused": msg.splitlines()[0][:300]}
    raise CheckFailed(f"{what} returned values, but the contract declares that {ctx.backend} "
                      f"refuses it (expect: {{error: {pattern.pattern!r}}}): check the "
                      "values (drop `expect`) or make the backend raise")


def _double_backward(ctx, case, dys: dict, vs: dict, selected: list[int]):
    """(∂S/∂w per wrt, ∂S/∂dy_k per selected output), float64 numpy, computed by autograd."""
    import torch

    wrt = tuple(ctx.spec["wrt"])
    targs = ctx.args(case, requires_grad=wrt)
    out = ctx.fn()(**targs)
    got = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(got) <= max(selected):
        raise CheckFailed(f"backend returned {len(got)} output(s); the check differentiates "
                          f"output {max(selected)}")
    ys, dy_ts = [], []
    for k in selected:
        y = got[k]
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            raise CheckFailed(f"output {k} has no autograd graph, but the check "
                              "differentiates it")
        ys.append(y)
        dy_ts.append(torch.from_numpy(dys[k]).to(device=y.device, dtype=y.dtype)
                     .requires_grad_(True))
    leaves = [targs[w] for w in wrt]
    grads = torch.autograd.grad(ys, leaves, grad_outputs=dy_ts, create_graph=True,
                                allow_unused=True)
    s = None
    for w, g in zip(wrt, grads):
        if g is None:
            raise CheckFailed(f"no gradient reached {w!r}")
        v = torch.from_numpy(vs[w]).to(device=g.device, dtype=torch.float64)
        term = (g.to(torch.float64) * v).sum()
        s = term if s is None else s + term
    if not s.requires_grad:
        raise CheckFailed("the first-order gradients carry no autograd graph under "
                          "create_graph=True: every second derivative would silently be zero "
                          "(a backward that detaches its result must be once_differentiable)")
    second = torch.autograd.grad(s, leaves + dy_ts, allow_unused=True)
    names = list(wrt) + [f"dy[{k}]" for k in selected]
    res = {}
    for name, d, like in zip(names, second, leaves + dy_ts):
        # unused: S does not depend on it, the derivative is zero (the oracle decides whether
        # that is right)
        res[name] = np.zeros(tuple(like.shape)) if d is None else backends.to_numpy(d)
    return res


def _rho(bwd_out: dict, vs: dict, scale: float) -> float:
    """Rounding bound of one float64 evaluation of S = Σ_w ⟨g_w, v_w⟩ (see the module doc)."""
    u = EPS64 / 2
    n_w = len(vs)
    rho = 0.0
    for w, v in vs.items():
        g = bwd_out[w]
        level = math.ceil(math.log2(max(int(g.size), 1)))
        mag = np.maximum(np.abs(g), scale)
        rho += (level + n_w + FWD_ULPS) * u * float((mag * np.abs(v)).sum())
    return rho


def run(ctx, case):
    if ctx.backend == "reference":
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: gradgrad compares an "
                         "optimized backend with finite differences of the reference "
                         "backward; the reference backend is the oracle, not a subject")
    ref_fwd = ctx.fn(backend="reference")
    args64 = ctx.ref_args(case)
    outs = backends.outputs(backends.call(ref_fwd, **args64))
    selected = ctx.output_indices([0])
    # an output element that is not finite at x (a mean over no counted token is NaN by
    # definition) has no derivative: its upstream gradient is zero and its dy coordinates are
    # not compared, as the gradient kind leaves it out of L
    defined = {k: np.isfinite(outs[k]) for k in selected}
    dys = {k: np.where(defined[k], dy, 0.0)
           for k, dy in _upstreams(outs, selected, case).items()}
    upstream = _backward_kwargs(ctx, outs, dys)
    wrt = list(ctx.spec["wrt"])
    vs = _directions({w: np.shape(args64[w]) for w in wrt}, case)

    pattern = expect_error(ctx)
    if pattern is not None:
        return confirm_error(ctx, pattern, lambda: _double_backward(ctx, case, dys, vs,
                                                                    selected),
                             f"the double backward on {ctx.backend}")
    try:
        got = _double_backward(ctx, case, dys, vs, selected)
    except CheckFailed:
        raise
    except Exception as e:
        raise backends.ImplementationRaised(
            f"double backward on {ctx.backend} raised {type(e).__name__}: {e}") from e

    bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
    eq = ctx.contract.equations.get(ctx.equation)
    bargs = dict(args64, **upstream)

    def contracted(**a):
        g = backends.call(bwd, **a)
        if not isinstance(g, dict) or any(w not in g for w in wrt):
            raise CheckFailed(f"reference backward must return {{arg: gradient}} with {wrt}")
        return tuple(np.asarray(g[w], np.float64) for w in wrt)

    at_x = dict(zip(wrt, contracted(**bargs)))
    scale = max([1.0] + [float(np.abs(a).max()) for a in bargs.values()
                         if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size])
    rho = _rho(at_x, vs, scale)
    v_idx = {i: vs[w] for i, w in enumerate(wrt)}
    rng = np.random.default_rng([case.seed, DIRECTION_SEED, 0x5EED])
    from falsify.harness.plan import upstream_name

    variables = ([(w, w, None) for w in wrt]
                 + [(f"dy[{k}]", upstream_name(eq, k), defined[k]) for k in selected])
    worst = 0.0
    for label, arg, keep in variables:
        x = bargs[arg]
        pool = np.arange(x.size) if keep is None else np.flatnonzero(keep)
        coords = rng.choice(pool, size=min(GG_COORDS, pool.size), replace=False)
        fd, tols = _central_differences(contracted, bargs, arg, label, coords, v_idx, rho)
        worst = max(worst, _compare(ctx, case, label, x, got[label], fd, tols, rho))
    return {"second_order": "values", "worst_ratio_to_bound": round(worst, 4)}


def _central_differences(contracted, bargs: dict, arg: str, label: str, coords, v_idx: dict,
                         rho: float) -> tuple[list, list]:
    """([(index, D(h), D(2h))], [finite-difference bound]) of ∂S/∂arg at each sampled flat
    coordinate, differencing the reference backward contracted with the directions."""
    x = bargs[arg]
    fd, tols = [], []
    for fi in coords:
        idx = np.unravel_index(fi, x.shape)
        h = H0 * max(1.0, abs(float(x[idx])))
        d1 = central_difference(contracted, bargs, arg, idx, h, v_idx)
        d2 = central_difference(contracted, bargs, arg, idx, 2 * h, v_idx)
        t = fd_tolerance(d1, d2, h, rho, 0.0)
        if not all(map(math.isfinite, (d1, d2, t))):
            raise FiniteDifferenceError(
                f"∂S/∂{label}{tuple(int(i) for i in idx)}: finite differences of the "
                f"reference backward are not finite (D(h) = {d1!r}, D(2h) = {d2!r}, "
                f"tolerance {t!r}): no judgement")
        fd.append((idx, d1, d2))
        tols.append(t)
    return fd, tols


def _compare(ctx, case, label: str, x, g, fd: list, tols: list, rho: float) -> float:
    """Fail unless the backend's double backward `g` is within bound of every central
    difference; returns the worst |diff| / bound ratio."""
    ref_max = max(abs(d1) for _, d1, _ in fd) if fd else 0.0
    atol, rtol = ctx.tol(case, ref_max)
    worst = 0.0
    for (idx, d1, d2), t in zip(fd, tols):
        err = abs(float(g[idx]) - d1)
        worst = max(worst, err / (t + atol + rtol * abs(d1)) if err else 0.0)
        if not err <= t + atol + rtol * abs(d1):
            raise CheckFailed(
                f"∂S/∂{label}{tuple(int(i) for i in idx)} (S = Σ_w ⟨∂L/∂w, v_w⟩): "
                f"{ctx.backend} double backward {float(g[idx])!r} vs central difference "
                f"of the reference backward {d1!r} (|diff| {err:.3g} > {t:.3g} finite-"
                f"difference bound [2·truncation {abs(d2 - d1) / 3:.3g} + 3·rounding "
                f"{rho / (H0 * max(1.0, abs(float(x[idx])))):.3g}] + {atol:.3g} + "
                f"{rtol:.3g}·|ref|; {tolerance_terms(ctx, case, atol, rtol)})")
    return worst
