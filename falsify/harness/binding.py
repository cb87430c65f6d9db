"""`module:function` → the callable, imported once per process: the one resolver behind
backend bindings, mutant overrides, `build:` input builders and probe/proof targets; and which
`module:function` an equation is bound to on a backend, `--bind` and mutant overrides
included. It lies below the case builder (falsify/harness/cases.py), the backend caller
(falsify/harness/backends.py) and the fingerprints (falsify/harness/fingerprint.py), which
each need it; light enough that `pv coverage` reads bindings without importing hypothesis."""

from __future__ import annotations

from contextlib import contextmanager

from falsify.harness import handover
from falsify.harness.model import Contract
from falsify.harness.validate import resolve_binding

_cache: dict[str, object] = {}


class BindingError(Exception):
    pass


def resolve(ref: str):
    if ref in _cache:
        return _cache[ref]
    fn, err = resolve_binding(ref, allow_import=True)
    if err:
        raise BindingError(err[1])
    _cache[ref] = fn
    return fn


_overrides: dict[str, str] = {}


def active_overrides() -> dict[str, str]:
    """The run's `--bind` overrides (from the run manifest), then those set by `overriding`
    (mutants), which win."""
    m = handover.active()
    out = dict(m.binds) if m is not None else {}
    out.update(_overrides)
    return out


@contextmanager
def overriding(key: str, ref: str):
    """Temporarily bind `equation.backend` (or `contract:equation.backend`) to `ref`."""
    old = _overrides.get(key)
    _overrides[key] = ref
    try:
        yield
    finally:
        if old is None:
            _overrides.pop(key, None)
        else:
            _overrides[key] = old


def active_policy(contract: Contract, equation: str, backend: str) -> dict:
    """The API policy a bound third-party function declares for `equation` on `backend` (the
    run manifest's `policy`, keyed as `binds` are): `dtypes` it accepts beyond the contract's,
    `zero_size` rules that replace the contract's. Empty for the contract's own functions."""
    m = handover.active()
    if m is None or not m.policy:
        return {}
    for key in (f"{contract.id}:{equation}.{backend}", f"{equation}.{backend}"):
        if key in m.policy:
            return m.policy[key]
    return {}


def active_pins(contract: Contract, equation: str) -> dict:
    """The input arguments a bound equation variant fixes (its `pins`), for the checks of
    `equation`: a conformance binding that follows a variant names it in its policy, on
    whichever backend it binds. Empty outside such a run."""
    m = handover.active()
    if m is None or not m.policy:
        return {}
    out = {}
    for key, pol in m.policy.items():
        eq_key = key.rsplit(".", 1)[0]
        if eq_key in (f"{contract.id}:{equation}", equation):
            out.update(pol.get("pins") or {})
    return out


def binding_ref(contract: Contract, equation: str, backend: str) -> tuple[str, bool]:
    """(module:function, overridden?) for an equation on a backend."""
    ov = active_overrides()
    for key in (f"{contract.id}:{equation}.{backend}", f"{equation}.{backend}"):
        if key in ov:
            return ov[key], True
    eq = contract.equations.get(equation)
    if eq is None:
        raise BindingError(f"{contract.id}: no equation {equation!r}")
    if backend not in eq.bindings:
        raise BindingError(f"{contract.id}: equation {equation!r} has no {backend!r} binding "
                           f"(bound: {', '.join(eq.bindings) or 'none'})")
    return eq.bindings[backend], False
