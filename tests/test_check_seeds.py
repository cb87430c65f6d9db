"""A check's examples are a function of the contract, the check and the run's seed only: two
projects that differ in name, depth, code and contracts draw the same examples for the same
check, and print the same minimal falsifying input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given

import falsify
from falsify.cli import main
from falsify.harness import runtime

# a kernel with a tiling bug in its float16 path: rows past the first block of 4 are never
# normalized. The pinned examples (m = 4, 3, 1) miss it, so the failure is one hypothesis draws;
# float32 passes, so all of its examples are drawn. Every input the kernel sees is logged next to
# it (dtype, shape and a digest of the values), in the order hypothesis drew them.
KERNEL = '''\
import hashlib
from pathlib import Path

import torch
{extra_import}

LOG = Path(__file__).with_name("drawn.log")


def softmax(x):
    with LOG.open("a") as f:
        digest = hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]
        f.write(f"{{x.dtype}} {{tuple(x.shape)}} {{digest}}\\n")
    y = torch.softmax(x, -1)
    if x.dtype == torch.float16 and x.shape[0] > 4:
        y[4:] = torch.exp(x[4:] - x[4:].amax(-1, keepdim=True))
    return y
'''

# a project's own code: hypothesis mines literals of the local modules a process has loaded
TUNING = ("BLOCK_ROWS = 4\nHIDDEN = 3584\nVOCAB = 151_936\nMASK_FILL = -10_000\n"
          "NEG_LOGIT = -1e4\nTINY = 1e-12\nSCALE = 0.125\nLR = 3e-4\n")


def _project(root: Path, name: str, monkeypatch, kernels: list[str], own_code: bool) -> str:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1"\n')
    monkeypatch.chdir(root)
    for k in kernels:
        assert main(["init", "--kernel", k]) == 0
    pkg = name.replace("-", "_")
    if own_code:
        (root / pkg / "tuning.py").write_text(TUNING)
    (root / pkg / "tiled.py").write_text(KERNEL.format(
        extra_import=f"from {pkg}.tuning import BLOCK_ROWS  # noqa: F401" if own_code else ""))
    return pkg


def _drawn(root: Path, pkg: str) -> tuple[list[str], str]:
    log = root / pkg / "drawn.log"
    log.unlink(missing_ok=True)
    env = dict(os.environ, FALSIFY_QUIET="1", CI="1",
               PYTHONPATH=str(Path(falsify.__file__).parents[1]))
    env.pop("FALSIFY_SEED", None)
    proc = subprocess.run(
        [sys.executable, "-m", "falsify", "run", "softmax-kernel-v1", "--backend", "torch",
         "--no-mutants", "-n", "1", "-k", "SM_001",
         "--bind", f"softmax.torch={pkg}.tiled:softmax"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    failed = "FAILED softmax-kernel-v1 FALSIFY-SM-001 on torch/float16"
    assert proc.returncode == 1 and failed in out, out
    minimal = re.search(r"minimal falsifying input:\n(.*?)\n  diagnosis", out, re.S)
    assert minimal, out
    return log.read_text().splitlines(), minimal.group(1)


@pytest.mark.heavy
def test_the_same_check_draws_the_same_examples_in_any_project(tmp_path, monkeypatch):
    # two projects as `falsify init` makes them, differing in name, depth, contracts and code
    # (only the second has a module of its own literals), run one library check under the
    # ci profile against the same kernel: every input drawn, and the minimal failure, agree
    a = tmp_path / "a"
    b = tmp_path / "work" / "deeper" / "b"
    pa = _project(a, "alpha", monkeypatch, ["mykernel"], own_code=False)
    pb = _project(b, "beta-kernels", monkeypatch, ["fused_norm", "fast_act"], own_code=True)
    drawn_a, minimal_a = _drawn(a, pa)
    drawn_b, minimal_b = _drawn(b, pb)
    assert len(drawn_a) > 25 and drawn_a == drawn_b
    assert minimal_a == minimal_b


def _cases(monkeypatch, env: dict[str, str | None], variant: str = "float32",
           renamed: bool = False) -> list:
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    seen = []
    cid, chk = "softmax-kernel-v1", "FALSIFY-SM-001"

    def draw(case):
        seen.append((case.dims["m"], case.dims["n"], case.seed))

    def test_another_name(case):  # the same check, as another module would write it
        seen.append((case.dims["m"], case.dims["n"], case.seed))

    test = test_another_name if renamed else draw
    runtime.check_settings(cid, chk, "torch", variant)(
        given(case=runtime.strategy(cid, chk, variant))(test))()
    return seen


def test_ci_draws_do_not_depend_on_the_test_function(monkeypatch):
    """The ci profile's examples come from the check, not from hypothesis' digest of the test
    function (its source, name and module): a generated module's layout cannot move them."""
    ci = {"CI": "1", runtime.SEED_ENV: None}
    a = _cases(monkeypatch, ci)
    assert a == _cases(monkeypatch, ci, renamed=True) and len(a) >= 10
    assert _cases(monkeypatch, ci, "float16") != a  # each variant has its own seed
    assert _cases(monkeypatch, {"CI": "1", runtime.SEED_ENV: "7"}) != a


def test_check_seed_is_a_stable_function_of_the_check():
    s = runtime.check_seed("softmax-kernel-v1", "FALSIFY-SM-001", "torch", "float32", None)
    # a fixed value: the same on every machine, Python version and hash seed (changing the
    # derivation changes every ci profile's examples)
    assert s == 4960493068935267
    others = {runtime.check_seed(*k) for k in [
        ("softmax-kernel-v1", "FALSIFY-SM-001", "torch", "float32", 0),
        ("softmax-kernel-v1", "FALSIFY-SM-001", "torch", "float32", 7),
        ("softmax-kernel-v1", "FALSIFY-SM-001", "torch", "float16", None),
        ("softmax-kernel-v1", "FALSIFY-SM-001", "reference", "float32", None),
        ("softmax-kernel-v1", "FALSIFY-SM-002", "torch", "float32", None),
        ("rmsnorm-kernel-v1", "FALSIFY-SM-001", "torch", "float32", None)]}
    assert s not in others and len(others) == 6
