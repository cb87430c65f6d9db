"""`pv audit`: the traceability chain of one contract, with every broken link listed.

reference → equation → obligation → checks → bindings → last results → mutants.
A gap is anything that breaks the chain: no reference, an equation no obligation applies to or
with no optimized binding, an obligation with no executable check, a required run with no
passing current result, a contract with no mutants, a mutant not killed.

`check_gaps` needs no ledger: it reads what the contract declares and what its bindings are.
Each equation × backend it binds must be executed by some check, and an equation with a
backward must have a gradient check on every backend it binds — a forward parity check says
nothing about a backward ("forward checked, backward not"). An equation has a backward when a
gradient check differentiates it, when the contract has `<equation>_backward`, or when a
torch/triton binding runs through a torch.autograd.Function.

`invariance_findings` (warnings): a kernel contract runs the determinism and batch_invariance
kinds or declares them inapplicable with the reason (`metadata.inapplicable`); `declared` says
which backends a contract holds to the same bits, which to a declared bound, or why not.

`export_findings` (warnings): every public function an implementation exports is bound to some
equation or named by a check, or it is private. It reads the kernel's own modules
(`<package>.torch.<kernel>`, `<package>.triton.<kernel>`). A module's exports are its `__all__`,
Python's own declaration of a module's public API: each callable listed there must be bound,
named by a check (a static check's kernel, a `run:` probe's argument, ...), or called by one of
the contract's bindings (directly, or through other functions and classes of the kernel's
modules: a binding that is a thin wrapper over the entry point the application calls, so every
check of the binding runs it); a name in `__all__` that the module does not define is a finding
too, and helpers left out of `__all__` are not candidates. A module without `__all__` is held to
the older rule: every public (no leading underscore) callable defined in it must be bound or
named by a check — bind it, make it private, or declare the module's API in `__all__`.
"""

from __future__ import annotations

import dis
import inspect
import types
from dataclasses import dataclass, field

from falsify.harness.coverage import NEEDS_GPU, obligation_status, run_state, skipped_for_gpu
from falsify.harness.ledger import mutation_score, run_key
from falsify.harness.model import Contract
from falsify.harness.plan import backends_of, equation_of, runs

# kinds that do not execute an equation on a backend: a proof, an offline compile
_NOT_EXECUTING = {"symbolic", "static"}
OPTIMIZED = ("torch", "triton")


@dataclass
class Audit:
    contract: str
    chain: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    matrix: list[dict] = field(default_factory=list)  # see `matrix`
    fingerprint_fallbacks: list[dict] = field(default_factory=list)  # see `fingerprint_lines`

    def as_text(self) -> str:
        head = f"{self.contract}: {'OK' if not self.gaps else f'{len(self.gaps)} gap(s)'}"
        if self.warnings:
            head += f", {len(self.warnings)} warning(s)"
        body = [f"  {line}" for line in self.chain]
        gaps = [f"  GAP {g}" for g in self.gaps]
        warns = [f"  WARN {w}" for w in self.warnings]
        return "\n".join([head, *body, *gaps, *warns])

    def as_dict(self) -> dict:
        return {"contract": self.contract, "chain": self.chain, "gaps": self.gaps,
                "warnings": self.warnings, "matrix": self.matrix,
                "fingerprint_fallbacks": self.fingerprint_fallbacks}


def _resolve(ref: str):
    from falsify.harness.validate import resolve_binding

    fn, _ = resolve_binding(ref)  # an unresolvable binding is V012's finding, not audit's
    return fn


def _autograd_class(fn, depth: int = 2) -> str | None:
    """The torch.autograd.Function subclass a binding runs through: looked up among the
    globals its code names, following plain functions of the same module `depth` calls deep
    (a binding usually validates, then calls `SomeFunction.apply`)."""
    code, env = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if code is None or env is None:
        return None
    try:
        import torch
    except ImportError:
        return None
    if {"no_grad", "inference_mode"} & set(code.co_names):
        return None  # runs without autograd: a forward-only view (e.g. a difference of two)
    if "autograd" in code.co_names and {"grad", "backward"} & set(code.co_names):
        return None  # calls autograd itself: its output is already a derivative
    # global loads only: co_names also holds attribute names (F.silu is not the global silu)
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for name in sorted(names):
        obj = env.get(name)
        if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
            return obj.__name__
        if (depth > 0 and callable(obj) and getattr(obj, "__globals__", None) is env
                and obj is not fn):
            found = _autograd_class(obj, depth - 1)
            if found:
                return found
    return None


