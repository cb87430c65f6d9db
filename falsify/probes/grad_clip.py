"""Gradient-clipping contract: the torch.nn.utils comparison and the non-finite norm run.

The runs look the implementation up through the harness's binding resolution, so a mutant (or
`falsify run --bind`) swapped in for `clip_grad_norm` is what they run.
"""

from __future__ import annotations

import numpy as np
import torch

from falsify.probes import device

F32_EPS = float(np.finfo(np.float32).eps)
SHAPES = ((7, 13), (64,), (1,), (3, 1, 5), (33, 2))


def _bound_clip(backend: str):
    """The contract's `clip_grad_norm` binding for `backend`, through the harness (so mutant
    and --bind overrides apply)."""
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract("grad-clip-kernel-v1"), "clip_grad_norm", backend)


def vs_torch_clip(backend, dtype, max_norm, seed):
    """Our bound clip on 3-tensor groups vs torch.nn.utils.clip_grad_norm_ (eps = 1e-6,
    foreach=False) over gradient scales 1e-4 … 1e4. Returns the largest relative error of
    the clipped gradients and of the norm, and how many scenarios actually clipped."""
    if dtype != "float32":
        raise ValueError("the torch.nn.utils comparison runs in float32")
    fn = _bound_clip(backend)
    dev = device(backend)  # clip_grad_norm_ runs on the same device as ours
    gen = torch.Generator().manual_seed(seed)
    max_rel_g = max_rel_n = 0.0
    clipped = scenarios = 0
    trios = ((0, 1, 2), (3, 4, 1), (2, 0, 4))
    for scale in (1e-4, 1e-2, 1.0, 1e2, 1e4):
        for trio in trios:
            gs = [(torch.randn(SHAPES[i], generator=gen) * scale).to(dev) for i in trio]
            params = [torch.zeros(g.shape, requires_grad=True, device=dev) for g in gs]
            for p, g in zip(params, gs):
                p.grad = g.clone()
            want_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0,
                                                       error_if_nonfinite=True, foreach=False)
            out = fn(gs[0], gs[1], gs[2], max_norm, 1e-6, True)
            scenarios += 1
            clipped += int(float(want_norm) > max_norm)
            max_rel_n = max(max_rel_n, abs(float(out[3]) - float(want_norm)) / float(want_norm))
            for o, p in zip(out[:3], params):
                w = p.grad
                max_rel_g = max(max_rel_g, float(((o - w).abs() / w.abs().clamp_min(
                    torch.finfo(torch.float32).tiny)).max()))
    n_total = max(sum(int(np.prod(SHAPES[i])) for i in trio) for trio in trios)
    return {"max_rel_grad": max_rel_g, "max_rel_norm": max_rel_n, "clipped": clipped,
            "scenarios": scenarios, "n": n_total, "f32_eps": F32_EPS}


def nonfinite_raises(backend, dtype):
    """error_if_nonfinite=True raises NonFiniteGradNorm for an inf and for a NaN gradient and
    leaves the inputs untouched; False returns the NaN/inf norm with the gradients unchanged."""
    from falsify.errors import NonFiniteGradNorm

    fn = _bound_clip(backend)
    dev = device(backend)
    tdt = getattr(torch, dtype)
    res = {}
    for label, bad in (("inf", float("inf")), ("nan", float("nan"))):
        gs = [torch.randn(4, 5).to(tdt), torch.randn(9).to(tdt), torch.randn(2, 3).to(tdt)]
        gs = [g.to(dev) for g in gs]
        gs[1][3] = bad
        before = [g.clone() for g in gs]
        try:
            fn(gs[0], gs[1], gs[2], 1.0, 1e-6, True)
            res[f"{label}_raised"] = False
        except NonFiniteGradNorm:
            res[f"{label}_raised"] = True
        out = fn(gs[0], gs[1], gs[2], 1.0, 1e-6, False)
        res[f"{label}_norm"] = float(out[3])
        res[f"{label}_inputs_untouched"] = all(torch.equal(a, b) or (
            torch.isnan(a).equal(torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
            for a, b in zip(gs, before))
        res[f"{label}_outputs_unchanged"] = all(
            torch.equal(o.nan_to_num(), b.nan_to_num()) and torch.isnan(o).equal(torch.isnan(b))
            for o, b in zip(out[:3], before))
    return res
