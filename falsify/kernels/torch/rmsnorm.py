"""RMSNorm in PyTorch: fp32 compute, one rounding to the input dtype, own backward.

The forward saves only (x, w, inv_rms): inv_rms is one fp32 scalar per row, and the backward
recomputes normed = x·inv_rms with the same fp32 multiply the forward used, so the recomputed
value is bit-identical (saving `normed` would cost B·S·H·4 bytes per layer).

Backward (r = inv_rms, x̂ = x·r, g = dy ⊙ w, n = row length):
    dx = r·(g − x̂·mean(g ⊙ x̂))      (mean over the row: a per-row scalar)
    dw = Σ_rows dy ⊙ x̂
"""

from __future__ import annotations

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["rmsnorm", "rmsnorm_forward"]


def check_args(x: torch.Tensor, w: torch.Tensor, eps, out: torch.Tensor | None = None,
               dtypes: tuple = CHECKED):
    """Shape/dtype rules shared by the torch and Triton backends; raises before any work."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise TypeError("rmsnorm: x and w must be tensors")
    if x.dim() < 1 or x.shape[-1] < 1:
        # the mean square of no elements is 0/0
        raise ValueError(f"rmsnorm: the last dimension n = 0 (x {tuple(x.shape)}): no mean "
                         "square")
    if w.shape != (x.shape[-1],):
        raise ValueError(f"rmsnorm: w must have shape ({x.shape[-1]},), got {tuple(w.shape)}")
    require("rmsnorm", dtypes, x=x, w=w)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"rmsnorm: eps must be a positive number, got {eps!r}")
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ValueError(f"rmsnorm: out must be {tuple(x.shape)} {x.dtype}, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            raise RuntimeError("rmsnorm: out= does not support autograd (x or w requires grad)")


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        xf = x.float()
        # mean(x²) as a per-row dot product (one read pass, no [.., n] temporary for x²)
        ms = torch.linalg.vecdot(xf, xf).div_(x.shape[-1])
        inv_rms = torch.rsqrt(ms.add_(eps))
        # normed then ·w in place: the same two fp32 roundings, one [.., n] buffer
        y = (xf * inv_rms.unsqueeze(-1)).mul_(w.float()).to(x.dtype)
        ctx.save_for_backward(x, w, inv_rms)
        ctx.eps = eps
        ctx.mark_non_differentiable(inv_rms)
        return y, inv_rms

    @staticmethod
    def backward(ctx, dy, _d_inv_rms):
        x, w, inv_rms = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: this backward will be differentiated
            return (*_differentiable_backward(x, w, ctx.eps, dy, ctx.needs_input_grad), None)
        r = inv_rms.unsqueeze(-1)
        xhat = x.float() * r  # the forward's `normed`, recomputed bit-exactly
        dyf = dy.float()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            g = dyf * w.float()
            c = torch.linalg.vecdot(g, xhat).div_(x.shape[-1]).unsqueeze(-1)  # mean(g ⊙ x̂)
            # r·(g − x̂·c) in place in g's buffer: 7 passes and 2 buffers instead of 9 and 6
            dx = g.addcmul_(xhat, c, value=-1.0).mul_(r).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = xhat.mul_(dyf).reshape(-1, x.shape[-1]).sum(dim=0).to(w.dtype)
        return dx, dw, None


def _differentiable_backward(x, w, eps, dy, needs):
    """(dx, dw) as out-of-place autograd ops, for a backward that is itself differentiated.
    The saved inv_rms is an output marked non-differentiable, a constant to autograd: a
    backward built on it would silently drop every second-order term through ∂r/∂x. So r is
    recomputed from x with the forward's own operations (bit-identical to the saved one), and
    nothing is updated in place (the fast path overwrites values its own graph would need)."""
    xf = x.float()
    r = torch.rsqrt(torch.linalg.vecdot(xf, xf) / x.shape[-1] + eps).unsqueeze(-1)
    xhat = xf * r
    dyf = dy.float()
    dx = dw = None
    if needs[0]:
        g = dyf * w.float()
        c = torch.linalg.vecdot(g, xhat).div(x.shape[-1]).unsqueeze(-1)
        dx = ((g - xhat * c) * r).to(x.dtype)
    if needs[1]:
        dw = (xhat * dyf).reshape(-1, x.shape[-1]).sum(dim=0).to(w.dtype)
    return dx, dw


def rmsnorm_forward(x: torch.Tensor, w: torch.Tensor, eps: float, out=None):
    """(y, inv_rms): y in x.dtype, inv_rms fp32 with shape x.shape[:-1]."""
    check_args(x, w, eps, out)
    y, inv_rms = _RMSNormFunction.apply(x, w, float(eps))
    if out is not None:
        out.copy_(y)
        y = out
    return y, inv_rms


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out=None) -> torch.Tensor:
    return rmsnorm_forward(x, w, eps, out)[0]
