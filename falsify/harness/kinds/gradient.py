"""gradient: backward passes against the float64 reference backward.

- Which outputs: L = Σ_k Σ f_k(x)·dy_k over the outputs the check's `outputs` names (indices,
  or names from the equation's `outputs`; default: the first output only), each with its own
  random non-uniform dy_k rounded to the case dtype (the first output's drawn from the case
  seed, as with a single output; a later output k's from (seed, k)). The reference backward
  receives the forward's arguments plus `dy` = dy_0 (zeros when the first output is not
  selected) and `d<name>` = dy_k for each selected later output (`dlse` for an output named
  `lse`).
- reference backend: the reference backward (the contract's `backward` equation) is checked
  against central finite differences of the reference forward, in float64, along
  FD_DIRECTIONS random directions v per `wrt` argument: D(h) = (L(x + h·v) − L(x − h·v))/2h
  against ⟨g, s⟩/2h, s the step actually taken. A direction costs four forwards whatever the
  argument's size and sees every coordinate, where a coordinate difference costs four per
  coordinate. The tolerance is derived, not a fixed ratio (falsify/contracts/FORMAT.md, "Finite
  differences", has the derivation), with K the number of selected outputs and N_k the size
  of output k:
    step        h = eps64^(1/3), v_i = z_i/max|z|·max(1, |x_i|) (z standard normal): the step
                on coordinate i is at most eps64^(1/3)·max(1, |x_i|);
    truncation  e(h) = D(h) − ⟨g, s⟩/2h = h²·L‴[v, v, v]/6 + O(h^4) for a correct g,
                estimated (Richardson) as |e(2h) − e(h)|/3;
    rounding    each L is evaluated with error ≤ ρ = Σ_k (⌈log2 N_k⌉ + K + FWD_ULPS)·u·
                Σ_j m_kj·|dy_kj| (u = eps64/2, m_kj = max(|f_kj|, max|input|, 1): outputs
                formed by cancellation carry their intermediates' rounding; ⌈log2 N_k⌉ + 1 for
                output k's pairwise sum, K − 1 for adding the K partial sums), so D(h) carries
                ≤ ρ/h, D(2h) ≤ ρ/(2h);
    backward    the reference gradient's own rounding, ≤ (⌈log2 max N_k⌉ + K − 1 + FWD_ULPS)·
                u·max|g| per entry (K − 1 more additions where the upstream gradients meet),
                times Σ|s_i|/2h, plus the dot product's (⌈log2 N⌉ + 1)·u·Σ|g_i·s_i|/2h;
    check       |e(h)| ≤ 2·truncation + 3·ρ/h + backward.
  A failure is then localized: central differences on up to FD_COORDS coordinates name one
  that is off, when one is off by itself. A non-finite reference gradient entry fails.
  With K = 1 these are the single-output terms. A wrong formula errs by O(|g|), orders of
  magnitude above every term for smooth functions. Near a kink (relu, max, a clip) the
  central difference averages the two slopes, and Richardson's widening covers that only
  when the kink is farther than 3h/4 from x; closer, a correct backward (the slope of x's own
  side) would fail. So a central disagreement is then put to the one-sided differences,
  L(x ± k·h·v) − L(x) for k = 1, 2, 4 against ⟨g, ±k·h·v⟩, extrapolated to O(h²) and
  bounded as the central one is (`one_sided_agrees`): the side without the kink agrees with
  the slope of x's side, and the check passes. A wrong formula errs by O(|g|) on both sides
  and still fails; so does a backward that gives the other side's slope.
  An output element that is not finite at x (a mean over no counted token is NaN by
  definition) has no derivative: it is left out of L, so the reference backward must pass it
  no gradient (torch's rule too). A non-finite D(h), D(2h) or tolerance after that is a
  harness error (`FiniteDifferenceError`), never a pass or a failure of the implementation.
- torch/triton backends: autograd through the bound forward (which may be our own
  torch.autograd.Function) from the selected outputs with the same dy_k, compared with the
  reference backward under the check's per-dtype tolerance. A `wrt` argument that receives no
  gradient, or a selected output that is not differentiable, fails the check.
"""

import math

import numpy as np

from falsify.harness import backends, cases
from falsify.harness.kinds.parity import compare, judge_for, tolerance_terms
from falsify.harness.plan import upstream_name
from falsify.harness.runtime import CheckFailed

