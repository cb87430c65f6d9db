"""Checkpoints: kill-and-resume continues bit-identically (in-process stop and a real SIGKILL of
a separate process), atomic directory writes, retention of last-N + best, RNG round trip."""

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

from falsify.impl.llm import checkpoint as C
from falsify.impl.llm import train as T


def test_stop_and_resume_is_bit_identical(tmp_path):
    """Train 12 steps straight vs 5 steps, stop, resume, continue to 12 (grad_accum 2, so the
    data position inside accumulation matters; the schedule is mid-cosine at the cut)."""
    r = T.resume_equivalence(12, 5, tmp_path, grad_accum=2)
    assert r["resumed_from"].endswith("step-00000005")
    assert r["losses_killed"] == r["losses_straight"][:5]
    assert r["losses_resumed"] == r["losses_straight"][5:]  # exact float equality
    assert r["bit_identical"] and r["max_abs_diff"] == 0.0
    assert r["val_straight"] == r["val_resumed"]


def test_resume_without_data_position_would_differ(tmp_path):
    """The check can fail: resuming with the data position reset replays the first batches,
    and the continuation no longer matches."""
    straight = T.train(T.tiny_config(tmp_path / "a", max_steps=8, warmup_steps=0))
    cfg = T.tiny_config(tmp_path / "b", max_steps=8, warmup_steps=0)
    T.train(cfg, stop_after=4)
    ck = C.latest_checkpoint(tmp_path / "b")
    state_file = ck / C.STATE
    state = C.read_state(ck)
    state["data"]["step_in_epoch"] = 0
    import json

    state_file.write_text(json.dumps(state))
    resumed = T.train(cfg, resume="auto")
    assert resumed.losses != straight.losses[4:]


def _launch(out_dir: Path, extra: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "falsify", "train", f"out_dir={out_dir}", "progress=false",
            *[f"{k}={v}" for k, v in T.TINY_TEST.items() if k not in ("progress",)], *extra]
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
    cfg = T.load_config(None, [f"out_dir={killed}", *[f"{k}={v}" for k, v in
                                                     T.TINY_TEST.items()], *steps])
    threads = torch.get_num_threads()
    try:  # threads=1 as in the subprocess: the same reduction order, so bitwise comparable
        resumed = T.train(cfg, resume="auto", keep_model=True)
        straight = T.train(T.config_from_dict({"out_dir": str(tmp_path / "straight")},
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
    cfg = T.tiny_config(tmp_path, max_steps=4, warmup_steps=0)
    model = T.build_model(T.model_config(cfg), "torch", seed=0)
    tr = T.Trainer(model, cfg, torch.device("cpu"))
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
    cfg = T.tiny_config(tmp_path, hidden_size=32, num_heads=4)
    other = T.build_model(T.model_config(cfg), "torch", seed=0)
    with pytest.raises(C.CheckpointError, match="shape"):
        C.load_checkpoint(ck, other, None, tr.param_names)


def test_changed_beta2_on_resume_is_refused(tmp_path):
    tr = _dummy(tmp_path)
    ck = _save(tr, tmp_path, 1)
    cfg = T.tiny_config(tmp_path / "x", beta2=0.999)
    tr2 = T.Trainer(T.build_model(T.model_config(cfg), "torch", seed=0), cfg,
                    torch.device("cpu"))
    with pytest.raises(C.CheckpointError, match="betas"):
        C.load_checkpoint(ck, tr2.model, tr2.optimizer, tr2.param_names)


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
