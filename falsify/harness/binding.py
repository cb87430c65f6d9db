"""`module:function` → the callable, imported once per process: the one resolver behind
backend bindings, mutant overrides, `build:` input builders and probe/proof targets. It lies
below both the case builder (falsify/harness/cases.py) and the backend caller
(falsify/harness/backends.py), which each need it."""

from __future__ import annotations

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
