"""Executing one check: what generated tests and `falsify mutants` call.

    CONTRACT = library_contract(name, sha256)                 # a generated module's contract,
    CONTRACT = contract_file(__file__, relpath, sha256)       # loaded once per process
    execute(contract, check_id, backend, variant, case)       # one example
    strategy(contract, check_id, variant)                     # hypothesis strategy of cases
    examples(contract, check_id, variant)                     # pinned cases (@example)
    check_settings(contract, check_id, backend, variant)      # hypothesis settings
    kill_mutant(contract, mutant_id)                          # run its obligation's checks

`contract` is a loaded `Contract`. Contracts are loaded by path and cached by (resolved path,
sha256); a bare id (`contract("kd-loss-kernel-v1")`, used by `run:` probes) is resolved in
the active run's manifest, else in the project's id space (project + library).
What a check reports back to the pytest plugin (a detail, a mutant result) goes to the
`recording()` the plugin opens around each test, never into a module-wide table.

A check kind is a small module in falsify/harness/kinds/ with `run(ctx, case)`; it raises
`CheckFailed` (an AssertionError) when the prediction is falsified and `Unproven` when a
symbolic engine could not decide.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

from falsify.harness import backends, binding, cases, expr, handover, project
from falsify.harness.model import Check, Contract, load_contract
from falsify.harness.plan import INPUT_KINDS, equation_of, output_index, runs

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


def first_failure(e: BaseException) -> tuple[BaseException, int]:
    """(the first of Hypothesis' distinct failures, how many there were): a group's own
    message says only how many it holds; its first member carries the message, the falsifying
    example (its notes) and the arbiter's evidence."""
    n = 1
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        n = max(n, len(e.exceptions))
        e = e.exceptions[0]
    return e, n


class Unproven(AssertionError):
    """A symbolic check that timed out or returned unknown: never counted as passed."""


class StaleModule(RuntimeError):
    """A generated module whose contract changed after it was generated."""


_LOADED: dict[tuple[Path, str], Contract] = {}


def remember(c: Contract) -> Contract:
    """Cache an already-parsed contract (the command parsed it once; pytest runs in-process
    without xdist, so generated modules reuse it)."""
    _LOADED[(c.path.resolve(), c.sha256)] = c
    return c


def load(path: str | Path, sha256: str | None = None) -> Contract:
    """The contract at `path`, parsed once per process per content. With `sha256`, the file
    must still have that content (a generated module names the text it was generated from)."""
    p = Path(path).resolve()
    try:
        data = p.read_bytes()
    except OSError as e:
        raise RuntimeError(f"cannot read contract {p}: {e}") from None
    sha = hashlib.sha256(data).hexdigest()
    if sha256 is not None and sha != sha256:
        raise StaleModule(f"{p} changed since its test module was generated: run `pv generate` "
                          "(or `falsify run`, which regenerates)")
    hit = _LOADED.get((p, sha))
    if hit is not None:
        return hit
    c, findings = load_contract(p)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise RuntimeError(f"contract {p} does not validate:\n" + "\n".join(map(str, errors)))
    return remember(c)


def library_contract(name: str, sha256: str | None = None) -> Contract:
    """A contract of the shipped library, by file name."""
    return load(project.library_dir() / name, sha256)


def contract_file(module_file: str, relpath: str, sha256: str | None = None) -> Contract:
    """A contract named by its path relative to the generated module that uses it."""
    return load(Path(module_file).resolve().parent / relpath, sha256)


def contract(ref: str | Contract) -> Contract:
    """A contract by id: the active run's contract of that id, else the project's or the
    library's. A `Contract` is returned as is."""
    if isinstance(ref, Contract):
        return ref
    m = handover.active()
    path = m.contract_path(ref) if m else None
    if path is None:
        path = project.resolve_id(ref, project.find_project())
    if path is None:
        raise RuntimeError(f"no contract {ref!r} in this run, the project or the library")
    return load(path)


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

    @property
    def pins(self) -> dict:
        """Arguments a bound equation variant fixes (falsify.harness.binding.active_pins)."""
        return binding.active_pins(self.contract, self.equation)

    def output_indices(self, default) -> list[int]:
        """The check's `outputs` as indices (a name is looked up in the equation's `outputs`),
        or `default` when it names none. A name the equation does not declare is a contract
        error (ValueError; `pv validate` reports it as V018), never a failure."""
        sel = self.spec.get("outputs")
        if not sel:
            return list(default)
        eq = self.contract.equations.get(self.equation)
        return [output_index(eq, e) for e in sel]

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


def replays_pinned(kind: str) -> bool:
    """Whether a kind's checks replay the input's pinned examples: a kind module says no with
    PINNED_EXAMPLES = False (layouts: its views of a large pinned shape would cost interpreted
    Triton programs and find nothing a tiny drawn case does not)."""
    return getattr(kind_module(kind), "PINNED_EXAMPLES", True)


def unless_unavailable(contract_ref: str | Contract, check_id: str, backend: str):
    """A generated test's skip marker for a kind that cannot run on this machine (its module's
    `unavailable(backend)` gives the reason): the test is reported as skipped with that reason
    before hypothesis starts, never as passed. The kind's `run` refuses the same way, so a
    mutant run through `kill_mutant` is skipped too."""
    import pytest

    c = contract(contract_ref)
    why = kind_module(_check(c, check_id).kind).unavailable(backend)
    return pytest.mark.skipif(bool(why), reason=why or "")


@dataclass
class Recording:
    """What the checks of one test reported: details of passed checks, a mutant's result."""

    details: list[dict] = field(default_factory=list)
    mutant: MutantResult | None = None


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "falsify_recording", default=None)


