"""property: a predicate on the backend's outputs (`y`, `outs`) and inputs must hold."""

from falsify.harness import backends


def run(ctx, case):
    outs = backends.outputs(backends.call(ctx.fn(), **ctx.args(case)))
    atol, rtol = ctx.tol(case)
    env = ctx.env(case, y=outs[0], outs=outs, tol=atol, rtol=rtol)
    ctx.assert_expr(ctx.spec["predicate"], env, "predicate")
