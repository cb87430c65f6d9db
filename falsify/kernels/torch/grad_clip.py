"""Global-norm gradient clipping in PyTorch (math and non-finite rule:
falsify/reference/grad_clip.py).
This is the clip the training loop runs on the torch backend (falsify/llm/ops.py binds it).

The norm must not overflow: a plain fp32 Σg² overflows once |g| ≳ 1.8e19
(torch.linalg.vector_norm([1e35, 1e35]) is inf), exactly when clipping is needed most
(activation gradients of 1e35 occur in diverging runs), and it loses precision once the
squares fall below fp32's normal range (|g| ≲ 1e-19). So the norm is computed in one of two ways:

- fast: torch._foreach_norm, one read of every gradient (what torch.nn.utils.clip_grad_norm_
  costs). Its fp32 Σg² is used when the norm lands in [2^-40, inf): the squares were then
  summed without overflow (the partial sums only grow, so a finite total had finite partials),
  and a square below fp32's normal range (2^-126) is rounded by at most 2^-150, i.e. 2^-70 of
  Σg² ≥ 2^-80 per element. A NaN element makes it NaN, which is the answer (reference rule:
  any NaN reports NaN).
- scaled, otherwise: with A = max |g| over all tensors, ‖g‖ = A·sqrt(Σ (g/A)²). Every scaled
  square is ≤ 1, so the sum cannot overflow; an inf element reports +inf.

Choosing between them reads one flag on the host; the training loop reads the norm on the host
anyway (its Andon check), so this costs no extra synchronisation there. Clipping itself
multiplies only when coef < 1 (coef = 1 would rewrite every gradient unchanged).
"""

from __future__ import annotations

import torch

from falsify.arguments import check_clip_args
from falsify.errors import NonFiniteGradNorm
from falsify.kernels.dtypes import CHECKED, require

# clip_grad_norm_ is the training loop's clip (falsify/llm/ops.py): the bound clip_grad_norm
# clips its copies with it on every path, so every check of the binding runs it.
__all__ = ["clip_grad_norm", "clip_grad_norm_"]



def check_grads(grads, dtypes: tuple = CHECKED) -> None:
    if len(grads) == 0:
        raise ValueError("no gradients to clip")
    for i, g in enumerate(grads):
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"grads[{i}] must be a torch.Tensor, got {type(g).__name__}")
        require("grad_clip", dtypes, **{f"grads[{i}]": g})
        if g.device != grads[0].device:
            raise ValueError("all gradients must be on one device")


FAST_MIN = 2.0 ** -40  # below this fp32 squares may have left the normal range


def scaled_norm(grads) -> torch.Tensor:
    """A·sqrt(Σ (g/A)²) in fp32, A = max |g|; NaN if any element is NaN, +inf if any is ±inf."""
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


def total_norm(grads) -> torch.Tensor:
    """Global L2 norm in fp32 (0-d); NaN if any element is NaN, +inf if any is ±inf."""
    with torch.no_grad():
        parts = torch._foreach_norm([g.detach() for g in grads], 2, dtype=torch.float32)
        fast = torch.linalg.vector_norm(torch.stack(parts))
        if bool(torch.isnan(fast) | ((fast >= FAST_MIN) & torch.isfinite(fast))):
            return fast
        return scaled_norm(grads)


def clip_coefficient(norm: torch.Tensor, max_norm, eps) -> torch.Tensor:
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
    coef = clip_coefficient(norm, max_norm, eps)
    if bool(coef < 1):
        with torch.no_grad():
            full = [g for g in grads if g.dtype == torch.float32]
            if full:
                torch._foreach_mul_(full, coef)
            for g in grads:
                if g.dtype != torch.float32:
                    # multiply in fp32 and round once: an fp16 coef would add a second rounding
                    g.copy_(g.float() * coef)
    return norm


def clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """Functional form on three tensors (the contract's binding): (g0', g1', g2', norm)."""
    outs = [g.detach().clone() for g in (g0, g1, g2)]
    norm = clip_grad_norm_(outs, max_norm, eps, error_if_nonfinite)
    return outs[0], outs[1], outs[2], norm
