"""Loop-level probes for the qlora contract.

* `frozen_base_probe`: forward, backward and one optimizer step with the NF4 state registered as
  if it were trainable; the state must get no gradient and stay bit-identical.
* `matches_lora_probe`: qlora_linear against the same backend's nf4_dequantize + lora_linear.
Probes look the functions up through the harness at call time, so swapped-in mutants run.
"""

from __future__ import annotations

# torch 2.13 imports triton on its first matmul (torch/_native/ops); the interpreter switch must
# come first or the probes' Triton kernels look for a GPU driver.
import falsify.kernels.triton  # noqa: F401
from falsify.probes import device

CONTRACT = "qlora-kernel-v1"


def _functions(backend, fns):
    if fns is not None:
        return fns
    from falsify.harness import backends, runtime

    return (backends.function(runtime.contract(CONTRACT), "qlora_linear", backend),
            backends.function(runtime.contract("nf4-kernel-v1"), "nf4_quantize", backend),
            backends.function(runtime.contract("nf4-kernel-v1"), "nf4_dequantize", backend),
            backends.function(runtime.contract("lora-kernel-v1"), "lora_linear", backend))


def _layer(dtype, m, in_features, out_features, rank, seed, dev="cpu"):
    """(w, x, a, b, dy), drawn on the CPU and moved to `dev`."""
    import torch

    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    gen = torch.Generator().manual_seed(int(seed))

    def uniform(*shape):
        return (torch.rand(*shape, generator=gen) * 2 - 1).to(dt)

    layer = (uniform(out_features, in_features).float(), uniform(m, in_features),
             uniform(rank, in_features), uniform(out_features, rank), uniform(m, out_features))
    return tuple(t.to(dev) for t in layer)


def frozen_base_probe(backend, dtype, m, in_features, out_features, rank, alpha, blocksize,
                      double_quant, seed, fns=None):
    """Quantize a random base, register every floating NF4 tensor (absmax, absmax2, offset) as
    requiring grad — what a careless `nn.Parameter` wrapping would do — run forward, backward
    and one SGD step over adapters *and* those tensors. Returns whether the packed bytes and
    every scale are bit-identical afterwards, whether any state tensor got a gradient, and
    whether the adapters did move (the positive control)."""
    import torch

    qlora, quantize, _, _ = _functions(backend, fns)
    w, x, a, b, dy = _layer(dtype, m, in_features, out_features, rank, seed, device(backend))
    state = list(quantize(w, blocksize, double_quant))
    names = ["packed", "absmax", "absmax2", "offset"] if double_quant else ["packed", "absmax"]
    before = {k: v.detach().clone() for k, v in zip(names, state)}
    kw = dict(zip(names, state))
    floats = [v.requires_grad_(True) for v in state if v.is_floating_point()]
    a.requires_grad_(True)
    b.requires_grad_(True)
    a0, b0 = a.detach().clone(), b.detach().clone()
    y = qlora(x, shape=(out_features, in_features), blocksize=blocksize, a=a, b=b, alpha=alpha,
              r=rank, **kw)
    (y.float() * dy.float()).sum().backward()
    state_grads = [v.grad for v in floats]
    torch.optim.SGD([a, b, *floats], lr=0.5).step()
    identical = all(torch.equal(before[k].view(torch.uint8), kw[k].detach().view(torch.uint8))
                    for k in names)
    return {
        "state_identical": identical,
        "state_grad_none": all(g is None for g in state_grads),
        "adapters_moved": bool(not torch.equal(a.detach(), a0) and not torch.equal(b.detach(), b0)),
    }


def matches_lora_probe(backend, dtype, m, in_features, out_features, rank, alpha, blocksize,
                       double_quant, seed, fns=None):
    """max |qlora_linear(x, state) − lora_linear(x, nf4_dequantize(state, dtype=x.dtype))| on
    one backend, relative to the LoRA parity bound scale i·(1 + α)·(i + r + 3): both compute the
    same float32 dequantized weight, rounded to x's dtype, so they differ by accumulation order
    at most."""
    import torch

    qlora, quantize, dequantize, lora = _functions(backend, fns)
    w, x, a, b, _ = _layer(dtype, m, in_features, out_features, rank, seed, device(backend))
    state = list(quantize(w, blocksize, double_quant))
    extra = {"absmax2": state[2], "offset": state[3]} if double_quant else {}
    shape = (out_features, in_features)
    with torch.no_grad():
        y_q = qlora(x, state[0], state[1], shape, blocksize, a, b, alpha, rank, **extra)
        w_dq = dequantize(state[0], state[1], shape, blocksize, dtype=x.dtype, **extra)
        y_l = lora(x, w_dq, a, b, alpha, rank)
    diff = float((y_q.float() - y_l.float()).abs().max())
    return {"max_diff": diff,
            "scale": float(in_features * (1 + alpha) * (in_features + rank + 3))}
