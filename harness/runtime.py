"""Executing one check: what generated tests and `falsify mutants` call.

    execute(contract_id, check_id, backend, variant, case)   # one example
    strategy(contract_id, check_id, variant)                  # hypothesis strategy of cases
    examples(contract_id, check_id, variant)                  # pinned cases (@example)
    check_settings(contract_id, check_id, backend)            # hypothesis settings
    kill_mutant(contract_id, mutant_id)                       # run its obligation's checks

A check kind is a small module in harness/kinds/ with `run(ctx, case)`; it raises
`CheckFailed` (an AssertionError) when the prediction is falsified and `Unproven` when a
symbolic engine could not decide.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings

from falsify.harness import backends, cases, expr
from falsify.harness.model import CONTRACTS_DIR, Check, Contract, load_contract
from falsify.harness.plan import INPUT_KINDS, equation_of, runs

if sys.version_info < (3, 11):  # hypothesis depends on the backport there
    from exceptiongroup import BaseExceptionGroup


class CheckFailed(AssertionError):
    """The check's prediction was falsified."""


def is_falsification(e: BaseException) -> bool:
    """A check failure (the prediction did not hold, or the implementation raised), as opposed
    to an error in the contract or the harness. Hypothesis groups several distinct failures."""
    if isinstance(e, BaseExceptionGroup):
        return any(is_falsification(x) for x in e.exceptions)
    return isinstance(e, AssertionError) and not isinstance(e, Unproven)


class Unproven(AssertionError):
    """A symbolic check that timed out or returned unknown: never counted as passed."""


CONTRACT_DIRS_ENV = "FALSIFY_CONTRACTS"  # extra directories (os.pathsep separated)


def contract_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(CONTRACT_DIRS_ENV, "").split(os.pathsep) if p]
    return extra + [CONTRACTS_DIR]


@cache
def contract(contract_id: str) -> Contract:
    for d in contract_dirs():
        for ext in (".yaml", ".yml"):
            p = d / f"{contract_id}{ext}"
            if p.exists():
                c, findings = load_contract(p)
                errors = [f for f in findings if f.severity == "error"]
                if errors:
                    raise RuntimeError(f"contract {contract_id} does not validate:\n"
                                       + "\n".join(map(str, errors)))
                return c
    raise RuntimeError(f"no contract {contract_id!r} in {', '.join(map(str, contract_dirs()))}")


def _check(c: Contract, check_id: str) -> Check:
    t = c.check(check_id)
    if t is None or not t.spec:
        raise RuntimeError(f"{c.id}: no executable check {check_id!r}")
    return t


# ---------------------------------------------------------------- tolerances
def tolerance(spec: dict, dtype: str, dims: dict, ref_max: float = 1.0) -> tuple[float, float]:
    """(atol, rtol) for this dtype; (0, 0) when the check declares none."""
    tol = spec.get("tolerance") or {}
    entry = tol.get(dtype)
    if entry is None:
        if tol:
            raise CheckFailed(f"no tolerance declared for dtype {dtype!r}")
        return 0.0, 0.0
    return (expr.tolerance_value(entry.get("atol", 0.0), dtype, dims, ref_max),
            expr.tolerance_value(entry.get("rtol", 0.0), dtype, dims, ref_max))


