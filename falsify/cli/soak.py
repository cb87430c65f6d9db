"""`falsify soak`: keep drawing fresh hypothesis seeds over the contracts until the time is up.

Each round runs one contract's checks (round-robin, so every contract comes round) under a new
seed in a child pytest, with the time left as its budget: the child is stopped at the deadline,
so the soak ends within the minutes given. A failing check is reported with the one command
that reproduces it (`falsify run CONTRACT --seed N -k TEST`): with a fixed seed every check
draws the same examples again (falsify/harness/runtime.py `check_settings`). Each round
keeps its own example database: a failure one round saved is not replayed in the next, where
it would be reported under a seed that does not reproduce it.

While it runs (falsify.harness.progress, on stderr): on a terminal a live display of rounds
done, contracts covered, checks passed and failed so far, the round running now and the time
left; in a log one line per finished round, `falsify soak: CONTRACT seed N: P passed, F failed,
S s`. A failing check and its reproducing command are printed as its result arrives.

Exit codes: 0 nothing failed, 1 a check failed (or errored), 2 usage error.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from falsify.cli.session import ensure_generated, repro_command, run_manifest, select_contracts
from falsify.errors import UsageError

# pytest -v prints one line per test: "path::test_name PASSED [ 12%]"
_RESULT = re.compile(r"^(?P<node>\S+::\S+) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
GRACE_S = 5.0  # after SIGTERM at the deadline, before SIGKILL



@dataclass
class Round:
    contract: str
    seed: int
    ran: int = 0
    failures: list[str] = field(default_factory=list)  # node ids
    cut: bool = False  # stopped at the deadline before it finished
    rc: int = 0


def _run_round(module: Path, contract: str, seed: int, budget_s: float, manifest: Path,
               on_result=lambda node, failed: None) -> Round:
    """One contract's checks under `seed` in a child pytest, stopped at `budget_s`; the run
    manifest names the contract's file, the `fast` profile, the backends and the round's
    ledger, as `falsify run` hands them over. `on_result(node, failed)` is called as each
    check's result line arrives, so a failure is reported when it happens."""
    import queue
    import threading

    r = Round(contract, seed)
    env = dict(os.environ, FALSIFY_SEED=str(seed))
    cmd = [sys.executable, "-m", "pytest", str(module), "-v", "-p", "no:cacheprovider",
           "-p", "no:benchmark", "--falsify-manifest", str(manifest), "--tb=no"]
    # a process group of its own, so the deadline stops pytest and anything it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + budget_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            r.cut = True
            break
        try:
            line = lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        if line is None:
            break
        m = _RESULT.match(line.strip())
        if m and m["outcome"] != "SKIPPED":
            r.ran += 1
            failed = m["outcome"] in ("FAILED", "ERROR")
            if failed:
                r.failures.append(m["node"])
            on_result(m["node"], failed)
    if r.cut and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    r.rc = proc.wait()
    return r


def _messages(ledger: Path) -> dict[str, str]:
    """nodeid → the failure's first line, from the round's ledger (written when it finishes)."""
    from falsify.harness import ledger as ledger_mod

    if not ledger.exists():
        return {}
    try:
        data = ledger_mod.load(ledger)
    except Exception:  # a round cut at the deadline may leave none: messages are a bonus
        return {}
    return {e.get("nodeid", ""): e.get("message") or "" for e in data["runs"].values()
            if e.get("outcome") not in ("passed", "skipped")}


def seedless_keys(c) -> list[str]:
    """The manifest `reuse` keys of a contract's checks that draw no examples: a round leaves
    them out, since no seed changes what they compute."""
    from falsify.harness.ledger import run_key
    from falsify.harness.plan import runs
    from falsify.harness.runtime import uses_hypothesis

    return ["run:" + run_key(dict(contract=c.id, check=t.id, backend=r.backend,
                                  variant=r.variant))
            for t in c.checks if not uses_hypothesis(t.kind) for r in runs(c, t)]