def _executed(c: Contract) -> dict[str, dict[str, set[str]]]:
    """equation → backend → the check kinds that execute it there."""
    out: dict[str, dict[str, set[str]]] = {}
    for t in c.checks:
        if not t.spec or t.kind in _NOT_EXECUTING:
            continue
        for eq in _equations_run(c, t):
            for b in backends_of(c, t):
                kinds = out.setdefault(eq, {}).setdefault(b, set())
                kinds.add(t.kind)
                if t.kind == "training" and t.spec.get("wrt"):
                    kinds.add("gradient")  # the probe differentiates and judges the gradient
        if t.kind == "gradient" and t.spec.get("backward"):
            # the reference backward runs on every gradient check (as the oracle)
            out.setdefault(t.spec["backward"], {}).setdefault("reference", set()).add("oracle")
        if t.kind == "roundtrip" and t.spec.get("inverse"):
            # the inverse runs on the check's own backend, and the relation judges it
            for b in backends_of(c, t):
                out.setdefault(t.spec["inverse"], {}).setdefault(b, set()).add(t.kind)
    return out


def _equations_run(c: Contract, t) -> list[str | None]:
    """The equations a check executes: a training check (a probe that runs a whole model or
    loop) every equation its obligation applies to, unless it names one; any other check the
    one `equation_of` gives."""
    ob = c.obligation(t.obligation) if t.obligation else None
    if t.kind == "training" and not t.spec.get("equation") and ob and ob.applies_to:
        return list(ob.applies_to)
    return [equation_of(c, t)]


def backward_reason(c: Contract, name: str, resolve: bool = True) -> str | None:
    """Why equation `name` has a backward (None: it has none, or it is itself a backward)."""
    grads = [t for t in c.checks if t.kind == "gradient"]
    if any(t.spec.get("backward") == name for t in grads):
        return None
    diff = [t.id for t in grads if equation_of(c, t) == name]
    if diff:
        return f"{', '.join(diff)} differentiate{'s' if len(diff) == 1 else ''} it"
    if f"{name}_backward" in c.equations:
        return f"the contract declares {name}_backward"
    if resolve:
        for b in OPTIMIZED:
            ref = c.equations[name].bindings.get(b)
            cls = _autograd_class(_resolve(ref)) if ref else None
            if cls:
                return f"its {b} binding runs the autograd.Function {cls}"
    return None


def check_gaps(c: Contract, resolve: bool = True) -> list[str]:
    """Equation × backend pairs without a check of a kind they need (no ledger needed)."""
    if c.mode != "native":
        return []
    gaps = []
    executed = _executed(c)
    for name, eq in c.equations.items():
        runs = executed.get(name, {})
        for b in OPTIMIZED:
            if b in eq.bindings and not runs.get(b):
                gaps.append(f"equation {name} on {b}: bound, but no check executes it")
        why = backward_reason(c, name, resolve)
        if not why:
            continue
        for b in (b for b in ("reference", *OPTIMIZED) if b in eq.bindings):
            if "gradient" not in runs.get(b, set()):
                kinds = ", ".join(sorted(runs.get(b, set()))) or "none"
                gaps.append(f"equation {name} on {b}: has a backward ({why}) but no gradient "
                            f"check (checks there: {kinds}): forward checked, backward not")
        gaps += _undifferentiated_outputs(c, name, eq)
    return gaps


