"""`falsify run` and `falsify mutants`: generate the contracts' tests, run them under pytest,
report from the results.

The command parses each selected contract once, writes the run manifest (the one hand-over to
the pytest plugin, see falsify.harness.handover) and reads this session's entries back from
the manifest's results file. Both need a project (falsify.harness.project): the generated
modules and the ledger are the project's.

Exit codes: 0 all passed, 1 a check failed or a mutant survived, 2 usage error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from falsify.cli.common import resolve_user_binding
from falsify.cli.session import (
    ensure_generated,
    repro_command,
    resolve_seed,
    run_manifest,
    select_contracts,
)
from falsify.errors import UsageError

SYMBOLIC = ("z3", "crosshair")
WORKERS_HELP = ("parallel pytest workers (default: up to 2 cores); a run whose tests the ledger "
                "expects to take under 12 s stays in this process and says so")



def _parse_binds(binds: list[str], contracts, allow_any: bool) -> dict[str, str]:
    """`--bind EQUATION.BACKEND=module:function`: the equation and backend must be one a
    selected contract binds, or the run would silently check the built-in kernel; the module
    must lie in the project or the installed packages unless `allow_any`."""
    bound = {(eq, b) for c in contracts for eq, e in c.equations.items() for b in e.bindings}
    equations = sorted({eq for eq, _ in bound})
    out = {}
    for b in binds or []:
        if "=" not in b or ":" not in b.split("=", 1)[1]:
            raise UsageError(f"--bind {b!r}: expected EQUATION.BACKEND=module:function")
        key, ref = b.split("=", 1)
        if "." not in key or key.rsplit(".", 1)[1] not in ("reference", "torch", "triton"):
            raise UsageError(f"--bind {b!r}: key must be EQUATION.BACKEND with BACKEND one of "
                             "reference, torch, triton")
        eq, backend = key.rsplit(".", 1)
        if eq not in equations:
            raise UsageError(f"--bind {b!r}: no selected contract has equation {eq!r} "
                             f"(equations: {', '.join(equations) or 'none'})")
        if (eq, backend) not in bound:
            have = sorted(be for e, be in bound if e == eq)
            raise UsageError(f"--bind {b!r}: equation {eq!r} has no {backend} binding to "
                             f"replace (bound: {', '.join(have)})")
        resolve_user_binding(f"--bind {b!r}", ref, allow_any)
        out[key] = ref
    return out


class _Progress:
    """pytest plugin: what a person watching the run sees while it goes on, through the shared
    display (falsify.harness.progress): on a terminal, contracts done of total, checks passed
    and failed so far, the contract running now and an ETA from the seconds the ledger recorded
    for each test; in a log, one line per finished contract with its counts and seconds. A
    failure is printed when its report reaches the controller, not only in the summary."""

    def __init__(self, console, contracts: dict[str, str], expected: dict[str, float],
                 workers: int):
        from falsify.harness.progress import Progress

        self.console = console
        self.contracts = contracts  # generated module file name -> contract id
        self.expected = expected  # node id -> seconds it took last time
        self.workers = max(1, workers)
        self.left: dict[str, set[str]] = {}  # contract -> node ids not reported yet
        self.counts: dict[str, list] = {}  # contract -> [passed, failed, first report time]
        # the ETA is worked out here, on pytest's thread, as reports arrive: the display
        # redraws on a thread of its own, which must not walk the sets these hooks change
        self.eta = ""
        self.view = Progress(console, "contracts", eta=lambda: self.eta)
        self.shown = False
        self.closed: set[str] = set()  # contracts whose line is printed

    def _contract(self, nodeid: str) -> str:
        return self.contracts.get(nodeid.split("::")[0].rsplit("/", 1)[-1], "?")

    def _collected(self, nodeids) -> None:
        for n in nodeids:
            self.left.setdefault(self._contract(n), set()).add(n)
        self.eta = self._eta()
        self.view.set_total(len(self.left))
        if not self.shown:
            self.shown = True
            self.view.__enter__()

    def pytest_collection_finish(self, session):
        self._collected(i.nodeid for i in session.items)

    # a pytest-xdist hook (a dependency): under -n the controller collects nothing itself
    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.left:  # every worker collects the same ids: take the first list
            self._collected(ids)

    def _eta(self) -> str:
        from falsify.harness.progress import fmt_seconds

        left = [n for ns in self.left.values() for n in ns]
        known = [self.expected[n] for n in left if n in self.expected]
        if not known:
            return "ETA unknown (no durations in the ledger)" if left else ""
        mean = sum(known) / len(known)
        return f"ETA {fmt_seconds((sum(known) + mean * (len(left) - len(known))) / self.workers)}"

    def pytest_runtest_logreport(self, report):
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        cid = self._contract(report.nodeid)
        count = self.counts.setdefault(cid, [0, 0, time.time() - report.duration])
        ok = not report.failed
        count[0 if ok else 1] += 1
        left = self.left.setdefault(cid, set())
        left.discard(report.nodeid)
        self.eta = self._eta()
        self.view.now = cid
        self.view.check(ok)
        if report.failed:
            what = "MUTANT SURVIVED" if "falsify_mutant" in report.keywords else "FAILED"
            line = str(report.longrepr).strip().splitlines()
            self.view.failed(f"{what} {report.nodeid}: {line[-1] if line else report.when}")
        if not left and cid not in self.closed:
            self.closed.add(cid)
            self.view.finished(f"falsify: {cid}: {count[0]} passed, {count[1]} failed, "
                               f"{time.time() - count[2]:.0f} s")

    def pytest_collectreport(self, report):
        if report.failed:
            self.console.print(f"[bold red]collection error[/] {report.nodeid}")
            self.console.print(str(report.longrepr), markup=False)

    def pytest_sessionfinish(self, session):
        if self.shown:
            self.view.__exit__(None, None, None)


def _expected_seconds(ledger_path, profile: str | None = None) -> dict[str, float]:
    """Node id -> the seconds its last result took, for the progress display's ETA; with
    `profile`, only results of a profile that draws as many examples (a thorough result's
    seconds say nothing about a fast run's)."""
    from falsify.harness import ledger
    from falsify.harness.runtime import PROFILE_STRENGTH

    try:
        data = ledger.load(ledger_path)
    except ledger.LedgerError:
        return {}  # the run itself reports an unreadable ledger; the ETA only goes unknown
    strength = PROFILE_STRENGTH.get(profile) if profile else None
    return {e["nodeid"]: float(e["duration_s"]) for s in ("runs", "mutants")
            for e in data[s].values() if e.get("nodeid") and e.get("duration_s") is not None
            and (strength is None
                 or PROFILE_STRENGTH.get(e.get("profile", "fast"), 0) == strength)}


def _durations(manifest: dict) -> dict[str, float]:
    """Node id -> the seconds its test took last time: from the run's ledger, else (a first
    run, as in a fresh clone) from the project's committed evidence ledgers, whose profile
    differs but whose long tests are the same long tests. For the ETA and for the order."""
    from falsify.harness import evidence, project

    seen = _expected_seconds(manifest["ledger"])
    if seen:
        return seen
    # only an order and an ETA hang on these: a broken project file or evidence glob is for
    # the commands that read them to report (the run checks the project; `pv generate` the
    # evidence), not a reason to stop a run
    try:
        proj = project.find_project(Path(manifest["project_root"]))
        paths = evidence.files(proj) if proj else []
    except (project.ProjectError, evidence.EvidenceError):
        return {}
    out: dict[str, float] = {}
    for path in paths:
        out.update(_expected_seconds(path))
    return out


def run_pytest(modules: list[Path], manifest, extra: list[str], asked: int, console,
            tests: list[tuple]) -> tuple[int, dict]:
    """pytest in-process with its terminal reporter off: the progress display and our own
    summary replace it; collection errors are printed by _Progress. `tests` are the generated
    tests the run keeps (falsify.harness.worker_plan.planned), which decide whether the `asked`
    workers start or the run stays in this process. Returns (exit code, this session's
    entries), handed over through the manifest and its results file."""
    import pytest

    from falsify.harness import handover, worker_plan
    from falsify.harness.generate import module_name

    tmp = Path(tempfile.mkdtemp(prefix="falsify-run-"))
    durations = _durations(manifest)
    k = extra[extra.index("-k") + 1] if "-k" in extra else None
    work = worker_plan.expected(worker_plan.selected(tests, k),
                                _expected_seconds(manifest["ledger"], manifest["profile"]))
    workers = worker_plan.workers_for(asked, work)
    if workers < asked:
        console.print(f"falsify: {work.tests} test(s), about {work.seconds:.0f} s of work: run "
                      f"in this process, not on {asked} workers (starting them would cost more "
                      "than they save)", markup=False)
    try:
        path = handover.write(tmp / "manifest.json", handover.Manifest(
            **{**manifest, "results": str(tmp / "results.json"), "durations": durations}))
        args = [str(m) for m in modules] + ["--falsify-manifest", str(path),
                                             "-p", "no:cacheprovider", "-p", "no:terminal",
                                             "-p", "no:benchmark"]
        if workers > 1:
            args += ["-n", str(workers)]
        if "triton" in manifest["backends"]:
            from falsify import triton_env

            triton_env.announce()
        names = {module_name(c): c for c in manifest["contracts"]}
        progress = _Progress(console, names, durations, workers)
        from falsify.harness import threads

        # in this process, torch gets the share of the cores one of the asked workers would
        # have: the same thread count, so the same results, whichever way the run went
        with threads.for_workers(workers), threads.as_one_of(asked if workers == 1 else 1):
            rc = int(pytest.main(args + extra, plugins=[progress]))
        return rc, handover.read_results(tmp / "results.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _seeded(seed: int | None):
    """FALSIFY_SEED for this run's pytest and its xdist workers (a process setting, like
    FALSIFY_TRITON: plain pytest reads it the same way), restored afterwards."""
    from falsify.harness.runtime import SEED_ENV

    old = os.environ.get(SEED_ENV)
    if seed is not None:
        os.environ[SEED_ENV] = str(seed)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SEED_ENV, None)
        else:
            os.environ[SEED_ENV] = old


def reusable(contracts, data: dict, keep: list[str], select: str, profile: str,
              seedless_only: bool = False) -> list[str]:
    """`--changed`: the tests whose last result passed (a mutant: was killed) against the
    current contract text and implementation source, under a profile that searched at least as
    hard as `profile` (manifest `reuse` keys): a fast result never stands in for a thorough one,
    and entries written before profiles were recorded count as fast. A check that draws no
    examples (a training probe, a proof, a compile) runs the same under every profile and seed,
    so any current pass of it counts. A result skipped for want of a GPU is reused while this
    machine still has none: rerunning it would only skip again. `seedless_only`
    (`--reuse-seedless`): only those checks, and no mutants."""
    from falsify.harness.coverage import current, skipped_for_gpu
    from falsify.harness.kinds.device import unavailable
    from falsify.harness.ledger import mutant_key, run_key
    from falsify.harness.plan import runs
    from falsify.harness.runtime import PROFILE_STRENGTH, uses_hypothesis

    need = PROFILE_STRENGTH[profile]

    def settled(e, done: str, backend: str, draws: bool = True) -> bool:
        if draws and PROFILE_STRENGTH.get(e.get("profile", "fast"), 0) < need:
            return False
        return e["outcome"] == done or (skipped_for_gpu(e) and bool(unavailable(backend)))

    out = []
    for c in contracts:
        for t in c.checks:
            draws = uses_hypothesis(t.kind)
            if seedless_only and draws:
                continue
            for r in runs(c, t):
                key = run_key(dict(contract=c.id, check=t.id, backend=r.backend,
                                   variant=r.variant))
                e = data["runs"].get(key)
                if (r.backend in keep and e and settled(e, "passed", r.backend, draws)
                        and current(c, e, t)):
                    out.append("run:" + key)
        for m in c.mutants if select != "checks" and not seedless_only else []:
            key = mutant_key(dict(contract=c.id, mutant=m.id))
            e = data["mutants"].get(key)
            if e and settled(e, "killed", m.backend) and current(c, e, mutant=m):
                out.append("mutant:" + key)
    return out



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
            line = repro_command(e["contract"], seed, e["nodeid"], flags=flags)
            console.print(f"  reproduce: {line}", markup=False, soft_wrap=True)


def _needs_gpu(e: dict) -> bool:
    """A mutant skipped because its checks need a GPU: not run, neither killed nor survived
    (coverage lists its obligation as needs-gpu); any other skip is a failure to judge it."""
    from falsify.harness.coverage import skipped_for_gpu

    return skipped_for_gpu(e)


def _print_survivors(mutants, console):
    for e in mutants:
        if e["outcome"] == "killed":
            continue
        if _needs_gpu(e):
            console.print(f"MUTANT NOT RUN {e['contract']} {e['mutant']} ({e['obligation']}, "
                          f"{e['backend']}): {e.get('message')}", markup=False, style="yellow")
            continue
        why = ("no check of the obligation failed against it" if e["outcome"] == "survived"
               else e.get("message") or "the mutant test errored")
        console.print(f"MUTANT {e['outcome'].upper()} {e['contract']} {e['mutant']} "
                      f"({e['obligation']}, {e['backend']}): {why}", markup=False,
                      style="bold red")


def _summary(contracts, data, runs, mutants, select, bind_note, keep) -> str:
    from falsify.harness import coverage
    from falsify.harness.plan import runs as planned

    passed = sum(e["outcome"] == "passed" for e in runs)
    failed = sum(e["outcome"] in ("failed", "error", "unproven") for e in runs)
    checks = f"checks {passed} passed, {failed} failed"
    if bind_note:
        return f"{checks}; {bind_note}"
    if select == "checks":
        return (f"{checks}; mutants not run (--no-mutants), so no obligation coverage figure: "
                "`falsify run` without --no-mutants runs both")
    killed = sum(e["outcome"] == "killed" for e in mutants)
    judged = [e for e in mutants if not _needs_gpu(e)]
    hollow = len(hollow_kills(runs, mutants))
    hollow_note = (f" ({hollow} only by checks that fail on the implementation too: no "
                   "evidence until those pass)") if hollow else ""
    cov = coverage.compute(contracts, data)
    covered, total = cov.overall()
    pct = 100.0 * covered / total if total else 100.0
    skipped = sorted({r.backend for c in contracts for t in c.checks for r in planned(c, t)}
                     - set(keep))
    why = (f" ({', '.join(skipped)} not run: not in --backend or the project's `backends`)"
           if skipped else "")
    return (f"coverage: {covered}/{total} obligations covered ({pct:.1f}%){why}, counting "
            f"checks and mutants; {checks}; mutants {killed}/{len(judged)} killed{hollow_note}"
            f"{cov.needs_gpu_note()}")


def hollow_kills(runs, mutants) -> list[dict]:
    """Killed mutants whose killing check (`killed_by`: CHECK/backend/variant) failed in the
    same run on the real implementation: a stub or broken kernel fails every check, so its
    mutants "die" without showing that the check can tell a bug from correct code."""
    failing = {(e["contract"], f"{e['check']}/{e['backend']}/{e['variant']}") for e in runs
               if e["outcome"] in ("failed", "error", "unproven")}
    return [e for e in mutants if e["outcome"] == "killed"
            and (e["contract"], e.get("killed_by")) in failing]


def _shard(args, contracts, proj) -> list:
    """`--shard K/N`: this shard's contracts, split by the seconds the balance ledger records
    (falsify.harness.shard); every shard must read the same balance ledger."""
    if not args.shard:
        return contracts
    from falsify.harness import ledger, shard

    src = Path(args.balance_ledger) if args.balance_ledger else proj.ledger_path
    try:
        balance = ledger.load(src)
    except ledger.LedgerError as e:
        raise UsageError(str(e)) from None
    return shard.select(contracts, args.shard, balance)


def _echo_seed(args, seed, origin, console) -> None:
    """The seed and the command line that reruns exactly this run: every option that selects
    what runs or how hard it searches, so the line reruns this run and not a larger one."""
    argv = ["falsify", "run", *args.contracts, "--seed", str(seed)]
    argv += [a for b in args.bind for a in ("--bind", b)]
    argv += ["--allow-any-import"] if args.allow_any_import else []
    argv += ["--backend", args.backend] if args.backend else []
    argv += ["-k", args.k] if args.k else []
    argv += ["--shard", args.shard] if args.shard else []
    argv += ["--balance-ledger", args.balance_ledger] if args.balance_ledger else []
    argv += ["--thorough"] * bool(args.thorough) + ["--no-mutants"] * bool(args.no_mutants)
    console.print(f"falsify: hypothesis seed {seed} ({origin}); rerun exactly: "
                  f"{shlex.join(argv)}", soft_wrap=True)  # one line, to copy


def _reuse(args, contracts, ledger_path, keep, select, profile, console) -> list[str]:
    from falsify.harness import ledger

    if args.changed:
        reuse = reusable(contracts, ledger.load(ledger_path), keep, select, profile)
        console.print(f"falsify: --changed: reused {len(reuse)} passing result(s) whose contract "
                      f"and implementation are unchanged, searched under the {profile} profile "
                      "or a harder one", markup=False)
        return reuse
    if args.reuse_seedless:
        reuse = reusable(contracts, ledger.load(ledger_path), keep, select, profile,
                          seedless_only=True)
        console.print(f"falsify: --reuse-seedless: reused {len(reuse)} passing result(s) of "
                      "checks that draw no examples (training probes, proofs, compiles) and whose "
                      "contract and implementation are unchanged: no seed can change them",
                      markup=False)
        return reuse
    return []


def _report(args, contracts, session, rc, ctx, console) -> int:
    """Failures, survivors, the table (or JSON) and the summary line; the exit code."""
    from falsify.harness import ledger

    data = ledger.load(ctx["ledger"])
    # only what this session ran: the ledger also holds other contracts' results, some of
    # them written by concurrent runs while this one was in flight
    selected = {c.id for c in contracts}
    runs = [e for e in session["runs"] if e["contract"] in selected]
    muts = [e for e in session["mutants"] if e["contract"] in selected]
    _print_failures(contracts, runs, console, ctx["seed"], ctx["flags"])
    _print_survivors(muts, console)
    if args.format == "json":
        print(json.dumps({"entries": runs, "mutants": muts, "exit": rc}, indent=1, default=str))
    else:
        _results_table(contracts, data, ctx["keep"], console)
    summary = _summary(contracts, data, runs, muts, ctx["select"], ctx["bind_note"], ctx["keep"])
    console.print(f"{summary}; ledger {ctx['ledger']}; {time.time() - ctx['start']:.0f} s",
                  markup=False)
    if ctx["junit"]:
        console.print(f"JUnit XML written to {ctx['junit']}")
    if rc == 5:
        raise UsageError("no check selected (wrong --backend or -k?)")
    survived = any(e["outcome"] != "killed" and not _needs_gpu(e) for e in muts)
    return 0 if rc == 0 and not survived else 1


def _empty_shard(args, ledger_path, console) -> int:
    """A shard the split left without contracts still writes its (empty) ledger: the merge
    step expects one file per shard."""
    from falsify.harness import ledger

    ledger.merge([], [], ledger_path)
    console.print(f"falsify: shard {args.shard} holds no contract of this selection; "
                  f"ledger {ledger_path} written without results", markup=False)
    return 0


def cmd_run(args) -> int:
    from rich.console import Console

    from falsify.harness import shard, worker_plan
    from falsify.harness.project import require_project

    if args.shard:
        shard.parse(args.shard)  # a bad K/N is a usage error before anything is loaded
    proj = require_project("falsify run")
    console = Console(stderr=args.format != "table")
    contracts = _shard(args, select_contracts(args.contracts, proj), proj)
    binds = _parse_binds(args.bind, contracts, args.allow_any_import)
    keep = _kept_backends(args, proj, binds)
    profile = "thorough" if args.thorough else ("ci" if os.environ.get("CI") else proj.profile)
    seed, origin = resolve_seed(args.seed)
    # what a failure's own reproduction needs beside its -k node id
    flags = " ".join([f"--bind {b}" for b in args.bind] + ["--thorough"] * bool(args.thorough)
                     + ["--allow-any-import"] * bool(args.allow_any_import))
    if seed is not None:
        _echo_seed(args, seed, origin, console)
    ledger_path = Path(args.ledger) if args.ledger else proj.ledger_path
    bind_note = None
    if binds:
        # results about someone else's function are not the project's coverage; mutants
        # replace the contract's own binding, so they say nothing about the bound function
        if not args.ledger:
            ledger_path = ledger_path.with_name("ledger-bind.json")
        bind_note = (f"--bind checks {', '.join(binds)}: {', '.join(keep)} checks only, no "
                     "mutants; the results are not the project's coverage")
    if not contracts:
        return _empty_shard(args, ledger_path, console)
    modules = ensure_generated(contracts, proj)
    select = "checks" if (args.no_mutants or binds) else "all"
    junit = Path(args.junit_file) if args.format == "junit" else None
    extra = (["--junitxml", str(junit)] if junit else []) + (["-k", args.k] if args.k else [])
    start = time.time()
    reuse = _reuse(args, contracts, ledger_path, keep, select, profile, console)
    manifest = run_manifest(proj, contracts, select, profile, keep, binds, ledger_path, reuse)
    tests = worker_plan.planned(contracts, keep, select, reuse)
    if reuse and not junit and not tests:
        rc, session = 5, {"runs": [], "mutants": []}  # starting pytest would only deselect
    else:
        with _seeded(seed):
            rc, session = run_pytest(modules, manifest, extra, args.workers, console, tests)
    if rc == 5 and reuse:  # everything selected was reused: nothing left to run
        rc = 0
    ctx = dict(ledger=ledger_path, seed=seed, flags=flags, keep=keep, select=select,
               bind_note=bind_note, start=start, junit=junit)
    return _report(args, contracts, session, rc, ctx, console)


def _kept_backends(args, proj, binds: dict[str, str]) -> list[str]:
    """The backends whose checks run. `--backend` names them; otherwise the project's, and the
    symbolic ones (proofs). A `--bind` run judges the bound function, so by default it runs the
    backends the binds name and nothing else: the other backends' checks and the proofs call
    the contract's own functions, which no binding replaces."""
    if args.backend:
        backends = [b.strip() for b in args.backend.split(",")]
    elif binds:
        backends = sorted({key.rsplit(".", 1)[1] for key in binds})
    else:
        backends = list(proj.backends)
    return backends if binds else backends + [b for b in SYMBOLIC if b not in backends]


def cmd_mutants(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from falsify.harness import worker_plan
    from falsify.harness.project import require_project

    proj = require_project("falsify mutants")
    console = Console()
    contracts = select_contracts(args.contracts, proj)
    modules = ensure_generated(contracts, proj)
    ledger_path = Path(args.ledger) if args.ledger else proj.ledger_path
    profile = "ci" if os.environ.get("CI") else proj.profile
    backends = ([b.strip() for b in args.backend.split(",")] if args.backend
                else list(proj.backends))
    manifest = run_manifest(proj, contracts, "mutants", profile, backends, {}, ledger_path)
    rc, session = run_pytest(modules, manifest, [], args.workers, console,
                          worker_plan.planned(contracts, backends, "mutants", []))
    t = Table(title="falsify mutants")
    for col in ("contract", "mutant", "obligation", "backend", "result", "killed by"):
        t.add_column(col)
    ids = {c.id for c in contracts}
    muts = sorted((e for e in session["mutants"] if e["contract"] in ids),
                  key=lambda e: (e["contract"], e["mutant"]))
    survived = 0
    for e in muts:
        style = {"killed": "green", "survived": "bold red"}.get(e["outcome"], "yellow")
        survived += e["outcome"] != "killed" and not _needs_gpu(e)
        t.add_row(e["contract"], e["mutant"], e["obligation"], e["backend"],
                  f"[{style}]{e['outcome']}[/]", e.get("killed_by") or "")
    console.print(t)
    gpu = sum(_needs_gpu(e) for e in muts)
    gpu_note = f"; {gpu} need a GPU: not run" if gpu else ""
    console.print(f"mutants: {len(muts) - survived - gpu} of {len(muts) - gpu} killed{gpu_note}"
                  if not survived else f"[bold red]{survived} mutant(s) not killed[/]{gpu_note}")
    if rc == 5:
        raise UsageError("no mutant selected")
    return 0 if rc == 0 and not survived else 1


def register(sub) -> None:
    r = sub.add_parser("run", help="run the contracts' checks and mutants, report coverage")
    r.add_argument("contracts", nargs="*",
                   help="contract ids (the project's or the library's) or files "
                        "(default: the project's contracts)")
    r.add_argument("--backend", default=None,
                   help="comma-separated: reference,torch,triton (default: the project's "
                        "`backends` and the proofs; with --bind, the backends it binds)")
    r.add_argument("--no-mutants", "--quick", dest="no_mutants", action="store_true",
                   help="checks only, no mutants: quick, but no obligation coverage figure "
                        "(--quick is the same)")
    r.add_argument("--thorough", action="store_true",
                   help=">= 1000 examples per check; 10,000 for critical kernels")
    r.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help=WORKERS_HELP)
    r.add_argument("--format", choices=["table", "json", "junit"], default="table")
    r.add_argument("--junit-file", default="falsify-junit.xml")
    r.add_argument("--bind", action="append", default=[],
                   metavar="EQUATION.BACKEND=module:function",
                   help="check another implementation against a contract without editing it")
    r.add_argument("--allow-any-import", action="store_true",
                   help="let --bind import a module from outside the project and the installed "
                        "packages (it runs that module's code)")
    r.add_argument("--ledger", default=None, help="default: the project's `ledger`")
    r.add_argument("-k", default=None, help="pytest -k expression to select checks")
    r.add_argument("--changed", action="store_true",
                   help="re-run only the checks (and mutants) whose contract or implementation "
                        "source changed since their last passing result; reuse the rest "
                        "(with --thorough, only results the thorough profile produced)")
    r.add_argument("--reuse-seedless", action="store_true",
                   help="reuse current passing results of the checks that draw no examples "
                        "(training probes, proofs, compiles): a new seed cannot change them")
    r.add_argument("--shard", default=None, metavar="K/N",
                   help="run shard K of N: the contracts split over N runs, balanced by the "
                        "seconds --balance-ledger records; merge the shards' ledgers with "
                        "`pv ledger merge`")
    r.add_argument("--balance-ledger", default=None, metavar="LEDGER",
                   help="with --shard: the ledger whose durations balance the split (default: "
                        "the project's `ledger`); every shard must name the same one")
    r.add_argument("--seed", default=None, metavar="N|commit",
                   help="hypothesis seed for every check (reproducible exploration); 'commit' "
                        "derives it from `git rev-parse HEAD`")
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("mutants", help="run every declared mutant; a survivor is a failure")
    m.add_argument("contracts", nargs="*")
    m.add_argument("--backend", default=None,
                   help="comma-separated: reference,torch,triton (default: the project's "
                        "`backends`)")
    m.add_argument("-n", "--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help=WORKERS_HELP)
    m.add_argument("--ledger", default=None)
    m.set_defaults(func=cmd_mutants)
