"""LoRA contract: the training-kind check of the init / frozen-base obligations. Functions are
looked up through the harness at call time, so swapped-in mutants run."""

from __future__ import annotations

# torch 2.13 imports triton on its first matmul (torch/_native/ops); the interpreter switch must
# come first or the probes' Triton kernels look for a GPU driver.
import falsify.kernels.triton  # noqa: F401
from falsify.probes import device

CONTRACT = "lora-kernel-v1"


def init_step_probe(backend, dtype, m, in_features, out_features, rank, alpha, seed, fns=None):
    """One forward/backward at initialisation with the contract's `lora_init` (torch's for the
    triton backend, which binds none) and `lora_linear` bindings, looked up through the harness
    at call time so swapped-in mutants are what runs (`fns=(init, forward)` overrides).

    Returns `delta` = max |y(A₀, B₀) − y(A₀, 0)| (0 iff B₀ is exactly zero), `da_max`, `db_max`
    (max |∂L/∂A|, |∂L/∂B| for L = Σ y·dy), `w_grad_none` (the frozen W got no gradient although
    requires_grad was left on), `a_bound_ok` (|A₀| ≤ 1/√in)."""
    import math

    import torch

    if fns is None:
        from falsify.harness import backends, runtime

        c = runtime.contract(CONTRACT)
        init = backends.function(c, "lora_init", "torch" if backend == "triton" else backend)
        fwd = backends.function(c, "lora_linear", backend)
    else:
        init, fwd = fns
    dev = device(backend)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    gen = torch.Generator().manual_seed(int(seed) + 1)

    def uniform(*shape):
        return (torch.rand(*shape, generator=gen) * 2 - 1).to(dt)

    x, w, dy = uniform(m, in_features), uniform(out_features, in_features), uniform(m, out_features)
    x, w, dy = x.to(dev), w.to(dev), dy.to(dev)
    a0, b0 = init(in_features, out_features, rank, seed)
    a = a0.to(dt).to(dev).requires_grad_(True)
    b = b0.to(dt).to(dev).requires_grad_(True)
    w.requires_grad_(True)
    y = fwd(x, w, a, b, alpha, rank)
    with torch.no_grad():
        y_base = fwd(x, w.detach(), a.detach(), torch.zeros_like(b), alpha, rank)
    (y.float() * dy.float()).sum().backward()
    return {
        "delta": float((y.detach().float() - y_base.float()).abs().max()),
        "da_max": float(a.grad.abs().max()) if a.grad is not None else float("nan"),
        "db_max": float(b.grad.abs().max()) if b.grad is not None else float("nan"),
        "w_grad_none": w.grad is None,
        "a_bound_ok": bool((a0.abs() <= 1.0 / math.sqrt(in_features)).all()),
    }