def _undifferentiated_outputs(c: Contract, name: str, eq) -> list[str]:
    """A later named output of an equation with a backward that no gradient check
    differentiates on a backend binding it, unless declared `non_differentiable`: the gap that
    let a dropped dlse (attention's lse) pass every o-only check."""
    from falsify.harness.plan import output_index

    done: dict[str, set[int]] = {}
    for t in c.checks:
        if t.kind != "gradient" or equation_of(c, t) != name:
            continue
        try:
            sel = {output_index(eq, e) for e in t.spec.get("outputs") or [0]}
        except ValueError:  # V018 reports it
            continue
        for b in backends_of(c, t):
            done.setdefault(b, set()).update(sel)
    gaps = []
    for k, out in enumerate(eq.outputs[1:], start=1):
        if out in eq.non_differentiable:
            continue
        for b in (b for b in ("reference", *OPTIMIZED) if b in eq.bindings):
            if k not in done.get(b, set()):
                gaps.append(f"equation {name} on {b}: output {out!r} is differentiable but no "
                            "gradient check differentiates it: name it in a gradient check's "
                            "`outputs`, or declare it non_differentiable")
    return gaps


def _named(raw) -> set[str]:
    """Every `module:attribute` string in a contract fragment."""
    if isinstance(raw, dict):
        return set().union(*(_named(v) for v in raw.values())) if raw else set()
    if isinstance(raw, list):
        return set().union(*(_named(v) for v in raw)) if raw else set()
    return {raw} if isinstance(raw, str) and ":" in raw and " " not in raw else set()


def _defined_in(obj) -> str | None:
    # a @triton.jit kernel wraps the Python function it was defined as
    inner = getattr(obj, "fn", None)
    return getattr(inner if callable(inner) else obj, "__module__", None)


def _loaded_globals(code: types.CodeType) -> set[str]:
    """The global names a code object loads, nested functions and comprehensions included."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _loaded_globals(const)
    return names


def _reached(roots, modules: set[str]) -> dict[int, object]:
    """What the roots' code loads as globals (id -> object), following the functions and
    classes defined in `modules` that it reaches: a binding's own helpers, the methods of a
    class it instantiates, an autograd.Function's forward and backward. Static and generous: a
    global the code loads counts as called whichever branch loads it; that the binding calls it
    on every check path is what the note beside the module's `__all__` claims."""
    reached: dict[int, object] = {}
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            for member in vars(obj).values():
                member = getattr(member, "__func__", getattr(member, "fget", member))
                if callable(member):
                    todo.append(member)
            continue
        fn = inspect.unwrap(obj) if callable(obj) else obj
        code, env = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
        if code is None or env is None:
            continue
        for name in _loaded_globals(code):
            target = env.get(name)
            if target is None:
                continue
            reached[id(target)] = target
            if callable(target) and _defined_in(target) in modules:
                todo.append(target)
    return reached


def export_findings(c: Contract) -> list[str]:
    """The kernel's torch/triton modules' exports that the contract leaves unchecked (see the
    module docstring): with `__all__`, its callables that no binding and no check names and no
    binding calls, and its names the module does not define; without, every public callable
    defined there that no binding and no check names."""
    import importlib

    if c.mode != "native":
        return []
    # bindings, and what checks name (a static check's kernel, a probe); a mutant's
    # replacement is not a binding
    named = set().union(*(set(eq.bindings.values()) for eq in c.equations.values()),
                        *(_named(t.spec) for t in c.checks if t.spec))
    # the kernel's own implementation modules, `<package>.<backend>.<kernel>`
    # (falsify/kernels/torch/
    # softmax.py): an application module that a loop contract binds exports far more
    modules = sorted({mod for eq in c.equations.values() for b, ref in eq.bindings.items()
                      if b in OPTIMIZED and ":" in ref
                      for mod in [ref.split(":", 1)[0]]
                      if mod.split(".")[-2:] == [b, c.kernel or ""]})
    loaded = {}
    for mod in modules:
        try:
            loaded[mod] = importlib.import_module(mod)
        except Exception:  # noqa: BLE001 — an unimportable binding is V012's finding
            continue
    roots = [fn for eq in c.equations.values() for b, ref in eq.bindings.items()
             if b in OPTIMIZED and ref.split(":", 1)[0] in loaded
             for fn in [_resolve(ref)] if fn is not None]
    reached: dict[int, object] | None = None  # computed once, for the first module with __all__
    out = []
    for mod, m in loaded.items():
        if not hasattr(m, "__all__"):
            for n, obj in vars(m).items():
                if (n.startswith("_") or not callable(obj) or _defined_in(obj) != mod
                        or f"{mod}:{n}" in named):
                    continue
                out.append(f"{mod}:{n} is public but bound to no equation of {c.id}: bind it, "
                           f"rename it _{n}, or declare the module's API in __all__")
            continue
        if reached is None:
            reached = _reached(roots, set(loaded))
        for n in m.__all__:
            if not isinstance(n, str) or not hasattr(m, n):
                out.append(f"{mod}:{n} is public (in __all__) but {mod} does not define it")
                continue
            obj = getattr(m, n)
            if not callable(obj) or f"{mod}:{n}" in named or id(obj) in reached:
                continue
            out.append(f"{mod}:{n} is public (in __all__) but bound to no equation of {c.id}, "
                       f"named by no check and called by no binding: bind it, or drop it from "
                       f"__all__ (and rename it _{n} unless another module imports it)")
    return out


