"""One writer per run directory.

Every run that writes a run directory (pretraining, a resume, fine-tuning, GRPO, distillation,
rank 0 of a data-parallel job) first takes an exclusive, non-blocking flock on
`<out_dir>/.falsify-run.lock` and holds it until the run ends. Two writers on one directory
would interleave metrics, and one's pruning would delete checkpoints the other is verifying.

The lock file holds its holder's PID, start time and command as JSON, so a refused run can name
who holds it. The kernel drops a flock when its process dies (`kill -9` included), so a lock
file left by a killed run is merely a file: the next run takes the flock and says it took over.
A clean release empties the file instead of deleting it: deleting would let a third run lock a
fresh file while a second one still waits on the old one's inode.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import time
from pathlib import Path

from falsify.llm.checkpoint import CheckpointError

log = logging.getLogger(__name__)

LOCK_NAME = ".falsify-run.lock"


class RunDirLocked(CheckpointError):
    """Another live process writes this run directory (the CLI: exit 2)."""


class RunLock:
    """A held lock; `release()` (or the process's end) gives it up."""

    def __init__(self, run_dir: Path, fd: int, created: bool):
        self.run_dir, self.fd, self.created = run_dir, fd, created

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK_NAME

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
            if self.created and [p.name for p in self.run_dir.iterdir()] == [LOCK_NAME]:
                # the run wrote nothing (a preflight refused it): leave no directory behind
                self.path.unlink()
                self.run_dir.rmdir()
        finally:
            os.close(self.fd)
            self.fd = -1


def _holder(fd: int) -> dict | None:
    data = os.pread(fd, 65536, 0)
    if not data.strip():
        return None
    try:
        rec = json.loads(data)
    except ValueError:
        return {"unreadable": data[:80].decode("utf-8", "replace")}
    return rec if isinstance(rec, dict) else {"unreadable": str(rec)[:80]}


def _describe(rec: dict | None) -> str:
    if rec is None:
        return "a process that has not yet written its PID"
    if "unreadable" in rec:
        return f"a process whose lock record is unreadable ({rec['unreadable']!r})"
    started = rec.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
            if isinstance(started, (int, float)) else "an unknown time")
    return f"PID {rec.get('pid')} (started {when}: {rec.get('command', '?')})"


def acquire(run_dir: str | Path) -> RunLock:
    """Take the run directory's lock (creating the directory), or raise RunDirLocked naming
    the live holder. A record left by a dead holder is taken over, with a warning."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(_holder(fd))
        os.close(fd)
        raise RunDirLocked(f"{run_dir}: another run writes this directory: {holder}; wait for "
                           f"it to end or choose another out_dir ({run_dir / LOCK_NAME})") from None
    stale = _holder(fd)
    if stale is not None:
        log.warning("%s: took over the lock of %s, which no longer holds it (the process "
                    "ended without releasing it, e.g. killed)", run_dir / LOCK_NAME,
                    _describe(stale))
    record = {"pid": os.getpid(), "started": time.time(), "command": " ".join(sys.argv)}
    # Rewritten in place, not replaced: the flock belongs to this inode. Readers that race the
    # write see an empty or partial record and say so.
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    os.fsync(fd)
    return RunLock(run_dir, fd, created)


def release(lock: RunLock | None) -> None:
    if lock is not None:
        lock.release()
