"""Every deviation the conformance matrix records comes with a standalone reproduction.

A `deviation` Finding (falsify/conformance/registry.py) is what a library maintainer is sent,
so it names a script under evidence/conformance/ that uses only the library (with torch where
the library is built on it), numpy and mpmath, prints its input, the library's result, the
true value and the contract's bound, and exits 1 while the deviation reproduces (0 once the
library is fixed). Here: each deviation names a script that exists, each script is named by
some finding (no orphans), and, marked heavy, scripts whose library is installed run in a
fresh interpreter and still reproduce: one per library in the test command, all of them under
FALSIFY_ALL_REPROS=1 (the weekly conformance workflow).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.conformance import registry

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "evidence" / "conformance"
SCRIPTS = sorted(p.name for p in EVIDENCE.glob("*.py"))
LABELS = ("input:", "library:", "true:", "bound:")


def _deviations():
    """(library, binding, check, finding) for every deviation of the shipped binding sets."""
    return [(lib.name, b.name, check, f)
            for lib in registry.libraries() for b in lib.bindings
            for check, f in b.findings.items() if f.kind == "deviation"]


def test_every_deviation_names_an_existing_repro():
    missing = [f"{lib}/{b} {check}: repro {f.repro!r}"
               for lib, b, check, f in _deviations()
               if not f.repro or "/" in f.repro or not f.repro.endswith(".py")
               or not (EVIDENCE / f.repro).is_file()]
    assert missing == []


def test_every_repro_script_is_named_by_a_finding():
    named = {f.repro for *_, f in _deviations()}
    assert [s for s in SCRIPTS if s not in named] == []


def test_only_deviations_name_a_repro():
    """A variant is a documented convention and `ours` a fix of the contract: neither is a
    bug report, so neither names a reproduction."""
    extra = [f"{lib.name}/{b.name} {check} ({f.kind})"
             for lib in registry.libraries() for b in lib.bindings
             for check, f in b.findings.items() if f.kind != "deviation" and f.repro]
    assert extra == []


def _library_of(script: str) -> registry.Library:
    """A script is named `<library>_<what>.py` after the binding set whose library it runs."""
    return registry.library(script.split("_", 1)[0])


def test_script_names_start_with_their_library():
    assert [s for s in SCRIPTS if s.split("_", 1)[0] not in registry.MODULES] == []


def _to_run() -> list[str]:
    """The scripts the run executes: every one under FALSIFY_ALL_REPROS=1 (the weekly
    conformance workflow, against the newest releases); otherwise the first of each library,
    which keeps every library's script shape running in the test command's budget (all of
    them take about 6 CPU-minutes)."""
    if os.environ.get("FALSIFY_ALL_REPROS") == "1":
        return SCRIPTS
    first: dict[str, str] = {}
    for s in SCRIPTS:
        first.setdefault(s.split("_", 1)[0], s)
    return sorted(first.values())


@pytest.mark.heavy
@pytest.mark.parametrize("script", _to_run())
def test_repro_script_reproduces(script):
    lib = _library_of(script)
    if lib.version() is None:
        pytest.skip(f"{lib.distribution} is not installed")
    for module in ("mpmath", "numpy"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    r = subprocess.run([sys.executable, str(EVIDENCE / script)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    out = r.stdout
    assert r.returncode == 1, f"exit {r.returncode} (1 = reproduces)\n{out}\n{r.stderr[-2000:]}"
    for label in LABELS:
        assert re.search(rf"^{re.escape(label)}", out, re.M), f"no {label!r} line\n{out}"