# The check-kind matrix (`pv audit`, `pv status`, the docs pages): kinds beyond parity that a
# kernel contract runs on the backends it binds, or declares inapplicable with the reason in
# `metadata.inapplicable` (whose schema enum lists the same names).
MATRIX_KINDS = ("determinism", "batch_invariance", "dtypes", "gradgrad", "jvp", "layouts", "device",
                "compile")
# kinds whose check either holds a backend to the same bits or, with a `tolerance`, to a bound
INVARIANCE_KINDS = ("determinism", "batch_invariance")
# kinds whose check either compares a backend's derivatives with the reference (`checked`) or,
# with `expect: {error: ...}`, confirms that the backend refuses them with a clear error
DERIVATIVE_KINDS = ("gradgrad", "jvp")


def _labels(kind: str) -> tuple[str, ...]:
    if kind in INVARIANCE_KINDS:
        return ("bitwise", "bounded")
    if kind == "compile":
        return ("forward and backward", "forward")
    if kind in DERIVATIVE_KINDS:
        return ("checked", "refuses")
    return ("checked",)


def _label(kind: str, t) -> str:
    if kind in INVARIANCE_KINDS:
        return "bounded" if "tolerance" in t.spec else "bitwise"
    if kind in DERIVATIVE_KINDS and (t.spec.get("expect") or {}).get("error"):
        return "refuses"
    if kind == "compile":  # the backward compiled too, or the forward only
        return "forward and backward" if t.spec.get("gradient") else "forward"
    return "checked"


def declared(c: Contract, kind: str) -> dict | None:
    """For a kind in MATRIX_KINDS: {label: backends} over the checks that run it (for the
    invariance kinds `bitwise` and `bounded`, the latter when the kernel says it is not
    invariant and the check enforces a bound; for gradgrad and jvp `checked` and `refuses`,
    the latter where the check confirms a clear error; for compile `forward and backward` when
    the check names a gradient check, else `forward`; `checked` for the others), or
    `inapplicable` with the reason; None when the contract neither runs the kind nor says why
    not."""
    if kind in c.inapplicable:
        return {"inapplicable": c.inapplicable[kind]}
    out = {k: set() for k in _labels(kind)}
    for t in c.checks:
        if t.kind == kind:
            out[_label(kind, t)] |= {r.backend for r in runs(c, t)}
    if not set().union(*out.values()):
        return None
    return {k: sorted(v) for k, v in out.items()}


def invariance_lines(c: Contract) -> tuple[list[str], list[str]]:
    """(chain lines, warnings) for the matrix kinds of a kernel contract."""
    chain, warnings = [], []
    if c.mode != "native" or not c.kernel:
        return chain, warnings
    for kind in MATRIX_KINDS:
        d = declared(c, kind)
        if d is None:
            warnings.append(f"{kind}: no check runs it and metadata.inapplicable does not say "
                            "why not")
        elif "inapplicable" in d:
            chain.append(f"{kind}: inapplicable — {d['inapplicable']}")
        else:
            parts = [f"{k} on {', '.join(v)}" for k, v in d.items() if v]
            chain.append(f"{kind}: {'; '.join(parts)}")
    return chain, warnings


