"""Memory and speed evidence for the fused linear cross-entropy: the peak-memory run the
contract asserts, the benchmark entry for `falsify bench kernels`, and a standalone benchmark
(`python -m falsify.proofs.fused_linear_cross_entropy`).

Measuring allocated bytes on CPU. torch has no CPU counterpart of
torch.cuda.max_memory_allocated, and the process RSS mixes in allocator caching, page
granularity and whatever glibc keeps. The profiler, with profile_memory=True, records every
allocation and free of torch's CPU allocator with a running "Total Allocated" (bytes live
from allocations made since profiling started). Its maximum over the run is the peak *extra*
memory the call needed, in exact bytes, independent of allocator caching and deterministic
for a given shape — the CPU analogue of max_memory_allocated. Inputs allocated before the
profiler starts are not counted; gradients created by backward are.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def peak_allocated_bytes(fn) -> int:
    """Peak of torch's CPU "Total Allocated" while fn() runs (bytes beyond what was live
    before it started)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return _peak_from_trace(prof)


def _peak_from_trace(prof) -> int:
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    mem = sorted((e for e in trace["traceEvents"] if e.get("name") == "[memory]"),
                 key=lambda e: e["ts"])
    return max([int(e["args"]["Total Allocated"]) for e in mem] + [0])


def _bound_flce(backend):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract("fused-linear-cross-entropy-kernel-v1"),
                             "fused_linear_cross_entropy", backend)


def _inputs(T, H, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, H, generator=g) / H ** 0.5).to(dtype).requires_grad_(True)
    w = (torch.randn(V, H, generator=g) / H ** 0.5).to(dtype).requires_grad_(True)
    y = torch.randint(0, V, (T,), generator=g)
    y[::7] = -100
    return x, w, y


def naive(x, w, y):
    return F.cross_entropy(x @ w.t(), y, ignore_index=-100)


def memory_vs_naive(backend, dtype, T, H, V, chunk_size):
    """Peak extra bytes of one forward + backward (reduction mean and none) of the bound FLCE
    and of the naive F.cross_entropy(x @ W.T, y), and the analytic bound for ours:
        dW (V·H fp32) + dx (T·H) + the returned grads (V·H + T·H in the input dtype)
        + 2 blocks of C·V fp32 (a chunk's logits/gradient and one temporary)
        + a vocabulary-chunk temporary per row block + O(T) row vectors.
    The naive path holds at least the [T, V] logits and their gradient: 2·T·V·4 bytes."""
    if dtype != "float32":
        raise ValueError("the memory comparison runs in float32")
    fn = _bound_flce(backend)
    tdt = getattr(torch, dtype)
    out = {}
    for reduction in ("mean", "none"):
        x, w, y = _inputs(T, H, V, tdt)

        def ours(x=x, w=w, y=y, reduction=reduction):
            loss = fn(x, w, y, reduction=reduction, chunk_size=chunk_size)
            loss.backward(torch.ones_like(loss))

        out[f"ours_{reduction}"] = peak_allocated_bytes(ours)
    x, w, y = _inputs(T, H, V, tdt)
    out["naive"] = peak_allocated_bytes(lambda: naive(x, w, y).backward())
    es = torch.tensor([], dtype=tdt).element_size()
    C = chunk_size
    out["bound"] = (V * H * 4 + T * H * 4 + (V * H + T * H) * es + 2 * C * V * 4
                    + C * 2048 * 4 * 4 + 64 * T + (1 << 16))
    out["logits_bytes"] = T * V * 4
    return out


def bench_cases():
    """Cases for `falsify bench kernels` (register with EXTRA_CASES.append(bench_cases)): our
    torch FLCE vs F.cross_entropy(x @ W.T, y), forward + backward, fp32, at the spec's shape
    tokens=4096, hidden=1024, vocab=32768."""
    from falsify.bench.kernels import Case
    from falsify.impl.torch.fused_linear_cross_entropy import fused_linear_cross_entropy

    T, H, V = 4096, 1024, 32768

    def setup():
        x, w, y = _inputs(T, H, V, torch.float32)
        return {"x": x, "w": w, "y": y}

    return [Case("fused_linear_cross_entropy", f"{T}x{H}x{V}", setup,
                 lambda a: fused_linear_cross_entropy(a["x"], a["w"], a["y"]),
                 lambda a: naive(a["x"], a["w"], a["y"]),
                 "F.cross_entropy(x @ W.T, y)", flops=3 * 2.0 * T * H * V, backward=True)]


def benchmark(T=4096, H=1024, V=32768, repeats=3, backend="torch"):
    """Median wall time of forward + backward (interleaved repeats after one warm-up each) and
    peak extra allocated bytes, ours vs naive."""
    import importlib

    mod = importlib.import_module(f"falsify.impl.{backend}.fused_linear_cross_entropy")
    x, w, y = _inputs(T, H, V, torch.float32)

    def run(which):
        x.grad = w.grad = None
        loss = mod.fused_linear_cross_entropy(x, w, y) if which == "ours" else naive(x, w, y)
        loss.backward()
        return float(loss)

    losses = {k: run(k) for k in ("ours", "naive")}  # warm-up, and the values to compare
    times = {"ours": [], "naive": []}
    for _ in range(repeats):
        for which in ("ours", "naive"):
            t0 = time.perf_counter()
            run(which)
            times[which].append(time.perf_counter() - t0)
    peaks = {}
    for which in ("ours", "naive"):
        x.grad = w.grad = None
        peaks[which] = peak_allocated_bytes(lambda which=which: run(which))
    t_o, t_n = statistics.median(times["ours"]), statistics.median(times["naive"])
    return {"shape": f"tokens={T}, hidden={H}, vocab={V}", "threads": torch.get_num_threads(),
            "ours_s": t_o, "naive_s": t_n, "time_ratio": t_o / t_n,
            "ours_peak_mib": peaks["ours"] / 2 ** 20, "naive_peak_mib": peaks["naive"] / 2 ** 20,
            "mem_ratio": peaks["ours"] / peaks["naive"],
            "loss_ours": losses["ours"], "loss_naive": losses["naive"]}


if __name__ == "__main__":
    args = dict(a.split("=") for a in sys.argv[1:])
    print(json.dumps(benchmark(**{k: (v if k == "backend" else int(v)) for k, v in args.items()}),
                     indent=1))
