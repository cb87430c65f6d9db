"""falsify.harness.worker_plan: a `falsify run` starts the workers `-n` asks for only when its
work can pay for them; a small run stays in its own process, says so, and gives torch the
threads one worker would have had."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.harness import threads, worker_plan
from falsify.harness.generate import render
from falsify.harness.model import load_contract
from falsify.harness.plan import BACKENDS
from falsify.harness.project import library_dir

LIBRARY = sorted(library_dir().glob("*.yaml"))


@pytest.mark.parametrize("path", LIBRARY[:6] + LIBRARY[-6:], ids=lambda p: p.stem)
def test_the_planned_tests_are_the_generated_ones(path, tmp_path):
    """The plan names exactly the test functions the generator writes, so recorded durations
    (keyed by node id) find them."""
    c, _ = load_contract(path)
    written = set(re.findall(r"^def (test_\w+)\(", render(c, tmp_path), re.M))
    keep = [*BACKENDS, "z3", "crosshair"]
    planned = worker_plan.planned([c], keep, "all", [])
    assert {fn for _, fn, _ in planned} == written
    assert {mod for mod, _, _ in planned} == {f"test_{c.id.replace('-', '_')}.py"}
    checks = {fn for _, fn, m in worker_plan.planned([c], keep, "checks", []) if m == "falsify"}
    mutants = {fn for _, fn, _ in worker_plan.planned([c], keep, "mutants", [])}
    assert checks | mutants == written and not checks & mutants
    assert all("__reference__" in fn for _, fn, _ in worker_plan.planned([c], ["reference"],
                                                                           "checks", []))


def test_k_selects_as_pytest_does_on_the_names_it_knows():
    tests = [("test_a.py", "test_falsify_sm_001__reference__float32", "falsify"),
             ("test_a.py", "test_falsify_sm_001__torch__float32", "falsify"),
             ("test_a.py", "test_mut_sm_001", "falsify_mutant")]
    assert worker_plan.selected(tests, "reference and SM_001") == tests[:1]
    assert worker_plan.selected(tests, "not reference") == tests[1:]
    assert worker_plan.selected(tests, "falsify_mutant") == tests[2:]
    assert worker_plan.selected(tests, "(") == tests  # unreadable: pytest reports it
    assert worker_plan.selected(tests, None) == tests


def test_the_work_is_the_recorded_seconds_and_decides_the_workers():
    tests = [("test_a.py", f"test_{i}", "falsify") for i in range(4)]
    seen = {"tests/generated/test_a.py::test_0": 1.0, "tests/generated/test_a.py::test_1": 3.0,
            "elsewhere/test_a.py::test_2": 5.0, "tests/generated/test_b.py::test_3": 99.0}
    w = worker_plan.expected(tests, seen)
    assert (w.tests, w.timed, w.seconds) == (4, 3, 1.0 + 3.0 + 5.0 + 3.0)  # test_3: the median
    assert worker_plan.expected(tests, {}).seconds == 4 * worker_plan.UNTIMED_S
    assert worker_plan.workers_for(2, w) == 2  # 12 s is not below the threshold
    small = worker_plan.Work(tests=40, seconds=worker_plan.SMALL_WORK_S - 0.1, timed=40)
    large = worker_plan.Work(tests=40, seconds=worker_plan.SMALL_WORK_S + 0.1, timed=40)
    assert worker_plan.workers_for(2, small) == 1 and worker_plan.workers_for(2, large) == 2
    assert worker_plan.workers_for(8, worker_plan.Work(3, 600.0, 3)) == 3  # one test a worker
    assert worker_plan.workers_for(2, worker_plan.Work(1, 600.0, 1)) == 1
    assert worker_plan.workers_for(1, large) == 1


def test_in_this_process_torch_gets_one_workers_share_and_its_own_back(monkeypatch):
    import torch

    monkeypatch.delenv(threads.ENV, raising=False)
    before = torch.get_num_threads()
    with threads.as_one_of(2):
        assert torch.get_num_threads() == threads.share(2)
    assert torch.get_num_threads() == before
    with threads.as_one_of(1):
        assert torch.get_num_threads() == before
    monkeypatch.setenv(threads.ENV, "3")  # the user's choice wins
    with threads.as_one_of(2):
        assert torch.get_num_threads() == before


def _run(proj: Path, ledger: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, FALSIFY_QUIET="1", CI="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "falsify.cli", "run", "softmax-kernel-v1",
                           "-k", "reference and SM_001", "--backend", "reference",
                           "--no-mutants", "-n", "2", "--ledger", str(ledger)],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=600)


def test_a_small_run_stays_in_its_process_and_a_long_one_starts_workers(tmp_path):
    (tmp_path / "falsify.toml").write_text('backends = ["reference"]\n')
    ledger = tmp_path / "ledger.json"
    r = _run(tmp_path, ledger)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, out
    assert ("falsify: 2 test(s), about 4 s of work: run in this process, not on 2 workers"
            in out), out
    data = json.loads(ledger.read_text())
    assert len(data["runs"]) == 2 and {e["outcome"] for e in data["runs"].values()} == {"passed"}
    for e in data["runs"].values():  # as if each had taken a minute: now workers pay
        e["duration_s"] = 60.0
    ledger.write_text(json.dumps(data))
    r = _run(tmp_path, ledger)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0 and "run in this process" not in out, out
    assert "2 passed, 0 failed" in out, out


def test_the_help_states_the_threshold_the_plan_uses():
    from falsify.cli.run import WORKERS_HELP

    assert f"under {worker_plan.SMALL_WORK_S:g} s" in WORKERS_HELP
