"""`falsify bench kernels`: our kernels vs the plain eager PyTorch formulation of the same thing,
measured side by side in one run (the cases: falsify/bench/kernel_cases.py).

Time: the fastest of interleaved samples (ours, baseline, ours, …) after warm-up, so drift in
the machine's load hits both sides alike; every figure that matters is the ratio ours / eager.
Peak memory: each (case, implementation) runs in a fresh subprocess; after the inputs exist we
reset the kernel's resident-set high-water mark (`echo 5 > /proc/self/clear_refs`) and report
VmHWM − VmRSS after one call (forward, plus backward where the case trains): the extra bytes the
call needed at its peak. This is Linux only and counts real resident pages, including allocator
caching. On a CUDA device the child reports torch's peak allocated bytes instead.

Without a CUDA device the torch backend is the one timed (Triton runs only under its
interpreter here, whose timings mean nothing). With one, the same cases also time the Triton
implementations and report TFLOP/s (GEMM-class cases) or GB/s (memory-bound cases) against the
device's peak.

Baselines per machine: `--save-baseline FILE` writes the run's rows and the machine's
description; `--check FILE` compares each (kernel, shape, pass) row's ratio ours / eager with
the file's: grown by more than 10 % fails (exit 1), 5–10 % warns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from falsify.bench.kernel_cases import Case, cases, coverage_lines
from falsify.errors import UsageError
from falsify.harness.files import atomic_write
from falsify.helptext import first_paragraph
from falsify.llm.bench_baseline import BASELINE_FORMAT, load_baseline

FAIL_GROWTH = 1.10  # ratio ours/eager grown by more than this fails --check
WARN_GROWTH = 1.05  # ... by more than this warns
MIN_SAMPLE_S = 0.02  # shortest timed sample (several calls of a fast kernel)

# Dense peaks per device (TF32 tensor-core FLOP/s, since fp32 tl.dot runs as TF32 in Triton,
# and HBM bytes/s), from the vendors' data sheets. Matched by substring of the device name, most
# specific first; a device not listed gets no percentage and a line saying so.
GPU_PEAKS = (
    ("H200", 494.7e12, 4.8e12),
    ("H100 PCIe", 378.0e12, 2.0e12),
    ("H100", 494.7e12, 3.35e12),
    ("A100-SXM4-80GB", 156.0e12, 2.039e12),
    ("A100", 156.0e12, 1.555e12),
)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def _tensors(args: dict):
    for v in args.values():
        for t in (v if isinstance(v, list) else [v]):
            if isinstance(t, torch.Tensor):
                yield t


def _call(case: Case, fn, args: dict):
    if case.backward:
        for t in _tensors(args):
            t.grad = None
        out = fn(args)
        y = out[0] if isinstance(out, (tuple, list)) else out
        y.float().sum().backward()
        return out
    with torch.no_grad():
        return fn(args)


def time_sides(case: Case, sides: dict, repeats: int, dev: str) -> dict[str, float]:
    """Seconds per call of each side: the fastest of `repeats` samples, samples interleaved so
    load drift hits all sides alike. A sample is `inner` back-to-back calls lasting at least
    MIN_SAMPLE_S: a kernel of 0.1 ms timed alone is at the mercy of one scheduler tick. The
    minimum, not the median: other processes only ever add time (on 2 busy cores one of torch's
    two threads waits at every barrier for a core, 10-40× slowdowns measured), so the least
    disturbed sample is the closest to the kernel's own cost, and each side gets the same
    number of chances at it."""
    args = case.setup(dev, case.backward)
    slowest = 0.0
    for _ in range(2):  # warm-up: allocator, lazy init, (on a GPU) compilation
        for fn in sides.values():
            _sync(dev)
            t0 = time.perf_counter()
            _call(case, fn, args)
            _sync(dev)
            slowest = max(slowest, time.perf_counter() - t0)
    inner = max(1, min(1000, math.ceil(MIN_SAMPLE_S / max(slowest, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(inner):
                _call(case, fn, args)
            _sync(dev)
            times[name].append((time.perf_counter() - t0) / inner)
    return {name: min(ts) for name, ts in times.items()}


def find_case(kernel: str, label: str, passes: str, quick: bool) -> Case:
    case = next((c for c in cases(quick) if c.key == (kernel, label, passes)), None)
    if case is None:
        raise UsageError(f"no benchmark case {kernel!r} {label!r} {passes!r}"
                         + (" in the --quick set" if quick else ""))
    return case


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure_peak(kernel: str, label: str, passes: str, which: str, quick: bool = False) -> int:
    case = find_case(kernel, label, passes, quick)
    fn = case.ours if which == "ours" else case.baseline
    dev = _device()
    args = case.setup(dev, case.backward)
    if dev == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _call(case, fn, args)
        torch.cuda.synchronize()
        return max(0, torch.cuda.max_memory_allocated() - base)
    rss = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    _call(case, fn, args)
    return max(0, _status("VmHWM") - rss)


def peak_in_subprocess(case: Case, which: str, quick: bool = False) -> int:
    # Through `python -m falsify`, which imports this module under its own name: the child
    # measures the very case list the parent timed, never a second copy of the module loaded
    # as __main__ (whose module-level state other modules' imports would not reach).
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "kernels", "--measure",
                        *case.key, which] + (["--quick"] if quick else []),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"peak measurement failed for {' '.join(case.key)} {which}:\n"
                           + r.stderr[-2000:])
    return int(json.loads(r.stdout.strip().splitlines()[-1])["peak_extra_bytes"])


# ------------------------------------------------------------------------------ baselines

def machine() -> dict:
    """What makes a baseline belong to one machine: ratios move with the CPU, its core count,
    torch's build and the threads it uses."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass  # not Linux: platform's answer above stands
    d = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
         "threads": torch.get_num_threads(), "platform": platform.platform()}
    if torch.cuda.is_available():
        d["gpu"] = torch.cuda.get_device_name()
    return d


