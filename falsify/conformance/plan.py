"""Which checks judge a binding, and how bindings share pytest sessions.

A binding is judged by the contract's torch-backend checks of the equations it binds — the
checks of an equation it does not bind would run our own function and say nothing about the
library — less the checks it declares not claimed. Bindings of different contracts run in one
session (one worker start, warm imports); two bindings of one contract bind the same equation,
so they go into successive sessions ("rounds").
"""

from __future__ import annotations

from dataclasses import dataclass

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


def bind_key(contract_id: str, equation: str) -> str:
    """The manifest key of a bound equation: contract-qualified, so that bindings of two
    contracts whose equations share a name can run in one session."""
    return f"{contract_id}:{equation}.{BACKEND}"


def rounds(items: list[tuple]) -> list[list[tuple]]:
    """(library, binding) pairs into sessions: the n-th binding of every contract in round n."""
    by_contract: dict[str, list[tuple]] = {}
    for lib, b in items:
        by_contract.setdefault(b.contract, []).append((lib, b))
    depth = max((len(v) for v in by_contract.values()), default=0)
    return [[v[i] for v in by_contract.values() if i < len(v)] for i in range(depth)]
