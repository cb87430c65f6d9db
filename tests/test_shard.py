"""`falsify run --shard K/N` and `pv ledger merge`: the split is deterministic and balanced,
bad values are usage errors, conflicting shard ledgers are refused, and two shards merged equal
one unsharded run (coverage, counts and every outcome)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.errors import UsageError
from falsify.harness import ledger, shard

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# two fast kernel contracts with mutants (8 between them), about 20 s each on 2 cores
CONTRACTS = ["lr-schedule-kernel-v1", "pass-at-k-kernel-v1"]


@pytest.mark.parametrize("text", ["", "1", "0/2", "3/2", "1/0", "a/b", "-1/2", "1/2/3"])
def test_bad_shard_values_are_usage_errors(text):
    with pytest.raises(UsageError, match="--shard"):
        shard.parse(text)


def test_bad_shard_on_the_command_line_exits_2():
    proc = subprocess.run([BIN / "falsify", "run", "--shard", "3/2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "need 1 <= K <= N" in proc.stderr


def test_partition_is_greedy_longest_first_and_stable():
    ids = ["a", "b", "c", "d", "e"]
    secs = {"a": 10.0, "b": 7.0, "c": 5.0, "d": 4.0}
    parts = shard.partition(ids, secs, 2)
    # a -> 1; b -> 2; c -> 2 (7 < 10); d -> 1 (12 > 10): loads 14 and 12
    assert parts[0][:2] == ["a", "d"] and parts[1][:2] == ["b", "c"]
    assert sorted(sum(parts, [])) == ids  # every contract in exactly one shard
    # e has no duration: placed by a hash of its id, the same on every call and machine
    assert shard.partition(ids, secs, 2) == parts
    assert shard.partition(["e"], {}, 2) == shard.partition(["e"], {}, 2)
    assert shard.partition(ids, secs, 1) == [ids]


def _entry(contract, check, outcome, sha="s1"):
    return dict(contract=contract, check=check, backend="torch", variant="default",
                outcome=outcome, sha256=sha, impl_sha="i1", time="2026-01-01T00:00:00Z")


def test_merge_refuses_conflicts_and_names_both_files(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    ledger.merge([_entry("x", "t1", "passed")], [], a)
    ledger.merge([_entry("x", "t1", "passed"), _entry("y", "t2", "passed")], [], b)
    ledger.merge([_entry("x", "t1", "failed")], [], c)
    out = tmp_path / "out.json"
    pv = [BIN / "pv", "ledger", "merge"]
    ok = subprocess.run(pv + [a, b, "-o", out], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert len(ledger.load(out)["runs"]) == 2
    bad = subprocess.run(pv + [a, c, "-o", tmp_path / "bad.json"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1
    assert str(a) in bad.stderr and str(c) in bad.stderr and "x|t1|torch|default" in bad.stderr
    assert not (tmp_path / "bad.json").exists()  # nothing written on a conflict
    missing = subprocess.run(pv + [a, tmp_path / "nope.json", "-o", out], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "nope.json" in missing.stderr


def _run(*args):
    proc = subprocess.run([BIN / "falsify", "run", *CONTRACTS, "--seed", "7", "-n", "1",
                           *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _coverage(path):
    proc = subprocess.run([BIN / "pv", "coverage", *CONTRACTS, "--ledger", path, "--format",
                           "json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cov = json.loads(proc.stdout)
    # the verdicts, not the timings and times the entries carry
    return cov["overall"], {(c["id"], o["obligation"]): o["status"]
                            for c in cov["contracts"] for o in c["obligations"]}


def _outcomes(data):
    return {s: {k: e["outcome"] for k, e in data[s].items()} for s in ("runs", "mutants")}


@pytest.mark.heavy
def test_two_shards_merged_equal_one_run(tmp_path):
    full = tmp_path / "full.json"
    _run("--ledger", full)
    shards = [tmp_path / f"shard-{k}.json" for k in (1, 2)]
    for k, path in enumerate(shards, 1):
        # the full run's durations balance the split, as a committed ledger would on CI
        _run("--shard", f"{k}/2", "--balance-ledger", full, "--ledger", path)
    split = [{e["contract"] for e in ledger.load(p)["runs"].values()} for p in shards]
    assert all(split) and not split[0] & split[1], split  # each shard ran whole contracts
    merged = tmp_path / "merged.json"
    proc = subprocess.run([BIN / "pv", "ledger", "merge", *shards, "-o", merged],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    one, two = ledger.load(full), ledger.load(merged)
    assert _outcomes(one) == _outcomes(two)
    assert len(two["runs"]) == len(one["runs"]) and len(two["mutants"]) == len(one["mutants"])
    assert any(e["outcome"] == "killed" for e in two["mutants"].values())
    overall, statuses = _coverage(full)
    assert _coverage(merged) == (overall, statuses) and "covered" in statuses.values()