def cmd_soak(args) -> int:
    from falsify.harness.project import require_project, resolve_id

    if args.minutes <= 0:
        raise UsageError(f"--minutes {args.minutes}: must be > 0")
    # the budget counts from the start, validation and generation included; a round stopped at
    # the deadline gets GRACE_S to exit, so that is kept in hand
    end = time.monotonic() + 60.0 * args.minutes - GRACE_S
    proj = require_project("falsify soak")
    contracts = select_contracts(args.contracts, proj)
    if not contracts:
        raise UsageError("no native contract to soak")
    by_id = {c.id: c for c in contracts}
    modules = dict(zip(by_id, ensure_generated(contracts, proj)))
    # how `falsify run` names each contract again: its id where the id resolves to this file
    # (the project's or the library's), else its path
    names = {c.id: c.id if resolve_id(c.id, proj) == Path(c.path) else str(c.path)
             for c in contracts}
    # z3 and CrossHair, training probes and compiles draw nothing from the seed: a soak spends
    # its time on the checks that draw (the others are left out of every round)
    backends = (args.backend or "reference,torch,triton").split(",")
    from falsify.harness.runtime import uses_hypothesis

    order = [c.id for c in contracts if any(uses_hypothesis(t.kind) for t in c.checks)]
    if not order:
        raise UsageError("no check of these contracts draws examples (training probes, proofs "
                         "and compiles give the same result under every seed): nothing to soak")
    start = secrets.randbelow(len(order))  # a long soak and a short one cover different ones
    print(f"falsify soak: {len(order)} contract(s), {args.minutes:g} min, a fresh seed per "
          "round", file=sys.stderr, flush=True)
    rounds, failures = _soak(args, proj, by_id, modules, names, backends,
                             order[start:] + order[:start], end)
    checks = sum(r.ran for r in rounds)
    print(f"soak: {len(rounds)} seed(s) drawn, {checks} check(s) run, {len(failures)} "
          f"failure(s) in {args.minutes:g} min")
    return 1 if failures else 0


def _soak(args, proj, by_id, modules, names, backends, order, end):
    """The rounds until `end` (a monotonic time), round-robin over `order`, each watched
    through the shared progress display (falsify.harness.progress): on a terminal rounds done,
    contracts covered, checks passed and failed so far, the round running now and the time
    left; in a log one line per finished round. A failing check is printed with the command
    that reproduces it as its result line arrives. Returns (rounds, failures)."""
    from rich.console import Console

    from falsify.harness import handover
    from falsify.harness.progress import Progress, fmt_seconds

    rounds: list[Round] = []
    failures: list[tuple[Round, str]] = []
    covered: set[str] = set()
    view = Progress(Console(stderr=True), "rounds",
                    eta=lambda: f"{fmt_seconds(max(0.0, end - time.monotonic()))} left")
    with view, tempfile.TemporaryDirectory(prefix="falsify-soak-") as tmp:
        k = 0
        while (left := end - time.monotonic()) > 1.0:  # the clock between rounds
            cid = order[k % len(order)]
            seed = secrets.randbits(32)
            ledger = Path(tmp) / f"round-{k}.json"
            manifest = handover.write(Path(tmp) / f"round-{k}.manifest.json", handover.Manifest(
                **run_manifest(proj, [by_id[cid]], "checks", "fast", backends, {}, ledger,
                            reuse=seedless_keys(by_id[cid])),
                results=str(Path(tmp) / f"round-{k}.results.json"),
                example_db=str(Path(tmp) / f"round-{k}.examples")))

            def result(node, failed, cid=cid, seed=seed):
                view.check(not failed)
                if failed:
                    view.failed(f"FAILED {node}\n    reproduce: "
                                f"{repro_command(names[cid], seed, node, args.backend)}")

            view.start(f"{cid} seed {seed}")
            t0 = time.monotonic()
            r = _run_round(modules[cid], cid, seed, left, manifest, result)
            rounds.append(r)
            covered.add(cid)
            view.extra = f"contracts covered {len(covered)}/{len(order)}"
            view.finished(f"falsify soak: {cid} seed {seed}: {r.ran - len(r.failures)} passed, "
                          f"{len(r.failures)} failed, {time.monotonic() - t0:.0f} s"
                          + (" (cut at the deadline)" if r.cut else ""))
            msgs = _messages(ledger)  # the ledger is written when the round ends
            for node in r.failures:
                failures.append((r, node))
                if msgs.get(node):
                    view.failed(f"  {node}: {msgs[node]}")
            if not r.cut and r.rc not in (0, 1, 5):  # 2-4: interrupted, internal, usage
                view.failed(f"  pytest exited {r.rc} (collection or internal error) for {cid}")
                failures.append((r, f"{cid}: pytest exit {r.rc}"))
            k += 1
    return rounds, failures


def register(sub) -> None:
    s = sub.add_parser("soak", help="draw fresh seeds over the contracts until the time is up")
    s.add_argument("contracts", nargs="*", help="contract ids or files (default: all)")
    s.add_argument("--minutes", type=float, default=5.0, help="wall-clock budget (default 5)")
    s.add_argument("--backend", default=None, help="comma-separated: reference,torch,triton")
    s.set_defaults(func=cmd_soak)
