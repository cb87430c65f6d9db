"""`falsify bench kernels`: our torch kernels vs the plain eager PyTorch formulation, on CPU,
measured side by side in one run.

Time: median of interleaved repeats (ours, baseline, ours, …) after warm-up, so drift in the
machine's load hits both sides alike. Peak memory: each (case, implementation) runs in a fresh
subprocess; after the inputs exist we reset the kernel's resident-set high-water mark
(`echo 5 > /proc/self/clear_refs`) and report VmHWM − VmRSS after one call (forward, plus
backward where the case trains): the extra bytes the call needed at its peak. This is Linux
only and counts real resident pages, including allocator caching.

On a GPU (when present) the same cases report Triton vs PyTorch in TFLOP/s or GB/s; without one
that part is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from falsify.cli.common import UsageError


@dataclass
class Case:
    kernel: str
    label: str
    setup: Callable[[], dict]
    ours: Callable[[dict], object]
    baseline: Callable[[dict], object]
    baseline_name: str
    flops: float = 0.0  # per call, for GFLOP/s
    backward: bool = False


def _bwd(out, args):
    y = out[0] if isinstance(out, (tuple, list)) else out
    y.float().sum().backward() if y.requires_grad else None


def _rand(*shape, grad=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)
    return t.requires_grad_(grad)


def cases(quick: bool = False) -> list[Case]:
    """Every case, defined here so that the list is the same however this module is loaded
    (imported, or run as __main__ by the peak-memory subprocess). `quick`: small shapes, still
    one power-of-2 and one odd shape per kernel, for a run of a couple of minutes."""
    out: list[Case] = []

    def add(kernel, *a, **k):
        out.append(Case(kernel, *a, **k))

    from falsify.impl.torch import softmax as sm

    for m, n in ((256, 1024), (255, 4099)) if quick else ((4096, 4096), (1023, 32000)):
        add("softmax", f"{m}x{n}", lambda m=m, n=n: {"x": _rand(m, n)},
            lambda a: sm.softmax(a["x"]),
            lambda a: torch.exp(a["x"] - a["x"].amax(-1, keepdim=True)).div_(
                torch.exp(a["x"] - a["x"].amax(-1, keepdim=True)).sum(-1, keepdim=True)),
            "eager exp/sum", flops=5.0 * m * n)
    try:
        from falsify.impl.torch import rmsnorm as rn
    except ImportError:
        rn = None
    if rn is not None:
        for m, n in ((512, 1024), (255, 1000)) if quick else ((8192, 1024), (4096, 4096)):
            def setup(m=m, n=n):
                return {"x": _rand(m, n, grad=True), "w": _rand(n, grad=True, seed=1)}

            def eager(a):
                x, w = a["x"], a["w"]
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

            add("rmsnorm fwd+bwd", f"{m}x{n}", setup, lambda a: rn.rmsnorm(a["x"], a["w"], 1e-6),
                eager, "eager x*rsqrt(mean(x²)+eps)*w", flops=4.0 * m * n * 3, backward=True)
    from falsify.impl.torch.fused_linear_cross_entropy import fused_linear_cross_entropy

    # A language-model head (4k tokens, hidden 1k, 32k vocabulary) in the full run: the naive
    # side materialises the [T, V] logits and their gradient, which the fused kernel avoids.
    T, H, V = (512, 256, 8192) if quick else (4096, 1024, 32768)

    def flce_setup(T=T, H=H, V=V):
        x = (_rand(T, H) / H ** 0.5).requires_grad_(True)
        w = (_rand(V, H, seed=1) / H ** 0.5).requires_grad_(True)
        y = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(2))
        y[::7] = -100
        return {"x": x, "w": w, "y": y}

    add("fused_linear_cross_entropy", f"{T}x{H}x{V}", flce_setup,
        lambda a: fused_linear_cross_entropy(a["x"], a["w"], a["y"]),
        lambda a: F.cross_entropy(a["x"] @ a["w"].t(), a["y"], ignore_index=-100),
        "F.cross_entropy(x @ W.T, y)", flops=3 * 2.0 * T * H * V, backward=True)

    from falsify.impl.torch.fused_linear_kd import fused_linear_kd

    # Distillation head (4k tokens, hidden 512, 32k vocabulary) with full teacher logits: the
    # naive side holds the [N, V] student logits, both tempered log-softmaxes, the KL terms and
    # their gradients. Every label counted, so kl_div's batchmean is the mean over valid rows.
    N, D, V = (512, 128, 8192) if quick else (4096, 512, 32000)
    temp, alpha = 2.0, 0.5

    def kd_setup(N=N, D=D, V=V):
        x = (_rand(N, D) / D ** 0.5).requires_grad_(True)
        w = (_rand(V, D, seed=1) / D ** 0.5).requires_grad_(True)
        zt = _rand(N, V, seed=3) * 3
        y = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(2))
        return {"x": x, "w": w, "zt": zt, "y": y}

    def kd_naive(a):
        z = a["x"] @ a["w"].t()  # once, shared by both terms
        kl = F.kl_div(F.log_softmax(z / temp, -1), F.log_softmax(a["zt"] / temp, -1),
                      log_target=True, reduction="batchmean")
        return kl * temp ** 2 * alpha + (1 - alpha) * F.cross_entropy(z, a["y"])

    add("fused_linear_kd", f"{N}x{D}x{V}", kd_setup,
        lambda a: fused_linear_kd(a["x"], a["w"], a["zt"], a["y"], temperature=temp,
                                  alpha=alpha),
        kd_naive, "F.kl_div(log_softmax(x @ W.T / T), ...) + F.cross_entropy",
        flops=3 * 2.0 * N * D * V, backward=True)
    return out


def _call(case: Case, which: str, args: dict):
    fn = case.ours if which == "ours" else case.baseline
    if case.backward:
        for t in args.values():
            if isinstance(t, torch.Tensor) and t.grad is not None:
                t.grad = None
        out = fn(args)
        _bwd(out, args)
        return out
    with torch.no_grad():
        return fn(args)


def time_pair(case: Case, repeats: int = 5) -> tuple[float, float]:
    args = case.setup()
    for _ in range(2):
        _call(case, "ours", args)
        _call(case, "baseline", args)
    t_ours, t_base = [], []
    for _ in range(repeats):
        for which, acc in (("ours", t_ours), ("baseline", t_base)):
            t0 = time.perf_counter()
            _call(case, which, args)
            acc.append(time.perf_counter() - t0)
    return statistics.median(t_ours), statistics.median(t_base)


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure_peak(kernel: str, label: str, which: str, quick: bool = False) -> int:
    case = next((c for c in cases(quick) if c.kernel == kernel and c.label == label), None)
    if case is None:
        raise UsageError(f"no benchmark case {kernel!r} {label!r}"
                         + (" in the --quick set" if quick else ""))
    args = case.setup()
    rss = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    _call(case, which, args)
    return max(0, _status("VmHWM") - rss)


def peak_in_subprocess(case: Case, which: str, quick: bool = False) -> int:
    # Through `python -m falsify`, which imports this module under its own name: the child
    # measures the very case list the parent timed, never a second copy of the module loaded
    # as __main__ (whose module-level state other modules' imports would not reach).
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "kernels", "--measure",
                        case.kernel, case.label, which] + (["--quick"] if quick else []),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"peak measurement failed for {case.kernel} {case.label} {which}:\n"
                           + r.stderr[-2000:])
    return int(json.loads(r.stdout.strip().splitlines()[-1])["peak_extra_bytes"])


def register(sub) -> None:
    p = sub.add_parser("kernels", help="our torch kernels vs eager PyTorch: time and peak "
                                       "memory", description=__doc__.split("\n")[0])
    p.add_argument("--measure", nargs=3, metavar=("KERNEL", "LABEL", "WHICH"),
                   help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true",
                   help="small shapes (a couple of minutes), ours vs the baseline as usual")
    p.add_argument("--only", default=None, help="substring of the kernel names to run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_kernels)


def cmd_kernels(args) -> int:
    if args.measure:
        print(json.dumps({"peak_extra_bytes": measure_peak(*args.measure, args.quick)}))
        return 0
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(torch.get_num_threads())
    rows = []
    for c in cases(args.quick):
        if args.only and args.only not in c.kernel:
            continue
        t_ours, t_base = time_pair(c, args.repeats)
        row = dict(kernel=c.kernel, shape=c.label, baseline=c.baseline_name,
                   ours_ms=t_ours * 1e3, base_ms=t_base * 1e3, time_ratio=t_ours / t_base,
                   gflops=c.flops / t_ours / 1e9 if c.flops else None)
        if not args.no_memory:
            mo = peak_in_subprocess(c, "ours", args.quick)
            mb = peak_in_subprocess(c, "baseline", args.quick)
            row.update(ours_peak_mb=mo / 2**20, base_peak_mb=mb / 2**20,
                       mem_ratio=mo / mb if mb else None)
        rows.append(row)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    t = Table(title=f"falsify bench kernels — CPU, {torch.get_num_threads()} threads, "
                    "ours vs eager PyTorch (ratio < 1: ours is faster / smaller)")
    for col in ("kernel", "shape", "ours ms", "eager ms", "time ratio", "ours peak MiB",
                "eager peak MiB", "mem ratio"):
        t.add_column(col, justify="right" if col not in ("kernel", "shape") else "left")
    for r in rows:
        t.add_row(r["kernel"], r["shape"], f"{r['ours_ms']:.2f}", f"{r['base_ms']:.2f}",
                  f"{r['time_ratio']:.2f}",
                  f"{r.get('ours_peak_mb', float('nan')):.1f}",
                  f"{r.get('base_peak_mb', float('nan')):.1f}",
                  f"{r['mem_ratio']:.2f}" if r.get("mem_ratio") else "-")
    Console(width=200).print(t)
    if not torch.cuda.is_available():
        print("GPU section: no CUDA device visible — Triton vs PyTorch/cuBLAS TFLOP/s and GB/s "
              "are measured only on a GPU.")
    return 0


if __name__ == "__main__":  # `python -m falsify.bench.kernels ...` is `falsify bench kernels ...`
    from falsify.cli import main

    sys.exit(main(["bench", "kernels", *sys.argv[1:]]))
