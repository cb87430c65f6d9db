"""pytest plugin: records every generated check and mutant test in the results ledger.

Workers (pytest-xdist) attach a JSON entry to each report's `user_properties`; the controller
collects them in `pytest_runtest_logreport` and merges them into the ledger through
`ledger.merge` (locked, atomic): what arrived is flushed at most every FLUSH_S seconds while
the session runs, and the rest at session end. An hours-long thorough run that is stopped or
killed keeps every result it finished but the last FLUSH_S seconds', so `--changed` resumes it
instead of starting over. Without xdist the same hooks run in one process.

Under `falsify run` the command passes `--falsify-manifest` (see falsify.harness.handover):
the manifest says which tests to keep, the profile, the binds and the ledger, and the
controller writes this session's entries to the manifest's results file. Under plain pytest
the ledger is the project's (falsify.harness.project), or none outside a project.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from pathlib import Path

import pytest

from falsify.harness import fingerprint, handover, ledger, project

KEY = "falsify_entry"
SINK = "falsify-sink"
FLUSH_S = 30.0  # a ledger merge rewrites the file: often enough to lose little, rarely enough
#                 to cost nothing next to the checks
RECORDING = pytest.StashKey()


def pytest_addoption(parser):
    g = parser.getgroup("falsify")
    g.addoption("--mutants", action="store_true",
                help="run the generated mutant tests (and only those)")
    g.addoption("--falsify-ledger", default=None,
                help="ledger path (default: the project's `ledger`)")
    g.addoption("--falsify-manifest", default=None,
                help="run manifest written by `falsify run` (falsify.harness.handover)")
    g.addoption("--no-ledger", action="store_true", help="do not write the ledger")
    g.addoption("--falsify-backends", default=None,
                help="comma-separated backends to keep (reference,torch,triton,z3,crosshair)")


def pytest_configure(config):
    config.addinivalue_line("markers", "falsify_mutant(contract, mutant, obligation, backend): "
                                       "a generated mutant test")
    m = None
    path = config.getoption("--falsify-manifest")
    if path:
        m = handover.read(path)
        if m.project_root not in sys.path:  # bindings into the project's own modules
            sys.path.insert(0, m.project_root)
    handover.activate(m)
    config._falsify_manifest = m
    try:  # without a manifest the ledger is the project's; a broken project file says so now
        config._falsify_project = (project.find_project(config.invocation_params.dir)
                                   if m is None else None)
    except project.ProjectError as e:
        raise pytest.UsageError(str(e)) from None
    config.pluginmanager.register(_Sink(config), SINK)


def _select(config) -> str:
    m = config._falsify_manifest
    if config.getoption("--mutants"):
        return "mutants"
    return m.select if m is not None else "checks"


def pytest_itemcollected(item):
    """A generated check test also matches its check kind under `-k` (`-k compile`, `-k
    "gradient and torch"`): the kind is the contract's, not part of the test's name."""
    mark = item.get_closest_marker("falsify")
    if mark is None:
        return
    c, check = mark.kwargs.get("contract"), mark.kwargs.get("check")
    t = c.check(check) if hasattr(c, "check") and check else None
    if t is not None and t.kind:
        item.extra_keyword_matches.add(t.kind)


def pytest_collection_modifyitems(config, items):
    select = _select(config)
    m = config._falsify_manifest
    backends = config.getoption("--falsify-backends")
    keep_backends = set(backends.split(",")) if backends else (
        set(m.backends) if m is not None and m.backends else None)
    reuse = set(m.reuse) if m is not None else set()
    only = set(m.only) if m is not None else set()
    keep, drop = [], []
    for item in items:
        if reuse and _reuse_key(item) in reuse:  # `falsify run --changed`: result kept
            drop.append(item)
            continue
        if only and _reuse_key(item) not in only:  # `falsify conformance`: the bound checks
            drop.append(item)
            continue
        is_mutant = item.get_closest_marker("falsify_mutant") is not None
        dropped = (select == "mutants" and not is_mutant) or (select == "checks" and is_mutant)
        if dropped:
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
    manifest = config._falsify_manifest
    if manifest is not None and manifest.durations:
        _longest_first(items, manifest.durations)


def _longest_first(items: list, durations: dict[str, float]) -> None:
    """Under `falsify run`, the tests longest first by the seconds they took last time (a test
    not timed yet counts as a median one): pytest-xdist hands tests out in this order, so the
    long ones start while short ones can still fill in around them, and the workers finish
    together instead of one running a two-minute probe alone at the end. Every worker sorts
    the same collection by the same manifest, so they agree on the order, as xdist requires."""
    known = sorted(durations.get(i.nodeid, 0.0) for i in items if i.nodeid in durations)
    typical = known[len(known) // 2] if known else 0.0
    items.sort(key=lambda i: -durations.get(i.nodeid, typical))


def _reuse_key(item) -> str | None:
    """The manifest's `reuse` key of a generated test (see falsify.harness.handover)."""
    mark = item.get_closest_marker("falsify") or item.get_closest_marker("falsify_mutant")
    if mark is None:
        return None
    kw = dict(mark.kwargs)
    kw["contract"] = getattr(kw["contract"], "id", kw["contract"])
    if "mutant" in kw:
        return "mutant:" + ledger.mutant_key(kw)
    return "run:" + ledger.run_key(kw)


