"""Facts behind the embedding contract: z3 launch/address arithmetic and the range probe."""

import z3

from falsify.impl.triton.embedding import MAX_BLOCK, launch_config
from falsify.proofs.bitvec import U

CONTRACT = "embedding-kernel-v1"


def launch_claims():
    """On 32-bit vectors, for 1 ≤ tokens ≤ 2^30 and 1 ≤ D ≤ 2^20: the column tiles cover D
    exactly (cols·BLOCK ≥ D > (cols − 1)·BLOCK, BLOCK = 2^k ≤ 1024)."""
    tokens, d = z3.BitVec("tokens", 32), z3.BitVec("d", 32)
    cfg = launch_config(U(tokens), U(d))
    block, cols = cfg["BLOCK"].e, cfg["grid"][1].e
    dom = z3.And(z3.UGE(tokens, 1), z3.ULE(tokens, 2 ** 30), z3.UGE(d, 1), z3.ULE(d, 2 ** 20))
    return z3.Implies(dom, z3.And(
        cfg["grid"][0].e == tokens, block & (block - 1) == 0, z3.ULE(block, MAX_BLOCK),
        z3.UGE(cols * block, d), z3.ULT((cols - 1) * block, d)))


def address_claims():
    """Over the integers (the kernel computes offsets in int64, far from overflow for tables
    below 2^62 elements): for a table [V, D] with row stride s_v ≥ D·s_d and s_d ≥ 1, every id
    the host check admits (0 ≤ id < V) and every unmasked lane (0 ≤ col < D) addresses an element
    inside the table's extent: 0 ≤ id·s_v + col·s_d ≤ (V − 1)·s_v + (D − 1)·s_d. The
    accumulator is contiguous (s_v = D, s_d = 1), so its adds land in [0, V·D)."""
    row, col, v, d, sv, sd = z3.Ints("row col v d s_v s_d")
    dom = z3.And(v >= 1, d >= 1, sd >= 1, sv >= d * sd)
    admitted = z3.And(row >= 0, row < v, col >= 0, col < d)
    off = row * sv + col * sd
    return z3.Implies(z3.And(dom, admitted), z3.And(
        off >= 0, off <= (v - 1) * sv + (d - 1) * sd,
        z3.Implies(z3.And(sv == d, sd == 1), off < v * d)))


def range_probe(backend, dtype="float32", vocab=8, d=4):
    """Call the contract's `embedding` binding for `backend` (through the harness, so mutants
    are what runs) with ids outside [0, V): each call must raise before writing anything into a
    provided `out`; a valid call must return the right rows."""
    import numpy as np
    import torch

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "embedding", backend)
    ref = backend == "reference"  # numpy in, numpy out, no `out=`
    dt = getattr(torch, dtype)
    table = torch.arange(vocab * d, dtype=torch.float32).view(vocab, d).to(dt)
    tab = table.double().numpy() if ref else table

    def ids_of(values):
        return np.asarray(values, dtype=np.int64) if ref else torch.tensor(values)

    bad = {"id = V": [0, vocab], "id = −1": [-1, 0], "id = 2^40": [2 ** 40, 1],
           "id = V + 1000": [vocab + 1000, 2]}
    rejected, untouched = [], True
    for name, ids in bad.items():
        out = None if ref else torch.full((2, d), float("nan"), dtype=dt)
        try:
            fn(ids=ids_of(ids), table=tab, **({} if ref else {"out": out}))
        except (ValueError, IndexError):
            rejected.append(name)
        untouched = untouched and (ref or bool(torch.isnan(out).all()))
    got = backends.to_numpy(fn(ids=ids_of([vocab - 1, 0, 3]), table=tab))
    valid = np.array_equal(got, backends.to_numpy(table[[vocab - 1, 0, 3]]))
    return {"bad_cases": len(bad), "rejected": len(rejected), "untouched": bool(untouched),
            "valid_ok": bool(valid), "accepted": ", ".join(sorted(set(bad) - set(rejected)))}