# a matrix cell: the worst state over the kind's runs on that equation × backend
_CELL_ORDER = ("failing", "stale", "skipped", "not-run", "needs-gpu", "covered")
_CELL_TEXT = {"failing": "FAILED", "stale": "stale", "skipped": "skipped", "not-run": "not run",
              "needs-gpu": "not run: no GPU", "covered": "passed"}


def matrix(c: Contract, ledger: dict | None) -> list[dict]:
    """One row per equation × backend a matrix-kind check runs on (and one per inapplicable
    kind): {equation, backend, cells: {kind: state}}. A state is `passed`, `FAILED`, `stale`,
    `skipped`, `not run` (from the ledger; `declared` without one), `inapplicable: <reason>`,
    or absent when no check of that kind runs there."""
    rows: dict[tuple[str, str], dict[str, list[str]]] = {}
    for t in c.checks:
        if t.kind not in MATRIX_KINDS or not t.spec:
            continue
        eq = equation_of(c, t)
        for r in runs(c, t):
            if ledger is None:
                state = "declared"
            else:
                key = run_key(dict(contract=c.id, check=t.id, backend=r.backend,
                                   variant=r.variant))
                e = ledger["runs"].get(key)
                state = run_state(c, e, t)
                if state == "skipped" and skipped_for_gpu(e):
                    state = "needs-gpu"
            rows.setdefault((eq, r.backend), {}).setdefault(t.kind, []).append(state)
    out = []
    for (eq, b), kinds in sorted(rows.items()):
        cells = {}
        for kind, states in kinds.items():
            if "declared" in states:
                cells[kind] = "declared"
            else:
                cells[kind] = _CELL_TEXT[next(s for s in _CELL_ORDER if s in states
                                              or s == "covered")]
        out.append({"equation": eq, "backend": b, "cells": cells})
    for kind in MATRIX_KINDS:
        if kind in c.inapplicable:
            out.append({"equation": "*", "backend": "*",
                        "cells": {kind: f"inapplicable: {c.inapplicable[kind]}"}})
    return out


def matrix_lines(c: Contract, ledger: dict | None) -> list[str]:
    """The matrix as chain lines: `matrix <equation>/<backend>: kind=state, ...`."""
    if c.mode != "native" or not c.kernel:
        return []
    return [f"matrix {r['equation']}/{r['backend']}: "
            + ", ".join(f"{k}={v}" for k, v in r["cells"].items()) for r in matrix(c, ledger)]


def _some(names: list[str], shown: int = 4) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def fingerprint_lines(c: Contract) -> tuple[list[str], list[dict]]:
    """How each check's results are fingerprinted: by the functions and classes it reaches,
    except where a reference could not be followed statically and a whole module counts (an
    edit anywhere in it stales those results). One line per such module, with the reason and
    the checks it affects; neither a gap nor a warning, since the results stay correct, only
    less durable."""
    from falsify.harness.fingerprint import fallbacks

    found = fallbacks(c)
    by_reason: dict[str, tuple[set[str], set[str]]] = {}  # reason -> (modules, checks)
    for check, module, why in found:
        modules, checks = by_reason.setdefault(why, (set(), set()))
        modules.add(module)
        checks.add(check)
    whole = {check for check, _, _ in found}
    lines = [f"fingerprint: {len(c.checks) - len(whole)} of {len(c.checks)} check(s) by the "
             f"functions they reach" + (", the rest fall back to whole modules:" if whole else "")]
    for why, (modules, checks) in sorted(by_reason.items()):
        lines.append(f"    whole {_some(sorted(modules))} ({why}): {_some(sorted(checks))}")
    return lines, [{"check": k, "module": m, "reason": w} for k, m, w in found]


