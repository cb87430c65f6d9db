"""Facts behind the swiglu contract: z3 launch arithmetic and the aliasing probe."""

import z3

from falsify.impl.triton.swiglu import MAX_BLOCK, launch_config
from falsify.proofs.bitvec import U

CONTRACT = "swiglu-kernel-v1"


def launch_claims():
    """For 1 ≤ rows ≤ 2^24 and 1 ≤ n ≤ 2^24 (32-bit vectors): BLOCK is a power of two ≤ 1024,
    ≥ n whenever n ≤ 1024; the column tiles cover the row (cols·BLOCK ≥ n) and none starts
    past its end ((cols − 1)·BLOCK < n), so the mask `offs < n` is exact."""
    rows, n = z3.BitVec("rows", 32), z3.BitVec("n", 32)
    cfg = launch_config(U(rows), U(n))
    block, cols = cfg["BLOCK"].e, cfg["grid"][1].e
    dom = z3.And(z3.UGE(rows, 1), z3.ULE(rows, 2 ** 24), z3.UGE(n, 1), z3.ULE(n, 2 ** 24))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == rows, block & (block - 1) == 0, z3.ULE(block, MAX_BLOCK),
        z3.Implies(z3.ULE(n, MAX_BLOCK), z3.UGE(block, n)),
        z3.UGE(cols * block, n), z3.ULT((cols - 1) * block, n)))


def aliasing_probe(backend, dtype="float32", m=3, n=40):
    """Exercise the in-place backward's aliasing rule on the contract's bound
    `swiglu_backward_inplace` (looked up through the harness, so mutants are what runs):
    the legal call must return gate's and up's own storage and leave dy alone; every illegal
    aliasing (up is gate, partial overlaps, dy overlapping an output) must raise before anything
    is written."""
    import torch

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "swiglu_backward_inplace", backend)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(m * 100 + n)

    def fresh(rows=m, cols=n):
        return (torch.randn(rows, cols, generator=gen) * 4).to(dt)

    gate, up, dy = fresh(), fresh(), fresh()
    dy0 = dy.clone()
    d_gate, d_up = fn(gate, up, dy)
    in_place = (d_gate.data_ptr() == gate.data_ptr() and d_up.data_ptr() == up.data_ptr()
                and d_gate.shape == gate.shape and d_up.shape == up.shape)

    buf = fresh(2 * m + 1, n)  # shared storage for the illegal cases
    other = fresh()
    bad_cases = {
        "up is gate": (buf[:m], buf[:m], other),
        "up overlaps gate": (buf[:m], buf[1:m + 1], other),
        "dy is gate": (buf[:m], other, buf[:m]),
        "dy overlaps up": (other, buf[m:2 * m], buf[m + 1:2 * m + 1]),
    }
    rejected, untouched = [], True
    for name, (g, u, d) in bad_cases.items():
        snap = buf.clone(), other.clone()
        try:
            fn(g, u, d)
        except ValueError:
            rejected.append(name)
        untouched = untouched and torch.equal(buf, snap[0]) and torch.equal(other, snap[1])
        buf.copy_(snap[0])
        other.copy_(snap[1])
    return {"in_place": bool(in_place), "dy_untouched": bool(torch.equal(dy, dy0)),
            "bad_cases": len(bad_cases), "rejects": len(rejected),
            "untouched_after_reject": bool(untouched),
            "accepted": ", ".join(sorted(set(bad_cases) - set(rejected)))}
