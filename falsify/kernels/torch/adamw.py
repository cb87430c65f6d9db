"""AdamW in PyTorch: the multi-tensor update the training loop runs (`adamw_multi`, through
the `AdamW` optimizer class; falsify/llm/ops.py binds it), and the contract's bindings over them:
the single-tensor functional step runs the same `adamw_multi`, the multi-step run steps the
`AdamW` class itself (`optimizer_run`, which the Triton run uses too).

The update is torch's fused AdamW kernel (torch._fused_adamw_: one pass per parameter reading
θ, g, m, v and writing θ, m, v — what torch.optim.AdamW(fused=True) runs; on one CPU thread a
62M-parameter step took 51 ms fused vs 304 ms with eight elementwise passes). Its scalar factors
are computed in float64 from the step count, as torch.optim.AdamW computes them, so the result
is bit-identical to torch.optim.AdamW(fused=True). The math and its derivation are in
falsify/reference/adamw.py.

Precision policy: optimizer states m and v are always fp32. fp16/bf16 parameters are updated in
fp32 and rounded once when written back (an fp16 θ cannot absorb updates below ½ ulp(θ), so
keep fp32 master weights for real training; the low-precision path exists for parity tests).

No hyperparameter has a default: every call names lr, β1, β2, ε and λ.
"""

from __future__ import annotations

import importlib
import math

import torch

from falsify.arguments import check_hyperparameters
from falsify.kernels.dtypes import CHECKED, FP32, require

# adamw_multi is the training loop's update (falsify/llm/ops.py) and AdamW its optimizer
# (falsify/llm/trainer.py): adamw_step calls adamw_multi on every path, and adamw_run steps an
# AdamW driving adamw_multi (optimizer_run), so every check of the bindings runs both.
__all__ = ["adamw_step", "adamw_run", "adamw_multi", "AdamW"]



