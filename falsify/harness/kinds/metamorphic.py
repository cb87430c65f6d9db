"""metamorphic: f(x) and f(T(x)) must satisfy a relation (shift invariance, scaling,
permutation, causality). T is applied to the float64 values and then rounded to the case dtype,
exactly as a caller's input would be."""

import numpy as np

from falsify.harness import backends, cases, expr
from falsify.harness.runtime import CheckFailed


def transformed(ctx, case):
    env = ctx.env(case)
    new_args = dict(case.args)
    for name, src in ctx.spec["transform"].items():
        if name not in case.args:
            raise CheckFailed(f"transform names {name!r}, which is not an input argument")
        with np.errstate(all="ignore"):
            val = expr.evaluate(src, env)
        old = case.args[name]
        if isinstance(old, np.ndarray):
            dt = cases.arg_dtype(ctx.input_spec["args"].get(name, {}), case.dtype)
            val = np.broadcast_to(np.asarray(val), old.shape)
            new_args[name] = (cases.round_to(val, dt) if dt in cases.FLOAT_DTYPES
                              else np.asarray(val).astype(old.dtype))
        else:
            new_args[name] = val
    return cases.Case(case.dtype, case.dims, new_args, case.params, case.seed, case.label)


def run(ctx, case):
    fn = ctx.fn()
    outs1 = backends.outputs(backends.call(fn, **ctx.args(case)))
    case2 = transformed(ctx, case)
    outs2 = backends.outputs(backends.call(fn, **ctx.args(case2)))
    finite = outs1[0][np.isfinite(outs1[0])]
    atol, rtol = ctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
    env = ctx.env(case, y1=outs1[0], y2=outs2[0], outs1=outs1, outs2=outs2, tol=atol, rtol=rtol,
                  x2=ctx.ref_args(case2))
    ctx.assert_expr(ctx.spec["relation"], env, "relation")
