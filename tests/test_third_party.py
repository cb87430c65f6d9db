"""The third-party guide tells the truth: every `falsify run --bind` command on
site/docs/guide/third-party.md is rerun (ci profile: fixed examples) and its
outcome must match the output the page shows: the same results row and the same failed checks,
each with its diagnosis, and exit 1 exactly when something failed.

A kernel that starts passing (or failing) after an upgrade makes this test fail until the page
is rerun and its text updated: the page is evidence, not decoration.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "site" / "docs" / "guide" / "third-party.md"
BLOCK = re.compile(r"```bash\n(CI=1 falsify run .*?)\n```\n\n```text\n(.*?)```", re.S)


def _documented() -> dict[str, tuple[list[str], str]]:
    runs = {}
    for cmd, shown in BLOCK.findall(PAGE.read_text()):
        argv = shlex.split(cmd.replace("\\\n", " "))
        assert argv[:3] == ["CI=1", "falsify", "run"], argv
        runs[argv[3]] = (argv[3:], shown)
    return runs


DOCUMENTED = _documented()


def _outcome(text: str, contract: str) -> tuple[str, list[str], int]:
    row = next((ln for ln in text.splitlines() if ln.startswith(f"│ {contract} ")), None)
    assert row is not None, f"no results row for {contract} in:\n{text[-2000:]}"
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # the bound backend's column (a --bind run runs no other backend, and no proofs)
    failed = sorted(re.findall(rf"^FAILED {re.escape(contract)} \S+ on torch/\S+ \(\w+\)",
                               text, re.M))
    blocks = re.split(r"^(?=FAILED )", text, flags=re.M)
    diagnosed = sum("diagnosis (if_fails):" in b for b in blocks if b.startswith(
        f"FAILED {contract} ") and " on torch/" in b.splitlines()[0])
    return cells[1], failed, diagnosed


def test_the_page_documents_the_three_kernels():
    assert set(DOCUMENTED) == {"attention-kernel-v1", "rmsnorm-kernel-v1",
                               "cross-entropy-kernel-v1"}
    for argv, _ in DOCUMENTED.values():
        binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
        assert binds and all(b.split("=")[1].startswith("tests.fixtures.third_party:")
                             for b in binds), argv
    text = PAGE.read_text()
    # results pasted from a real run must not carry the machine they ran on
    assert str(ROOT) not in text and "site-packages" not in text


@pytest.mark.heavy
@pytest.mark.parametrize("contract", sorted(DOCUMENTED))
def test_the_page_shows_what_the_run_gives(contract, tmp_path):
    argv, shown = DOCUMENTED[contract]
    # no shrinking (tests/conftest.py): the outcome is compared, not the example printed
    env = dict(os.environ, CI="1", COLUMNS="100", FALSIFY_QUIET="1", FALSIFY_TEST_NO_SHRINK="1")
    env.pop("FALSIFY_PROFILE", None)
    proc = subprocess.run([sys.executable, "-m", "falsify.cli", "run", *argv,
                           "--ledger", str(tmp_path / "ledger.json")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    got = proc.stdout + proc.stderr
    cell, failed, diagnoses = _outcome(got, contract)
    want_cell, want_failed, _ = _outcome(shown, contract)
    assert (cell, failed) == (want_cell, want_failed), \
        f"the page shows {want_cell} {want_failed}; the run gave {cell} {failed}:\n{got[-4000:]}"
    assert diagnoses == len(failed), got[-4000:]
    assert (proc.returncode == 1) if failed else (proc.returncode in (0, 1)), got[-4000:]