def audit(c: Contract, ledger: dict) -> Audit:
    a = Audit(c.id)
    if c.references:
        for r in c.references:
            a.chain.append(f"reference: {r}")
    else:
        a.gaps.append("no metadata.references: the equations cite no source")
    applied = {e for o in c.obligations for e in o.applies_to}
    applied |= {equation_of(c, t) for t in c.checks if t.spec}
    for name, eq in c.equations.items():
        binds = ", ".join(f"{b}={ref}" for b, ref in eq.bindings.items()) or "none"
        a.chain.append(f"equation {name}: bindings {binds}")
        if name not in applied and "all" not in applied:
            a.gaps.append(f"equation {name}: no obligation applies to it")
        if not eq.bindings:
            a.gaps.append(f"equation {name}: no bindings, nothing executes it")
        elif "reference" not in eq.bindings:
            a.gaps.append(f"equation {name}: no reference binding")
    for o in c.obligations:
        st = obligation_status(c, o.id, ledger)
        checks = c.checks_for(o.id)
        a.chain.append(f"obligation {o.id} ({o.type}): {st.status}; checks "
                       f"{', '.join(t.id for t in checks) or 'none'}")
        for r in st.runs:
            a.chain.append(f"    {r['check']} {r['backend']}/{r['variant']}: {r['state']}"
                           + (f" — {r['message']}" if r.get("message") else ""))
        for m in st.mutants:
            a.chain.append(f"    mutant {m['id']}: {m['state']}"
                           + (f" (killed by {m['killed_by']})" if m.get("killed_by") else ""))
        if not checks:
            a.gaps.append(f"{o.id}: no executable check")
        if st.status == NEEDS_GPU:  # reported, not a gap: no machine here could close it
            a.warnings += [f"{o.id}: {r}" for r in st.reasons]
        else:
            a.gaps += [f"{o.id}: {r}" for r in st.reasons if r != "no executable check"]
    if c.mode == "native" and not c.mutants:
        a.gaps.append("no mutants: nothing shows the checks can fail")
    a.gaps += check_gaps(c)
    chain, warnings = invariance_lines(c)
    a.chain += chain + matrix_lines(c, ledger)
    a.matrix = matrix(c, ledger) if c.mode == "native" and c.kernel else []
    a.warnings += warnings + export_findings(c)
    fp_lines, a.fingerprint_fallbacks = fingerprint_lines(c)
    a.chain += fp_lines
    lines, warnings = mutation_lines(c, ledger)
    a.chain += lines
    a.warnings += warnings
    return a


def mutation_lines(c: Contract, ledger: dict) -> tuple[list[str], list[str]]:
    """Beside coverage, what `falsify mutate` recorded (the ledger's `mutations` section) for
    the mutants this contract's checks ran: the count of each outcome and the mutation score,
    and a warning per survivor, as the obligations that ran it and missed it. A survivor is a
    finding to judge (sharpen a check, or declare it equivalent), not yet a gap."""
    mine = [e for e in (ledger.get("mutations") or {}).values()
            if any(k.split(" ", 1)[0] == c.id for k in e.get("checks") or ())]
    if not mine:
        return ["mutation (falsify mutate): no results for this contract's checks"], []
    statuses = [e.get("status") for e in mine]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(sorted(statuses)))
    sc = mutation_score(statuses)
    line = (f"mutation (falsify mutate): {len(mine)} mutant(s) its checks ran: {counts}; "
            f"score {'-' if sc is None else f'{sc:.0%}'}")
    warnings = [f"mutant {e['id']} survived ({e.get('description', '')}): "
                + ", ".join(o.split(" ", 1)[-1] for o in e.get("obligations") or ()
                            if o.split(" ", 1)[0] == c.id) + " ran it and missed it"
                for e in mine if e.get("status") == "survived"]
    return [line], warnings


def audit_checks(c: Contract) -> Audit:
    """The ledger-free part of the audit: check gaps (failing), unbound exports and kernels
    silent on the invariance kinds (warnings)."""
    chain, warnings = invariance_lines(c)
    fp_lines, fp = fingerprint_lines(c)
    return Audit(c.id, chain=chain + fp_lines, gaps=check_gaps(c),
                 warnings=warnings + export_findings(c), fingerprint_fallbacks=fp)
