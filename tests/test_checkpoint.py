"""Checkpoints: kill-and-resume continues bit-identically (in-process stop and a real SIGKILL of
a separate process), atomic directory writes, retention of last-N + best, RNG round trip."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from falsify.llm import checkpoint as C
from falsify.llm import config as LC
from falsify.llm import run as RUN
from falsify.llm import trainer as TR
from falsify.llm.checkpoint_load import load_checkpoint
from falsify.llm.model import build_model


def test_stop_and_resume_is_bit_identical(tmp_path):
    """Train 12 steps straight vs 5 steps, stop, resume, continue to 12 (grad_accum 2, so the
    data position inside accumulation matters; the schedule is mid-cosine at the cut)."""
    r = RUN.resume_equivalence(12, 5, tmp_path, grad_accum=2)
    assert r["resumed_from"].endswith("step-00000005")
    assert r["losses_killed"] == r["losses_straight"][:5]
    assert r["losses_resumed"] == r["losses_straight"][5:]  # exact float equality
    assert r["bit_identical"] and r["max_abs_diff"] == 0.0
    assert r["val_straight"] == r["val_resumed"]


def test_resume_without_data_position_would_differ(tmp_path):
    """The check can fail: resuming with the data position reset replays the first batches,
    and the continuation no longer matches."""
    straight = RUN.train(RUN.tiny_config(tmp_path / "a", max_steps=8, warmup_steps=0))
    cfg = RUN.tiny_config(tmp_path / "b", max_steps=8, warmup_steps=0)
    RUN.train(cfg, stop_after=4)
    ck = C.latest_checkpoint(tmp_path / "b")
    state_file = ck / C.STATE
    state = C.read_state(ck)
    state["data"]["step_in_epoch"] = 0

    state_file.write_text(json.dumps(state))
    C.write_manifest(ck)  # a deliberate edit: re-seal it, or resume refuses it as damaged
    resumed = RUN.train(cfg, resume="auto")
    assert resumed.losses != straight.losses[4:]


def _launch(out_dir: Path, extra: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "falsify", "train", f"out_dir={out_dir}", "progress=false",
            *[f"{k}={v}" for k, v in RUN.TINY_TEST.items() if k not in ("progress",)], *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    """A real `kill -9` of `falsify train` mid-run, then `--resume`: the continuation equals an
    uninterrupted run bit for bit, and the killed process left no partial checkpoint behind."""
    steps = ["max_steps=40", "warmup_steps=4", "save_interval=1", "keep_last=3",
             "eval_interval=40", "threads=1"]
    killed = tmp_path / "killed"
    proc = _launch(killed, steps)
    deadline = time.time() + 90
    while time.time() < deadline:
        ck = C.latest_checkpoint(killed)
        if ck is not None and C.read_state(ck)["step"] >= 6:
            break
        if proc.poll() is not None:
            pytest.fail("training process ended before it could be killed")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at = C.read_state(C.latest_checkpoint(killed))["step"]
    assert 6 <= at < 40, "the run should have been killed mid-way"
    cfg = LC.load_config(None, [f"out_dir={killed}", *[f"{k}={v}" for k, v in
                                                     RUN.TINY_TEST.items()], *steps])
    threads = torch.get_num_threads()
    try:  # threads=1 as in the subprocess: the same reduction order, so bitwise comparable
        resumed = RUN.train(cfg, resume="auto", keep_model=True)
        straight = RUN.train(LC.config_from_dict({"out_dir": str(tmp_path / "straight")},
                                              base=cfg), keep_model=True)
    finally:
        torch.set_num_threads(threads)
    assert resumed.final_step == 40
    assert resumed.losses == straight.losses[at:]
    a, b = resumed.model.state_dict(), straight.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # only complete checkpoints remain visible; temp dirs from the kill are never "latest"
    assert all((p / C.STATE).exists() for p in C.list_checkpoints(killed))


def _dummy(tmp_path):
    cfg = RUN.tiny_config(tmp_path, max_steps=4, warmup_steps=0)
    model = build_model(LC.model_config(cfg), "torch", seed=0)
    tr = TR.Trainer(model, cfg, torch.device("cpu"))
    x = torch.randint(4, 512, (2, 32))
    tr.train_step([(x, x.roll(-1, 1))])
    return tr


def _save(tr, run, step, val=None, keep=2):
    return C.save_checkpoint(run, step, tr.model, tr.optimizer, tr.param_names,
                             data_state={"epoch": 0}, config={},
                             metrics={"val_loss": val} if val is not None else {},
                             keep_last=keep)


def test_incomplete_and_temp_dirs_are_ignored(tmp_path):
    tr = _dummy(tmp_path)
    _save(tr, tmp_path, 1)
    root = C.checkpoints_dir(tmp_path)
    (root / ".tmp-step-00000009-abc").mkdir()          # a write that was killed
    (root / "step-00000007").mkdir()                   # no state.json: not complete
    (root / "step-00000007" / "model.safetensors").write_bytes(b"partial")
    assert C.latest_checkpoint(tmp_path).name == "step-00000001"
    assert [p.name for p in C.list_checkpoints(tmp_path)] == ["step-00000001"]


def test_retention_keeps_last_n_and_best(tmp_path):
    tr = _dummy(tmp_path)
    for step, val in [(1, 5.0), (2, 3.0), (3, 4.0), (4, 4.5), (5, None)]:
        _save(tr, tmp_path, step, val, keep=2)
    names = [p.name for p in C.list_checkpoints(tmp_path)]
    assert names == ["step-00000002", "step-00000004", "step-00000005"]
    assert C.best_checkpoint(tmp_path).name == "step-00000002"
    assert not [p for p in C.checkpoints_dir(tmp_path).iterdir() if p.name.startswith(".")]


def test_contents_and_strict_load(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    w = load_file(str(ck / "model.safetensors"))
    assert set(w) == set(tr.param_names) and all(v.dtype == torch.float32 for v in w.values())
    opt = load_file(str(ck / "optimizer.safetensors"))
    assert {f"{n}.{k}" for n in tr.param_names for k in ("step", "exp_avg", "exp_avg_sq")} == \
        set(opt)
    state = C.read_state(ck)
    assert state["optimizer_groups"][0]["betas"] == [0.9, 0.95]
    # a model of another shape is refused with the tensor named
    cfg = RUN.tiny_config(tmp_path, hidden_size=32, num_heads=4)
    other = build_model(LC.model_config(cfg), "torch", seed=0)
    with pytest.raises(C.CheckpointError, match="shape"):
        load_checkpoint(ck, other, None, tr.param_names)


def test_changed_beta2_on_resume_is_refused(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    cfg = RUN.tiny_config(tmp_path / "x", beta2=0.999)
    tr2 = TR.Trainer(build_model(LC.model_config(cfg), "torch", seed=0), cfg,
                    torch.device("cpu"))
    with pytest.raises(C.CheckpointError, match="betas"):
        load_checkpoint(ck, tr2.model, tr2.optimizer, tr2.param_names)


def test_rng_state_round_trip():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    js, ts = C.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    C.set_rng_state(js, ts)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


# --------------------------------------------------------------------- damaged checkpoints
def _damage(run: Path, case: str) -> str:
    """Damage the newest checkpoint (step 8) or the metrics log as a crash or a bad copy
    would; returns the file the message must name."""
    ck = C.checkpoints_dir(run) / "step-00000008"
    if case == "truncated_model":
        f = ck / "model.safetensors"
        os.truncate(f, f.stat().st_size // 2)
        return "model.safetensors"
    if case == "torn_state":
        f = ck / C.STATE
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        return C.STATE
    if case == "deleted_rng":
        (ck / "rng.safetensors").unlink()
        return "rng.safetensors"
    if case == "bit_flip":  # same size: only the sha256 can see it
        f = ck / "optimizer.safetensors"
        b = bytearray(f.read_bytes())
        b[-5] ^= 0x01
        f.write_bytes(bytes(b))
        return "optimizer.safetensors"
    assert case == "torn_metrics"
    with (run / "metrics.jsonl").open("ab") as fh:  # a kill mid-write of step 9's record
        fh.write(b'{"step": 9, "loss": 6.1')
    return "metrics.jsonl"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run of 12 steps stopped after 8, checkpoints at 4 and 8 (copied per test)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    RUN.train(RUN.tiny_config(run, max_steps=12, save_interval=4, keep_last=3, warmup_steps=0),
            stop_after=8)
    assert [p.name for p in C.list_checkpoints(run)] == ["step-00000004", "step-00000008"]
    return run


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


DAMAGE = ["truncated_model", "torn_state", "deleted_rng", "bit_flip"]


@pytest.mark.parametrize("case", DAMAGE)
def test_named_damaged_checkpoint_is_refused_with_the_intact_one_offered(tmp_path, capsys,
                                                                         stopped_run, case):
    from falsify.cli import main as falsify_main

    def main(argv):
        return falsify_main(["train", *argv])

    run = _copy(stopped_run, tmp_path / "run")
    name = _damage(run, case)
    for target in (run, C.checkpoints_dir(run) / "step-00000008"):
        assert main(["--resume", str(target)]) == 2
        out, err = capsys.readouterr()
        errors = [ln for ln in (out + err).splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in out + err, out + err
        msg = errors[0]
        assert f"step-00000008 is damaged: {name}" in msg
        assert f"--resume {C.checkpoints_dir(run) / 'step-00000004'}" in msg  # how to go on
    # nothing was lost: both checkpoints are still there, the damaged one untouched
    assert sorted(p.name for p in C.checkpoint_dirs(run)) == ["step-00000004", "step-00000008"]


@pytest.mark.parametrize("case", DAMAGE)
def test_resume_auto_takes_the_newest_intact_checkpoint_and_says_so(tmp_path, capsys, caplog,
                                                                    stopped_run, case):
    from falsify.cli import main as falsify_main

    def main(argv):
        return falsify_main(["train", *argv])

    run = _copy(stopped_run, tmp_path / "run")
    name = _damage(run, case)
    caplog.set_level("WARNING")
    assert main([f"out_dir={run}", "--resume"]) == 0
    out = capsys.readouterr().out
    said = [r.getMessage() for r in caplog.records if r.name == C.__name__]
    assert any(f"step-00000008 is damaged: {name}" in m and "step-00000004" in m
               for m in said), said
    assert f"resumed from {C.checkpoints_dir(run) / 'step-00000004'}" in out.replace("\n", "")
    assert C.read_state(C.latest_checkpoint(run))["step"] == 12
    C.verify_checkpoint(C.checkpoints_dir(run) / "step-00000008")  # re-written, intact again


def test_torn_metrics_line_is_repaired_not_fatal(tmp_path, capsys, caplog, stopped_run):
    from falsify.cli import main as falsify_main

    def main(argv):
        return falsify_main(["train", *argv])

    run = _copy(stopped_run, tmp_path / "run")
    _damage(run, "torn_metrics")
    caplog.set_level("WARNING")
    assert main([f"out_dir={run}", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out and \
        any("torn last line" in r.getMessage() for r in caplog.records)
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, 13))  # the torn step-9 record gone, 9..12 written anew


def test_damaged_line_before_the_last_is_an_error_naming_it(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(C.CheckpointError, match=r"metrics.jsonl:2: not a metrics record"):
        C.truncate_metrics(p, 3)
    assert p.read_text().count("\n") == 3  # left as it was


def test_resume_subprocess_names_the_file_and_exits_2(tmp_path, stopped_run):
    """As a user runs it: no traceback, one error line, exit 2."""
    run = _copy(stopped_run, tmp_path / "run")
    _damage(run, "torn_state")
    p = subprocess.run([sys.executable, "-m", "falsify", "train", "--resume", str(run)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr
    assert "step-00000008 is damaged: state.json" in p.stdout.replace("\n", "")


def test_checkpoint_without_manifest_still_gets_structural_checks(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    (ck / C.MANIFEST).unlink()  # lost: state.json's own hashes still verify it
    assert C.verify_checkpoint(ck)["step"] == 1
    f = ck / "model.safetensors"
    os.truncate(f, f.stat().st_size - 7)
    with pytest.raises(C.CheckpointDamaged, match="model.safetensors: not a valid safetensors"):
        C.verify_checkpoint(ck)


def test_manifest_less_checkpoint_with_flipped_bytes_is_damaged(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    (ck / C.MANIFEST).unlink()
    f = ck / "model.safetensors"
    b = bytearray(f.read_bytes())
    for i in range(1, 17):  # 16 bytes of weights: the header still parses
        b[-i] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(C.CheckpointDamaged, match=r"model.safetensors: sha256 differs from the "
                                                  r"one state.json recorded"):
        C.verify_checkpoint(ck)


def test_manifest_less_checkpoint_without_recorded_hashes_is_unverified(tmp_path):
    """As written before either record existed: nothing vouches for the weights."""
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    (ck / C.MANIFEST).unlink()
    state = C.read_state(ck)
    del state[C.STATE_HASHES]
    (ck / C.STATE).write_text(json.dumps(state))
    with pytest.raises(C.CheckpointDamaged, match=r"manifest.json: missing, and state.json "
                                                  r"records no sha256"):
        C.verify_checkpoint(ck)


def test_resume_auto_skips_a_manifest_less_corrupt_checkpoint(tmp_path, caplog, stopped_run):
    """The latest checkpoint's manifest deleted and 16 bytes of its weights flipped: resume
    falls back to step 4 and says so, as for any other damage."""
    run = _copy(stopped_run, tmp_path / "run")
    ck = C.checkpoints_dir(run) / "step-00000008"
    (ck / C.MANIFEST).unlink()
    f = ck / "model.safetensors"
    b = bytearray(f.read_bytes())
    b[-16:] = bytes(x ^ 0xFF for x in b[-16:])
    f.write_bytes(bytes(b))
    caplog.set_level("WARNING")
    cfg = RUN.tiny_config(run, max_steps=12, save_interval=4, keep_last=3, warmup_steps=0)
    r = RUN.train(cfg, resume="auto")
    assert r.resumed_from.endswith("step-00000004")
    assert any("step-00000008 is damaged: model.safetensors: sha256 differs" in rec.getMessage()
               for rec in caplog.records), [rec.getMessage() for rec in caplog.records]


def test_resume_rewrites_the_checkpoint_steps_torn_record(tmp_path, stopped_run):
    """Step 8's checkpoint intact, the last metrics line (step 8's record) torn: the resumed
    run's metrics.jsonl holds the records an uninterrupted run writes, step 8's included."""
    straight = tmp_path / "straight"
    cfg = dict(max_steps=12, save_interval=4, keep_last=3, warmup_steps=0)
    RUN.train(RUN.tiny_config(straight, **cfg))
    run = _copy(stopped_run, tmp_path / "run")
    m = run / "metrics.jsonl"
    lines = m.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["step"] == 8
    m.write_bytes(b"".join(lines[:-1]) + lines[-1][:20])  # torn, no newline
    RUN.train(RUN.tiny_config(run, **cfg), resume="auto")

    def shape(path):
        return [(r["step"], sorted(r)) for r in map(json.loads, path.read_text().splitlines())]

    assert shape(m) == shape(straight / "metrics.jsonl")


def test_no_intact_checkpoint_left_says_so(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    (ck / "rng.safetensors").unlink()
    with pytest.raises(C.CheckpointDamaged, match="rng.safetensors: missing; no intact"):
        C.find_checkpoint(tmp_path, fallback=True, for_resume=True)


# ---------------------------------------------------------------------------- orphans
_WRITER = """
import sys, torch
from falsify.llm import checkpoint as C
model = torch.nn.Linear(2048, 2048)  # 4.2M parameters: ~50 MB a checkpoint, a visible write
opt = torch.optim.AdamW(model.parameters(), foreach=False)
model(torch.ones(1, 2048)).sum().backward()
opt.step()
names = [n for n, _ in model.named_parameters()]
print("ready", flush=True)
for step in range(1, 10**6):
    C.save_checkpoint(sys.argv[1], step, model, opt, names, data_state={}, config={},
                      keep_last=1)
