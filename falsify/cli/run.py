"""`falsify run` and `falsify mutants`: generate the contracts' tests, run them under pytest,
report from the ledger.

Exit codes: 0 all passed, 1 a check failed or a mutant survived, 2 usage error.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from falsify.cli.common import UsageError
from falsify.harness.model import CONTRACTS_DIR

SYMBOLIC = ("z3", "crosshair")


def _select(names: list[str]):
    """Contracts by id (or path); all native contracts when none is named."""
    from falsify.harness.validate import validate

    paths = []
    for n in names:
        p = Path(n)
        if p.exists():
            paths.append(p)
        else:
            q = CONTRACTS_DIR / f"{n.removesuffix('.yaml')}.yaml"
            if not q.exists():
                raise UsageError(f"no contract {n!r} (looked for {q})")
            paths.append(q)
    rep = validate(paths or [CONTRACTS_DIR])
    if rep.errors:
        for f in rep.errors:
            print(f, file=sys.stderr)
        raise UsageError(f"{len(rep.errors)} validation error(s); run `pv validate`")
    return [c for c in rep.contracts if c.mode == "native"]


def _ensure_generated(contracts) -> list[Path]:
    from falsify.harness import generate

    expected = generate.plan_tests(contracts)
    stale = [p for p, why in generate.stale_files(expected, generate.GENERATED_DIR)
             if p in expected]  # only the selected contracts' modules; never delete others
    for p in stale:
        generate.atomic_write(p, expected[p])
    changed = stale
    if changed:
        print(f"falsify: regenerated {len(changed)} test module(s)", file=sys.stderr)
    return [generate.GENERATED_DIR / generate.module_name(c.id) for c in contracts]


def _parse_binds(binds: list[str]) -> dict[str, str]:
    out = {}
    for b in binds or []:
        if "=" not in b or ":" not in b.split("=", 1)[1]:
            raise UsageError(f"--bind {b!r}: expected EQUATION.BACKEND=module:function")
        key, ref = b.split("=", 1)
        if "." not in key or key.rsplit(".", 1)[1] not in ("reference", "torch", "triton"):
            raise UsageError(f"--bind {b!r}: key must be EQUATION.BACKEND with BACKEND one of "
                             "reference, torch, triton")
        from falsify.harness.validate import resolve_binding

        _, err = resolve_binding(ref, allow_import=True)
        if err:
            raise UsageError(f"--bind {b!r}: {err[1]}")
        out[key] = ref
    return out


class _Progress:
    """pytest plugin: a rich progress bar fed by the controller's reports."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None
        self.failed = 0

    def pytest_collection_finish(self, session):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.progress.start()
        self.task = self.progress.add_task("checks", total=len(session.items), status="")

    def pytest_runtest_logreport(self, report):
        if self.progress is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.failed:
                self.failed += 1
            self.progress.update(self.task, advance=1,
                                 status=f"[red]{self.failed} failed" if self.failed else "")

    def pytest_collectreport(self, report):
        if report.failed:
            self.console.print(f"[bold red]collection error[/] {report.nodeid}")
            self.console.print(str(report.longrepr), markup=False)

    def pytest_sessionfinish(self, session):
        if self.progress is not None:
            self.progress.stop()


def _pytest(modules: list[Path], extra: list[str], workers: int, env: dict, console) -> int:
    """pytest in-process with its terminal reporter off: the progress bar and our own summary
    (from the ledger) replace it; collection errors are printed by _Progress."""
    import pytest

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    args = [str(m) for m in modules] + ["-p", "no:cacheprovider", "-p", "no:terminal",
                                         "-p", "no:benchmark"]
    if workers > 1:
        args += ["-n", str(workers)]
    args += extra
    try:
        return int(pytest.main(args, plugins=[_Progress(console)]))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _results_table(contracts, ledger_data, backends, console):
    from rich.table import Table

    t = Table(title="falsify run")
    t.add_column("contract")
    for b in backends:
        t.add_column(b, justify="center")
    rows = {}
    for e in ledger_data["runs"].values():
        rows.setdefault((e["contract"], e["backend"]), []).append(e)
    from falsify.harness.plan import runs

    for c in contracts:
        required = {r.backend for t in c.checks for r in runs(c, t)}
        cells = []
        for b in backends:
            es = [e for e in rows.get((c.id, b), []) if e.get("sha256") == c.sha256]
            p = sum(e["outcome"] == "passed" for e in es)
            f = sum(e["outcome"] in ("failed", "error", "unproven") for e in es)
            cells.append(f"[green]{p}[/] / [red]{f}[/]" if es
                         else ("[dim]not-run[/]" if b in required else "[dim]—[/]"))
        t.add_row(c.id, *cells)
    console.print(t)


