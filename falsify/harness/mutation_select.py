"""Which checks can kill a mutant: those whose execution reaches the mutated function.

The fingerprint (falsify.harness.fingerprint) already follows, for each check on each backend,
every top-level statement its execution reaches, by (module, name); a check reaches a method
when it reaches the method's class. A module the fingerprint had to count whole (a dynamic
import) is reached in every name. A function no check reaches is a blind spot: its mutants are
reported "not reached", never run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from falsify.harness import fingerprint
from falsify.harness.model import Contract
from falsify.harness.plan import backends_of

CheckKey = tuple[str, str, str]  # (contract id, check id, backend): one generated test group
SYMBOLIC = ("z3", "crosshair")


@dataclass
class Reach:
    """(module, top-level name) -> the checks that reach it; module name -> its file."""

    names: dict[tuple[str, str], set[CheckKey]] = field(default_factory=lambda: defaultdict(set))
    whole: dict[str, set[CheckKey]] = field(default_factory=lambda: defaultdict(set))
    files: dict[str, Path] = field(default_factory=dict)
    obligations: dict[CheckKey, str] = field(default_factory=dict)
    # (module, top-level name) -> the checks that call it by name (their binding or `run:`),
    # not only through something else: a mutant of it is likeliest to fail those
    direct: dict[tuple[str, str], set[CheckKey]] = field(
        default_factory=lambda: defaultdict(set))

    def checks(self, module: str, top_level: str) -> set[CheckKey]:
        return self.names.get((module, top_level), set()) | self.whole.get(module, set())

    def module_of(self, path: Path) -> str | None:
        path = path.resolve()
        return next((m for m, f in sorted(self.files.items()) if f == path), None)


def _backends(c: Contract, check, backends: tuple[str, ...]) -> list[str]:
    """The backends the generator writes a test of `check` for (plan.backends_of: a parity
    check has none on the reference, a training probe only torch), among `backends`. Every
    backend an equation binds would name tests that do not exist, so no unmutated result could
    ever stand for them."""
    return [b for b in backends_of(c, check) if b in backends]


def reach(contracts: list[Contract], backends: tuple[str, ...]) -> Reach:
    # the fingerprint's own walk (its private parts on purpose: one definition of "reaches")
    roots = fingerprint._roots()
    out = Reach()
    for c in contracts:
        for check in c.checks:
            if check.spec is None:
                continue
            for b in _backends(c, check, backends):
                key = (c.id, check.id, b)
                out.obligations[key] = check.obligation or ""
                refs = fingerprint._refs(c, b, check, None)
                for ref in refs:
                    module, _, name = ref.partition(":")
                    out.direct[(module, name.split(".")[0])].add(key)
                parts = fingerprint._Closure(roots).run(refs)
                for module, name in parts:
                    if name == "*":
                        out.whole[module].add(key)
                    elif name:
                        out.names[(module, name.split("#")[0])].add(key)
                    f = fingerprint._module_file(module, roots)
                    if f is not None:
                        out.files[module] = f.resolve()
    return out
