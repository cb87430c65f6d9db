"""The device check kind: GPU against CPU on one case, bounded by twice a named parity check's
tolerance. Without a GPU it is skipped with the reason, never passed, and coverage lists its
obligations as needs-gpu outside the percentage. The comparison itself is exercised here on a
stand-in device (the CPU twice), since these machines have no GPU."""

from __future__ import annotations

import pytest

from falsify.harness import coverage, runtime
from falsify.harness.kinds import device
from falsify.harness.ledger import run_key
from falsify.harness.plan import runs as planned
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.device_fns"
ROWS = {"dtypes": ["float32"], "dims": {"m": [1, 6]},
        "args": {"x": {"shape": ["m"], "values": [-2.0, 2.0]}}, "examples": [{"m": 5}]}
TOL = {"why": "tanh is correctly rounded to a few ulp",
       "float32": {"atol": "eps", "rtol": "4 * eps"}}
PARITY = {"kind": "parity", "input": "rows", "tolerance": TOL}
DEVICE = {"kind": "device", "input": "rows", "parity": "FALSIFY-FIX-001"}


def _contract(tmp_path, fn, checks=None, **kw):
    eqs = {"f": {"reference": f"{FNS}:reference", "torch": f"{FNS}:{fn}"}}
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, checks or [PARITY, DEVICE]), **kw)


@pytest.fixture
def no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """The GPU side runs on the CPU: what the check compares, not where, is under test."""
    monkeypatch.setattr(device, "GPU", "cpu")
    monkeypatch.setattr(device, "unavailable", lambda backend: None)


def test_without_a_gpu_the_check_is_skipped_with_the_reason(tmp_path, no_gpu):
    c = _contract(tmp_path, "consistent")
    with pytest.raises(pytest.skip.Exception, match="needs a GPU: torch sees no CUDA device"):
        run_check(c, 1, "torch", "float32", first_case(c, 1, "float32"))
    assert device.unavailable("torch").startswith(device.NO_GPU)


def test_a_library_mutant_of_a_device_obligation_is_skipped_not_judged(no_gpu):
    # MUT-SM-005 is wrong only on CUDA: without a GPU nothing can kill it, and it must not
    # read as survived (or killed) either
    with pytest.raises(pytest.skip.Exception, match=device.NO_GPU):
        runtime.kill_mutant("softmax-kernel-v1", "MUT-SM-005")


def test_consistent_devices_pass(tmp_path, stand_in_gpu):
    c = _contract(tmp_path, "consistent")
    detail = run_check(c, 1, "torch", "float32", first_case(c, 1, "float32"))
    assert detail == {"gpu": "cpu", "cpu_side": "torch", "max_device_diff": 0.0}


def test_a_gpu_side_off_from_the_truth_fails_as_such(tmp_path, stand_in_gpu):
    c = _contract(tmp_path, "gpu_side_off")
    with pytest.raises(runtime.CheckFailed, match=r"on the GPU \(torch\) against the float64"):
        run_check(c, 1, "torch", "float32", first_case(c, 1, "float32"))


def test_a_cpu_side_off_fails_on_the_cross_device_bound(tmp_path, stand_in_gpu):
    c = _contract(tmp_path, "cpu_side_off")
    with pytest.raises(runtime.CheckFailed, match="GPU torch and CPU torch differ by 0.001"):
        run_check(c, 1, "torch", "float32", first_case(c, 1, "float32"))


@pytest.mark.parametrize("device_check, message", [
    (dict(DEVICE, parity="FALSIFY-FIX-009"), "parity 'FALSIFY-FIX-009' must name a parity check"),
    (dict(DEVICE, call={"x": "0"}), "differs from FALSIFY-FIX-001's"),
    ({"kind": "device", "input": "rows"}, "a device check needs `parity`"),
])
def test_v018_the_bound_must_come_from_a_parity_check_of_the_same_computation(
        tmp_path, device_check, message):
    rep = _contract(tmp_path, "consistent", [PARITY, device_check], expect_errors=True)
    assert any(f.rule == "V018" and message in f.message for f in rep.errors), rep.errors


def _ledger(c, outcome, message):
    runs = {}
    for t in c.checks:
        for r in planned(c, t):
            e = dict(contract=c.id, sha256=c.sha256, check=t.id, backend=r.backend,
                     variant=r.variant, outcome="passed")
            if t.kind == "device":
                e.update(outcome=outcome, message=message)
            runs[run_key(e)] = e
    return {"runs": runs, "mutants": {}}


def test_coverage_lists_skipped_device_obligations_apart_and_never_as_covered(tmp_path):
    c = _contract(tmp_path, "consistent")
    cov = coverage.compute([c], _ledger(c, "skipped", f"Skipped: {device.NO_GPU}: no CUDA"))
    assert cov.obligation(c.id, "FIX-002").status == "needs-gpu"
    assert cov.overall() == (1, 1)  # the parity obligation alone is counted
    assert cov.needs_gpu() == [f"{c.id}:FIX-002"]
    assert "1 obligation(s) need a GPU" in cov.as_text()


def test_a_skip_for_another_reason_or_a_gpu_failure_counts_as_usual(tmp_path):
    c = _contract(tmp_path, "consistent")
    cov = coverage.compute([c], _ledger(c, "skipped", "Skipped: somebody said so"))
    assert cov.obligation(c.id, "FIX-002").status == "skipped"
    assert cov.overall() == (1, 2)
    cov = coverage.compute([c], _ledger(c, "failed", "CheckFailed: differ"))
    assert cov.obligation(c.id, "FIX-002").status == "failing"
    assert cov.overall() == (1, 2)