def _print_failures(contracts, entries, console, seed=None, flags=""):
    by_id = {c.id: c for c in contracts}
    for e in entries:
        if e["outcome"] in ("passed", "skipped"):
            continue
        c = by_id.get(e["contract"])
        t = c.check(e["check"]) if c else None
        o = c.obligation(e["obligation"]) if c else None
        console.print(f"[bold red]FAILED[/] {e['contract']} {e['check']} on "
                      f"{e['backend']}/{e['variant']} ({e['outcome']})")
        if o:
            console.print(f"  obligation {o.id}: {o.property}")
        if e.get("message"):
            console.print(f"  {e['message']}", markup=False)
        if e.get("example"):
            console.print("  minimal falsifying input:", markup=False)
            for line in e["example"].splitlines():
                console.print(f"    {line}", markup=False)
        if t and t.if_fails:
            console.print(f"  diagnosis (if_fails): {t.if_fails}", markup=False)
        if seed is not None:
            from falsify.cli.soak import repro_command

            line = repro_command(e["contract"], seed, e["nodeid"], flags=flags)
            console.print(f"  reproduce: {line}", markup=False, soft_wrap=True)


def cmd_run(args) -> int:
    from rich.console import Console

    from falsify.harness import coverage, ledger

    console = Console(stderr=args.format != "table")
    contracts = _select(args.contracts)
    binds = _parse_binds(args.bind)
    modules = _ensure_generated(contracts)
    backends = [b.strip() for b in args.backend.split(",")] if args.backend else None
    keep = list(backends or ["reference", "torch", "triton"]) + list(SYMBOLIC)
    if backends:
        keep = backends + [b for b in SYMBOLIC if b not in backends]
    profile = "thorough" if args.thorough else ("ci" if os.environ.get("CI") else "fast")
    env = {"FALSIFY_PROFILE": profile}
    from falsify.cli.soak import SEED_ENV, resolve_seed

    seed, origin = resolve_seed(args.seed)
    flags = " ".join([f"--bind {b}" for b in args.bind] + ["--thorough"] * bool(args.thorough))
    if seed is not None:
        env[SEED_ENV] = str(seed)
        console.print(f"falsify: hypothesis seed {seed} ({origin}); rerun exactly: "
                      f"falsify run {' '.join(args.contracts)} --seed {seed} {flags}".strip()
                      .replace("  ", " "),
                      soft_wrap=True)  # one line, to copy
    ledger_path = Path(args.ledger) if args.ledger else ledger.default_path()
    if binds:
        env["FALSIFY_BIND"] = json.dumps(binds)
        if not args.ledger:  # results about someone else's function are not our coverage
            ledger_path = ledger_path.with_name("ledger-bind.json")
    extra = ["--falsify-backends", ",".join(keep), "--falsify-ledger", str(ledger_path)]
    junit = None
    if args.format == "junit":
        junit = Path(args.junit_file)
        extra += ["--junitxml", str(junit)]
    if args.k:
        extra += ["-k", args.k]
    from falsify.harness import pytest_plugin

    start = time.time()
    pytest_plugin.LAST_SESSION.update(runs=[], mutants=[])
    rc = _pytest(modules, extra, args.workers, env, console)
    after = ledger.load(ledger_path)
    # only what this session ran: the ledger also holds other contracts' results, some of
    # them written by concurrent runs while this one was in flight
    selected = {c.id for c in contracts}
    new = [e for e in pytest_plugin.LAST_SESSION["runs"] if e["contract"] in selected]
    _print_failures(contracts, new, console, seed, flags)
    if args.format == "json":
        print(json.dumps({"entries": new, "exit": rc}, indent=1, default=str))
    else:
        _results_table(contracts, after, [b for b in keep], console)
    cov = coverage.compute(contracts, after if not binds else ledger.load())
    covered, total = cov.overall()
    console.print(f"coverage: {covered}/{total} obligations covered "
                  f"({100.0 * covered / total if total else 100:.1f}%) — mutants count: run "
                  f"`falsify mutants`; ledger {ledger_path}; {time.time() - start:.0f} s")
    if junit:
        console.print(f"JUnit XML written to {junit}")
    if rc == 5:
        raise UsageError("no check selected (wrong --backend or -k?)")
    return 0 if rc == 0 else 1


