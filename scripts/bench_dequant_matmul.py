"""CPU timing and peak memory of the chunked torch dequant_matmul against dequantize-the-whole-
weight-then-F.linear, on one GGUF-quantized weight [n, k] and activations x [m, k].

    python scripts/bench_dequant_matmul.py [--qtype q4_k] [--n 4096] [--k 4096] [--m 512]

Time: the two variants run alternately in one process, --repeat times each after a warm-up,
forward only (no_grad) and forward + backward (dx; the weight is frozen); the minimum of each
is reported, the estimate least disturbed by other work on a shared machine (by default the
process's CPU time with one torch thread: wall time on a loaded machine varies several-fold).
Memory: each variant runs again in a fresh subprocess after a small warm-up call of both (so
lazily loaded code and thread pools are in the baseline), and its peak resident memory
(ru_maxrss) above that is its own (glibc's mmap threshold fixed, so freed tensors leave).
Blocks are random bytes with bounded scales.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _setup(a):
    import numpy as np
    import torch
    import torch.nn.functional as F

    from falsify.kernels.torch import gguf_quants as T
    from falsify.reference import gguf_quants as R

    torch.set_num_threads(a.threads)
    if a.chunk_mib:
        T.CHUNK_BYTES = int(a.chunk_mib * 2**20)
    torch.manual_seed(0)
    qk, nbytes = R.QTYPES[a.qtype]
    rng = np.random.default_rng(0)
    bounded = getattr(R, f"bounded_{a.qtype}")
    blocks = torch.empty(a.n, a.k // qk * nbytes, dtype=torch.uint8)
    for r0 in range(0, a.n, 256):  # in slices: the builder's int64 temporaries stay small
        raw = rng.integers(0, 256, (min(256, a.n - r0), blocks.shape[1]), dtype=np.uint8)
        blocks[r0:r0 + 256] = torch.from_numpy(bounded(raw))
    x = torch.rand(a.m, a.k) * 2 - 1
    dy = torch.randn(a.m, a.n)
    dequant = getattr(T, f"{a.qtype}_dequantize")
    variants = {
        "naive": lambda xx: F.linear(xx, dequant(blocks)),
        "fused": lambda xx: T.dequant_matmul(xx, blocks, a.qtype, a.n, a.k),
    }
    return torch, T, qk, x, dy, variants


def _once(torch, f, x, dy, clock=time.perf_counter):
    with torch.no_grad():
        t0 = clock()
        f(x)
        t1 = clock()
    xg = x.clone().requires_grad_()
    t2 = clock()
    f(xg).backward(dy)
    return t1 - t0, clock() - t2


def _memory(a) -> dict:
    torch, T, qk, x, dy, variants = _setup(a)
    from falsify.reference import gguf_quants as R

    small = torch.from_numpy(getattr(R, f"bounded_{a.qtype}")(
        torch.randint(0, 256, (16, R.QTYPES[a.qtype][1]), dtype=torch.uint8).numpy()))
    xs = torch.rand(4, qk)
    import torch.nn.functional as F
    F.linear(xs, getattr(T, f"{a.qtype}_dequantize")(small))
    T.dequant_matmul(xs.requires_grad_(), small, a.qtype, 16, qk).sum().backward()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    _once(torch, variants[a.variant], x, dy)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_extra_MiB": (peak - base) / 1024}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--qtype", default="q4_k", choices=["q8_0", "q4_k", "q6_k"])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--m", type=int, default=512)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: with --clock cpu, the CPU time of one "
                        "thread is the figure least disturbed by other processes)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="cpu",
                   help="wall: perf_counter; cpu: this process's CPU time (process_time)")
    p.add_argument("--chunk-mib", type=float, default=0.0,
                   help="override CHUNK_BYTES (MiB) for the fused path, to explore the choice")
    p.add_argument("--variant", choices=["fused", "naive"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.variant:
        print(json.dumps(_memory(a)))
        return 0
    mem = {}
    for v in ("naive", "fused"):
        cmd = [sys.executable, __file__, "--variant", v, "--qtype", a.qtype, "--n", str(a.n),
               "--k", str(a.k), "--m", str(a.m), "--chunk-mib", str(a.chunk_mib),
               "--threads", str(a.threads)]
        # glibc serves large blocks from mmap (returned to the system when freed) only below
        # a threshold that grows with every free: fixed at 128 KiB, the resident peak is the
        # peak of live tensors rather than of the allocator's cached heap
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
        mem[v] = json.loads(out.strip().splitlines()[-1])["peak_extra_MiB"]
    torch, T, qk, x, dy, variants = _setup(a)
    times = {v: ([], []) for v in variants}
    for i in range(a.repeat + 1):
        for v, f in variants.items():
            fwd, both = _once(torch, f, x, dy,
                              time.process_time if a.clock == "cpu" else time.perf_counter)
            if i:  # the first round is a warm-up
                times[v][0].append(fwd)
                times[v][1].append(both)
    best = {v: (min(t[0]), min(t[1])) for v, t in times.items()}
    for v in variants:
        print(f"{v:6s} forward {best[v][0] * 1e3:8.1f} ms  forward+backward "
              f"{best[v][1] * 1e3:8.1f} ms  peak extra {mem[v]:7.1f} MiB")
    print(f"{a.qtype} W [{a.n}, {a.k}], x [{a.m}, {a.k}], {torch.get_num_threads()} threads, "
          f"{a.clock} time, "
          f"chunks of {T.chunk_rows(a.n, a.k)} rows / {T.chunk_cols(a.n, a.k, qk)} columns: "
          f"time ratio naive/fused forward {best['naive'][0] / best['fused'][0]:.2f}, "
          f"forward+backward {best['naive'][1] / best['fused'][1]:.2f}; the whole W in fp32 "
          f"is {a.n * a.k * 4 / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
