"""RMSNorm contract: the saved-tensors probe."""

from __future__ import annotations

from falsify.probes import device

CONTRACT = "rmsnorm-kernel-v1"


def saved_tensors_probe(backend, dtype="float32", m=4, n=96, eps=1e-6, fn=None):
    """Run the bound forward under `saved_tensors_hooks` and measure what autograd keeps.

    Unless `fn` is given, the function is the contract's `rmsnorm` binding for `backend`, looked
    up through the harness at call time, so a mutant swapped in for the binding is what gets
    probed. Returns the number of saved elements that are not x or w themselves; the contract
    allows one fp32 scalar per row (inv_rms) and nothing of size m·n (no `normed`)."""
    import torch

    if fn is None:
        from falsify.harness import backends, runtime

        fn = backends.function(runtime.contract(CONTRACT), "rmsnorm", backend)
    dev = device(backend)
    gen = torch.Generator().manual_seed(m * 1000 + n)
    dt = getattr(torch, dtype)
    x = torch.randn(m, n, generator=gen).to(dt).to(dev).requires_grad_()
    w = torch.randn(n, generator=gen).to(dt).to(dev).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = fn(x, w, eps)
    inputs = {(x.data_ptr(), tuple(x.shape)), (w.data_ptr(), tuple(w.shape))}
    extra = [t for t in saved if (t.data_ptr(), tuple(t.shape)) not in inputs]
    y.backward(torch.ones_like(y))  # the saved set must also be enough to run the backward
    return {"rows": m, "n": n, "saved": len(saved),
            "extra_elems": sum(t.numel() for t in extra),
            "extra_bytes": sum(t.numel() * t.element_size() for t in extra),
            "grads_finite": bool(torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all())}
