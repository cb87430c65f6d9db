"""The built package works for a user: sdist and wheel build, the wheel carries the contract
library and the `init` templates, and installed on its own (no checkout on sys.path, run from a
directory outside the checkout) it scaffolds a project that validates, fails on its stubs with
the diagnosis and goes green once they are written (run and mutants, then the CI workflow
`falsify init` wrote, run step by step as GitHub runs it: install from the wheel, validate,
run, mutants, `pv coverage --min 100`);
it checks a user's softmax against the library contract (a correct one passes, a buggy one
fails with the diagnosis) and reports coverage, without writing a file inside the installed
package.

The wheel goes into a fresh venv with --no-deps; the dependencies (torch, triton, ...) are
reused from the interpreter running this test through a .pth file, so nothing is downloaded
but the build backend. About a minute on two busy cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("contracts/softmax-kernel-v1.yaml", "contracts/contract.schema.json",
           "contracts/FORMAT.md", "contracts/fixtures/bpe-tokenizer-300.json",
           "contracts/fixtures/bpe-tokenizer-1024.json")
TEMPLATES = ("templates/contract.yaml", "templates/workflow.yml", "templates/impl.py.tmpl")

SOFTMAX = """import torch


def softmax(x):
    # the dtypes the contract checks, refused otherwise before any work; a row of no entries
    # has no distribution, so n = 0 is refused by name (the contract's size-0 rule)
    if x.dtype not in (torch.float32, torch.float16):
        raise TypeError(f"softmax: unsupported dtype {str(x.dtype).removeprefix('torch.')}")
    if x.shape[-1] == 0:
        raise ValueError("softmax: n = 0: a row of no entries has no distribution")
    # accumulate in fp32 and round once, as the contract's fp16 tolerance (half an ulp of the
    # output) requires: an fp16 row sum over thousands of terms is off by more than that
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
"""
BUGGY = """import torch


def softmax(x):
    e = torch.exp(x)  # no max subtraction: overflows for x > 88 in fp32
    return e / e.sum(dim=-1, keepdim=True)
"""


def _run(cmd, cwd, env=None, timeout=600):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class Steps:
    """Every step runs and every failed expectation is reported together: one test, because the
    steps depend on each other (and xdist must not split them), yet a failure in one says
    nothing about the others."""

    def __init__(self):
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str, detail: str = "") -> bool:
        if not ok:
            self.failures.append(f"{what}\n{detail[-2500:]}".rstrip())
        return ok


def _build(out: Path) -> tuple[Path, Path]:
    out.mkdir()
    # no --sdist/--wheel: the wheel is built from the sdist, so a file the sdist forgets is
    # missing from the wheel too (and nothing is built inside the checkout)
    proc = _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("falsify-*.whl")
    (sdist,) = out.glob("falsify-*.tar.gz")
    return wheel, sdist


def _install(wheel: Path, base: Path) -> dict:
    """A venv holding only the wheel; the running interpreter's packages reused."""
    venv = base / "venv"
    proc = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=base)
    assert proc.returncode == 0, proc.stderr
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=base).stdout.strip())
    # the dependencies this interpreter has (a venv's are not the base's system site). The
    # project's .venv usually lives inside the checkout: its site-packages is still only
    # dependencies, since a path a .pth adds is not scanned for .pth files, so the editable
    # install's finder there never activates (the isolation check allows exactly these dirs)
    (site / "_falsify_test_deps.pth").write_text("\n".join(sorted(DEPS)) + "\n")
    proc = _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                cwd=base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FALSIFY_", "PYTHON"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", FALSIFY_QUIET="1")
    project = base / "userproj"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "userpkg"\nversion = "0.1"\n')
    return dict(py=py, bin=venv / "bin", pkg=site / "falsify", env=env, project=project)


def _files(pkg: Path) -> set[str]:
    return {p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and p.suffix != ".pyc"}


def _check_archives(steps: Steps, wheel: Path, sdist: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    steps.expect("falsify/llm/sft/stdlib-docstrings.jsonl" in names,
                 "wheel: the fine-tuning set `falsify finetune` defaults to is missing")
    steps.expect("falsify/llm/evalset/code-problems.jsonl" in names,
                 "wheel: the problem set `falsify eval` defaults to is missing")
    for want in LIBRARY + TEMPLATES:
        steps.expect(any(re.fullmatch(rf"falsify/(.+/)?{re.escape(want)}", n) for n in names),
                     f"wheel: {want} missing from {wheel.name}")
    names = tarfile.open(sdist).getnames()
    for want in LIBRARY + tuple(f"falsify/{t}" for t in TEMPLATES):
        steps.expect(any(n.endswith("/" + want) for n in names), f"sdist: {want} missing")


DEPS = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}


