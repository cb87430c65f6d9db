"""parity: the backend's outputs equal the float64 reference's, |got − ref| ≤ atol + rtol·|ref|.

With `poison: true` on the Triton backend, float inputs and `out` are views into NaN-filled
buffers: a kernel that reads outside its view produces NaN (caught by the comparison) and one
that writes outside it is caught by the margin check. A 0-d (scalar) `out` has no margins: it is
filled with the sentinel, so a kernel that never writes it fails the comparison.
"""

import numpy as np

from falsify.harness import backends
from falsify.harness.runtime import CheckFailed


def compare(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float, what: str) -> None:
    if got.shape != ref.shape:
        raise CheckFailed(f"{what}: shape {got.shape} != reference {ref.shape}")
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(got) & np.isnan(ref)
        same_inf = np.isinf(got) & np.isinf(ref) & (np.sign(got) == np.sign(ref))
        err = np.abs(got - ref)
        ok = both_nan | same_inf | (err <= atol + rtol * np.abs(ref))
    if not ok.all():
        bad = np.argwhere(~ok)
        i = tuple(bad[0])
        raise CheckFailed(
            f"{what}: {len(bad)} of {ok.size} element(s) differ beyond atol={atol:.3g}, "
            f"rtol={rtol:.3g}; first at {i}: got {got[i]!r}, reference {ref[i]!r}, "
            f"max |err| = {np.nanmax(np.where(np.isfinite(err), err, np.inf)):.3g}")


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
    got = backends.outputs(backends.call(fn, **args))
    backends.check_margins(guards)
    selected = ctx.spec.get("outputs") or range(len(ref))
    if len(got) < len(ref):
        raise CheckFailed(f"backend returned {len(got)} output(s), reference {len(ref)}")
    for i in selected:
        finite = ref[i][np.isfinite(ref[i])]
        ref_max = float(np.abs(finite).max()) if finite.size else 0.0
        atol, rtol = ctx.tol(case, ref_max)
        compare(got[i], ref[i], atol, rtol, f"output {i}")
