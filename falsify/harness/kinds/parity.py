"""parity: the backend's outputs equal the float64 reference's, |got − ref| ≤ atol + rtol·|ref|.

With `poison: true` on the Triton backend, float inputs and `out` are views into NaN-filled
buffers: a kernel that reads outside its view produces NaN (caught by the comparison) and one
that writes outside it is caught by the margin check. A 0-d (scalar) `out` has no margins: it is
filled with the sentinel, so a kernel that never writes it fails the comparison.
"""

import numpy as np

from falsify.harness import arbiter, backends
from falsify.harness.cases import FLOAT_DTYPES
from falsify.harness.runtime import CheckFailed


def compare(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float, what: str,
            judge=None, terms: str = "") -> None:
    """|got − ref| ≤ atol + rtol·|ref| elementwise. On failure, `judge(index, got, ref)` (a
    harness.arbiter Verdict) says which side is closer to the truth, and `terms` how the
    tolerance was derived; both go into the CheckFailed message and its `evidence`."""
    if got.shape != ref.shape:
        raise CheckFailed(f"{what}: shape {got.shape} != reference {ref.shape}")
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(got) & np.isnan(ref)
        same_inf = np.isinf(got) & np.isinf(ref) & (np.sign(got) == np.sign(ref))
        err = np.abs(got - ref)
        ok = both_nan | same_inf | (err <= atol + rtol * np.abs(ref))
    if not ok.all():
        bad = np.argwhere(~ok)
        i = tuple(int(k) for k in bad[0])
        msg = (f"{what}: {len(bad)} of {ok.size} element(s) differ beyond atol={atol:.3g}, "
               f"rtol={rtol:.3g}; first at {i}: got {got[i]!r}, reference {ref[i]!r}, "
               f"max |err| = {np.nanmax(np.where(np.isfinite(err), err, np.inf)):.3g}")
        evidence = dict(index=list(i), got=float(got[i]), reference=float(ref[i]),
                        atol=atol, rtol=rtol, tolerance=terms or None)
        if judge is not None and final_run():
            v = judge(i, float(got[i]), float(ref[i]))
            msg += f"; {v.sentence()}"
            evidence["arbiter"] = v.evidence()
        if terms:
            msg += f"\n  tolerance: {terms}"
        e = CheckFailed(msg)
        e.evidence = evidence
        raise e


def final_run() -> bool:
    """False while hypothesis is still searching or shrinking (hundreds of failing calls, each
    would re-run the reference in mpmath); True for the reported replay and outside hypothesis."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        return bool(getattr(current_build_context(), "is_final", True))
    except InvalidArgument:  # not inside a hypothesis test: a direct call, always reported
        return True


def judge_for(fn, args: dict, pick_output, dtype: str):
    """A `judge` for compare: re-runs the reference `fn` on `args` in high precision at the
    failing element (pick_output(outputs, index) selects it)."""
    if dtype not in FLOAT_DTYPES:
        return None

    def judge(index, got, ref):
        return arbiter.arbitrate(fn, args, lambda outs: pick_output(outs, index), got, ref,
                                 dtype)

    return judge


def tolerance_terms(ctx, case, atol: float, rtol: float) -> str:
    """The declared tolerance for this dtype with its values: what the derivation allowed."""
    tol = ctx.spec.get("tolerance") or {}
    entry = tol.get(case.dtype) or {}
    parts = [f"{k} = {entry[k]} = {v:.3g}" if isinstance(entry.get(k), str) else f"{k} = {v:.3g}"
             for k, v in (("atol", atol), ("rtol", rtol)) if k in entry or v]
    why = " ".join(str(tol.get("why", "")).split())
    return "; ".join(parts) + (f" (why: {why})" if why else "")


def _check_kept_dtype(ctx, case, raw, selected) -> None:
    """The equation's `keeps_dtype` outputs come back, on torch and Triton, in the case's
    floating dtype: values alone cannot tell a float16 result from a float32 one that is more
    accurate than asked, and a caller pays for it in memory and a dtype clash downstream."""
    eq = ctx.contract.equations.get(ctx.equation)
    keep = eq.keeps_dtype if eq is not None else False
    if not keep or ctx.backend == "reference" or case.dtype not in FLOAT_DTYPES:
        return
    import torch

    outs = list(raw) if isinstance(raw, (tuple, list)) else [raw]
    want = backends.torch_dtype(case.dtype)
    for i in selected:
        name = eq.outputs[i] if i < len(eq.outputs) else None
        if keep is not True and name not in keep:
            continue
        o = outs[i] if i < len(outs) else None
        if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dtype != want:
            raise CheckFailed(f"output {i}{f' ({name})' if name else ''} has dtype {o.dtype}; "
                              f"the equation keeps the inputs' dtype ({want})")


def run(ctx, case):
    ref_fn = ctx.fn(backend="reference")
    ref = backends.outputs(backends.call(ref_fn, **ctx.ref_args(case)))
    fn = ctx.fn()
    args = ctx.args(case)
    guards = []
    if ctx.spec.get("poison") and ctx.backend == "triton":
        import torch

        args, guards = backends.poison(args, fn)
        # the output buffer has the implementation's output dtype: the case dtype for floats,
        # the reference's integer dtype for codes (e.g. packed uint8)
        out_dtype = (backends.torch_dtype(case.dtype) if ref[0].dtype.kind == "f"
                     else torch.from_numpy(ref[0][:0]).dtype)
        like = torch.from_numpy(ref[0]).to(device=backends.device_for(ctx.backend),
                                           dtype=out_dtype)
        out, g = backends.poisoned_out(fn, like)
        if out is not None:
            args["out"] = out
            if g is not None:
                guards.append(("out", g))
            else:  # a 0-d output has no margin to poison; NaN still shows an unwritten `out`
                out.fill_(backends._sentinel(out.dtype))
    raw = backends.call(fn, **args)
    got = backends.outputs(raw)
    backends.check_margins(guards)
    selected = ctx.output_indices(range(len(ref)))
    _check_kept_dtype(ctx, case, raw, selected)
    if len(got) < len(ref):
        raise CheckFailed(f"backend returned {len(got)} output(s), reference {len(ref)}")
    for i in selected:
        finite = ref[i][np.isfinite(ref[i])]
        ref_max = float(np.abs(finite).max()) if finite.size else 0.0
        atol, rtol = ctx.tol(case, ref_max)
        judge = judge_for(ref_fn, ctx.ref_args(case),
                          lambda outs, idx, i=i: outs[i][idx], case.dtype)
        compare(got[i], ref[i], atol, rtol, f"output {i}", judge,
                tolerance_terms(ctx, case, atol, rtol))
