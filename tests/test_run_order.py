"""`falsify run` starts the longest tests first, timed by the run's ledger or, on a first run,
by the project's committed evidence (falsify/cli/run.py:_durations and
falsify/harness/pytest_plugin.py:_longest_first)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from falsify.cli.run import _durations
from falsify.harness.pytest_plugin import _longest_first


def _items(*ids):
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_the_longest_tests_go_first_and_untimed_ones_count_as_typical():
    items = _items("short", "new", "long", "mid", "also-short")
    _longest_first(items, {"short": 1.0, "long": 100.0, "mid": 10.0, "also-short": 1.0})
    # the timed ones sorted are 1, 1, 10, 100: "new" counts as the median, 10, and ties "mid"
    assert [i.nodeid for i in items] == ["long", "new", "mid", "short", "also-short"]


def _ledger(path, seconds: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "mutants": {}, "runs": {
        n: {"nodeid": n, "duration_s": s} for n, s in seconds.items()}}))


def test_durations_come_from_the_runs_ledger_else_from_the_evidence(tmp_path):
    (tmp_path / "falsify.toml").write_text('evidence = ["evidence/*-ledger.json"]\n')
    _ledger(tmp_path / "evidence" / "thorough-ledger.json", {"t::a": 50.0, "t::b": 5.0})
    manifest = {"project_root": str(tmp_path), "ledger": str(tmp_path / "ledger.json")}
    assert _durations(manifest) == {"t::a": 50.0, "t::b": 5.0}  # first run: no ledger yet
    _ledger(tmp_path / "ledger.json", {"t::b": 7.0})
    assert _durations(manifest) == {"t::b": 7.0}  # the run's own timings, one source only
    (tmp_path / "falsify.toml").write_text('evidence = ["gone/*.json"]\n')
    (tmp_path / "ledger.json").unlink()
    assert _durations(manifest) == {}  # an order is a hint: a broken glob is pv's to report
