"""`falsify train --nproc N`: data-parallel training through torchrun's launcher, end to end on
the CPU with gloo (the loop's equivalences are distributed-train-v1's checks; these tests run
the command a user runs)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TINY = ["model=tiny", "corpus=synthetic", "synthetic_tokens=60000", "vocab_size=512",
        "hidden_size=64", "num_layers=2", "num_heads=4", "num_kv_heads=2",
        "intermediate_size=192", "seq_len=32", "grad_accum=2", "warmup_steps=0",
        "sample_tokens=0", "threads=1", "device=cpu", "backend=torch"]
EPS32 = 2.0 ** -24


def falsify(*argv, timeout=300, env=None, **kw):
    env = dict(env or os.environ, COLUMNS="400")
    return subprocess.run([sys.executable, "-m", "falsify", *argv], env=env, text=True,
                          capture_output=True, timeout=timeout, **kw)


def steps(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def _trained_a_step(run: Path) -> bool:
    """While a run is writing: a whole step line is in its metrics (a line being written is
    not read)."""
    try:
        text = (run / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return False
    return any('"loss"' in line for line in text.split("\n")[:-1])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone since it was listed
        return b""


def test_two_processes_train_what_one_process_trains(tmp_path):
    """2 ranks × batch 2 against 1 process × batch 4 on the same data: one metrics line per
    step (rank 0 writes), the same token counts, losses within distributed-train-v1's 700·ε₃₂
    and weights within its 1.2e-4 of the update."""
    common = [*TINY, "max_steps=6", "save_interval=3", "eval_interval=3"]
    ddp = falsify("train", "--nproc", "2", *common, "batch_size=2", f"out_dir={tmp_path / 'a'}")
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert ddp.stdout.count("trained 6 steps") == 1  # one report, from rank 0
    one = falsify("train", *common, "batch_size=4", f"out_dir={tmp_path / 'b'}")
    assert one.returncode == 0, one.stdout + one.stderr
    a, b = steps(tmp_path / "a"), steps(tmp_path / "b")
    assert [r["step"] for r in a] == list(range(1, 7))
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 700 * EPS32 * y["loss"]
    wa = load_file(tmp_path / "a" / "checkpoints" / "step-00000006" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "checkpoints" / "step-00000006" / "model.safetensors")
    from falsify.llm import config as LC
    from falsify.llm.model import build_model

    init = build_model(LC.model_config(LC.TrainConfig.load(None, [*common, "batch_size=4"])),
                       "torch", seed=0).state_dict()
    for k in wb:
        moved = float(torch.linalg.vector_norm(wb[k] - init[k]))
        assert float(torch.linalg.vector_norm(wa[k] - wb[k])) <= 2 * 6 * 2e-5 * moved + 1e-12, k


def test_a_bad_config_is_refused_once_before_any_rank_starts(tmp_path):
    r = falsify("train", "--nproc", "2", *TINY, "lr=0", f"out_dir={tmp_path / 'r'}")
    assert r.returncode == 2
    assert (r.stdout + r.stderr).count("lr=") == 1
    assert "rank" not in r.stderr and not (tmp_path / "r").exists()


def test_a_ddp_run_ends_with_its_sample_and_summary(tmp_path):
    """The run's last act, the sample, goes through the model every rank holds (DDP's wrapper
    has no `cfg`): every rank finishes, rank 0 prints the sample and writes summary.json. The
    flags reach every rank (3 steps, not the default 300, into --out), and the old key=value
    form's note is the launcher's one line, not one per rank."""
    tiny = [a for a in TINY if not a.startswith("sample_tokens=")]
    r = falsify("train", "--nproc", "2", *tiny, "--max-steps", "3", "--batch-size", "2",
                "--sample-tokens", "8", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_step"] == 3 and summary["sample"]
    assert "sample (prompt" in r.stdout
    assert (r.stdout + r.stderr).count("note: key=value is the old form") == 1


@pytest.mark.parametrize("verb", ["train", "finetune"])
def test_a_bad_warmup_is_refused_once_before_any_rank_starts(tmp_path, verb):
    """The warmup fraction is a preflight rule, not a field rule: both launchers check it."""
    args = TINY if verb == "train" else ["progress=false", "backend=torch"]
    r = falsify(verb, "--nproc", "2", *args, "max_steps=3", "warmup_steps=2",
                f"out_dir={tmp_path / 'r'}")
    assert r.returncode == 2
    assert (r.stdout + r.stderr).count("warmup_steps=2 is 66.7% of max_steps=3") == 1
    assert "rank" not in r.stderr and not (tmp_path / "r").exists()


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc (Linux)")
def test_a_killed_rank_stops_the_whole_job_with_an_error(tmp_path):
    """kill -9 of one rank mid-run: the launcher ends the other rank and exits non-zero, naming
    the rank, in bounded time (no hang in the next all-reduce)."""
    run = tmp_path / "k"
    env = dict(os.environ, COLUMNS="400")
    p = subprocess.Popen([sys.executable, "-m", "falsify", "train", "--nproc", "2", *TINY,
                          "batch_size=2", "max_steps=2000", "epochs=10",
                          "save_interval=100000", "eval_interval=100000", f"out_dir={run}"],
                         env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and not _trained_a_step(run):
            time.sleep(0.2)
        assert p.poll() is None and _trained_a_step(run), (
            p.communicate()[1][-2000:] if p.poll() is not None else "no step in 120 s")
        ranks = [c for c in _children(p.pid) for c in [c, *_children(c)]
                 if b"falsify" in _cmdline(c) and b"train" in _cmdline(c)]
        assert len(ranks) >= 2, ranks
        t0 = time.monotonic()
        os.kill(ranks[-1], signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert "rank" in err and "failed" in err, err[-2000:]
    assert stopped_in < 60


KILL_IN_SAVE = """
import os
if os.environ.get("RANK") == os.environ.get("KILL_RANK_IN_SAVE"):
    import signal
    import safetensors.torch as st
    real, saves = st.save_file, []

    def save_file(tensors, path, *a, **k):  # the rank's RNG file: after its shards, pre-commit
        if os.path.basename(str(path)).startswith("rng-rank"):
            saves.append(path)
            if len(saves) == int(os.environ["KILL_AT_SAVE"]):
                os.kill(os.getpid(), signal.SIGKILL)
        return real(tensors, path, *a, **k)
    st.save_file = save_file
