"""The peak-memory run of falsify/contracts/fused-linear-cross-entropy-kernel-v1.yaml: ours vs the
naive
F.cross_entropy(x @ W.T, y), against the analytic bound. (The side-by-side speed and memory
benchmark is `falsify bench kernels`.)

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

import torch
import torch.nn.functional as F

from falsify.probes import device


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
    if not mem:
        return 0
    # "Total Allocated" is the profiler's running total over every allocation it has seen
    # while profiling, in this window or an earlier one; tensors from an earlier window freed
    # outside any window stay in it. The window's own baseline is the total before its first
    # event, so the peak counts only what this call added.
    base = int(mem[0]["args"]["Total Allocated"]) - int(mem[0]["args"]["Bytes"])
    return max(0, max(int(e["args"]["Total Allocated"]) for e in mem) - base)


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
    if device(backend) != "cpu":
        raise ValueError(f"backend={backend!r} runs on {device(backend)}: this probe measures "
                         "torch's CPU allocator")
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
