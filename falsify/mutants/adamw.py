"""AdamW mutants: the optimizer bugs the AdamW contract's checks must catch (coupled L2 decay, a
dropped β2, no bias correction, uninitialised state, stride-blind Triton
indexing; pv adamw-kernel-v1's qa falsification line)."""

from __future__ import annotations

import math

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.arguments import check_hyperparameters
from falsify.kernels.torch.adamw import check_tensors
from falsify.kernels.triton.adamw import launch_config


def _adam_core(param, grad, m, v, step, lr, beta1, beta2, eps, decoupled_decay, bias_correction):
    p = param.detach().float().clone()
    g = grad.detach().float()
    m = m.detach().clone()
    v = v.detach().clone()
    if decoupled_decay:
        p.mul_(1 - lr * decoupled_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bc1)
    return p.to(param.dtype), m, v


def l2_weight_decay(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """Adam with L2 regularisation: λθ is added to the gradient, so the decay passes through
    m and v and is divided by √v̂ (pv adamw qa falsification: "Move weight decay inside
    gradient")."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v)
    g = grad.float() + weight_decay * param.float()
    return _adam_core(param, g, m, v, step, lr, beta1, beta2, eps, 0.0, True)


def beta2_default(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """The configured β2 is dropped and a library default 0.999 used (an optimizer built
    with default parameters runs β2 = 0.999 while the config says 0.95)."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v)
    return _adam_core(param, grad, m, v, step, lr, beta1, 0.999, eps, weight_decay, True)


def no_bias_correction(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """m and v used raw: early steps are scaled by (1−β1)/√(1−β2) ≈ 3.2 (β = 0.9, 0.999)."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v)
    return _adam_core(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay, False)


def _recycled_block(like: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """`torch.empty_like(like)` as a GPU allocator serves it: a recycled block that still holds
    the previous owner's data (device memory with stale values makes m and v
    start non-zero, and v can be negative). A fresh CPU process often gets zeroed pages from
    the OS instead, which would hide the bug by luck, so the previous contents are written in
    explicitly: the mutant models the bug deterministically rather than depend on malloc."""
    buf = torch.empty_like(like, dtype=torch.float32)
    buf.copy_(previous.detach().reshape(like.shape).to(torch.float32))
    return buf


def uninitialised_state(param, grads, lr, beta1, beta2, eps, weight_decay):
    """adamw_run whose optimizer state comes from torch.empty (recycled memory, here the first
    gradient's bytes) instead of torch.zeros."""
    from falsify.kernels.torch.adamw import adamw_multi

    check_hyperparameters(1, lr, beta1, beta2, eps, weight_decay)
    p = param.detach().clone()
    if grads.shape[0] == 0:
        return p, torch.zeros(p.shape), torch.zeros(p.shape)
    m = _recycled_block(p, grads[0])
    v = _recycled_block(p, grads[0].abs())  # keep v ≥ 0 so only the bias, not a NaN, shows
    for t in range(1, grads.shape[0] + 1):
        adamw_multi([p], [grads[t - 1]], [m], [v], t, lr, beta1, beta2, eps, weight_decay)
    return p, m, v


@triton.jit
def _contiguous_only_kernel(p_ptr, g_ptr, m_ptr, v_ptr, po_ptr, mo_ptr, vo_ptr, numel,
                            decay, w1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps,
                            BLOCK: tl.constexpr):
    # The bug: flat offsets, as if every tensor were contiguous and started at its pointer.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = p * decay
    m = m + w1 * (g - m)
    v = v * beta2 + one_minus_beta2 * g * g
    p = p + neg_step_size * tl.div_rn(m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps)
    tl.store(po_ptr + offs, p.to(po_ptr.dtype.element_ty), mask=mask)
    tl.store(mo_ptr + offs, m, mask=mask)
    tl.store(vo_ptr + offs, v, mask=mask)


def triton_ignores_strides(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay,
                           out=None, m_out=None, v_out=None):
    """Triton AdamW that indexes every tensor as if contiguous: right on fresh tensors, wrong
    (reads and writes outside the view) on strided views such as a parameter slice."""
    from falsify.kernels.torch.adamw import step_scalars

    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v)
    out = torch.empty_like(param) if out is None else out
    m_out = torch.empty_like(m) if m_out is None else m_out
    v_out = torch.empty_like(v) if v_out is None else v_out
    numel = param.numel()
    if numel:
        decay, step_size, bc2_sqrt = step_scalars(step, lr, beta1, beta2, weight_decay)
        block, grid = launch_config(numel)
        _contiguous_only_kernel[(grid,)](param, grad, m, v, out, m_out, v_out, numel, decay,
                                         1.0 - beta1, beta2, 1.0 - beta2, -step_size, bc2_sqrt,
                                         eps, BLOCK=block)
    return out, m_out, v_out


def eps_inside_sqrt(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """Denominator √(v̂ + ε) instead of √v̂ + ε (v̂ = v'/(1 − β2^t)). Relative change of the
    step ≈ ε/(2v̂) for v̂ ≫ ε: below 1e-6 for v̂ ≥ 1e-2, so only small second moments show it."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v)
    p = param.detach().float().clone().mul_(1 - lr * weight_decay)
    m2 = m.detach().clone().lerp_(grad.detach().float(), 1 - beta1)
    v2 = v.detach().clone().mul_(beta2).addcmul_(grad.float(), grad.float(), value=1 - beta2)
    denom = (v2 / (1 - beta2 ** step)).add_(eps).sqrt_()
    p.addcdiv_(m2, denom, value=-lr / (1 - beta1 ** step))
    return p.to(param.dtype), m2, v2


def triton_loop_update_step_stuck(param, grads, lr, beta1, beta2, eps, weight_decay):
    """Triton `adamw_run` with the training loop's multi-tensor update (`adamw_multi`) passing
    t = 1 on every step: bias correction never decays. Before `adamw_run` drove the `AdamW`
    class with `adamw_multi`, no contract check reached this function and the bug survived."""
    from unittest import mock

    from falsify.kernels.triton import adamw as ta

    real = ta.adamw_multi

    def stuck(params, grads_, ms, vs, step, *rest, **hyperparameters):
        return real(params, grads_, ms, vs, 1, *rest, **hyperparameters)

    with mock.patch.object(ta, "adamw_multi", stuck):
        return ta.adamw_run(param, grads, lr, beta1, beta2, eps, weight_decay)
