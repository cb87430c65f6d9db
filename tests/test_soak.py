"""`falsify soak` and seeded runs: fresh seeds until the time is up, every failure with the one
command that reproduces it, and FALSIFY_SEED making a check's examples repeatable."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given

from falsify.harness import runtime
from tests.test_check_semantics import contract_dict

ROOT = Path(__file__).resolve().parents[1]

FNS = "tests.fixtures.alarm_fns"
# a soak's line per finished round, in a log
ROUND = re.compile(r"^falsify soak: (?P<contract>\S+) seed (?P<seed>\d+): "
                   r"(?P<passed>\d+) passed, (?P<failed>\d+) failed, \d+ s"
                   r"( \(cut at the deadline\))?$")


def _contract_dir(tmp_path, predicate: str):
    inp = {"dtypes": ["float64"], "dims": {"m": [1, 8]},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}}, "examples": [{"m": 1}]}
    data = contract_dict({"f": {"reference": f"{FNS}:identity"}}, {"rows": inp},
                         [{"kind": "property", "input": "rows", "predicate": predicate}])
    cdir = tmp_path / "contracts"
    cdir.mkdir()
    path = cdir / "fix-kernel-v1.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    # a temporary project whose own code includes the fixture functions (tests/)
    (tmp_path / "falsify.toml").write_text('generated = "gen"\nledger = "l.json"\n')
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    env = dict(os.environ, FALSIFY_QUIET="1", COLUMNS="200")
    env.pop("CI", None)
    return path, env


def _falsify(args, env, cwd, timeout=300):
    """`falsify ARGS` run from `cwd`, the temporary project."""
    return subprocess.run([sys.executable, "-m", "falsify.cli", *args],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_soak_reports_a_failure_with_a_command_that_reproduces_it(tmp_path):
    # |x| < 0.9 is false for most drawn x ∈ [−1, 1]: the planted bug every seed finds
    path, env = _contract_dir(tmp_path, "np.all(np.abs(x) < 0.9)")
    t0 = time.monotonic()
    r = _falsify(["soak", str(path), "--minutes", "0.4"], env, tmp_path)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert elapsed < 0.4 * 60 + 10  # the budget holds (plus the interpreter's start-up)
    summary = r.stdout.strip().splitlines()[-1]
    assert summary.startswith("soak: ") and "seed(s) drawn" in summary
    assert "check(s) run" in summary and " 0 failure(s)" not in summary
    repro = next(line.split("reproduce: ", 1)[1] for line in r.stderr.splitlines()
                 if "reproduce: " in line)
    # the contract is the project's own, so the command names it by id
    assert repro.startswith("falsify run fix-kernel-v1 --seed ") and " -k test_" in repro
    # printed when the failure happens: between the line of the round before and the line
    # its own round prints when it ends, which names the seed the command reproduces
    err = r.stderr.splitlines()
    ends = [i for i, line in enumerate(err) if ROUND.match(line)]
    failing = next(i for i in ends if ROUND.match(err[i])["failed"] != "0")
    before = max([i for i in ends if i < failing], default=-1)
    within = [line for line in err[before + 1:failing] if "reproduce: " in line]
    assert within and all(f"--seed {ROUND.match(err[failing])['seed']} " in line
                          for line in within), r.stderr
    again = _falsify(shlex.split(repro)[1:] + ["-n", "1"], env, tmp_path)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "reproduce: falsify run" in again.stdout + again.stderr  # printed by run too


def test_soak_passes_when_nothing_fails_and_stops_in_time(tmp_path):
    path, env = _contract_dir(tmp_path, "np.all(np.abs(x) <= 1.0)")
    t0 = time.monotonic()
    r = _falsify(["soak", str(path), "--minutes", "0.3"], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - t0 < 0.3 * 60 + 10
    assert "0 failure(s)" in r.stdout
    # in a log (no terminal): one line per finished round with its counts and seconds
    rounds = [m for m in map(ROUND.match, r.stderr.splitlines()) if m]
    assert rounds and all(m["contract"] == "fix-kernel-v1" for m in rounds), r.stderr
    assert all(m["failed"] == "0" for m in rounds) and int(rounds[0]["passed"]) > 0


def test_a_seeded_run_prints_a_rerun_line_with_its_selection(tmp_path):
    # the line keeps every option that narrows the run (backend, -k, no mutants): copying it
    # reruns these checks, not the whole contract
    path, env = _contract_dir(tmp_path, "np.all(np.abs(x) <= 1.0)")
    r = _falsify(["run", "fix-kernel-v1", "--seed", "5", "--backend", "reference",
                  "-k", "test_ and reference", "--no-mutants", "-n", "1"], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in (r.stdout + r.stderr).splitlines() if "rerun exactly: " in ln)
    assert line.split("rerun exactly: ", 1)[1] == (
        "falsify run fix-kernel-v1 --seed 5 --backend reference -k 'test_ and reference' "
        "--no-mutants")


@pytest.mark.parametrize("args", [["soak", "--minutes", "0"], ["run", "--seed", "abc"]])
def test_bad_soak_and_seed_arguments_are_usage_errors(tmp_path, args):
    (tmp_path / "contracts").mkdir()
    (tmp_path / "falsify.toml").write_text('generated = "gen"\n')
    r = _falsify(args, dict(os.environ, FALSIFY_QUIET="1"), tmp_path)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def _drawn(monkeypatch, seed: str | None, ci: bool = False) -> list:
    if seed is None:
        monkeypatch.delenv(runtime.SEED_ENV, raising=False)
    else:
        monkeypatch.setenv(runtime.SEED_ENV, seed)
    if ci:
        monkeypatch.setenv("CI", "true")  # the ci profile: fixed examples
    else:
        monkeypatch.delenv("CI", raising=False)  # this checkout's profile: fast
    seen = []
    cid, chk = "lr-schedule-kernel-v1", "FALSIFY-LRS-001"

    @runtime.check_settings(cid, chk, "torch", "float64")
    @given(case=runtime.strategy(cid, chk, "float64"))
    def draw(case):
        seen.append((case.dims["n"], case.dims["W"], case.dims["T"], case.seed))

    draw()
    return seen


def test_a_seed_draws_the_same_examples_and_another_seed_others(monkeypatch):
    a, b = _drawn(monkeypatch, "12345"), _drawn(monkeypatch, "12345")
    assert a == b and len(a) >= 10
    assert _drawn(monkeypatch, "54321") != a


def test_a_seed_draws_the_same_examples_whatever_modules_are_loaded(monkeypatch, tmp_path):
    # hypothesis also draws constants it finds in the process's local modules, so what one seed
    # drew depended on what the process had imported: a soak round and the `falsify run -k`
    # that should reproduce it drew different examples. Loading a module full of integers
    # between two seeded draws must not change them.
    seeds = [str(s) for s in range(1, 9)]
    before = [_drawn(monkeypatch, s) for s in seeds]
    mod = tmp_path / "falsify_seed_consts.py"
    mod.write_text("".join(f"C{i} = {v}\n" for i, v in enumerate(
        [*range(1, 300), *(2**k - 1 for k in range(8, 33)), *(3**k for k in range(6, 20))])))
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("falsify_seed_consts")
    assert before == [_drawn(monkeypatch, s) for s in seeds]


def test_seeded_ci_runs_are_not_derandomized(monkeypatch):
    # under CI a seed still decides the examples: the ci profile's fixed ones are the default
    ci = _drawn(monkeypatch, None, ci=True)
    assert ci == _drawn(monkeypatch, None, ci=True)
    seeded = _drawn(monkeypatch, "7", ci=True)
    assert seeded != ci and seeded == _drawn(monkeypatch, "7", ci=True)


def test_commit_seed_is_stable_per_commit():
    from falsify.cli.session import commit_seed

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: there is no commit to derive a seed from")
    n1, head = commit_seed(ROOT)
    n2, _ = commit_seed(ROOT)
    assert n1 == n2 and 0 <= n1 < 2**32 and len(head) == 40


def test_a_soak_leaves_out_the_checks_no_seed_can_change(tmp_path):
    """Training probes, proofs and compiles compute the same under every seed: a round runs only
    the checks that draw examples, and a contract with none of those is not soaked."""
    from falsify.cli.soak import seedless_keys
    from falsify.harness.model import load_contract
    from falsify.harness.project import library_dir

    sm, _ = load_contract(library_dir() / "softmax-kernel-v1.yaml")
    keys = seedless_keys(sm)
    kinds = {sm.check(k.split("|")[1]).kind for k in keys}
    assert keys and kinds and not kinds & {"parity", "property", "gradient", "metamorphic"}
    assert {"symbolic", "static"} <= kinds
    loop, _ = load_contract(library_dir() / "train-loop-v1.yaml")
    assert len(seedless_keys(loop)) == sum(len(runtime.runs(loop, t)) for t in loop.checks)
    (tmp_path / "falsify.toml").write_text('ledger = "l.json"\n')
    env = dict(os.environ, FALSIFY_QUIET="1")
    r = _falsify(["soak", "train-loop-v1", "--minutes", "0.2"], env, tmp_path)
    assert r.returncode == 2 and "nothing to soak" in r.stderr and "Traceback" not in r.stderr
