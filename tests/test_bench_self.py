"""`falsify bench self` times each job as a user runs it and sets each beside its goal; a job
that fails is reported as failed, never as a figure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LITE = Path(__file__).parent / "fixtures" / "valid" / "softmax-lite-v1.yaml"
JOBS = ["main job: falsify run", "falsify run --changed (nothing changed)", "pv coverage",
        "pv status"]


def _bench(root: Path, *args):
    return subprocess.run([sys.executable, "-m", "falsify.cli", "bench", "self", "--format",
                           "json", *args], cwd=root, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, COLUMNS="200"))


@pytest.mark.heavy
def test_every_job_is_timed_beside_its_goal(tmp_path):
    (tmp_path / "contracts").mkdir()
    shutil.copy(LITE, tmp_path / "contracts" / LITE.name)
    (tmp_path / "falsify.toml").write_text('backends = ["reference", "torch"]\n')
    proc = _bench(tmp_path, "softmax-lite-v1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert [j["job"] for j in out["jobs"]] == JOBS
    goals = {j["job"]: j["goal_s"] for j in out["jobs"]}
    assert goals == dict(zip(JOBS, [300.0, 10.0, 2.0, 2.0]))
    for j in out["jobs"]:
        assert j["exit"] == 0 and j["wall_s"] > 0
        assert j["verdict"] == ("within goal" if j["wall_s"] <= j["goal_s"]
                                else f"over goal x{j['wall_s'] / j['goal_s']:.1f}")
    # one line per finished job, for a log
    assert sum(line.startswith("bench self: ") for line in proc.stderr.splitlines()) == 4
    assert not (tmp_path / ".falsify" / "ledger.json").exists()  # the project's evidence untouched


@pytest.mark.heavy
def test_a_failing_job_is_reported_failed_and_the_bench_exits_1(tmp_path):
    subprocess.run([sys.executable, "-m", "falsify.cli", "init"], cwd=tmp_path, check=True,
                   capture_output=True)  # the scaffold's placeholder kernel fails its check
    proc = _bench(tmp_path)
    assert proc.returncode == 1
    jobs = {j["job"]: j for j in json.loads(proc.stdout)["jobs"]}
    assert jobs["main job: falsify run"]["verdict"] == "failed (exit 1)"
    assert "FALSIFY-MYKERNEL-001" in proc.stderr  # the failing check, from the job's log


def test_ci_needs_the_projects_gate(tmp_path):
    (tmp_path / "falsify.toml").write_text("")
    proc = subprocess.run([sys.executable, "-m", "falsify.cli", "bench", "self", "--ci"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has no .ci/run" in proc.stderr


def test_a_third_party_kernel_that_fails_checks_was_judged_but_a_broken_job_is_not(tmp_path):
    """The guide's kernels fail some checks on purpose (exit 1): that run is a verdict and its
    time the figure. Exit 1 from any other job, or exit 2 from the third-party one, is not."""
    from falsify.bench.self import Job, Timing

    bind = Job("third-party binding", ("x",), 60.0, verdict_exits=(0, 1))
    main = Job("main job", ("x",), 300.0)
    log = tmp_path / "log"
    assert not Timing(bind, 42.0, 1, log).broken
    assert Timing(bind, 42.0, 1, log).verdict == \
        "within goal (checks failed: the kernel's findings)"
    assert Timing(bind, 90.0, 0, log).verdict == "over goal x1.5"
    assert Timing(bind, 42.0, 2, log).broken
    assert Timing(main, 42.0, 1, log).broken
    assert Timing(main, 42.0, 1, log).verdict == "failed (exit 1)"