def cmd_mutants(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from falsify.harness import ledger

    console = Console()
    contracts = _select(args.contracts)
    modules = _ensure_generated(contracts)
    ledger_path = Path(args.ledger) if args.ledger else ledger.default_path()
    profile = "ci" if os.environ.get("CI") else "fast"
    extra = ["--mutants", "--falsify-ledger", str(ledger_path)]
    if args.backend:
        extra += ["--falsify-backends", args.backend]
    rc = _pytest(modules, extra, args.workers, {"FALSIFY_PROFILE": profile}, console)
    data = ledger.load(ledger_path)
    t = Table(title="falsify mutants")
    for col in ("contract", "mutant", "obligation", "backend", "result", "killed by"):
        t.add_column(col)
    survived = 0
    ids = {c.id: c for c in contracts}
    for e in sorted(data["mutants"].values(), key=lambda e: (e["contract"], e["mutant"])):
        c = ids.get(e["contract"])
        if c is None or e.get("sha256") != c.sha256:
            continue
        if args.backend and e["backend"] not in args.backend.split(","):
            continue
        style = {"killed": "green", "survived": "bold red"}.get(e["outcome"], "yellow")
        survived += e["outcome"] != "killed"
        t.add_row(e["contract"], e["mutant"], e["obligation"], e["backend"],
                  f"[{style}]{e['outcome']}[/]", e.get("killed_by") or "")
    console.print(t)
    total = sum(len(c.mutants) for c in contracts)
    console.print(f"mutants: {total - survived} of {total} killed" if not survived
                  else f"[bold red]{survived} mutant(s) not killed[/]")
    if rc == 5:
        raise UsageError("no mutant selected")
    return 0 if rc == 0 and not survived else 1


def register(sub) -> None:
    r = sub.add_parser("run", help="run the contracts' checks (generates tests if needed)")
    r.add_argument("contracts", nargs="*", help="contract ids or files (default: all)")
    r.add_argument("--backend", default=None, help="comma-separated: reference,torch,triton")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fast hypothesis profile (default)")
    g.add_argument("--thorough", action="store_true",
                   help=">= 1000 examples per check; 10,000 for critical kernels")
    r.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1))
    r.add_argument("--format", choices=["table", "json", "junit"], default="table")
    r.add_argument("--junit-file", default="falsify-junit.xml")
    r.add_argument("--bind", action="append", default=[],
                   metavar="EQUATION.BACKEND=module:function",
                   help="check another implementation against a contract without editing it")
    r.add_argument("--ledger", default=None)
    r.add_argument("-k", default=None, help="pytest -k expression to select checks")
    r.add_argument("--seed", default=None, metavar="N|commit",
                   help="hypothesis seed for every check (reproducible exploration); 'commit' "
                        "derives it from `git rev-parse HEAD`")
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("mutants", help="run every declared mutant; a survivor is a failure")
    m.add_argument("contracts", nargs="*")
    m.add_argument("--backend", default=None)
    m.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1))
    m.add_argument("--ledger", default=None)
    m.set_defaults(func=cmd_mutants)