@dataclass
class Ctx:
    contract: Contract
    check: Check
    backend: str
    variant: str

    @property
    def spec(self) -> dict:
        return self.check.spec

    @property
    def equation(self) -> str:
        return equation_of(self.contract, self.check)

    @property
    def input_spec(self) -> dict:
        return self.contract.inputs.get(self.spec.get("input", ""), {})

    def fn(self, equation: str | None = None, backend: str | None = None):
        return backends.function(self.contract, equation or self.equation,
                                 backend or self.backend)

    def call_kwargs(self, case: cases.Case) -> dict:
        """`call:` overrides: expressions in dims, params, `dtype` and the epsilons."""
        env = dict(case.dims)
        env.update(case.params)
        env.update(expr.eps_names(case.dtype), dtype=case.dtype)
        return {k: expr.evaluate(v, env) for k, v in (self.spec.get("call") or {}).items()}

    def ref_args(self, case: cases.Case) -> dict:
        """The reference call's keyword arguments: the case's (float64) with `call:` applied.
        A `call:` key that names an input argument replaces it, on every backend alike."""
        a = backends.reference_args(case)
        a.update(self.call_kwargs(case))
        return a

    def args(self, case: cases.Case, requires_grad: tuple = ()) -> dict:
        a = backends.args_for(self.backend, case, self.input_spec.get("args", {}), requires_grad)
        a.update(self.call_kwargs(case))
        return a

    def tol(self, case: cases.Case, ref_max: float = 1.0) -> tuple[float, float]:
        # scalar arguments (lr_max, a scale) set the size of intermediates a tolerance may
        # depend on; `eps` stays the dtype epsilon (expr.scalar_args leaves harness names out)
        return tolerance(self.spec, case.dtype, {**expr.scalar_args(case.args), **case.dims},
                         ref_max)

    def env(self, case: cases.Case, **extra) -> dict:
        """Names visible to predicates and relations: the arguments the function was called
        with (each by name and all in `args`), dims, params, `dtype`, the epsilons, `extra`.
        With an argument named `eps`, a bare `eps` is an error (V021): `eps_dtype` or
        `args['eps']` say which is meant."""
        return names_env(self.ref_args(case), case, **extra)

    def assert_expr(self, src: str, env: dict, what: str) -> None:
        with np.errstate(all="ignore"):
            try:
                val = expr.evaluate(src, env)
            except expr.ExprError:
                raise
            except Exception as e:  # a contract bug, not a falsification: reported as error
                raise expr.ExprError(f"{what} {src!r} raised {type(e).__name__}: {e}") from None
        ok = np.asarray(val)
        if ok.dtype != np.bool_ and ok.dtype.kind not in "iu":
            raise CheckFailed(f"{what} {src!r} gave {ok.dtype} values, not booleans")
        if not ok.all():
            bad = np.argwhere(~ok.astype(bool))
            where = f" at {len(bad)} position(s), first {tuple(bad[0])}" if ok.ndim else ""
            raise CheckFailed(f"{what} {src!r} is false{where}")


def names_env(args: dict, case: cases.Case, **extra) -> dict:
    e = expr.eps_names(case.dtype)
    e.update(args)
    if "eps" in args:  # ambiguous: neither meaning is bound; expr.evaluate's error says to
        del e["eps"]   # write eps_dtype for the dtype epsilon or args['eps'] for the argument
    e.update(case.dims)
    e.update(case.params)
    e.update(dtype=case.dtype, args=args)
    e.update(extra)
    return e


def kind_module(kind: str):
    return importlib.import_module(f"falsify.harness.kinds.{kind}")


def execute(contract_id: str, check_id: str, backend: str, variant: str,
            case: cases.Case | None = None) -> dict | None:
    c = contract(contract_id)
    t = _check(c, check_id)
    ctx = Ctx(c, t, backend, variant)
    detail = kind_module(t.kind).run(ctx, case)
    if detail:
        LAST_DETAIL[(contract_id, check_id, backend, variant)] = detail
    return detail


# ---------------------------------------------------------------- hypothesis plumbing
PROFILE_ENV = "FALSIFY_PROFILE"  # fast (default) | ci | thorough
PROFILES = {
    # examples per check for reference/torch, and for the interpreted Triton backend
    "fast": dict(max_examples=20, triton=5),
    "ci": dict(max_examples=25, triton=5),
    "thorough": dict(max_examples=1000, triton=50, critical=10_000),
}


def profile_name() -> str:
    # CI gets the derandomized profile: the same examples on every run, so a red CI is
    # reproducible locally with FALSIFY_PROFILE=ci.
    name = os.environ.get(PROFILE_ENV) or ("ci" if os.environ.get("CI") else "fast")
    if name not in PROFILES:
        raise RuntimeError(f"{PROFILE_ENV}={name!r}: choose one of {', '.join(PROFILES)}")
    return name


def max_examples(c: Contract, t: Check, backend: str) -> int:
    prof = PROFILES[profile_name()]
    n = prof["max_examples"]
    if c.critical and "critical" in prof:
        n = prof["critical"]
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        n = min(n, prof["triton"])  # ~0.4 ms per program instance under the interpreter
    if t.spec.get("max_examples"):
        n = min(n, int(t.spec["max_examples"]))
    return n


SEED_ENV = "FALSIFY_SEED"  # an integer: hypothesis draws from it instead of fresh randomness