"""


@pytest.mark.parametrize("victim", [0, 1])
def test_kill_9_of_a_rank_during_a_save_leaves_the_previous_checkpoint(tmp_path, victim):
    """One rank is killed (SIGKILL, from a sitecustomize hook) in the middle of the second
    sharded save, after its shards and before the commit: the job stops naming that rank, and
    step 3 stays the newest checkpoint and verifies intact. Rank 1 killed: rank 0, alive,
    removes the half-written step 6 itself. Rank 0 killed: the half-written step 6 stays as an
    orphan, which `--resume auto` removes before it continues from step 3 to the end."""
    from falsify.llm import checkpoint as C

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_IN_SAVE)
    run = tmp_path / "run"
    common = [*TINY, "batch_size=2", "max_steps=6", "save_interval=3", "eval_interval=3",
              f"out_dir={run}"]
    env = dict(PYTHONPATH=os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
               KILL_RANK_IN_SAVE=str(victim), KILL_AT_SAVE="2")
    killed = falsify("train", "--nproc", "2", *common, env=dict(os.environ, **env))
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert "failed" in killed.stderr, killed.stderr[-2000:]
    assert [p.name for p in C.list_checkpoints(run)] == ["step-00000003"]
    C.verify_checkpoint(run / "checkpoints" / "step-00000003")
    temps = [p.name for p in C.checkpoints_dir(run).iterdir() if p.name.startswith(".tmp-")]
    if victim == 1:
        assert temps == [], temps
        return
    assert any("step-00000006" in t and not t.endswith(".lock") for t in temps), temps
    again = falsify("train", "--nproc", "2", "--resume", "auto", *common)
    assert again.returncode == 0, again.stdout + again.stderr
    assert not [p for p in C.checkpoints_dir(run).iterdir() if p.name.startswith(".tmp-")]
    assert [r["step"] for r in steps(run)] == [1, 2, 3, 4, 5, 6]
    C.verify_checkpoint(run / "checkpoints" / "step-00000006")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_nodes(tmp_path, node_overrides: tuple[list, list], timeout=180):
    """Two "nodes" × 1 process on this machine: two launchers meeting at one c10d rendezvous,
    as on two machines."""
    endpoint = f"localhost:{_free_port()}"
    env = dict(os.environ, COLUMNS="400")
    procs = [subprocess.Popen([sys.executable, "-m", "falsify", "train", "--nproc", "1",
                               "--nnodes", "2", "--rdzv-endpoint", endpoint, *TINY, *over],
                              env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for over in node_overrides]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_two_nodes_meet_at_one_rendezvous_and_train_one_model(tmp_path):
    common = ["batch_size=2", "max_steps=4", f"out_dir={tmp_path / 'n'}"]
    outs = _two_nodes(tmp_path, (common, common))
    for _, _, err in outs:
        assert "failed" not in err, err[-2000:]
    assert sum(out.count("trained 4 steps") for _, out, _ in outs) == 1  # global rank 0 reports
    assert [r["step"] for r in steps(tmp_path / "n")] == [1, 2, 3, 4]


def test_ranks_built_with_different_models_stop_the_job(tmp_path):
    """A node started with another model config: DDP's check of the replicas raises on the
    ranks, and both launchers exit non-zero instead of training two models or hanging."""
    base = ["batch_size=2", "max_steps=4", f"out_dir={tmp_path / 'n'}"]
    outs = _two_nodes(tmp_path, (base, [*base, "intermediate_size=128"]), timeout=120)
    assert all(code != 0 for code, _, _ in outs), [(c, e[-800:]) for c, _, e in outs]
    assert any("failed" in err for _, _, err in outs)


def test_bench_distributed_counts_the_whole_gradient_once():
    """`falsify bench distributed`: every parameter of the tiny model is used, so DDP's buckets
    carry exactly the fp32 gradient, 4P bytes, once per step (accumulation under no_sync adds
    no all-reduce); the timings are positive and the communication share a fraction."""
    r = falsify("bench", "distributed", "--steps", "2", "--format", "json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["bytes_per_step"] == out["fp32_grad_bytes"] == 4 * out["params"], out
    assert out["single_step_s"] > 0 and out["ddp_step_s"] > 0 and out["speedup"] > 0, out
    assert -1 < out["comm_share"] < 1, out
    # in a log (no terminal): one line per finished side on stderr, beside stdout's JSON
    assert re.search(r"^bench distributed: one process: step [\d.]+ ms, \d+ s$\n"
                     r"^bench distributed: DDP 2 processes: step [\d.]+ ms, \d+ s$",
                     r.stderr, re.M), r.stderr


@pytest.mark.heavy
def test_resume_matrix_2_to_2_2_to_1_1_to_2(tmp_path):
    """2 → 2 processes resumes bit for bit; 2 → 1 and 1 → 2 continue the same loss curve
    (within distributed-train-v1's 700·ε₃₂) when batch_size × processes, the global batch the
    data position counts, stays the same; another global batch is refused, naming both."""
    common = [*TINY, "max_steps=6", "save_interval=3", "eval_interval=3"]
    runs = {"a": ("2", "batch_size=2", None), "a22": ("2", "batch_size=2", "a"),
            "a21": ("1", "batch_size=4", "a"), "e": ("1", "batch_size=4", None),
            "e12": ("2", "batch_size=2", "e")}
    for name, (nproc, batch, resume) in runs.items():
        extra = (["--resume", str(tmp_path / resume / "checkpoints" / "step-00000003")]
                 if resume else [])
        r = falsify("train", "--nproc", nproc, *extra, *common, batch,
                    f"out_dir={tmp_path / name}")
        assert r.returncode == 0, (name, r.stdout + r.stderr)

    def last(name):
        return load_file(tmp_path / name / "checkpoints" / "step-00000006" / "model.safetensors")

    a, a22 = last("a"), last("a22")
    assert all(torch.equal(a[k], a22[k]) for k in a)
    for straight, resumed in (("a", "a21"), ("e", "e12")):
        want = [r["loss"] for r in steps(tmp_path / straight)][3:]
        got = [r["loss"] for r in steps(tmp_path / resumed)]
        assert len(got) == 3
        assert all(abs(g - w) <= 700 * EPS32 * w for g, w in zip(got, want, strict=True))
    bad = falsify("train", "--resume", str(tmp_path / "a" / "checkpoints" / "step-00000003"),
                  *common, "batch_size=2", f"out_dir={tmp_path / 'bad'}")
    assert bad.returncode == 2
    assert "global batch 4" in bad.stdout and "1 × 2 = 2" in bad.stdout


def test_fsdp_trains_what_one_process_trains_and_resumes_bit_for_bit(tmp_path):
    """parallel=fsdp: each rank keeps half of every weight, gradient and AdamW moment; the
    checkpoint is the whole state (gathered, written by rank 0), so the one-process run's
    losses and weights are met within distributed-train-v1's bounds, and a resume from it on
    FSDP continues bit for bit."""
    common = [*TINY, "max_steps=6", "save_interval=3", "eval_interval=3"]
    runs = {"f": ("2", ["batch_size=2", "parallel=fsdp"], None),
            "f2": ("2", ["batch_size=2", "parallel=fsdp"], "f"),
            "one": ("1", ["batch_size=4"], None)}
    for name, (nproc, extra, resume) in runs.items():
        more = (["--resume", str(tmp_path / resume / "checkpoints" / "step-00000003")]
                if resume else [])
        r = falsify("train", "--nproc", nproc, *more, *common, *extra,
                    f"out_dir={tmp_path / name}")
        assert r.returncode == 0, (name, r.stdout + r.stderr)

    def last(name):
        return load_file(tmp_path / name / "checkpoints" / "step-00000006" / "model.safetensors")

    f, f2, one = last("f"), last("f2"), last("one")
    assert all(torch.equal(f[k], f2[k]) for k in f)
    for x, y in zip(steps(tmp_path / "f"), steps(tmp_path / "one"), strict=True):
        assert abs(x["loss"] - y["loss"]) <= 700 * EPS32 * y["loss"]
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 2e-4 * y["grad_norm"]
    assert max(float((f[k] - one[k]).abs().max()) for k in f) < 1e-5


@pytest.mark.parametrize("kind", ["sft", "preference"])
def test_finetune_on_two_processes_trains_what_one_process_trains(tmp_path, kind):
    """`falsify finetune --nproc 2` (QLoRA, DDP over the adapters), SFT and DPO: one metrics
    line per step from rank 0, the same counts (tokens, pairs) and the losses of one process
    with the doubled batch within distributed-train-v1's 700·ε₃₂ (the same fp32 arithmetic on
    rows grouped another way); DPO's per-pair stats are summed over the ranks; the adapter is
    exported once; a resume on another process count is refused."""
    from tests.test_finetune import base_with_tokenizer, shipped_records, write_jsonl

    base = base_with_tokenizer(tmp_path)
    recs = shipped_records(40)
    if kind == "preference":
        recs = [{"prompt": r["prompt"], "chosen": r["response"],
                 "rejected": recs[(i + 1) % len(recs)]["response"]} for i, r in enumerate(recs)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    common = ["--method", "qlora", "--model", str(base), "--data", str(data), "max_steps=3",
              "grad_accum=2", "lora_r=4", "val_split=0.2", "sample_count=0", "lr=3e-3",
              "progress=false", "backend=torch", "threads=1", "save_every=2"]
    two = falsify("finetune", "--nproc", "2", *common, "batch_size=2",
                  "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stdout + two.stderr
    assert two.stdout.count("trained 3/3 steps") == 1
    one = falsify("finetune", *common, "batch_size=4", "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stdout + one.stderr
    a, b = steps(tmp_path / "two"), steps(tmp_path / "one")
    assert [r["step"] for r in a] == [1, 2, 3]
    assert [r["count"] for r in a] == [r["count"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 700 * EPS32 * y["loss"], (x, y)
        if kind == "preference":  # means over the step's pairs, both ranks' pairs counted
            assert abs(x["accuracy"] - y["accuracy"]) < 1e-9, (x, y)
    assert (tmp_path / "two" / "adapter").is_dir()
    ck = tmp_path / "two" / "checkpoints" / "step-00000002"
    bad = falsify("finetune", "--resume", str(ck), *common, "batch_size=2",
                  "--out", str(tmp_path / "two"))
    assert bad.returncode == 2
    assert "written by 2 process(es); this run has 1" in bad.stdout.replace("\n", " ")
