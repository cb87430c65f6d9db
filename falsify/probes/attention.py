"""Executable probes for the attention contract: GQA ≡ MHA with repeated K/V, and peak memory
linear in the sequence length. Functions are looked up through the harness at call time, so a
swapped-in mutant is what runs."""

from __future__ import annotations

from falsify.probes import device

CONTRACT = "attention-kernel-v1"


def _bound(backend, equation="attention"):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), equation, backend)


def gqa_probe(backend, dtype="float32", b=2, hkv=2, g=3, s=37, d=24, causal=True, fn=None):
    """GQA ≡ MHA with K/V repeated per group: forward outputs agree, and the GQA gradient of
    each K/V head equals the sum of the MHA gradients of its G repeated copies. The function is
    the contract's `attention` binding looked up at call time (mutants included) unless `fn`
    is given. Returns the largest differences, scaled by the output/gradient magnitude."""
    import torch

    fn = fn or _bound(backend)
    dev = device(backend)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(11)
    q = (torch.rand(b, hkv * g, s, d, generator=gen) * 2 - 1).to(dt)
    k = (torch.rand(b, hkv, s, d, generator=gen) * 2 - 1).to(dt)
    v = (torch.rand(b, hkv, s, d, generator=gen) * 2 - 1).to(dt)
    dy = torch.randn(b, hkv * g, s, d, generator=gen).to(dt)
    q, k, v, dy = (t.to(dev) for t in (q, k, v, dy))
    leaves_g = [t.clone().requires_grad_() for t in (q, k, v)]
    y_g = fn(*leaves_g, causal=causal)
    gq_g, gk_g, gv_g = torch.autograd.grad(y_g, leaves_g, dy)
    leaves_m = [q.clone().requires_grad_(), k.repeat_interleave(g, dim=1).requires_grad_(),
                v.repeat_interleave(g, dim=1).requires_grad_()]
    y_m = fn(*leaves_m, causal=causal)
    gq_m, gk_m, gv_m = torch.autograd.grad(y_m, leaves_m, dy)

    def rel(x, y):
        x, y = x.detach().double(), y.detach().double()
        return float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))

    def group_sum(t):
        return t.double().reshape(b, hkv, g, s, d).sum(dim=2)

    return {"fwd": rel(y_g, y_m), "dq": rel(gq_g, gq_m), "dk": rel(gk_g, group_sum(gk_m)),
            "dv": rel(gv_g, group_sum(gv_m)),
            "fwd_bit_exact": bool(torch.equal(y_g.detach(), y_m.detach()))}


def peak_bytes(run) -> tuple[object, int]:
    """Peak bytes the torch CPU allocator holds during `run()`, above what was live before.

    The profiler records every allocation and free of the c10 allocator as a `[memory]` event
    with a signed size; replaying them in time order gives the live-bytes curve and its peak.
    This counts exactly the tensors `run` creates (inputs made before are excluded), unlike RSS
    (allocator caching, page granularity) or tracemalloc (which only sees Python's allocator,
    not torch's)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return res, peak


def memory_probe(backend, dtype="float32", b=1, hkv=2, g=2, d=64, s_small=512, s_large=2048,
                 causal=True, fn=None):
    """Peak memory of forward + backward at two sequence lengths, for the bound `attention`
    (mutants included) and for the materializing baseline at the long length. Linear growth
    gives peak_large / peak_small ≈ s_large / s_small = 4; anything holding [S, S] gives ≈ 16.
    `scores_large` is the size of one fp32 [B, Hq, S, S] score tensor at s_large."""
    import torch

    from falsify.kernels.torch.attention import attention_naive

    if device(backend) != "cpu":
        raise ValueError(f"backend={backend!r} runs on {device(backend)}: this probe measures "
                         "torch's CPU allocator")
    fn = fn or _bound(backend)
    dt = getattr(torch, dtype)

    def fwd_bwd(f, s):
        gen = torch.Generator().manual_seed(s)
        q = torch.randn(b, hkv * g, s, d, generator=gen).to(dt).requires_grad_()
        k = torch.randn(b, hkv, s, d, generator=gen).to(dt).requires_grad_()
        v = torch.randn(b, hkv, s, d, generator=gen).to(dt).requires_grad_()
        dy = torch.randn(b, hkv * g, s, d, generator=gen).to(dt)

        def run():
            y = f(q, k, v, causal=causal)
            grads = torch.autograd.grad(y, (q, k, v), dy)
            return float(y.detach().float().abs().sum()) + sum(float(t.float().abs().sum())
                                                                for t in grads)

        return peak_bytes(run)[1]

    small, large = fwd_bwd(fn, s_small), fwd_bwd(fn, s_large)
    naive = fwd_bwd(attention_naive, s_large)
    return {"peak_small": small, "peak_large": large, "ratio": large / max(small, 1),
            "naive_large": naive, "scores_large": b * hkv * g * s_large * s_large * 4,
            "s_small": s_small, "s_large": s_large}