def save_baseline(path: Path, rows: list[dict], quick: bool) -> None:
    doc = {"format": BASELINE_FORMAT, "machine": machine(), "quick": quick,
           # size and the Triton time (a GPU run only) are what the dispatcher ranks backends
           # by (falsify/llm/dispatch.py: `backend=fastest-verified`)
           "rows": [{k: r[k] for k in ("kernel", "size", "shape", "pass", "ours_ms", "triton_ms",
                                       "base_ms", "time_ratio") if k in r} for r in rows]}
    atomic_write(path, json.dumps(doc, indent=1))


def compare(rows: list[dict], baseline_rows: list[dict]) -> tuple[list[str], list[str]]:
    """Annotate each measured row with `vs_baseline` (ratio now / ratio then) and `check`
    ("ok", "warn", "FAIL", "new"); return (keys of baseline rows this run did not measure,
    keys of rows the baseline lacks), each as "kernel shape pass"."""
    base = {(r["kernel"], r["shape"], r["pass"]): r["time_ratio"] for r in baseline_rows}
    new = []
    for r in rows:
        key = (r["kernel"], r["shape"], r["pass"])
        if key not in base:
            r["vs_baseline"], r["check"] = None, "new"
            new.append(" ".join(key))
            continue
        growth = r["time_ratio"] / base[key]
        r["vs_baseline"] = growth
        r["check"] = "FAIL" if growth > FAIL_GROWTH else "warn" if growth > WARN_GROWTH else "ok"
    measured = {(r["kernel"], r["shape"], r["pass"]) for r in rows}
    missing = [" ".join(k) for k in base if k not in measured]
    return missing, new


# ------------------------------------------------------------------------------ GPU figures

def gpu_peaks() -> tuple[str, float | None, float | None]:
    name = torch.cuda.get_device_name()
    for sub, flops, bw in GPU_PEAKS:
        if sub in name:
            return name, flops, bw
    return name, None, None


def _throughput(case: Case, seconds: float, peaks) -> str:
    _, pf, pb = peaks
    if case.flops:
        v, unit, peak = case.flops / seconds, "TFLOP/s", pf
        shown = v / 1e12
    elif case.bytes:
        v, unit, peak = case.bytes / seconds, "GB/s", pb
        shown = v / 1e9
    else:
        return "-"
    return f"{shown:.1f} {unit}" + (f" ({100 * v / peak:.0f}%)" if peak else "")


# ------------------------------------------------------------------------------ the verb

