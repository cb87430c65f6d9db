"""statistical: a per-sample statistic over N seeded samples, then a predicate on the array
`stats` (mean error within a bound, tail quantiles). Deterministic: the samples come from a
fixed seed, so a failure reproduces exactly."""

import numpy as np

from falsify.harness import backends, cases, expr

SEED = 20260


def run(ctx, case=None):
    spec = ctx.input_spec
    rng = np.random.default_rng(SEED)
    fn = ctx.fn()
    stats = []
    for i in range(int(ctx.spec["samples"])):
        c = cases.sample_case(spec, ctx.variant, rng, ctx.spec.get("params"),
                              where=f"{ctx.contract.id}.inputs.{ctx.spec['input']}",
                              label=f"sample {i}")
        outs = backends.outputs(backends.call(fn, **ctx.args(c)))
        atol, rtol = ctx.tol(c)
        env = ctx.env(c, y=outs[0], outs=outs, tol=atol, rtol=rtol)
        with np.errstate(all="ignore"):
            stats.append(np.asarray(expr.evaluate(ctx.spec["statistic"], env), np.float64))
    stats = np.stack(stats)
    env = {"stats": stats, "n": len(stats)}
    ctx.assert_expr(ctx.spec["predicate"], env, "statistical predicate")
    return {"mean": float(stats.mean()), "max": float(stats.max()), "samples": len(stats)}
