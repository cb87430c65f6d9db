"""symbolic: facts proved, not sampled.

- z3: `target()` returns a claim (or a list of claims) built with z3; we assert the negation
  and ask for satisfiability. unsat = proved; sat = falsified, with the model as the
  counterexample; unknown (including a timeout) = Unproven — never "passed".
- crosshair: `target` is a pure-Python function with PEP 316 `pre:`/`post:` conditions in its
  docstring. Passed only when CrossHair reports every condition CONFIRMED (all paths exhausted);
  a counterexample fails the check; anything else (cannot confirm within the budget) is Unproven.
"""

from falsify.harness import backends
from falsify.harness.runtime import CheckFailed, Unproven


def _z3(ctx):
    import z3

    claims = backends.resolve(ctx.spec["target"])()
    claims = claims if isinstance(claims, (list, tuple)) else [claims]
    s = z3.Solver()
    s.set("timeout", int(1000 * float(ctx.spec.get("timeout_s", 30))))
    s.add(z3.Not(z3.And(*claims)))
    res = s.check()
    if res == z3.unsat:
        return {"result": "proved", "claims": len(claims)}
    if res == z3.sat:
        raise CheckFailed(f"z3 found a counterexample: {s.model()}")
    raise Unproven(f"z3 returned unknown ({s.reason_unknown()}): not proven")


def _crosshair(ctx):
    from crosshair.core_and_libs import AnalysisKind, analyze_function, run_checkables
    from crosshair.options import DEFAULT_OPTIONS, AnalysisOptionSet
    from crosshair.statespace import MessageType

    fn = backends.resolve(ctx.spec["target"])
    budget = float(ctx.spec.get("timeout_s", 30))
    opts = DEFAULT_OPTIONS.overlay(AnalysisOptionSet(
        analysis_kind=[AnalysisKind.PEP316], per_condition_timeout=budget, report_all=True))
    msgs = list(run_checkables(analyze_function(fn, opts)))
    if not msgs:
        raise CheckFailed(f"{ctx.spec['target']} has no PEP 316 conditions to check")
    failures = [m for m in msgs if m.state in (MessageType.POST_FAIL, MessageType.EXEC_ERR,
                                                MessageType.POST_ERR, MessageType.SYNTAX_ERR,
                                                MessageType.IMPORT_ERR)]
    if failures:
        raise CheckFailed("; ".join(f"line {m.line}: {m.message}" for m in failures))
    if any(m.state != MessageType.CONFIRMED for m in msgs):
        raise Unproven("CrossHair could not confirm every condition within "
                       f"{budget:g} s: " + "; ".join(m.message for m in msgs))
    return {"result": "confirmed", "conditions": len(msgs)}


def run(ctx, case=None):
    engine = ctx.spec["engine"]
    return _z3(ctx) if engine == "z3" else _crosshair(ctx)