# Random directions per `wrt` argument: each costs four reference forwards whatever the
# argument's size, and sees every coordinate (a wrong entry anywhere moves ⟨g, v⟩)
FD_DIRECTIONS = 2
# Coordinates tried after a directional failure, to name one that is off
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


def _upstreams(outs: list, selected: list[int], case) -> dict[int, np.ndarray]:
    """{output index: dy} for the selected outputs. The first output's dy comes from the case
    seed (as with a single output), a later output k's from (seed, k): independent draws."""
    if max(selected) >= len(outs):  # the contract names an output the reference lacks
        raise ValueError(f"the reference returned {len(outs)} output(s); the check "
                         f"differentiates output {max(selected)}")
    dtype = case.dtype if case.dtype in cases.FLOAT_DTYPES else "float64"
    return {k: _upstream(outs[k].shape, case.seed if k == 0 else [case.seed, k], dtype)
            for k in selected}


def _backward_kwargs(ctx, outs: list, dys: dict) -> dict:
    """The upstream gradients as the reference backward's keywords: `dy` for the first output
    (zeros when it is not selected: L does not depend on it), `d<name>` for a later one."""
    eq = ctx.contract.equations.get(ctx.equation)
    kw = {"dy": dys[0] if 0 in dys else np.zeros_like(outs[0])}
    kw.update({upstream_name(eq, k): dy for k, dy in dys.items() if k})
    return kw


def _ref_backward(ctx, case, upstream: dict):
    bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
    grads = backends.call(bwd, **ctx.ref_args(case), **upstream)
    if not isinstance(grads, dict):
        raise CheckFailed("reference backward must return {arg: gradient}")
    missing = [w for w in ctx.spec["wrt"] if w not in grads]
    if missing:
        raise CheckFailed(f"reference backward returned no gradient for {missing}")
    return {k: np.asarray(v, np.float64) for k, v in grads.items()}


def _loss(fwd, args: dict, dys: dict, keeps: dict) -> float:
    """L = Σ_k Σ f_k·dy_k over the outputs in `dys`: each output's pairwise sum (of the
    entries `keeps[k]` masks, when given), then the K partial sums in order."""
    outs = backends.outputs(backends.call(fwd, **args))
    total = 0.0
    for k in sorted(dys):
        prod = np.asarray(outs[k] * dys[k])
        prod = prod if keeps.get(k) is None else prod[keeps[k]]
        total += float(prod.sum())
    return total


def directional_difference(fwd, args: dict, w: str, v: np.ndarray, h: float, dy,
                           keep=None) -> tuple[float, np.ndarray]:
    """(L(x + h·v) − L(x − h·v), s) with s = (x + h·v) − (x − h·v), the step actually taken
    (x ± h·v is rounded; comparing against ⟨∇L, s⟩ removes that error). `dy` is the first
    output's upstream gradient, or {output index: dy}; `keep` (likewise one mask, or {output
    index: mask}) masks the outputs in L (those finite at x)."""
    dys = dy if isinstance(dy, dict) else {0: dy}
    keeps = keep if isinstance(keep, dict) else {k: keep for k in dys}
    x = args[w]
    hi, lo = x + h * v, x - h * v
    vals = [_loss(fwd, dict(args, **{w: xs}), dys, keeps) for xs in (hi, lo)]
    return vals[0] - vals[1], np.where(v == 0, 0.0, hi - lo)  # ±inf entries stay put


def central_difference(fwd, args: dict, w: str, idx: tuple, h: float, dy, keep=None) -> float:
    """(L(x + h·e_i) − L(x − h·e_i)) / (actual step): the coordinate case of
    `directional_difference`; dividing by the step actually taken removes the eps·|x_i|/h
    error of dividing by 2h."""
    v = np.zeros_like(args[w], dtype=np.float64)
    v[idx] = 1.0
    diff, step = directional_difference(fwd, args, w, v, h, dy, keep)
    return diff / float(step[idx])