def check_tensors(param, grad, m, v, dtypes: tuple = CHECKED) -> None:
    """Shapes and dtypes every backend accepts; raise before touching any data."""
    for name, t in (("param", param), ("grad", grad), ("m", m), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    require("adamw", dtypes, param=param)
    if grad.dtype != param.dtype:
        raise TypeError(f"grad dtype {grad.dtype} differs from param dtype {param.dtype}")
    for name, t in (("m", m), ("v", v)):
        if t.dtype != torch.float32:
            raise TypeError(f"{name} dtype {t.dtype}: optimizer state must be float32")
    if not (param.shape == grad.shape == m.shape == v.shape):
        raise ValueError(f"shape mismatch: param {tuple(param.shape)}, grad {tuple(grad.shape)}, "
                         f"m {tuple(m.shape)}, v {tuple(v.shape)}")


def step_scalars(step, lr, beta1, beta2, weight_decay):
    """The per-step Python floats torch.optim.AdamW computes (float64, rounded to the tensor
    dtype by each op): decay factor 1 − ηλ, step size η/(1−β1^t), √(1−β2^t)."""
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    return 1.0 - lr * weight_decay, lr / bias_correction1, math.sqrt(bias_correction2)


def init_state(params):
    """Zero-initialised fp32 moments, one (m, v) pair per parameter. Zeros matter: m̂ and v̂
    divide by 1 − β^t assuming m₀ = v₀ = 0; recycled memory would be amplified by up to
    1/(1−β2) = 1000× at t = 1."""
    # zeros_like: a sharded parameter (FSDP's DTensor) gets moments sharded the same way
    ms = [torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
          for p in params]
    vs = [torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
          for p in params]
    return ms, vs


def adamw_multi(params, grads, ms, vs, step, lr, beta1, beta2, eps, weight_decay):
    """In-place AdamW step over lists of tensors (the training loop's call).

    params/grads: same dtype per pair; ms/vs: fp32. All tensors updated in place; nothing is
    returned. fp32 parameters are updated by the fused kernel directly; low-precision parameters
    are widened, updated and rounded back (the state stays fp32 throughout)."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    n = len(params)
    if not (len(grads) == len(ms) == len(vs) == n):
        raise ValueError(f"list lengths differ: params {n}, grads {len(grads)}, ms {len(ms)}, "
                         f"vs {len(vs)}")
    for p, g, m, v in zip(params, grads, ms, vs):
        check_tensors(p, g, m, v)
    if n == 0:
        return
    with torch.no_grad():
        # torch._fused_adamw_ indexes every tensor as contiguous (a stepped or transposed view
        # is read and written at the wrong elements): noncontiguous tensors go through a
        # contiguous copy, written back below
        work = [p.float().contiguous() for p in params]
        gs = [g.float().contiguous() for g in grads]
        ms_in, vs_in = ms, vs
        ms = [m.contiguous() for m in ms_in]
        vs = [v.contiguous() for v in vs_in]
        by_device: dict[torch.device, list[int]] = {}
        for i, p in enumerate(work):
            by_device.setdefault(p.device, []).append(i)
        for device, idx in by_device.items():
            # the kernel reads t from a float32 tensor on the parameters' device (torch keeps
            # fused AdamW's step counters there); it only reads it, so one serves every tensor
            t = torch.full((), float(step), dtype=torch.float32, device=device)
            torch._fused_adamw_([work[i] for i in idx], [gs[i] for i in idx],
                                [ms[i] for i in idx], [vs[i] for i in idx], [],
                                [t] * len(idx), lr=lr, beta1=beta1, beta2=beta2,
                                weight_decay=weight_decay, eps=eps, amsgrad=False,
                                maximize=False, grad_scale=None, found_inf=None)
        for dst, src in zip([*params, *ms_in, *vs_in], [*work, *ms, *vs]):
            if src is not dst:
                dst.copy_(src)


def adamw_step(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """Functional single-tensor AdamW step: returns new (param, m, v), inputs untouched."""
    check_tensors(param, grad, m, v)
    p, m2, v2 = param.detach().clone(), m.detach().clone(), v.detach().clone()
    adamw_multi([p], [grad.detach()], [m2], [v2], step, lr, beta1, beta2, eps, weight_decay)
    return p, m2, v2


def adamw_run(param, grads, lr, beta1, beta2, eps, weight_decay):
    """len(grads) steps from zero state; returns the final (param, m, v)."""
    check_hyperparameters(1, lr, beta1, beta2, eps, weight_decay)
    require("adamw_run", FP32, param=param, grads=grads)  # its contract runs float32 only
    return optimizer_run(param, grads, lr, beta1, beta2, eps, weight_decay, "torch", adamw_multi)


def optimizer_run(param, grads, lr, beta1, beta2, eps, weight_decay, backend, update):
    """`adamw_run` as the training loop runs it: the `AdamW` optimizer over one parameter,
    stepped once per gradient, with the backend's `update` (falsify/llm/trainer.py passes its Ops
    bundle's). The optimizer keeps the state (zero-initialised) and the step count; the
    contract's run checks therefore check the class, not a sibling of it."""
    if grads.dim() != param.dim() + 1 or tuple(grads.shape[1:]) != tuple(param.shape):
        raise ValueError(f"grads must have shape [steps, *{tuple(param.shape)}], "
                         f"got {tuple(grads.shape)}")
    p = param.detach().clone()
    opt = AdamW([p], lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                backend=backend, update=update)
    for g in grads:
        p.grad = g.detach()
        opt.step()
    st = opt.state[p]
    if not st:  # no gradient, no step: the zero state
        (st["exp_avg"],), (st["exp_avg_sq"],) = init_state([p])
    return p, st["exp_avg"], st["exp_avg_sq"]


class AdamW(torch.optim.Optimizer):
    """torch.optim-style AdamW driving `adamw_multi` (torch) or the Triton kernel; the
    optimizer of the training loop.

    Every hyperparameter is required (no defaults) and readable back from
    `param_groups`, so a training loop can assert that its config reached the optimizer. The
    groups and state use torch.optim.AdamW's layout ("betas", "eps", "weight_decay", "lr";
    per-parameter "step", "exp_avg", "exp_avg_sq"), so checkpoints are read and written alike.

    `update`: the multi-tensor update to run (the training loop passes its Ops bundle's,
    falsify/llm/ops.py); None: the backend module's `adamw_multi`, looked up at each step."""

    def __init__(self, params, *, lr, beta1, beta2, eps, weight_decay, backend, update=None):
        check_hyperparameters(1, lr, beta1, beta2, eps, weight_decay)
        if backend not in ("torch", "triton"):
            raise ValueError(f"backend={backend!r}: must be 'torch' or 'triton'")
        self.backend = backend
        self._update = update
        super().__init__(params, dict(lr=lr, betas=(beta1, beta2), eps=eps,
                                      weight_decay=weight_decay))

    def hyperparameters(self, group: int = 0) -> dict:
        """The values one update of `group` uses, by their names in the update's signature."""
        g = self.param_groups[group]
        return {"lr": g["lr"], "beta1": g["betas"][0], "beta2": g["betas"][1],
                "eps": g["eps"], "weight_decay": g["weight_decay"]}

    def update_fn(self):
        if self._update is not None:
            return self._update
        return importlib.import_module(f"falsify.kernels.{self.backend}.adamw").adamw_multi

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        update = self.update_fn()
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                st = self.state[p]
                if not st:
                    (st["exp_avg"],), (st["exp_avg_sq"],) = init_state([p])
                    st["step"] = torch.zeros((), dtype=torch.float32)
                st["step"] += 1
            # Parameters of one group may have been created at different times (so have
            # different step counts): group them by step so each call uses one t.
            by_step: dict[int, list] = {}
            for p in params:
                by_step.setdefault(int(self.state[p]["step"]), []).append(p)
            hp = self.hyperparameters(i)
            for t, ps in by_step.items():
                update(ps, [p.grad for p in ps], [self.state[p]["exp_avg"] for p in ps],
                       [self.state[p]["exp_avg_sq"] for p in ps], t, **hp)
        return loss
