"""roundtrip: z = inverse(*f(x)) and a relation on x, f's outputs and z
(quantize∘dequantize error bounds, encode/decode identities; z may be a str, held in a 0-d
object array)."""

import numpy as np

from falsify.harness import backends, expr
from falsify.harness.runtime import names_env


def run(ctx, case):
    fwd = ctx.fn()
    inv = ctx.fn(equation=ctx.spec["inverse"])
    raw = backends.call(fwd, **ctx.args(case))
    raw = list(raw) if isinstance(raw, (tuple, list)) else [raw]
    env = names_env(ctx.ref_args(case), case)
    inv_kwargs = {k: expr.evaluate(v, env) for k, v in (ctx.spec.get("args") or {}).items()}
    z = backends.outputs(backends.call(inv, *raw, **inv_kwargs))
    outs = [backends.to_numpy(r) for r in raw]
    # ref_max only means something for numbers (a decoded str has no magnitude)
    numeric = z[0].dtype.kind in "biuf"
    finite = z[0][np.isfinite(z[0])] if numeric else np.zeros(0)
    atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
    e = ctx.env(case, outs=outs, y=outs[0], z=z[0], zs=z, tol=atol, rtol=rtol)
    ctx.assert_expr(ctx.spec["relation"], e, "relation")