def fd_tolerance(d1: float, d2: float, h: float, rho: float, g_round: float) -> float:
    """Bound on |D(h) − L'| from D(h), D(2h), the step h and the evaluation rounding ρ.
    |D(2h) − D(h)|/3 estimates D(h)'s truncation error but also carries up to 1.5·ρ/h/3 of
    rounding noise that may cancel it; the factors 2 and 3 cover that and the O(h^4) rest."""
    return 2.0 * abs(d2 - d1) / 3.0 + 3.0 * rho / h + g_round


def _check_fd(ctx, case, args64, outs: dict, dys: dict, ref_grads) -> None:
    """Central differences of L = Σ_k Σ f_k·dy_k over the selected outputs (`outs`: {index:
    value at x}) against the reference gradients."""
    ref_fwd = ctx.fn(backend="reference")
    u = EPS64 / 2
    n_out = len(dys)
    finite = {k: np.isfinite(y) for k, y in outs.items()}
    levels = {k: math.ceil(math.log2(max(int(y.size), 1))) for k, y in outs.items()}
    # An output computed by cancellation (KL ≈ 0, logsumexp − z_y, x − max x) carries the
    # rounding of its intermediates, not of its own value: those are of the inputs' magnitude,
    # or of unit scale (probabilities, log V) — all-zero logits give KL = 0 from O(1) terms.
    # Each output's scale is max(|f_j|, max |input|, 1), the unit scale the step h assumes too.
    xscale = max((float(np.abs(v).max()) for v in args64.values()
                  if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size), default=0.0)
    xscale = max(xscale, 1.0)
    # Output k's pairwise sum costs ⌈log2 N_k⌉ + 1 levels, adding the K partial sums K − 1.
    rho = 0.0
    for k, y in outs.items():
        mag = np.maximum(np.abs(y[finite[k]]), xscale)
        rho += ((levels[k] + n_out + FWD_ULPS) * u
                * float((mag * np.abs(dys[k][finite[k]])).sum()))
    g_levels = max(levels.values()) + n_out - 1
    for w in ctx.spec["wrt"]:
        x = args64[w]
        g = ref_grads[w]
        g_max = float(np.abs(g[np.isfinite(g)]).max(initial=0.0))
        for j in range(FD_DIRECTIONS if x.size else 0):
            # a random direction whose step h·v_i on coordinate i is at most H0·max(1, |x_i|),
            # the step a coordinate difference takes there
            z = np.random.default_rng([case.seed, 0x5EED, j]).standard_normal(x.shape)
            v = z / float(np.abs(z).max()) * np.maximum(1.0, np.abs(x))
            v[~np.isfinite(x)] = 0.0  # an infinite entry has no finite neighbourhood
            fd, e, tol, terms = _directional_error(ref_fwd, args64, w, v, g, dys, finite, rho,
                                                   (g_levels + FWD_ULPS) * u * g_max)
            if not all(map(math.isfinite, fd)):
                raise FiniteDifferenceError(
                    f"d/d{w} along a random direction: finite differences are not finite "
                    f"(D(h) = {fd[0]!r}, D(2h) = {fd[1]!r}, step {H0:.3g}): the forward leaves "
                    "the finite range within one step of x; no judgement")
            bad = np.flatnonzero(~np.isfinite(g))
            if bad.size:  # L is finite around x along v, so its derivative there is too
                idx = tuple(int(i) for i in np.unravel_index(bad[0], g.shape))
                raise CheckFailed(f"d/d{w}{idx}: the reference backward gives {g[idx]!r} "
                                  f"({bad.size} non-finite entries) where the central "
                                  f"difference along a random direction is finite ({fd[0]!r})")
            if not math.isfinite(tol):
                raise FiniteDifferenceError(
                    f"d/d{w} along a random direction: the tolerance is not finite ({tol!r}); "
                    "no judgement")
            if not abs(e) <= tol and not one_sided_agrees(
                    ref_fwd, args64, w, v, g, dys, finite, rho,
                    (g_levels + FWD_ULPS) * u * g_max):
                _localize(ref_fwd, args64, w, g, dys, finite, rho,
                          (g_levels + FWD_ULPS) * u * g_max, case.seed)
                raise CheckFailed(
                    f"d/d{w} along a random direction v: reference backward ⟨g, v⟩ and the "
                    f"central difference differ by {abs(e):.3g} (step {H0:.3g}; tolerance "
                    f"{tol:.3g} = {terms}); no single sampled coordinate shows it alone")


