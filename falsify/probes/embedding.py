"""Embedding contract: the out-of-range token id probe."""

from falsify.probes import device

CONTRACT = "embedding-kernel-v1"


def range_probe(backend, dtype="float32", vocab=8, d=4):
    """Call the contract's `embedding` binding for `backend` (through the harness, so mutants
    are what runs) with ids outside [0, V): each call must raise before writing anything into a
    provided `out`; a valid call must return the right rows."""
    import numpy as np
    import torch

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "embedding", backend)
    ref = backend == "reference"  # numpy in, numpy out, no `out=`
    dev = device(backend)
    dt = getattr(torch, dtype)
    table = torch.arange(vocab * d, dtype=torch.float32).view(vocab, d).to(dt)
    tab = table.double().numpy() if ref else table.to(dev)

    def ids_of(values):
        return np.asarray(values, dtype=np.int64) if ref else torch.tensor(values, device=dev)

    bad = {"id = V": [0, vocab], "id = −1": [-1, 0], "id = 2^40": [2 ** 40, 1],
           "id = V + 1000": [vocab + 1000, 2]}
    rejected, untouched = [], True
    for name, ids in bad.items():
        out = None if ref else torch.full((2, d), float("nan"), dtype=dt, device=dev)
        try:
            fn(ids=ids_of(ids), table=tab, **({} if ref else {"out": out}))
        except (ValueError, IndexError):
            rejected.append(name)
        untouched = untouched and (ref or bool(torch.isnan(out).all()))
    got = backends.to_numpy(fn(ids=ids_of([vocab - 1, 0, 3]), table=tab))
    valid = np.array_equal(got, backends.to_numpy(table[[vocab - 1, 0, 3]]))
    return {"bad_cases": len(bad), "rejected": len(rejected), "untouched": bool(untouched),
            "valid_ok": bool(valid), "accepted": ", ".join(sorted(set(bad) - set(rejected)))}
