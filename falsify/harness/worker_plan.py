"""How many pytest-xdist workers a `falsify run` starts: as many as `-n` asks, or none (the
run stays in the calling process) when the work it has left is too small to pay for them.

A worker is a fresh interpreter that imports torch, hypothesis and the generated modules
before its first test, and is torn down after its last: measured on 2 cores, a run of two
0.4-second checks took 13.4 s on two workers and 7.4 s in its own process, where torch is
already imported. Workers save half the work at best (two of them), so below SMALL_WORK_S
seconds of expected work they cost more than they save.

The expected work is the tests the run will keep (the plan's checks and mutants on the kept
backends, less what `--changed` reuses, and those `-k` selects), each at the seconds the run's
ledger recorded for it under a profile that draws as many examples (not the committed evidence,
whose thorough seconds are a hundred times a fast run's); a test never timed counts as the
median timed one, or UNTIMED_S when none is. `-k` is matched against each test's function and module
names and its marker, as pytest matches it against those and the names of the directories
above: an estimate, which decides only how fast the run goes, never what it runs or finds.
"""

from __future__ import annotations

from dataclasses import dataclass

from falsify.harness.generate import generated_test_name, module_name
from falsify.harness.ledger import mutant_key, run_key
from falsify.harness.plan import runs

SMALL_WORK_S = 12.0
UNTIMED_S = 2.0


@dataclass(frozen=True)
class Work:
    tests: int  # generated tests the run keeps
    seconds: float  # their expected duration
    timed: int  # how many of them have a recorded duration


def planned(contracts, keep: list[str], select: str, reuse: list[str]) -> list[tuple]:
    """(module file name, test function name, marker name) of every generated test the run
    keeps, before `-k`: the generator's names (falsify.harness.generate) for the plan's runs and
    mutants, filtered by backend, `select` and reuse as the pytest plugin filters them."""
    reused = set(reuse)
    out = []
    for c in contracts:
        mod = module_name(c.id)
        for t in c.checks if select != "mutants" else []:
            for r in runs(c, t):
                key = run_key(dict(contract=c.id, check=t.id, backend=r.backend,
                                   variant=r.variant))
                if r.backend in keep and "run:" + key not in reused:
                    out.append((mod, generated_test_name(t.id, r.backend, r.variant), "falsify"))
        for m in c.mutants if select != "checks" else []:
            key = mutant_key(dict(contract=c.id, mutant=m.id))
            if m.backend in keep and "mutant:" + key not in reused:
                out.append((mod, generated_test_name(m.id), "falsify_mutant"))
    return out


def selected(tests: list[tuple], k: str | None) -> list[tuple]:
    """The tests `-k` keeps, matched as pytest matches (case-insensitive substrings of the
    names in scope) on the names this plan knows; every test when the expression cannot be read
    here (pytest will say why)."""
    if not k:
        return tests
    try:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(k)
    except Exception:  # noqa: BLE001 - pytest reports a bad -k; the estimate takes everything
        return tests

    def keeps(names: tuple) -> bool:
        low = [n.lower() for n in names]
        return expr.evaluate(lambda sub, **_: any(sub.lower() in n for n in low))

    return [t for t in tests if keeps(t)]


def expected(tests: list[tuple], durations: dict[str, float]) -> Work:
    """The work in `tests`, from `durations` (node id -> seconds, as the ledger records them:
    `path/test_module.py::test_function`)."""
    by_name = {}
    for nodeid, s in durations.items():
        path, _, fn = nodeid.partition("::")
        by_name[(path.rsplit("/", 1)[-1], fn)] = s
    known = [by_name[(mod, fn)] for mod, fn, _ in tests if (mod, fn) in by_name]
    typical = sorted(known)[len(known) // 2] if known else UNTIMED_S
    return Work(len(tests), sum(known) + typical * (len(tests) - len(known)), len(known))


def workers_for(asked: int, work: Work) -> int:
    """`asked` workers, or 1 (this process) when the work cannot pay for starting them."""
    if asked <= 1 or work.tests <= 1 or work.seconds < SMALL_WORK_S:
        return 1
    return min(asked, work.tests)