def _directional_error(fwd, args64, w, v, g, dys, finite, rho, g_round):
    """((D(h), D(2h)), D(h) − ⟨g, s⟩/2h, its bound, the bound's terms) along direction v, with
    D(h) = (L(x + h·v) − L(x − h·v))/2h and s the step actually taken. The error e(h) behaves
    as h²·L‴[v, v, v]/6, so |e(2h) − e(h)|/3 estimates it (Richardson) as on one coordinate;
    the reference gradient's rounding enters as Σ_i |s_i|·g_round plus the dot product's own
    (⌈log2 N⌉ + 1)·u·Σ|g_i·s_i|."""
    u = EPS64 / 2
    levels = math.ceil(math.log2(max(int(g.size), 1))) + 1
    fd, errs, bounds = [], [], []
    for h in (H0, 2 * H0):
        diff, s = directional_difference(fwd, args64, w, v, h, dys, finite)
        gs = g * s
        fd.append(diff / (2 * h))
        errs.append((diff - float(gs.sum())) / (2 * h))
        bounds.append((g_round * float(np.abs(s).sum()) + levels * u * float(np.abs(gs).sum()))
                      / (2 * h))
    e1, e2 = errs
    tol = fd_tolerance(e1, e2, H0, rho, bounds[0])
    terms = (f"2·truncation {abs(e2 - e1) / 3:.3g} + 3·rounding {rho / H0:.3g} + backward "
             f"rounding {bounds[0]:.3g}")
    return tuple(fd), e1, tol, terms


def one_sided_agrees(fwd, args64, w, v, g, dys, finite, rho, g_round) -> bool:
    """Whether ⟨g, ·⟩ agrees with the one-sided differences of L on one side of x, within that
    side's bound. Asked only after the central difference disagreed: near a kink the side that
    does not cross it is smooth and agrees.

    On a side (steps s_k = ±k·h·v, k = 1, 2, 4, as actually taken), e(k) = (L(x + s_k) − L(x) −
    ⟨g, s_k⟩)/(k·h) is c·k·h + d·(k·h)² + O(h³) for a smooth L and a right g, and a g off by Δ
    along v adds −Δ to every e(k), which the extrapolation keeps. Richardson removes
    the O(h) term: R(1) = 2·e(1) − e(2) and R(2) = 2·e(2) − e(4) are −2d·h² and −8d·h², so
    R(1) is as sharp as the central difference and 2·|R(2) − R(1)|/3 bounds it (with room for
    the rest, as in `fd_tolerance`). On the side that crosses a kink at distance δ < h (slopes
    jumping by J): e(k) = J·δ/(k·h), R(1) = 1.5·J·δ/h, R(2) = 0.75·J·δ/h, so the bound is
    0.5·J·δ/h < |R(1)|: the crossing side never vouches for the other side's slope. Rounding:
    R(1) carries ≤ 5·ρ/h from its evaluations (each L within ρ), taken 3 times as the central
    bound does; the backward's own over the steps, 3 times one step's."""
    u = EPS64 / 2
    levels = math.ceil(math.log2(max(int(g.size), 1))) + 1
    x = args64[w]
    base = _loss(fwd, args64, dys, finite)
    for sign in (1.0, -1.0):
        errs, bound = [], 0.0
        for k in (1, 2, 4):
            xs = x + sign * k * H0 * v
            s = np.where(v == 0, 0.0, xs - x)
            gs = g * s
            diff = _loss(fwd, dict(args64, **{w: xs}), dys, finite) - base
            errs.append((diff - float(gs.sum())) / (k * H0))
            if k == 1:
                bound = (g_round * float(np.abs(s).sum())
                         + levels * u * float(np.abs(gs).sum())) / H0
        r1, r2 = 2 * errs[0] - errs[1], 2 * errs[1] - errs[2]
        tol = 2.0 * abs(r2 - r1) / 3.0 + 15.0 * rho / H0 + 3.0 * bound
        if all(map(math.isfinite, (r1, r2, tol))) and abs(r1) <= tol:
            return True
    return False