def run_seed() -> int | None:
    """The seed every check's search starts from, or None for fresh randomness (the `fast` and
    `thorough` profiles) or the derandomized `ci` profile. One number reproduces a whole run:
    `falsify run --seed N` (or FALSIFY_SEED=N with pytest) draws the same examples again."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw, 0)
    except ValueError:
        raise RuntimeError(f"{SEED_ENV}={raw!r}: expected an integer") from None


def example_database():
    """Failing examples are kept under the project (.falsify/hypothesis, beside the ledger) and
    replayed first on the next run; the derandomized `ci` profile keeps none (every run is the
    same examples), a seeded run keeps one so a red CI run's minimal example survives it."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    from falsify.harness.model import ROOT

    return DirectoryBasedExampleDatabase(ROOT / ".falsify" / "hypothesis")


def check_settings(contract_id: str, check_id: str, backend: str):
    """The check's hypothesis settings, as a decorator; with FALSIFY_SEED it also fixes the
    seed (hypothesis' `@seed`), so a seeded run draws the same examples every time."""
    from hypothesis import seed as fix_seed

    c = contract(contract_id)
    t = _check(c, check_id)
    n = run_seed()
    derandomize = profile_name() == "ci" and n is None
    s = settings(
        max_examples=max_examples(c, t, backend),
        deadline=None,  # interpreted Triton and CI machines make wall-clock deadlines noise
        derandomize=derandomize,  # CI: the same examples every run
        database=None if derandomize else example_database(),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
        print_blob=True,
    )
    if n is None:
        return s
    return lambda test: fix_seed(n)(s(test))


def strategy(contract_id: str, check_id: str, variant: str):
    c = contract(contract_id)
    t = _check(c, check_id)
    spec = c.inputs[t.spec["input"]]
    return cases.case_strategy(spec, variant, t.spec.get("params"),
                               where=f"{c.id}.inputs.{t.spec['input']}")


def examples(contract_id: str, check_id: str, variant: str) -> list[cases.Case]:
    c = contract(contract_id)
    t = _check(c, check_id)
    spec = c.inputs[t.spec["input"]]
    return cases.pinned_cases(spec, variant, t.spec.get("params"),
                              where=f"{c.id}.inputs.{t.spec['input']}")


def uses_hypothesis(kind: str) -> bool:
    return kind in INPUT_KINDS and kind != "statistical"


def run_with_hypothesis(contract_id: str, check_id: str, backend: str, variant: str) -> None:
    """Run one check over its pinned examples and a hypothesis search, in-process (used by
    `kill_mutant`; generated tests use @given directly)."""
    c = contract(contract_id)
    t = _check(c, check_id)
    if not uses_hypothesis(t.kind):
        execute(contract_id, check_id, backend, variant, None)
        return
    for ex in examples(contract_id, check_id, variant):
        execute(contract_id, check_id, backend, variant, ex)

    @check_settings(contract_id, check_id, backend)
    @given(case=strategy(contract_id, check_id, variant))
    def search(case):
        execute(contract_id, check_id, backend, variant, case)

    search()


@dataclass
class MutantResult:
    mutant: str
    killed: bool
    killed_by: str | None
    message: str
    tried: list[str]


def kill_mutant(contract_id: str, mutant_id: str) -> MutantResult:
    c = contract(contract_id)
    m = next((m for m in c.mutants if m.id == mutant_id), None)
    if m is None:
        raise RuntimeError(f"{contract_id}: no mutant {mutant_id!r}")
    tried = []
    with backends.overriding(f"{c.id}:{m.equation}.{m.backend}", m.with_):
        for t in c.checks_for(m.obligation):
            for r in runs(c, t):
                if r.backend != m.backend:
                    continue
                label = f"{t.id}/{r.backend}/{r.variant}"
                tried.append(label)
                try:
                    run_with_hypothesis(c.id, t.id, r.backend, r.variant)
                except Exception as e:
                    if not is_falsification(e):
                        raise  # a harness or contract error is not a kill
                    msg = f"{type(e).__name__}: {e}"
                    return MutantResult(m.id, True, label, msg[:2000], tried)
    return MutantResult(m.id, False, None, "no check of the obligation failed", tried)


class MutantSurvived(AssertionError):
    """Every check of the mutant's obligation passed against the buggy implementation."""


LAST_MUTANT: dict[tuple[str, str], MutantResult] = {}
LAST_DETAIL: dict[tuple[str, str, str, str], dict] = {}


def assert_killed(contract_id: str, mutant_id: str) -> MutantResult:
    """The generated mutant test: passes when some check of the obligation fails."""
    r = kill_mutant(contract_id, mutant_id)
    LAST_MUTANT[(contract_id, mutant_id)] = r
    if not r.killed:
        raise MutantSurvived(f"{mutant_id} survived: {', '.join(r.tried) or 'no check ran'} "
                             "all passed against the mutant")
    return r
