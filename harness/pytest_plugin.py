"""pytest plugin: records every generated check and mutant test in the results ledger.

Workers (pytest-xdist) attach a JSON entry to each report's `user_properties`; the controller
collects them in `pytest_runtest_logreport` and writes the ledger once, at session end,
through `ledger.merge` (locked, atomic). Without xdist the same hooks run in one process.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from falsify.harness import ledger

KEY = "falsify_entry"


def pytest_addoption(parser):
    g = parser.getgroup("falsify")
    g.addoption("--mutants", action="store_true",
                help="run the generated mutant tests (and only those)")
    g.addoption("--falsify-ledger", default=None, help="ledger path (default .falsify/ledger.json)")
    g.addoption("--no-ledger", action="store_true", help="do not write the ledger")
    g.addoption("--falsify-backends", default=None,
                help="comma-separated backends to keep (reference,torch,triton,z3,crosshair)")


def pytest_configure(config):
    config.addinivalue_line("markers", "falsify_mutant(contract, mutant, obligation, backend): "
                                       "a generated mutant test")
    config._falsify_entries = []
    config._falsify_mutants = []


def pytest_collection_modifyitems(config, items):
    want_mutants = config.getoption("--mutants")
    backends = config.getoption("--falsify-backends")
    keep_backends = set(backends.split(",")) if backends else None
    keep, drop = [], []
    for item in items:
        is_mutant = item.get_closest_marker("falsify_mutant") is not None
        is_check = item.get_closest_marker("falsify") is not None
        if want_mutants != is_mutant and (is_mutant or is_check or want_mutants):
            drop.append(item)
            continue
        if keep_backends:
            m = item.get_closest_marker("falsify") or item.get_closest_marker("falsify_mutant")
            if m and m.kwargs.get("backend") not in keep_backends:
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _example(excinfo) -> str | None:
    notes = getattr(excinfo.value, "__notes__", None) or []
    text = "\n".join(n for n in notes if "Falsifying" in n or "case=" in n or "Case(" in n)
    return text[:4000] or None


def _sha(contract_id: str) -> str:
    from falsify.harness import runtime

    try:
        return runtime.contract(contract_id).sha256
    except Exception:
        return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    check = item.get_closest_marker("falsify")
    mut = item.get_closest_marker("falsify_mutant")
    if not (check or mut):
        return
    if rep.when == "setup" and rep.passed:
        return
    if rep.when == "teardown" and not rep.failed:
        return
    from falsify.harness import runtime

    exc = call.excinfo
    if rep.skipped:
        status = "skipped"
    elif rep.passed:
        status = "passed"
    elif exc is not None and exc.errisinstance(runtime.Unproven):
        status = "unproven"
    elif rep.when != "call" or (exc is not None and not exc.errisinstance(AssertionError)):
        status = "error"
    else:
        status = "failed"
    base = dict(time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                duration_s=round(rep.duration, 4), nodeid=item.nodeid,
                bind=os.environ.get("FALSIFY_BIND") or None)
    if exc is not None and status != "passed":
        first = str(exc.value).splitlines()[0] if str(exc.value) else ""
        base["message"] = f"{exc.typename}: {first}"[:1000]
        base["example"] = _example(exc)
        if getattr(exc.value, "evidence", None):  # the arbiter's verdict and tolerance terms
            base["evidence"] = exc.value.evidence
    if check:
        kw = check.kwargs
        entry = dict(base, contract=kw["contract"], sha256=_sha(kw["contract"]),
                     obligation=kw["obligation"], check=kw["check"], backend=kw["backend"],
                     variant=kw["variant"], outcome=status)
        detail = runtime.LAST_DETAIL.get((kw["contract"], kw["check"], kw["backend"],
                                          kw["variant"]))
        if detail and status == "passed":
            entry["detail"] = detail
        rep.user_properties.append((KEY, json.dumps({"run": entry}, default=str)))
    else:
        kw = mut.kwargs
        r = runtime.LAST_MUTANT.get((kw["contract"], kw["mutant"]))
        killed = status == "passed"
        entry = dict(base, contract=kw["contract"], sha256=_sha(kw["contract"]),
                     mutant=kw["mutant"], obligation=kw["obligation"], backend=kw["backend"],
                     outcome="killed" if killed else ("survived" if status == "failed"
                                                      else "error"),
                     killed_by=r.killed_by if (r and killed) else None,
                     kill_message=r.message if (r and killed) else None,
                     tried=r.tried if r else None)
        rep.user_properties.append((KEY, json.dumps({"mutant": entry}, default=str)))


_SINK: list[dict] = []  # entries seen by this process (the controller under xdist)
# What the last session in this process recorded: `falsify run` reports from here, not from a
# diff of the ledger, which other processes (another `falsify run`, CI shards) also write.
LAST_SESSION: dict[str, list[dict]] = {"runs": [], "mutants": []}


def pytest_runtest_logreport(report):
    for k, v in getattr(report, "user_properties", []):
        if k == KEY:
            _SINK.append(json.loads(v))


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):  # xdist worker: the controller writes
        return
    runs = [d["run"] for d in _SINK if "run" in d]
    muts = [d["mutant"] for d in _SINK if "mutant" in d]
    _SINK.clear()
    LAST_SESSION.update(runs=runs, mutants=muts)
    if config.getoption("--no-ledger") or not (runs or muts):
        return
    path = config.getoption("--falsify-ledger")
    ledger.merge(runs, muts, path)
    config._falsify_written = (len(runs), len(muts))


def pytest_terminal_summary(terminalreporter, config):
    w = getattr(config, "_falsify_written", None)
    if w:
        terminalreporter.write_line(f"falsify: recorded {w[0]} check result(s) and {w[1]} "
                                    f"mutant result(s) in the ledger")
