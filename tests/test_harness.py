"""End-to-end tests of the harness: generated checks, ledger, coverage gate, staleness,
mutants, --bind, and `pv generate --check`.

They work on a copy of the softmax contract without its Triton bindings (the interpreter is
slow, and Triton is covered by the generated suite itself) in a temporary project (a
falsify.toml that overrides the library's softmax-kernel-v1 with the copy), running the real
`falsify` and `pv` commands in subprocesses from the project directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from falsify.harness import ledger
from falsify.harness.project import library_dir

REPO = Path(__file__).resolve().parents[1]

CONTRACT = "softmax-kernel-v1"


def _without_triton(data: dict) -> dict:
    for eq in data["equations"].values():
        eq.get("bindings", {}).pop("triton", None)
    data["mutants"] = [m for m in data["mutants"] if not m["replaces"].endswith(".triton")]
    n = len(data["mutants"])
    data["qa_gate"]["pass_criteria"] = (f"All {len(data['falsification_tests'])} falsification "
                                        f"tests pass and all {n} mutants are killed")
    return data


@pytest.fixture()
def workspace(tmp_path):
    cdir = tmp_path / "contracts"
    cdir.mkdir()
    data = yaml.safe_load((library_dir() / f"{CONTRACT}.yaml").read_text())
    path = cdir / f"{CONTRACT}.yaml"
    path.write_text(yaml.safe_dump(_without_triton(data), sort_keys=False, allow_unicode=True))
    (tmp_path / "falsify.toml").write_text(
        'generated = "gen"\nledger = "l.json"\noverrides = ["softmax-kernel-v1"]\n')
    # PYTHONPATH: --bind names a function in this repository's tests/fixtures
    env = dict(os.environ, FALSIFY_QUIET="1", CI="1", COLUMNS="200", PYTHONPATH=str(REPO))
    return dict(dir=cdir, path=path, env=env, ledger=tmp_path / "l.json", tmp=tmp_path)


def run(ws, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", *args], cwd=ws["tmp"], env=ws["env"],
                          capture_output=True, text=True, timeout=timeout)


def falsify(ws, *args):
    return run(ws, "falsify.cli", *args)


def pv(ws, *args):
    return run(ws, "falsify.cli.pv", *args)


def edit(ws, fn):
    data = yaml.safe_load(ws["path"].read_text())
    fn(data)
    ws["path"].write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def coverage_json(ws) -> dict:
    r = pv(ws, "coverage", str(ws["dir"]), "--format", "json")
    return json.loads(r.stdout)


def status_of(cov: dict, oid: str) -> str:
    (c,) = cov["contracts"]
    return next(o["status"] for o in c["obligations"] if o["obligation"] == oid)


@pytest.mark.heavy
def test_full_run_covers_everything_and_edits_break_it(workspace):
    ws = workspace
    # `falsify run` runs the checks and the mutants, and its coverage line counts both
    r = falsify(ws, "run", str(ws["path"]), "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    # the device-consistency obligation and its mutant need a GPU: listed apart, not counted
    contract = yaml.safe_load(ws["path"].read_text())
    n, muts = len(contract["proof_obligations"]) - 1, len(contract["mutants"]) - 1
    summary = " ".join(r.stdout.split())
    assert f"coverage: {n}/{n} obligations covered (100.0%), counting checks and mutants" \
        in summary, summary
    assert f"mutants {muts}/{muts} killed" in summary
    assert "1 obligation(s) need a GPU (device consistency): not run here, not counted" \
        in summary
    assert "MUTANT NOT RUN softmax-kernel-v1 MUT-SM-005" in summary
    r = pv(ws, "coverage", str(ws["dir"]), "--min", "100")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{n}/{n} obligations covered" in r.stdout

    # every generated test left exactly one ledger entry, none lost under xdist
    data = ledger.load(ws["ledger"])
    gen = (ws["tmp"] / "gen" / "test_softmax_kernel_v1.py").read_text()
    assert len(data["runs"]) == gen.count("@pytest.mark.falsify(")
    assert len(data["mutants"]) == muts + 1

    # editing the contract after the run makes its entries stale
    ws["path"].write_text(ws["path"].read_text() + "\n# an edit\n")
    cov = coverage_json(ws)
    assert {o["status"] for o in cov["contracts"][0]["obligations"]} == {"stale"}
    assert pv(ws, "coverage", str(ws["dir"]), "--min", "100").returncode == 1


def test_deleting_a_check_makes_its_obligation_not_run(workspace):
    ws = workspace
    edit(ws, lambda d: d.update(falsification_tests=[
        t for t in d["falsification_tests"] if t["id"] != "FALSIFY-SM-002"]))
    cov = coverage_json(ws)
    assert status_of(cov, "SM-BND-001") == "not-run"
    r = pv(ws, "coverage", str(ws["dir"]), "--min", "100")
    assert r.returncode == 1
    assert "below --min 100" in r.stdout


@pytest.mark.heavy
def test_loosened_tolerance_lets_a_mutant_survive(workspace):
    ws = workspace

    def loosen(d):
        for t in d["falsification_tests"]:
            if t["obligation"] == "SM-EQV-001":
                t["check"]["tolerance"] = {"why": "loosened", "float32": {"atol": 1.0},
                                           "float16": {"atol": 1.0}}
    edit(ws, loosen)
    r = falsify(ws, "mutants", str(ws["path"]), "--backend", "torch", "-n", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    data = ledger.load(ws["ledger"])
    outcome = {e["mutant"]: e["outcome"] for e in data["mutants"].values()}
    assert outcome["MUT-SM-004"] == "survived"
    assert outcome["MUT-SM-001"] == "killed"
    cov = coverage_json(ws)
    assert status_of(cov, "SM-EQV-001") in ("mutant-survived", "not-run")
    assert pv(ws, "coverage", str(ws["dir"]), "--min", "100").returncode == 1


def test_bind_runs_a_buggy_softmax_and_prints_a_minimal_input(workspace):
    ws = workspace
    r = falsify(ws, "run", str(ws["path"]), "--backend", "torch", "-k", "SM_004",
                "--bind", "softmax.torch=tests.fixtures.buggy:softmax_no_max_subtraction")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "SM-BND-002" in out  # the obligation
    assert "minimal falsifying input" in out
    assert "10000." in out  # hypothesis shrinks to a row holding the largest special value
    assert "exp evaluated without subtracting the row max" in out  # if_fails
    # results about someone else's function never enter the contract's own ledger
    assert not ws["ledger"].exists()


def test_generate_check_detects_hand_edits(workspace, tmp_path):
    ws = workspace
    out = tmp_path / "gen2"
    assert pv(ws, "generate", str(ws["dir"]), "--out", str(out), "--no-docs").returncode == 0
    assert pv(ws, "generate", str(ws["dir"]), "--out", str(out), "--check").returncode == 0
    mod = out / "test_softmax_kernel_v1.py"
    mod.write_text(mod.read_text().replace("rt.execute", "pass  # rt.execute", 1))
    r = pv(ws, "generate", str(ws["dir"]), "--out", str(out), "--check")
    assert r.returncode == 1
    assert "differs from the contract" in r.stdout


def test_no_mutants_summary_never_reads_like_a_low_coverage(workspace):
    ws = workspace
    r = falsify(ws, "run", str(ws["path"]), "--backend", "reference", "--no-mutants",
                "-k", "SM_001")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = " ".join(r.stdout.split())
    assert "mutants not run (--no-mutants)" in summary
    assert "obligations covered" not in summary
    assert ledger.load(ws["ledger"])["mutants"] == {}


def test_bind_to_an_equation_no_contract_has_is_a_usage_error(workspace):
    ws = workspace
    r = falsify(ws, "run", str(ws["path"]),
                "--bind", "nosuchEq.torch=tests.fixtures.buggy:softmax_no_max_subtraction")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no selected contract has equation 'nosuchEq' (equations: softmax)" in r.stderr
    r = falsify(ws, "run", str(ws["path"]),
                "--bind", "softmax.triton=tests.fixtures.buggy:softmax_no_max_subtraction")
    assert r.returncode == 2
    assert "has no triton binding to replace (bound: reference, torch)" in r.stderr
    assert not ws["ledger"].exists()


def test_generated_files_on_main_are_up_to_date():
    r = subprocess.run([sys.executable, "-m", "falsify.cli.pv", "generate", "--check"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _merge_worker(path: str, worker: int) -> None:
    entries = [dict(contract="c", check=f"K{worker}-{i}", backend="torch", variant="float32",
                    outcome="passed") for i in range(40)]
    for e in entries:
        ledger.merge([e], [], Path(path))


def test_concurrent_ledger_writers_lose_nothing(tmp_path):
    import multiprocessing as mp

    path = tmp_path / "ledger.json"
    procs = [mp.Process(target=_merge_worker, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = ledger.load(path)
    assert len(data["runs"]) == 160


def test_a_mutant_run_stops_at_its_first_falsifying_example(monkeypatch):
    """A kill needs one failure, not the smallest: after the first falsifying call hypothesis
    only replays that example to report it, instead of shrinking (dozens of calls more under
    the Triton interpreter)."""
    from falsify.harness import runtime

    calls, failed_at = [], []
    execute = runtime.execute

    def counting(*a, **kw):
        calls.append(a[1])
        try:
            return execute(*a, **kw)
        except Exception:
            failed_at.append(len(calls))
            raise

    monkeypatch.setattr(runtime, "execute", counting)
    r = runtime.kill_mutant(runtime.library_contract("softmax-kernel-v1.yaml"), "MUT-SM-007")
    assert r.killed, r
    assert failed_at, "the mutant never failed a check"
    assert len(calls) - failed_at[0] <= 2, (len(calls), failed_at)


def test_a_bind_runs_the_backend_it_binds_and_nothing_else(workspace):
    """Without --backend, a --bind run judges the bound function only: the torch checks run,
    the reference's own checks and the proofs (SM-007 and SM-008 are z3 proofs of the
    contract's own functions, which no binding replaces) do not; --backend still decides."""
    ws = workspace
    bind = ("--bind", "softmax.torch=falsify.kernels.torch.softmax:softmax")
    r = falsify(ws, "run", str(ws["path"]), "-k", "SM_001 or SM_007 or SM_008", *bind)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = ledger.load(ws["ledger"].with_name("ledger-bind.json"))["runs"].values()
    assert {e["backend"] for e in runs} == {"torch"}, sorted(e["backend"] for e in runs)
    assert {e["check"] for e in runs} == {"FALSIFY-SM-001"}
    assert "torch checks only, no mutants" in " ".join(r.stdout.split())
    r = falsify(ws, "run", str(ws["path"]), "-k", "SM_001", "--backend", "reference,torch",
                *bind)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = ledger.load(ws["ledger"].with_name("ledger-bind.json"))["runs"].values()
    assert {e["backend"] for e in runs} == {"reference", "torch"}
