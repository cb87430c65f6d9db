"""The results ledger: every executed check and mutant, latest result per key.

One JSON file per project (its `ledger` key, default .falsify/ledger.json). Writers take an
exclusive lock, merge their entries over what is on disk and replace the file atomically
(temp file + os.replace), so parallel pytest-xdist runs and concurrent `falsify` processes
neither lose nor corrupt entries. Only the pytest controller writes; workers ship entries to
it in reports.
"""

from __future__ import annotations

import fcntl
import json
import time
from contextlib import contextmanager
from pathlib import Path

from falsify.harness.files import atomic_write

VERSION = 1
OUTCOMES = ("passed", "failed", "error", "skipped", "unproven")


def run_key(e: dict) -> str:
    return "|".join((e["contract"], e["check"], e["backend"], e["variant"]))


def mutant_key(e: dict) -> str:
    return "|".join((e["contract"], e["mutant"]))


class LedgerError(Exception):
    pass


def load(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        return {"version": VERSION, "runs": {}, "mutants": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LedgerError(f"{path}: not a valid ledger ({e}); delete it to start afresh") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise LedgerError(f"{path}: unknown ledger version {data.get('version')!r}")
    data.setdefault("runs", {})
    data.setdefault("mutants", {})
    return data


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(data: dict, path: Path) -> None:
    """Replace the ledger at `path` with `data`: a temp file in the same directory, fsynced,
    then os.replace, so a reader sees the old file or the new one, never half of either."""
    data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True), durable=True)


def merge(entries: list[dict], mutants: list[dict], path: Path) -> Path:
    """Merge new entries over the ledger on disk, atomically."""
    path = Path(path)
    with _locked(path):
        data = load(path)
        for e in entries:
            data["runs"][run_key(e)] = e
        for m in mutants:
            data["mutants"][mutant_key(m)] = m
        _write(data, path)
    return path


class LedgerConflict(LedgerError):
    """Two ledgers hold the same key with different verdicts or hashes."""


# what makes two entries of one key the same result: the verdict, and the contract text and
# implementation it judged (times, seeds and durations differ between any two runs); for a
# `falsify mutate` result, its status and the function it mutated
_SAME = ("outcome", "sha256", "impl_sha", "status", "function_sha256")


def combine(paths: list[Path]) -> dict:
    """The union of several ledgers (shards of one run). A key held by two files must carry
    the same outcome and hashes in both; otherwise LedgerConflict names the key and both
    files. Of two agreeing entries, the later one (by `time`) is kept."""
    out = {"version": VERSION, "runs": {}, "mutants": {}}
    origin: dict[tuple[str, str], Path] = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise LedgerError(f"{path}: no such ledger")
        data = load(path)
        for section in ("runs", "mutants", "mutations"):
            if section not in data:  # `mutations`: only where `falsify mutate` wrote some
                continue
            for key, e in data[section].items():
                old = out.setdefault(section, {}).get(key)
                if old is not None:
                    diff = [f for f in _SAME if old.get(f) != e.get(f)]
                    if diff:
                        what = "; ".join(f"{f} {old.get(f)!r} vs {e.get(f)!r}" for f in diff)
                        raise LedgerConflict(f"{section[:-1]} {key!r} differs between "
                                             f"{origin[section, key]} and {path}: {what}")
                    if str(e.get("time", "")) <= str(old.get("time", "")):
                        continue
                out[section][key] = e
                origin[section, key] = path
    return out


def write_merged(paths: list[Path], out: Path) -> dict:
    """`pv ledger merge`: combine `paths` and write the result to `out` atomically (under
    the ledger lock, so a concurrent writer to `out` is not lost)."""
    data = combine(paths)
    out = Path(out)
    with _locked(out):
        _write(data, out)
    return data


def set_provenance(path: Path, provenance: dict) -> dict:
    """Record what a committed ledger is evidence of (falsify.harness.evidence), atomically
    and under the ledger lock; the entries are left as they are."""
    path = Path(path)
    if not path.is_file():
        raise LedgerError(f"{path}: no such ledger")
    with _locked(path):
        data = load(path)
        data["provenance"] = dict(provenance)
        _write(data, path)
    return data


def mutation_score(statuses) -> float | None:
    """killed / (killed + survived + timed out) over `falsify mutate` statuses: of the mutants
    the checks ran to the end, the share they caught; None where there were none. Equivalent,
    not reached, error and not run do not count."""
    statuses = list(statuses)
    judged = sum(s in ("killed", "survived", "timed out") for s in statuses)
    return statuses.count("killed") / judged if judged else None


def merge_mutations(results: dict[str, dict], path: Path) -> Path:
    """`falsify mutate`'s results, by mutant id, into the ledger's `mutations` section (locked,
    atomic); the `runs` and `mutants` sections are left as they are."""
    path = Path(path)
    with _locked(path):
        data = load(path)
        data.setdefault("mutations", {}).update(results)
        _write(data, path)
    return path
