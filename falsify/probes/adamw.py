"""Loop-level runs for the AdamW contract: our update next to torch.optim.AdamW and
torch.optim.Adam, and the hyperparameter contract of every public entry point.

The runs resolve the implementation by module attribute at call time, so a harness that swaps a
binding by patching the module is seen here too.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import torch

from falsify.probes import device

F32_EPS = float(np.finfo(np.float32).eps)
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay")
SHAPES = ((7, 13), (64,), (1,), (3, 1, 5))  # non-power-of-2, size-1 and 3-d parameters


def _impl(backend: str):
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend={backend!r}: this run compares torch or triton")
    return importlib.import_module(f"falsify.kernels.{backend}.adamw")


def _grad_stream(steps: int, seed: int, dev: str = "cpu"):
    """Seeded gradients whose scale sweeps 1e-3 … 1e3 (Adam is scale-invariant only up to ε),
    with an all-zero gradient on every 10th step for the first tensor; drawn on the CPU, on
    `dev` when yielded."""
    gen = torch.Generator().manual_seed(seed)
    for t in range(1, steps + 1):
        scale = 10.0 ** ((t % 7) - 3)
        gs = [(torch.randn(s, generator=gen) * scale).to(dev) for s in SHAPES]
        if t % 10 == 0:
            gs[0].zero_()
        yield gs


def vs_torch_adamw(backend, dtype, steps, lr, beta1, beta2, eps, weight_decay, seed):
    """Run `steps` updates of our adamw_multi (zero state from init_state) next to
    torch.optim.AdamW and next to torch.optim.Adam with coupled L2 decay, on the same gradients.

    Returns max_abs_err (ours vs AdamW, over every step and element), the scale of the run
    (largest |θ| and largest per-step |Δθ| seen in torch's AdamW trajectory) and l2_gap (final
    max |ours − Adam-L2|): a correct AdamW matches the first and is far from the second."""
    if dtype != "float32":
        raise ValueError("the torch.optim comparison runs fp32 parameters (optimizer states are "
                         "fp32 on every backend)")
    from falsify.kernels.torch.adamw import init_state

    impl = _impl(backend)
    dev = device(backend)  # torch.optim runs on the same device as ours
    gen = torch.Generator().manual_seed(seed + 1)
    init = [torch.randn(s, generator=gen).to(dev) for s in SHAPES]
    ref = [p.clone().requires_grad_(True) for p in init]
    l2 = [p.clone().requires_grad_(True) for p in init]
    ours = [p.clone() for p in init]
    opt = torch.optim.AdamW(ref, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
                            foreach=False)
    opt_l2 = torch.optim.Adam(l2, lr=lr, betas=(beta1, beta2), eps=eps,
                              weight_decay=weight_decay, foreach=False)
    ms, vs = init_state(ours)  # the zero state the AdamW class starts from, on either backend
    max_err = max_param = max_update = 0.0
    for t, gs in enumerate(_grad_stream(steps, seed, dev), start=1):
        before = [p.detach().clone() for p in ref]
        for p, q, g in zip(ref, l2, gs):
            p.grad = g.clone()
            q.grad = g.clone()
        opt.step()
        opt_l2.step()
        impl.adamw_multi(ours, [g.clone() for g in gs], ms, vs, t, lr, beta1, beta2, eps,
                         weight_decay)
        for p, b, o in zip(ref, before, ours):
            p = p.detach()
            max_err = max(max_err, (o - p).abs().max().item())
            max_param = max(max_param, p.abs().max().item())
            max_update = max(max_update, (p - b).abs().max().item())
    l2_gap = max((o - q.detach()).abs().max().item() for o, q in zip(ours, l2))
    return {"max_abs_err": max_err, "max_abs_param": max_param, "max_abs_update": max_update,
            "l2_gap": l2_gap, "steps": steps, "f32_eps": F32_EPS,
            "all_finite": all(bool(torch.isfinite(o).all()) for o in ours),
            "v_min": min(v.min().item() for v in vs)}


def hyperparameter_contract(backend, dtype):
    """No hyperparameter has a default and invalid values are rejected, on every public entry
    point of the backend; the AdamW optimizer class keeps the configured values.

    Returns: defaulted (names of hyperparameters that have a default anywhere: must be empty),
    missing_raises (omitting beta2 raises TypeError everywhere), invalid_tried /
    invalid_rejected (out-of-domain values raising ValueError), configured (the optimizer's
    param_groups after construction with β2 = 0.95, λ = 0.1)."""
    impl = _impl(backend)
    defaulted = []
    fns = [impl.adamw_step, impl.adamw_multi, impl.adamw_run]
    for fn in fns:
        sig = inspect.signature(fn)
        for name in HYPERPARAMETERS:
            prm = sig.parameters.get(name)
            if prm is None or prm.default is not inspect.Parameter.empty:
                defaulted.append(f"{fn.__name__}.{name}")
    # On the backend's device: a mutant that skips validation must launch and not raise, rather
    # than fail on a CPU pointer with a ValueError counted as a rejection.
    dev = device(backend)
    p = torch.randn(5, 3, dtype=getattr(torch, dtype)).to(dev)
    g = torch.randn(5, 3, dtype=getattr(torch, dtype)).to(dev)
    m, v = torch.zeros(5, 3, device=dev), torch.zeros(5, 3, device=dev)
    good = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    missing_raises = True
    try:
        impl.adamw_step(p, g, m, v, 1, lr=1e-3, beta1=0.9, eps=1e-8, weight_decay=0.1)
        missing_raises = False
    except TypeError:
        pass
    bad = [dict(step=0), dict(step=1.5), dict(lr=-1e-3), dict(beta1=1.0), dict(beta2=1.0),
           dict(beta2=-0.1), dict(eps=0.0), dict(weight_decay=-0.1), dict(beta1=float("nan")),
           dict(lr=float("inf"))]
    rejected = 0
    for b in bad:
        kw = {"step": 1, **good, **b}
        try:
            impl.adamw_step(p, g, m, v, **kw)
        except ValueError:
            rejected += 1
    from falsify.kernels.torch.adamw import AdamW

    w = torch.nn.Parameter(torch.randn(4, dtype=torch.float32).to(dev))
    opt = AdamW([w], lr=3e-4, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1,
                backend=backend)
    group = opt.hyperparameters(0)
    class_defaults = [k for k, prm in inspect.signature(AdamW.__init__).parameters.items()
                      if k in HYPERPARAMETERS and prm.default is not inspect.Parameter.empty]
    return {"defaulted": defaulted + [f"AdamW.{k}" for k in class_defaults],
            "missing_raises": missing_raises, "invalid_tried": len(bad),
            "invalid_rejected": rejected, "configured": group}
