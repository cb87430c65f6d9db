"""`falsify conformance [LIB...]`: the shipped contracts judged against third-party libraries.

Each library's binding set (falsify/conformance/lib_<name>.py) binds its functions to contract
equations; every binding runs its contract's torch-backend checks through the same generated
tests and pytest plugin as `falsify run --bind`, under the `ci` profile (each check's examples
fixed, the same in any checkout) unless `--thorough`. Bindings of different contracts share a
pytest session. Results go to a conformance ledger of their own (default
`.falsify/conformance-ledger.json`), never the project's coverage.

Exit codes: 0 every failed cell is classified (deviation or documented variant) and, with
`--against`, no cell changed; 1 otherwise (an unclassified failure, a finding that blames our
contract, a check that did not run, a changed cell); 2 usage error (an unknown or uninstalled
library).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from falsify.cli.run import WORKERS_HELP
from falsify.cli.session import ensure_generated, run_manifest, select_contracts
from falsify.errors import UsageError


def _libraries(names: list[str]):
    from falsify.conformance import registry

    try:
        libs = registry.libraries(names)
    except registry.RegistryError as e:
        raise UsageError(str(e)) from None
    missing = [lib for lib in libs if lib.version() is None]
    if missing:
        raise UsageError("not installed: " + ", ".join(
            f"{lib.name} (pip install {lib.distribution}, or 'falsify[{lib.extra}]')"
            for lib in missing))
    return libs


def _items(libs, only: list[str]) -> list[tuple]:
    items = [(lib, b) for lib in libs for b in lib.bindings]
    if only:
        known = {f"{lib.name}/{b.name}" for lib, b in items}
        bad = sorted(set(only) - known)
        if bad:
            raise UsageError(f"--binding {', '.join(bad)}: no such binding (known: "
                             f"{', '.join(sorted(known))})")
        items = [(lib, b) for lib, b in items if f"{lib.name}/{b.name}" in only]
    return items


def _check_declarations(items, contracts) -> None:
    from falsify.conformance.plan import equation_variant, unknown_checks

    for lib, b in items:
        c = contracts[b.contract]
        where = f"falsify.conformance.lib_{lib.name}: binding {b.name!r} of {c.id}"
        eqs = sorted(set(b.binds) - set(c.equations))
        bad = unknown_checks(c, b)
        if eqs or bad:
            raise UsageError(f"{where} names " + "; ".join(
                ([f"equations {eqs} the contract lacks"] if eqs else [])
                + ([f"checks {bad} the contract lacks"] if bad else [])))
        try:
            equation_variant(c, b)
        except ValueError as e:
            raise UsageError(f"{where}: {e}") from None


def _run_round(proj, round_items, contracts, profile: str, workers: int, console) -> list:
    """One pytest session for bindings of distinct contracts; their ledger records."""
    from falsify.cli.run import run_pytest
    from falsify.conformance import plan
    from falsify.harness import conformance as matrix
    from falsify.harness.generate import generated_test_name, module_name

    # checks outside a followed variant's domain are not applicable, like the declared ones
    round_items = [(lib, plan.judged_binding(contracts[b.contract], b)) for lib, b in round_items]
    live = [(lib, b) for lib, b in round_items if not b.needs_gpu]
    records = [matrix.gpu_record(lib, b, contracts[b.contract], profile)
               for lib, b in round_items if b.needs_gpu]
    if not live:
        return records
    cs = [contracts[b.contract] for _, b in live]
    binds, policy, only, tests, planned = {}, {}, [], [], {}
    for lib, b in live:
        c = contracts[b.contract]
        b_binds, b_policy = plan.session_binds(c, b)
        binds.update(b_binds)
        policy.update(b_policy)
        planned[(lib.name, b.name)] = ps = plan.planned(c, b)
        only += ["run:" + p.key for p in ps]
        tests += [(module_name(c.id), generated_test_name(p.check.id, plan.BACKEND, p.variant),
                   "falsify") for p in ps]
    modules = ensure_generated(cs, proj)
    with tempfile.TemporaryDirectory(prefix="falsify-conformance-") as tmp:
        manifest = run_manifest(proj, cs, "checks", profile, [plan.BACKEND], binds,
                                Path(tmp) / "ledger.json")
        manifest.update(policy=policy, only=only)
        start = time.time()
        _rc, session = run_pytest(modules, manifest, [], workers, console, tests)
    seconds = (time.time() - start) / len(live)  # one session: its wall shared out
    for lib, b in live:
        c = contracts[b.contract]
        entries = [e for e in session["runs"] if e["contract"] == c.id]
        records.append(matrix.record(lib, b, c, planned[(lib.name, b.name)], entries, seconds,
                                     profile))
    return records


def cmd_conformance(args) -> int:
    from rich.console import Console

    from falsify.harness import conformance as matrix
    from falsify.harness.project import require_project

    proj = require_project("falsify conformance")
    # a log gets the matrix at a width a person can read, not the 80 columns of no terminal
    console = Console(width=None if sys.stdout.isatty() else 160)
    items = _items(_libraries(args.libraries), args.binding)
    if not items:
        raise UsageError("no binding selected")
    contracts = {c.id: c for c in select_contracts(sorted({b.contract for _, b in items}),
                                                   proj)}
    ledger_path = Path(args.ledger) if args.ledger else proj.state_dir / "conformance-ledger.json"
    try:
        old = matrix.load(Path(args.against)) if args.against else None
    except matrix.ConformanceLedgerError as e:
        raise UsageError(str(e)) from None
    start = time.time()
    records = conform(items, contracts, proj, "thorough" if args.thorough else "ci",
                      args.workers, console)
    matrix.save(ledger_path, records)
    return _report(records, old, ledger_path, time.time() - start, console)


def conform(items, contracts, proj, profile: str, workers: int, console) -> list[dict]:
    """Run (library, binding) pairs; their ledger records, in the order given."""
    from falsify.conformance import plan

    _check_declarations(items, contracts)
    records = []
    for round_items in plan.rounds(items):
        records += _run_round(proj, round_items, contracts, profile, workers, console)
    order = {(lib.name, b.name): i for i, (lib, b) in enumerate(items)}
    return sorted(records, key=lambda r: order[(r["library"], r["binding"])])


def _report(records, old, ledger_path, seconds: float, console) -> int:
    from falsify.harness import conformance as matrix

    for rec in records:
        for line in matrix.failure_lines(rec):
            console.print(line, markup=False, soft_wrap=True)
    console.print(matrix.table(records))
    loose = matrix.unclassified(records)
    ours = [(rec["binding"], r) for rec in records for r in matrix.failures(rec)
            if (r.get("finding") or {}).get("kind") == "ours"]
    not_run = [(rec["binding"], r) for rec in records for r in rec["results"]
               if r["outcome"] == "not-run"]
    changed = matrix.changed_cells(old, records) if old is not None else []
    for line in changed:
        console.print(f"changed: {line}", markup=False, style="bold red")
    libs = sorted({r["library"] for r in records})
    console.print(f"conformance: {len(libs)} librar{'y' if len(libs) == 1 else 'ies'}, "
                  f"{len(records)} binding(s); {len(loose)} unclassified failure(s), "
                  f"{len(ours)} blaming our contract, {len(not_run)} check(s) not run"
                  + (f", {len(changed)} changed cell(s)" if old is not None else "")
                  + f"; ledger {ledger_path}; {seconds:.0f} s", markup=False)
    return 1 if (loose or ours or not_run or changed) else 0


def register(sub) -> None:
    c = sub.add_parser("conformance", help="the contracts judged against third-party libraries")
    c.add_argument("libraries", nargs="*",
                   help="binding sets to run (default: all): torch, transformers, liger, ...")
    c.add_argument("--binding", action="append", default=[], metavar="LIB/NAME",
                   help="only this binding (repeatable), e.g. torch/F.rms_norm")
    c.add_argument("--ledger", default=None,
                   help="conformance ledger to write (default: .falsify/conformance-ledger.json)")
    c.add_argument("--against", default=None, metavar="LEDGER",
                   help="a committed conformance ledger: exit 1 when a cell differs from it")
    c.add_argument("--thorough", action="store_true",
                   help="search with the thorough profile instead of the fixed `ci` examples")
    c.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help=WORKERS_HELP)
    c.set_defaults(func=cmd_conformance)