@contextmanager
def recording():
    """Collect what checks report while the block runs (the pytest plugin wraps each test)."""
    rec = Recording()
    token = _RECORDING.set(rec)
    try:
        yield rec
    finally:
        _RECORDING.reset(token)


def execute(contract_ref: str | Contract, check_id: str, backend: str, variant: str,
            case: cases.Case | None = None) -> dict | None:
    c = contract(contract_ref)
    t = _check(c, check_id)
    ctx = Ctx(c, t, backend, variant)
    detail = kind_module(t.kind).run(ctx, case)
    rec = _RECORDING.get()
    if detail and rec is not None:
        rec.details.append(detail)
    return detail


# ---------------------------------------------------------------- hypothesis plumbing
PROFILES = {
    # examples per check for reference/torch, and for the interpreted Triton backend
    "fast": dict(max_examples=20, triton=5),
    "ci": dict(max_examples=25, triton=5),
    "thorough": dict(max_examples=1000, triton=50, critical=10_000),
}


# how hard each profile searches: a result is reusable (`falsify run --changed`) only by a run
# whose profile searches no harder than the one that produced it
PROFILE_STRENGTH = {"fast": 0, "ci": 0, "thorough": 1}


def gpu_name() -> str | None:
    """The CUDA device this process's checks could use, or None: recorded with every result, so
    the dispatcher (falsify/llm/dispatch.py) can tell GPU evidence (a `device` check that ran) from
    a ledger carried to another machine. torch is not imported for it: a process that never
    imported torch ran nothing on a GPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def profile_name() -> str:
    """The run manifest's profile; without one (plain pytest), `ci` under CI (derandomized:
    the same examples on every run, so a red CI is reproducible with `profile = "ci"`), else
    the project's `profile`, else `fast`."""
    m = handover.active()
    if m is not None:
        name = m.profile
    elif os.environ.get("CI"):
        name = "ci"
    else:
        name = _project_profile()
    if name not in PROFILES:
        raise RuntimeError(f"profile {name!r}: choose one of {', '.join(PROFILES)}")
    return name


@cache
def _project_profile() -> str:
    p = project.find_project()
    return p.profile if p else "fast"


def max_examples(c: Contract, t: Check, backend: str) -> int:
    prof = PROFILES[profile_name()]
    n = prof["max_examples"]
    if c.critical and "critical" in prof:
        n = prof["critical"]
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        n = min(n, prof["triton"])  # ~0.4 ms per program instance under the interpreter
    # a kind whose cases are costly, or whose bugs show on any case, caps every profile
    # (compile: seconds of compilation per shape; layouts: a layout bug shows on any shape)
    cap = getattr(kind_module(t.kind), "MAX_EXAMPLES", None)
    if cap is not None:
        n = min(n, cap)
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
    """Failing examples of an unseeded `fast` or `thorough` run are kept under the project
    (.falsify/hypothesis, beside the ledger) and replayed first on the next one. A seeded run,
    and so the `ci` profile, keeps and replays none: hypothesis' `@seed` sets `database=None`,
    and the seed alone reproduces the run. A manifest may name another database. Outside a
    project (plain pytest on loose files) hypothesis' own default applies."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    m = handover.active()
    if m is not None and m.example_db:
        return DirectoryBasedExampleDatabase(m.example_db)
    root = Path(m.project_root) if m is not None else None
    if root is None:
        p = project.find_project()
        root = p.root if p else None
    if root is None:
        return settings.default.database
    return DirectoryBasedExampleDatabase(root / ".falsify" / "hypothesis")


def _pin_local_constants() -> None:
    """Make what a seed draws independent of what the process has imported.

    Hypothesis mixes into its draws constants it finds in every *local* module loaded so far
    (`providers._get_local_constants`): falsify itself when it is not installed in
    site-packages, the user's package, the kernels a run binds. That pool differs between
    projects, between a soak round and a `falsify run -k TEST`, and between xdist workers that
    ran other tests first, so one seed drew different examples in each. Under a seed (and the
    `ci` profile's fixed one) the pool is pinned empty for the process (hypothesis' built-in
    constants still apply). The hook is private: if a hypothesis release moves it,
    tests/test_soak.py's module-loading test fails."""
    from hypothesis.internal.conjecture import providers

    if getattr(providers, "_falsify_pinned", False) or not hasattr(
            providers, "_get_local_constants"):  # older hypothesis: no local constants
        return
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()
    providers._falsify_pinned = True