def _check_isolation(steps: Steps, inst: dict) -> None:
    proc = _run([inst["py"], "-c", "import sys, falsify; print(falsify.__file__); "
                 "print('\\n'.join(sys.path))"], cwd=inst["project"], env=inst["env"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert Path(lines[0]).is_relative_to(inst["pkg"]), lines[0]
    deps = {Path(d).resolve() for d in DEPS}
    assert not any(p and Path(p).resolve().is_relative_to(ROOT) and Path(p).resolve() not in deps
                   for p in lines[1:]), lines
    assert not inst["project"].resolve().is_relative_to(ROOT)


def _check_own_contract(steps: Steps, project: Path, cli) -> None:
    """The scaffolded contract: fails on the stubs with its diagnosis, then goes green."""
    proc, out = cli("falsify", "run", "mykernel-kernel-v1")
    steps.expect(proc.returncode == 1 and "obligation MYKERNEL-EQV-001" in out
                 and "is the stub `falsify init` wrote" in out
                 and "minimal falsifying input" in out
                 and "diagnosis (if_fails): mykernel differs from the float64 reference" in out,
                 f"`falsify run` on the stubs did not fail honestly (exit {proc.returncode})", out)
    (project / "userpkg/mykernel_reference.py").write_text(
        "import numpy as np\n\n\ndef mykernel(x):\n    return np.tanh(x)\n")
    (project / "userpkg/mykernel.py").write_text(
        "import torch\n\n\ndef mykernel(x):\n    return torch.tanh(x)\n")
    for argv, what in ((("falsify", "run", "mykernel-kernel-v1"), "the written kernel passes"),
                       (("falsify", "mutants", "mykernel-kernel-v1"), "its mutant is killed")):
        proc, out = cli(*argv)
        steps.expect(proc.returncode == 0, f"`{' '.join(argv)}`: {what} (exit {proc.returncode})",
                     out)


def _run_workflow(steps: Steps, inst: dict, wheel: Path) -> None:
    """The workflow `falsify init` wrote, run as GitHub runs it: each step's `run:` script in
    bash -e from the repository root, with CI set, the step's `env:` resolved (the repository
    variable FALSIFY_SPEC: this wheel) and the venv's python first on PATH, in order, stopping
    at the first that fails. The `uses:` steps (checkout, setup-python, upload) are GitHub's."""
    import yaml

    flow = yaml.safe_load((inst["project"] / ".github/workflows/falsify.yml").read_text())
    (job,) = flow["jobs"].values()
    env = dict(inst["env"], CI="true", GITHUB_ACTIONS="true")
    ran = []
    for step in job["steps"]:
        if "run" not in step:
            continue
        step_env = {k: str(wheel) if "vars.FALSIFY_SPEC" in str(v) else str(v)
                    for k, v in (step.get("env") or {}).items()}
        proc = _run(["bash", "-e", "-c", step["run"]], cwd=inst["project"],
                    env={**env, **step_env}, timeout=900)
        ran.append(step.get("name", step["run"].splitlines()[0]))
        if proc.returncode != 0:
            steps.expect(False, f"workflow step {ran[-1]!r} failed (exit {proc.returncode})",
                         proc.stdout + proc.stderr)
            return
    steps.expect(ran[0] == "Install" and "Obligation coverage" in ran,
                 f"the workflow's steps were not the expected ones: {ran}")
    steps.expect((inst["project"] / "falsify-junit.xml").is_file(),
                 "the workflow's run step wrote no JUnit report")


@pytest.mark.heavy
def test_the_wheel_works_for_a_user(tmp_path):
    steps = Steps()
    wheel, sdist = _build(tmp_path / "dist")
    _check_archives(steps, wheel, sdist)
    inst = _install(wheel, tmp_path)
    _check_isolation(steps, inst)
    before = _files(inst["pkg"])

    def cli(*argv):
        proc = _run([str(inst["bin"] / argv[0]), *argv[1:]], cwd=inst["project"],
                    env=inst["env"])
        return proc, proc.stdout + proc.stderr

    proc, out = cli("falsify", "init")
    steps.expect(proc.returncode == 0 and
                 (inst["project"] / "contracts/mykernel-kernel-v1.yaml").is_file() and
                 "[tool.falsify]" in (inst["project"] / "pyproject.toml").read_text(),
                 "`falsify init` did not scaffold the project", out)
    proc, out = cli("pv", "validate")
    steps.expect(proc.returncode == 0 and "0 error(s)" in out, "`pv validate` failed", out)

    _check_own_contract(steps, inst["project"], cli)
    _run_workflow(steps, inst, wheel)

    bind = ("falsify", "run", "softmax-kernel-v1", "--bind", "softmax.torch=userpkg:softmax",
            "--backend", "torch")
    (inst["project"] / "userpkg/__init__.py").write_text(SOFTMAX)
    proc, out = cli(*bind)
    steps.expect(proc.returncode == 0 and "softmax-kernel-v1" in out and "FAILED" not in out,
                 f"a correct user softmax did not pass (exit {proc.returncode})", out)
    (inst["project"] / "userpkg/__init__.py").write_text(BUGGY)
    proc, out = cli(*bind)
    steps.expect(proc.returncode == 1 and "obligation SM-BND-002" in out
                 and "minimal falsifying input" in out
                 and "diagnosis (if_fails): exp evaluated without subtracting the row max" in out,
                 f"a buggy user softmax did not fail with its diagnosis (exit {proc.returncode})",
                 out)
    proc, out = cli("pv", "coverage")
    steps.expect(proc.returncode == 0 and
                 re.search(r"coverage: \d+/\d+ obligations covered", out) is not None,
                 f"`pv coverage` did not report (exit {proc.returncode})", out)

    new = sorted(_files(inst["pkg"]) - before)
    steps.expect(not new, f"files appeared inside the installed package: {new[:10]}")
    assert not steps.failures, f"{len(steps.failures)} failed step(s):\n\n" + \
        "\n\n".join(steps.failures)
