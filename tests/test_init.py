"""`falsify init` scaffolds a project that validates, fails honestly on its stubs, and goes green
(check passed, mutant killed, 100 % coverage) once the two functions are written.

Everything runs in a temporary directory outside the checkout, as a user's project would.
"""

from __future__ import annotations

import os
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest
import yaml

import falsify
from falsify.cli import main

KERNEL = "mykernel"
CONTRACT = f"contracts/{KERNEL}-kernel-v1.yaml"
WRITTEN = [CONTRACT, "userpkg/__init__.py", f"userpkg/{KERNEL}_reference.py",
           f"userpkg/{KERNEL}.py", f"userpkg/{KERNEL}_mutants.py",
           ".github/workflows/falsify.yml", ".pre-commit-config.yaml"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "userpkg"\nversion = "0.1"\n')
    monkeypatch.chdir(root)
    return root


def test_init_writes_the_scaffold_and_appends_the_config(project, capsys):
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    for rel in WRITTEN:
        assert (project / rel).is_file(), rel
        assert f"wrote {rel}" in out
    cfg = tomllib.loads((project / "pyproject.toml").read_text())
    assert cfg["project"]["name"] == "userpkg"  # the user's table is untouched
    assert cfg["tool"]["falsify"] == {
        "contracts": ["contracts"], "generated": "tests/generated",
        "ledger": ".falsify/ledger.json", "docs": "site/docs/contracts",
        "backends": ["reference", "torch", "triton"], "profile": "fast", "overrides": []}
    assert not (project / "falsify.toml").exists()
    for rel in (".github/workflows/falsify.yml", ".pre-commit-config.yaml", CONTRACT):
        assert isinstance(yaml.safe_load((project / rel).read_text()), dict), rel


def test_rerun_keeps_every_user_file(project, capsys):
    assert main(["init"]) == 0
    capsys.readouterr()
    mine = "# my own kernel\n"
    (project / f"userpkg/{KERNEL}.py").write_text(mine)
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    assert (project / f"userpkg/{KERNEL}.py").read_text() == mine
    for rel in ["pyproject.toml", *WRITTEN]:
        assert f"kept  {rel} (already there, not overwritten)" in out, rel
    assert "wrote" not in out


def test_without_pyproject_writes_falsify_toml(tmp_path, monkeypatch, capsys):
    root = tmp_path / "my-kernels"
    root.mkdir()
    monkeypatch.chdir(root)
    assert main(["init", "--kernel", "rms_norm"]) == 0
    out = capsys.readouterr().out
    assert "package my_kernels (the directory name)" in out
    assert tomllib.loads((root / "falsify.toml").read_text())["profile"] == "fast"
    assert (root / "contracts/rms_norm-kernel-v1.yaml").is_file()
    assert (root / "my_kernels/rms_norm.py").is_file()
    assert not (root / "pyproject.toml").exists()


def test_src_layout_package_is_used(project, capsys):
    (project / "src/userpkg").mkdir(parents=True)
    assert main(["init"]) == 0
    assert (project / f"src/userpkg/{KERNEL}.py").is_file()
    assert not (project / "userpkg").exists()


@pytest.mark.parametrize("argv, needle", [
    (["init", "--kernel", "Rms-Norm"], "--kernel 'Rms-Norm'"),
    (["init", "--package", "not-a-name"], "is not a Python identifier"),
])
def test_bad_names_are_usage_errors(project, capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (project / "contracts").exists()


def test_unreadable_pyproject_is_a_usage_error(project, capsys):
    (project / "pyproject.toml").write_text("[project\nname = 1\n")
    assert main(["init"]) == 2
    err = capsys.readouterr().err
    assert "pyproject.toml: cannot read it as TOML" in err
    assert not (project / "contracts").exists()


REFERENCE = "import numpy as np\n\n\ndef mykernel(x):\n    return np.tanh(x)\n"
TORCH = "import torch\n\n\ndef mykernel(x):\n    return torch.tanh(x)\n"


def _run(project: Path, *argv: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    # run from the project as a user would: falsify finds it by its [tool.falsify] table and
    # imports the user's package from the project root; no environment variable says where.
    # The path is only the falsify under test (this checkout's, not whichever is installed).
    env = dict(os.environ, FALSIFY_QUIET="1", PYTHONPATH=str(Path(falsify.__file__).parents[1]))
    proc = subprocess.run([sys.executable, *argv], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stdout + proc.stderr
    return proc


def test_scaffold_fails_on_the_stubs_then_goes_green(project, capsys):
    assert main(["init"]) == 0
    pv = ["-m", "falsify.cli.pv"]
    fals = ["-m", "falsify", "run", "-n", "1"]
    out = _run(project, *pv, "validate").stdout
    assert "0 error(s), 0 warning(s) in 1 contract(s)" in out

    failed = _run(project, *fals, "--no-mutants", check_rc=1)
    text = failed.stdout + failed.stderr
    assert "FAILED" in text and "is the stub `falsify init` wrote" in text
    assert "minimal falsifying input" in text and "diagnosis (if_fails)" in text
    # the stub fails every check, so its mutant "dies" too: the summary says that is no evidence
    both = _run(project, *fals, check_rc=1)
    said = " ".join((both.stdout + both.stderr).split())
    assert "mutants 1/1 killed (1 only by checks that fail on the implementation too" in said

    (project / f"userpkg/{KERNEL}_reference.py").write_text(REFERENCE)
    (project / f"userpkg/{KERNEL}.py").write_text(TORCH)
    green = _run(project, *fals)  # checks and mutants: the float16 mutant is killed by parity
    assert "mutants not run" not in green.stdout + green.stderr
    cov = _run(project, *pv, "coverage", "--min", "100").stdout
    assert "1/1 obligations covered (100.0%)" in cov


def _egg_info(root: Path, tmp: Path) -> subprocess.CompletedProcess:
    """The package discovery the workflow's `pip install -e .` runs (setuptools' egg_info),
    without pip, a build environment or the network: about half a second."""
    return subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                           "egg_info", "-e", str(tmp)], cwd=root, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("extra", ["", "\n[tool.setuptools]\nzip-safe = false\n"])
def test_the_workflow_install_step_finds_one_package(project, tmp_path, capsys, extra):
    """contracts/ (and later site/) next to a flat-layout package: setuptools' automatic
    discovery would stop `pip install -e .` ("Multiple top-level packages discovered in a
    flat-layout"); init names the package, keeping a [tool.setuptools] table already there."""
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + extra)
    assert main(["init"]) == 0
    (project / "site" / "docs").mkdir(parents=True)
    proc = _egg_info(project, tmp_path)
    assert proc.returncode == 0 and "Multiple top-level" not in proc.stderr, proc.stderr
    assert "[tool.setuptools.packages.find]" in capsys.readouterr().out
    cfg = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]
    assert cfg["packages"] == {"find": {"include": ["userpkg", "userpkg.*"]}}
    assert cfg.get("zip-safe", False) is False


def test_packaging_left_alone_where_discovery_is_fine(project, tmp_path):
    """A src layout (discovery looks under src/ only) or packages the user already set: the
    pyproject gets only [tool.falsify]."""
    (project / "src" / "userpkg").mkdir(parents=True)
    assert main(["init"]) == 0
    assert "setuptools" not in tomllib.loads((project / "pyproject.toml").read_text())["tool"]
    assert _egg_info(project, tmp_path).returncode == 0


def test_gitignore_gets_the_falsify_directory_once(project, capsys):
    """.falsify/ (the ledger, caches, run locks) is local state: init adds it to .gitignore,
    keeping the user's lines, and a rerun does not add it twice."""
    (project / ".gitignore").write_text("*.pyc")
    assert main(["init"]) == 0
    assert "wrote .gitignore" in capsys.readouterr().out
    assert (project / ".gitignore").read_text().splitlines() == ["*.pyc", ".falsify/"]
    assert main(["init"]) == 0
    assert (project / ".gitignore").read_text().splitlines() == ["*.pyc", ".falsify/"]


MYSOFTMAX = "import torch\n\n\ndef softmax(x):\n    return torch.softmax(x, -1)\n"


def _generated(project: Path) -> list[str]:
    return sorted(p.name for p in (project / "tests/generated").iterdir())


@pytest.mark.heavy
def test_runs_of_contracts_not_the_projects_own_leave_generated_in_sync(project, tmp_path,
                                                                        capsys):
    """A library contract bound to the user's kernel, and a contract file from outside the
    project's contract directories: their test modules go to the project's local state, so
    tests/generated stays what `pv generate` writes and the pre-commit gate still passes; the
    results still reach the ledgers."""
    from falsify.cli.pv import main as pv_main
    from falsify.harness import ledger
    from falsify.harness.project import library_dir

    assert main(["init"]) == 0
    fals = ["-m", "falsify", "run", "-n", "1", "--no-mutants", "--backend", "torch"]
    assert pv_main(["generate", "--no-docs"]) == 0
    own = _generated(project)
    assert own == ["__init__.py", f"test_{KERNEL}_kernel_v1.py"]

    (project / "userpkg/mysoftmax.py").write_text(MYSOFTMAX)
    _run(project, *fals, "softmax-kernel-v1", "--bind",
         "softmax.torch=userpkg.mysoftmax:softmax", "-k", "SM_001")
    assert pv_main(["generate", "--check"]) == 0
    assert _generated(project) == own
    assert (project / ".falsify/generated/test_softmax_kernel_v1.py").is_file()
    bound = ledger.load(project / ".falsify/ledger-bind.json")["runs"].values()
    assert {(e["contract"], e["check"], e["backend"], e["outcome"]) for e in bound} == \
        {("softmax-kernel-v1", "FALSIFY-SM-001", "torch", "passed")}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = elsewhere / "mysoftmax-kernel-v1.yaml"
    outside.write_text((library_dir() / "softmax-kernel-v1.yaml").read_text())
    _run(project, *fals, str(outside), "-k", "SM_001")
    assert pv_main(["generate", "--check"]) == 0
    assert _generated(project) == own
    runs = ledger.load(project / ".falsify/ledger.json")["runs"].values()
    assert {(e["contract"], e["check"], e["backend"], e["outcome"]) for e in runs} == \
        {("mysoftmax-kernel-v1", "FALSIFY-SM-001", "torch", "passed")}
