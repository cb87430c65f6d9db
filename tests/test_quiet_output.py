"""Output that is the project's own: no line from a third-party library reaches a user of
`falsify run` or of a verb's --help, and the no-GPU line is said only by a command that runs
Triton kernels, once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from falsify import triton_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPU_LINE = "no GPU visible"
# what the libraries we import print when left alone: torchao's extension loader, torch's
# pytree deprecation (a glog-style "W1129 01:36:31.76 ... file.py:630]" prefix), the profiler's
# USDT probes, transformers' weight-loading bar, and any Python warning or traceback line
THIRD_PARTY = re.compile(r"Failed to load .*\.so|_pytree|USDT|profiler_start|Loading weights|"
                         r"Loading checkpoint shards|[A-Za-z]+Warning:|site-packages/|"
                         r"^[WIEF]\d{4} \d\d:\d\d:\d\d|^\s*warnings\.warn\(")


def _env():
    env = dict(os.environ, COLUMNS="200")
    for k in ("FALSIFY_QUIET", "TRITON_INTERPRET", "HF_HUB_DISABLE_PROGRESS_BARS",
              "KINETO_LOG_LEVEL"):
        env.pop(k, None)  # as a user's shell has it: the defaults decide
    return env


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if THIRD_PARTY.search(line)]


def test_importing_torchao_after_falsify_prints_nothing():
    # torchao is what prints most ("Failed to load ... .so" per extension, the pytree
    # deprecation): importing it after falsify, as our commands do, must stay silent
    proc = subprocess.run([sys.executable, "-c", "import falsify, torchao"], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _noise(proc.stdout + proc.stderr) == []


def test_the_torch_profiler_after_falsify_prints_nothing():
    # kineto writes "USDT: ... profiler_start" / "profiler_stop" to stderr per profile; the
    # probes and the train/finetune benches open one per check or per side
    code = ("import falsify, torch\n"
            "from torch.profiler import ProfilerActivity, profile\n"
            "with profile(activities=[ProfilerActivity.CPU]):\n"
            "    torch.ones(4) @ torch.ones(4)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _noise(proc.stdout + proc.stderr) == []


def test_help_is_quiet_and_says_nothing_about_the_gpu():
    proc = subprocess.run([BIN / "falsify", "bench", "finetune", "--help"], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "usage: falsify bench finetune" in out
    assert _noise(out) == [] and GPU_LINE not in out


def test_run_of_one_contract_prints_only_our_own_lines(tmp_path):
    proc = subprocess.run([BIN / "falsify", "run", "pass-at-k-kernel-v1", "--no-mutants",
                           "-n", "1", "--ledger", tmp_path / "ledger.json"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert _noise(out) == [], out
    # in a log (no terminal): one line per finished contract, with its counts and seconds
    assert re.search(r"^falsify: pass-at-k-kernel-v1: \d+ passed, 0 failed, \d+ s$", out, re.M)
    expected = 1 if not triton_env.gpu_visible() else 0
    assert out.count(GPU_LINE) == expected, out
