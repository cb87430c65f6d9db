"""One writer per run directory: a second run on a live run's directory is refused naming the
holder; a lock left by a killed run is taken over, with a message."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.llm import run as RUN

# A live run as the lock sees it: the flock held on .falsify-run.lock and its record written.
# Plain fcntl, not run_lock, so that the refusal is shown against code that takes no lock.
_HOLDER = """
import fcntl, json, os, sys, time
from pathlib import Path
run = Path(sys.argv[1])
run.mkdir(parents=True, exist_ok=True)
fd = os.open(run / ".falsify-run.lock", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(),
                         "command": "holder"}).encode())
print("held", flush=True)
time.sleep(600)
"""


def _hold(run_dir: Path) -> subprocess.Popen:
    """A live run as another process holds it: the lock taken, then asleep."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("locked") / "run"
    RUN.train(RUN.tiny_config(run, max_steps=4, save_interval=2, warmup_steps=0), stop_after=2)
    return run


def test_second_writer_on_a_live_run_is_refused_with_the_holders_pid(tmp_path, short_run):
    import shutil

    run = Path(shutil.copytree(short_run, tmp_path / "run"))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    proc = _hold(run)
    try:
        p = subprocess.run([sys.executable, "-m", "falsify", "train", f"out_dir={run}",
                            "--resume"], capture_output=True, text=True, timeout=300)
    finally:
        _kill(proc)
    out = (p.stdout + p.stderr).replace("\n", "")
    assert p.returncode == 2 and "Traceback" not in out, out
    assert f"another run writes this directory: PID {proc.pid} (started " in out, out
    # nothing was read, pruned or written by the refused run
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


@pytest.mark.parametrize("verb", ["train", "distill", "finetune"])
def test_every_run_type_takes_the_lock(tmp_path, verb, monkeypatch):
    """A fresh run of each kind on a held directory is refused before it reads anything:
    distill before it loads its teacher (with none given, training the built-in base)."""
    from falsify.llm import distill as D
    from falsify.llm import finetune as FT
    from falsify.llm import run_lock as L
    from falsify.llm.finetune_stage import finetune

    def no_teacher(*a, **k):
        raise AssertionError("the teacher was loaded before the run directory was locked")

    monkeypatch.setattr(D, "load_teacher", no_teacher)
    run = tmp_path / "run"
    proc = _hold(run)
    try:
        with pytest.raises(L.RunDirLocked, match=f"PID {proc.pid}"):
            if verb == "train":
                RUN.train(RUN.tiny_config(run, max_steps=2, warmup_steps=0))
            elif verb == "distill":
                D.distill(D.DistillConfig(out_dir=str(run), max_steps=2, warmup_steps=0))
            else:
                finetune(FT.FinetuneConfig(out_dir=str(run), max_steps=2, warmup_steps=0))
    finally:
        _kill(proc)


def test_a_killed_runs_lock_is_taken_over_with_a_message(tmp_path, caplog):
    from falsify.llm import run_lock as L

    run = tmp_path / "run"
    proc = _hold(run)
    _kill(proc)  # kill -9: the kernel drops the flock, the file with its record stays
    assert json.loads((run / L.LOCK_NAME).read_text())["pid"] == proc.pid
    caplog.set_level("WARNING")
    lock = L.acquire(run)
    try:
        said = [r.getMessage() for r in caplog.records]
        assert any(f"took over the lock of PID {proc.pid}" in m for m in said), said
        assert json.loads((run / L.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert (run / L.LOCK_NAME).read_text() == ""  # released: the next run takes no warning
    L.acquire(tmp_path / "fresh").release()
    assert not (tmp_path / "fresh").exists()  # created for a run that wrote nothing: removed


def test_a_finished_run_releases_the_lock(tmp_path, short_run):
    """A completed run leaves an empty record, so the next run neither waits nor warns."""
    from falsify.llm import run_lock as L

    assert (short_run / L.LOCK_NAME).read_text() == ""
    L.acquire(short_run).release()
