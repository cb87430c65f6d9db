"""Run a set of generated checks once, in a subprocess, against the unmutated code or one
mutant (falsify.harness.mutation_apply), and say how it went.

Each run is a fresh interpreter: a mutant served by the import system must be imported before
anything else holds the original, and a run that hangs is killed with its whole process group
without touching the caller. Everything the run writes (its ledger, its hypothesis example
database, the run manifest) goes to a temporary directory that is removed afterwards: the
project's ledger keeps only what `falsify run` records, and examples a mutant made fail are not
replayed against the real code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from falsify.harness import handover
from falsify.harness.files import atomic_write
from falsify.harness.mutation_apply import ENV

PLUGIN = "falsify.harness.mutation_apply"


@dataclass(frozen=True)
class Outcome:
    status: str  # passed (survived, for a mutant) | failed (killed) | timed out | error
    seconds: float
    failed_check: str = ""  # the first failing check, for a kill
    detail: str = ""  # the tail of pytest's output, for an error
    # seconds per (contract, check, backend), every dtype summed, of the checks that ran
    durations: dict = field(default_factory=dict)
    source: str = "run"  # "ledger": an unmutated run's result taken from current evidence


def run_checks(manifest: dict, modules: list[Path], keep: set[tuple[str, str, str]],
               mutation: dict | None, timeout: float | None, cwd: Path,
               order: list[tuple[str, str, str]] | None = None) -> Outcome:
    """`keep` checks (contract, check, backend) of `modules`, stopping at the first failure,
    under `mutation` ({module, path, source}) or none; `timeout` seconds at most. `order`: the
    checks to run first, in that order (the rest follow in collection order)."""
    with tempfile.TemporaryDirectory(prefix="falsify-mutate-") as tmp:
        t = Path(tmp)
        m = handover.write(t / "manifest.json", handover.Manifest(**{
            **manifest, "ledger": str(t / "ledger.json"), "results": str(t / "results.json"),
            "example_db": str(t / "examples"), "select": "checks",
            "backends": sorted({k[2] for k in keep})}))
        spec = {**(mutation or {"module": None}), "keep": sorted(map(list, keep)),
                "order": [list(k) for k in order or ()], "report": str(t / "killed.json")}
        atomic_write(t / "mutation.json", json.dumps(spec))
        # -x: one failing check kills the mutant, the rest need not run. The project's own
        # addopts are left out: an `-n auto` there would start workers, each paying the
        # imports again, for a run that mostly stops at its first failure
        cmd = [sys.executable, "-m", "pytest", *map(str, modules), "--falsify-manifest", str(m),
               "-p", PLUGIN, "-p", "no:cacheprovider", "-x", "-q", "--no-header",
               "-o", "addopts="]
        env = dict(os.environ, **{ENV: str(t / "mutation.json")})
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: pytest and any workers
            proc.communicate()
            return Outcome("timed out", time.monotonic() - start)
        seconds = time.monotonic() - start
        killed = t / "killed.json"
        if proc.returncode in (1, 2) and killed.exists():  # a failed check or collection
            what = json.loads(killed.read_text(encoding="utf-8"))["killed_by"]
            return Outcome("failed", seconds, failed_check=what)
        if proc.returncode == 0:
            return Outcome("passed", seconds, durations=_durations(t / "ledger.json"))
        return Outcome("error", seconds, detail=f"pytest exit {proc.returncode}:\n"
                                                + "\n".join(out.splitlines()[-15:]))


def _durations(ledger: Path) -> dict[tuple[str, str, str], float]:
    """Seconds per (contract, check, backend) in a run's ledger, its dtypes summed."""
    if not ledger.is_file():
        return {}
    out: dict[tuple[str, str, str], float] = {}
    for e in json.loads(ledger.read_text(encoding="utf-8")).get("runs", {}).values():
        k = (e["contract"], e["check"], e["backend"])
        out[k] = out.get(k, 0.0) + float(e.get("duration_s") or 0.0)
    return out
