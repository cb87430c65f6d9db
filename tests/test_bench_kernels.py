"""`falsify bench kernels`: the case list covers every contract kernel (or says why not), and
`--save-baseline` / `--check` compare ratios ours/eager row by row. No timing is asserted here:
the comparison logic is tested on fixed numbers, and the command-line tests move the baseline
far enough (1000×) that the machine's noise cannot decide the outcome."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.bench.kernel_cases import NOT_BENCHMARKED, cases, contract_kernels, coverage_lines
from falsify.bench.kernels import compare


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "falsify", "bench", "kernels", *args],
                          capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=dict(os.environ))


def test_every_contract_kernel_has_a_case_or_a_reason():
    kernels = set(contract_kernels())
    have = {c.contract for c in cases(quick=True)}
    assert {"gemm", "attention", "nf4", "qlora", "adamw"} <= have
    assert not (kernels - have - set(NOT_BENCHMARKED)), "contract kernels: no case, no reason"
    assert set(NOT_BENCHMARKED) <= kernels, "a reason for a kernel that has no contract"
    assert not (set(NOT_BENCHMARKED) & have), "a kernel both benchmarked and excused"
    assert all("NO REASON" not in line for line in coverage_lines(quick=True))


@pytest.mark.parametrize("quick", [True, False])
def test_case_keys_unique_and_each_kernel_at_two_sizes(quick):
    cs = cases(quick)
    assert len({c.key for c in cs}) == len(cs)
    for kernel in {c.kernel for c in cs}:
        assert {"normal", "large"} <= {c.size for c in cs if c.kernel == kernel}, kernel
    (mem,) = [c for c in cs if c.size == "S=2048"]
    assert mem.kernel == "attention" and "x2048x" in mem.label


def _row(kernel, ratio, shape="8x8", p="fwd"):
    return {"kernel": kernel, "shape": shape, "pass": p, "time_ratio": ratio}


def test_compare_fails_warns_and_lists_missing_rows():
    base = [_row("a", 1.0), _row("b", 1.0), _row("c", 1.0), _row("gone", 1.0)]
    # the baseline's row "a" looks 20 % faster than this run: ratio grew by 1/0.8 = 1.25
    base[0]["time_ratio"] = 0.8
    rows = [_row("a", 1.0), _row("b", 1.07), _row("c", 0.5), _row("added", 1.0)]
    missing, new = compare(rows, base)
    assert [r["check"] for r in rows] == ["FAIL", "warn", "ok", "new"]
    assert rows[0]["vs_baseline"] == pytest.approx(1.25)
    assert missing == ["gone 8x8 fwd"] and new == ["added 8x8 fwd"]


def test_save_baseline_then_check_pass_and_fail(tmp_path):
    base = tmp_path / "machines" / "ci.json"
    quick = ["--quick", "--only", "softmax", "--repeats", "3", "--no-memory"]
    r = _run(*quick, "--save-baseline", str(base), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(base.read_text())
    assert {"cpu", "cores", "torch", "threads"} <= set(doc["machine"]) and doc["quick"] is True
    assert [(x["kernel"], x["pass"]) for x in doc["rows"]] == [("softmax", "fwd")] * 2
    assert not list(base.parent.glob("*.tmp"))  # the temp file was renamed, not left behind
    # in a log (no terminal), one line per finished case on stderr, beside stdout's table
    done = [ln for ln in r.stderr.splitlines() if re.match(
        r"^bench kernels: softmax \S+ fwd: ours [\d.]+ ms, eager [\d.]+ ms, ratio [\d.]+, "
        r"\d+ s$", ln)]
    assert len(done) == 2, r.stderr

    # every row's baseline ratio made 1000× worse: this run is faster everywhere, the check
    # passes (a literal re-check of the same numbers passes or fails with the machine's load:
    # tiny kernels on 2 busy cores swing by several × between runs)
    for x in doc["rows"]:
        x["time_ratio"] *= 1000
    slower = tmp_path / "slower.json"
    slower.write_text(json.dumps(doc))
    r = _run(*quick, "--check", str(slower), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"check against {slower}: passed" in r.stdout

    # one row made to look 1000× faster in the baseline than the run (1000× then ÷ 10⁶)
    victim = doc["rows"][1]
    victim["time_ratio"] /= 1e6
    faster = tmp_path / "faster.json"
    faster.write_text(json.dumps(doc))
    r = _run(*quick, "--check", str(faster), cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"FAIL: softmax {victim['shape']} fwd" in r.stdout
    assert f"FAIL: softmax {doc['rows'][0]['shape']}" not in r.stdout
    assert "FAILED, 1 rows" in r.stdout


def test_check_with_a_bad_baseline_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    for text in ("{not json", json.dumps({"format": "something else"}),
                 json.dumps({"format": "falsify-bench-kernels-baseline-v1",
                             "rows": [{"kernel": "softmax", "shape": "1", "pass": "fwd",
                                       "time_ratio": "fast"}]})):
        bad.write_text(text)
        r = _run("--quick", "--only", "softmax", "--check", str(bad), cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert "Traceback" not in r.stderr and len(errors) == 1 and str(bad) in errors[0]
    r = _run("--quick", "--check", str(tmp_path / "absent.json"), cwd=tmp_path)
    assert r.returncode == 2 and "absent.json: baseline file not found" in r.stderr


def test_gpu_throughput_against_the_peak():
    """The CUDA-only figures, on fixed numbers (no GPU here): TFLOP/s for GEMM-class cases,
    GB/s for memory-bound ones, a percentage only when the device's peak is known."""
    from falsify.bench.kernels import GPU_PEAKS, _throughput

    gemm = next(c for c in cases(quick=True) if c.kernel == "gemm" and c.passes == "fwd")
    rms = next(c for c in cases(quick=True) if c.kernel == "rmsnorm" and c.passes == "fwd")
    assert _throughput(gemm, gemm.flops / 2e14, ("H100", 4e14, 3e12)) == "200.0 TFLOP/s (50%)"
    assert _throughput(rms, rms.bytes / 1.5e12, ("H100", 4e14, 3e12)) == "1500.0 GB/s (50%)"
    assert _throughput(rms, rms.bytes / 1.5e12, ("Unknown GPU", None, None)) == "1500.0 GB/s"
    assert [n for n, _, _ in GPU_PEAKS].index("H100 PCIe") < [n for n, _, _ in GPU_PEAKS].index(
        "H100")  # most specific name first
    assert all(c.triton is not None for c in cases(quick=True) if c.contract in (
        "gemm", "softmax", "rmsnorm", "rope", "swiglu", "gelu", "attention", "cross_entropy",
        "fused_linear_cross_entropy", "fused_linear_kd", "embedding", "adamw", "grad_clip",
        "lora", "qlora", "nf4"))