def _example(e: BaseException) -> str | None:
    notes = getattr(e, "__notes__", None) or []
    text = "\n".join(n for n in notes if "Falsifying" in n or "case=" in n or "Case(" in n)
    return text[:4000] or None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not (item.get_closest_marker("falsify") or item.get_closest_marker("falsify_mutant")):
        yield
        return
    from falsify.harness import runtime

    with runtime.recording() as rec:
        item.stash[RECORDING] = rec
        yield


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
    m = item.config._falsify_manifest
    rec = item.stash.get(RECORDING, None)
    base = dict(time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                duration_s=round(rep.duration, 4), nodeid=item.nodeid,
                bind=json.dumps(m.binds, sort_keys=True) if m is not None and m.binds else None,
                # how hard the search looked, and the seed that draws the same examples again:
                # `--changed --thorough` reuses only results the thorough profile produced
                profile=runtime.profile_name(), seed=runtime.run_seed(),
                gpu=runtime.gpu_name())
    if exc is not None and status != "passed":
        e, n = runtime.first_failure(exc.value)  # a group: its first failure, and the count
        first = str(e).splitlines()[0] if str(e) else ""
        base["message"] = (f"{type(e).__name__}: {first}" + (
            f" (the first of {n} distinct failures)" if n > 1 else ""))[:1000]
        base["example"] = _example(e) or _example(exc.value)
        if getattr(e, "evidence", None):  # the arbiter's verdict and tolerance terms
            base["evidence"] = e.evidence
    if check:
        kw = check.kwargs
        c = runtime.contract(kw["contract"])
        entry = dict(base, contract=c.id, sha256=c.sha256,
                     impl_sha=fingerprint.impl_hash(c, kw["backend"], c.check(kw["check"])),
                     obligation=kw["obligation"], check=kw["check"], backend=kw["backend"],
                     variant=kw["variant"], outcome=status)
        if rec is not None and rec.details and status == "passed":
            entry["detail"] = rec.details[-1]
        rep.user_properties.append((KEY, json.dumps({"run": entry}, default=str)))
    else:
        kw = mut.kwargs
        c = runtime.contract(kw["contract"])
        r = rec.mutant if rec is not None else None
        killed = status == "passed"
        mutant = next((x for x in c.mutants if x.id == kw["mutant"]), None)
        broken = broken_mutant(mutant, r.message) if (r and killed) else None
        if broken:  # the "kill" is the mutant's own call failing: no evidence, fail the test
            killed, status = False, "error"
            base["message"] = broken[:1000]
            rep.outcome, rep.longrepr = "failed", broken
        entry = dict(base, contract=c.id, sha256=c.sha256,
                     impl_sha=fingerprint.impl_hash(c, kw["backend"], mutant=mutant),
                     mutant=kw["mutant"], obligation=kw["obligation"], backend=kw["backend"],
                     outcome="killed" if killed else {"failed": "survived",
                                                      "skipped": "skipped"}.get(status, "error"),
                     killed_by=r.killed_by if (r and killed) else None,
                     kill_message=r.message if (r and killed) else None,
                     tried=r.tried if r else None)
        rep.user_properties.append((KEY, json.dumps({"mutant": entry}, default=str)))


