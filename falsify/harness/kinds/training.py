"""training: a loop-level run. `run(backend=, dtype=, **args)` returns a dict `r`; the
predicate on `r` must hold. The run function compares against something independent (a
reference loop, torch.optim, an uninterrupted run), never against itself."""


from falsify.harness import backends, expr
from falsify.harness.runtime import CheckFailed, tolerance


def run(ctx, case=None):
    fn = backends.resolve(ctx.spec["run"])
    r = backends.call(fn, backend=ctx.backend, dtype=ctx.variant, **(ctx.spec.get("args") or {}))
    if not isinstance(r, dict):
        raise CheckFailed(f"{ctx.spec['run']} returned {type(r).__name__}, not a dict")
    atol, rtol = tolerance(ctx.spec, ctx.variant, {})
    env = dict(expr.eps_names(ctx.variant), r=r, tol=atol, rtol=rtol, dtype=ctx.variant)
    scalars = {k: v for k, v in r.items() if isinstance(v, (int, float, str, bool))}
    try:
        ctx.assert_expr(ctx.spec["predicate"], env, "training predicate")
    except CheckFailed as e:
        # the run's figures are the evidence: which term of the predicate broke, and by how much
        shown = ", ".join(f"{k}={v!r}" for k, v in scalars.items())
        e.args = (f"{e.args[0]}; the run returned {shown}",)
        raise
    return scalars
