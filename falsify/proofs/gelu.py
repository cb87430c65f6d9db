"""Facts behind the gelu contract: z3 launch arithmetic and the tanh-vs-erf gap probe."""

import z3

from falsify.impl.triton.gelu import MAX_BLOCK, launch_config
from falsify.proofs.bitvec import U

CONTRACT = "gelu-kernel-v1"
MAX_GAP = 4.7324e-4
ARGMAX = 2.69894  # |x| where |gelu_tanh − gelu_exact| peaks (both signs: the gap is even)


def launch_claims():
    """For 1 ≤ rows, n ≤ 2^24 (32-bit vectors): BLOCK is a power of two ≤ 1024 (≥ n when
    n ≤ 1024), cols·BLOCK ≥ n and (cols − 1)·BLOCK < n: every element is in exactly one tile."""
    rows, n = z3.BitVec("rows", 32), z3.BitVec("n", 32)
    cfg = launch_config(U(rows), U(n))
    block, cols = cfg["BLOCK"].e, cfg["grid"][1].e
    dom = z3.And(z3.UGE(rows, 1), z3.ULE(rows, 2 ** 24), z3.UGE(n, 1), z3.ULE(n, 2 ** 24))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == rows, block & (block - 1) == 0, z3.ULE(block, MAX_BLOCK),
        z3.Implies(z3.ULE(n, MAX_BLOCK), z3.UGE(block, n)),
        z3.UGE(cols * block, n), z3.ULT((cols - 1) * block, n)))


def gap_probe(backend, dtype="float32", lo=-6.0, hi=6.0, points=12001):
    """max |gelu(x, 'tanh') − gelu(x, 'none')| over a grid (spacing 1e-3, plus ±ARGMAX), using
    the contract's `gelu_gap` binding for `backend` (looked up through the harness, so mutants
    are what runs). Returns the maximum and where it is attained."""
    import numpy as np

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "gelu_gap", backend)
    xs = np.concatenate([np.linspace(lo, hi, points), [-ARGMAX, ARGMAX]])
    xs = xs.astype({"float32": np.float32, "float16": np.float16}[dtype]).reshape(1, -1)
    if backend != "reference":
        import torch

        xs = torch.from_numpy(xs)
    gap = backends.to_numpy(fn(xs)).reshape(-1)
    i = int(np.argmax(np.abs(gap)))
    return {"max_gap": float(np.abs(gap[i])), "argmax": float(np.asarray(xs).reshape(-1)[i]),
            "points": int(gap.size)}
