"""CPU timing and peak memory of the chunked torch dequant_matmul against dequantize-the-whole-
weight-then-F.linear, on one GGUF-quantized weight [n, k] and activations x [m, k].

    python scripts/bench_dequant_matmul.py [--qtype q4_k] [--n 4096] [--k 4096] [--m 512]

Each variant runs in a fresh subprocess, so its peak resident memory (ru_maxrss) above the
inputs' is its own; the time is the median of --repeat runs after a warm-up, forward only and
forward + backward (dx; the weight is frozen). Blocks are random bytes with bounded scales.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def _run_variant(a) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from falsify.impl.torch import gguf_quants as T
    from falsify.reference import gguf_quants as R

    torch.manual_seed(0)
    qk, nbytes = R.QTYPES[a.qtype]
    raw = np.random.default_rng(0).integers(0, 256, (a.n, a.k // qk * nbytes), dtype=np.uint8)
    blocks = torch.from_numpy(getattr(R, f"bounded_{a.qtype}")(raw))
    x = torch.rand(a.m, a.k) * 2 - 1
    dy = torch.randn(a.m, a.n)
    dequant = getattr(T, f"{a.qtype}_dequantize")

    def naive(xx):
        return F.linear(xx, dequant(blocks))

    def fused(xx):
        return T.dequant_matmul(xx, blocks, a.qtype, a.n, a.k)

    f = fused if a.variant == "fused" else naive
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    fwd, both = [], []
    for i in range(a.repeat + 1):
        with torch.no_grad():
            t0 = time.perf_counter()
            f(x)
            t1 = time.perf_counter()
        xg = x.clone().requires_grad_()
        t2 = time.perf_counter()
        f(xg).backward(dy)
        t3 = time.perf_counter()
        if i:  # the first run is a warm-up
            fwd.append(t1 - t0)
            both.append(t3 - t2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": a.variant, "forward_s": statistics.median(fwd),
            "forward_backward_s": statistics.median(both),
            "peak_extra_MiB": (peak - base) / 1024, "threads": torch.get_num_threads(),
            "chunk_rows": T.chunk_rows(a.n, a.k)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--qtype", default="q4_k", choices=["q8_0", "q4_k", "q6_k"])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--m", type=int, default=512)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--variant", choices=["fused", "naive"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.variant:
        print(json.dumps(_run_variant(a)))
        return 0
    res = {}
    for v in ("naive", "fused"):
        cmd = [sys.executable, __file__, "--variant", v, "--qtype", a.qtype, "--n", str(a.n),
               "--k", str(a.k), "--m", str(a.m), "--repeat", str(a.repeat)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        res[v] = json.loads(out.strip().splitlines()[-1])
    for v in ("naive", "fused"):
        r = res[v]
        print(f"{v:6s} forward {r['forward_s'] * 1e3:8.1f} ms  forward+backward "
              f"{r['forward_backward_s'] * 1e3:8.1f} ms  peak extra {r['peak_extra_MiB']:7.1f} MiB")
    n, f = res["naive"], res["fused"]
    print(f"{a.qtype} W [{a.n}, {a.k}], x [{a.m}, {a.k}], {f['threads']} threads, chunk "
          f"{f['chunk_rows']} rows: speed ratio naive/fused forward "
          f"{n['forward_s'] / f['forward_s']:.2f}, forward+backward "
          f"{n['forward_backward_s'] / f['forward_backward_s']:.2f}; fp32 W whole = "
          f"{a.n * a.k * 4 / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