"""


def _temp_dirs(run: Path) -> list[Path]:
    root = C.checkpoints_dir(run)
    return [p for p in root.iterdir() if p.name.startswith(".tmp-") and p.is_dir()] \
        if root.is_dir() else []


def test_kill_9_during_a_save_leaves_an_orphan_the_next_start_removes(tmp_path, caplog):
    run = tmp_path / "run"
    for _ in range(5):  # the kill may land between two writes: try again
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(run)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 60
        while not _temp_dirs(run) and time.time() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if _temp_dirs(run):
            break
    orphans = _temp_dirs(run)
    assert orphans, "never caught the writer mid-save"
    assert all(Path(f"{o}.lock").exists() for o in orphans)  # the writer's lock file stays
    assert all(not p.name.startswith(".") for p in C.list_checkpoints(run))
    caplog.set_level("WARNING")
    removed = C.remove_orphans(run)
    assert sorted(removed) == sorted(orphans)
    assert not [p for p in C.checkpoints_dir(run).iterdir() if p.name.startswith(".")]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert all(str(o) in said for o in orphans) and "killed" in said


_HOLDER = """
import sys, time
from pathlib import Path
from falsify.llm import checkpoint as C
root = Path(sys.argv[1])
root.mkdir(parents=True, exist_ok=True)
tmp, fd, lock = C._locked_temp_dir(root, ".tmp-step-00000099-")
(tmp / "model.safetensors").write_bytes(b"half-written")
print(tmp, flush=True)
time.sleep(600)
"""


def test_a_live_writers_temp_dir_is_never_removed(tmp_path):
    """A second process mid-write (holding its lock) keeps its temp dir through a cleanup and
    a save next to it; once it is killed, the next cleanup removes it."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(C.checkpoints_dir(run))],
                            stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(proc.stdout.readline().strip())
        assert tmp.is_dir()
        assert C.remove_orphans(run) == []
        tr = _dummy(tmp_path)
        _save(tr, run, 1)  # a save cleans orphans first: this one is not an orphan
        assert (tmp / "model.safetensors").read_bytes() == b"half-written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert C.remove_orphans(run) == [tmp] and not tmp.exists()
    assert not Path(f"{tmp}.lock").exists()


def test_lockless_and_trash_leftovers(tmp_path):
    """Temp dirs from writers that predate the lock are removed only once long untouched;
    a cut-off prune's .trash- dir always."""
    root = C.checkpoints_dir(tmp_path)
    old, fresh, trash = (root / ".tmp-step-00000001-old", root / ".tmp-step-00000002-new",
                         root / ".trash-step-00000003-1-2")
    for d in (old, fresh, trash):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 100)
    past = time.time() - C.ORPHAN_MIN_AGE_S - 60
    for p in (old / "model.safetensors", old):
        os.utime(p, (past, past))
    assert sorted(C.remove_orphans(tmp_path)) == sorted([old, trash])
    assert fresh.is_dir()