def register(sub) -> None:
    p = sub.add_parser("kernels", help="our kernels vs eager PyTorch: time, memory, baselines",
                       description=first_paragraph(__doc__))
    add_arguments(p)
    p.set_defaults(func=cmd_kernels)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measure", nargs=4, metavar=("KERNEL", "SHAPE", "PASS", "WHICH"),
                   help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true",
                   help="small shapes (about a minute on 2 cores), ours vs the baseline as usual")
    p.add_argument("--only", default=None,
                   help="comma-separated substrings of the kernel names to run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--save-baseline", type=Path, metavar="FILE",
                   help="write this run's rows and machine description to FILE (JSON)")
    p.add_argument("--check", type=Path, metavar="FILE",
                   help="compare each row's ratio ours/eager with FILE's: > 10%% slower fails "
                        "(exit 1), 5-10%% warns")


def _selected(args) -> list[Case]:
    if args.repeats < 1:
        raise UsageError(f"--repeats must be ≥ 1, got {args.repeats}")
    subs = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    chosen = [c for c in cases(args.quick) if subs is None or any(s in c.kernel for s in subs)]
    if not chosen:
        raise UsageError(f"--only {args.only!r} matches no kernel")
    return chosen


def cmd_kernels(args) -> int:
    if args.measure:
        print(json.dumps({"peak_extra_bytes": measure_peak(*args.measure, args.quick)}))
        return 0
    # read the baseline before measuring anything: a bad file costs no benchmark time
    baseline = load_baseline(args.check) if args.check else None
    chosen = _selected(args)
    from falsify import triton_env

    triton_env.announce()  # its Triton timings are the interpreter's
    dev = _device()
    peaks = gpu_peaks() if dev == "cuda" else None
    rows = _measure(args, chosen, dev, peaks)
    missing, new = compare(rows, baseline["rows"]) if baseline else ([], [])
    if args.save_baseline:
        save_baseline(args.save_baseline, rows, args.quick)
    failed = [r for r in rows if r.get("check") == "FAIL"]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        _print_table(rows, dev, peaks, baseline is not None)
    if baseline is not None:
        _print_check(args, baseline, rows, missing, new, failed,
                     sys.stderr if args.format == "json" else sys.stdout)
    if args.save_baseline:
        print(f"baseline written to {args.save_baseline}",
              file=sys.stderr if args.format == "json" else sys.stdout)
    return 1 if failed else 0


def _measure(args, chosen: list[Case], dev: str, peaks) -> list[dict]:
    """One row per case, watched through the shared progress display on stderr (stdout is
    the table or JSON): on a terminal cases done of total and an ETA from the cases' mean; in a
    log one line per finished case. It is redrawn between cases only, never while timing."""
    from rich.console import Console

    from falsify.harness.progress import Progress

    rows = []
    with Progress(Console(stderr=True), "cases", total=len(chosen), ticking=False) as view:
        for c in chosen:
            view.start(" ".join(c.key))
            t0 = time.monotonic()
            sides = {"ours": c.ours, "baseline": c.baseline}
            if dev == "cuda" and c.triton is not None:
                sides["triton"] = c.triton
            t = time_sides(c, sides, args.repeats, dev)
            row = dict(kernel=c.kernel, shape=c.label, size=c.size, **{"pass": c.passes},
                       baseline=c.baseline_name, ours_ms=t["ours"] * 1e3,
                       base_ms=t["baseline"] * 1e3, time_ratio=t["ours"] / t["baseline"])
            if "triton" in t:
                row.update(triton_ms=t["triton"] * 1e3,
                           triton_ratio=t["triton"] / t["baseline"],
                           triton_throughput=_throughput(c, t["triton"], peaks),
                           ours_throughput=_throughput(c, t["ours"], peaks))
            if not args.no_memory:
                mo = peak_in_subprocess(c, "ours", args.quick)
                mb = peak_in_subprocess(c, "baseline", args.quick)
                row.update(ours_peak_mb=mo / 2**20, base_peak_mb=mb / 2**20,
                           mem_ratio=mo / mb if mb else None)
            rows.append(row)
            view.finished(f"bench kernels: {' '.join(c.key)}: ours {row['ours_ms']:.3f} ms, "
                          f"eager {row['base_ms']:.3f} ms, ratio {row['time_ratio']:.2f}, "
                          f"{time.monotonic() - t0:.0f} s")
    return rows


