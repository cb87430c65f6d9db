"""Incremental verification: ledger entries carry the contract's and the implementation's hash;
`pv coverage` calls a result whose implementation changed `stale`, and `falsify run --changed`
re-runs exactly the checks whose contract or implementation changed.

A temporary project holds two copies of the softmax contract (Triton dropped: the interpreter
is slow), each binding torch to a kernel module of the project's own; editing one module must
re-run only its contract's checks that execute it.
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

KERNEL = "from falsify.kernels.torch.softmax import softmax  # noqa: F401\n"


def _contract(proj: Path, cid: str, prefix: str, module: str, critical: bool = True,
              max_examples: int | None = None) -> None:
    text = (library_dir() / "softmax-kernel-v1.yaml").read_text()
    data = yaml.safe_load(text.replace("SM-", f"{prefix}-"))  # ids unique across contracts
    # critical=False: the thorough profile's 1,000 examples a check instead of 10,000, for a
    # test about which results are reused, not about what the examples find
    data["metadata"]["critical"] = critical
    eq = data["equations"]["softmax"]
    eq["bindings"].pop("triton")
    eq["bindings"]["torch"] = f"{module}:softmax"
    # the compile check (and its obligation) left out: torch.compile costs tens of seconds a
    # run and a check of any other kind is reused or re-run by the same rule
    data["falsification_tests"] = [t for t in data["falsification_tests"]
                                   if t["check"]["kind"] != "compile"]
    checked = {t["obligation"] for t in data["falsification_tests"]}
    data["proof_obligations"] = [o for o in data["proof_obligations"] if o["id"] in checked]
    data["qa_gate"]["checks"] = [t["id"] for t in data["falsification_tests"]]
    for t in data["falsification_tests"] if max_examples else []:
        t["check"]["max_examples"] = max_examples  # caps every profile, thorough included
    data["mutants"] = [m for m in data["mutants"] if m["replaces"] == "softmax.reference"]
    data["qa_gate"]["pass_criteria"] = (f"All {len(data['falsification_tests'])} falsification "
                                        f"tests pass and all {len(data['mutants'])} mutants "
                                        "are killed")
    (proj / "contracts" / f"{cid}.yaml").write_text(yaml.safe_dump(data, sort_keys=False,
                                                                   allow_unicode=True))
    (proj / f"{module}.py").write_text(KERNEL)


def sh(proj, *args):
    env = dict(os.environ, FALSIFY_QUIET="1", CI="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", *args], cwd=proj, env=env,
                          capture_output=True, text=True, timeout=900)


def _states(proj) -> dict[tuple[str, str], set[str]]:
    """(contract, backend) -> the coverage states of its required runs (Triton left out: the
    project does not run it, so its static checks stay not-run; so are the device checks,
    skipped on a machine without a GPU)."""
    cov = json.loads(sh(proj, "falsify.cli.pv", "coverage", "--format", "json").stdout)
    out: dict[tuple[str, str], set[str]] = {}
    for c in cov["contracts"]:
        for o in c["obligations"]:
            if o["status"] == "needs-gpu":
                continue
            for r in o["runs"]:
                if r["backend"] != "triton":
                    out.setdefault((c["id"], r["backend"]), set()).add(r["state"])
    return out


@pytest.mark.heavy
def test_changed_reruns_exactly_the_edited_kernels_checks(tmp_path):
    proj = tmp_path
    (proj / "contracts").mkdir()
    (proj / "falsify.toml").write_text('backends = ["reference", "torch"]\n')
    _contract(proj, "a-softmax-v1", "SA", "kern_a")
    _contract(proj, "b-softmax-v1", "SB", "kern_b")
    r = sh(proj, "falsify.cli", "run", "--no-mutants", "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    led = proj / ".falsify" / "ledger.json"
    first = ledger.load(led)["runs"]
    assert all(e.get("impl_sha") for e in first.values())

    # nothing changed: everything is reused, nothing runs
    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--changed", "-n", "2", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["entries"] == []
    assert f"reused {len(first)} passing result(s)" in " ".join(r.stderr.split())

    # edit one kernel: its contract's results on torch go stale, nothing else
    (proj / "kern_a.py").write_text(KERNEL + "softmax.tuned = True\n")  # runs on import
    states = _states(proj)
    assert states[("a-softmax-v1", "torch")] == {"stale"}
    assert states[("a-softmax-v1", "reference")] == states[("a-softmax-v1", "z3")] == {"covered"}
    assert {s for (cid, _), ss in states.items() if cid == "b-softmax-v1" for s in ss} == \
        {"covered"}

    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--changed", "-n", "2", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    rerun = {(e["contract"], e["check"], e["backend"], e["variant"])
             for e in json.loads(r.stdout)["entries"]}
    expected = {k for k, e in ((tuple(k.split("|")), e) for k, e in first.items())
                if k[0] == "a-softmax-v1" and e["backend"] == "torch"}
    assert rerun == expected and expected
    assert f"reused {len(first) - len(expected)} passing result(s)" in " ".join(r.stderr.split())
    after = ledger.load(led)["runs"]
    for k, e in first.items():
        if tuple(k.split("|")) not in expected:
            assert after[k] == e, f"{k} was re-run"  # reused: the entry is untouched
    assert {s for ss in _states(proj).values() for s in ss} == {"covered"}


def test_changed_thorough_reuses_only_thorough_results(tmp_path):
    """A fast result never stands in for a thorough one: `--changed --thorough` re-runs what the
    fast profile checked, and reuses what the thorough profile checked. Each entry names the
    profile and the seed that reproduce it."""
    proj = tmp_path
    (proj / "contracts").mkdir()
    (proj / "falsify.toml").write_text('backends = ["reference"]\n')
    # 50 examples a check under every profile: which results are reused depends on the
    # profile's name, not on how many examples it drew
    _contract(proj, "a-softmax-v1", "SA", "kern_a", critical=False, max_examples=50)
    pick = ["-k", "reference and (SA_001 or SA_002)"]
    r = sh(proj, "falsify.cli", "run", "--no-mutants", *pick)
    assert r.returncode == 0, r.stdout + r.stderr
    led = proj / ".falsify" / "ledger.json"
    fast = ledger.load(led)["runs"]
    assert fast and {e["profile"] for e in fast.values()} == {"ci"}  # CI=1 in sh()

    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--changed", "--thorough",
           "--seed", "7", *pick, "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reused 0 passing result(s)" in " ".join(r.stderr.split())
    ran = json.loads(r.stdout)["entries"]
    assert {(e["check"], e["variant"]) for e in ran} == \
        {(e["check"], e["variant"]) for e in fast.values()}
    assert {(e["profile"], e["seed"]) for e in ran} == {("thorough", 7)}

    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--changed", "--thorough", *pick,
           "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["entries"] == []
    assert f"reused {len(ran)} passing result(s)" in " ".join(r.stderr.split())
    # and a thorough result stands in for a fast one
    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--changed", *pick, "--format", "json")
    assert json.loads(r.stdout)["entries"] == [], r.stderr


def test_reuse_seedless_reruns_every_drawing_check_and_reuses_the_rest(tmp_path):
    """`--reuse-seedless` (CI's commit-seed run after the test suite): a check that draws no
    examples (here the contract's z3 and CrossHair proofs) gives the same result under any
    seed, so its current pass is reused; every check that draws runs again with the new seed."""
    from falsify.harness.model import load_contract
    from falsify.harness.runtime import uses_hypothesis

    proj = tmp_path
    (proj / "contracts").mkdir()
    (proj / "falsify.toml").write_text('backends = ["reference"]\n')
    _contract(proj, "a-softmax-v1", "SA", "kern_a")
    r = sh(proj, "falsify.cli", "run", "--no-mutants", "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    first = ledger.load(proj / ".falsify" / "ledger.json")["runs"]
    c, _ = load_contract(proj / "contracts" / "a-softmax-v1.yaml")
    seedless = {k for k, e in first.items() if not uses_hypothesis(c.check(e["check"]).kind)}
    assert seedless and len(seedless) < len(first)

    r = sh(proj, "falsify.cli", "run", "--no-mutants", "--reuse-seedless", "--seed", "5", "-n",
           "2", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    ran = {"|".join((e["contract"], e["check"], e["backend"], e["variant"]))
           for e in json.loads(r.stdout)["entries"]}
    assert ran == set(first) - seedless
    assert f"reused {len(seedless)} passing result(s) of checks that draw no examples" in \
        " ".join(r.stderr.split())


def test_the_ledger_is_written_while_the_session_runs(tmp_path, monkeypatch):
    """Results reach the ledger at most FLUSH_S seconds after they arrive, not only at
    session end: a long thorough run that is stopped keeps what it finished."""
    from falsify.harness import pytest_plugin as plugin

    path = tmp_path / "ledger.json"

    class Config:
        _falsify_manifest = None
        _falsify_project = None

        def getoption(self, name):
            return str(path) if name == "--falsify-ledger" else None

    class Report:
        def __init__(self, check):
            entry = dict(contract="c-v1", check=check, backend="torch", variant="float32",
                         outcome="passed")
            self.user_properties = [(plugin.KEY, json.dumps({"run": entry}))]

    sink = plugin._Sink(Config())
    monkeypatch.setattr(plugin, "FLUSH_S", 3600.0)
    sink.pytest_runtest_logreport(Report("A"))
    assert not path.exists()  # not due yet
    monkeypatch.setattr(plugin, "FLUSH_S", 0.0)
    sink.pytest_runtest_logreport(Report("B"))
    assert sorted(ledger.load(path)["runs"]) == ["c-v1|A|torch|float32", "c-v1|B|torch|float32"]
    before = path.stat().st_mtime_ns
    assert sink.flush() == path and path.stat().st_mtime_ns == before  # nothing new: no write
