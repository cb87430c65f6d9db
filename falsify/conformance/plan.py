"""Which checks judge a binding, and how bindings share pytest sessions.

A binding is judged by the contract's torch-backend checks of the equations it binds — the
checks of an equation it does not bind would run our own function and say nothing about the
library — less the checks it declares not claimed. Bindings of different contracts share a
pytest session (one worker start, warm imports); bindings of one contract go into successive
sessions ("rounds").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from falsify.harness.case_spec import pin_admitted, pin_domain
from falsify.harness.ledger import run_key
from falsify.harness.plan import equation_of, judges, runs

BACKEND = "torch"


@dataclass(frozen=True)
class Planned:
    check: object  # harness.model.Check
    variant: str
    key: str  # the ledger run key
    judges: str  # math | policy


def planned(contract, binding) -> list[Planned]:
    """The runs that judge `binding` (a registry.Binding) of `contract`."""
    out = []
    for t in contract.checks:
        if equation_of(contract, t) not in binding.binds or t.id in binding.not_claimed:
            continue
        for r in runs(contract, t):
            if r.backend == BACKEND:
                key = run_key(dict(contract=contract.id, check=t.id, backend=r.backend,
                                   variant=r.variant))
                out.append(Planned(t, r.variant, key, judges(contract, t)))
    return out


def unknown_checks(contract, binding) -> list[str]:
    """`not_claimed` and `findings` keys that name no check of the contract (a typo would hide
    nothing, but would keep a stale classification alive)."""
    ids = {t.id for t in contract.checks}
    keys = list(binding.not_claimed) + [k.split("/", 1)[0] for k in binding.findings]
    return sorted(k for k in set(keys) if k not in ids)


def equation_variant(contract, binding):
    """(equation, its EquationVariant) the binding follows, or None. A name no bound equation
    declares is a declaration error (ValueError), never ignored."""
    if not binding.variant:
        return None
    for eq in binding.binds:
        v = contract.equations[eq].variants.get(binding.variant) if eq in contract.equations \
            else None
        if v is not None:
            return eq, v
    declared = sorted({f"{eq}: {n}" for eq in binding.binds if eq in contract.equations
                       for n in contract.equations[eq].variants})
    raise ValueError(f"variant {binding.variant!r} is not declared by the equations it binds "
                     f"({', '.join(declared) or 'none declares a variant'})")


def outside_variant(contract, binding) -> dict[str, str]:
    """Check id -> why it is not applicable, for the checks of the bound equations whose input
    lies outside the followed variant's domain: an argument the variant pins is fixed there to
    other values (a mean-only loss judged by checks of per-token losses)."""
    found = equation_variant(contract, binding)
    if not found or not found[1].pins:
        return {}
    out = {}
    for t in contract.checks:
        if equation_of(contract, t) not in binding.binds or not t.spec:
            continue
        args = (contract.inputs.get(t.spec.get("input", "")) or {}).get("args") or {}
        for arg, value in found[1].pins.items():
            a = args.get(arg)
            if a is not None and not pin_admitted(a, value):
                out[t.id] = (f"outside variant {binding.variant!r}: its input fixes {arg} to "
                             f"{pin_domain(a)}, the variant to {value!r}")
                break
    return out


def judged_binding(contract, binding):
    """The binding as it is judged: its declared not-claimed checks, and those outside the
    variant it follows."""
    extra = outside_variant(contract, binding)
    if not extra:
        return binding
    return dataclasses.replace(binding, not_claimed={**extra, **binding.not_claimed})


def session_binds(contract, binding) -> tuple[dict, dict]:
    """The manifest's `binds` and `policy` for one binding: its equations bound to the library
    (and, for a variant, each reference it declares in place of that equation's reference);
    its declared policy with the variant's pins on every equation it binds."""
    found = equation_variant(contract, binding)
    pins = found[1].pins if found else {}
    binds = {bind_key(contract.id, eq): ref for eq, ref in binding.binds.items()}
    if found:  # each equation declaring the variant (a forward and its backward) may give its
        for name, eq in contract.equations.items():  # own reference
            v = eq.variants.get(binding.variant)
            if v is not None and v.reference:
                binds[f"{contract.id}:{name}.reference"] = v.reference
    policy = {bind_key(contract.id, eq): {**binding.policy, **({"pins": pins} if pins else {})}
              for eq in binding.binds}
    return binds, policy


def bind_key(contract_id: str, equation: str) -> str:
    """The manifest key of a bound equation: contract-qualified, so that bindings of two
    contracts whose equations share a name can run in one session."""
    return f"{contract_id}:{equation}.{BACKEND}"


def rounds(items: list[tuple]) -> list[list[tuple]]:
    """(library, binding) pairs into pytest sessions, in order: the n-th binding of every
    contract in session n. Two bindings of one contract never share a session, even when they
    bind different equations: a check of one equation may call another equation's binding (a
    round trip quantizes with one function and dequantizes with the other), and would then
    judge the other binding's function where the contract's own was meant."""
    by_contract: dict[str, list[tuple]] = {}
    for lib, b in items:
        by_contract.setdefault(b.contract, []).append((lib, b))
    depth = max((len(v) for v in by_contract.values()), default=0)
    return [[v[i] for v in by_contract.values() if i < len(v)] for i in range(depth)]