def _print_table(rows, dev, peaks, checked) -> None:
    from rich.console import Console
    from rich.table import Table

    where = (f"CUDA {peaks[0]}" if dev == "cuda"
             else f"CPU, {torch.get_num_threads()} threads")
    t = Table(title=f"falsify bench kernels — {where}, ours vs eager PyTorch "
                    "(ratio < 1: ours is faster / smaller)")
    cols = ["kernel", "size", "shape", "pass", "ours ms", "eager ms", "time ratio"]
    if dev == "cuda":
        cols += ["triton ms", "triton ratio", "triton", "ours (torch)"]
    cols += ["ours peak MiB", "eager peak MiB", "mem ratio"]
    if checked:
        cols += ["vs baseline", "check"]
    left = {"kernel", "size", "shape", "pass", "check"}
    for col in cols:
        t.add_column(col, justify="left" if col in left else "right")
    for r in rows:
        cells = [r["kernel"], r["size"], r["shape"], r["pass"], f"{r['ours_ms']:.2f}",
                 f"{r['base_ms']:.2f}", f"{r['time_ratio']:.2f}"]
        if dev == "cuda":
            cells += ([f"{r['triton_ms']:.3f}", f"{r['triton_ratio']:.2f}",
                       r["triton_throughput"], r["ours_throughput"]] if "triton_ms" in r
                      else ["-", "-", "-", "-"])
        cells += [f"{r['ours_peak_mb']:.1f}" if "ours_peak_mb" in r else "-",
                  f"{r['base_peak_mb']:.1f}" if "base_peak_mb" in r else "-",
                  f"{r['mem_ratio']:.2f}" if r.get("mem_ratio") else "-"]
        if checked:
            g = r.get("vs_baseline")
            cells += [f"{100 * (g - 1):+.0f}%" if g else "-", r["check"]]
        t.add_row(*cells)
    Console(width=220).print(t)
    if dev == "cuda":
        if peaks[1] is None:
            print(f"{peaks[0]}: no peak figures known (GPU_PEAKS in falsify/bench/kernels.py); "
                  "throughput shown without a percentage.")
    else:
        print("Triton timings need a CUDA GPU (here Triton runs only under its interpreter): "
              "this CPU run times the torch backend against eager PyTorch.")
    for line in coverage_lines():
        print(f"no case: {line}")


def _print_check(args, baseline, rows, missing, new, failed, out) -> None:
    here, there = machine(), baseline.get("machine")
    if there != here:
        print(f"note: baseline {args.check} was made on {there}; this run: {here}", file=out)
    if bool(baseline.get("quick")) != args.quick:
        made, now = ("with" if baseline.get("quick") else "without",
                     "with" if args.quick else "without")
        print(f"note: baseline {args.check} was made {made} --quick, this run {now} it: its "
              "shapes differ", file=out)
    for r in rows:
        if r["check"] in ("FAIL", "warn"):
            print(f"{r['check']}: {r['kernel']} {r['shape']} {r['pass']}: ratio ours/eager "
                  f"{r['time_ratio']:.3f} vs baseline {r['time_ratio'] / r['vs_baseline']:.3f}"
                  f" ({100 * (r['vs_baseline'] - 1):+.0f}%)", file=out)
    if missing:
        print(f"{len(missing)} baseline rows not measured in this run"
              + (f" (--only {args.only})" if args.only else "") + ": " + "; ".join(missing),
              file=out)
    if new:
        print(f"{len(new)} rows not in the baseline: " + "; ".join(new), file=out)
    print(f"check against {args.check}: "
          + (f"FAILED, {len(failed)} rows more than {100 * (FAIL_GROWTH - 1):.0f}% slower "
             "relative to eager" if failed else "passed"), file=out)


def main(argv: list[str] | None = None) -> int:
    """`python -m falsify.bench.kernels ...`, the same as `falsify bench kernels ...`: parsed
    here, with the verb's own arguments, so that the benchmark does not import the command
    line. A usage or I/O error is one line on stderr and exit 2, as under `falsify`."""
    p = argparse.ArgumentParser(prog="python -m falsify.bench.kernels",
                                description=first_paragraph(__doc__))
    add_arguments(p)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return cmd_kernels(args)
    except (UsageError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