# Python's own wording when a call does not fit the callee's signature ("f() got an unexpected
# keyword argument 'lr'", "f() missing 1 required positional argument: 'x'", ...), as
# falsify/harness/backends.py wraps what an implementation raised.
_SIGNATURE = re.compile(r"raised TypeError: (?P<callee>[\w.<>]+)\(\) (?:got an unexpected "
                        r"keyword argument|missing \d+ required|takes \d+ positional|takes from "
                        r"\d+ to \d+ positional|got multiple values for argument|got some "
                        r"positional-only)")


def broken_mutant(mutant, kill_message: str | None) -> str | None:
    """Why a "kill" is no kill, or None: the check failed only because a function the mutant's
    own module defines was called with arguments its signature does not take. That happens when
    the implementation's calling convention moves (a keyword argument added to what the mutant
    wraps) and the mutant is not updated: it then dies on every check without ever running its
    bug, which proves nothing about the checks. A signature error inside the implementation
    (the mutant calling a kernel wrongly) stays a kill: that is a bug the checks caught."""
    m = _SIGNATURE.search(kill_message or "")
    if m is None or mutant is None or ":" not in (mutant.with_ or ""):
        return None
    module = mutant.with_.split(":", 1)[0]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    top = getattr(mod, m["callee"].split(".", 1)[0], None)
    if getattr(top, "__module__", None) != module:
        return None
    return (f"{mutant.id} is broken, not killed: {mutant.with_} was called with arguments its "
            f"signature does not take, so its bug never ran ({kill_message}). Update the mutant "
            "to the implementation's calling convention.")


class _Sink:
    """Entries this session saw, from its own reports (the controller's, under xdist), and
    how many of them are already in the ledger."""

    def __init__(self, config):
        self.config = config
        self.entries: list[dict] = []
        self.flushed = 0
        self.last_flush = time.monotonic()

    def pytest_runtest_logreport(self, report):
        for k, v in getattr(report, "user_properties", []):
            if k == KEY:
                self.entries.append(json.loads(v))
        if time.monotonic() - self.last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> Path | None:
        """Merge the entries not yet written into the ledger (the controller only: a worker's
        reports reach the controller, which writes). Returns the ledger, or None when there is
        none to write."""
        self.last_flush = time.monotonic()
        config = self.config
        if hasattr(config, "workerinput") or config.getoption("--no-ledger"):
            return None
        path = _ledger_path(config)
        new = self.entries[self.flushed:]
        if path is None or not new:
            return path
        ledger.merge([d["run"] for d in new if "run" in d],
                     [d["mutant"] for d in new if "mutant" in d], path)
        self.flushed = len(self.entries)
        return path


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    handover.activate(None)


def _ledger_path(config) -> Path | None:
    explicit = config.getoption("--falsify-ledger")
    if explicit:
        return Path(explicit)
    m = config._falsify_manifest
    if m is not None:
        return Path(m.ledger) if m.ledger else None
    p = config._falsify_project
    return p.ledger_path if p else None


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):  # xdist worker: the controller writes
        return
    sink = config.pluginmanager.get_plugin(SINK)
    runs = [d["run"] for d in sink.entries if "run" in d]
    muts = [d["mutant"] for d in sink.entries if "mutant" in d]
    m = config._falsify_manifest
    if m is not None and m.results:
        handover.write_results(m.results, runs, muts)
    if config.getoption("--no-ledger") or not (runs or muts):
        return
    path = sink.flush()
    config._falsify_written = None if path is None else (len(runs), len(muts), path)


def pytest_terminal_summary(terminalreporter, config):
    if not hasattr(config, "_falsify_written"):
        return
    w = config._falsify_written
    if w is None:
        terminalreporter.write_line("falsify: no project here (falsify.toml or [tool.falsify] "
                                    "in pyproject.toml), so no ledger: results not recorded")
    else:
        terminalreporter.write_line(f"falsify: recorded {w[0]} check result(s) and {w[1]} "
                                    f"mutant result(s) in {w[2]}")
