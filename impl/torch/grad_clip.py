"""Global-norm gradient clipping in PyTorch (math and non-finite rule: reference/grad_clip.py).

The norm is computed *scaled*: with A = max |g| over all tensors, ‖g‖ = A·sqrt(Σ (g/A)²). Every
scaled square is ≤ 1, so the fp32 sum cannot overflow. A plain fp32 Σg² overflows once |g| ≳
1.8e19 (torch.linalg.vector_norm([1e35, 1e35]) is inf): exactly when clipping is needed most
(seed ALB-044: activation gradients of 1e35).

No host synchronisation on the clipping path: coef is a 0-d tensor used by _foreach_mul_, set
to 1 when the norm is not finite. Only error_if_nonfinite=True reads the norm on the host.
"""

from __future__ import annotations

import torch

from falsify.reference.grad_clip import NonFiniteGradNorm, check_clip_args

GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_grads(grads) -> None:
    if len(grads) == 0:
        raise ValueError("no gradients to clip")
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"grads[{i}] must be a torch.Tensor, got {type(g).__name__}")
        if g.dtype not in GRAD_DTYPES:
            raise TypeError(f"grads[{i}] dtype {g.dtype}: must be float32, float16 or bfloat16")
        if g.device != grads[0].device:
            raise ValueError("all gradients must be on one device")


def total_norm(grads) -> torch.Tensor:
    """Scaled global L2 norm in fp32; NaN if any element is NaN, +inf if any is ±inf."""
    with torch.no_grad():
        absmax = torch.stack([g.detach().abs().amax().float() if g.numel() else
                              torch.zeros((), device=g.device) for g in grads])
        has_nan = torch.stack([torch.isnan(g).any() for g in grads]).any()
        a = absmax.max()
        finite = torch.isfinite(a)
        # A = 0 (all zero) or non-finite: divide by 1 instead; the result is overridden below.
        safe = torch.where(finite & (a > 0), a, torch.ones_like(a))
        sq = torch.zeros((), dtype=torch.float32, device=a.device)
        for g in grads:
            if g.numel():
                sq = sq + torch.sum((g.detach().float() / safe) ** 2)
        norm = safe * torch.sqrt(sq)
        norm = torch.where(a > 0, norm, torch.zeros_like(norm))
        norm = torch.where(finite, norm, torch.full_like(norm, float("inf")))
        return torch.where(has_nan, torch.full_like(norm, float("nan")), norm)


def _clip_coefficient(norm: torch.Tensor, max_norm, eps) -> torch.Tensor:
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    return torch.where(torch.isfinite(norm), coef, torch.ones_like(coef))


def clip_grad_norm_(grads, max_norm, eps, error_if_nonfinite) -> torch.Tensor:
    """Clip a list of gradient tensors in place by their global norm; returns the norm (fp32,
    0-d) measured before clipping. Non-finite norm: gradients untouched, norm returned (or
    NonFiniteGradNorm raised when error_if_nonfinite)."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    grads = list(grads)
    check_grads(grads)
    norm = total_norm(grads)
    if error_if_nonfinite and not bool(torch.isfinite(norm)):
        raise NonFiniteGradNorm(f"total gradient norm is {norm.item()}; gradients left "
                                "unchanged")
    coef = _clip_coefficient(norm, max_norm, eps)
    with torch.no_grad():
        for g in grads:
            # multiply in fp32 and round once: an fp16 coef would add a second rounding
            g.copy_(g.float() * coef)
    return norm


def clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """Functional form on three tensors (the contract's binding): (g0', g1', g2', norm)."""
    outs = [g.detach().clone() for g in (g0, g1, g2)]
    norm = clip_grad_norm_(outs, max_norm, eps, error_if_nonfinite)
    return outs[0], outs[1], outs[2], norm
