"""GELU contract: the tanh-vs-erf gap probe."""

from falsify.probes import device

CONTRACT = "gelu-kernel-v1"
ARGMAX = 2.69894  # |x| where |gelu_tanh − gelu_exact| peaks (both signs: the gap is even)


def gap_probe(backend, dtype="float32", lo=-6.0, hi=6.0, points=12001):
    """max |gelu(x, 'tanh') − gelu(x, 'none')| over a grid (spacing 1e-3, plus ±ARGMAX), using
    the contract's `gelu_gap` binding for `backend` (looked up through the harness, so mutants
    are what runs). Returns the maximum and where it is attained."""
    import numpy as np

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "gelu_gap", backend)
    xs = np.concatenate([np.linspace(lo, hi, points), [-ARGMAX, ARGMAX]])
    xs = xs.astype({"float32": np.float32, "float16": np.float16}[dtype]).reshape(1, -1)
    arg = xs
    if backend != "reference":
        import torch

        arg = torch.from_numpy(xs).to(device(backend))
    gap = backends.to_numpy(fn(arg)).reshape(-1)
    i = int(np.argmax(np.abs(gap)))
    return {"max_gap": float(np.abs(gap[i])), "argmax": float(xs.reshape(-1)[i]),
            "points": int(gap.size)}
