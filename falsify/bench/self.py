"""`falsify bench self`: how long falsify's own verdicts take, each beside its goal.

The jobs, in this order, in the current project, each as the command a user types (a fresh
interpreter, so start-up and imports count):

- the main job: `falsify run` (every check and mutant, the project's profile; or only the
  contracts named), goal 5 min;
- `falsify run --changed` right after it, nothing changed, goal 10 s;
- `pv coverage` and `pv status`, goal 2 s each;
- with `--third-party CONTRACT EQ.BACKEND=module:function`: that one contract with that
  binding, as the third-party guide runs it, goal 60 s (a kernel that fails checks, exit 1,
  was judged: its time counts);
- with `--ci`: the project's CI gate, `.ci/run`, goal 25 min.

The runs write their results to a ledger in a temporary directory, so the project's own
evidence is left as it was. A job that exits non-zero (but for the third-party one's exit 1)
is reported as failed with the end of its output, and the bench exits 1: a fast wrong answer
is not a figure. The goals are for a
quiet 2-core machine; the bench prints the machine's core count and load average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from falsify.errors import UsageError
from falsify.helptext import first_paragraph

FALSIFY = (sys.executable, "-m", "falsify.cli")
PV = (sys.executable, "-m", "falsify.cli.pv")


@dataclass(frozen=True)
class Job:
    name: str
    argv: tuple[str, ...]
    goal_s: float
    # exit codes that are a verdict, not a broken job: a third-party kernel that fails checks
    # (exit 1) was judged, and how long judging it took is the figure
    verdict_exits: tuple[int, ...] = (0,)


@dataclass
class Timing:
    job: Job
    wall_s: float
    exit: int
    log: Path

    @property
    def broken(self) -> bool:
        return self.exit not in self.job.verdict_exits

    @property
    def verdict(self) -> str:
        if self.broken:
            return f"failed (exit {self.exit})"
        judged = " (checks failed: the kernel's findings)" if self.exit == 1 else ""
        if self.wall_s <= self.job.goal_s:
            return "within goal" + judged
        return f"over goal x{self.wall_s / self.job.goal_s:.1f}" + judged


def jobs(args, ledger: Path) -> list[Job]:
    led = ("--ledger", str(ledger), *args.contracts)
    out = [Job("main job: falsify run", (*FALSIFY, "run", *led), 300.0),
           Job("falsify run --changed (nothing changed)", (*FALSIFY, "run", "--changed", *led),
               10.0),
           Job("pv coverage", (*PV, "coverage", *led), 2.0),
           Job("pv status", (*PV, "status"), 2.0)]
    if args.third_party:
        contract, bind = args.third_party
        out.append(Job(f"third-party binding: falsify run {contract} --bind {bind}",
                       (*FALSIFY, "run", contract, "--bind", bind,
                        "--ledger", str(ledger.with_name("ledger-bind.json"))), 60.0,
                       verdict_exits=(0, 1)))
    if args.ci:
        out.append(Job("CI gate: .ci/run", ("bash", ".ci/run"), 1500.0))
    return out


def run_job(job: Job, root: Path, logdir: Path) -> Timing:
    log = logdir / (job.name.split(":")[0].replace(" ", "-") + ".log")
    env = dict(os.environ, FALSIFY_QUIET="1")
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(job.argv, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT)
    return Timing(job, time.perf_counter() - t0, proc.returncode, log)


def fmt_goal(left: list[Job]) -> str:
    from falsify.harness.progress import fmt_seconds

    return fmt_seconds(sum(j.goal_s for j in left))


def _tail(path: Path, lines: int = 15) -> str:
    """What a failed job's log says: each failure line the run printed as it happened (they
    name the contract and check, and lie above the summary), then the log's last lines."""
    text = path.read_text(errors="replace").splitlines()
    failures = [x for x in text[:-lines] if x.startswith(("FAILED ", "MUTANT SURVIVED "))]
    return "\n".join(failures[:20] + text[-lines:])


def report(timings: list[Timing], fmt: str) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if fmt == "json":
        print(json.dumps({"cpus": os.cpu_count(), "load_1min": load, "jobs": [
            {"job": t.job.name, "wall_s": round(t.wall_s, 2), "goal_s": t.job.goal_s,
             "exit": t.exit, "verdict": t.verdict} for t in timings]}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"falsify bench self ({os.cpu_count()} cores, load {load:.1f}; "
                        "goals are for a quiet 2-core machine)")
    for col in ("job", "wall s", "goal s", "verdict"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    for t in timings:
        table.add_row(t.job.name, f"{t.wall_s:.1f}", f"{t.job.goal_s:g}", t.verdict)
    Console().print(table)


def cmd_self(args) -> int:
    from falsify.harness.project import require_project

    proj = require_project("falsify bench self")
    if args.ci and not (proj.root / ".ci" / "run").is_file():
        raise UsageError(f"--ci: the project at {proj.root} has no .ci/run")
    from rich.console import Console

    from falsify.harness.progress import Progress

    with tempfile.TemporaryDirectory(prefix="falsify-bench-self-") as tmp:
        timings = []
        todo = jobs(args, Path(tmp) / "ledger.json")
        # the jobs take minutes: on a terminal jobs done of total, the job now and an ETA
        # from their goals; in a log one line per finished job. Stderr: stdout is the report.
        view = Progress(Console(stderr=True), "jobs", total=len(todo), ticking=False,
                        eta=lambda: "goals left " + fmt_goal(todo[len(timings):]))
        with view:
            for job in todo:
                view.start(job.name)
                t = run_job(job, proj.root, Path(tmp))
                timings.append(t)
                view.finished(f"bench self: {job.name}: {t.wall_s:.1f} s (goal {job.goal_s:g} "
                              f"s), {t.verdict}")
                if t.broken:
                    view.failed(_tail(t.log))
        report(timings, args.format)
    return 1 if any(t.broken for t in timings) else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("contracts", nargs="*", metavar="CONTRACT",
                   help="time the run jobs on these contracts only (default: all of the "
                        "project's, as `falsify run` selects them)")
    p.add_argument("--third-party", nargs=2, metavar=("CONTRACT", "EQ.BACKEND=module:function"),
                   help="also time one contract with this binding (goal 60 s)")
    p.add_argument("--ci", action="store_true",
                   help="also time the project's CI gate, .ci/run (goal 25 min)")
    p.add_argument("--format", choices=("table", "json"), default="table")


def register(sub) -> None:
    p = sub.add_parser("self", help="falsify's own verdicts timed beside their goals",
                       description=first_paragraph(__doc__))
    add_arguments(p)
    p.set_defaults(func=cmd_self)