def _localize(fwd, args64, w, g, dys, finite, rho, g_round, seed) -> None:
    """After a directional failure: central differences on up to FD_COORDS coordinates, to
    name one that is off (raises CheckFailed); returns when none of them shows it alone."""
    x = args64[w]
    rng = np.random.default_rng(seed ^ 0x5EED)
    flat = g.reshape(-1)
    for fi in rng.choice(x.size, size=min(FD_COORDS, x.size), replace=False):
        idx = np.unravel_index(fi, x.shape)
        h = H0 * max(1.0, abs(float(x[idx])))
        d1 = central_difference(fwd, args64, w, idx, h, dys, finite)
        d2 = central_difference(fwd, args64, w, idx, 2 * h, dys, finite)
        tol = fd_tolerance(d1, d2, h, rho, g_round)
        if all(map(math.isfinite, (d1, d2, tol))) and not abs(d1 - flat[fi]) <= tol:
            v = np.zeros_like(x, dtype=np.float64)
            v[idx] = max(1.0, abs(float(x[idx])))  # the step h = H0·max(1, |x_i|)
            if one_sided_agrees(fwd, args64, w, v, g, dys, finite, rho, g_round):
                continue  # a kink within a step of x_i: the slope of x_i's side is right
            raise CheckFailed(
                f"d/d{w}{tuple(int(i) for i in idx)}: reference backward {flat[fi]!r} vs "
                f"central difference {d1!r} (step {h:.3g}; tolerance {tol:.3g} = "
                f"2·truncation {abs(d2 - d1) / 3:.3g} + 3·rounding {rho / h:.3g} + "
                f"backward rounding {g_round:.3g})")


def _assert_statistics_detached(ctx, got: list) -> None:
    """Outputs the equation declares `non_differentiable` (saved statistics such as RMSNorm's
    inv_rms) must come back without an autograd graph: one that carries a graph invites a loss
    to use it, and the backward, which takes no upstream gradient for it, would drop that
    gradient silently."""
    import torch

    eq = ctx.contract.equations.get(ctx.equation)
    for name in (eq.non_differentiable if eq is not None else []):
        k = eq.outputs.index(name)
        y = got[k] if k < len(got) else None
        if isinstance(y, torch.Tensor) and y.requires_grad:
            raise CheckFailed(f"output {name!r} is declared non_differentiable but carries an "
                              "autograd graph: a loss that uses it would get a gradient the "
                              "backward never computes (mark it non-differentiable)")


def run(ctx, case):
    ref_fwd = ctx.fn(backend="reference")
    args64 = ctx.ref_args(case)
    outs = backends.outputs(backends.call(ref_fwd, **args64))
    selected = ctx.output_indices([0])
    dys = _upstreams(outs, selected, case)
    upstream = _backward_kwargs(ctx, outs, dys)
    ref_grads = _ref_backward(ctx, case, upstream)
    if ctx.backend == "reference":
        _check_fd(ctx, case, args64, {k: outs[k] for k in selected}, dys, ref_grads)
        return
    import torch

    wrt = tuple(ctx.spec["wrt"])
    targs = ctx.args(case, requires_grad=wrt)
    out = backends.call(ctx.fn(), **targs)
    got = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(got) <= max(selected):
        raise CheckFailed(f"backend returned {len(got)} output(s); the check differentiates "
                          f"output {max(selected)}")
    _assert_statistics_detached(ctx, got)
    ys, dy_ts = [], []
    for k in selected:
        y = got[k]
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            raise CheckFailed(f"output {k} has no autograd graph, but the check "
                              "differentiates it")
        ys.append(y)
        dy_ts.append(torch.from_numpy(dys[k]).to(
            device=y.device, dtype=y.dtype if y.is_floating_point() else torch.float32))
    leaves = [targs[w] for w in wrt]
    grads = backends.call(torch.autograd.grad, ys, leaves, grad_outputs=dy_ts,
                          allow_unused=True)
    for w, g in zip(wrt, grads):
        if g is None:
            raise CheckFailed(f"no gradient reached {w!r}")
        ref = ref_grads[w]
        finite = ref[np.isfinite(ref)]
        atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        bwd = ctx.fn(equation=ctx.spec["backward"], backend="reference")
        judge = judge_for(bwd, dict(ctx.ref_args(case), **upstream),
                          lambda outs, idx, w=w: outs[w][idx], case.dtype)
        compare(backends.to_numpy(g), ref, atol, rtol, f"d/d{w}", judge,
                tolerance_terms(ctx, case, atol, rtol))
