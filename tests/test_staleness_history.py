"""scripts/staleness_history.py on a tiny repository: the former fingerprint (raw text of the
imported modules) is staled by every edit to the module; the current one only by an edit to
what the check executes."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "staleness_history.py"

CONTRACT = """\
metadata: {version: 1.0.0}
equations:
  f:
    formula: "y = x + 1"
    bindings:
      reference: pkg.mod:f
falsification_tests:
  - id: T-001
    rule: f adds one
    check: {kind: parity, input: x}
  - id: T-002
    rule: "not executable here (compat mode): no result"
"""

MOD = '''"""A module."""


def f(x):
    """Add one."""
    return x + 1  # the step


def g(x):
    return x * 2
'''

EDITS = [  # (subject, old, new)
    ("comment", "# the step", "# one step"),
    ("docstring", '"""Add one."""', '"""Add one to x."""'),
    ("f's body", "return x + 1", "return 1 + x"),
    ("unrelated g", "return x * 2", "return x * 3"),
]


def _load():
    spec = importlib.util.spec_from_file_location("staleness_history", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _commit(repo: Path, subject: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "-m", subject], cwd=repo, check=True)


def test_before_stales_every_edit_after_only_the_executed_one(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "contracts").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "mod.py").write_text(MOD)
    (repo / "contracts" / "toy-v1.yaml").write_text(CONTRACT)
    _commit(repo, "initial")
    text = MOD
    for subject, old, new in EDITS:
        assert old in text
        text = text.replace(old, new)
        (repo / "pkg" / "mod.py").write_text(text)
        _commit(repo, subject)

    rows = _load().main(["--commits", "4", "--repo", str(repo)])
    rows.reverse()  # oldest first, as EDITS
    assert [r["subject"] for r in rows] == [e[0] for e in EDITS]
    assert [r["results"] for r in rows] == [1, 1, 1, 1]
    assert [r["staled_before"] for r in rows] == [1, 1, 1, 1]
    assert [r["staled_after"] for r in rows] == [0, 0, 1, 0]
    assert "| 4 |" not in capsys.readouterr().out.splitlines()[-1]  # totals line, not a row


def test_package_dir_maps_old_layout_folders_longest_prefix_first():
    pyproject = b'[tool.setuptools]\npackage-dir = { "falsify" = "falsify", ' \
                b'"falsify.impl" = "impl" }\n'
    assert _load().package_dirs(pyproject) == \
        [("falsify.impl", "impl"), ("falsify", "falsify"), ("", "")]