def check_seed(contract_id: str, check_id: str, backend: str, variant: str,
               seed: int | None) -> int:
    """The seed one check's search starts from: a sha256 digest of the check's identity and the
    run's seed (None: the `ci` profile's fixed examples). Nothing else enters it, so a check draws
    the same examples in any project, checkout path or selection of tests; hypothesis' own
    derandomization would digest the generated test function (its source and signature)
    instead. Each backend and variant gets its own stream, as each test did before."""
    key = "\x1f".join([contract_id, check_id, backend, variant,
                       "ci" if seed is None else str(seed)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def check_settings(contract_ref: str | Contract, check_id: str, backend: str,
                   variant: str, shrink: bool = True):
    """The check's hypothesis settings, as a decorator. Under FALSIFY_SEED, and in the `ci`
    profile, it also fixes the seed (hypothesis' `@seed`, to `check_seed`), so the run draws
    the same examples every time and everywhere; otherwise (`fast`, `thorough`) each run draws
    fresh ones. Without `shrink`, the shrink phase is left out (a mutant run: see
    `run_with_hypothesis`)."""
    from hypothesis import seed as fix_seed

    c = contract(contract_ref)
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
        **({} if shrink else {"phases": [p for p in Phase if p is not Phase.shrink]}),
    )
    if n is None and not derandomize:
        return s
    _pin_local_constants()
    return lambda test: fix_seed(check_seed(c.id, check_id, backend, variant, n))(s(test))


def strategy(contract_ref: str | Contract, check_id: str, variant: str):
    c = contract(contract_ref)
    t = _check(c, check_id)
    spec = c.inputs[t.spec["input"]]
    return cases.case_strategy(spec, variant, t.spec.get("params"),
                               where=f"{c.id}.inputs.{t.spec['input']}",
                               pins=binding.active_pins(c, equation_of(c, t)))


def examples(contract_ref: str | Contract, check_id: str, variant: str) -> list[cases.Case]:
    c = contract(contract_ref)
    t = _check(c, check_id)
    if not replays_pinned(t.kind):
        return []
    spec = c.inputs[t.spec["input"]]
    return cases.pinned_cases(spec, variant, t.spec.get("params"),
                              where=f"{c.id}.inputs.{t.spec['input']}",
                              pins=binding.active_pins(c, equation_of(c, t)))


def uses_hypothesis(kind: str) -> bool:
    return kind in INPUT_KINDS and kind not in ("statistical", "dtypes")


def run_with_hypothesis(contract_ref: str | Contract, check_id: str, backend: str,
                        variant: str, shrink: bool = True) -> None:
    """Run one check over its pinned examples and a hypothesis search, in-process (used by
    `kill_mutant`; generated tests use @given directly). With `shrink=False` the first
    falsifying example is reported as found: a mutant's kill needs a failure, not the
    smallest one, and shrinking under the Triton interpreter costs many more calls than
    finding did."""
    c = contract(contract_ref)
    t = _check(c, check_id)
    if not uses_hypothesis(t.kind):
        execute(c, check_id, backend, variant, None)
        return
    for ex in examples(c, check_id, variant):
        execute(c, check_id, backend, variant, ex)

    def search(case):
        execute(c, check_id, backend, variant, case)

    search = given(case=strategy(c, check_id, variant))(search)
    check_settings(c, check_id, backend, variant, shrink=shrink)(search)()


@dataclass
class MutantResult:
    mutant: str
    killed: bool
    killed_by: str | None
    message: str
    tried: list[str]


def kill_mutant(contract_ref: str | Contract, mutant_id: str) -> MutantResult:
    c = contract(contract_ref)
    m = next((m for m in c.mutants if m.id == mutant_id), None)
    if m is None:
        raise RuntimeError(f"{c.id}: no mutant {mutant_id!r}")
    tried = []
    with backends.overriding(f"{c.id}:{m.equation}.{m.backend}", m.with_):
        for t in c.checks_for(m.obligation):
            for r in runs(c, t):
                if r.backend != m.backend:
                    continue
                label = f"{t.id}/{r.backend}/{r.variant}"
                tried.append(label)
                try:
                    run_with_hypothesis(c, t.id, r.backend, r.variant, shrink=False)
                except Exception as e:
                    if not is_falsification(e):
                        raise  # a harness or contract error is not a kill
                    msg = f"{type(e).__name__}: {e}"
                    return MutantResult(m.id, True, label, msg[:2000], tried)
    return MutantResult(m.id, False, None, "no check of the obligation failed", tried)


class MutantSurvived(AssertionError):
    """Every check of the mutant's obligation passed against the buggy implementation."""


def assert_killed(contract_ref: str | Contract, mutant_id: str) -> MutantResult:
    """The generated mutant test: passes when some check of the obligation fails."""
    r = kill_mutant(contract_ref, mutant_id)
    rec = _RECORDING.get()
    if rec is not None:
        rec.mutant = r
    if not r.killed:
        raise MutantSurvived(f"{mutant_id} survived: {', '.join(r.tried) or 'no check ran'} "
                             "all passed against the mutant")
    return r
