"""statistical: a per-sample statistic over N seeded samples, then a predicate on the array
`stats` (mean error within a bound, tail quantiles). Deterministic: the samples come from a
fixed seed, so a failure reproduces exactly.

The predicate sees `stats`, `samples` (N), `dtype`, the epsilons, and the case's dims and
params like every other kind: a name that is the same in every sample is a number; one drawn
per sample (a dim with a range) is an array aligned with `stats`. So are `tol` and `rtol`.
"""

import numpy as np

from falsify.harness import backends, cases, expr

SEED = 20260


def _per_sample(values: list):
    """One value when every sample agrees, else the array of per-sample values."""
    first = values[0]
    if all(isinstance(v, type(first)) and v == first for v in values):
        return first
    return np.asarray(values)


def run(ctx, case=None):
    spec = ctx.input_spec
    rng = np.random.default_rng(SEED)
    fn = ctx.fn()
    stats, dims, params, tols = [], [], [], []
    for i in range(int(ctx.spec["samples"])):
        c = cases.sample_case(spec, ctx.variant, rng, ctx.spec.get("params"),
                              where=f"{ctx.contract.id}.inputs.{ctx.spec['input']}",
                              label=f"sample {i}", pins=ctx.pins)
        outs = backends.outputs(backends.call(fn, **ctx.args(c)))
        atol, rtol = ctx.tol(c)
        env = ctx.env(c, y=outs[0], outs=outs, tol=atol, rtol=rtol)
        with np.errstate(all="ignore"):
            stats.append(np.asarray(expr.evaluate(ctx.spec["statistic"], env), np.float64))
        dims.append(c.dims)
        params.append(c.params)
        tols.append((atol, rtol))
    stats = np.stack(stats)
    env = expr.eps_names(ctx.variant)
    for per in (dims, params):
        for k in per[0]:
            env[k] = _per_sample([p[k] for p in per])
    env.update(stats=stats, samples=len(stats), dtype=ctx.variant,
               tol=_per_sample([t[0] for t in tols]), rtol=_per_sample([t[1] for t in tols]))
    ctx.assert_expr(ctx.spec["predicate"], env, "statistical predicate")
    return {"mean": float(stats.mean()), "max": float(stats.max()), "samples": len(stats)}
